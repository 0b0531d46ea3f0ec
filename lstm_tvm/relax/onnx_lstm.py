"""The converter of ONNX's standard ``LSTM`` (opsets 7, 14, 22; forward inference) onto
lstm_tvm's ``BlockLSTM`` kernel.

ONNX's LSTM is TF's BlockLSTM with no forget bias and no cell clip, its weights re-laid out
(:mod:`.lstm_weights`): one kernel call per direction, run for all ``T`` steps. A reverse
direction runs on each row's steps reversed within its length; with ``sequence_lens``, ``Y``
is zero past each row's length and ``Y_h``/``Y_c`` are each row's state at its last step
(:mod:`.sequence_te`). ``layout = 1`` (batch-major) is transposed around the kernel.

Refused with an ``OpError`` naming the node, attribute and value: activations other than
Sigmoid/Tanh/Tanh, ``activation_alpha``/``activation_beta``, ``clip`` (ONNX clips the gate
pre-activations; the kernel can clip only the cell), ``input_forget = 1``, dtypes other than
float32/float16, and ``W``/``R`` without static shapes (``I`` and ``H`` are compiled in).
"""

from __future__ import annotations

import dataclasses

from tvm import relax
from tvm.error import OpAttributeInvalid, OpAttributeUnImplemented
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..registry import DTYPES, get_op
from ..validation import validate_attrs
from .context import NodeContext
from .lstm_weights import direction_weights, take_direction
from .sequence_te import last_step, ordered_steps, reverse_steps
from .shapes import dtype_of, known_dims, static_dim, tensor_dims

__all__ = ["KERNEL_ATTRS", "LSTM", "LSTMAttrs"]

#: The only activations the kernel computes (f, g, h of ONNX: gates, cell input, cell output).
DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")
#: BlockLSTM's attributes for ONNX semantics: no forget bias, no cell clip (off when <= 0).
KERNEL_ATTRS = {"forget_bias": 0.0, "cell_clip": -1.0}
_ATTRS_V7 = frozenset({"activation_alpha", "activation_beta", "activations", "clip",
                       "direction", "hidden_size", "input_forget"})
_ATTRS_V14 = _ATTRS_V7 | {"layout"}
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
_KERNEL_OUTPUTS = get_op("BlockLSTM").output_names


@dataclasses.dataclass(frozen=True)
class LSTMAttrs:
    """The attributes of an ONNX LSTM node that lstm_tvm supports, checked."""

    direction: str = "forward"
    layout: int = 0
    hidden_size: int | None = None

    @property
    def num_directions(self) -> int:
        return _DIRECTIONS[self.direction]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LSTM(OnnxOpConverter):
    """ONNX ``LSTM`` -> lstm_tvm's ``BlockLSTM`` kernel, one call per direction."""

    @classmethod
    def check_attrs(cls, attr: dict, label: str, version: int) -> LSTMAttrs:
        """The node's attributes, or an ``OpError`` naming the node, attribute and value for
        what the kernel cannot compute."""
        given = {k: v for k, v in attr.items() if k != "tvm_custom"}
        allowed = _ATTRS_V14 if version >= 14 else _ATTRS_V7
        unknown = sorted(set(given) - allowed)
        if unknown:
            raise OpAttributeInvalid(f"{label}: unknown attribute(s) {unknown} for LSTM opset "
                                     f"{version}; expected among {sorted(allowed)}")
        direction = _text(given.get("direction", "forward"))
        if direction not in _DIRECTIONS:
            raise OpAttributeInvalid(f"{label}: attribute 'direction' = {direction!r}; expected "
                                     f"one of {list(_DIRECTIONS)}")
        _check_activations(given, label, _DIRECTIONS[direction])
        if "clip" in given:
            raise OpAttributeUnImplemented(
                f"{label}: attribute 'clip' = {given['clip']!r} is not supported: ONNX clips "
                f"the gate pre-activations to [-clip, clip], lstm_tvm's kernels can only clip "
                f"the cell state (leave 'clip' out)")
        if given.get("input_forget", 0) != 0:
            raise OpAttributeUnImplemented(
                f"{label}: attribute 'input_forget' = {given['input_forget']!r} is not "
                f"supported: lstm_tvm's kernels have independent input and forget gates "
                f"(use input_forget = 0)")
        layout = given.get("layout", 0)
        if layout not in (0, 1):
            raise OpAttributeInvalid(f"{label}: attribute 'layout' = {layout!r}; expected 0 "
                                     f"(time-major) or 1 (batch-major)")
        hidden = given.get("hidden_size")
        if hidden is not None and (not isinstance(hidden, int) or hidden < 1):
            raise OpAttributeInvalid(f"{label}: attribute 'hidden_size' = {hidden!r}; "
                                     f"expected an int >= 1")
        return LSTMAttrs(direction, layout, hidden)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, ctx: NodeContext):
        return _convert(bb, inputs, cls.check_attrs(attr, ctx.label, 7), ctx)

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, ctx: NodeContext):
        return _convert(bb, inputs, cls.check_attrs(attr, ctx.label, 14), ctx)


