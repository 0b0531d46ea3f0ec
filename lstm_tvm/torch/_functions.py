"""The Python functions of :mod:`lstm_tvm.torch`: ``lstm_tvm.torch.<Op>(**tf_kwargs)``, the
custom op with TF's keyword arguments, its outputs as a named tuple."""

from __future__ import annotations

import torch

from ..api import output_tuple
from ..registry import get_op
from ..validation import validate_attrs
from ._eager import call
from ._ops import INT_OVERLOAD, NAMESPACE

__all__ = ["make_function"]


def make_function(op_name: str):
    """``lstm_tvm.torch.<op_name>``: ``torch.ops.lstm_tvm.<op_name>`` called with TF's keyword
    arguments (the overload chosen by ``seq_len_max``'s type), a named tuple of its outputs."""
    op = get_op(op_name)
    result = output_tuple(op.name)
    known = set(op.input_names) | set(op.attr_names)
    ints = [t.name for t in op.inputs if t.dtype != "T"]

    def fn(**kwargs):
        unknown = sorted(set(kwargs) - known)
        missing = [n for n in op.input_names if n not in kwargs]
        if unknown or missing:
            what = f"unexpected argument(s) {unknown}" if unknown else \
                f"missing input(s) {missing}"
            raise TypeError(f"{op.name}: {what}; expected inputs {list(op.input_names)} and "
                            f"attributes {list(op.attr_names)}")
        overload = "default"
        for name in ints:
            value = kwargs[name]
            if not isinstance(value, torch.Tensor):
                if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
                    raise TypeError(f"{op.name}: input {name!r} expected an int or an int64 "
                                    f"tensor, got {type(value).__name__} {value!r}")
                overload = INT_OVERLOAD
        attrs = {k: v for k, v in kwargs.items() if k in op.attr_names}
        if not torch.compiler.is_compiling():  # PyTorch would convert a bool to a float
            attrs = validate_attrs(op, attrs)
        return result(*call(op.name, overload, tuple(kwargs[n] for n in op.input_names), attrs))

    fn.__signature__ = op.signature()
    fn.__name__ = fn.__qualname__ = op.name
    gradient = (f"Gradients reach every float input through {op.pair}; the gate outputs are "
                f"not differentiable." if op.direction == "forward"
                else "It has no gradient of its own.")
    fn.__doc__ = (f"{op.doc}\n\n``torch.ops.{NAMESPACE}.{op.name}`` with TF's keyword arguments"
                  f" (``tf.raw_ops.{op.name}``).\n\n"
                  f"{op.summary(' (tensors, a named tuple)')}{gradient}\n")
    return fn
