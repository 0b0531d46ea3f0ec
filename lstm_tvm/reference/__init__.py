"""Float64 NumPy references of the six TF LSTM block ops (TensorFlow 2.21 semantics)."""

from .block_cell import (
    cell_grad_matmul,
    join_gates,
    lstm_block_cell,
    lstm_block_cell_grad,
    resolve_layout,
    split_gates,
)
from .block_lstm import (
    block_lstm,
    block_lstm_grad,
    block_lstm_grad_v2,
    block_lstm_v2,
    run,
    seq_len_of,
)

__all__ = [
    "block_lstm",
    "block_lstm_grad",
    "block_lstm_grad_v2",
    "block_lstm_v2",
    "cell_grad_matmul",
    "join_gates",
    "lstm_block_cell",
    "lstm_block_cell_grad",
    "resolve_layout",
    "run",
    "seq_len_of",
    "split_gates",
]