def _check_activations(given: dict, label: str, directions: int) -> None:
    default = list(DEFAULT_ACTIVATIONS) * directions
    if "activations" in given:
        value = given["activations"]
        names = [_text(v) for v in (value if isinstance(value, (tuple, list)) else [value])]
        if [n.lower() for n in names] != [n.lower() for n in default]:
            raise OpAttributeUnImplemented(
                f"{label}: attribute 'activations' = {names} is not supported: lstm_tvm's "
                f"kernels compute only {default} (leave 'activations' out)")
    for name in ("activation_alpha", "activation_beta"):
        if name in given:
            value = given[name]
            shown = list(value) if isinstance(value, tuple) else value
            raise OpAttributeUnImplemented(
                f"{label}: attribute {name!r} = {shown}"
                f" is not supported: lstm_tvm's kernels compute {default} without parameters "
                f"(leave {name!r} out)")


def _static_shape(expr, label: str, name: str, symbols: tuple[str, ...]) -> list[int]:
    dims = known_dims(expr, label, f"input {name!r}", len(symbols))
    static = [static_dim(d) for d in dims] if dims is not None else [None] * len(symbols)
    if None in static:
        got = "unknown" if dims is None else \
            f"({', '.join(str(d) if s is None else str(s) for d, s in zip(dims, static))})"
        raise ValueError(f"{label}: input {name!r} must have a static shape "
                         f"({', '.join(symbols)}) since lstm_tvm compiles I and H into its "
                         f"kernel; got {got}")
    return static


