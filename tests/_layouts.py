"""NumPy arrays of every memory layout a caller may pass: aligned or not, strided, big-endian,
read-only, Fortran order (each a copy of ``a``'s values)."""

import numpy as np

from lstm_tvm import _host_arrays


def aligned_copy(a):
    out = _host_arrays.aligned_empty(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def offset_copy(a, offset):
    buf = _host_arrays.aligned_empty(a.nbytes + 64)
    out = buf[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def misaligned_copy(a):
    """Off a 64-byte boundary by one element: the CPU kernels read it in place."""
    return offset_copy(a, a.itemsize)


def unaligned_copy(a):
    """Off its element's alignment (NumPy's flags.aligned is False): copied."""
    return offset_copy(a, 1)


def strided(a):
    wide = np.zeros(a.shape + (2,), a.dtype)
    wide[..., 0] = a
    return wide[..., 0]


def big_endian(a):
    return a.astype(a.dtype.newbyteorder(">"))


def read_only(a):
    out = a.copy()
    out.flags.writeable = False
    return out


def fortran(a):
    return np.asfortranarray(a)


LAYOUTS = [aligned_copy, misaligned_copy, unaligned_copy, strided, big_endian, read_only,
           fortran]
