"""The shared-memory arena of a Client: regions registered once on its
channel and carved into slots, so that tensors on their way to a server on
this host travel by reference with nothing registered per call.

The arena grows by whole regions (at least GROW_BYTES, doubling what it
holds) until it reaches its limit; a slot that does not fit is refused
(None) and its tensor travels as bytes. A slot is free again once the last
array or tensor over it is gone. close() unregisters the regions and
removes their names (nothing is left in /dev/shm), while arrays still over
them stay valid.

A torch tensor over a slot (tensor()) is made through DLPack, with libc's
free as its deleter (it frees the small DLManagedTensor block, nothing
else), not by torch.from_numpy: that tensor's storage holds the numpy
array, and releasing it takes the GIL. Autograd may release such a tensor
after the interpreter has finalized: the tasks a failed backward pass left
in the engine's thread-local ready queue go with the thread's
thread-local storage, and taking the GIL there hung the exiting process.
A slot lent to a torch tensor is kept by _LENT until a weak reference to
the tensor's storage says it is gone, checked when an arena finds no room
(before it grows)."""
import collections
import ctypes as C
import logging
import threading
import weakref

import numpy as np

from . import _lib as L
from ._region import Region

log = logging.getLogger("convgrad")

ALIGN = 64  # bytes; a cache line, and AVX-512's vector
GROW_BYTES = 16 << 20


def _round_up(n, to):
    return (n + to - 1) // to * to


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8),
                ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice),
                ("ndim", C.c_int32), ("dtype", _DLDataType),
                ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)),
                ("byte_offset", C.c_uint64)]


class _DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", C.c_void_p),
                ("deleter", C.c_void_p)]


_DL_CPU = 1
_DL_FLOAT, _DL_BFLOAT = 2, 4
_libc = C.CDLL(None)
_libc.malloc.restype = C.c_void_p
_libc.malloc.argtypes = [C.c_size_t]
_libc.free.argtypes = [C.c_void_p]
_FREE = C.cast(_libc.free, C.c_void_p).value
_capsule = C.pythonapi.PyCapsule_New
_capsule.restype = C.py_object
_capsule.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]

# (weak reference to a torch storage, the array of the slot it is over)
_LENT = []
_lent_lock = threading.Lock()


