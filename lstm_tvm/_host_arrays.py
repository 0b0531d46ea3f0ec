"""NumPy arrays handed to CPU kernels without copies, and aligned output arrays.

CPU kernels read their inputs wherever they lie (aligned to their element size, see
:class:`lstm_tvm.kernels.variant.KernelVariant`), so a NumPy array is passed by DLPack when
it is C-contiguous, writeable, aligned (NumPy's flag), in native byte order and of 16 KiB or
more (below, a copy costs no more than the checks); any other array is copied into an aligned
staging buffer. Outputs, which the kernels write with vector stores that assume TVM's 64-byte
alignment, are this module's own: views into one aligned buffer per call, written again by a
later call only when nothing references them any more (the caller dropped every output of that
call), so an output the caller keeps is never overwritten and a serving loop touches no fresh
memory.

Who holds what: the staging and output buffers belong to the process, not to a thread. A call
borrows a set of buffers for its configuration (its *slot*) from a :class:`Lender` and gives it
back when its kernel has run, so calls of one configuration from many threads at once each get
their own set, and a thread that ends leaves nothing behind. Nothing here is thread-local: a
DLPack view of a NumPy array held in a thread's state would be freed while that thread is torn
down, and NumPy's deleter crashes CPython 3.11 there when the thread is not one Python made (an
ONNX Runtime or TensorFlow pool thread running a Python callback; CPython gh-119585). Buffers
are dropped only by a call (on a live thread) or when the process ends, and what the lenders
keep is bounded by the configurations in use and the calls that overlapped, not by the number
of threads that came and went.
"""

from __future__ import annotations

import sys

import numpy as np
import tvm_ffi

__all__ = ["ALIGNMENT", "Lender", "OutputLayout", "aligned_empty", "borrow_staging",
           "give_back_staging", "staged_inputs"]

#: The data alignment TVM's kernels assume.
ALIGNMENT = 64

