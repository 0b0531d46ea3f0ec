"""The contract an ONNX model's lstm_tvm nodes are held to, on every route, before a kernel runs.

Everything is derived from :mod:`lstm_tvm.registry` (through the ops' ``OpSchema``s of
:mod:`.schema` and :func:`lstm_tvm.validation.validate_attrs`):

- the model imports :data:`~.domain.DOMAIN` at :data:`~.domain.DOMAIN_VERSION` when it holds a
  node of the domain, and every node of the domain is one of the six ops;
- ``onnx.checker`` passes with the schemas registered: op inputs and outputs counted (every
  output of an op is written: TF computes them all), attribute names and types (bools as INT
  0/1, floats as FLOAT), no attribute twice, one writer per value, nodes in topological order;
- attribute values as TF's (:func:`node_attrs`): a finite ``forget_bias`` in float32's range,
  ``use_peephole`` 0 or 1, ``cell_clip`` any float (TF's rule: one that is not a finite,
  normal float32 above 0 turns the clip off);
- as far as onnx's type and shape inference tells: every input has the op's rank, every float
  input ``x``'s type, float32 or float16; ``seq_len_max`` int64; ``I`` and ``H`` at least 1.

:func:`check_model` checks it. lstm_tvm's routes run it when a session or module is made (the
PyOp route's ``InferenceSession``, ``native.InferenceSession``, ``relax.from_onnx``); plain ONNX
Runtime running the ops' ONNX functions knows nothing of it (see :mod:`.functions` for what the
function bodies check), so run it before deploying there. Feeds are checked by each route at
run time (dtypes, ranks, dims, ``seq_len_max`` in ``[0, T]``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping

import onnx
from onnx import TensorProto, helper

from ..registry import OPS, OpSpec
from ..validation import validate_attrs
from .domain import DOMAIN, DOMAIN_VERSION
from .schema import register_schemas

__all__ = ["check_model", "lstm_nodes", "node_attrs", "node_label"]

_FLOATS = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}


def node_attrs(op: OpSpec, given: Mapping[str, object], label: str) -> dict:
    """A node's ONNX attribute values (bools as 0/1 ints) as TF's, every one (TF's defaults
    filled), or ``TypeError``/``ValueError`` starting with ``label`` and naming the attribute.
    """
    unknown = sorted(set(given) - set(op.attr_names))
    if unknown:
        raise TypeError(f"{label}: unknown attribute(s) {unknown}; expected among "
                        f"{list(op.attr_names)}")
    values = {}
    for spec in op.attrs:
        if spec.name not in given:
            if spec.required:
                raise TypeError(f"{label}: attribute {spec.name!r} is required")
            continue
        value = given[spec.name]
        if spec.type is bool:
            if not isinstance(value, numbers.Integral) or int(value) not in (0, 1):
                raise ValueError(f"{label}: attribute {spec.name!r} expected 0 or 1, got "
                                 f"{value!r}")
            values[spec.name] = bool(value)
        elif isinstance(value, numbers.Real):
            values[spec.name] = float(value)
        else:
            raise TypeError(f"{label}: attribute {spec.name!r} expected a float, got {value!r}")
    try:
        return validate_attrs(op, values)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{label}: {str(err).split(': ', 1)[-1]}") from None


def lstm_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The nodes of :data:`~.domain.DOMAIN` in ``graph`` and its subgraphs (``If`` branches,
    ``Loop`` bodies); not those of function bodies."""
    for node in graph.node:
        if node.domain == DOMAIN:
            yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from lstm_nodes(sub)


def node_label(node: onnx.NodeProto) -> str:
    """``"<op type> node '<name>'"``, or the first output's name for an unnamed node."""
    if node.name:
        return f"{node.op_type} node {node.name!r}"
    outputs = [o for o in node.output if o]
    return f"{node.op_type} node (unnamed, output {outputs[0]!r})" if outputs else \
        f"{node.op_type} node (unnamed)"


