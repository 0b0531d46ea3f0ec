"""The TensorFlow functions of :mod:`lstm_tvm.tf`: each op's call, its static shapes and checks,
and the gradients of the forward ops."""

from __future__ import annotations

import inspect

import numpy as np
import tensorflow as tf

from .. import raw_ops
from ..api import output_tuple
from ..autodiff import grad_route
from ..registry import OpSpec, eval_dim, get_op
from ..validation import validate_attrs, validate_inputs

__all__ = ["make_op"]


def make_op(op_name: str):
    """The function ``lstm_tvm.tf.<op_name>``: TF's keyword arguments, TF tensors out."""
    op = get_op(op_name)
    outputs = output_tuple(op.name)
    known = set(op.input_names) | set(op.attr_names)

    def fn(**kwargs):
        name = kwargs.pop("name", None)
        target = kwargs.pop("target", "llvm")
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"{op.name}: unexpected argument(s) {unknown}; expected inputs "
                            f"{list(op.input_names)} and attributes {list(op.attr_names)}")
        missing = [n for n in op.input_names if n not in kwargs]
        if missing:
            raise TypeError(f"{op.name}: missing input(s) {missing}; expected "
                            f"{list(op.input_names)}")
        attrs = validate_attrs(op, {k: v for k, v in kwargs.items() if k in op.attr_names})
        with tf.name_scope(name or op.name):
            tensors = [_tensor(op, n, kwargs[n]) for n in op.input_names]
            _check_static(op, tensors)
            if op.direction == "forward":
                result = _differentiable(op, attrs, target)(*tensors)
            else:
                result = _call(op, attrs, target, tensors)
        return outputs(*result)

    fn.__signature__ = op.signature(extra=(
        inspect.Parameter("target", inspect.Parameter.KEYWORD_ONLY, default="llvm"),
        inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None)))
    fn.__name__ = fn.__qualname__ = op.name
    gradient = (f"Gradients flow to every float input through {op.pair} (see the module doc)."
                if op.direction == "forward" else "It has no gradient of its own.")
    fn.__doc__ = (f"{op.doc}\n\n{op.summary(' (TF tensors, a named tuple)')}{gradient}\n")
    return fn


def _tensor(op: OpSpec, name: str, value) -> tf.Tensor:
    """Input ``name`` as a tensor: ``seq_len_max`` as int64, floats as they are (a variable is
    read, so that the tape sees it)."""
    try:
        if op.input(name).dtype == "int64":
            return tf.cast(tf.convert_to_tensor(value), tf.int64) \
                if isinstance(value, (tf.Tensor, tf.Variable)) else tf.constant(value, tf.int64)
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{op.name}: input {name!r} expected a tensor, got "
                        f"{type(value).__name__}: {err}") from None


class _Static:
    """The static shape and dtype of a tensor, for :func:`validate_inputs`."""

    def __init__(self, tensor: tf.Tensor):
        self.shape = tuple(tensor.shape.as_list())
        self.dtype = np.dtype(tensor.dtype.as_numpy_dtype)


def _check_static(op: OpSpec, tensors: list) -> None:
    """Check the call as :mod:`lstm_tvm.raw_ops` does when every float input's shape is static
    (``seq_len_max`` too, where its value is known); the kernels check the rest."""
    floats = {t.name: tensors[i] for i, t in enumerate(op.inputs) if t.dtype == "T"}
    if not all(t.shape.is_fully_defined() for t in floats.values()):
        return
    inputs = {name: _Static(t) for name, t in floats.items()}
    for i, spec in enumerate(op.inputs):
        if spec.dtype != "T":
            value = tf.get_static_value(tensors[i])
            inputs[spec.name] = 0 if value is None else value
    validate_inputs(op, inputs)


def _output_shapes(op: OpSpec, tensors: list) -> list[tf.TensorShape]:
    """Each output's shape, its dims known where the inputs they come from are."""
    sizes = {}
    for sym, (name, axis) in op.size_sources.items():
        shape = tensors[op.input_names.index(name)].shape
        if shape.rank is not None and shape[axis] is not None:
            sizes[sym] = shape[axis]
    shapes = []
    for spec in op.outputs:
        dims = []
        for dim in spec.shape:
            try:
                dims.append(eval_dim(dim, sizes))
            except KeyError:  # a size the inputs leave unknown
                dims.append(None)
        shapes.append(tf.TensorShape(dims))
    return shapes


def _call(op: OpSpec, attrs: dict, target, tensors: list) -> list:
    """``op`` on the kernels, in a ``tf.numpy_function``; outputs with their static shapes.

    ``numpy_function`` hands the kernels NumPy views of TF's buffers and takes their outputs
    (aligned arrays over the kernels' buffers) as they are, without copies either way; it
    costs less a call than ``py_function``, which makes eager tensors of both."""
    names, run = op.input_names, raw_ops.runner(op.name)

    def kernels(*arrays):
        return list(run(dict(zip(names, arrays)), attrs, target=target))

    dtype = next(t.dtype for t, s in zip(tensors, op.inputs) if s.dtype == "T")
    outs = tf.numpy_function(kernels, tensors, Tout=[dtype] * len(op.outputs),
                             name=op.name)
    for out, shape in zip(outs, _output_shapes(op, tensors)):
        out.set_shape(shape)
    return outs


def _differentiable(op: OpSpec, attrs: dict, target):
    """``op`` with its gradient (:func:`lstm_tvm.autodiff.grad_route`)."""
    route = grad_route(op.name)
    grad_attrs = {k: attrs[k] for k in route.grad.attr_names}

    @tf.custom_gradient
    def call(*tensors):
        outs = _call(op, attrs, target, list(tensors))

        def grad(*upstream):
            values = {"input": dict(zip(op.input_names, tensors)),
                      "output": dict(zip(op.output_names, outs)),
                      "output_grad": {}}
            for kind, n in route.sources:  # cs and h: TF ignores the gates' gradients
                if kind == "output_grad":
                    g = upstream[op.output_names.index(n)]
                    values[kind][n] = g if g is not None else tf.zeros_like(values["output"][n])
            result = _call(route.grad, grad_attrs, target,
                           [values[kind][n] for kind, n in route.sources])
            values["grad"] = dict(zip(route.grad.output_names, result))
            found = {n: values["grad"][out] for n, out in route.from_grad.items()}
            if route.matmul is not None:
                product = _call(route.matmul, {}, target,
                                [values[kind][n] for kind, n in route.matmul_sources])
                product = dict(zip(route.matmul.output_names, product))
                found.update({n: product[out] for n, out in route.from_matmul.items()})
            return [found.get(n) for n in op.input_names]

        return outs, grad

    return call
