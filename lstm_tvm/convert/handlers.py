"""tf2onnx handlers mapping TF's six LSTM block ops onto :data:`~lstm_tvm.onnx.domain.DOMAIN` nodes.

A :class:`Handlers` object gives ``tf2onnx`` one handler per registry op
(:meth:`Handlers.custom_op_handlers`). Each handler, on a TF node of op ``<Op>``:

- checks the node against :data:`lstm_tvm.registry.OPS`: input count, the float dtype of every
  ``T`` input (float32 or float16, all alike), ``seq_len_max`` int64, and every static rank and
  dim against the registry's ``T, B, I, H`` symbols (``w`` must be ``(I+H, 4H)``, ...);
- converts TF's attributes with :func:`lstm_tvm.onnx.domain.onnx_attrs` (bools as 0/1, TF's
  defaults filled in, so the PyOp route finds every attribute) and drops the rest (``T``);
- puts the node in the custom domain under the same op type, keeping TF's input and output
  order, and sets every output's dtype and shape (dims from the inputs, ``-1`` if unknown).

**TF's BlockLSTMV2 gradient.** TF 2.21 registers the gradient of ``BlockLSTM`` (gate layout
ICFO) for ``BlockLSTMV2`` (IFCO) too, so ``tf.GradientTape`` through ``BlockLSTMV2`` emits a
``BlockLSTMGrad`` node fed by a ``BlockLSTMV2``'s outputs, whose ``w_grad``, ``b_grad``,
``x_grad`` and ``h_prev_grad`` are wrong. A ``BlockLSTMGrad`` node whose activation inputs
(``i, cs, f, o, ci, co, h``) are outputs of a ``BlockLSTMV2`` node (through ``Identity`` nodes
too) becomes a ``BlockLSTMGradV2`` node, the gradient TF should have used (same inputs, outputs
and attributes), with a warning; :attr:`Handlers.gradient_fixes` lists them.

A node that fails a check is left unconverted and its error kept in :attr:`Handlers.errors`
(tf2onnx would only log it): :mod:`lstm_tvm.convert.api` raises them after the conversion.
"""

from __future__ import annotations

import dataclasses
import logging

from onnx import TensorProto, helper

from ..onnx.domain import DOMAIN, onnx_attrs
from ..registry import OPS, SIZES, OpSpec, TensorSpec, eval_dim

__all__ = ["ConversionError", "GradientFix", "Handlers"]

log = logging.getLogger("lstm_tvm.convert")

_FLOAT_TYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}

_FORWARD_OUTPUTS = OPS["BlockLSTMV2"].output_names


class ConversionError(ValueError):
    """A TF graph that lstm_tvm cannot convert; the message names the node and the input."""


@dataclasses.dataclass(frozen=True)
class GradientFix:
    """A ``BlockLSTMGrad`` node fed by ``BlockLSTMV2`` and converted as ``BlockLSTMGradV2``."""

    node: str
    forward: str


def _dtype_name(elem: int | None) -> str:
    if elem is None:
        return "unknown"
    return helper.tensor_dtype_to_np_dtype(elem).name


def _shape_text(shape) -> str:
    return "(" + ", ".join("?" if d < 0 else str(d) for d in shape) + ")"


