"""Unscheduled TIR kernels, one builder per registry op (see :data:`BUILDERS`)."""

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
}

__all__ = ["BUILDERS", "cell_grad_matmul"]
