"""ctypes declarations of libcgclient (client/include/cgc/client.h and the
parts of cg/problem.h it uses) and how the library is found.

The structures mirror the C headers field by field; ctypes lays them out by
the platform's C ABI, as the compiler does. Keep both in step."""
import ctypes as C
import os

MAX_SPATIAL = 3
MAX_RANK = 2 + MAX_SPATIAL
MESSAGE_MAX = 512

# cg_op
OP_CONV_BWD_DATA = 1
OP_CONV_BWD_WEIGHTS = 2
OP_DECONV_BWD_DATA = 3
OP_DECONV_BWD_WEIGHTS = 4
OP_CONV_BWD = 5
OP_DECONV_BWD = 6

# cg_grad: the outputs of a layer's backward, in the order they come
GRADS = ("diff_src", "diff_weights", "diff_bias")
GRAD_COUNT = len(GRADS)

# cg_dtype
DTYPE_F32 = 1
DTYPE_BF16 = 2
DTYPE_F16 = 3

# cgc errno values (CGC_ERRNO_MAP, CG_ERRNO_MAP)
CGC_ERPC = -20
CGC_ETIMEDOUT = -22
CG_ELIMIT = -6

AUTO_PAD = {"none": 0, "same_upper": 1, "same_lower": 2, "valid": 3}
DATA_FORMAT = {"NCX": 1, "NXC": 2}
WEIGHTS_FORMAT = {"OIX": 1, "XIO": 2, "IOX": 3, "XOI": 4}
HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


class Ints(C.Structure):
    _fields_ = [("v", C.POINTER(C.c_int64)), ("len", C.c_size_t)]


class Attrs(C.Structure):
    _fields_ = [("strides", Ints), ("pads_begin", Ints), ("pads_end", Ints),
                ("dilations", Ints), ("output_padding", Ints),
                ("groups", C.c_int64), ("auto_pad", C.c_int),
                ("data_format", C.c_int), ("weights_format", C.c_int),
                ("dst_shape", Ints), ("weights_shape", Ints)]


_TENSOR_FIELDS = [("dtype", C.c_int), ("rank", C.c_int),
                  ("dims", C.c_int64 * MAX_RANK), ("layout", C.c_int),
                  ("data", C.c_void_p), ("nbytes", C.c_size_t)]

# A staged tensor's id: the SHA-256 of its bytes (cgc_stage), or a private
# id (cgc_stage_private).
STAGED_ID_BYTES = 32


class TensorView(C.Structure):
    _fields_ = _TENSOR_FIELDS + [("staged", C.c_void_p)]


class Tensor(C.Structure):
    _fields_ = _TENSOR_FIELDS


class StageResult(C.Structure):
    _fields_ = [("present", C.c_int), ("bytes_sent", C.c_uint64),
                ("ttl_ms", C.c_uint64), ("total_ms", C.c_double),
                ("attempts", C.c_int)]


class Result(C.Structure):
    _fields_ = [("queue_ms", C.c_double), ("compute_ms", C.c_double),
                ("total_ms", C.c_double), ("compute_path", C.c_char * 16),
                ("worker", C.c_char * 64), ("npads", C.c_int),
                ("pads_begin", C.c_int64 * MAX_SPATIAL),
                ("pads_end", C.c_int64 * MAX_SPATIAL),
                ("attempts", C.c_int), ("bytes_sent", C.c_uint64),
                ("bytes_received", C.c_uint64), ("upload_ms", C.c_double),
                ("download_ms", C.c_double),
                ("output_compute_ms", C.c_double * GRAD_COUNT)]


class Request(C.Structure):
    _fields_ = [("op", C.c_int), ("attrs", Attrs),
                ("inputs", TensorView * 3), ("has_shape_input", C.c_int),
                ("shape_input", Ints), ("output_layout", C.c_int),
                ("weights_output_layout", C.c_int), ("grads", C.c_uint),
                ("deadline_ms", C.c_int64)]


class Status(C.Structure):
    _fields_ = [("code", C.c_int), ("message", C.c_char * MESSAGE_MAX)]


class Options(C.Structure):
    _fields_ = [("deadline_ms", C.c_int64), ("max_message_bytes", C.c_int64),
                ("upload_chunk_bytes", C.c_size_t),
                ("download_chunk_bytes", C.c_uint32),
                ("max_output_bytes", C.c_uint64), ("retries", C.c_int),
                ("backoff_initial_ms", C.c_int64),
                ("backoff_max_ms", C.c_int64),
                ("backoff_multiplier", C.c_double),
                ("tls_ca_file", C.c_char_p), ("tls_cert_file", C.c_char_p),
                ("tls_key_file", C.c_char_p),
                ("tls_server_name", C.c_char_p), ("token", C.c_char_p),
                ("replicas", C.c_int), ("split_parts", C.c_int),
                ("split_min_flops", C.c_uint64),
                ("hedge_budget", C.c_double), ("verify_rate", C.c_double),
                ("verify_notify", C.c_void_p),
                ("verify_notify_arg", C.c_void_p)]


