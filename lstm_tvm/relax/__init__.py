"""Relax interop: import ONNX models holding ``LSTM`` and lstm_tvm's custom-domain nodes into a
Relax ``IRModule`` that calls lstm_tvm's kernels (:func:`from_onnx`).

- :mod:`.importer`: ``from_onnx`` and the importer (TVM's, with lstm_tvm's converters first).
- :mod:`.custom_ops`: converters of the six ``org.lstm_tvm`` ops.
- :mod:`.onnx_lstm`: the converter of ONNX's standard ``LSTM``.
- :mod:`.lstm_weights`: ONNX LSTM weights re-laid out for ``BlockLSTM`` (NumPy and Relax).
- :mod:`.shape_values`: shapes the graph computes (``tf.shape`` arithmetic), followed at import.
- :mod:`.sequence_te`: per-row sequence lengths (reverse, mask, last step) as TE.
- :mod:`.kernel_calls`: ``call_tir`` of the kernels; :mod:`.shapes`: dims and dtypes.
"""

from .custom_ops import CUSTOM_CONVERTERS
from .importer import LSTMGraphImporter, from_onnx
from .onnx_lstm import LSTM

__all__ = ["CUSTOM_CONVERTERS", "LSTM", "LSTMGraphImporter", "from_onnx"]
