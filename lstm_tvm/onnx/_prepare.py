"""Rewrite a model for the PyOp route (:mod:`lstm_tvm.onnx.ort`): attributes and float16.

onnxruntime-extensions PyOps need every declared attribute on the node, and a PyOp taking a
float16 tensor aborts the process; :func:`prepare_model` fills TF's default attributes and
refuses float16 lstm_tvm nodes or wraps them in ``Cast`` nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from ..registry import OPS
from .domain import DOMAIN, onnx_attr_default, onnx_attr_type, onnx_attrs
from .schema import register_schemas

__all__ = ["float16_nodes", "prepare_model"]


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    register_schemas()
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    return {v.name: v.type.tensor_type.elem_type
            for v in list(g.input) + list(g.value_info) + list(g.output)
            if v.type.HasField("tensor_type")}


def _is_lstm(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type in OPS


def _x_types(model: onnx.ModelProto) -> dict[int, int]:
    """Index -> element type of ``x`` for the top-level lstm_tvm nodes whose ``x`` is not
    float32 (types onnx's inference cannot tell are left out)."""
    types = _value_types(model)
    found = {k: types.get(n.input[OPS[n.op_type].input_names.index("x")])
             for k, n in enumerate(model.graph.node) if _is_lstm(n)}
    return {k: t for k, t in found.items() if t not in (None, onnx.TensorProto.FLOAT)}


def _float16_indices(model: onnx.ModelProto) -> list[int]:
    return [k for k, t in _x_types(model).items() if t == onnx.TensorProto.FLOAT16]


def float16_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The top-level lstm_tvm nodes of ``model`` whose float type is float16."""
    return [model.graph.node[k] for k in _float16_indices(model)]


def _check_types(model: onnx.ModelProto) -> None:
    """``TypeError`` for lstm_tvm nodes whose ``x`` is neither float32 nor float16."""
    bad = [f"{model.graph.node[k].op_type} ({model.graph.node[k].name or 'unnamed'}): "
           f"{onnx.helper.tensor_dtype_to_np_dtype(t).name}"
           for k, t in _x_types(model).items() if t != onnx.TensorProto.FLOAT16]
    if bad:
        raise TypeError(f"lstm_tvm PyOp route: node(s) {bad}: expected float32 (or float16) "
                        f"tensors")


def _fill_attributes(node: onnx.NodeProto) -> None:
    op = OPS[node.op_type]
    present = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    onnx_attrs(op.name, present)  # validates (unknown, missing required, values)
    for a in node.attribute:
        want = onnx_attr_type(op.attr(a.name))
        if a.type != want:
            raise TypeError(f"{op.name}: attribute {a.name!r} expected ONNX type "
                            f"{onnx.AttributeProto.AttributeType.Name(want)}, got "
                            f"{onnx.AttributeProto.AttributeType.Name(a.type)}")
    for spec in op.attrs:
        if spec.name not in present:
            node.attribute.append(helper.make_attribute(spec.name, onnx_attr_default(spec)))


def _cast_node(node: onnx.NodeProto, types: Mapping[str, int], casts: dict) -> list:
    """``[Cast inputs to float32, node (rewired), Cast outputs back]``."""
    op = OPS[node.op_type]
    elem = types[node.input[op.input_names.index("x")]]
    before = []
    for k, (spec, name) in enumerate(zip(op.inputs, list(node.input))):
        if spec.dtype != "T":
            continue
        if name not in casts:
            casts[name] = f"{name}__lstm_tvm_in_f32"
            before.append(helper.make_node("Cast", [name], [casts[name]],
                                           to=onnx.TensorProto.FLOAT))
        node.input[k] = casts[name]
    after = []
    for k, name in enumerate(list(node.output)):
        node.output[k] = f"{name}__lstm_tvm_out_f32"
        after.append(helper.make_node("Cast", [node.output[k]], [name], to=elem))
    return before + [node] + after


def prepare_model(model: onnx.ModelProto, *, float16: str = "error") -> onnx.ModelProto:
    """A copy of ``model`` ready for the PyOp route.

    Missing optional attributes of lstm_tvm nodes are added with TF's defaults; unknown,
    missing required or mistyped attributes (an ONNX type other than the registry's) and float
    types other than float32/float16 raise ``TypeError``. For lstm_tvm nodes whose float type
    is float16: ``float16="error"`` raises ``TypeError``;
    ``float16="cast"`` computes them in float32 between ``Cast`` nodes.
    """
    if float16 not in ("error", "cast"):
        raise ValueError(f"float16: expected 'error' or 'cast', got {float16!r}")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        if _is_lstm(node):
            _fill_attributes(node)
    _check_types(model)
    bad = set(_float16_indices(model))
    if not bad:
        return model
    if float16 == "error":
        names = [f"{n.op_type} ({n.name or 'unnamed'})" for k, n in enumerate(model.graph.node)
                 if k in bad]
        raise TypeError(
            f"lstm_tvm PyOp route: node(s) {names} have float16 tensors, but this route runs "
            f"float32 only (an onnxruntime-extensions PyOp taking float16 aborts the process). "
            f"Use "
            f"float16='cast' (float32 kernels between Cast nodes) or the function route "
            f"(make_model(..., with_functions=True) in a plain onnxruntime session).")
    types = _value_types(model)
    casts: dict = {}
    nodes = []
    for k, node in enumerate(model.graph.node):
        nodes.extend(_cast_node(node, types, casts) if k in bad else [node])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
