"""tf2onnx handlers for TF ops of gradient graphs that tf2onnx 1.17 cannot convert.

``tf.GradientTape`` on tensors of dynamic shape (a batch or time dim of ``None``) emits
``BroadcastGradientArgs`` for the gradient of every broadcasting binary op (``Sub``, ``Mul``,
...), and tf2onnx 1.17 has no handler for it, so a training step with dynamic shapes would not
convert. :data:`HANDLERS` adds one; :func:`lstm_tvm.convert.from_function` and its siblings
use it unless the caller passes their own.

``BroadcastGradientArgs(s0, s1) -> (r0, r1)``: ``r0`` are the axes of the broadcast shape
(``s0`` and ``s1`` right-aligned, the shorter padded with leading 1s) along which ``s0`` has a
1: summing the broadcast gradient over them (and reshaping to ``s0``) gives ``s0``'s gradient;
likewise ``r1``. TF also lists axes where both shapes have a 1: summing over a size-1 axis does
nothing, so the results agree.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

__all__ = ["HANDLERS", "broadcast_gradient_args"]


def broadcast_gradient_args(ctx, node, name, args):
    """tf2onnx handler of TF's ``BroadcastGradientArgs`` (int32 or int64 shapes)."""
    from tf2onnx import utils

    out_dtype = ctx.get_dtype(node.output[0])
    outputs = list(node.output)
    s0, s1 = node.input
    ctx.remove_node(node.name)

    def make(op_type, inputs, **attr):
        return ctx.make_node(op_type, inputs, attr=attr,
                             op_name_scope=node.name).output[0]

    def const(value):
        return ctx.make_const(utils.make_name(f"{node.name}_const"),
                              np.asarray(value, np.int64)).output[0]

    shapes = [make("Cast", [s], to=TensorProto.INT64) for s in (s0, s1)]
    ranks = [make("Shape", [s]) for s in shapes]
    rank = make("Max", ranks)
    one, flat = const(1), const([-1])
    ones_value = helper.make_tensor("value", TensorProto.INT64, [1], [1])
    for shape, r, out in zip(shapes, ranks, outputs):
        ones = make("ConstantOfShape", [make("Sub", [rank, r])], value=ones_value)
        padded = make("Concat", [ones, shape], axis=0)
        axes = make("NonZero", [make("Equal", [padded, one])])
        ctx.make_node("Cast", [make("Reshape", [axes, flat])], attr={"to": out_dtype},
                      outputs=[out], shapes=[[-1]], dtypes=[out_dtype],
                      op_name_scope=node.name)


#: ``{tf_op: (handler, [])}`` for tf2onnx's ``custom_op_handlers``.
HANDLERS = {"BroadcastGradientArgs": (broadcast_gradient_args, [])}
