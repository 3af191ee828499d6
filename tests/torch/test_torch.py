#!/usr/bin/python3
"""tests/torch/test_torch.py - cross-checks libcgkernels against PyTorch.

Owns the independent check of the four ops: for a seeded set of small
problems it builds a cg_problem through ctypes, resolves it, runs it on the
oneDNN engine (cg_engine_run) and on the plain-C reference
(cg_reference_run), and compares both with the gradient PyTorch's autograd
computes for the forward Convolution / ConvTranspose with the same
attributes. Every backward-weights case is also run as the layer op
(ConvolutionBackward / ConvTransposeBackward) with a random subset of
outputs, through cg_layer_resolve, cg_engine_run_layer and
cg_reference_layer, against torch's gradients of the input, the weights and
a bias. The expected geometry (auto_pad pads, inferred shapes, implied
output_padding, output dims) is derived here from SEMANTICS.md, not read
back from the library, and checked against the cg_geom.

Ground truth is torch in float64 with mkldnn disabled: torch links the same
libdnnl as the engine, and float64 keeps it on torch's own loops, so the
check is independent of oneDNN. Inputs are rounded to the request's dtype
first, so the only legitimate differences are the engine's f32 summation
order and the final rounding to the output dtype.

Usage: test_torch.py PATH/libcgkernels.so [--seed S] [--cases N]
Prints one summary line per op and dtype and ends with "N passed, M failed";
exits 1 when anything failed. Run with /usr/bin/python3 (Debian's, which has
torch and numpy)."""

import argparse
import copy
import ctypes as C
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# ---- the C API, mirrored from kernels/include/cg/{problem,engine}.h ------

OP_CONV_BWD_DATA, OP_CONV_BWD_WEIGHTS = 1, 2
OP_DECONV_BWD_DATA, OP_DECONV_BWD_WEIGHTS = 3, 4
OP_CONV_BWD, OP_DECONV_BWD = 5, 6
OP_NAMES = {1: "ConvolutionBackwardData", 2: "ConvolutionBackwardWeights",
            3: "ConvTransposeBackwardData", 4: "ConvTransposeBackwardWeights",
            5: "ConvolutionBackward", 6: "ConvTransposeBackward"}
GRADS = ("diff_src", "diff_weights", "diff_bias")
DT_F32, DT_BF16, DT_F16 = 1, 2, 3
DT_NAMES = {DT_F32: "f32", DT_BF16: "bf16", DT_F16: "f16"}
DATA_DEFAULT, NCX, NXC = 0, 1, 2
W_DEFAULT, OIX, XIO, IOX, XOI = 0, 1, 2, 3, 4
FMT_NAMES = {0: "default", 1: "OIX", 2: "XIO", 3: "IOX", 4: "XOI"}
DFMT_NAMES = {0: "default", 1: "NCX", 2: "NXC"}
AP_NONE, AP_SAME_UPPER, AP_SAME_LOWER, AP_VALID = 0, 1, 2, 3
AP_NAMES = {0: "none", 1: "same_upper", 2: "same_lower", 3: "valid"}
MAX_SPATIAL, MAX_RANK = 3, 5


class Ints(C.Structure):
    _fields_ = [("v", C.POINTER(C.c_int64)), ("len", C.c_size_t)]


class Attrs(C.Structure):
    _fields_ = [("strides", Ints), ("pads_begin", Ints), ("pads_end", Ints),
                ("dilations", Ints), ("output_padding", Ints),
                ("groups", C.c_int64), ("auto_pad", C.c_int),
                ("data_format", C.c_int), ("weights_format", C.c_int),
                ("dst_shape", Ints), ("weights_shape", Ints)]


class Problem(C.Structure):
    _fields_ = [("op", C.c_int), ("dtype", C.c_int), ("attrs", Attrs),
                ("input_dims", Ints * 3), ("has_shape_input", C.c_int),
                ("shape_input", Ints), ("out_data_format", C.c_int),
                ("out_weights_format", C.c_int), ("grads", C.c_uint)]


class Geom(C.Structure):
    _fields_ = [("op", C.c_int), ("dtype", C.c_int), ("nsp", C.c_int),
                ("mb", C.c_int64), ("groups", C.c_int64),
                ("ic", C.c_int64), ("oc", C.c_int64),
                ("in_sp", C.c_int64 * MAX_SPATIAL),
                ("out_sp", C.c_int64 * MAX_SPATIAL),
                ("kernel", C.c_int64 * MAX_SPATIAL),
                ("stride", C.c_int64 * MAX_SPATIAL),
                ("dilation", C.c_int64 * MAX_SPATIAL),
                ("pad_begin", C.c_int64 * MAX_SPATIAL),
                ("pad_end", C.c_int64 * MAX_SPATIAL),
                ("output_padding", C.c_int64 * MAX_SPATIAL),
                ("data_format", C.c_int), ("weights_format", C.c_int),
                ("out_data_format", C.c_int), ("out_weights_format", C.c_int),
                ("in_rank", C.c_int),
                ("in_dims", (C.c_int64 * MAX_RANK) * 2),
                ("in_elems", C.c_size_t * 2), ("in_bytes", C.c_size_t * 2),
                ("out_dims", C.c_int64 * MAX_RANK),
                ("out_elems", C.c_size_t), ("out_bytes", C.c_size_t),
                ("flops", C.c_double)]


