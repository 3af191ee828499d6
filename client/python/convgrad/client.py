"""convgrad.Client: the ops (synchronous, and the layer ops as futures),
health and server info over libcgclient, and shared-memory regions."""
import atexit
import concurrent.futures
import ctypes as C
import ipaddress
import logging
import os
import socket
import sys
import threading
import weakref

import numpy as np

from . import _arena
from . import _lib as L
from .errors import Error, InvalidArgument, from_status

log = logging.getLogger("convgrad")

# Default bound of a Client's shared-memory arena (shm_bytes=).
SHM_BYTES = 1 << 30
# Clients whose arenas atexit closes, so that no object is left behind in
# /dev/shm by a process that exits with tensors still over them.
_with_arenas = weakref.WeakSet()

# Loaded on import, so that a missing library shows at once, with what to do.
L.load()

_NP_DTYPES = {np.dtype(np.float32): L.DTYPE_F32,
              np.dtype(np.uint16): L.DTYPE_BF16,
              np.dtype(np.float16): L.DTYPE_F16}
_NP_OF = {L.DTYPE_F32: np.float32, L.DTYPE_BF16: np.uint16,
          L.DTYPE_F16: np.float16}
_DTYPE_NAMES = {L.DTYPE_F32: "f32", L.DTYPE_BF16: "bf16", L.DTYPE_F16: "f16",
                4: "s32", 5: "s64"}
_OPTIONS = ("max_message_bytes", "upload_chunk_bytes", "download_chunk_bytes",
            "max_output_bytes", "backoff_initial_ms", "backoff_max_ms",
            "backoff_multiplier", "replicas", "split_parts", "split_min_flops",
            "hedge_budget", "verify_rate")
# Keyword -> cgc_options string field (paths and the token), encoded as the
# file system does.
_STRING_OPTIONS = {"tls_ca": "tls_ca_file", "tls_cert": "tls_cert_file",
                "tls_key": "tls_key_file", "tls_server_name": "tls_server_name",
                "token": "token"}


def _torch_dtypes():
    torch = sys.modules["torch"]
    return {torch.float32: L.DTYPE_F32, torch.bfloat16: L.DTYPE_BF16,
            torch.float16: L.DTYPE_F16}


def _is_torch(a):
    # torch is never imported here: an array can only be a tensor when the
    # caller has imported it.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _ms(seconds):
    return 0 if seconds is None else max(1, int(round(seconds * 1000)))


class _Array:
    """One array as libcgclient sees it: dtype, dims, and the address of
    its own memory (numpy array or CPU tensor, made contiguous if it was
    not). Holds the array so that the memory lives as long as this."""

    def __init__(self, name, a, writable=False):
        self.name = name
        self.staged = None  # the id buffer of a Staged, which goes by it
        if isinstance(a, Staged):
            if writable:
                raise InvalidArgument("%s: a staged array cannot receive "
                                      "an output" % name)
            self.staged = a._id
            a = a._x.array
        if _is_torch(a):
            if a.device.type != "cpu":
                raise InvalidArgument("%s: a %s tensor; only CPU tensors are "
                                      "accepted" % (name, a.device.type))
            dt = _torch_dtypes().get(a.dtype)
            if dt is None:
                raise InvalidArgument("%s: dtype %s; accepted: float32, "
                                      "bfloat16, float16" % (name, a.dtype))
            if not a.is_contiguous():
                if writable:
                    raise InvalidArgument("%s: must be contiguous" % name)
                a = a.contiguous()
            self.ptr = a.data_ptr()
            self.nbytes = a.numel() * a.element_size()
            self.torch = True
        elif isinstance(a, np.ndarray):
            dt = _NP_DTYPES.get(a.dtype)
            if dt is None:
                raise InvalidArgument("%s: dtype %s; accepted: float32, "
                                      "uint16 (bf16 bits), float16"
                                      % (name, a.dtype))
            if not a.flags.c_contiguous:
                if writable:
                    raise InvalidArgument("%s: must be C-contiguous" % name)
                a = np.ascontiguousarray(a)
            if writable and not a.flags.writeable:
                raise InvalidArgument("%s: is read-only" % name)
            self.ptr = a.ctypes.data
            self.nbytes = a.nbytes
            self.torch = False
        else:
            raise InvalidArgument("%s: a %s; expected a numpy array or a CPU "
                                  "torch tensor" % (name, type(a).__name__))
        if not 1 <= a.ndim <= L.MAX_RANK:
            raise InvalidArgument("%s: rank %d; expected 1..%d"
                                  % (name, a.ndim, L.MAX_RANK))
        self.array = a
        self.dtype = dt
        self.shape = tuple(int(d) for d in a.shape)

    def view(self, v):
        v.dtype = self.dtype
        v.rank = len(self.shape)
        for i, d in enumerate(self.shape):
            v.dims[i] = d
        v.data = self.ptr
        v.nbytes = self.nbytes
        v.staged = C.addressof(self.staged) if self.staged else None