def _check_domain(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    unknown = sorted({n.op_type for n in nodes if n.op_type not in OPS})
    if unknown:
        raise ValueError(f"model: {DOMAIN} has no op(s) {unknown}; it holds {list(OPS)}")
    versions = {o.domain: o.version for o in model.opset_import}
    if nodes and DOMAIN not in versions:
        raise ValueError(f"model: holds {DOMAIN} nodes ({node_label(nodes[0])}, ...) but does "
                         f"not import the domain: add opset_import {DOMAIN!r} version "
                         f"{DOMAIN_VERSION}")
    if DOMAIN in versions and versions[DOMAIN] != DOMAIN_VERSION:
        raise ValueError(f"model: imports {DOMAIN} version {versions[DOMAIN]}; lstm_tvm "
                         f"defines version {DOMAIN_VERSION}")


def _value_types(inferred: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value's type in an inferred model (graph inputs, initializers, value_info)."""
    g = inferred.graph
    types = {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}
    for init in g.initializer:
        types[init.name] = helper.make_tensor_type_proto(init.data_type, list(init.dims))
    return types


def _elem(types: Mapping[str, onnx.TypeProto], name: str) -> int | None:
    t = types.get(name)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.elem_type:
        return None
    return t.tensor_type.elem_type


def _rank(types: Mapping[str, onnx.TypeProto], name: str) -> int | None:
    t = types.get(name)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


def _static_dim(types: Mapping[str, onnx.TypeProto], name: str, axis: int) -> int | None:
    t = types.get(name)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if len(dims) <= axis or not dims[axis].HasField("dim_value"):
        return None
    return dims[axis].dim_value


def _check_node(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto]) -> None:
    op, label = OPS[node.op_type], node_label(node)
    node_attrs(op, {a.name: helper.get_attribute_value(a) for a in node.attribute}, label)
    given = dict(zip(op.input_names, node.input))
    x_type = _elem(types, given.get("x", ""))
    for spec in op.inputs:
        rank = _rank(types, given.get(spec.name, ""))
        if rank is not None and rank != len(spec.shape):
            raise ValueError(f"{label}: input {spec.name!r} expected rank {len(spec.shape)}, "
                             f"got rank {rank}")
        elem = _elem(types, given.get(spec.name, ""))
        if elem is None:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(elem).name
        if spec.dtype == "int64":
            if elem != TensorProto.INT64:
                raise TypeError(f"{label}: input {spec.name!r} expected int64, got {dtype}")
        elif spec.name != "x" and x_type in _FLOATS and elem != x_type:
            raise TypeError(f"{label}: input {spec.name!r} expected {_FLOATS[x_type]} (the type "
                            f"of 'x'), got {dtype}")
        elif elem not in _FLOATS:
            raise TypeError(f"{label}: input {spec.name!r} expected float32 or float16, got "
                            f"{dtype}")
    for sym, (source, axis) in op.size_sources.items():
        if sym in ("I", "H"):
            size = _static_dim(types, given.get(source, ""), axis)
            if size is not None and size < 1:
                raise ValueError(f"{label}: input {source!r} dim {axis} ({sym}) expected >= 1, "
                                 f"got {size}")


def check_model(model: onnx.ModelProto) -> None:
    """Check ``model`` against lstm_tvm's contract (the module doc); registers the ops'
    schemas with onnx (:func:`~.schema.register_schemas`).

    Raises
    ------
    ValueError
        onnx's checker rejects the model (its message), the domain is not imported or at
        another version, an attribute value TF refuses, ``I`` or ``H`` below 1.
    TypeError
        An input whose type onnx's inference knows is not the op's (float inputs unlike
        ``x``, float64, a non-int64 ``seq_len_max``). Each message names the node and the
        input or attribute.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected an onnx.ModelProto, got {type(model).__name__}")
    nodes = list(lstm_nodes(model.graph))
    _check_domain(model, nodes)
    register_schemas()
    inferred = _inferred(model)
    try:
        onnx.checker.check_model(_with_io_shapes(model, inferred))
    except onnx.checker.ValidationError as err:
        raise ValueError(f"model: onnx.checker rejects it: {err}") from None
    if nodes:
        types = _value_types(inferred)
        for node in nodes:
            _check_node(node, types)


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the types and shapes onnx's inference tells (best effort)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is best effort; the checker reports the model
        return model


def _with_io_shapes(model: onnx.ModelProto, inferred: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, its graph inputs and outputs declared without a shape given the one inference
    found (an empty one where it found none): onnx's checker requires the field on them, ONNX
    Runtime does not (a model it runs must not be refused for that alone)."""
    known = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output,
                                      *inferred.graph.input]}
    missing = [v for v in [*model.graph.input, *model.graph.output]
               if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if not missing:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in [*copy.graph.input, *copy.graph.output]:
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or tensor.HasField("shape"):
            continue
        found = known.get(value.name)
        if found is not None and found.tensor_type.HasField("shape"):
            tensor.shape.CopyFrom(found.tensor_type.shape)
        else:  # present for the checker, which (without full_check) reads no dims
            tensor.shape.SetInParent()
    return copy
