"""The op registry: the single source of truth for the six TensorFlow LSTM block ops and
lstm_tvm's one helper kernel.

Everything that needs to know an op's name, its inputs and outputs (TF's order), their
shapes, its attributes with TF's defaults, or its gate layout reads it from here: validation,
kernels, references, the ``raw_ops`` API, the CLI and the docs. :data:`OPS` holds the TF ops
(what ``tf.raw_ops``, ONNX, tf2onnx and Relax know); :data:`HELPERS` the kernels TF computes
in Python (``CellGradMatmul``); :data:`KERNEL_OPS` both, what lstm_tvm compiles.

Shapes are written in the symbols ``T`` (time), ``B`` (batch), ``I`` (input size) and
``H`` (cell size); ``4H`` and ``I+H`` are derived dims. The element dtype of every float
tensor is the op's ``T`` attribute (float16 or float32); ``seq_len_max`` is an int64 scalar.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Mapping

#: Element dtypes the ops accept (TF's ``T`` attribute).
DTYPES = ("float32", "float16")

#: Gate layouts: the order of the four H-wide blocks in the 4H columns of ``w``, ``b``, ``dicfo``.
#: ``i`` input gate, ``c`` cell input (``ci``), ``f`` forget gate, ``o`` output gate.
GATE_LAYOUTS = {"ICFO": ("i", "c", "f", "o"), "IFCO": ("i", "f", "c", "o")}

#: The size symbols: every other dim is an expression of them (see :func:`eval_dim`).
SIZES = ("T", "B", "I", "H")

#: Dimension expressions allowed in shapes, and how to evaluate them from the size symbols.
_DIM_EVAL = {
    "T": lambda s: s["T"],
    "B": lambda s: s["B"],
    "I": lambda s: s["I"],
    "H": lambda s: s["H"],
    "4H": lambda s: 4 * s["H"],
    "I+H": lambda s: s["I"] + s["H"],
}


def eval_dim(dim: str, sizes: Mapping[str, int]) -> int:
    """Evaluate a dimension expression (``"T"``, ``"4H"``, ``"I+H"``, ...) for concrete sizes."""
    return _DIM_EVAL[dim](sizes)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of an op: its TF name, shape in dim symbols, and element dtype.

    ``dtype`` is ``"T"`` for the op's float type or a concrete dtype (``"int64"``).
    """

    name: str
    shape: tuple[str, ...]
    dtype: str = "T"
    doc: str = ""

    def concrete_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape for concrete ``sizes`` (a mapping with keys among ``T, B, I, H``)."""
        return tuple(eval_dim(d, sizes) for d in self.shape)


@dataclasses.dataclass(frozen=True)
class AttrSpec:
    """An op attribute: name, Python type, TF default (``None`` = required)."""

    name: str
    type: type
    default: float | bool | None = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is None


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Everything lstm_tvm knows about one TF op.

    ``kind`` is ``"cell"`` (one step) or ``"sequence"`` (a time loop); ``direction`` is
    ``"forward"`` or ``"backward"``; ``pair`` names the op's forward (for a grad op) or
    grad (for a forward op) partner. ``tf_op`` is False for a helper of lstm_tvm's own, a
    kernel of what TF computes in Python around its ops.
    """

    name: str
    kind: str
    direction: str
    gate_layout: str
    pair: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[AttrSpec, ...]
    doc: str = ""
    tf_op: bool = True

    @functools.cached_property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @functools.cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @functools.cached_property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    def signature(self, inputs=inspect.Parameter.KEYWORD_ONLY,
                  extra: tuple[inspect.Parameter, ...] = ()) -> inspect.Signature:
        """The Python signature of a function taking this op's inputs (of parameter kind
        ``inputs``), then its attributes as keyword arguments with their defaults (TF's
        ``tf.raw_ops.<Op>`` form), then ``extra``."""
        params = [inspect.Parameter(n, inputs) for n in self.input_names]
        params += [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY,
                                     default=inspect.Parameter.empty if a.required else a.default)
                   for a in self.attrs]
        return inspect.Signature([*params, *extra])

    def summary(self, outputs: str = "") -> str:
        """Lines naming the op's inputs, outputs (followed by ``outputs``, e.g. what they
        are) and attributes with their defaults, for the docstrings of its functions."""
        return (f"Inputs: {', '.join(self.input_names)}.\n"
                f"Outputs: {', '.join(self.output_names)}{outputs}.\n"
                f"Attributes: {', '.join(f'{a.name}={a.default!r}' for a in self.attrs)}.\n")

    @property
    def gates(self) -> tuple[str, str, str, str]:
        """The gate order of this op's 4H columns, e.g. ``("i", "c", "f", "o")``."""
        return GATE_LAYOUTS[self.gate_layout]

    def gate_index(self, gate: str) -> int:
        """Position (0..3) of ``gate`` (one of ``i, c, f, o``) in the 4H columns."""
        return self.gates.index(gate)

    def input(self, name: str) -> TensorSpec:
        return _lookup(self.inputs, name, f"{self.name} input")

    def output(self, name: str) -> TensorSpec:
        return _lookup(self.outputs, name, f"{self.name} output")

    def attr(self, name: str) -> AttrSpec:
        return _lookup(self.attrs, name, f"{self.name} attribute")

    @property
    def size_sources(self) -> dict[str, tuple[str, int]]:
        """Where each size symbol (``T``, ``B``, ``I``, ``H``) of the op is read: ``(input name,
        axis)`` of the first input whose shape has it (``x`` gives ``T``, ``B``, ``I``;
        ``cs_prev`` gives ``H``); every other dim is checked against them."""
        sources: dict[str, tuple[str, int]] = {}
        for spec in self.inputs:
            for axis, sym in enumerate(spec.shape):
                if sym in SIZES:
                    sources.setdefault(sym, (spec.name, axis))
        return sources

    def defaults(self) -> dict[str, float | bool]:
        """TF's default for every optional attribute."""
        return {a.name: a.default for a in self.attrs if not a.required}


