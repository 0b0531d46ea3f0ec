"""Converters of lstm_tvm's custom-domain nodes (``org.lstm_tvm``, the six TF ops).

Each node becomes one ``call_tir`` of the op's kernel, its inputs and outputs in TF's order
(:mod:`lstm_tvm.registry`). ``I`` and ``H`` must be static (they are compiled into the kernel);
``T`` and ``B`` may be symbolic. Attributes are the ONNX forms of TF's (:mod:`lstm_tvm.onnx.domain`:
floats, bools as 0/1 ints), TF's defaults filling the omitted ones.
"""

from __future__ import annotations

from tvm import tirx
from tvm.error import OpAttributeInvalid, OpAttributeRequired
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..registry import DTYPES, OPS, OpSpec, eval_dim, get_op
from ..onnx.contract import node_attrs
from .context import NodeContext
from .kernel_calls import seq_len_value
from .shapes import dtype_of, known_dims, static_dim, tensor_dims

__all__ = ["CUSTOM_CONVERTERS", "TFBlockOpConverter"]


class TFBlockOpConverter(OnnxOpConverter):
    """Base of the six converters: subclasses set :attr:`op_name` (a registry op)."""

    op_name: str = ""

    @classmethod
    def check_attrs(cls, attr: dict, label: str, version: int = 1) -> dict:
        """The node's attributes as TF's (every one, defaults filled), or an ``OpError``
        naming the node, attribute and value (:func:`lstm_tvm.onnx.contract.node_attrs`)."""
        op = get_op(cls.op_name)
        given = {k: v for k, v in attr.items() if k != "tvm_custom"}
        missing = [spec.name for spec in op.attrs if spec.required and spec.name not in given]
        if missing:
            raise OpAttributeRequired(f"{label}: attribute {missing[0]!r} is required")
        try:
            return node_attrs(op, given, label)
        except (TypeError, ValueError) as err:
            raise OpAttributeInvalid(str(err)) from None

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, ctx: NodeContext):
        op = get_op(cls.op_name)
        attrs = cls.check_attrs(attr, ctx.label)
        names = op.input_names
        if len(inputs) != len(names) or any(inputs[k] is None for k in range(len(names))):
            missing = [n for k, n in enumerate(names) if k >= len(inputs) or inputs[k] is None]
            raise ValueError(f"{ctx.label}: every input is required ({', '.join(names)}); "
                             f"missing {missing}, got {len(inputs)} inputs")
        tensors = dict(zip(names, inputs))
        dtype = _float_dtype(op, tensors, ctx.label)
        sizes = _static_sizes(op, tensors, ctx.label)
        x_names = ("T", "B", "I") if op.kind == "sequence" else ("B", "I")
        x, dims = tensor_dims(bb, tensors["x"], ctx.label, "input 'x'", x_names,
                              [None] * (len(x_names) - 1) + [sizes["I"]])
        tensors["x"] = x
        sizes.update(zip(x_names[:-1], dims[:-1]))
        seq = None
        if op.kind == "sequence":
            seq = seq_len_value(bb, tensors["seq_len_max"], ctx.label)
            steps = static_dim(sizes["T"])
            if steps is not None and isinstance(seq, tirx.IntImm) and int(seq) > steps:
                raise ValueError(f"{ctx.label}: input 'seq_len_max' expected <= T = {steps}, "
                                 f"got {int(seq)}")
        floats = [tensors[t.name] for t in op.inputs if t.dtype == "T"]
        return ctx.kernels.call(bb, op.name, dtype, sizes, attrs, floats, seq_len_max=seq)


def _float_dtype(op: OpSpec, tensors: dict, label: str) -> str:
    """The one float dtype of the op's float inputs (one of :data:`DTYPES`)."""
    dtypes = {t.name: dtype_of(tensors[t.name], label, f"input {t.name!r}")
              for t in op.inputs if t.dtype == "T"}
    dtype = dtypes["x"]
    if dtype not in DTYPES:
        raise TypeError(f"{label}: input 'x' expected one of {list(DTYPES)}, got {dtype}")
    for name, got in dtypes.items():
        if got != dtype:
            raise TypeError(f"{label}: input {name!r} expected {dtype} (the dtype of 'x'), "
                            f"got {got}")
    return dtype


def _static_sizes(op: OpSpec, tensors: dict, label: str) -> dict:
    """``I`` and ``H`` from the inputs' static dims, checked against every static dim."""
    found: dict[str, tuple[int, str]] = {}
    shapes = {}
    for spec in op.inputs:
        if spec.dtype != "T":
            continue
        what = f"input {spec.name!r}"
        dims = known_dims(tensors[spec.name], label, what, len(spec.shape))
        shapes[spec.name] = dims
        for sym, dim in zip(spec.shape, dims or ()):
            if static_dim(dim) is not None and sym not in ("T", "B"):
                found.setdefault(sym, (static_dim(dim), spec.name))
    sizes = {}
    if "H" in found or "4H" in found:
        sizes["H"] = found["H"][0] if "H" in found else found["4H"][0] // 4
    if "I" in found or ("I+H" in found and "H" in sizes):
        sizes["I"] = found["I"][0] if "I" in found else found["I+H"][0] - sizes["H"]
    for sym in ("I", "H"):
        source = op.size_sources[sym][0]
        if sizes.get(sym, 0) < 1:
            raise ValueError(f"{label}: the {'input' if sym == 'I' else 'cell'} size {sym} must "
                             f"be static (it is compiled into the kernel): give input "
                             f"{source!r} (or 'w') a static shape")
    for spec in op.inputs:
        for k, (sym, dim) in enumerate(zip(spec.shape, shapes.get(spec.name) or ())):
            got = static_dim(dim)
            if sym in ("T", "B") or got is None:
                continue
            if got != eval_dim(sym, sizes):
                raise ValueError(
                    f"{label}: input {spec.name!r} dim {k} ({sym}) expected "
                    f"{eval_dim(sym, sizes)} (I={sizes['I']}, H={sizes['H']}), got {got}")
    return sizes


def _converter_class(op_name: str) -> type:
    doc = f"``{op_name}`` of domain ``org.lstm_tvm`` -> ``call_tir`` of lstm_tvm's kernel."
    return type(op_name, (TFBlockOpConverter,), {"op_name": op_name, "__doc__": doc})


#: One converter class per registry op, by op type.
CUSTOM_CONVERTERS: dict[str, type] = {name: _converter_class(name) for name in OPS}