#: Configurations a lender keeps buffers for (all are dropped past it).
_SLOTS = 256
#: Sets of buffers a lender keeps for one configuration: as many calls of it at once as are
#: expected to overlap (more are served with fresh buffers, dropped when given back).
_PER_SLOT = 4
#: Inputs smaller than this are copied even when aligned: checking costs about as much.
_COPY_BELOW = 16384


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data is :data:`ALIGNMENT`-aligned (a
    view; its ``base`` owns the memory, and every view made of it refers to that base)."""
    return _aligned(np.empty(nbytes + ALIGNMENT, np.uint8), nbytes)


def _aligned(raw: np.ndarray, nbytes: int) -> np.ndarray:
    start = -raw.__array_interface__["data"][0] % ALIGNMENT
    return raw[start:start + nbytes]


class Lender:
    """Sets of buffers by slot, owned by the process and lent to one call at a time.

    :meth:`borrow` takes a set out (so no other call can get it) and :meth:`give_back` returns
    it; past :data:`_PER_SLOT` sets for a slot the oldest is dropped, and past :data:`_SLOTS`
    slots every set is, by the thread giving back. No lock: each step is one ``list.pop``,
    ``list.append`` or dict operation, atomic under the GIL (and under the per-object locks of
    a free-threaded build); a race between two of them at worst drops a set, never lends one
    twice."""

    __slots__ = ("_free",)

    def __init__(self):
        self._free: dict = {}

    def borrow(self, slot, usable=None):
        """The set given back last for ``slot``, taken out of the lender, when there is one and
        ``usable(entry)`` (if given) accepts it; else None (a refused set goes back, to the
        front of the queue)."""
        entries = self._free.get(slot)
        if not entries:
            return None
        try:
            entry = entries.pop()
        except IndexError:  # taken meanwhile by another thread
            return None
        if usable is None or usable(entry):
            return entry
        entries.insert(0, entry)
        return None

    def give_back(self, slot, entry) -> None:
        """Return ``entry`` (borrowed or new) for later calls of ``slot``."""
        entries = self._free.get(slot)
        if entries is None:
            if len(self._free) >= _SLOTS:
                self._free = {}
            entries = self._free.setdefault(slot, [])
        entries.append(entry)
        if len(entries) > _PER_SLOT:
            try:
                del entries[0]
            except IndexError:
                pass

    def __len__(self) -> int:
        """The sets held (for tests and diagnostics)."""
        return sum(map(len, list(self._free.values())))


_STAGING = Lender()
_OUTPUTS = Lender()


def borrow_staging(arrays, slot, unread=frozenset()) -> "_Staging":
    """Staging buffers for a call of ``slot`` (a hashable naming the call's configuration:
    every call with one ``slot`` passes arrays of the same shapes and dtypes, in the same order,
    and the same ``unread``), lent until :func:`give_back_staging`; its
    :meth:`~_Staging.tensors_of` gives the kernel's tensors. ``unread``: positions of arrays
    the kernel never reads; a small one is not copied (its tensor is a buffer of NaN: were it
    read after all, the outputs say so)."""
    staging = _STAGING.borrow(slot)
    return staging if staging is not None else _Staging(arrays, unread)


def give_back_staging(slot, staging: "_Staging") -> None:
    """End the loan of :func:`borrow_staging` (the tensors it gave must not be used again)."""
    _STAGING.give_back(slot, staging)


class staged_inputs:
    """``with staged_inputs(arrays, slot, unread) as tensors:`` :func:`borrow_staging`'s
    tensors for ``arrays`` for the duration of the block."""

    __slots__ = ("_slot", "_staging", "tensors")

    def __init__(self, arrays, slot, unread=frozenset()):
        self._slot = slot
        self._staging = borrow_staging(arrays, slot, unread)
        #: What ``with`` gives.
        self.tensors = self._staging.tensors_of(arrays)

    def __enter__(self) -> list:
        return self.tensors

    def __exit__(self, *exc) -> None:
        self.tensors = None
        give_back_staging(self._slot, self._staging)


class _Staging:
    """The staging buffers of one configuration for one call at a time: a small array (below
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

    def tensors_of(self, arrays) -> list:
        """The kernel's tensors for ``arrays``, copying what cannot be read in place."""
        out = list(self.tensors)
        for i, view in self.small:
            view[...] = arrays[i]  # same shape; the dtype differs at most in byte order
        for i in self.large:
            array = arrays[i]
            flags = array.flags
            if flags.c_contiguous and flags.writeable and flags.aligned and array.dtype.isnative:
                out[i] = tvm_ffi.from_dlpack(array, require_alignment=array.dtype.alignment,
                                             require_contiguous=True)
            else:
                view, out[i] = self._copy(i, array)
                view[...] = array
        return out

    def _copy(self, i: int, array: np.ndarray) -> tuple:
        """``(array, tensor)``: the staging buffer of large input ``i``."""
        if i not in self._copies:
            self._copies[i] = _buffer(array)
        return self._copies[i]


def _buffer(array: np.ndarray) -> tuple:
    """An aligned, C-contiguous, native-order buffer of ``array``'s shape and dtype, as an
    array and as a TVM tensor."""
    view = aligned_empty(array.nbytes).view(array.dtype.newbyteorder("=")).reshape(array.shape)
    view = compact_strides(view)
    return view, tvm_ffi.from_dlpack(view)


def compact_strides(array: np.ndarray) -> np.ndarray:
    """``array``, as a view with C-contiguous strides when it has no elements: NumPy gives a
    zero-size array zero strides, which DLPack passes on and TVM's compactness check of a
    kernel argument refuses."""
    if array.size or array.ndim == 0:
        return array
    strides = [array.itemsize]
    for dim in reversed(array.shape[1:]):
        strides.insert(0, strides[0] * dim)
    return np.lib.stride_tricks.as_strided(array, strides=strides)


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

    def borrow(self, slot) -> "OutputBuffer":
        """A call's outputs for ``slot`` in a buffer nobody else references (its ``arrays``,
        and its ``tensors`` for the kernel), lent until :meth:`give_back`; the arrays may be
        returned to the caller (the buffer is written again only once they are dropped)."""
        entry = _OUTPUTS.borrow(slot, self._fits)
        return entry if entry is not None else OutputBuffer(self)

    @staticmethod
    def give_back(slot, entry: "OutputBuffer") -> None:
        """End the loan of :meth:`borrow`: hold the returned arrays before calling this."""
        _OUTPUTS.give_back(slot, entry)

    def _fits(self, entry: "OutputBuffer") -> bool:
        return entry.layout is self and entry.unreferenced()


class OutputBuffer:
    """One call's outputs: NumPy arrays over one aligned buffer, and TVM tensors over them."""

    __slots__ = ("layout", "raw", "arrays", "tensors", "_owners", "_alone")

    def __init__(self, layout: OutputLayout):
        self.layout = layout
        self.raw = np.empty(layout.nbytes + ALIGNMENT, np.uint8)
        buf = _aligned(self.raw, layout.nbytes)
        self.arrays = [compact_strides(buf[o:o + n].view(layout.dtype).reshape(s))
                       for (o, n), s in zip(layout.spans, layout.shapes)]
        del buf
        self.tensors = [tvm_ffi.from_dlpack(a) for a in self.arrays]
        self._owners = (self.raw, *self.arrays)
        self._alone = self._references()  # only this buffer refers to them

    def _references(self) -> list:
        return list(map(sys.getrefcount, self._owners))

    def unreferenced(self) -> bool:
        """Whether no output of the call that used it (nor any view of one) is alive.

        Every view of the memory refers to its owner ``raw``, and the outputs returned are
        ``arrays`` themselves: with as many references to each as when only this buffer held
        them, the memory may be written again (unless one was reshaped or frozen since)."""
        if self._references() != self._alone:
            return False
        dtype = self.layout.dtype
        for a, shape in zip(self.arrays, self.layout.shapes):
            if a.shape != shape or a.dtype is not dtype or not a.flags.writeable:
                return False
        return True
