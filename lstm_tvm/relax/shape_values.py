"""Shapes a graph computes at run time, known at import time as ``PrimExpr``s.

A TF graph with a dynamic batch writes ``tf.reshape(h, [-1, batch_size, H])`` with
``batch_size = tf.shape(x)[0]``; tf2onnx turns it into ``Shape`` -> ``Cast`` (int32) -> ``Slice``
-> ``Concat`` (with int32 constants) -> ``Cast`` (int64) -> ``Reshape``. TVM's ONNX frontend
follows shapes as ``ShapeExpr`` through some of these ops but not through an int32 ``Cast`` or a
``Concat`` of int32 constants, and its ``Reshape`` takes only a constant or a ``ShapeExpr``.

:class:`ShapeValues` follows the values of small integer tensors beside TVM's conversion: a
value is known when it comes from constants and from the dims of tensors whose type Relax knows,
through the index ops listed in :data:`FOLLOWED`. A known static value becomes a constant. An op
that takes a shape operand (:data:`SHAPE_OPERANDS`) is given it as a constant or a ``ShapeExpr``
(symbolic in the graph's dims, so ``Reshape``'s output keeps the batch dim of the tensor it came
from); ``Reshape``'s ``0`` and ``-1`` are resolved against its data's dims; a ``Tile`` by
symbolic repeats becomes a broadcast. ``BroadcastGradientArgs`` (as :mod:`lstm_tvm.convert`
writes it: the axes where a shape has a 1, by ``Equal`` and ``NonZero``) is followed as such, and
the ``ReduceSum`` over those axes gets them at import: the static 1s; a symbolic dim is left out
when it is the summed tensor's own dim (1 in both at run time, or in neither). A ``Reshape``
whose target is not known (read from a graph input, say) is resolved at run time instead: its
``0`` and ``-1`` by Relax ops, checked to hold the data's elements, then ``tensor_to_shape``
into fresh dims.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from tvm import relax, tirx
from tvm.ir import is_prim_expr
from tvm.sym import Analyzer

from .context import node_label
from .shapes import constant_value, static_dim

__all__ = ["FOLLOWED", "SHAPE_OPERANDS", "IntValue", "ShapeValues"]

#: Index of the shape operand of each op that takes one (``ReduceSum``: its axes).
SHAPE_OPERANDS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Tile": 1, "ReduceSum": 1}
#: Ops whose operand TVM's loop accepts as a ``ShapeExpr`` (``Tile``: see ``convert``).
_TAKES_SHAPE_EXPR = ("Reshape", "Expand", "ConstantOfShape")
#: The most values followed in one tensor (shapes and index vectors are short).
_MAX_VALUES = 16
_INT_DTYPES = ("int64", "int32")


@dataclasses.dataclass(frozen=True)
class IntValue:
    """The value of a small integer (or bool) tensor, ``values`` as ``int64`` ``PrimExpr``s.

    ``rank`` 0 is a scalar, 1 a vector, 2 a ``(1, n)`` matrix (``NonZero``'s output). ``kind``
    says what ``values`` hold: ``"values"`` the elements; ``"ones"`` the dims of a shape, the
    tensor being the bool vector ``dims == 1``; ``"ones_axes"`` the dims of a shape, the tensor
    being the indices where they are 1 (what ``BroadcastGradientArgs`` computes).
    """

    rank: int
    values: tuple
    dtype: str = "int64"
    kind: str = "values"

    @property
    def static(self) -> list[int] | None:
        """The elements as Python ints when every one is static, else ``None``."""
        ints = [static_dim(v) for v in self.values]
        if self.kind != "values" or any(v is None for v in ints):
            return None
        return ints

    def constant(self) -> relax.Expr | None:
        """The tensor as a Relax constant when every element is static, else ``None``."""
        ints = self.static
        if ints is None:
            return None
        shape = ((), (len(ints),), (1, len(ints)))[self.rank]
        return relax.const(np.array(ints, self.dtype).reshape(shape), self.dtype)


def _int64(value) -> tirx.PrimExpr:
    return tirx.IntImm("int64", int(value)) if not is_prim_expr(value) else value.astype("int64")


def value_of(expr) -> IntValue | None:
    """The value of a Relax expression TVM's frontend made: a ``ShapeExpr``, a scalar
    ``PrimExpr``, or a small integer constant."""
    if expr is None:
        return None
    if isinstance(expr, relax.ShapeExpr):
        return IntValue(1, tuple(_int64(v) for v in expr.values))
    if is_prim_expr(expr):  # TVM's frontend computed a scalar from shapes
        dtype = str(expr.ty.dtype)
        return IntValue(0, (_int64(expr),), dtype) if dtype in _INT_DTYPES else None
    array = constant_value(expr) if isinstance(expr, relax.Expr) else None
    if array is None or array.dtype.name not in _INT_DTYPES or array.ndim > 1 \
            or array.size > _MAX_VALUES:
        return None
    return IntValue(array.ndim, tuple(_int64(v) for v in array.reshape(-1)), array.dtype.name)


class ShapeValues:
    """The known values of one graph's integer tensors, by ONNX value name."""

    def __init__(self):
        self._values: dict[str, IntValue] = {}
        self._analyzer = Analyzer()

    def get(self, name: str, nodes: Mapping) -> IntValue | None:
        """The value of ONNX value ``name`` (converted to ``nodes[name]``), if known."""
        if not name:
            return None
        if name in self._values:
            return self._values[name]
        return value_of(nodes.get(name))

    def follow(self, node: onnx.NodeProto, nodes: Mapping, attrs: Mapping) -> IntValue | None:
        """The value of ``node``'s output, when it follows from its inputs' known values."""
        rule = FOLLOWED.get(node.op_type)
        if rule is None or len(node.output) != 1:
            return None
        inputs = [self.get(name, nodes) for name in node.input]
        try:
            value = rule(node, inputs, attrs, nodes)
        except (IndexError, ValueError, ZeroDivisionError):
            return None  # TVM's conversion of the node reports what is wrong with it
        if value is None or len(value.values) > _MAX_VALUES:
            return None
        simplify = self._analyzer.simplify
        return dataclasses.replace(value, values=tuple(simplify(v) for v in value.values))

    def record(self, name: str, value: IntValue | None) -> None:
        """Remember ``value`` as the value of ONNX value ``name``."""
        if value is not None:
            self._values[name] = value

    def convert(self, bb: relax.BlockBuilder, node: onnx.NodeProto, nodes: Mapping,
                value: IntValue | None):
        """``node`` converted here, else ``None`` (TVM converts it): an output whose value is
        known and static becomes a constant; a ``Tile`` whose repeats are known but symbolic
        (TVM's dynamic ``Tile`` forgets its output's dims, and ops on them then fail to lower)
        becomes a broadcast of the data with a unit axis before each of its axes."""
        constant = value.constant() if value is not None else None
        if constant is not None:
            return constant
        if node.op_type != "Tile" or len(node.input) != 2:
            return None
        repeats = self.get(node.input[1], nodes)
        dims = _dims(nodes.get(node.input[0]))
        if repeats is None or repeats.rank != 1 or repeats.kind != "values" \
                or repeats.static is not None or dims is None \
                or len(dims) != len(repeats.values):
            return None
        one = tirx.IntImm("int64", 1)
        data = nodes[node.input[0]]
        spread = relax.op.reshape(data, relax.ShapeExpr([v for d in dims for v in (one, d)]))
        tiled = relax.op.broadcast_to(
            spread, relax.ShapeExpr([v for r, d in zip(repeats.values, dims) for v in (r, d)]))
        simplify = self._analyzer.simplify
        return relax.op.reshape(tiled, relax.ShapeExpr(
            [simplify(r * d) for r, d in zip(repeats.values, dims)]))

    def shape_operand(self, bb: relax.BlockBuilder, node: onnx.NodeProto, nodes: Mapping,
                      attrs: Mapping):
        """``(index, expr)``: the shape (or axes) operand TVM's converter of ``node`` should
        take instead of the one it has (a constant, or a ``ShapeExpr``), or ``None`` to
        convert the node as it is."""
        index = SHAPE_OPERANDS.get(node.op_type)
        if index is None or len(node.input) <= index or not node.input[index]:
            return None
        operand = nodes.get(node.input[index])
        if operand is None or constant_value(operand) is not None \
                or isinstance(operand, relax.ShapeExpr) and node.op_type != "Reshape":
            return None
        value = self.get(node.input[index], nodes)
        data = nodes[node.input[0]]
        if node.op_type == "ReduceSum":
            axes = self._ones_axes(value, data)
            return None if axes is None else (index, relax.const(np.array(axes, "int64"), "int64"))
        if value is None or value.rank != 1 or value.kind != "values":
            if node.op_type == "Reshape" and _tensor_length(operand) is not None \
                    and _dims(data) is not None:
                return index, _reshape_at_run_time(bb, data, operand,
                                                   bool(attrs.get("allowzero", 0)),
                                                   node_label(node))
            return None
        values = list(value.values)
        if node.op_type == "Reshape":
            values = self._resolve_reshape(data, values, bool(attrs.get("allowzero", 0)))
            if values is None:
                return None
        ints = [static_dim(v) for v in values]
        if None not in ints:
            return index, relax.const(np.array(ints, "int64"), "int64")
        if node.op_type not in _TAKES_SHAPE_EXPR:
            return None
        return index, relax.ShapeExpr(values)

    def _ones_axes(self, value: IntValue | None, data) -> list[int] | None:
        """``ReduceSum``'s axes where they are the axes of size 1 of a shape of ``data``'s rank
        (``BroadcastGradientArgs``): the static 1s, and not a symbolic dim that is ``data``'s
        own (at run time 1 in both or in neither: summing over it changes nothing)."""
        dims = _dims(data)
        if value is None or value.kind != "ones_axes" or value.rank != 1 or dims is None \
                or len(dims) != len(value.values):
            return None
        axes = []
        for k, (dim, own) in enumerate(zip(value.values, dims)):
            size = static_dim(dim)
            if size == 1:
                axes.append(k)
            elif size is None and not self._analyzer.can_prove_equal(dim, own):
                return None
        return axes

    def _resolve_reshape(self, data, target: list, allowzero: bool) -> list | None:
        """``Reshape``'s target with ``0`` (copy the data's dim) and ``-1`` (the rest)
        resolved; ``None`` when the data's dims are not known and the target needs them."""
        ints = [static_dim(v) for v in target]
        needs_dims = -1 in ints or (not allowzero and 0 in ints)
        if not needs_dims:
            return target
        dims = _dims(data)
        if dims is None:
            return None
        out = [dims[k] if v == 0 and not allowzero and k < len(dims) else target[k]
               for k, v in enumerate(ints)]
        if ints.count(-1) != 1:
            return out if -1 not in ints else None
        rest = ints.index(-1)
        known = [d for k, d in enumerate(out) if k != rest]
        out[rest] = self._analyzer.simplify(
            tirx.floordiv(_product(dims), _product(known)))
        return out


def _dims(expr) -> list | None:
    """The dims of tensor ``expr`` as ``int64`` ``PrimExpr``s, if Relax knows them."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [_int64(d) for d in ty.shape.values]


def _product(values: Sequence) -> tirx.PrimExpr:
    return math.prod(values, start=tirx.IntImm("int64", 1))


def _tensor_length(expr) -> int | None:
    """The static length of a rank-1 integer tensor, else ``None``."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.ndim != 1 or "int" not in str(ty.dtype) \
            or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return static_dim(ty.shape.values[0])


def _reshape_at_run_time(bb: relax.BlockBuilder, data, shape, allowzero: bool, label: str):
    """``Reshape``'s target read at run time, its ``0`` and ``-1`` resolved by Relax ops
    against ``data``'s shape, as a ``ShapeExpr`` of fresh dims; a target that does not hold
    ``data``'s elements exactly fails the run (the VM's reshape would make a smaller view)."""
    length = _tensor_length(shape)
    target = bb.emit(relax.op.astype(shape, "int64"))
    dims = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(data)))
    zero, one = relax.const(0, "int64"), relax.const(1, "int64")
    rank = data.ty.ndim
    if not allowzero:
        copied = relax.op.strided_slice(dims, [0], [0], [min(length, rank)]) \
            if rank > length else dims
        if rank < length:
            copied = relax.op.concat([dims, relax.const(np.ones(length - rank, "int64"),
                                                        "int64")])
        target = bb.emit(relax.op.where(relax.op.equal(target, zero), copied, target))
    unknown = relax.op.equal(target, relax.const(-1, "int64"))
    rest = relax.op.floor_divide(relax.op.prod(dims),
                                 relax.op.prod(relax.op.where(unknown, one, target)))
    target = bb.emit(relax.op.where(unknown, rest, target))
    fits = relax.op.logical_and(
        relax.op.equal(relax.op.prod(target), relax.op.prod(dims)),
        relax.op.greater_equal(relax.op.min(target), zero))
    bb.emit(relax.op.assert_op(fits, [shape, dims],
                               f"{label}: the target shape {{}} does not fit the data's shape "
                               f"{{}} (ONNX Reshape: 0 copies a dim, one -1 takes the rest)"))
    shape_value = bb.emit(relax.op.tensor_to_shape(target))
    fresh = [tirx.Var(f"reshape_dim_{k}", "int64") for k in range(length)]
    bb.match_cast(shape_value, relax.ShapeType(fresh))
    return relax.ShapeExpr(fresh)


