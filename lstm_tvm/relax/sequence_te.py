"""Tensor expressions for ONNX ``LSTM``'s per-batch sequence lengths, emitted with ``emit_te``.

Tensors are time-major, ``(T, B, ...)``. ``lengths`` is an integer tensor ``(B,)`` (ONNX
``sequence_lens``) or ``None``, meaning every row runs all ``T`` steps; each length is clamped
to ``[0, T]``. The kernel always runs ``T`` steps; these expressions reorder its input for a
reverse direction and pick or mask its outputs so that each row sees only its own steps.
"""

from __future__ import annotations

from tvm import te, tirx

__all__ = ["last_step", "ordered_steps", "reverse_steps"]


def _length(lengths, b, steps):
    """Row ``b``'s length as a time index: ``lengths[b]`` clamped to ``[0, steps]``."""
    if lengths is None:
        return steps
    length = lengths[b].astype("int64")  # Relax dims are int64
    return tirx.min(tirx.max(length, tirx.const(0, "int64")), steps)


def reverse_steps(a: te.Tensor, lengths: te.Tensor | None = None) -> te.Tensor:
    """Each row's first ``L_b`` steps reversed, the rest kept (ONNX ``ReverseSequence``):
    ``out[t, b] = a[L_b - 1 - t, b]`` for ``t < L_b``, else ``a[t, b]``."""
    steps = a.shape[0]

    def value(t, b, *rest):
        length = _length(lengths, b, steps)
        return a[(tirx.if_then_else(t < length, length - 1 - t, t), b, *rest)]

    return te.compute(a.shape, value, name="reverse_steps")


def ordered_steps(h: te.Tensor, lengths: te.Tensor | None = None,
                  reverse: bool = False) -> te.Tensor:
    """ONNX ``Y`` of one direction from the kernel's ``h`` (steps in processing order):
    ``out[t, b] = h[t, b]`` (``h[L_b - 1 - t, b]`` when ``reverse``) for ``t < L_b``, else 0."""
    steps = h.shape[0]

    def value(t, b, j):
        length = _length(lengths, b, steps)
        src = length - 1 - t if reverse else t
        return tirx.if_then_else(t < length, h[src, b, j], tirx.const(0, h.dtype))

    return te.compute(h.shape, value, name="ordered_steps")


def last_step(h: te.Tensor, lengths: te.Tensor | None = None) -> te.Tensor:
    """Each row's state after its last step, ``h[L_b - 1, b]`` (zero where ``L_b = 0``),
    ``(B, H)``."""
    steps = h.shape[0]

    def value(b, j):
        length = _length(lengths, b, steps)
        return tirx.if_then_else(length > 0, h[length - 1, b, j], tirx.const(0, h.dtype))

    return te.compute(h.shape[1:], value, name="last_step")