def _torch_over(a, dtype):
    """A torch tensor of dtype (float32, float16, bfloat16) over the memory
    of a, a C-contiguous array of a slot, whose release takes no GIL; a's
    slot stays taken while the tensor's storage lives."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    code, bits = {torch.float32: (_DL_FLOAT, 32),
                  torch.float16: (_DL_FLOAT, 16),
                  torch.bfloat16: (_DL_BFLOAT, 16)}[dtype]
    n = a.ndim
    # The block and its shape, which torch reads until the deleter runs.
    p = _libc.malloc(C.sizeof(_DLManagedTensor) + 8 * max(n, 1))
    if not p:
        raise MemoryError("convgrad: no memory for a DLPack tensor")
    shape = (C.c_int64 * max(n, 1)).from_address(
        p + C.sizeof(_DLManagedTensor))
    shape[:n] = a.shape
    m = _DLManagedTensor.from_address(p)
    m.dl_tensor = _DLTensor(a.ctypes.data, _DLDevice(_DL_CPU, 0), n,
                            _DLDataType(code, bits, 1),
                            C.cast(shape, C.POINTER(C.c_int64)), None, 0)
    m.manager_ctx = None
    m.deleter = _FREE
    try:
        t = torch.utils.dlpack.from_dlpack(_capsule(p, b"dltensor", None))
    except BaseException:
        _libc.free(p)
        raise
    storage = getattr(t, "untyped_storage", t.storage)()
    with _lent_lock:
        _LENT.append((StorageWeakRef(storage), a))
    return t


def _reclaim():
    """Gives back the slots whose torch tensors are all gone."""
    keep, gone = [], []
    with _lent_lock:
        for x in _LENT:
            (gone if x[0].expired() else keep).append(x)
        _LENT[:] = keep
    del gone  # the arrays go, and with them the slots (_Slot.__del__)


class _Space:
    """One region of the arena and its free extents, first fit, merged
    when freed."""

    def __init__(self, region):
        self.region = region
        self.base = region.bytes.ctypes.data
        self.free = [(0, region.nbytes)]  # (offset, bytes), by offset

    def take(self, n):
        for i, (off, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = (off + n, size - n)
                return off
        return None

    def give(self, off, n):
        i = 0
        while i < len(self.free) and self.free[i][0] < off:
            i += 1
        self.free.insert(i, (off, n))
        # merge with the next, then the previous extent
        if i + 1 < len(self.free) and off + n == self.free[i + 1][0]:
            self.free[i] = (off, n + self.free[i + 1][1])
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            self.free[i - 1] = (self.free[i - 1][0],
                                self.free[i - 1][1] + self.free[i][1])
            del self.free[i]


class _Slot:
    """numpy's view of n bytes at off in a space (__array_interface__).
    Every array over the slot holds this object, which gives the bytes
    back when the last of them is gone. Freeing only queues them: it may
    run on any thread, at any time (the arena's lock may be held)."""

    def __init__(self, freed, space, off, n):
        self.freed, self.space, self.off, self.n = freed, space, off, n
        self.__array_interface__ = {
            "data": (space.base + off, False), "shape": (n,),
            "typestr": "|u1", "version": 3}

    def __del__(self):
        self.freed.append((self.space, self.off, self.n))


class Arena:
    """Slots in shared-memory regions registered on client's channel, at
    most limit bytes of regions in all. Thread-safe."""

    def __init__(self, client, limit):
        self._client = weakref.ref(client)
        self.limit = int(limit)
        self.total = 0
        self._spaces = []
        self._freed = collections.deque()  # appended by _Slot.__del__
        self._lock = threading.Lock()
        self.closed = False

    def grow(self, need):
        """Adds a region of at least need bytes; returns it, or None (with
        the reason logged at debug level) when the limit, /dev/shm or the
        server refuses. Raises what the first registration raises, for the
        caller to decide about the arena."""
        from .errors import Error
        size = max(_round_up(need, 1 << 20), GROW_BYTES, self.total)
        size = min(size, self.limit - self.total)
        if size < need:
            return None
        try:
            region = Region(size)
        except Error as e:
            log.debug("convgrad: no region of %d bytes (%s): tensors that "
                      "do not fit the arena travel as bytes", size, e)
            self.limit = self.total
            return None
        try:
            region.register(self._client())
        except Error:
            if self._spaces:
                log.debug("convgrad: the server refused another region: "
                          "the arena stays at %d bytes", self.total)
                self.limit = self.total
                return None
            raise
        space = _Space(region)
        self._spaces.append(space)
        self.total += size
        return space

    def _fit(self, n):
        while self._freed:
            space, off, size = self._freed.popleft()
            space.give(off, size)
        for space in self._spaces:
            off = space.take(n)
            if off is not None:
                return space, off
        return None, None

    def _take(self, n):
        space, off = self._fit(n)
        if space is None:
            _reclaim()
            space, off = self._fit(n)
        if space is not None:
            return space, off
        space = self.grow(n)
        if space is None:
            return None, None
        return space, space.take(n)

    def array(self, shape, dtype):
        """An uninitialised C-contiguous numpy array in a slot, or None
        when the arena cannot hold it."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            if self.closed:
                return None
            space, off = self._take(_round_up(max(n, 1), ALIGN))
        if space is None:
            return None
        slot = _Slot(self._freed, space, off, _round_up(max(n, 1), ALIGN))
        return np.asarray(slot)[:n].view(dtype).reshape(shape)

    def holds(self, ptr, nbytes):
        """Whether the nbytes at address ptr lie in one region of the
        arena, where a call reads them in place."""
        with self._lock:
            return any(sp.base <= ptr and ptr + nbytes <= sp.base +
                       sp.region.nbytes for sp in self._spaces)

    def tensor(self, shape, dtype):
        """array() as a torch tensor of a torch dtype, or None."""
        import torch
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                    torch.bfloat16: np.int16}[dtype]
        a = self.array(tuple(shape), np_dtype)
        return None if a is None else _torch_over(a, dtype)

    def close(self):
        """Unregisters the regions and removes their names; arrays over
        them stay valid, and the memory goes with the last of them."""
        with self._lock:
            self.closed = True
            spaces, self._spaces = self._spaces, []
        st = L.Status()
        for space in spaces:
            space.region._lib.cgc_region_unlink(space.region._map.p,
                                                C.byref(st))