# --- How each followed op computes its output's value --------------------------------------------

def _same(node, inputs, attrs, nodes):
    return inputs[0]


def _values(value: IntValue | None, rank: int | None = None) -> IntValue | None:
    """``value`` when it holds its elements (of ``rank``, if given)."""
    if value is None or value.kind != "values" or rank is not None and value.rank != rank:
        return None
    return value


def _cast(node, inputs, attrs, nodes):
    dtype = onnx.helper.tensor_dtype_to_np_dtype(attrs.get("to", 0)).name \
        if attrs.get("to") in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) else None
    value = inputs[0]
    if dtype is None or value is None or value.kind == "ones":
        return None
    return dataclasses.replace(value, dtype=dtype)


def _shape(node, inputs, attrs, nodes):
    dims = _dims(nodes.get(node.input[0]))
    if dims is None:
        return None
    return IntValue(1, tuple(dims[slice(attrs.get("start", 0), attrs.get("end"))]))


def _static_operand(inputs, k, attrs, name, default=None):
    """A list of ints from input ``k`` (opset >= 10 style) or attribute ``name``."""
    if k < len(inputs) and inputs[k] is not None:
        return inputs[k].static
    if name in attrs:
        value = attrs[name]
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return default


def _slice(node, inputs, attrs, nodes):
    data = _values(inputs[0], 1)
    starts = _static_operand(inputs, 1, attrs, "starts")
    ends = _static_operand(inputs, 2, attrs, "ends")
    axes = _static_operand(inputs, 3, attrs, "axes", [0])
    steps = _static_operand(inputs, 4, {}, "steps", [1])
    if data is None or None in (starts, ends, axes, steps) or len(starts) != 1 \
            or axes[0] not in (0, -1) or steps[0] == 0:
        return None
    return dataclasses.replace(data, values=data.values[starts[0]:ends[0]:steps[0]])


