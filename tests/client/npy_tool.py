"""npy_tool.py - NumPy side of the client's .npy interop test.

make DIR: writes diff_dst (2,6,7,7) and OIX weights (6,4,3,3) as f32 '<f4',
f16 '<f2' and bf16 (raw bits as '<u2', round to nearest even), plus a
Fortran-order and an f64 file that the CLI must reject.
check FILE DTYPE D0,D1,..: the CLI's output loads with that dtype and shape
and holds finite values.
"""
import sys

import numpy as np


def to_bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make(d):
    rng = np.random.default_rng(5)
    dd = rng.uniform(-1, 1, (2, 6, 7, 7)).astype(np.float32)
    w = rng.uniform(-1, 1, (6, 4, 3, 3)).astype(np.float32)
    for name, a in (("dd", dd), ("w", w)):
        np.save(f"{d}/{name}_f32.npy", a)
        np.save(f"{d}/{name}_f16.npy", a.astype(np.float16))
        np.save(f"{d}/{name}_bf16.npy", to_bf16_bits(a))
    np.save(f"{d}/fortran.npy", np.asfortranarray(dd))
    np.save(f"{d}/f64.npy", dd.astype(np.float64))


def check(path, dtype, shape):
    a = np.load(path)
    want = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dtype]
    assert a.dtype == want, (a.dtype, want)
    assert a.shape == tuple(int(x) for x in shape.split(",")), a.shape
    f = (a.astype(np.uint32) << 16).view(np.float32) if dtype == "bf16" else a
    assert np.all(np.isfinite(f)) and np.any(f != 0)
    print("ok", path, a.dtype, a.shape)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4])