class VerifyStats(C.Structure):
    _fields_ = [("calls", C.c_uint64), ("outputs", C.c_uint64),
                ("failed", C.c_uint64), ("recovered", C.c_uint64),
                ("lost", C.c_uint64)]


class OpInfo(C.Structure):
    _fields_ = [("op", C.c_int), ("names", C.POINTER(C.c_char_p)),
                ("n_names", C.c_size_t), ("inputs", C.POINTER(C.c_char_p)),
                ("n_inputs", C.c_size_t), ("output", C.c_char_p),
                ("outputs", C.POINTER(C.c_char_p)), ("n_outputs", C.c_size_t)]


class DtypeInfo(C.Structure):
    _fields_ = [("dtype", C.c_int), ("native", C.c_int)]


class ServerInfo(C.Structure):
    _fields_ = [("version", C.c_char_p), ("ops", C.POINTER(OpInfo)),
                ("n_ops", C.c_size_t), ("dtypes", C.POINTER(DtypeInfo)),
                ("n_dtypes", C.c_size_t), ("onednn_version", C.c_char_p),
                ("cpu_isa", C.c_char_p), ("workers", C.c_uint32),
                ("threads_per_worker", C.c_uint32),
                ("cpus", C.POINTER(C.c_int32)), ("n_cpus", C.c_size_t),
                ("max_request_bytes", C.c_uint64),
                ("max_tensor_elements", C.c_uint64),
                ("max_inflight_bytes", C.c_uint64),
                ("queue_depth", C.c_uint32),
                ("default_chunk_bytes", C.c_uint32),
                ("idle_timeout_ms", C.c_uint64),
                ("stream_window_bytes", C.c_uint64),
                ("max_request_flops", C.c_uint64),
                ("io_cpus", C.POINTER(C.c_int32)), ("n_io_cpus", C.c_size_t),
                ("threads_policy", C.c_char_p),
                ("shm", C.c_char_p), ("max_regions", C.c_uint32),
                ("max_region_bytes", C.c_uint64),
                ("max_stride", C.c_uint64), ("max_dilation", C.c_uint64),
                ("max_pad", C.c_uint64),
                ("max_output_padding", C.c_uint64),
                ("max_effective_extent", C.c_uint64),
                ("max_padded_extent", C.c_uint64),
                ("store_bytes", C.c_uint64), ("store_ttl_ms", C.c_uint64),
                ("store_peer_bytes", C.c_uint64),
                ("store_held_bytes", C.c_uint64),
                ("store_entries", C.c_uint64), ("store_hits", C.c_uint64),
                ("store_misses", C.c_uint64),
                ("store_evictions", C.c_uint64),
                ("store_expired", C.c_uint64),
                ("priv_", C.c_void_p)]


# The library whose ABI the structures above mirror, by its soname: an
# older or newer libcgclient has other layouts. CMakeLists.txt refuses to
# configure when this differs from the soname it builds, so a version bump
# comes here and to the structures together.
SONAME = "libcgclient.so.0.2"


def _candidates():
    """Where libcgclient may be, in order: the environment variable, the
    prefix this package was installed into by `cmake --install`
    (PREFIX/lib/python3.X/dist-packages/convgrad -> PREFIX/lib),
    /usr/local/lib (cmake's default prefix, before ldconfig ran), then the
    dynamic linker's own search by soname (a Debian package's library in
    /usr/lib/<multiarch>)."""
    env = os.environ.get("CONVGRAD_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.normpath(os.path.join(here, "..", "..", "..", SONAME)),
            os.path.join("/usr/local/lib", SONAME), SONAME], False