def _gather(node, inputs, attrs, nodes):
    data = _values(inputs[0], 1)
    indices = _values(inputs[1])
    if data is None or indices is None or indices.static is None \
            or attrs.get("axis", 0) not in (0, -1):
        return None
    return IntValue(indices.rank, tuple(data.values[i] for i in indices.static), data.dtype)


def _concat(node, inputs, attrs, nodes):
    if attrs.get("axis", 0) not in (0, -1) or any(_values(v, 1) is None for v in inputs):
        return None
    return IntValue(1, tuple(v for value in inputs for v in value.values), inputs[0].dtype)


def _unsqueeze(node, inputs, attrs, nodes):
    axes = _static_operand(inputs, 1, attrs, "axes")
    data = _values(inputs[0], 0)
    if data is None or axes not in ([0], [-1]):
        return None
    return dataclasses.replace(data, rank=1)


def _squeeze(node, inputs, attrs, nodes):
    axes = _static_operand(inputs, 1, attrs, "axes", [0])
    data = _values(inputs[0], 1)
    if data is None or len(data.values) != 1 or axes not in ([0], [-1]):
        return None
    return dataclasses.replace(data, rank=0)


def _reshape(node, inputs, attrs, nodes):
    data = inputs[0]
    target = inputs[1].static if len(inputs) > 1 and inputs[1] is not None else None
    if data is None or target is None:
        return None
    if target in ([-1], [len(data.values)]):
        return dataclasses.replace(data, rank=1)
    if target == [] and len(data.values) == 1:
        return dataclasses.replace(data, rank=0)
    return None


