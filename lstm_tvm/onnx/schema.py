"""ONNX ``OpSchema`` objects for the six ops, generated from :mod:`lstm_tvm.registry`.

:func:`register_schemas` registers one schema per registry op in :data:`~.domain.DOMAIN`
(version :data:`~.domain.DOMAIN_VERSION`) with onnx's Python registry, so that
``onnx.checker.check_model(model, full_check=True)`` and
``onnx.shape_inference.infer_shapes(model, strict_mode=True)`` understand lstm_tvm nodes:

- inputs and outputs in TF's order and with TF's names; every float tensor has type ``T`` in
  ``{tensor(float), tensor(float16)}`` (onnx rejects e.g. a float64 input, or mixed types),
  ``seq_len_max`` is ``tensor(int64)``;
- attributes as TF's (bools as INT 0/1, floats as FLOAT) with TF's defaults; TF attributes
  without a default (``use_peephole`` of the grad ops) are required;
- a shape-inference function: output shapes from the registry's symbols (``T, B, I, H, 4H,
  I+H``) bound from the input shapes (concrete or symbolic dims; conflicting concrete sizes and
  wrong ranks are errors), output element type = the inputs' ``T``.

onnxruntime does not read these schemas (it ignores Python-registered schemas); see
:mod:`.functions` and :mod:`.ort` for execution. Registration is explicit and idempotent, never
an import side effect.
"""

from __future__ import annotations

import onnx
from onnx import defs, helper
from onnx.defs import OpSchema

from ..registry import OPS, OpSpec, TensorSpec
from .domain import (
    DOMAIN,
    DOMAIN_VERSION,
    FLOAT_TYPE_STRS,
    INDEX_TYPE_STR,
    onnx_attr_default,
    onnx_attr_type,
)

__all__ = ["deregister_schemas", "infer_output_types", "make_schema", "register_schemas"]

_T, _I64 = "T", "I64"
_ATTR_TYPES = {onnx.AttributeProto.INT: OpSchema.AttrType.INT,
               onnx.AttributeProto.FLOAT: OpSchema.AttrType.FLOAT}


def _fail(op: OpSpec, message: str):
    raise onnx.shape_inference.InferenceError(f"[ShapeInferenceError] {op.name}: {message}")


def _param(spec: TensorSpec) -> OpSchema.FormalParameter:
    return OpSchema.FormalParameter(spec.name, _T if spec.dtype == "T" else _I64, spec.doc)


def _attribute(op: OpSpec, name: str) -> OpSchema.Attribute:
    spec = op.attr(name)
    default = onnx_attr_default(spec)
    if default is None:
        return OpSchema.Attribute(name, _ATTR_TYPES[onnx_attr_type(spec)], spec.doc, required=True)
    return OpSchema.Attribute(name, helper.make_attribute(name, default), spec.doc)


def make_schema(op_name: str) -> OpSchema:
    """A new (unregistered) ``OpSchema`` for registry op ``op_name``."""
    op = OPS[op_name]
    constraints = [(_T, list(FLOAT_TYPE_STRS), "float16 or float32 (TF's T)")]
    if any(t.dtype != "T" for t in op.inputs):
        constraints.append((_I64, [INDEX_TYPE_STR], "seq_len_max: an int64 scalar"))
    schema = OpSchema(
        op.name, DOMAIN, DOMAIN_VERSION,
        f"{op.doc} TensorFlow's {op.name} (tf.raw_ops.{op.name}); gate layout {op.gate_layout}.",
        inputs=[_param(t) for t in op.inputs],
        outputs=[_param(t) for t in op.outputs],
        type_constraints=constraints,
        attributes=[_attribute(op, a) for a in op.attr_names],
    )
    schema.set_type_and_shape_inference_function(lambda ctx: _infer(op, ctx))
    return schema


# --- shape inference ---------------------------------------------------------------------------