class Layer(C.Structure):
    _fields_ = [("op", C.c_int), ("dtype", C.c_int), ("grads", C.c_uint),
                ("ninputs", C.c_int), ("in_bytes", C.c_size_t * 3),
                ("data", Geom), ("weights", Geom),
                ("data_in", C.c_int * 2), ("weights_in", C.c_int * 2),
                ("out_rank", C.c_int * 3),
                ("out_dims", (C.c_int64 * MAX_RANK) * 3),
                ("out_elems", C.c_size_t * 3), ("out_bytes", C.c_size_t * 3)]


class EngineConfig(C.Structure):
    _fields_ = [("threads", C.c_int), ("cache_capacity", C.c_size_t)]


class RunInfo(C.Structure):
    _fields_ = [("path", C.c_int), ("cache_hit", C.c_int),
                ("impl", C.c_char_p), ("compute_ms", C.c_double),
                ("threads", C.c_int), ("runs", C.c_uint64)]


def load_library(path):
    lib = C.CDLL(path)
    P, G = C.POINTER(Problem), C.POINTER(Geom)
    err = [C.c_char_p, C.c_size_t]
    sig = {
        "cg_problem_init": (None, [P]),
        "cg_problem_resolve": (C.c_int, [P, G] + err),
        "cg_engine_new": (C.c_int, [C.POINTER(C.c_void_p),
                                    C.POINTER(EngineConfig)] + err),
        "cg_engine_free": (None, [C.c_void_p]),
        "cg_engine_run": (C.c_int, [C.c_void_p, G, C.c_void_p, C.c_void_p,
                                    C.c_void_p, C.POINTER(RunInfo)] + err),
        "cg_reference_run": (C.c_int, [G, C.c_void_p, C.c_void_p,
                                       C.c_void_p] + err),
        "cg_reference_forward": (C.c_int, [G, C.c_void_p, C.c_void_p,
                                           C.c_void_p] + err),
        "cg_layer_resolve": (C.c_int, [P, C.POINTER(Layer)] + err),
        "cg_engine_run_layer": (C.c_int, [C.c_void_p, C.POINTER(Layer),
                                          C.c_void_p * 3, C.c_void_p * 3,
                                          RunInfo * 3] + err),
        "cg_reference_layer": (C.c_int, [C.POINTER(Layer), C.c_void_p * 3,
                                         C.c_void_p * 3] + err),
        "cg_backend_version": (C.c_char_p, []),
        "cg_backend_isa": (C.c_char_p, []),
        "cg_backend_dtype_native": (C.c_int, [C.c_int]),
        "cg_dtype_epsilon": (C.c_double, [C.c_int]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def c_ints(values, keep):
    """A cg_ints over values; the backing array is appended to keep so it
    lives as long as the problem that borrows it."""
    if values is None or len(values) == 0:
        return Ints(None, 0)
    arr = (C.c_int64 * len(values))(*[int(v) for v in values])
    keep.append(arr)
    return Ints(C.cast(arr, C.POINTER(C.c_int64)), len(values))


# ---- dtypes: rounding done here, independently of cg_f32_to_* -----------

# Unit roundoff of each output type; f32 accumulation uses 2^-24.
UNIT = {DT_F32: 2.0 ** -24, DT_BF16: 2.0 ** -8, DT_F16: 2.0 ** -11}
F32_UNIT, F64_UNIT = 2.0 ** -24, 2.0 ** -53


def to_bits(x, dt):
    """float32 array -> buffer contents of dtype dt (round to nearest even)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dt == DT_F32:
        return x
    if dt == DT_F16:
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(b, dt):
    if dt == DT_F32:
        return b.astype(np.float64)
    if dt == DT_F16:
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def np_dtype(dt):
    return np.float32 if dt == DT_F32 else np.uint16


# ---- layouts: torch is NCX with OIX (conv) / IOX (ConvTranspose) --------

def data_perm(fmt, nsp):
    """Axis order that turns an NCX array into fmt."""
    if fmt == NCX:
        return list(range(nsp + 2))
    return [0] + list(range(2, nsp + 2)) + [1]


def weights_perm(deconv, fmt, nsp):
    """Axis order that turns torch's weights into fmt. Torch holds
    Convolution weights as (OC, ICg, K) = OIX and ConvTranspose weights as
    (IC, OCg, K) = IOX; every ConvTranspose spelling holds (OCg, IC)."""
    k = list(range(2, nsp + 2))
    if not deconv:
        return {OIX: [0, 1] + k, XIO: k + [1, 0]}[fmt]
    return {IOX: [0, 1] + k, OIX: [1, 0] + k, XOI: k + [1, 0],
            XIO: k + [0, 1]}[fmt]


def to_layout(a, perm):
    return np.ascontiguousarray(np.transpose(a, perm))


def from_layout(a, perm):
    return np.ascontiguousarray(np.transpose(a, np.argsort(perm)))


# ---- problem generation --------------------------------------------------

def same_pads(total, ap):
    """SEMANTICS.md auto_pad split: SAME_UPPER puts the odd unit at the end,
    SAME_LOWER at the beginning."""
    pb = total // 2 if ap == AP_SAME_UPPER else (total + 1) // 2
    return pb, total - pb


class Case:
    """One problem: the forward geometry (torch's view) plus how it is
    presented to convgrad (formats, which lists are given, shape mode)."""

    def describe(self):
        return ("#%d %s %s nsp=%d N=%d IC=%d OC=%d g=%d in=%s out=%s K=%s "
                "S=%s D=%s pads=%s/%s op=%s auto_pad=%s data=%s(out %s) "
                "w=%s(out %s) shape=%s" % (
                    self.idx, OP_NAMES[self.op], DT_NAMES[self.dt], self.nsp,
                    self.n, self.ic, self.oc, self.g, self.in_sp, self.out_sp,
                    self.k, self.s, self.d, self.pb, self.pe, self.opad,
                    AP_NAMES[self.ap], DFMT_NAMES[self.dfmt_req],
                    DFMT_NAMES[self.out_dfmt_req], FMT_NAMES[self.wfmt_req],
                    FMT_NAMES[self.out_wfmt_req], self.shape_mode))


def rint(rng, lo, hi):
    """Uniform integer in [lo, hi]."""
    return int(rng.randint(lo, hi + 1))


def gen_case(rng, idx, op, dt):
    c = Case()
    c.idx, c.op, c.dt = idx, op, dt
    c.deconv = op in (OP_DECONV_BWD_DATA, OP_DECONV_BWD_WEIGHTS)
    nsp = c.nsp = int(rng.choice([1, 2, 3], p=[0.35, 0.4, 0.25]))
    kind = rng.choice(["plain", "grouped", "depthwise", "wide"],
                      p=[0.45, 0.25, 0.2, 0.1])
    if kind == "wide":
        # Channel counts oneDNN blocks by 16: its jit/brgemm/AMX kernels.
        c.g = int(rng.choice([1, 1, 2]))
        icg, ocg = int(rng.choice([16, 32])), int(rng.choice([16, 32]))
    elif kind == "plain":
        c.g, icg, ocg = 1, rint(rng, 1, 4), rint(rng, 1, 4)
    elif kind == "grouped":
        c.g, icg, ocg = rint(rng, 2, 3), rint(rng, 1, 3), rint(rng, 1, 3)
    else:
        c.g, icg, ocg = rint(rng, 2, 6), 1, 1
    c.ic, c.oc, c.n = c.g * icg, c.g * ocg, rint(rng, 1, 2)
    kmax = {1: 5, 2: 3, 3: 3}[nsp]
    c.k = [rint(rng, 1, kmax) for _ in range(nsp)]
    c.s = [int(rng.choice([1, 1, 2, 3])) for _ in range(nsp)]
    dils = [1, 1, 2, 3] if nsp == 1 else [1, 1, 2]
    c.d = [int(rng.choice(dils)) for _ in range(nsp)]
    ek = [(k - 1) * d + 1 for k, d in zip(c.k, c.d)]
    c.ap = int(rng.choice([AP_NONE, AP_SAME_UPPER, AP_SAME_LOWER, AP_VALID],
                          p=[0.55, 0.15, 0.15, 0.15]))
    c.pb, c.pe, c.in_sp, c.out_sp = [], [], [], []
    c.opad = [0] * nsp
    for a in range(nsp):
        S, EK = c.s[a], ek[a]
        if not c.deconv:
            maxin = {1: 14, 2: 8, 3: 5}[nsp]
            if c.ap in (AP_SAME_UPPER, AP_SAME_LOWER):
                xi = rint(rng, 1, maxin)
                t = max(0, (-(-xi // S) - 1) * S + EK - xi)
                pb, pe = same_pads(t, c.ap)
            else:
                pb = pe = 0
                if c.ap == AP_NONE and rng.rand() < 0.7:
                    pb, pe = rint(rng, 0, EK), rint(rng, 0, EK)
                lo = max(1, EK - pb - pe)
                xi = rint(rng, lo, max(lo, maxin))
            xo = (xi + pb + pe - EK) // S + 1
        else:
            maxin = {1: 7, 2: 4, 3: 3}[nsp]
            xi = rint(rng, 1, maxin)
            if rng.rand() < 0.5:
                c.opad[a] = rint(rng, 0, max(S, c.d[a]) - 1)
            if c.ap in (AP_SAME_UPPER, AP_SAME_LOWER):
                pb, pe = same_pads(max(0, EK - S), c.ap)
            elif c.ap == AP_VALID:
                pb = pe = 0
            else:
                full = S * (xi - 1) + EK + c.opad[a]
                pb = rint(rng, 0, min(EK, full - 1))
                pe = rint(rng, 0, min(EK, full - 1 - pb))
            xo = S * (xi - 1) + EK - pb - pe + c.opad[a]
        assert xo >= 1, "generator produced an empty output"
        c.pb.append(pb)
        c.pe.append(pe)
        c.in_sp.append(xi)
        c.out_sp.append(xo)

    c.dfmt_req = int(rng.choice([DATA_DEFAULT, NCX, NXC]))
    c.dfmt = NXC if c.dfmt_req == DATA_DEFAULT else c.dfmt_req
    wfmts = [OIX, XIO, IOX, XOI] if c.deconv else [OIX, XIO]
    c.wfmt_req = int(rng.choice([W_DEFAULT] + wfmts))
    c.wfmt = c.wfmt_req or (XOI if c.deconv else XIO)
    c.out_dfmt_req = c.out_wfmt_req = 0
    if op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA):
        if rng.rand() < 0.5:
            c.out_dfmt_req = int(rng.choice([NCX, NXC]))
    elif rng.rand() < 0.5:
        c.out_wfmt_req = int(rng.choice(wfmts))
    c.out_dfmt = c.out_dfmt_req or c.dfmt
    c.out_wfmt = c.out_wfmt_req or c.wfmt

    # How the output shape reaches convgrad.
    c.shape_mode = "none"
    c.pass_opad = False
    if op == OP_CONV_BWD_DATA:
        modes = ["attr", "input", "both"]
        if c.ap in (AP_NONE, AP_VALID):
            modes.append("infer")
        c.shape_mode = str(rng.choice(modes))
        if c.shape_mode == "infer":
            # Older spec / PyTorch: the size is S*(Xo-1) + EK - PB - PE + op.
            c.opad = [(xi + pb + pe - e) % s for xi, pb, pe, e, s in
                      zip(c.in_sp, c.pb, c.pe, ek, c.s)]
            c.pass_opad = any(c.opad) or rng.rand() < 0.3
    elif op in (OP_CONV_BWD_WEIGHTS, OP_DECONV_BWD_WEIGHTS):
        c.shape_mode = str(rng.choice(["attr", "input", "both"]))
    if op == OP_DECONV_BWD_DATA:
        # Without output_padding diff_src is floor((Xo+PB+PE-EK)/S)+1, which
        # is the forward size only when output_padding < S.
        c.pass_opad = any(o >= s for o, s in zip(c.opad, c.s)) or \
            rng.rand() < 0.5
    elif op == OP_DECONV_BWD_WEIGHTS:
        c.pass_opad = rng.rand() < 0.5
    c.ek = ek
    return c


def data_dims(fmt, n, ch, sp):
    return [n, ch] + list(sp) if fmt == NCX else [n] + list(sp) + [ch]


def torch_weights_shape(c):
    if c.deconv:
        return [c.ic, c.oc // c.g] + c.k
    return [c.oc, c.ic // c.g] + c.k


def default_list(rng, values, neutral):
    """The list as a caller might send it: all-neutral lists are sometimes
    left empty, and all-zero pads sometimes sent as oneDNN's 12 zeros."""
    if all(v == neutral for v in values):
        r = rng.rand()
        if r < 0.4:
            return []
        if neutral == 0 and r < 0.6:
            return [0] * 12
    return list(values)


def build_problem(lib, rng, c, in_dims, keep):
    p = Problem()
    lib.cg_problem_init(C.byref(p))
    if p.attrs.groups != 1:
        raise RuntimeError("ctypes layout of cg_problem does not match "
                           "problem.h (groups != 1 after cg_problem_init)")
    p.op, p.dtype = c.op, c.dt
    a = p.attrs
    a.groups = c.g
    a.auto_pad = c.ap
    a.data_format, a.weights_format = c.dfmt_req, c.wfmt_req
    a.strides = c_ints(default_list(rng, c.s, 1), keep)
    a.dilations = c_ints(default_list(rng, c.d, 1), keep)
    if c.ap == AP_NONE:
        pb, pe = default_list(rng, c.pb, 0), default_list(rng, c.pe, 0)
    else:
        # Ignored (not validated) when auto_pad is set.
        r = rng.rand()
        if r < 0.4:
            pb = pe = []
        elif r < 0.7:
            pb = [rint(rng, 0, 99) for _ in range(c.nsp)]
            pe = [rint(rng, 0, 99) for _ in range(c.nsp + 1)]
        else:
            pb, pe = c.pb, c.pe
    a.pads_begin, a.pads_end = c_ints(pb, keep), c_ints(pe, keep)
    if c.pass_opad:
        a.output_padding = c_ints(default_list(rng, c.opad, 0) or c.opad,
                                  keep)
    for t in range(2):
        p.input_dims[t] = c_ints(in_dims[t], keep)

    if c.op == OP_CONV_BWD_DATA:
        shape = data_dims(c.dfmt, c.n, c.ic, c.in_sp)
    else:
        shape = to_layout(np.empty(torch_weights_shape(c), np.int8),
                          weights_perm(c.deconv, c.wfmt, c.nsp)).shape
    shape = list(shape)
    # "both": the shape input wins over a (different) attribute.
    wrong = [v + 1 for v in shape]
    field = "dst_shape" if c.op == OP_CONV_BWD_DATA else "weights_shape"
    if c.shape_mode == "attr":
        setattr(a, field, c_ints(shape, keep))
    elif c.shape_mode in ("input", "both"):
        p.has_shape_input = 1
        p.shape_input = c_ints(shape, keep)
        if c.shape_mode == "both":
            setattr(a, field, c_ints(wrong, keep))
    p.out_data_format, p.out_weights_format = c.out_dfmt_req, c.out_wfmt_req
    return p


# ---- torch ground truth ---------------------------------------------------

def torch_forward(c):
    """The forward op as torch computes it, with asymmetric pads: F.pad on
    the Convolution input, a crop of the ConvTranspose output."""
    nsp = c.nsp
    if not c.deconv:
        conv = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
        padspec = []
        for a in reversed(range(nsp)):
            padspec += [c.pb[a], c.pe[a]]

        def fwd(x, w):
            return conv(F.pad(x, padspec), w, stride=c.s, dilation=c.d,
                        groups=c.g)
        return fwd
    convt = (F.conv_transpose1d, F.conv_transpose2d,
             F.conv_transpose3d)[nsp - 1]
    crop = (slice(None), slice(None)) + tuple(
        slice(c.pb[a], c.pb[a] + c.out_sp[a]) for a in range(nsp))

    def fwd_t(x, w):
        y = convt(x, w, stride=c.s, padding=0, output_padding=c.opad,
                  groups=c.g, dilation=c.d)
        return y[crop]
    return fwd_t


def torch_grad(c, a, b):
    """Gradient of the op in torch layouts (float64 numpy in, out)."""
    fwd = torch_forward(c)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    if c.op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA):
        x = torch.zeros([c.n, c.ic] + c.in_sp, dtype=torch.float64,
                        requires_grad=True)
        y = fwd(x, tb)
        want, dy = x, ta
    else:
        w = torch.zeros(torch_weights_shape(c), dtype=torch.float64,
                        requires_grad=True)
        y = fwd(ta, w)
        want, dy = w, tb
    if list(y.shape) != [c.n, c.oc] + c.out_sp:
        raise RuntimeError("torch forward gives %s, expected %s" % (
            list(y.shape), [c.n, c.oc] + c.out_sp))
    (g,) = torch.autograd.grad(y, want, dy)
    return g.numpy()


def reduction_length(c, forward=False):
    """Number of products summed into one output element (upper bound) of
    the op, or of the forward op."""
    kp = int(np.prod(c.k))
    if forward:
        return (c.ic // c.g) * kp
    if c.op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA):
        return (c.oc // c.g) * kp
    sp = c.out_sp if c.op == OP_CONV_BWD_WEIGHTS else c.in_sp
    return c.n * int(np.prod(sp))


# ---- one case --------------------------------------------------------------

# What each case checks against torch: the op on oneDNN, the op on the
# reference, and the reference's forward op (the adjoint tests rely on it).
CHECKS = ("engine", "reference", "forward")


class Result:
    def __init__(self):
        self.ok, self.msgs = True, []
        self.rel = dict.fromkeys(CHECKS, 0.0)
        self.ratio = dict.fromkeys(CHECKS, 0.0)
        self.native = None
        self.impl = ""

    def fail(self, msg):
        self.ok = False
        self.msgs.append(msg)


def expected_geometry(c):
    """(field, expected) pairs of the cg_geom, from the spec alone."""
    out_dims = (data_dims(c.out_dfmt, c.n, c.ic, c.in_sp)
                if c.op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA) else
                list(to_layout(np.empty(torch_weights_shape(c), np.int8),
                               weights_perm(c.deconv, c.out_wfmt,
                                            c.nsp)).shape))
    ex = [("mb", c.n), ("groups", c.g), ("ic", c.ic), ("oc", c.oc),
          ("in_sp", c.in_sp), ("out_sp", c.out_sp), ("kernel", c.k),
          ("stride", c.s), ("dilation", c.d), ("pad_begin", c.pb),
          ("pad_end", c.pe), ("data_format", c.dfmt),
          ("weights_format", c.wfmt), ("out_dims", out_dims)]
    if c.deconv:
        ex.append(("output_padding", c.opad))
    return ex


def check_geometry(g, c, res):
    for field, want in expected_geometry(c):
        got = getattr(g, field)
        if isinstance(want, list):
            got = list(got)[:len(want)]
        if got != want:
            res.fail("geom.%s = %s, expected %s" % (field, got, want))


def compare(name, got, want, absum, c, L, acc_unit, res):
    """got/want/absum in torch layout; absum is the same op on |inputs|,
    i.e. the sum of |products| per element. Bound per element: final
    rounding u*|want| plus the summation error gamma_L * absum."""
    if not np.all(np.isfinite(got)):
        res.fail("%s: %d non-finite outputs (unwritten?)" %
                 (name, int(np.sum(~np.isfinite(got)))))
        return
    gamma = L * acc_unit / (1.0 - L * acc_unit)
    u = UNIT[c.dt]
    # f16 subnormals have a fixed spacing of 2^-24.
    tiny = 2.0 ** -25 if c.dt == DT_F16 else 1e-300
    bound = 1.5 * (u * np.abs(want) + (1.0 + u) * gamma * absum) + tiny
    err = np.abs(got - want)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    rel = float(np.max(err)) / scale if scale > 0 else float(np.max(err))
    ratio = float(np.max(err / bound))
    res.rel[name] = rel
    res.ratio[name] = ratio
    worst = np.unravel_index(int(np.argmax(err / bound)), err.shape)
    if ratio > 1.0:
        res.fail("%s: element %s = %.9g, torch %.9g (err %.3g > bound %.3g)"
                 % (name, tuple(int(i) for i in worst), got[worst],
                    want[worst], err[worst], bound[worst]))
    elif c.dt == DT_F32 and rel > 1e-5:
        res.fail("%s: relative error %.3g > 1e-5 of the output scale %.3g"
                 % (name, rel, scale))


def features(c):
    """Tags of what a case covers, counted for the coverage line."""
    fam = "deconv" if c.deconv else "conv"
    tags = ["rank%d" % c.nsp, DFMT_NAMES[c.dfmt],
            "%s w:%s" % (fam, FMT_NAMES[c.wfmt]), "auto_pad:" + AP_NAMES[c.ap]]
    if c.out_wfmt_req and c.out_wfmt != c.wfmt:
        tags.append("%s out_w:%s" % (fam, FMT_NAMES[c.out_wfmt]))
    if c.out_dfmt != c.dfmt:
        tags.append("out_data_changed")
    if c.g > 1:
        tags.append("%s %s" % (fam, "depthwise" if c.ic == c.g == c.oc
                               else "grouped"))
    if max(c.ic, c.oc) >= 16:
        tags.append("wide")
    tags += [t for t, on in (("strided", max(c.s) > 1),
                             ("dilated", max(c.d) > 1),
                             ("asym_pads", c.pb != c.pe),
                             ("output_padding", c.deconv and any(c.opad)),
                             ("output_padding>=stride", c.deconv and any(
                                 o >= s for o, s in zip(c.opad, c.s))),
                             ("pad>=EK", any(p >= e for p, e in
                                             zip(c.pb + c.pe, c.ek + c.ek))))
             if on]
    if c.shape_mode != "none":
        tags.append("shape:" + c.shape_mode)
    return tags


def random_input(rng, shape, perm, dt):
    """Uniform [-1, 1] values rounded to dt: (torch-layout float64 values,
    buffer laid out by perm)."""
    bits = to_bits(rng.uniform(-1.0, 1.0, size=shape).astype(np.float32), dt)
    return from_bits(bits, dt), to_layout(bits, perm)


def check_forward(lib, rng, c, g, res):
    """cg_reference_forward on geom g (input layouts) against torch."""
    x, xbuf = random_input(rng, [c.n, c.ic] + c.in_sp,
                           data_perm(c.dfmt, c.nsp), c.dt)
    w, wbuf = random_input(rng, torch_weights_shape(c),
                           weights_perm(c.deconv, c.wfmt, c.nsp), c.dt)
    out = np.empty(data_dims(c.dfmt, c.n, c.oc, c.out_sp), np_dtype(c.dt))
    out.fill(np.nan if c.dt == DT_F32 else 0xFFFF)
    err = C.create_string_buffer(512)
    rc = lib.cg_reference_forward(C.byref(g), xbuf.ctypes.data,
                                  wbuf.ctypes.data, out.ctypes.data, err,
                                  len(err))
    if rc != 0:
        res.fail("forward: rc %d %s" % (rc, err.value.decode()))
        return
    fwd = torch_forward(c)
    with torch.no_grad():
        want = fwd(torch.from_numpy(x), torch.from_numpy(w)).numpy()
        absum = fwd(torch.from_numpy(np.abs(x)),
                    torch.from_numpy(np.abs(w))).numpy()
    got = from_layout(from_bits(out, c.dt), data_perm(c.dfmt, c.nsp))
    compare("forward", got, want, absum, c, reduction_length(c, True),
            F64_UNIT, res)


def run_case(lib, eng, rng, c):
    res = Result()
    # Inputs in torch layout, rounded to the dtype, then laid out.
    if c.op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA):
        shapes = [[c.n, c.oc] + c.out_sp, torch_weights_shape(c)]
        perms = [data_perm(c.dfmt, c.nsp),
                 weights_perm(c.deconv, c.wfmt, c.nsp)]
    else:
        shapes = [[c.n, c.ic] + c.in_sp, [c.n, c.oc] + c.out_sp]
        perms = [data_perm(c.dfmt, c.nsp)] * 2
    tins, bufs = zip(*[random_input(rng, shape, perm, c.dt)
                       for shape, perm in zip(shapes, perms)])
    keep = []
    p = build_problem(lib, rng, c, [list(b.shape) for b in bufs], keep)
    g = Geom()
    err = C.create_string_buffer(512)
    rc = lib.cg_problem_resolve(C.byref(p), C.byref(g), err, len(err))
    if rc != 0:
        res.fail("cg_problem_resolve: %d %s" % (rc, err.value.decode()))
        return res
    check_geometry(g, c, res)
    if not res.ok:
        return res
    for t in range(2):
        if g.in_bytes[t] != bufs[t].nbytes:
            res.fail("geom.in_bytes[%d] = %d, buffer has %d" %
                     (t, g.in_bytes[t], bufs[t].nbytes))
            return res

    if c.op in (OP_CONV_BWD_DATA, OP_DECONV_BWD_DATA):
        out_perm = data_perm(c.out_dfmt, c.nsp)
    else:
        out_perm = weights_perm(c.deconv, c.out_wfmt, c.nsp)
    want = torch_grad(c, tins[0], tins[1])
    absum = torch_grad(c, np.abs(tins[0]), np.abs(tins[1]))

    outs = {}
    for name in ("engine", "reference"):
        out = np.empty(list(g.out_dims)[:c.nsp + 2], np_dtype(c.dt))
        out.fill(np.nan if c.dt == DT_F32 else 0xFFFF)  # NaN in bf16/f16
        if name == "engine":
            info = RunInfo()
            rc = lib.cg_engine_run(eng, C.byref(g), bufs[0].ctypes.data,
                                   bufs[1].ctypes.data, out.ctypes.data,
                                   C.byref(info), err, len(err))
            res.native = info.path == 0
            res.impl = (info.impl or b"").decode()
        else:
            rc = lib.cg_reference_run(C.byref(g), bufs[0].ctypes.data,
                                      bufs[1].ctypes.data, out.ctypes.data,
                                      err, len(err))
        if rc != 0:
            res.fail("%s: rc %d %s" % (name, rc, err.value.decode()))
            continue
        outs[name] = from_layout(from_bits(out, c.dt), out_perm)
    for name, got in outs.items():
        compare(name, got, want, absum, c, reduction_length(c),
                F32_UNIT if name == "engine" else F64_UNIT, res)
    check_forward(lib, rng, c, g, res)
    return res


def run_layer_case(lib, eng, rng, c):
    """c (a backward-weights case) as its layer op with a random subset of
    outputs: each output of the engine and of the reference against torch's
    gradient of the input, the weights and a bias of the forward op."""
    res = Result()
    x, xbuf = random_input(rng, [c.n, c.ic] + c.in_sp,
                           data_perm(c.dfmt, c.nsp), c.dt)
    dy, dybuf = random_input(rng, [c.n, c.oc] + c.out_sp,
                             data_perm(c.dfmt, c.nsp), c.dt)
    w, wbuf = random_input(rng, torch_weights_shape(c),
                           weights_perm(c.deconv, c.wfmt, c.nsp), c.dt)
    bufs = (xbuf, dybuf, wbuf)
    keep = []
    lc = copy.copy(c)
    lc.shape_mode = "none"
    p = build_problem(lib, rng, lc, [list(b.shape) for b in bufs[:2]], keep)
    p.op = OP_DECONV_BWD if c.deconv else OP_CONV_BWD
    p.input_dims[2] = c_ints(list(wbuf.shape), keep)
    p.grads = int(rng.randint(1, 8))
    lay = Layer()
    err = C.create_string_buffer(512)
    rc = lib.cg_layer_resolve(C.byref(p), C.byref(lay), err, len(err))
    if rc != 0:
        res.fail("cg_layer_resolve: %d %s" % (rc, err.value.decode()))
        return res, p.grads
    data_c = copy.copy(c)
    data_c.op = OP_DECONV_BWD_DATA if c.deconv else OP_CONV_BWD_DATA
    axes = (0,) + tuple(range(2, 2 + c.nsp))
    want = {"diff_src": (torch_grad(data_c, dy, w),
                         torch_grad(data_c, np.abs(dy), np.abs(w)),
                         reduction_length(data_c),
                         data_perm(c.dfmt, c.nsp)),
            "diff_weights": (torch_grad(c, x, dy),
                             torch_grad(c, np.abs(x), np.abs(dy)),
                             reduction_length(c),
                             weights_perm(c.deconv, c.out_wfmt, c.nsp)),
            "diff_bias": (dy.sum(axis=axes), np.abs(dy).sum(axis=axes),
                          c.n * int(np.prod(c.out_sp)), [0])}
    ins = (C.c_void_p * 3)(*[b.ctypes.data for b in bufs])
    for name in ("engine", "reference"):
        outs, ptrs = {}, (C.c_void_p * 3)()
        for i, g in enumerate(GRADS):
            if p.grads & (1 << i):
                o = np.empty(list(lay.out_dims[i])[:lay.out_rank[i]],
                             np_dtype(c.dt))
                o.fill(np.nan if c.dt == DT_F32 else 0xFFFF)
                outs[g], ptrs[i] = o, o.ctypes.data
        if name == "engine":
            infos = (RunInfo * 3)()
            rc = lib.cg_engine_run_layer(eng, C.byref(lay), ins, ptrs, infos,
                                         err, len(err))
        else:
            rc = lib.cg_reference_layer(C.byref(lay), ins, ptrs, err,
                                        len(err))
        if rc != 0:
            res.fail("layer %s: rc %d %s" % (name, rc, err.value.decode()))
            continue
        for g, o in outs.items():
            wv, ab, length, perm = want[g]
            compare("%s %s" % (name, g), from_layout(from_bits(o, c.dt), perm),
                    wv, ab, c, length,
                    F32_UNIT if name == "engine" else F64_UNIT, res)
    return res, p.grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library", help="path of libcgkernels.so")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--cases", type=int, default=600)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    lib = load_library(args.library)
    for dt, u in UNIT.items():
        if lib.cg_dtype_epsilon(dt) != u:
            print("cg_dtype_epsilon(%s) = %g, expected %g" %
                  (DT_NAMES[dt], lib.cg_dtype_epsilon(dt), u))
            return 1
    eng = C.c_void_p()
    err = C.create_string_buffer(512)
    cfg = EngineConfig(2, 0)
    if lib.cg_engine_new(C.byref(eng), C.byref(cfg), err, len(err)) != 0:
        print("cg_engine_new: %s" % err.value.decode())
        return 1
    print("oneDNN %s, ISA %s, native bf16 %d, f16 %d; torch %s; seed %d" % (
        lib.cg_backend_version().decode(), lib.cg_backend_isa().decode(),
        lib.cg_backend_dtype_native(DT_BF16),
        lib.cg_backend_dtype_native(DT_F16), torch.__version__, args.seed))

    rng = np.random.RandomState(args.seed)
    dts = [DT_F32, DT_BF16, DT_F32, DT_F16]
    stats, cover, impls = {}, {}, {}
    passed = failed = 0
    t0 = time.monotonic()
    try:
        for i in range(args.cases):
            op = 1 + i % 4
            dt = dts[(i // 4) % 4]
            c = gen_case(rng, i, op, dt)
            res = run_case(lib, eng, rng, c)
            st = stats.setdefault((op, dt), {"n": 0, "fail": 0, "rel": {},
                                             "ratio": {}})
            st["n"] += 1
            for t in features(c) + ["native" if res.native else "converted"]:
                cover[t] = cover.get(t, 0) + 1
            impls[res.impl] = impls.get(res.impl, 0) + 1
            for k in CHECKS:
                st["rel"][k] = max(st["rel"].get(k, 0.0), res.rel[k])
                st["ratio"][k] = max(st["ratio"].get(k, 0.0), res.ratio[k])
            if res.ok:
                passed += 1
            else:
                failed += 1
                st["fail"] += 1
                print("FAIL %s" % c.describe())
                for m in res.msgs:
                    print("  %s" % m)
            if op not in (OP_CONV_BWD_WEIGHTS, OP_DECONV_BWD_WEIGHTS):
                continue
            lres, grads = run_layer_case(lib, eng, rng, c)
            lop = OP_DECONV_BWD if c.deconv else OP_CONV_BWD
            lst = stats.setdefault((lop, dt), {"n": 0, "fail": 0, "rel": {},
                                               "ratio": {}})
            lst["n"] += 1
            for k, v in lres.rel.items():
                if k not in CHECKS:
                    lst["rel"][k] = max(lst["rel"].get(k, 0.0), v)
                    lst["ratio"][k] = max(lst["ratio"].get(k, 0.0),
                                          lres.ratio[k])
            for i, g in enumerate(GRADS):
                if grads & (1 << i):
                    cover["layer:" + g] = cover.get("layer:" + g, 0) + 1
            if lres.ok:
                passed += 1
            else:
                failed += 1
                lst["fail"] += 1
                print("FAIL %s as %s, outputs 0x%x" % (
                    c.describe(), OP_NAMES[lop], grads))
                for m in lres.msgs:
                    print("  %s" % m)
    finally:
        lib.cg_engine_free(eng)
    for (op, dt), st in sorted(stats.items()):
        print("%-28s %-4s %3d cases, %d failed; max rel err / err:bound: %s"
              % (OP_NAMES[op], DT_NAMES[dt], st["n"], st["fail"], ", ".join(
                  "%s %.2e / %.3f" % (k, st["rel"][k], st["ratio"][k])
                  for k in sorted(st["rel"]))))
    print("coverage: " +
          ", ".join("%s %d" % kv for kv in sorted(cover.items())))
    print("oneDNN implementations: " +
          ", ".join("%s %d" % kv for kv in sorted(impls.items())))
    print("%.1f s" % (time.monotonic() - t0))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
