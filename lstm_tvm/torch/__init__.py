"""TF's LSTM block ops in PyTorch: custom ops with gradients, an ``nn.LSTM``-like module and
ONNX export.

Importing this package registers (:func:`register`) ``torch.ops.lstm_tvm.<Op>`` for the six
ops of :data:`lstm_tvm.registry.OPS` and the helper ``CellGradMatmul``: TF's inputs (by
position or keyword), TF's attributes (keyword-only, TF's defaults), TF's outputs in TF's
order. ``seq_len_max`` is an int64 tensor (the default overload) or an int (the ``.int``
overload). CPU tensors run on :mod:`lstm_tvm.raw_ops`, as NumPy views that reach the kernels
through DLPack, and the outputs are tensors over the kernels' buffers (contiguous float32 and
float16 tensors are not copied in either direction, except small inputs: see
:mod:`lstm_tvm.raw_ops`); CUDA tensors run on the ops compiled for ``target="cuda"`` on
their device, through DLPack, on PyTorch's current stream. In plain eager mode on CPU tensors,
``lstm_tvm.torch.<Op>`` and :class:`LSTM` call the kernels without PyTorch's dispatcher
(:mod:`lstm_tvm.torch._eager`); tracers and compilers see ``torch.ops.lstm_tvm.<Op>``.
``lstm_tvm.torch.<Op>(**tf_kwargs)`` calls the op and returns a named tuple (``CellGradMatmul``
too: ``x``, ``h_prev``, ``w``, ``dicfo`` in; ``x_grad``, ``h_prev_grad``, ``w_grad``, ``b_grad``
out).

- Gradients: ``BlockLSTM`` -> ``BlockLSTMGrad``, ``BlockLSTMV2`` -> ``BlockLSTMGradV2``,
  ``LSTMBlockCell`` -> ``LSTMBlockCellGrad`` and ``CellGradMatmul``
  (:func:`lstm_tvm.autodiff.grad_route`), for every float input. Only ``cs`` and ``h`` are
  differentiable outputs; the gate outputs are marked non-differentiable (TF ignores their
  gradients). As in TF the clip of ``cell_clip`` is not differentiated.
- Fake kernels: ``torch.compile(fullgraph=True)`` and ``torch.export`` trace the ops.
- :class:`LSTM`: a module used like ``torch.nn.LSTM``, with TF's semantics.
- :mod:`lstm_tvm.torch.onnx_export`: ``torch.onnx.export`` writing lstm_tvm's ONNX nodes.
"""

from ..registry import KERNEL_OPS
from ._functions import make_function
from ._register import register
from .module import LSTM

__all__ = [*KERNEL_OPS, "LSTM", "register"]

register()

for _name in KERNEL_OPS:
    globals()[_name] = make_function(_name)