def _bind(op: OpSpec, dims: dict, sym: str, value: int | str | None, where: str):
    """Record ``sym = value``; concrete sizes win over symbolic ones and must agree."""
    if value is None:
        return
    old = dims.get(sym)
    if isinstance(value, int):
        if isinstance(old, int) and old != value:
            _fail(op, f"{where}: dim {sym} = {value} conflicts with {sym} = {old} seen before")
        dims[sym] = value
    elif old is None:
        dims[sym] = value


def _derive(op: OpSpec, dims: dict):
    """Fill and check the derived dims ``4H`` and ``I+H`` (and ``H``, ``I`` from them)."""
    H, G, I, IH = dims.get("H"), dims.get("4H"), dims.get("I"), dims.get("I+H")
    if not isinstance(H, int) and isinstance(G, int):
        if G % 4:
            _fail(op, f"dim 4H = {G} is not a multiple of 4")
        dims["H"] = H = G // 4
    if isinstance(H, int):
        _bind(op, dims, "4H", 4 * H, "4H = 4 * H")
        if not isinstance(I, int) and isinstance(IH, int):
            if IH - H < 1:
                _fail(op, f"dim I+H = {IH} leaves no input size with H = {H}")
            dims["I"] = I = IH - H
        if isinstance(I, int):
            _bind(op, dims, "I+H", I + H, "I+H")


def _dim_value(dim):
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    if dim.HasField("dim_param"):
        return dim.dim_param
    return None


def infer_output_types(op: OpSpec, input_types: list) -> list:
    """Output ``TypeProto``s of ``op`` for ``input_types`` (``TypeProto`` or None each).

    Raises ``onnx.shape_inference.InferenceError`` on wrong ranks, conflicting sizes or mixed
    float types. Dims that cannot be bound stay unknown; outputs get no type while no float
    input has one.
    """
    dims: dict = {}
    elem = None
    for spec, tp in zip(op.inputs, input_types):
        if tp is None or not tp.HasField("tensor_type"):
            continue
        tt = tp.tensor_type
        if spec.dtype == "T" and tt.elem_type:
            if elem is not None and tt.elem_type != elem:
                _fail(op, f"input {spec.name!r} has element type {tt.elem_type}, expected "
                          f"{elem} like the other float inputs")
            elem = tt.elem_type
        if not tt.HasField("shape"):
            continue
        if len(tt.shape.dim) != len(spec.shape):
            _fail(op, f"input {spec.name!r} expected rank {len(spec.shape)} "
                      f"({', '.join(spec.shape) or 'a scalar'}), got rank {len(tt.shape.dim)}")
        for sym, dim in zip(spec.shape, tt.shape.dim):
            _bind(op, dims, sym, _dim_value(dim), f"input {spec.name!r}")
    _derive(op, dims)
    if elem is None:
        return [None] * len(op.outputs)
    return [helper.make_tensor_type_proto(elem, [dims.get(s) for s in out.shape])
            for out in op.outputs]


def _infer(op: OpSpec, ctx) -> None:
    types = [ctx.get_input_type(k) if ctx.has_input(k) else None
             for k in range(min(ctx.get_num_inputs(), len(op.inputs)))]
    for k, tp in enumerate(infer_output_types(op, types)):
        if tp is not None and k < ctx.get_num_outputs() and ctx.has_output(k):
            ctx.set_output_type(k, tp)


# --- registration ------------------------------------------------------------------------------

def register_schemas() -> list[OpSchema]:
    """Register the schemas of all registry ops with onnx (idempotent); return them.

    A schema already registered for ``(op, DOMAIN_VERSION, DOMAIN)`` is kept (onnx raises
    ``SchemaError`` on a second registration).
    """
    schemas = []
    for name in OPS:
        if not defs.has(name, DOMAIN_VERSION, DOMAIN):
            defs.register_schema(make_schema(name))
        schemas.append(defs.get_schema(name, DOMAIN_VERSION, DOMAIN))
    return schemas


def deregister_schemas() -> None:
    """Remove the registered schemas of all registry ops from onnx (idempotent; for tests)."""
    for name in OPS:
        if defs.has(name, DOMAIN_VERSION, DOMAIN):
            defs.deregister_schema(name, DOMAIN_VERSION, DOMAIN)