def _constant_of_shape(node, inputs, attrs, nodes):
    shape = _values(inputs[0], 1)
    fill = onnx.numpy_helper.to_array(attrs["value"]) if "value" in attrs \
        else np.zeros(1, "float32")
    if shape is None or shape.static is None or len(shape.static) != 1 \
            or fill.dtype.name not in _INT_DTYPES or shape.static[0] > _MAX_VALUES:
        return None
    return IntValue(1, (_int64(fill.reshape(-1)[0]),) * shape.static[0], fill.dtype.name)


def _equal(node, inputs, attrs, nodes):
    dims, one = _values(inputs[0], 1), _values(inputs[1])
    if dims is None or one is None or one.static not in ([1],):
        return None
    if dims.static is not None:
        return IntValue(1, tuple(_int64(v == 1) for v in dims.static), "bool")
    return IntValue(1, dims.values, "bool", "ones")


def _nonzero(node, inputs, attrs, nodes):
    mask = inputs[0]
    if mask is None or mask.rank != 1:
        return None
    if mask.kind == "ones":
        return IntValue(2, mask.values, "int64", "ones_axes")
    if mask.static is None:
        return None
    return IntValue(2, tuple(_int64(k) for k, v in enumerate(mask.static) if v), "int64")


def _elementwise(combine):
    def rule(node, inputs, attrs, nodes):
        if len(inputs) != 2 or any(_values(v) is None for v in inputs):
            return None
        a, b = inputs
        if len(a.values) != len(b.values) and 1 not in (len(a.values), len(b.values)):
            return None
        n = max(len(a.values), len(b.values))
        pick = lambda v, k: v.values[k if len(v.values) > 1 else 0]  # noqa: E731
        return IntValue(max(a.rank, b.rank), tuple(combine(pick(a, k), pick(b, k))
                                                   for k in range(n)), a.dtype)
    return rule


def _divide(a, b):
    if static_dim(b) == 0:
        raise ZeroDivisionError
    return tirx.truncdiv(a, b)


#: How the value of each followed op's output follows from its inputs' values.
FOLLOWED = {
    "Identity": _same, "Cast": _cast, "Shape": _shape, "Slice": _slice, "Gather": _gather,
    "Concat": _concat, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Reshape": _reshape,
    "ConstantOfShape": _constant_of_shape, "Equal": _equal, "NonZero": _nonzero,
    "Add": _elementwise(lambda a, b: a + b), "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b), "Div": _elementwise(_divide),
    "Max": _elementwise(tirx.max), "Min": _elementwise(tirx.min),
}
