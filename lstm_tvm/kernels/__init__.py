"""Unscheduled TIR kernels, one builder per registry op, TF op or helper (see
:data:`BUILDERS`), and :func:`kernel_func`, the unscheduled PrimFunc of an op."""

from ..registry import get_op
from .block_cell import lstm_block_cell, lstm_block_cell_grad
from .block_lstm import block_lstm
from .block_lstm_grad import block_lstm_grad
from .cell_grad_matmul import cell_grad_matmul

#: Registry op name -> builder ``(op, dtype, input_size, cell_size, attrs) -> PrimFunc``.
BUILDERS = {
    "LSTMBlockCell": lstm_block_cell,
    "LSTMBlockCellGrad": lstm_block_cell_grad,
    "BlockLSTM": block_lstm,
    "BlockLSTMGrad": block_lstm_grad,
    "BlockLSTMV2": block_lstm,
    "BlockLSTMGradV2": block_lstm_grad,
    "CellGradMatmul": cell_grad_matmul,
}


def kernel_func(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """The unscheduled PrimFunc of registry op ``op`` (see :data:`lstm_tvm.registry.KERNEL_OPS`)."""
    return BUILDERS[op](get_op(op), dtype, input_size, cell_size, attrs)


__all__ = ["BUILDERS", "kernel_func"]