class Staged:
    """An array staged on a server (Client.stage): pass it to a call in
    place of the array, and the call names the server's copy instead of
    sending the bytes (libcgclient stages it again should the server have
    lost it). Holds the array, which must stay unchanged while in use.
    id: the SHA-256 of its bytes (or a private id: Client.stage's
    private=); present: the server held them already
    (nothing was sent); bytes_sent."""

    def __init__(self, x, id_buf, res):
        self._x = x
        self._id = id_buf
        self.id = bytes(id_buf)
        self.present = bool(res.present)
        self.bytes_sent = int(res.bytes_sent)
        self.shape = x.shape

    @property
    def array(self):
        return self._x.array

    def __repr__(self):
        return "Staged(%s, %s..., present=%s)" % (
            self.shape, self.id.hex()[:12], self.present)


class _Owned:
    """Frees a cgc_tensor once the arrays wrapping its memory are gone."""

    def __init__(self, lib, t):
        self.lib, self.t = lib, t

    def __deepcopy__(self, memo):
        # One owner per buffer: a copy would free it twice. Copies of the
        # arrays copy their data (numpy), never this object.
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        raise TypeError("a result buffer's owner cannot be pickled; "
                        "pickle the array, which carries its data")

    def __del__(self):
        self.lib.cgc_tensor_free(self.t)


class CallResult:
    """What the server and the client measured about one call: queue_ms,
    compute_ms, total_ms, compute_path, worker, pads_begin, pads_end,
    attempts, bytes_sent, bytes_received, upload_ms, download_ms."""

    def __init__(self, r):
        for f, _ in L.Result._fields_:
            v = getattr(r, f)
            if isinstance(v, bytes):
                v = v.decode()
            self.__dict__[f] = v
        self.pads_begin = list(r.pads_begin[:r.npads])
        self.pads_end = list(r.pads_end[:r.npads])
        del self.__dict__["npads"]
        self._raw = r  # for Client.local_rows

    def __repr__(self):
        return "CallResult(%s)" % ", ".join(
            "%s=%r" % kv for kv in sorted(self.__dict__.items())
            if not kv[0].startswith("_"))


