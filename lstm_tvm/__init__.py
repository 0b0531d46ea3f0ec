"""lstm_tvm: TensorFlow's LSTM block ops (forward and gradient) compiled by Apache TVM."""

from . import autodiff, raw_ops
from .api import CompiledOp, compile
from .raw_ops import cell_grad_matmul
from .registry import OPS, get_op

__version__ = "0.1.0"

__all__ = ["OPS", "get_op", "compile", "CompiledOp", "raw_ops", "cell_grad_matmul", "autodiff",
           "__version__"]