def _expect(label: str, name: str, k: int, symbol: str, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{label}: input {name!r} dim {k} ({symbol}) expected {want}, got {got}")


def _convert(bb: relax.BlockBuilder, inputs, attrs: LSTMAttrs, ctx: NodeContext):
    label, op = ctx.label, relax.op
    given = dict(zip(_INPUTS, (inputs[k] for k in range(len(_INPUTS)))))
    dtype, I, H = _checked_inputs(given, attrs, label)
    names = ("B", "T", "I") if attrs.layout else ("T", "B", "I")
    x, dims = tensor_dims(bb, given["X"], label, "input 'X'", names, [None, None, I])
    steps, batch = (dims[1], dims[0]) if attrs.layout else (dims[0], dims[1])
    if attrs.layout:
        x = bb.emit(op.permute_dims(x, [1, 0, 2]))
    kernel_attrs = validate_attrs(get_op("BlockLSTM"),
                                  {**KERNEL_ATTRS, "use_peephole": given["P"] is not None})
    sizes = {"T": steps, "B": batch, "I": I, "H": H}
    results = []
    for d in range(attrs.num_directions):
        weights = direction_weights(bb, d, H, dtype, given["W"], given["R"], given["B"],
                                    given["P"])
        states = [_initial_state(bb, given[name], d, attrs.layout, batch, H, dtype, label, name)
                  for name in ("initial_c", "initial_h")]
        reverse = attrs.direction == "reverse" or d == 1
        lengths = given["sequence_lens"]
        x_d = bb.emit_te(reverse_steps, x, lengths) if reverse else x
        out = ctx.kernels.call(
            bb, "BlockLSTM", dtype, sizes, kernel_attrs,
            [x_d, *states, *(weights[k] for k in ("w", "wci", "wcf", "wco", "b"))],
            seq_len_max=steps)
        h, cs = (bb.emit(relax.TupleGetItem(out, _KERNEL_OUTPUTS.index(n))) for n in ("h", "cs"))
        y = h if lengths is None and not reverse else \
            bb.emit_te(ordered_steps, h, lengths, reverse)
        results.append((y, bb.emit_te(last_step, h, lengths), bb.emit_te(last_step, cs, lengths)))
    ys, hs, cs = (list(r) for r in zip(*results))
    y = bb.emit(op.stack(ys, axis=1) if len(ys) > 1 else op.expand_dims(ys[0], 1))
    y_h, y_c = (bb.emit(op.stack(s, axis=0) if len(s) > 1 else op.expand_dims(s[0], 0))
                for s in (hs, cs))
    if attrs.layout:
        y = bb.emit(op.permute_dims(y, [2, 0, 1, 3]))
        y_h, y_c = (bb.emit(op.permute_dims(s, [1, 0, 2])) for s in (y_h, y_c))
    return relax.Tuple([y, y_h, y_c])


def _checked_inputs(given: dict, attrs: LSTMAttrs, label: str) -> tuple[str, int, int]:
    """``(dtype, I, H)`` after checking the inputs' dtypes and the weights' static shapes."""
    for name in ("X", "W", "R"):
        if given[name] is None:
            raise ValueError(f"{label}: input {name!r} is required")
    dtype = dtype_of(given["X"], label, "input 'X'")
    if dtype not in DTYPES:
        raise TypeError(f"{label}: input 'X' has dtype {dtype}; lstm_tvm's kernels take one of "
                        f"{list(DTYPES)}")
    for name in ("W", "R", "B", "initial_h", "initial_c", "P"):
        if given[name] is not None and dtype_of(given[name], label, name) != dtype:
            raise TypeError(f"{label}: input {name!r} expected {dtype} (the dtype of 'X'), got "
                            f"{dtype_of(given[name], label, name)}")
    lengths = given["sequence_lens"]
    if lengths is not None:
        if dtype_of(lengths, label, "input 'sequence_lens'") not in ("int32", "int64"):
            raise TypeError(f"{label}: input 'sequence_lens' expected int32, got "
                            f"{dtype_of(lengths, label, 'sequence_lens')}")
        known_dims(lengths, label, "input 'sequence_lens'", 1)
    D = attrs.num_directions
    num_dir, gates, I = _static_shape(given["W"], label, "W", ("num_directions", "4H", "I"))
    r_dirs, r_gates, H = _static_shape(given["R"], label, "R", ("num_directions", "4H", "H"))
    for name, dirs, rows in (("W", num_dir, gates), ("R", r_dirs, r_gates)):
        _expect(label, name, 0, "num_directions", dirs, D)
        _expect(label, name, 1, "4H", rows, 4 * H)
    if attrs.hidden_size is not None and attrs.hidden_size != H:
        raise ValueError(f"{label}: attribute 'hidden_size' = {attrs.hidden_size} but input 'R' "
                         f"has hidden size {H}")
    for name, symbols in (("B", ("num_directions", "8H")), ("P", ("num_directions", "3H"))):
        if given[name] is not None:
            got = _static_shape(given[name], label, name, symbols)
            _expect(label, name, 0, symbols[0], got[0], D)
            _expect(label, name, 1, symbols[1], got[1], int(symbols[1][0]) * H)
    return dtype, I, H


def _initial_state(bb, state, d: int, layout: int, batch, hidden: int, dtype: str, label: str,
                   name: str):
    """Direction ``d``'s ``(B, H)`` slice of ``initial_h``/``initial_c``, zeros if absent."""
    if state is None:
        return bb.emit(relax.op.zeros(relax.ShapeExpr([batch, hidden]), dtype))
    symbols = ("B", "num_directions", "H") if layout else ("num_directions", "B", "H")
    dims = known_dims(state, label, f"input {name!r}", 3)
    if dims is not None and static_dim(dims[2]) not in (None, hidden):
        _expect(label, name, 2, symbols[2], static_dim(dims[2]), hidden)
    return take_direction(bb, state, d, axis=layout)
