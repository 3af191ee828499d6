"""convgrad.Region: a POSIX shared-memory region made by libcgclient and
mapped for numpy, whose arrays a Client sends by reference once the region
is registered on its channel. The arena (_arena.py) carves its slots out of
such regions."""
import ctypes as C

import numpy as np

from . import _lib as L
from .errors import InvalidArgument, from_status


class _Mapping:
    """A region's memory as numpy sees it (__array_interface__). Every
    array over it holds this object, which frees the region (unregistering
    it if need be) when the last of them is gone: an array never outlives
    the memory it views."""

    def __init__(self, lib, p, nbytes):
        self.lib, self.p = lib, p
        self.__array_interface__ = {
            "data": (lib.cgc_region_data(p), False), "shape": (nbytes,),
            "typestr": "|u1", "version": 3}

    def __del__(self):
        self.lib.cgc_region_free(self.p)


class Region:
    """A POSIX shared-memory region for a server on this host (a unix
    socket or loopback target): once registered on a Client, the arrays
    made by array() or tensor() travel by reference, inputs and out= alike,
    and no tensor byte crosses the socket. The region must stay unchanged
    while calls read it.

        r = convgrad.Region(64 << 20)
        r.register(client)
        dy = r.array((8, 56, 56, 64), np.float32)
        w = r.array((3, 3, 64, 64), np.float32, offset=dy.nbytes)
        ...fill dy and w, then...
        client.conv_backward_data(dy, w, out=r.array(...), ...)

    nbytes: its size; key: "/NAME" (default: a fresh name). The object is
    removed when the Region and every array over it are gone."""

    def __init__(self, nbytes, key=None):
        lib = L.load()
        p = C.c_void_p()
        err = C.create_string_buffer(256)
        rc = lib.cgc_region_create(C.byref(p), key.encode() if key else None,
                                   int(nbytes), err, len(err))
        if rc != 0:
            raise from_status(3 if rc in (-1, -2) else 13,
                              err.value.decode(errors="replace"), rc)
        self._lib = lib
        self._map = _Mapping(lib, p, int(nbytes))
        self.nbytes = int(nbytes)
        self.key = lib.cgc_region_key(p).decode()
        self.bytes = np.asarray(self._map)

    def array(self, shape, dtype=np.float32, offset=0):
        """A C-contiguous numpy array of shape and dtype (float32, float16,
        or uint16 for bf16 bits) at offset (a multiple of its element
        size) in the region."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        if offset % dtype.itemsize or offset < 0 or offset + n > self.nbytes:
            raise InvalidArgument(
                "Region.array: %d bytes at offset %d do not fit %s (%d bytes,"
                " offsets multiples of %d)" % (n, offset, self.key,
                                               self.nbytes, dtype.itemsize))
        return self.bytes[offset:offset + n].view(dtype).reshape(shape)

    def tensor(self, shape, dtype=None, offset=0):
        """array() as a CPU torch tensor sharing the memory (dtype: a torch
        dtype, default float32; bfloat16 allowed)."""
        import torch
        dtype = dtype or torch.float32
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                    torch.bfloat16: np.int16}[dtype]
        t = torch.from_numpy(self.array(shape, np_dtype, offset))
        return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t

    def register(self, client):
        """RegisterRegion on client's server; from then on client sends
        arrays in this region by reference."""
        st = L.Status()
        rc = self._lib.cgc_region_register(client._channel(), self._map.p,
                                           C.byref(st))
        client._check(rc, st)

    def unregister(self):
        """UnregisterRegion: the arrays travel as bytes again."""
        st = L.Status()
        rc = self._lib.cgc_region_unregister(self._map.p, C.byref(st))
        if rc != 0:
            msg = st.message.decode(errors="replace")
            raise from_status(st.code if st.code else 9, msg, rc)