class Client:
    """A connection to one convgrad server, or to several replicas balanced
    by gRPC's round_robin ("h1:p,h2:p", "dns:///name:port", "ipv4:...",
    "unix:path"). Thread-safe: any number of threads may call one Client at
    once (the GIL is released during calls).

    deadline: seconds per call, retries and backoff included (default 60);
    retries: retries after UNAVAILABLE or a "retry later" refusal (the
    server's retry-after-ms trailer; default 5); other keyword arguments
    set the remaining fields of libcgclient's cgc_options by name
    (upload_chunk_bytes, download_chunk_bytes, max_message_bytes,
    max_output_bytes, backoff_initial_ms, backoff_max_ms,
    backoff_multiplier; replicas, split_parts, split_min_flops and
    hedge_budget: one call split along the minibatch over several replicas,
    client/README.md "Replicas"; the calls that return at once, such as
    convgrad.torch.offload's, too); verify_rate: the
    fraction (0 to 1) of calls whose results this client checks itself
    against their inputs (the adjoint identity, as the server's checks),
    and the first call of each shape, a result that fails asked for again
    at once (another replica where there are several), DATA_LOSS if that
    fails too; each failure is one line on stderr and counted in stats()
    (default: the CONVGRAD_VERIFY_RATE environment variable, else 0;
    proto/SEMANTICS.md "Result checks"). TLS: tls_ca (PEM roots the server's certificate
    must chain to), tls_cert and tls_key (this client's certificate, for a
    server that requires one), tls_server_name (the name the server's
    certificate must carry when the target's host is an address); paths,
    read and checked when the Client is made (InvalidArgument for a
    missing file or a key that does not match its certificate). token: a
    bearer token for a server started with --auth-tokens (default: the
    CONVGRAD_TOKEN environment variable).

    shm: shared-memory regions for a server on this host (a unix socket
    or loopback target whose server's --shm policy allows this caller).
    "auto" (default): convgrad.torch.offload passes a layer's tensors
    through the client's arena of regions; the ops called directly send
    bytes, unless their arrays lie in a Region registered on the client.
    True: the ops called directly go through the arena too (inputs copied
    in, layer ops' results returned over arena memory). False: never.
    shm_bytes: the arena's bound (default SHM_BYTES, 1 GiB): regions of at
    least 16 MiB are added as calls need them, and a tensor that does not
    fit travels as bytes. Without a server on this host, or when it refuses
    regions, everything travels as bytes; that is logged once, at debug
    level, on the "convgrad" logger.

    Each op takes its two arrays (numpy arrays or CPU torch tensors of one
    dtype: float32, bfloat16 - uint16 bits for numpy - or float16) and the
    spec's attributes as keyword arguments: strides, pads_begin, pads_end,
    dilations, output_padding (lists of ints), groups, auto_pad ("none",
    "same_upper", "same_lower", "valid"), data_format ("NXC" default,
    "NCX"), weights_format ("XIO"/"XOI" default, "OIX", "IOX"), dst_shape,
    weights_shape. deadline= overrides the client's for one call.

    The inputs are uploaded from their own memory. With out= (a contiguous
    array or tensor of the result's shape and dtype) the result is written
    into it and out is returned; without, the result is returned in the
    memory libcgclient received it in (no copy), as a numpy array, or a
    tensor when the inputs were tensors. with_result=True returns
    (array, CallResult) instead."""

    def __init__(self, target, deadline=60.0, retries=5, shm="auto",
                 shm_bytes=SHM_BYTES, **options):
        self._lib = L.load()
        self._ch = None
        self._arena = None
        if shm not in ("auto", True, False):
            raise InvalidArgument("shm: %r; accepted: 'auto', True, False"
                                  % (shm,))
        self._shm = shm
        self._shm_bytes = int(shm_bytes)
        self._shm_decided = shm is False
        self._args = (target, deadline, retries,
                      dict(options, shm=shm, shm_bytes=shm_bytes))
        opts = L.Options()
        self._lib.cgc_options_init(C.byref(opts))
        opts.deadline_ms = _ms(deadline)
        opts.retries = retries
        for k, v in options.items():
            if k in _STRING_OPTIONS:
                if v is not None:
                    setattr(opts, _STRING_OPTIONS[k], os.fsencode(v))
                continue
            if k not in _OPTIONS:
                raise TypeError("Client: unknown option %r (known: %s)"
                                % (k, ", ".join(_OPTIONS + tuple(
                                    _STRING_OPTIONS))))
            setattr(opts, k, v)
        ch = C.c_void_p()
        err = C.create_string_buffer(L.MESSAGE_MAX)
        rc = self._lib.cgc_channel_new(C.byref(ch), target.encode(),
                                       C.byref(opts), err, len(err))
        if rc != 0:
            raise from_status(3 if rc == -1 else 8,
                              err.value.decode(errors="replace"), rc)
        self._ch = ch
        self._lock = threading.Lock()
        self._shm_lock = threading.Lock()
        self._stats = dict(calls=0, retries=0, bytes_sent=0, bytes_received=0,
                           compute_ms=0.0, queue_ms=0.0, total_ms=0.0,
                           staged_bytes=0)
        self._stager = None  # stage_async's threads, made on first use
        # One replica: a call's parts pipeline over the one server.
        self._pipelines = options.get("replicas") == 1
        self._stage_off = ""  # why offload stopped staging, once it did
        # offload stages src under private ids until a server refuses them
        self._private_ids = True
        self._src_stages = []  # offload's latest src stages (torch.py)

    @property
    def target(self):
        """The gRPC target the channel uses (a host:port list rewritten to
        an ipv4:/ipv6: list)."""
        return self._lib.cgc_channel_target(self._channel()).decode()

    def close(self):
        """Closes the channel and the arena (its regions unregistered and
        removed; arrays over them stay valid); calls still running must
        have returned, and futures been collected."""
        if self._stager is not None:
            self._stager.shutdown(wait=True)
            self._stager = None
        if self._arena is not None:
            self._arena.close()
        if self._ch is not None:
            self._lib.cgc_channel_free(self._ch)
            self._ch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __deepcopy__(self, memo):
        # A deep copy of a model shares its client (and the channel).
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        target, deadline, retries, options = self._args
        return (_new_client, (target, deadline, retries, options))

    def __del__(self):
        if getattr(self, "_ch", None) is not None:
            self.close()

    def _channel(self):
        if self._ch is None:
            raise Error("the client is closed", 9)
        return self._ch

    def stats(self, reset=False):
        """Totals over the successful op calls of this client: calls,
        retries (attempts past each call's first: a replica that failed
        or went away under the call, or lacked a staged input),
        bytes_sent, bytes_received,
        compute_ms, queue_ms, total_ms;
        staged_bytes, what stage() uploaded;
        arena_bytes, the shared-memory regions its arena holds (0 when
        tensors travel as bytes); and the client's own result checks
        (verify_rate) since the Client was made, whatever reset says:
        verify_calls, verify_outputs (checked), verify_failed,
        verify_recovered, verify_lost. reset=True starts new totals after
        reading."""
        with self._lock:
            s = dict(self._stats)
            if reset:
                for k in self._stats:
                    self._stats[k] = 0
        arena = self._arena
        s["arena_bytes"] = arena.total if arena and not arena.closed else 0
        v = L.VerifyStats()
        self._lib.cgc_verify_stats_get(self._channel(), C.byref(v))
        for k, _ in L.VerifyStats._fields_:
            s["verify_" + k] = getattr(v, k)
        return s

    def _count(self, res):
        with self._lock:
            s = self._stats
            s["calls"] += 1
            s["retries"] += res.attempts - 1
            s["bytes_sent"] += res.bytes_sent
            s["bytes_received"] += res.bytes_received
            s["compute_ms"] += res.compute_ms
            s["queue_ms"] += res.queue_ms
            s["total_ms"] += res.total_ms

    def arena(self):
        """The shared-memory arena the client's tensors go through, or
        None when they travel as bytes (shm=False, a server elsewhere or
        refusing regions, a bound reached at once). Decided on first use:
        the target must be a unix socket or loopback, the server's info
        must offer regions, and the first region must register."""
        if self._shm_decided:
            return self._arena
        with self._shm_lock:
            if not self._shm_decided:
                self._arena = self._open_arena()
                self._shm_decided = True
        return self._arena

    def _open_arena(self):
        why = None
        if not _on_this_host(self.target):
            why = "the server %s is not on this host" % self.target
        else:
            try:
                policy = self.info().get("shm", "")
            except Error as e:
                policy, why = "", "GetServerInfo failed (%s)" % e
            if why is None and policy not in ("local", "on"):
                why = "the server serves no regions (shm %r)" % (
                    policy or "unknown")
        arena = None
        if why is None:
            arena = _arena.Arena(self, self._shm_bytes)
            try:
                if arena.grow(1) is None:
                    why = "no region could be made"
            except Error as e:
                why = "the server refused a region: %s" % e
        if why is not None:
            log.debug("convgrad: %s: tensors travel as bytes", why)
            return None
        _with_arenas.add(self)
        return arena

    def _drop_arena(self, why):
        """Falls back to bytes for good after a call failed over regions
        (a server restarted without them); logged once at debug level."""
        with self._shm_lock:
            arena, self._arena = self._arena, None
            self._shm_decided = True
        if arena is not None:
            log.debug("convgrad: %s: tensors travel as bytes from now on",
                      why)
            arena.close()

    def health(self, service="", deadline=None):
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ..."""
        out = C.c_int()
        st = L.Status()
        rc = self._lib.cgc_health(self._channel(), service.encode(),
                                  _ms(deadline), C.byref(out), C.byref(st))
        self._check(rc, st)
        return L.HEALTH.get(out.value, "UNKNOWN")

    def info(self, deadline=None):
        """The server's GetServerInfo as a dict."""
        p = C.POINTER(L.ServerInfo)()
        st = L.Status()
        rc = self._lib.cgc_server_info_get(self._channel(), _ms(deadline),
                                           C.byref(p), C.byref(st))
        self._check(rc, st)
        try:
            i = p.contents
            d = {f: getattr(i, f) for f, _ in L.ServerInfo._fields_
                 if f not in ("ops", "n_ops", "dtypes", "n_dtypes", "cpus",
                              "n_cpus", "io_cpus", "n_io_cpus", "priv_")}
            for k in ("version", "onednn_version", "cpu_isa",
                      "threads_policy", "shm"):
                d[k] = (d[k] or b"").decode()
            d["ops"] = [{"names": [o.names[j].decode()
                                   for j in range(o.n_names)],
                         "inputs": [o.inputs[j].decode()
                                    for j in range(o.n_inputs)],
                         "output": (o.output or b"").decode(),
                         "outputs": [o.outputs[j].decode()
                                     for j in range(o.n_outputs)]}
                        for o in i.ops[:i.n_ops]]
            d["dtypes"] = {_DTYPE_NAMES.get(t.dtype, str(t.dtype)):
                           bool(t.native) for t in i.dtypes[:i.n_dtypes]}
            d["cpus"] = list(i.cpus[:i.n_cpus])
            d["io_cpus"] = list(i.io_cpus[:i.n_io_cpus])
            return d
        finally:
            self._lib.cgc_server_info_free(p)

    def conv_backward_data(self, diff_dst, weights, out=None, **attrs):
        """ConvolutionBackwardData: diff_src of a convolution from diff_dst
        and weights. dst_shape (the diff_src shape, in data_format order)
        is inferred from the forward relation when not given."""
        return self._op(L.OP_CONV_BWD_DATA, [("diff_dst", diff_dst),
                                             ("weights", weights)], out, attrs)

    def conv_backward_weights(self, src, diff_dst, out=None, **attrs):
        """ConvolutionBackwardWeights: diff_weights of a convolution from
        src and diff_dst; weights_shape (in weights_format order) is
        required."""
        return self._op(L.OP_CONV_BWD_WEIGHTS, [("src", src),
                                                ("diff_dst", diff_dst)],
                        out, attrs)

    def conv_transpose_backward_data(self, diff_dst, weights, out=None,
                                     **attrs):
        """ConvTransposeBackwardData: diff_src of a transposed convolution
        from diff_dst and weights."""
        return self._op(L.OP_DECONV_BWD_DATA, [("diff_dst", diff_dst),
                                               ("weights", weights)],
                        out, attrs)

    def conv_transpose_backward_weights(self, src, diff_dst, out=None,
                                        **attrs):
        """ConvTransposeBackwardWeights: diff_weights of a transposed
        convolution from src and diff_dst; weights_shape is required."""
        return self._op(L.OP_DECONV_BWD_WEIGHTS, [("src", src),
                                                  ("diff_dst", diff_dst)],
                        out, attrs)

    def stage(self, a, deadline=None, private=False):
        """Uploads array a (numpy or CPU tensor) into the server's store
        of staged tensors ahead of the calls that need it, unless the
        server holds that content already (by SHA-256: data-parallel ranks
        upload shared weights once). Returns a Staged to pass to calls in
        a's place. Blocks (the GIL released): run it on a thread to
        overlap it with other work. Raises FailedPrecondition from a
        server without a store, and once libcgclient turned staging off
        for this client (its target spreads calls over servers that share
        no store: proto/SEMANTICS.md, "A pool behind one target").
        private=True: for bytes no other caller has (a layer's input),
        nothing is hashed and the Staged has a random id only this
        client's peer can name (cgc_stage_private); a server that
        predates private ids raises InvalidArgument."""
        x = _Array("array", a)
        id_buf = (C.c_ubyte * L.STAGED_ID_BYTES)()
        res = L.StageResult()
        st = L.Status()
        fn = self._lib.cgc_stage_private if private else self._lib.cgc_stage
        rc = fn(self._channel(), x.ptr, x.nbytes, _ms(deadline), id_buf,
                C.byref(res), C.byref(st))
        self._check(rc, st)
        with self._lock:
            self._stats["staged_bytes"] += res.bytes_sent
        return Staged(x, id_buf, res)

    def stage_async(self, a, deadline=None, private=False):
        """stage() on one of this client's two staging threads: returns a
        concurrent.futures.Future of the Staged at once. a must stay
        unchanged until it is used."""
        with self._lock:
            if self._stager is None:
                self._stager = concurrent.futures.ThreadPoolExecutor(
                    2, thread_name_prefix="convgrad-stage")
            stager = self._stager
        return stager.submit(self.stage, a, deadline, private)

    def conv_backward(self, src, diff_dst, weights, outputs=None, out=None,
                      **attrs):
        """ConvolutionBackward: a convolution layer's gradients in one call,
        src, diff_dst and weights sent once. outputs names the ones wanted
        (default all: "diff_src", "diff_weights", "diff_bias"; a first layer
        skips diff_src). Returns a dict of them; out, a dict of arrays,
        receives them in place instead."""
        return self._op(L.OP_CONV_BWD, [("src", src), ("diff_dst", diff_dst),
                                        ("weights", weights)],
                        out, attrs, outputs)

    def conv_transpose_backward(self, src, diff_dst, weights, outputs=None,
                                out=None, **attrs):
        """ConvTransposeBackward: conv_backward for a transposed
        convolution."""
        return self._op(L.OP_DECONV_BWD, [("src", src),
                                          ("diff_dst", diff_dst),
                                          ("weights", weights)],
                        out, attrs, outputs)

    def conv_backward_async(self, src, diff_dst, weights, outputs=None,
                            out=None, **attrs):
        """conv_backward started and not waited for: returns a Future at
        once, the call running on libcgclient's engine (cgc_call_start: one
        thread per channel drives every call in flight), so one thread may
        keep many calls in flight. The arrays (and out's) must stay
        unchanged until the Future is collected. out: a dict of arrays to
        receive the outputs, else they are allocated (in the arena with
        shm=True)."""
        return self._start(L.OP_CONV_BWD, [("src", src),
                                           ("diff_dst", diff_dst),
                                           ("weights", weights)],
                           out, attrs, outputs)

    def conv_transpose_backward_async(self, src, diff_dst, weights,
                                      outputs=None, out=None, **attrs):
        """conv_transpose_backward as a Future (see conv_backward_async)."""
        return self._start(L.OP_DECONV_BWD, [("src", src),
                                             ("diff_dst", diff_dst),
                                             ("weights", weights)],
                           out, attrs, outputs)

    def local_rows(self, src, diff_dst, weights, measured, local_ms,
                   transposed=False, outputs=None, **attrs):
        """How many of the first rows of the minibatch of a layer call
        (conv_backward's arguments, conv_transpose_backward's with
        transposed=True) the caller should compute itself, its own time
        for the call whole being local_ms, while the server computes the
        rest, so that the call ends soonest. measured: the CallResult of
        a call of this shape whole on this client (with_result=True),
        whose compute time and bytes on the wire tell the server's speed
        and the link's. 0 when a share would not end the call 5 % sooner
        (libcgclient's cgc_local_rows; client/python/README.md, "A share
        for the trainer")."""
        op = L.OP_DECONV_BWD if transposed else L.OP_CONV_BWD
        req, keep, ins, _ = self._request(op, [("src", src),
                                               ("diff_dst", diff_dst),
                                               ("weights", weights)],
                                          attrs, outputs)
        rows = C.c_int64()
        st = L.Status()
        rc = self._lib.cgc_local_rows(self._channel(), C.byref(req),
                                      C.byref(measured._raw), local_ms,
                                      C.byref(rows), C.byref(st))
        del keep, ins
        self._check(rc, st)
        return rows.value

    def _request(self, op, inputs, attrs, outputs):
        """The cgc_request of an op call, the arrays and lists it points to
        (to keep while it runs), and the call's with_result."""
        with_result = attrs.pop("with_result", False)
        deadline = attrs.pop("deadline", None)
        req = L.Request()
        self._lib.cgc_request_init(C.byref(req))
        req.op = op
        req.deadline_ms = _ms(deadline)
        if op in (L.OP_CONV_BWD, L.OP_DECONV_BWD):
            req.grads = _grads(outputs)
        keep = _attrs(req.attrs, attrs)
        ins = [_Array(name, a) for name, a in inputs]
        for x in ins[1:]:
            if x.dtype != ins[0].dtype:
                raise InvalidArgument("%s: %s but %s is %s; every input must "
                                      "have one dtype" % (
                                          x.name, _DTYPE_NAMES[x.dtype],
                                          ins[0].name,
                                          _DTYPE_NAMES[ins[0].dtype]))
        if self._shm is True:
            ins = self._stage(ins)
        for i, x in enumerate(ins):
            x.view(req.inputs[i])
        return req, keep, ins, with_result

    def _stage(self, ins):
        """ins copied into the arena (shm=True), each that fits."""
        arena = self.arena()
        if arena is None:
            return ins
        staged = []
        for x in ins:
            a = arena.array(x.shape, _NP_OF[x.dtype])
            if a is None:
                staged.append(x)
                continue
            src = x.array
            if x.torch:
                src = src.view(sys.modules["torch"].int16) if (
                    x.dtype == L.DTYPE_BF16) else src
                src = src.numpy()
            np.copyto(a, src.view(a.dtype), casting="no")
            y = _Array(x.name, a)
            y.dtype, y.torch = x.dtype, x.torch
            staged.append(y)
        return staged

    def _start(self, op, inputs, out, attrs, outputs):
        req, keep, ins, with_result = self._request(op, inputs, attrs,
                                                    outputs)
        names = [g for i, g in enumerate(L.GRADS) if req.grads & (1 << i)]
        if out is None:
            arena = self.arena() if self._shm is True else None
            out = {g: _new_output(arena, ins, g, req.attrs, op)
                   for g in names}
        arrs, data, caps = _out_arrays(out, names, ins[0].dtype)
        call = C.c_void_p()
        st = L.Status()
        rc = self._lib.cgc_call_start(self._channel(), C.byref(req), data,
                                      caps, C.byref(call), C.byref(st))
        self._check(rc, st)
        return Future(self, call, (req, keep, ins, arrs), out, with_result)

    def _check(self, rc, st):
        if rc == 0:
            return
        msg = st.message.decode(errors="replace")
        if not msg:
            msg = self._lib.cgc_strerror(rc).decode()
        raise from_status(st.code if st.code else 2, msg, rc)

    def _op(self, op, inputs, out, attrs, outputs=None):
        layer = op in (L.OP_CONV_BWD, L.OP_DECONV_BWD)
        if layer and out is None and self._shm is True and self.arena():
            # The results land in the arena: no copy, nothing on the wire.
            return self._start(op, inputs, None, attrs, outputs).result()
        req, keep, ins, with_result = self._request(op, inputs, attrs,
                                                    outputs)
        res = L.Result()
        st = L.Status()
        if layer:
            result = self._layer(req, res, st, out, ins[0])
        elif out is not None:
            result = self._single_into(req, res, st, out, ins[0])
        else:
            p = C.POINTER(L.Tensor)()
            rc = self._lib.cgc_compute(self._channel(), C.byref(req),
                                       C.byref(p), C.byref(res), C.byref(st))
            self._check(rc, st)
            result = _wrap(self._lib, p, ins[0].torch)
        del keep, ins
        self._count(res)
        return (result, CallResult(res)) if with_result else result

    def _single_into(self, req, res, st, out, first):
        o = _Array("out", out, writable=True)
        if o.dtype != first.dtype:
            raise InvalidArgument("out: %s but the inputs are %s" % (
                _DTYPE_NAMES[o.dtype], _DTYPE_NAMES[first.dtype]))
        t = L.Tensor()
        rc = self._lib.cgc_compute_into(self._channel(), C.byref(req), o.ptr,
                                        o.nbytes, C.byref(t), C.byref(res),
                                        C.byref(st))
        self._check(rc, st)
        _check_out_shape("out", o, t)
        return out

    def _layer(self, req, res, st, out, first):
        """The outputs of a layer op as a dict, in out's arrays if given."""
        names = [g for i, g in enumerate(L.GRADS) if req.grads & (1 << i)]
        if out is None:
            ps = (C.POINTER(L.Tensor) * L.GRAD_COUNT)()
            rc = self._lib.cgc_compute_layer(self._channel(), C.byref(req),
                                             ps, C.byref(res), C.byref(st))
            self._check(rc, st)
            return {g: _wrap(self._lib, ps[L.GRADS.index(g)], first.torch)
                    for g in names}
        arrs, data, caps = _out_arrays(out, names, first.dtype)
        ts = (L.Tensor * L.GRAD_COUNT)()
        rc = self._lib.cgc_compute_layer_into(self._channel(), C.byref(req),
                                              data, caps, ts, C.byref(res),
                                              C.byref(st))
        self._check(rc, st)
        for g, o in arrs.items():
            _check_out_shape(o.name, o, ts[L.GRADS.index(g)])
        return out


