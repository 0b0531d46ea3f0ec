"""ONNX export and ONNX Runtime execution of lstm_tvm's six ops (domain ``org.lstm_tvm``).

- :mod:`.domain`: the domain constants and attribute conversion.
- :mod:`.schema`: ``OpSchema``s with shape inference (``register_schemas``).
- :mod:`.contract`: what every route holds lstm_tvm nodes to (``check_model``).
- :mod:`.functions`: each op as an ONNX function in standard ops (runs in onnxruntime as is).
- :mod:`.models`: node and model builders.
- :mod:`.ort`: onnxruntime-extensions PyOps calling lstm_tvm's TVM kernels (import it
  explicitly: it needs ``onnxruntime`` and ``onnxruntime-extensions``).
- :mod:`.native`: builds and registers the C++ custom-op library, which runs
  export folders' TVM kernels natively in onnxruntime (import it explicitly).
"""

from .contract import check_model
from .domain import DOMAIN, DOMAIN_VERSION, IR_VERSION, ONNX_OPSET
from .functions import make_function, make_functions
from .models import make_forward_backward_model, make_model, make_node
from .schema import deregister_schemas, make_schema, register_schemas

__all__ = [
    "DOMAIN",
    "DOMAIN_VERSION",
    "IR_VERSION",
    "ONNX_OPSET",
    "check_model",
    "deregister_schemas",
    "make_forward_backward_model",
    "make_function",
    "make_functions",
    "make_model",
    "make_node",
    "make_schema",
    "register_schemas",
]
