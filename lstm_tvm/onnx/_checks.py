"""Input checks inside an ONNX function body (standard ONNX has no Assert op).

onnxruntime checks a model's declared input dims, but not that symbolic dims (``T``, ``B``)
agree between inputs, and a function may be used in models that declare no shapes at all.
:func:`checked_inputs` builds one ``ConstantOfShape`` whose dims are

    (cs_prev dims..., 0, seq_len_max, T - seq_len_max, d_1, -d_1, d_2, -d_2, ...,
     I - 1, H - 1, use_peephole, 1 - use_peephole, 0)

where each ``d_k`` is the difference between an input dim and the size the registry says it
must have (``T, B, I`` from ``x``, ``H`` from ``cs_prev``, ``4H``, ``I+H`` derived) or between an
input's rank and its registry rank. Every entry is >= 0 exactly when the inputs are
consistent (and the ``use_peephole`` attribute is 0 or 1); otherwise onnxruntime fails at that
node (a negative dim) instead of computing garbage; the last 0 is the shape of a node named
``<Op>_input_check_forget_bias_is_finite`` that fails for a NaN or infinite ``forget_bias``. A
``DequantizeLinear`` node named ``<Op>_input_check_dtype_is_float_or_float16`` makes a float64
or integer model a type error, and ``<Op>_input_check_<input>_has_the_type_of_x`` one whose
float inputs' types differ. The tensor has no elements (the 0), so nothing is allocated, and its
shape carries the checked ``cs_prev`` shape and ``seq_len_max`` back into the computation, which
keeps the check alive (it cannot be pruned as dead code); every other input reaches the body
through :func:`after_checks`, so no node reads an input before the checks passed.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..registry import OpSpec
from ._graph import Graph


def _both_signs(g: Graph, a: str, b: str) -> list[str]:
    return [g.minus(a, b), g.minus(b, a)]


def _dtype_check(g: Graph, op: OpSpec) -> str:
    """Nodes that type-check only when ``x`` is float32 or float16 (``DequantizeLinear``'s
    scale type, opset 21: float, float16, bfloat16; the body's ``Sin`` is not used because
    onnxruntime has no float16 ``Sin``) and every other float input has ``x``'s type (an
    ``Add`` of one-element probes). Without them, a float64 or int32 model would run (every
    input is cast to float32, outputs back) and silently compute garbage for integers, and a
    float64 ``w`` beside a float32 ``x`` would be rounded. Returns an empty int64 1-D tensor to
    concatenate into the check dims (keeps the nodes alive)."""
    one = g.const(1.0, np.float32, "one")
    scale = g.op("CastLike", one, "x", hint="dtype_probe")
    probe = g.op("DequantizeLinear", g.const(0, np.int8, "q"), scale, hint="dtype_ok",
                 node_name=f"{op.name}_input_check_dtype_is_float_or_float16")
    for spec in op.inputs:
        if spec.dtype == "T" and spec.name != "x":
            other = g.op("CastLike", one, spec.name, hint=f"dtype_probe_{spec.name}")
            probe = g.op("Add", probe, other, hint="dtype_ok",
                         node_name=f"{op.name}_input_check_{spec.name}_has_the_type_of_x")
    return g.op("Shape", probe, hint="dtype_ok_shape")  # shape of a scalar: []


def _finite_check(g: Graph, op: OpSpec, name: str, value: str) -> str:
    """A node that fails unless float attribute ``name`` (the scalar ``value``) is finite
    (TF refuses NaN and inf); returns a ``[0]`` int64 tensor for the check dims."""
    bad = g.op("Or", g.op("IsNaN", value), g.op("IsInf", value), hint=f"{name}_not_finite")
    entry = g.op("Neg", g.op("Reshape", g.op("Cast", bad, to=TensorProto.INT64), g.const([1])),
                 hint=f"{name}_check_dim")
    check = g.op("ConstantOfShape", entry, hint=f"{name}_check",
                 node_name=f"{op.name}_input_check_{name}_is_finite")
    return g.op("Shape", check, hint=f"{name}_ok")


def checked_inputs(g: Graph, op: OpSpec, use_peephole: str,
                   forget_bias: str | None = None) -> tuple[str, str | None, str]:
    """``(cs_prev, seq_len_max, zero)`` as checked values: ``cs_prev`` reshaped to its own
    (checked) shape, ``seq_len_max`` as a 1-element int64 tensor (None for cell ops), and a
    ``[0]`` int64 tensor read from the check for :func:`after_checks`.

    ``use_peephole`` is the int64 attribute value (a 0-d tensor): it must be 0 or 1;
    ``forget_bias`` (the float attribute, for the ops that have it) must be finite. ``I`` and
    ``H`` must be at least 1. The float type of ``x`` must be float32 or float16 and every
    float input's type ``x``'s (:func:`_dtype_check`; a type error when onnxruntime creates the
    session)."""
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
    parts += [g.minus(sizes["I"], g.const([1])), g.minus(sizes["H"], g.const([1]))]  # >= 1
    flag = g.op("Reshape", use_peephole, g.const([1]), hint="use_peephole_1")
    parts += [flag, g.minus(g.const([1]), flag), _dtype_check(g, op)]  # 0 <= flag <= 1
    if forget_bias is not None:
        parts.append(_finite_check(g, op, "forget_bias", forget_bias))
    dims = g.op("Concat", *parts, axis=0, hint="check_dims")
    what = "0<=seq_len_max<=T_and_" if op.kind == "sequence" else ""
    check = g.op("ConstantOfShape", dims, hint="input_check",
                 node_name=f"{op.name}_input_check_{what}shapes_agree_I_H_at_least_1_"
                          f"use_peephole_0_or_1")
    cs_prev = g.op("Reshape", "cs_prev", g.op("Shape", check, start=0, end=2), hint="cs_prev_ok")
    n1 = g.op("Shape", check, start=3, end=4, hint="n1") if op.kind == "sequence" else None
    return cs_prev, n1, g.op("Shape", check, start=2, end=3, hint="checked_zero")


def after_checks(g: Graph, name: str, checked_zero: str) -> str:
    """Input ``name`` as a value that exists only once the checks passed (a ``Reshape`` to its
    own shape plus :func:`checked_inputs`' ``[0]``), so that no node reads it before them: a
    bad input fails at the check, named, not at the first ``MatMul`` that meets it."""
    shape = g.op("Add", g.op("Shape", name, hint=f"{name}_shape"), checked_zero,
                 hint=f"{name}_shape_ok")
    return g.op("Reshape", name, shape, hint=f"{name}_ok")


def scalar(g: Graph, one_element: str) -> str:
    """A 1-element int64 tensor as a 0-d one."""
    return g.op("Reshape", one_element, g.const([], np.int64), hint="n")