class Future:
    """A layer call in flight (Client.conv_backward_async and
    conv_transpose_backward_async): its outputs can be collected one by
    one as they arrive (output()), or all at once (result()). Every output
    asked for is whole once result() returns; the call's arrays must stay
    unchanged until then. Thread-safe."""

    def __init__(self, client, call, keep, out, with_result):
        self._client, self._call, self._keep = client, call, keep
        self._out, self._with_result = out, with_result
        self._names = tuple(out)
        self._lock = threading.Lock()
        self._outcome = None  # (result, error) once finished

    def done(self):
        """True once the call has ended (result() will not wait)."""
        with self._lock:
            if self._outcome is not None:
                return True
            return bool(self._client._lib.cgc_call_done(self._call))

    def output(self, name, timeout=None):
        """Output name ("diff_src", ...) as soon as it is whole, while the
        rest of the call goes on: its data is final. Raises the call's
        error if it ended without it, TimeoutError after timeout
        seconds."""
        if name not in self._names:
            raise InvalidArgument("output: %r was not asked for (%s)"
                                  % (name, ", ".join(self._names)))
        self._wait(1 << L.GRADS.index(name), timeout)
        with self._lock:
            if self._outcome is None:
                return self._out[name]
        result = self.result()
        return (result[0] if self._with_result else result)[name]

    def result(self, timeout=None):
        """Waits for the end of the call and returns the dict of its
        outputs (with a CallResult when the call said with_result=True).
        Raises the call's error, or TimeoutError after timeout seconds (the
        call goes on)."""
        if timeout is not None:
            self._wait(0, timeout)
        with self._lock:
            if self._outcome is None:
                self._outcome = self._finish()
            result, error = self._outcome
        if error is not None:
            raise error
        return result

    def _wait(self, grads, timeout):
        with self._lock:
            if self._outcome is not None:
                if self._outcome[1] is not None:
                    raise self._outcome[1]
                return
            st = L.Status()
            lib = self._client._lib
            rc = lib.cgc_call_wait(self._call, grads,
                                   -1 if timeout is None else
                                   int(timeout * 1000), C.byref(st))
        if rc == L.CGC_ETIMEDOUT:
            raise TimeoutError("the call goes on after %.3f s" % timeout)
        self._client._check(rc, st)

    def _finish(self):
        """cgc_call_finish (once): (result, None) or (None, error)."""
        lib = self._client._lib
        ts = (L.Tensor * L.GRAD_COUNT)()
        res = L.Result()
        st = L.Status()
        rc = lib.cgc_call_finish(self._call, ts, C.byref(res), C.byref(st))
        self._call = None
        arrs = self._keep[3]
        self._keep = None  # the inputs may go
        try:
            self._client._check(rc, st)
            for g, o in arrs.items():
                _check_out_shape(o.name, o, ts[L.GRADS.index(g)])
        except Error as e:
            return None, e
        self._client._count(res)
        out, self._out = self._out, None
        return ((out, CallResult(res)) if self._with_result else out), None

    def __del__(self):
        # A call must be finished once: an abandoned future waits for it.
        if getattr(self, "_call", None) is not None and self._outcome is None:
            self._finish()


