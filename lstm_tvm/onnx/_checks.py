"""Input checks inside an ONNX function body (standard ONNX has no Assert op).

onnxruntime checks a model's declared input dims, but not that symbolic dims (``T``, ``B``)
agree between inputs, and a function may be used in models that declare no shapes at all.
:func:`checked_inputs` builds one ``ConstantOfShape`` whose dims are

    (cs_prev dims..., 0, seq_len_max, T - seq_len_max, d_1, -d_1, d_2, -d_2, ...,
     use_peephole, 1 - use_peephole)

where each ``d_k`` is the difference between an input dim and the size the registry says it
must have (``T, B, I`` from ``x``, ``H`` from ``cs_prev``, ``4H``, ``I+H`` derived) or between an
input's rank and its registry rank. Every entry is >= 0 exactly when the inputs are
consistent (and the ``use_peephole`` attribute is 0 or 1); otherwise onnxruntime fails at that
node (a negative dim) instead of computing garbage. A ``DequantizeLinear`` node named
``<Op>_input_check_dtype_is_float_or_float16`` makes a float64 or integer model a type error. The tensor has no elements (the 0), so nothing is allocated, and its shape carries the
checked ``cs_prev`` shape and ``seq_len_max`` back into the computation, which keeps the check
alive (it cannot be pruned as dead code).
"""

from __future__ import annotations

import numpy as np

from ..registry import OpSpec
from ._graph import Graph


def _both_signs(g: Graph, a: str, b: str) -> list[str]:
    return [g.minus(a, b), g.minus(b, a)]


def _dtype_check(g: Graph, op: OpSpec) -> str:
    """A node that type-checks only when ``x`` is float32 or float16 (``DequantizeLinear``'s
    scale type, opset 21: float, float16, bfloat16; the body's ``Sin`` is not used because
    onnxruntime has no float16 ``Sin``). Without it, a float64 or int32 model would run (every
    input is cast to float32, outputs back) and silently compute garbage for integers. Returns
    an empty int64 1-D tensor to concatenate into the check dims (keeps the node alive)."""
    scale = g.op("CastLike", g.const(1.0, np.float32, "one"), "x", hint="dtype_probe")
    probe = g.op("DequantizeLinear", g.const(0, np.int8, "q"), scale, hint="dtype_ok",
                 node_name=f"{op.name}_input_check_dtype_is_float_or_float16")
    return g.op("Shape", probe, hint="dtype_ok_shape")  # shape of a scalar: []


def checked_inputs(g: Graph, op: OpSpec, use_peephole: str) -> tuple[str, str | None]:
    """``(cs_prev, seq_len_max)`` as checked values: ``cs_prev`` reshaped to its own (checked)
    shape and ``seq_len_max`` as a 1-element int64 tensor (None for cell ops).

    ``use_peephole`` is the int64 attribute value (a 0-d tensor): it must be 0 or 1. The float
    type of ``x`` must be float32 or float16 (:func:`_dtype_check`; a type error when
    onnxruntime creates the session)."""
    sizes = {sym: g.dim(name, axis) for sym, (name, axis) in op.size_sources.items()}
    sizes["4H"] = g.op("Mul", sizes["H"], g.const([4]), hint="dim_4H")
    sizes["I+H"] = g.add(sizes["I"], sizes["H"])
    sources = set(op.size_sources.values())
    parts = [g.op("Shape", "cs_prev", hint="cs_prev_shape"), g.const([0])]
    if op.kind == "sequence":
        given = g.op("Reshape", "seq_len_max", g.const([1]), hint="n_given")
        parts += [given, g.minus(sizes["T"], given)]
    for spec in op.inputs:
        rank = g.op("Shape", g.op("Shape", spec.name), hint=f"rank_{spec.name}")
        parts += _both_signs(g, rank, g.const([len(spec.shape)]))
        for axis, sym in enumerate(spec.shape):
            if (spec.name, axis) not in sources:
                parts += _both_signs(g, g.dim(spec.name, axis), sizes[sym])
    flag = g.op("Reshape", use_peephole, g.const([1]), hint="use_peephole_1")
    parts += [flag, g.minus(g.const([1]), flag), _dtype_check(g, op)]  # 0 <= flag <= 1
    dims = g.op("Concat", *parts, axis=0, hint="check_dims")
    what = "0<=seq_len_max<=T_and_" if op.kind == "sequence" else ""
    check = g.op("ConstantOfShape", dims, hint="input_check",
                 node_name=f"{op.name}_input_check_{what}shapes_agree_and_use_peephole_0_or_1")
    cs_prev = g.op("Reshape", "cs_prev", g.op("Shape", check, start=0, end=2), hint="cs_prev_ok")
    n1 = g.op("Shape", check, start=3, end=4, hint="n1") if op.kind == "sequence" else None
    return cs_prev, n1


def scalar(g: Graph, one_element: str) -> str:
    """A 1-element int64 tensor as a 0-d one."""
    return g.op("Reshape", one_element, g.const([], np.int64), hint="n")
