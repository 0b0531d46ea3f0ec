"""TF graphs -> ONNX models holding lstm_tvm's custom ops (domain ``org.lstm_tvm``), via tf2onnx.

tf2onnx 1.17 has no conversion for ``BlockLSTM``, ``BlockLSTMV2`` or the grad ops; this package
gives it one handler per registry op (:mod:`.handlers`) and finishes the model for onnxruntime
1.31 (:mod:`.model`: opset 21, IR version 10, ONNX functions attached). Entry points
(:mod:`.api`): :func:`from_function`, :func:`from_graph_def`, :func:`from_saved_model`, and
``lstm-tvm convert`` (:mod:`lstm_tvm.cli.convert`). A ``BlockLSTMGrad`` node fed by
``BlockLSTMV2`` (what ``tf.GradientTape`` emits in TF 2.21, a TF bug) is converted as
``BlockLSTMGradV2``.

A function's arguments become the model's inputs; the ``tf.Variable`` s and ``tf.constant`` s
it captures become initializers (:mod:`.freeze`). Importing this package does not import
TensorFlow; converting needs it and tf2onnx (``pip install -e ".[convert]"``), imported without
TF's start-up lines (:mod:`.tf_import`).
"""

from .api import from_function, from_graph_def, from_saved_model, require, saved_model_signatures
from .handlers import ConversionError, GradientFix, Handlers
from .model import METADATA_GRADIENT_FIXES, attach_functions, finish_model, lstm_op_types

__all__ = [
    "METADATA_GRADIENT_FIXES",
    "ConversionError",
    "GradientFix",
    "Handlers",
    "attach_functions",
    "finish_model",
    "from_function",
    "from_graph_def",
    "from_saved_model",
    "lstm_op_types",
    "require",
    "saved_model_signatures",
]