def _out_arrays(out, names, dtype):
    """The caller's output arrays of a layer op (out: a dict with exactly
    the outputs in names, each of the inputs' dtype), and the pointer and
    capacity arrays libcgclient takes, indexed by gradient."""
    if not isinstance(out, dict) or set(out) != set(names):
        raise InvalidArgument("out: a dict with exactly the outputs "
                              "asked for (%s)" % ", ".join(names))
    arrs = {g: _Array("out[%r]" % g, out[g], writable=True) for g in names}
    data = (C.c_void_p * L.GRAD_COUNT)()
    caps = (C.c_size_t * L.GRAD_COUNT)()
    for g, o in arrs.items():
        if o.dtype != dtype:
            raise InvalidArgument("%s: %s but the inputs are %s" % (
                o.name, _DTYPE_NAMES[o.dtype], _DTYPE_NAMES[dtype]))
        data[L.GRADS.index(g)] = o.ptr
        caps[L.GRADS.index(g)] = o.nbytes
    return arrs, data, caps


def _on_this_host(target):
    """True when every server target names is on this host: a unix
    socket, or loopback addresses (names resolved now)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    if target.startswith(("ipv4:", "ipv6:")):
        items = target.split(":", 1)[1].lstrip("/").split(",")
    elif target.startswith("dns:"):
        items = [target[4:].lstrip("/").split("/")[-1]]
    else:
        items = target.split(",")
    for item in items:
        host = item.rsplit(":", 1)[0].strip("[]")
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        if not addrs or not all(
                ipaddress.ip_address(a.split("%")[0]).is_loopback
                for a in addrs):
            return False
    return True


def _close_arenas():
    for client in list(_with_arenas):
        if client._arena is not None:
            client._arena.close()


atexit.register(_close_arenas)


def _bias_len(op, wshape, attrs):
    """OC of a layer op from its weights' shape and format (SEMANTICS.md,
    "Weights layouts")."""
    groups = max(1, attrs.groups)
    fmt = {v: k for k, v in L.WEIGHTS_FORMAT.items()}.get(
        attrs.weights_format, "XIO" if op == L.OP_CONV_BWD else "XOI")
    if op == L.OP_CONV_BWD:
        return wshape[0] if fmt == "OIX" else wshape[-1]
    # ConvTranspose: IOX (IC, OCg, K), XOI (K, OCg, IC), and the older
    # spellings OIX (OCg, IC, K), XIO (K, IC, OCg).
    return groups * {"IOX": wshape[1], "XOI": wshape[-2], "OIX": wshape[0],
                     "XIO": wshape[-1]}[fmt]


def _new_output(arena, ins, g, attrs, op):
    """An uninitialised array for output g of a layer op on ins (src,
    diff_dst, weights): in the arena when given and there is room, a
    tensor when the inputs are tensors."""
    src, w = ins[0], ins[2]
    shape = {"diff_src": src.shape, "diff_weights": w.shape,
             "diff_bias": (_bias_len(op, w.shape, attrs),)}[g]
    dt = _NP_OF[src.dtype]
    a = arena.array(shape, dt) if arena is not None else None
    if a is None:
        a = np.empty(shape, dt)
    if not src.torch:
        return a
    torch = sys.modules["torch"]
    if src.dtype == L.DTYPE_BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _check_out_shape(name, o, t):
    dims = tuple(t.dims[:t.rank])
    if dims != o.shape:
        raise InvalidArgument("%s: shape %s but the result is %s"
                              % (name, o.shape, dims))


def _grads(outputs):
    """The cg_grad mask of a list of output names (None: all)."""
    if outputs is None:
        return (1 << L.GRAD_COUNT) - 1
    if isinstance(outputs, str):
        outputs = [outputs]
    mask = 0
    for name in outputs:
        if name not in L.GRADS:
            raise InvalidArgument("outputs: %r; accepted: %s"
                                  % (name, ", ".join(L.GRADS)))
        mask |= 1 << L.GRADS.index(name)
    if not mask:
        raise InvalidArgument("outputs: empty; name at least one of %s"
                              % ", ".join(L.GRADS))
    return mask


def _new_client(target, deadline, retries, options):
    return Client(target, deadline, retries, **options)


def _wrap(lib, p, as_torch):
    """The owned result p as an array over its own memory, freed with the
    last array that uses it."""
    t = p.contents
    buf = (C.c_uint8 * t.nbytes).from_address(t.data)
    buf._owner = _Owned(lib, p)
    arr = np.frombuffer(buf, dtype=_NP_OF[t.dtype]).reshape(t.dims[:t.rank])
    if not as_torch:
        return arr
    torch = sys.modules["torch"]
    if t.dtype == L.DTYPE_BF16:
        # torch has no uint16; the bits go through int16.
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _ints(name, v, keep):
    out = L.Ints()
    if v is None:
        return out
    try:
        vals = [int(x) for x in v]
    except TypeError:
        raise InvalidArgument("%s: expected a list of ints, got %r"
                              % (name, v)) from None
    arr = (C.c_int64 * max(1, len(vals)))(*vals)
    keep.append(arr)
    out.v = C.cast(arr, C.POINTER(C.c_int64))
    out.len = len(vals)
    return out


def _enum(name, table, v):
    key = v.lower() if name == "auto_pad" else v.upper()
    if key not in table:
        raise InvalidArgument("%s: %r; accepted: %s"
                              % (name, v, ", ".join(table)))
    return table[key]


def _attrs(a, attrs):
    """Fills the cg_attrs a; returns the int arrays it points to."""
    keep = []
    for name in ("strides", "pads_begin", "pads_end", "dilations",
                 "output_padding", "dst_shape", "weights_shape"):
        setattr(a, name, _ints(name, attrs.pop(name, None), keep))
    a.groups = int(attrs.pop("groups", 1))
    for name, table in (("auto_pad", L.AUTO_PAD),
                        ("data_format", L.DATA_FORMAT),
                        ("weights_format", L.WEIGHTS_FORMAT)):
        v = attrs.pop(name, None)
        if v is not None:
            setattr(a, name, _enum(name, table, v))
    if attrs:
        raise TypeError("unknown attribute(s): %s" % ", ".join(sorted(attrs)))
    return keep
