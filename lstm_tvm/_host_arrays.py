"""NumPy arrays handed to CPU kernels without copies, and aligned output arrays.

CPU kernels read their inputs wherever they lie (aligned to their element size, see
:func:`lstm_tvm.kernels._builder.cpu_variants`), so a NumPy array is passed by DLPack when
it is C-contiguous, writeable, aligned (NumPy's flag), in native byte order and of 16 KiB or
more (below, a copy costs no more than the checks); any other array is copied once into an
aligned staging buffer of the calling thread (reused from call to call). Outputs, which the
kernels write with vector stores that assume TVM's 64-byte alignment, are this module's own.
Outputs are views into one aligned buffer per call; a thread reuses its last buffer only when
nothing references it any more (the caller dropped every output of that call), so an output
the caller keeps is never overwritten and a serving loop touches no fresh memory.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import tvm_ffi

__all__ = ["ALIGNMENT", "OutputLayout", "aligned_empty", "kernel_args"]

#: The data alignment TVM's kernels assume.
ALIGNMENT = 64

_local = threading.local()


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data is :data:`ALIGNMENT`-aligned (a
    view; its ``base`` owns the memory, and every view made of it refers to that base)."""
    return _aligned(np.empty(nbytes + ALIGNMENT, np.uint8), nbytes)


def _aligned(raw: np.ndarray, nbytes: int) -> np.ndarray:
    start = -raw.__array_interface__["data"][0] % ALIGNMENT
    return raw[start:start + nbytes]


#: Configurations a thread keeps buffers for (all are dropped past it).
_POOL_SIZE = 256
#: Inputs smaller than this are copied even when aligned: checking costs about as much.
_COPY_BELOW = 16384


def kernel_args(arrays, slot, unread=frozenset()) -> list:
    """TVM tensors reading ``arrays``: their own memory when the kernels can read it in place,
    else copies in the calling thread's staging buffers for ``slot`` (a hashable naming the
    call's configuration: every call with one ``slot`` passes arrays of the same shapes and
    dtypes, in the same order, and the same ``unread``; its buffers are reused by its next call
    in the thread). ``unread``: positions of arrays the kernel never reads; a small one is
    not copied (its tensor is a buffer of NaN: were it read after all, the outputs say so)."""
    pool = _pool("inputs")
    staged = pool.get(slot)
    if staged is None:
        if len(pool) > _POOL_SIZE:
            pool.clear()
        staged = pool[slot] = _Staging(arrays, unread)
    out = list(staged.tensors)
    for i, view in staged.small:
        view[...] = arrays[i]  # same shape; the dtype differs at most in byte order
    for i in staged.large:
        array = arrays[i]
        flags = array.flags
        if flags.c_contiguous and flags.writeable and flags.aligned and array.dtype.isnative:
            out[i] = tvm_ffi.from_dlpack(array, require_alignment=array.dtype.alignment,
                                         require_contiguous=True)
        else:
            view, out[i] = staged.copy(i, array)
            view[...] = array
    return out


class _Staging:
    """The staging buffers of one configuration in one thread: a small array (below
    :data:`_COPY_BELOW` bytes) is always copied, reading its flags costs a copy's time; a large
    one gets a buffer only once it cannot be read in place."""

    def __init__(self, arrays, unread=frozenset()):
        small = [i for i, a in enumerate(arrays) if a.nbytes < _COPY_BELOW]
        buffers = {i: _buffer(arrays[i]) for i in small}
        for i in unread:
            if i in buffers:
                buffers[i][0].fill(np.nan)
        self.small = [(i, buffers[i][0]) for i in small if i not in unread]
        self.large = [i for i in range(len(arrays)) if i not in buffers]
        self.tensors = [buffers[i][1] if i in buffers else None for i in range(len(arrays))]
        self._copies: dict[int, tuple] = {}

    def copy(self, i: int, array: np.ndarray) -> tuple:
        """``(array, tensor)``: the staging buffer of large input ``i``."""
        if i not in self._copies:
            self._copies[i] = _buffer(array)
        return self._copies[i]


def _buffer(array: np.ndarray) -> tuple:
    """An aligned, C-contiguous, native-order buffer of ``array``'s shape and dtype, as an
    array and as a TVM tensor."""
    view = aligned_empty(array.nbytes).view(array.dtype.newbyteorder("=")).reshape(array.shape)
    return view, tvm_ffi.from_dlpack(view)


def _pool(name: str) -> dict:
    pool = getattr(_local, name, None)
    if pool is None:
        pool = {}
        setattr(_local, name, pool)
    return pool


class OutputLayout:
    """Where each output of one set of shapes lies in a call's output buffer (every output
    starts :data:`ALIGNMENT`-aligned)."""

    def __init__(self, shapes, dtype):
        self.dtype = np.dtype(dtype)
        self.shapes = [tuple(s) for s in shapes]
        self.spans, offset = [], 0
        for shape in self.shapes:
            nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
            self.spans.append((offset, nbytes))
            offset += -(-nbytes // ALIGNMENT) * ALIGNMENT
        self.nbytes = max(offset, ALIGNMENT)

    def allocate(self, slot):
        """``(arrays, tensors)``: the outputs as NumPy arrays and as TVM tensors over the same
        memory, in a buffer nobody else references."""
        pool = _pool("outputs")
        entry = pool.get(slot)
        if entry is not None:
            raw, arrays, tensors, alone, layout = entry
            # Every view of the memory refers to its owner ``raw``, and the outputs returned
            # are ``arrays`` themselves: with as many references to each as when the pool alone
            # held them, no output of the last call (nor any view of one) is alive, and the
            # memory may be written again.
            if (layout is self and _references(raw, arrays) == alone
                    and [a.shape for a in arrays] == self.shapes  # nor reshaped or frozen since
                    and all(a.dtype == self.dtype and a.flags.writeable for a in arrays)):
                return arrays, tensors
        raw = np.empty(self.nbytes + ALIGNMENT, np.uint8)
        buf = _aligned(raw, self.nbytes)
        arrays = [buf[o:o + n].view(self.dtype).reshape(s)
                  for (o, n), s in zip(self.spans, self.shapes)]
        tensors = [tvm_ffi.from_dlpack(a) for a in arrays]
        del buf
        if len(pool) > _POOL_SIZE:
            pool.clear()
        pool[slot] = entry = (raw, arrays, tensors, None, self)
        alone = _references(raw, arrays)  # counted as in the check above
        pool[slot] = (raw, arrays, tensors, alone, self)
        return arrays, tensors


def _references(raw, arrays) -> tuple:
    return (sys.getrefcount(raw), *map(sys.getrefcount, arrays))