class _Node:
    """One TF node being converted: its op spec and error messages naming it."""

    def __init__(self, ctx, node, op: OpSpec):
        self.ctx, self.node, self.op = ctx, node, op

    def fail(self, message: str):
        raise ConversionError(f"node {self.node.name!r} ({self.op.name}): {message}")

    def input_name(self, spec: TensorSpec) -> str:
        return self.node.input[self.op.input_names.index(spec.name)]

    def check_types(self) -> int:
        """The ONNX element type of the node's float inputs (checks all of them)."""
        if len(self.node.input) != len(self.op.inputs):
            self.fail(f"expected {len(self.op.inputs)} inputs ({', '.join(self.op.input_names)}), "
                      f"got {len(self.node.input)}")
        elem = None
        for spec in self.op.inputs:
            got = self.ctx.get_dtype(self.input_name(spec))
            if spec.dtype != "T":
                if got != TensorProto.INT64:
                    self.fail(f"input {spec.name!r} expected int64, got {_dtype_name(got)}")
                continue
            if got not in _FLOAT_TYPES:
                self.fail(f"input {spec.name!r} expected float32 or float16, got "
                          f"{_dtype_name(got)}")
            if elem is None:
                elem = got
            elif got != elem:
                self.fail(f"input {spec.name!r} is {_dtype_name(got)} but 'x' is "
                          f"{_dtype_name(elem)}; expected one float type")
        return elem

    def sizes(self) -> dict[str, int]:
        """``T, B, I, H`` read from the static input shapes (-1 where unknown), all checked."""
        sizes = {s: -1 for s in SIZES}
        seen: dict[str, str] = {}
        derived = []
        for spec in self.op.inputs:
            shape = self.ctx.get_shape(self.input_name(spec))
            if shape is None:
                continue
            if len(shape) != len(spec.shape):
                self.fail(f"input {spec.name!r} has rank {len(shape)} (shape "
                          f"{_shape_text(shape)}), expected rank {len(spec.shape)} "
                          f"({', '.join(spec.shape) or 'a scalar'})")
            for dim, value in zip(spec.shape, shape):
                if value is None or value < 0:
                    continue
                if dim not in sizes:
                    derived.append((spec, dim, value, shape))
                elif sizes[dim] < 0:
                    sizes[dim], seen[dim] = value, spec.name
                elif sizes[dim] != value:
                    self.fail(f"input {spec.name!r} has shape {_shape_text(shape)} "
                              f"({', '.join(spec.shape)}): {dim} = {value}, but input "
                              f"{seen[dim]!r} gives {dim} = {sizes[dim]}")
        for spec, dim, value, shape in sorted(derived, key=lambda d: d[1] != "4H"):
            want = _learn(dim, value, sizes)
            if want != value:
                known = ", ".join(f"{k} = {v}" for k, v in sizes.items() if v >= 0)
                self.fail(f"input {spec.name!r} has shape {_shape_text(shape)}, expected "
                          f"({', '.join(spec.shape)}) with {dim} = {want} ({known})"
                          if want >= 0 else
                          f"input {spec.name!r} has shape {_shape_text(shape)}, expected "
                          f"({', '.join(spec.shape)}): {dim} = {value} is not a multiple of 4")
        return sizes

    def set_outputs(self, elem: int, sizes: dict[str, int]) -> None:
        for spec, name in zip(self.op.outputs, self.node.output):
            shape = [_eval(d, sizes) for d in spec.shape]
            known = self.ctx.get_shape(name)
            if known is not None and len(known) == len(shape):
                shape = [s if s >= 0 else (k if k is not None and k >= 0 else -1)
                         for s, k in zip(shape, known)]
            self.ctx.set_dtype(name, elem)
            self.ctx.set_shape(name, shape)

    def convert_attrs(self) -> None:
        node = self.node
        present = {k: helper.get_attribute_value(node.attr[k]) for k in self.op.attr_names
                   if k in node.attr}
        try:
            values = onnx_attrs(self.op.name, present, fill_defaults=True)
        except (TypeError, ValueError) as err:
            self.fail(str(err))
        for k in list(node.attr):
            del node.attr[k]
        for k, v in values.items():
            node.set_attr(k, v)


def _eval(dim: str, sizes: dict[str, int]) -> int:
    """The registry's value of ``dim`` for ``sizes`` (-1 where a size it needs is unknown)."""
    if any(sizes[s] < 0 for s in sizes if s in dim):
        return -1
    return eval_dim(dim, sizes)


