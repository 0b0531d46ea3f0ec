"""Gate math shared by the cell and sequence kernels, as TIR expressions.

All math runs in float32 whatever the storage dtype (float16 inputs are widened on load and
rounded once on store), which is at least as accurate as TensorFlow's kernels.
"""

from __future__ import annotations

import dataclasses

from .._tvm import tirx, tvm
from ..validation import cell_clip_bound
from ._activations import ACC, clamp, const, sigmoid, tanh, unbound


def f32(value):
    """Widen a loaded value (a scalar or a vector) to the float32 compute type."""
    lanes = tvm.DataType(str(value.ty)).lanes if hasattr(value, "ty") else 1
    return tirx.Cast(str(tvm.DataType(ACC).with_lanes(lanes)), value)


def store(value, dtype: str):
    """Round a float32 result to the storage dtype."""
    return value if dtype == ACC else tirx.Cast(dtype, value)


def gate_offsets(gates: tuple[str, ...], cell_size: int) -> dict[str, int]:
    """Column offset of each gate's H-wide block in the 4H columns, by gate letter."""
    return {g: k * cell_size for k, g in enumerate(gates)}


@dataclasses.dataclass(frozen=True)
class CellConfig:
    """The compile-time constants of one forward cell."""

    forget_bias: float
    cell_clip: float
    use_peephole: bool


#: The gates whose activations :func:`gate_activations` computes (the output gate needs ``cs``).
ICF = ("i", "c", "f")


def gate_activations(cfg: CellConfig, pre, cs_prev, wci, wcf, bind=unbound) -> dict:
    """The input, cell-input and forget activations of one step: ``{"i": ..., "c": ...,
    "f": ...}`` float32 expressions of the pre-activations ``pre(gate)`` (``xh @ w + b``);
    ``bind`` binds intermediate values to variables (see :mod:`._activations`).

    Callers store them (float32) before :func:`cell_forward` reads them back, so that no
    activation's expression contains another's (see :mod:`._activations`).
    """
    peep = cfg.use_peephole
    gi = pre("i") + cs_prev * wci if peep else pre("i")
    # TF's order: (pre + forget_bias) + peephole.
    gf = pre("f") + const(cfg.forget_bias) if cfg.forget_bias != 0 else pre("f")
    gf = gf + cs_prev * wcf if peep else gf
    return {"i": sigmoid(gi, bind), "c": tanh(pre("c"), bind), "f": sigmoid(gf, bind)}


def cell_forward(cfg: CellConfig, act, go, cs_prev, wco, bind=unbound):
    """The rest of one forward step, from the stored activations ``act(gate)`` of
    :func:`gate_activations` and the output gate's pre-activation ``go`` (float32);
    ``bind`` binds intermediate values to variables (see :mod:`._activations`).

    Returns ``(i, cs, f, o, ci, co, h)`` as float32 expressions:
    ``cs = clip(i * ci + f * cs_prev)``, ``o = sigmoid(go + cs * wco)``, ``h = o * tanh(cs)``;
    the clip is TF's (:func:`~lstm_tvm.validation.cell_clip_bound`), or none.
    """
    i, ci, f = act("i"), act("c"), act("f")
    cs = i * ci + f * cs_prev
    bound = cell_clip_bound(cfg.cell_clip)
    if bound is not None:
        cs = clamp(cs, bound)  # a NaN cell state stays NaN, as TF's clip keeps it
    cs = bind(cs)
    o = bind(sigmoid(go + cs * wco if cfg.use_peephole else go, bind))
    co = bind(tanh(cs, bind))
    return i, cs, f, o, ci, co, o * co


def cell_backward(use_peephole: bool, i, cs, f, o, ci, co, cs_prev, cs_grad, h_grad, wci, wcf, wco):
    """One backward step (TF's ``LSTMBlockCellBwd``), float32 expressions.

    ``cs_grad`` and ``h_grad`` are the total gradients arriving at ``cs`` and ``h``.
    Returns ``(di, dci, df, do, cs_prev_grad)``; the clip is not differentiated (as TF).
    """
    one = const(1.0)
    do = o * (one - o) * h_grad * co
    dcs = (one - co * co) * h_grad * o + cs_grad
    if use_peephole:
        dcs = dcs + do * wco
    dci = (one - ci * ci) * dcs * i
    df = f * (one - f) * dcs * cs_prev
    di = i * (one - i) * dcs * ci
    cs_prev_grad = dcs * f
    if use_peephole:
        cs_prev_grad = cs_prev_grad + di * wci + df * wcf
    return di, dci, df, do, cs_prev_grad
