"""TF's LSTM block ops on lstm_tvm's kernels, as TensorFlow functions with gradients.

``lstm_tvm.tf.BlockLSTM(seq_len_max=..., x=..., ..., use_peephole=False)`` takes the keyword
arguments of ``tf.raw_ops.BlockLSTM`` (tensors, variables or anything
``tf.convert_to_tensor`` takes) and returns a named tuple of ``tf.Tensor`` with TF's output
names and order, eagerly or inside a ``tf.function``. The three forward ops (``LSTMBlockCell``,
``BlockLSTM``, ``BlockLSTMV2``) carry their gradients, so ``tf.GradientTape`` and Keras
optimizers train through them:

- ``BlockLSTM`` -> ``BlockLSTMGrad``, ``BlockLSTMV2`` -> ``BlockLSTMGradV2`` (TF 2.21 pairs
  ``BlockLSTMV2`` with ``BlockLSTMGrad`` and so gets its gradient wrong), ``LSTMBlockCell`` ->
  ``LSTMBlockCellGrad`` and the matmul part (:func:`cell_grad_matmul`; TF 2.21 registers no
  gradient for ``LSTMBlockCell``), as :func:`lstm_tvm.autodiff.grad_route` says;
- gradients reach every float input (``x, cs_prev, h_prev, w, wci, wcf, wco, b``); as in TF,
  only the gradients of ``cs`` and ``h`` are propagated (those of the gate outputs ``i, f, o,
  ci, co`` are ignored), and the clip of ``cell_clip`` is not differentiated;
- the grad ops themselves have no gradient (no second derivatives).

The kernels run in ``tf.numpy_function`` calls; tensors cross in both directions as NumPy
views of the same buffers, without copies. ``target=`` (default ``"llvm"``) chooses the kernels, as for
:mod:`lstm_tvm.raw_ops`. Output shapes are known statically where the inputs' are. Inputs whose
shapes are all static are checked when the call is traced, with :mod:`lstm_tvm.raw_ops`'
messages; the rest when the kernels run (a ``tf.errors.InvalidArgumentError`` carrying the
same message).
"""

from __future__ import annotations

from ..autodiff import grad_route
from ..registry import OPS
from ._ops import make_op

__all__ = [*OPS, "cell_grad_matmul"]

for _name in OPS:
    globals()[_name] = make_op(_name)

_matmul = make_op(grad_route("LSTMBlockCell").matmul.name)


def cell_grad_matmul(x, h_prev, w, dicfo, *, target="llvm", name=None):
    """The matmul part of ``LSTMBlockCell``'s gradient on the kernels
    (:func:`lstm_tvm.raw_ops.cell_grad_matmul`), as TF tensors: a named tuple ``(x_grad,
    h_prev_grad, w_grad, b_grad)``."""
    return _matmul(x=x, h_prev=h_prev, w=w, dicfo=dicfo, target=target, name=name)