def _lookup(items, name, what):
    for item in items:
        if item.name == name:
            return item
    raise KeyError(f"unknown {what} {name!r}; expected one of {[i.name for i in items]}")


# --- building blocks shared by several ops -------------------------------------------------

def _cell_params(x_shape):
    return (
        TensorSpec("x", x_shape, doc="the input"),
        TensorSpec("cs_prev", ("B", "H"), doc="the cell state of the previous step"),
        TensorSpec("h_prev", ("B", "H"), doc="the output of the previous step"),
        TensorSpec("w", ("I+H", "4H"), doc="the weight matrix"),
        TensorSpec("wci", ("H",), doc="the input-gate peephole weights"),
        TensorSpec("wcf", ("H",), doc="the forget-gate peephole weights"),
        TensorSpec("wco", ("H",), doc="the output-gate peephole weights"),
        TensorSpec("b", ("4H",), doc="the bias vector"),
    )


_ACT_DOCS = {
    "i": "the input gate",
    "cs": "the cell state before the tanh",
    "f": "the forget gate",
    "o": "the output gate",
    "ci": "the cell input",
    "co": "the cell after the tanh",
    "h": "the output h vector",
}

_SEQ_LEN = TensorSpec("seq_len_max", (), dtype="int64", doc="the number of steps to run (0..T)")


def _activations(names, shape):
    return tuple(TensorSpec(n, shape, doc=_ACT_DOCS[n]) for n in names)


def _forward_attrs(forget_bias, cell_clip):
    attrs = []
    if forget_bias is not None:
        attrs.append(AttrSpec("forget_bias", float, forget_bias, "the forget gate bias"))
    attrs.append(AttrSpec("cell_clip", float, cell_clip, "clip the cell to [-cell_clip, cell_clip] if > 0"))
    attrs.append(AttrSpec("use_peephole", bool, False, "whether to use peephole weights"))
    return tuple(attrs)


_GRAD_ATTRS = (AttrSpec("use_peephole", bool, None, "whether to use peephole weights"),)
_FWD_OUTS = ("i", "cs", "f", "o", "ci", "co", "h")
_PEEPHOLE_GRADS = tuple(
    TensorSpec(f"{p}_grad", ("H",), doc=f"the gradient of {p}") for p in ("wci", "wcf", "wco")
)


def _sequence_forward(name, layout, pair, forget_bias, cell_clip):
    return OpSpec(
        name=name, kind="sequence", direction="forward", gate_layout=layout, pair=pair,
        inputs=(_SEQ_LEN,) + _cell_params(("T", "B", "I")),
        outputs=_activations(_FWD_OUTS, ("T", "B", "H")),
        attrs=_forward_attrs(forget_bias, cell_clip),
        doc=f"LSTM over a whole sequence, gate layout {layout}.",
    )