def _learn(dim: str, value: int, sizes: dict[str, int]) -> int:
    """What the derived ``dim`` (``4H`` or ``I+H``) must be given ``sizes``, learning ``H`` or
    ``I`` from ``value`` where unknown (``value`` itself then); -1: ``4H`` not a multiple of 4."""
    if dim == "4H" and sizes["H"] < 0:
        if value % 4:
            return -1
        sizes["H"] = value // 4
    elif dim == "I+H":
        for unknown, other in (("I", "H"), ("H", "I")):
            if sizes[unknown] < 0 <= sizes[other] <= value:
                sizes[unknown] = value - sizes[other]
    want = _eval(dim, sizes)
    return value if want < 0 else want


class Handlers:
    """tf2onnx custom-op handlers for the registry ops, with what they found.

    ``fix_v2_gradient`` (default True) converts a ``BlockLSTMGrad`` fed by ``BlockLSTMV2`` as
    ``BlockLSTMGradV2`` (see the module doc). After a conversion, :attr:`errors` holds the
    :class:`ConversionError` of every node that could not be converted, :attr:`converted` the
    converted nodes (name -> ONNX op type) and :attr:`gradient_fixes` the fixed nodes.
    """

    def __init__(self, *, fix_v2_gradient: bool = True):
        self.fix_v2_gradient = fix_v2_gradient
        self.errors: list[ConversionError] = []
        self.converted: dict[str, str] = {}
        self.gradient_fixes: list[GradientFix] = []

    def custom_op_handlers(self) -> dict:
        """``{tf_op: (handler, [])}`` for ``tf2onnx``'s ``custom_op_handlers`` argument."""
        return {name: (self._handler(name), []) for name in OPS}

    def _handler(self, op_name: str):
        def handler(ctx, node, name, args):
            try:
                self._convert(ctx, node, OPS[op_name])
            except ConversionError as err:
                self.errors.append(err)
            return node

        handler.__name__ = f"convert_{op_name}"
        return handler

    def _convert(self, ctx, node, op: OpSpec) -> None:
        n = _Node(ctx, node, op)
        elem = n.check_types()
        sizes = n.sizes()
        n.convert_attrs()
        onnx_op = op.name
        if op.name == "BlockLSTMGrad" and self.fix_v2_gradient:
            forward = self._v2_forward(n)
            if forward is not None:
                onnx_op = "BlockLSTMGradV2"
                self.gradient_fixes.append(GradientFix(node.name, forward))
                log.warning("node %r: BlockLSTMGrad reads the outputs of BlockLSTMV2 node %r "
                            "(TF 2.21 registers BlockLSTM's gradient, gate layout ICFO, for "
                            "BlockLSTMV2, IFCO): converted as BlockLSTMGradV2, the correct "
                            "gradient", node.name, forward)
        node.type = onnx_op
        node.domain = DOMAIN
        n.set_outputs(elem, sizes)
        self.converted[node.name] = onnx_op

    @staticmethod
    def _v2_forward(n: _Node) -> str | None:
        """The name of the BlockLSTMV2 node whose outputs feed ``n``'s activation inputs, or
        None when they come from elsewhere; mixed BlockLSTM/BlockLSTMV2 producers fail."""
        producers = {}
        for k, act in enumerate(_FORWARD_OUTPUTS):
            name = n.input_name(n.op.input(act))
            source = n.ctx.get_node_by_output(name)
            while source is not None and source.type == "Identity":
                name = source.input[0]
                source = n.ctx.get_node_by_output(name)
            if source is not None and source.type in ("BlockLSTM", "BlockLSTMV2") \
                    and list(source.output).index(name) == k:
                producers[act] = source
        kinds = {p.type for p in producers.values()}
        if "BlockLSTMV2" not in kinds:
            return None
        if kinds != {"BlockLSTMV2"} or len({p.name for p in producers.values()}) != 1 \
                or len(producers) != len(_FORWARD_OUTPUTS):
            found = {a: f"{p.name} ({p.type})" for a, p in producers.items()}
            n.fail(f"activation inputs {list(_FORWARD_OUTPUTS)} come partly from BlockLSTMV2 "
                   f"outputs ({found}); expected all from one BlockLSTMV2 node (converted as "
                   f"BlockLSTMGradV2) or none (fix_v2_gradient=False converts it unchanged)")
        return next(iter(producers.values())).name
