"""Unscheduled TIR kernels, one builder per registry op (see :data:`BUILDERS`), and
:func:`kernel_func`, the unscheduled PrimFunc of an op."""

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
}

#: Pseudo-op name of the cell-gradient matmul helper (not a TF op).
CELL_GRAD_MATMUL = "CellGradMatmul"


def kernel_func(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """The unscheduled PrimFunc of ``op`` (a TF op name or :data:`CELL_GRAD_MATMUL`)."""
    if op == CELL_GRAD_MATMUL:
        return cell_grad_matmul(dtype, input_size, cell_size)
    return BUILDERS[op](get_op(op), dtype, input_size, cell_size, attrs)


__all__ = ["BUILDERS", "CELL_GRAD_MATMUL", "cell_grad_matmul", "kernel_func"]