def _sequence_backward(name, layout, pair):
    return OpSpec(
        name=name, kind="sequence", direction="backward", gate_layout=layout, pair=pair,
        inputs=(_SEQ_LEN,) + _cell_params(("T", "B", "I"))
        + _activations(_FWD_OUTS, ("T", "B", "H"))
        + (TensorSpec("cs_grad", ("T", "B", "H"), doc="the gradient of cs"),
           TensorSpec("h_grad", ("T", "B", "H"), doc="the gradient of h")),
        outputs=(
            TensorSpec("x_grad", ("T", "B", "I"), doc="the gradient of x"),
            TensorSpec("cs_prev_grad", ("B", "H"), doc="the gradient of cs_prev"),
            TensorSpec("h_prev_grad", ("B", "H"), doc="the gradient of h_prev"),
            TensorSpec("w_grad", ("I+H", "4H"), doc="the gradient of w"),
        ) + _PEEPHOLE_GRADS + (TensorSpec("b_grad", ("4H",), doc="the gradient of b"),),
        attrs=_GRAD_ATTRS,
        doc=f"Gradient of the sequence LSTM, gate layout {layout}.",
    )


_OP_LIST = (
    OpSpec(
        name="LSTMBlockCell", kind="cell", direction="forward", gate_layout="ICFO",
        pair="LSTMBlockCellGrad",
        inputs=_cell_params(("B", "I")),
        outputs=_activations(_FWD_OUTS, ("B", "H")),
        attrs=_forward_attrs(1.0, 3.0),
        doc="One LSTM step, gate layout ICFO.",
    ),
    OpSpec(
        name="LSTMBlockCellGrad", kind="cell", direction="backward", gate_layout="ICFO",
        pair="LSTMBlockCell",
        inputs=_cell_params(("B", "I"))
        + _activations(("i", "cs", "f", "o", "ci", "co"), ("B", "H"))
        + (TensorSpec("cs_grad", ("B", "H"), doc="the gradient of cs"),
           TensorSpec("h_grad", ("B", "H"), doc="the gradient of h")),
        outputs=(
            TensorSpec("cs_prev_grad", ("B", "H"), doc="the gradient of cs_prev"),
            TensorSpec("dicfo", ("B", "4H"), doc="the gradient of the gate pre-activations"),
        ) + _PEEPHOLE_GRADS,
        attrs=_GRAD_ATTRS,
        doc="Gradient of one LSTM step (without the matmul part), gate layout ICFO.",
    ),
    _sequence_forward("BlockLSTM", "ICFO", "BlockLSTMGrad", forget_bias=1.0, cell_clip=3.0),
    _sequence_backward("BlockLSTMGrad", "ICFO", "BlockLSTM"),
    _sequence_forward("BlockLSTMV2", "IFCO", "BlockLSTMGradV2", forget_bias=None, cell_clip=0.0),
    _sequence_backward("BlockLSTMGradV2", "IFCO", "BlockLSTMV2"),
)

#: All TF ops by name, in a stable order.
OPS: dict[str, OpSpec] = {op.name: op for op in _OP_LIST}

#: Name of the cell gradient's matmul helper.
CELL_GRAD_MATMUL = "CellGradMatmul"

#: lstm_tvm's helper kernels by name: what TF's Python gradient computes around its ops.
HELPERS: dict[str, OpSpec] = {CELL_GRAD_MATMUL: OpSpec(
    name=CELL_GRAD_MATMUL, kind="cell", direction="backward", gate_layout="ICFO",
    pair="LSTMBlockCell", tf_op=False,
    inputs=(TensorSpec("x", ("B", "I"), doc="the input"),
            TensorSpec("h_prev", ("B", "H"), doc="the output of the previous step"),
            TensorSpec("w", ("I+H", "4H"), doc="the weight matrix"),
            TensorSpec("dicfo", ("B", "4H"), doc="LSTMBlockCellGrad's gate gradient (any "
                       "layout: it only has to match w's)")),
    outputs=(TensorSpec("x_grad", ("B", "I"), doc="dicfo @ w^T, its first I columns"),
             TensorSpec("h_prev_grad", ("B", "H"), doc="dicfo @ w^T, its last H columns"),
             TensorSpec("w_grad", ("I+H", "4H"), doc="[x, h_prev]^T @ dicfo"),
             TensorSpec("b_grad", ("4H",), doc="dicfo summed over the batch")),
    attrs=(),
    doc="The matmul part of LSTMBlockCell's gradient (TF's Python gradient computes it "
        "around LSTMBlockCellGrad).",
)}

#: Every op lstm_tvm compiles: the TF ops, then the helpers.
KERNEL_OPS: dict[str, OpSpec] = {**OPS, **HELPERS}


def get_op(name: str) -> OpSpec:
    """The :class:`OpSpec` named ``name`` (a TF op or a helper); raises ``KeyError`` listing
    the known ops."""
    try:
        return KERNEL_OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; expected one of {list(KERNEL_OPS)}") from None


def forget_bias_of(op: OpSpec, attrs: Mapping[str, object]) -> float:
    """The forget bias a forward op applies: its attribute, or 0 for ops without one (V2)."""
    return float(attrs.get("forget_bias", 0.0)) if "forget_bias" in op.attr_names else 0.0
