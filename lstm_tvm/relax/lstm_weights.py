"""ONNX ``LSTM`` weights re-laid out as the inputs of lstm_tvm's ``BlockLSTM`` kernel.

ONNX, per direction ``d``: ``W[d]`` ``(4H, I)``, ``R[d]`` ``(4H, H)``, gate blocks of rows in
order i, o, f, c; ``B[d]`` ``(8H,)`` = ``Wb`` then ``Rb`` (same gate order); ``P[d]`` ``(3H,)``
= peepholes i, o, f. ``BlockLSTM``: ``w`` ``(I+H, 4H)`` = ``[W[d], R[d]]`` transposed (input rows
then recurrent rows), gate blocks of columns in order i, c, f, o; ``b = Wb + Rb`` ``(4H,)``
in that order; ``wci``, ``wcf``, ``wco`` ``(H,)``.

:func:`fold_weights` does it in NumPy at import time (constant weights: the model gets the
re-laid-out constants); :func:`emit_weights` emits the same re-layout as Relax ops (weights
that are graph inputs or computed).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..registry import GATE_LAYOUTS
from .shapes import constant_value

__all__ = ["ONNX_GATES", "PEEPHOLE_GATES", "direction_weights", "emit_weights", "fold_weights",
           "take_direction"]

#: ONNX's gate order of the 4H rows of ``W``, ``R`` and of each half of ``B``.
ONNX_GATES = ("i", "o", "f", "c")
#: ONNX's order of the peephole blocks of ``P``.
PEEPHOLE_GATES = ("i", "o", "f")
#: For each of BlockLSTM's gate blocks (ICFO), the ONNX block it comes from.
_GATE_PERM = [ONNX_GATES.index(g) for g in GATE_LAYOUTS["ICFO"]]
#: The ONNX blocks of ``P`` holding ``wci``, ``wcf``, ``wco``.
_PEEPHOLE_INDEX = {name: PEEPHOLE_GATES.index(name[2]) for name in ("wci", "wcf", "wco")}


def fold_weights(d: int, hidden: int, dtype: str, W: np.ndarray | None = None,
                 R: np.ndarray | None = None, B: np.ndarray | None = None,
                 P: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BlockLSTM's ``w`` (from ``W`` and ``R``), ``b`` (from ``B``) and ``wci``, ``wcf``,
    ``wco`` (from ``P``) of direction ``d``, in ``dtype``; only those whose sources are given.
    The bias sum is taken in float32 and rounded once to ``dtype``."""
    out = {}
    if W is not None and R is not None:
        rows = np.concatenate([W[d], R[d]], axis=1)  # (4H, I+H)
        rows = rows.reshape(4, hidden, -1)[_GATE_PERM].reshape(4 * hidden, -1)
        out["w"] = np.ascontiguousarray(rows.T).astype(dtype)
    if B is not None:
        both = B[d].astype(np.float32).reshape(2, 4, hidden).sum(axis=0)
        out["b"] = both[_GATE_PERM].reshape(4 * hidden).astype(dtype)
    if P is not None:
        for name, k in _PEEPHOLE_INDEX.items():
            out[name] = P[d].reshape(3, hidden)[k].astype(dtype)
    return out


def direction_weights(bb: relax.BlockBuilder, d: int, hidden: int, dtype: str, W, R,
                      B=None, P=None) -> dict[str, relax.Expr]:
    """All of BlockLSTM's weight inputs (``w``, ``b``, ``wci``, ``wcf``, ``wco``) of direction
    ``d`` from ONNX's Relax tensors (``B``, ``P`` may be ``None``: zeros). Each group whose
    sources are all constants is folded with :func:`fold_weights`, the others are emitted with
    :func:`emit_weights`."""
    out = {"b": np.zeros(4 * hidden, dtype),
           **{name: np.zeros(hidden, dtype) for name in _PEEPHOLE_INDEX}}
    folded, emitted = {}, {}
    for group in ({"W": W, "R": R}, {"B": B}, {"P": P}):
        if any(x is None for x in group.values()):
            continue
        values = {k: constant_value(x) for k, x in group.items()}
        if all(v is not None for v in values.values()):
            folded.update(values)
        else:
            emitted.update(group)
    out.update(fold_weights(d, hidden, dtype, **folded))
    out.update(emit_weights(bb, d, hidden, dtype, **emitted))
    return {k: relax.const(v) if isinstance(v, np.ndarray) else v for k, v in out.items()}


def take_direction(bb: relax.BlockBuilder, x, d: int, axis: int = 0) -> relax.Var:
    """``x`` at index ``d`` of ``axis`` (that axis dropped)."""
    part = relax.op.strided_slice(x, axes=[axis], begin=[d], end=[d + 1])
    return bb.emit(relax.op.squeeze(part, axis=[axis]))


def emit_weights(bb: relax.BlockBuilder, d: int, hidden: int, dtype: str, W=None, R=None,
                 B=None, P=None) -> dict[str, relax.Expr]:
    """:func:`fold_weights` as Relax ops on Relax tensors (``W``, ``R``, ``B``, ``P`` of the
    static shapes ONNX gives them); returns the entries whose sources are given."""
    op = relax.op
    perm = relax.const(np.array(_GATE_PERM, np.int64))
    out = {}
    if W is not None and R is not None:
        rows = bb.emit(op.concat([take_direction(bb, W, d), take_direction(bb, R, d)], axis=1))
        rows = bb.emit(op.take(op.reshape(rows, (4, hidden, -1)), perm, axis=0, mode="clip"))
        out["w"] = bb.emit(op.permute_dims(op.reshape(rows, (4 * hidden, -1)), [1, 0]))
    if B is not None:
        wide = op.astype(take_direction(bb, B, d), "float32")
        both = op.sum(op.reshape(wide, (2, 4, hidden)), axis=0)
        gates = bb.emit(op.take(both, perm, axis=0, mode="clip"))
        out["b"] = bb.emit(op.astype(op.reshape(gates, (4 * hidden,)), dtype))
    if P is not None:
        blocks = bb.emit(op.reshape(take_direction(bb, P, d), (3, hidden)))
        for name, k in _PEEPHOLE_INDEX.items():
            out[name] = take_direction(bb, blocks, k)
    return out