def _declare(lib):
    P = C.POINTER
    sigs = {
        "cgc_version": (C.c_char_p, []),
        "cgc_strerror": (C.c_char_p, [C.c_int]),
        "cgc_status_code_name": (C.c_char_p, [C.c_int]),
        "cgc_options_init": (None, [P(Options)]),
        "cgc_channel_new": (C.c_int, [P(C.c_void_p), C.c_char_p, P(Options),
                                      C.c_char_p, C.c_size_t]),
        "cgc_channel_free": (None, [C.c_void_p]),
        "cgc_channel_target": (C.c_char_p, [C.c_void_p]),
        "cgc_tensor_free": (None, [P(Tensor)]),
        "cgc_request_init": (None, [P(Request)]),
        "cgc_compute": (C.c_int, [C.c_void_p, P(Request), P(P(Tensor)),
                                  P(Result), P(Status)]),
        "cgc_compute_into": (C.c_int, [C.c_void_p, P(Request), C.c_void_p,
                                       C.c_size_t, P(Tensor), P(Result),
                                       P(Status)]),
        "cgc_compute_layer": (C.c_int, [C.c_void_p, P(Request),
                                        P(Tensor) * GRAD_COUNT, P(Result),
                                        P(Status)]),
        "cgc_compute_layer_into": (C.c_int, [C.c_void_p, P(Request),
                                             C.c_void_p * GRAD_COUNT,
                                             C.c_size_t * GRAD_COUNT,
                                             Tensor * GRAD_COUNT, P(Result),
                                             P(Status)]),
        "cgc_call_start": (C.c_int, [C.c_void_p, P(Request),
                                     C.c_void_p * GRAD_COUNT,
                                     C.c_size_t * GRAD_COUNT,
                                     P(C.c_void_p), P(Status)]),
        "cgc_call_wait": (C.c_int, [C.c_void_p, C.c_uint, C.c_int64,
                                    P(Status)]),
        "cgc_call_done": (C.c_int, [C.c_void_p]),
        "cgc_call_finish": (C.c_int, [C.c_void_p, Tensor * GRAD_COUNT,
                                      P(Result), P(Status)]),
        "cgc_health": (C.c_int, [C.c_void_p, C.c_char_p, C.c_int64,
                                 P(C.c_int), P(Status)]),
        "cgc_server_info_get": (C.c_int, [C.c_void_p, C.c_int64,
                                          P(P(ServerInfo)), P(Status)]),
        "cgc_server_info_free": (None, [P(ServerInfo)]),
        "cgc_verify_stats_get": (None, [C.c_void_p, P(VerifyStats)]),
        "cgc_region_create": (C.c_int, [P(C.c_void_p), C.c_char_p,
                                        C.c_size_t, C.c_char_p, C.c_size_t]),
        "cgc_region_data": (C.c_void_p, [C.c_void_p]),
        "cgc_region_key": (C.c_char_p, [C.c_void_p]),
        "cgc_region_register": (C.c_int, [C.c_void_p, C.c_void_p,
                                          P(Status)]),
        "cgc_region_unregister": (C.c_int, [C.c_void_p, P(Status)]),
        "cgc_region_unlink": (C.c_int, [C.c_void_p, P(Status)]),
        "cgc_region_free": (None, [C.c_void_p]),
        "cgc_local_rows": (C.c_int, [C.c_void_p, P(Request), P(Result),
                                     C.c_double, P(C.c_int64), P(Status)]),
        "cgc_stage": (C.c_int, [C.c_void_p, C.c_void_p, C.c_size_t,
                                C.c_int64, C.c_void_p, P(StageResult),
                                P(Status)]),
        "cgc_stage_private": (C.c_int, [C.c_void_p, C.c_void_p, C.c_size_t,
                                        C.c_int64, C.c_void_p,
                                        P(StageResult), P(Status)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


_lib = None


def load():
    """The loaded library (loaded once). Raises ImportError saying what to
    do when it cannot be found."""
    global _lib
    if _lib is not None:
        return _lib
    paths, from_env = _candidates()
    tried = []
    for path in paths:
        try:
            lib = C.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        _check_abi(lib, path)
        _lib = _declare(lib)
        return _lib
    if from_env:
        hint = "CONVGRAD_LIBRARY=%s cannot be loaded" % paths[0]
    else:
        hint = ("%s was not found; install it (Debian: the libcgclient%s "
                "package; or cmake --install build) or set CONVGRAD_LIBRARY "
                "to the full path of the library, e.g. "
                "build/client/libcgclient.so" % (SONAME, _abi()))
    raise ImportError(hint + "; tried: " + "; ".join(tried))


def _abi():
    """"0.2" of "libcgclient.so.0.2"."""
    return SONAME.split(".so.", 1)[1]


def _check_abi(lib, path):
    """Refuses a library of another ABI than SONAME's (one named by
    CONVGRAD_LIBRARY): its structures would be read with the wrong
    layout. Libraries before 0.2 have no cgc_version at all."""
    try:
        fn = lib.cgc_version
    except AttributeError:
        fn = None
    version = None
    if fn is not None:
        fn.restype = C.c_char_p
        fn.argtypes = []
        version = fn().decode()
    if version is None or not (version + ".").startswith(_abi() + "."):
        raise ImportError(
            "%s is libcgclient %s; this convgrad package needs %s (%s)" %
            (path, version or "older than 0.2", _abi(), SONAME))
