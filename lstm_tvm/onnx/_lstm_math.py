"""One LSTM step, forward and backward, as standard ONNX nodes (float32 values).

Internal to :mod:`lstm_tvm.onnx.functions`; the math is :mod:`lstm_tvm.reference.block_cell`'s
(TensorFlow semantics). ``peep`` is None without peephole: then no node reads ``wci, wcf, wco``
(not even a multiply by zero), so NaN/Inf in unused peephole weights cannot leak in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._graph import Graph


def split_gates(g: Graph, gates4: str, layout: Sequence[str], axis: int = -1) -> dict[str, str]:
    """Split the ``4H`` axis of ``gates4`` into its gate blocks, keyed ``i, c, f, o``."""
    parts = g.op("Split", gates4, n_out=4, axis=axis, num_outputs=4, hint="gate")
    return dict(zip(layout, parts))


def join_gates(g: Graph, blocks: Mapping[str, str], layout: Sequence[str], axis: int = -1) -> str:
    """Inverse of :func:`split_gates`."""
    return g.op("Concat", *(blocks[k] for k in layout), axis=axis, hint="dicfo")


def clip_keep_nan(g: Graph, x: str, lo: str, hi: str) -> str:
    """``x`` clipped to ``[lo, hi]`` by compare-and-select: NaN stays NaN, ``+-inf`` is clipped.

    TF's ``cell_clip`` and lstm_tvm's kernels keep NaN; ONNX leaves ``Clip`` of NaN open (ORT
    1.31 keeps it, a runtime lowering it to ``min``/``max`` may not), so no ``Clip`` here.
    """
    above = g.op("Greater", x, hi)
    below = g.op("Less", x, lo)
    return g.op("Where", above, hi, g.op("Where", below, lo, x), hint="cs")


def forward_step(g: Graph, pre: Mapping[str, str], cs_prev: str, *, peep: Mapping | None,
                 forget_bias: str | None, clip: tuple[str, str] | None) -> dict[str, str]:
    """``i, cs, f, o, ci, co, h`` of one step from the gate pre-activations ``pre``.

    ``forget_bias`` is a scalar value name (None: no bias, e.g. BlockLSTMV2); ``clip`` is
    ``(lo, hi)`` value names (``+-inf`` where TF does not clip) or None; the clip keeps NaN
    (:func:`clip_keep_nan`).
    """
    pre_i, pre_f, pre_o = pre["i"], pre["f"], pre["o"]
    if forget_bias is not None:
        pre_f = g.add(pre_f, forget_bias)
    if peep is not None:
        pre_i = g.add(pre_i, g.mul(peep["wci"], cs_prev))
        pre_f = g.add(pre_f, g.mul(peep["wcf"], cs_prev))
    i = g.op("Sigmoid", pre_i, hint="i")
    ci = g.op("Tanh", pre["c"], hint="ci")
    f = g.op("Sigmoid", pre_f, hint="f")
    cs = g.add(g.mul(i, ci), g.mul(f, cs_prev))
    if clip is not None:
        cs = clip_keep_nan(g, cs, *clip)
    co = g.op("Tanh", cs, hint="co")
    if peep is not None:
        pre_o = g.add(pre_o, g.mul(peep["wco"], cs))
    o = g.op("Sigmoid", pre_o, hint="o")
    h = g.mul(o, co)
    return {"i": i, "cs": cs, "f": f, "o": o, "ci": ci, "co": co, "h": h}


def backward_step(g: Graph, act: Mapping[str, str], cs_prev: str, cs_grad: str, h_grad: str,
                  one: str, *, peep: Mapping | None) -> dict[str, str]:
    """One cell gradient (TF's ``LSTMBlockCellGrad`` without the matmul part).

    ``act`` holds ``i, f, o, ci, co``; ``cs_grad``/``h_grad`` are the total gradients at ``cs``
    and ``h``; ``one`` is a float32 scalar 1. Returns ``di, dci, df, do`` and ``cs_prev_grad``.
    Like TF, ``cell_clip`` is not differentiated.
    """
    i, f, o, ci, co = (act[k] for k in ("i", "f", "o", "ci", "co"))
    do = g.mul(o, g.minus(one, o), h_grad, co)
    dcs = g.add(g.mul(g.minus(one, g.mul(co, co)), h_grad, o), cs_grad)
    if peep is not None:
        dcs = g.add(dcs, g.mul(do, peep["wco"]))
    dci = g.mul(g.minus(one, g.mul(ci, ci)), dcs, i)
    df = g.mul(f, g.minus(one, f), dcs, cs_prev)
    di = g.mul(i, g.minus(one, i), dcs, ci)
    cs_prev_grad = g.mul(dcs, f)
    if peep is not None:
        cs_prev_grad = g.add(cs_prev_grad, g.add(g.mul(di, peep["wci"]), g.mul(df, peep["wcf"])))
    return {"i": di, "c": dci, "f": df, "o": do, "cs_prev_grad": cs_prev_grad}
