"""Building kernels with TVM's IR builder: signatures from the registry, common block shapes.

A kernel is written as Python that emits ``s_tir`` blocks inside :func:`kernel`, whose
parameters are the op's inputs then outputs in the registry's order (destination-passing
style), with symbolic ``T`` and ``B``. Blocks are named so that schedules can find them.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

from .._tvm import IRBuilder, TB as T, tirx
from ..registry import OpSpec
from ._gates import ACC

__all__ = ["T", "kernel", "spatial", "reduction", "gemm", "flat", "padded", "zero", "temp", "ROW_TILE"]

#: Output rows a GEMM block computes together. GEMM blocks run over their row count rounded
#: up to a multiple of ROW_TILE (:func:`padded`), so a schedule can tile rows without bounds
#: checks; their left operand and output are scratch buffers with room for the extra rows.
ROW_TILE = 8


def zero(dtype: str = ACC):
    """The constant 0 of ``dtype``."""
    return tirx.const(0, dtype)


@contextlib.contextmanager
def kernel(op: OpSpec, dtype: str, input_size: int, cell_size: int, params: Sequence = ()):
    """Open a PrimFunc for ``op`` (an :class:`OpSpec`, or any object with a ``name``); yields
    ``(buffers, sizes, builder)``.

    ``buffers`` maps every input and output name of the registry to its ``Buffer`` (or to a
    scalar ``Var`` for int64 scalars such as ``seq_len_max``); ``sizes`` maps ``T, B, I, H`` to
    the (symbolic or constant) sizes. ``params`` overrides the registry's tensor list (for
    helpers that are not TF ops): a sequence of ``TensorSpec``. Call ``builder.get()`` after the
    ``with`` block for the PrimFunc.
    """
    sizes = {"T": tirx.Var("T", "int64"), "B": tirx.Var("B", "int64"),
             "I": input_size, "H": cell_size}
    specs = list(params) if params else list(op.inputs) + list(op.outputs)
    with IRBuilder() as builder:
        with T.prim_func(s_tir=True):
            T.func_name(f"lstm_tvm_{op.name}_{dtype}")
            T.func_attr({"tirx.noalias": True})
            buffers = {}
            for spec in specs:
                if spec.dtype == "int64" and not spec.shape:
                    buffers[spec.name] = T.arg(spec.name, tirx.Var(spec.name, "int64"))
                else:
                    shape = spec.concrete_shape(sizes)
                    buffers[spec.name] = T.arg(spec.name, T.Buffer(
                        shape, dtype if spec.dtype == "T" else spec.dtype, buffer_name=spec.name))
            if "seq_len_max" in buffers:
                # Callers outside lstm_tvm's Python API (an exported library) get an error, not
                # an out-of-bounds access, for a step count beyond the time extent.
                n = buffers["seq_len_max"]
                with T.Assert(tirx.all(n >= 0, n <= sizes["T"]),
                              f"{op.name}: seq_len_max must be in [0, T]", "ValueError"):
                    yield buffers, sizes, builder
            else:
                yield buffers, sizes, builder


def temp(name: str, shape, dtype: str = ACC):
    """A scratch buffer of the kernel (float32 unless told)."""
    buf = T.alloc_buffer(shape, dtype)
    IRBuilder.name(name, buf)
    return buf


def flat(buffer, rows):
    """A 2-D view ``(rows, last dim)`` of a contiguous buffer (e.g. ``(T, B, I)`` as ``(T*B, I)``)."""
    return T.decl_buffer((rows, buffer.shape[-1]), buffer.dtype, data=buffer.data)


def padded(rows):
    """``rows`` rounded up to a multiple of :data:`ROW_TILE` (symbolic sizes welcome)."""
    return (rows + ROW_TILE - 1) // ROW_TILE * ROW_TILE


def gemm(name: str, out, M, N, K, a: Callable, b: Callable,
         init: Callable | None = None, pad: bool = True) -> None:
    """``out[m, n] = init(m, n) + sum_k a(m, k) * b(k, n)`` for ``m < M, n < N, k < K``.

    ``K`` may be symbolic. With ``pad`` (for a symbolic ``M``) the rows
    ``M <= m < padded(M)`` are computed too: ``a`` must be readable there (a scratch operand
    with spare rows) and ``out`` must have them; callers ignore their results.
    """
    reduction(name, out, (padded(M) if pad else M, N), (K,), lambda m, n: (m, n),
              lambda s, r: a(s[0], r[0]) * b(r[0], s[1]), init=init)


def spatial(name: str, extents: Sequence, body: Callable) -> None:
    """A data-parallel block over ``extents``; ``body(*block_vars)`` emits its stores."""
    with T.grid(*extents) as loops:
        loops = _as_list(loops)
        with T.sblock(name):
            axes = T.axis.remap("S" * len(loops), list(loops))
            axes = _as_list(axes)
            body(*axes)


def reduction(name: str, out, spatial_extents: Sequence, reduce_extents: Sequence,
              index: Callable, term: Callable, init: Callable | None = None) -> None:
    """``out[index(s)] = init(s) + sum over r of term(s, r)``, as one reduction block.

    ``s`` are the spatial block vars, ``r`` the reduction ones; ``init`` defaults to 0.
    """
    n_s = len(spatial_extents)
    with T.grid(*spatial_extents, *reduce_extents) as loops:
        loops = _as_list(loops)
        with T.sblock(name):
            axes = T.axis.remap("S" * n_s + "R" * len(reduce_extents), list(loops))
            axes = _as_list(axes)
            s, r = list(axes[:n_s]), list(axes[n_s:])
            idx = list(index(*s))
            with T.init():
                T.buffer_store(out, init(*s) if init is not None else zero(out.dtype), idx)
            T.buffer_store(out, out[tuple(idx)] + term(s, r), idx)


def _as_list(values) -> list:
    return [values] if isinstance(values, tirx.Var) else list(values)
