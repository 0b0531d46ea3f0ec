"""Export compiled ops for deployment: one shared library, a manifest, ONNX definitions.

:func:`export` (``lstm-tvm export``) writes into a folder:

- ``lstm_tvm_ops.so``: every requested op's scheduled PrimFunc in one ``IRModule``, compiled
  once by ``tvm.compile`` (one global symbol per op, ``lstm_tvm_<Op>_<dtype>``).
- ``manifest.json``: what the library holds and how to call it (:mod:`.manifest`).
- ``onnx/<Op>.onnx``: a single-op model per op in the custom domain ``org.lstm_tvm`` with the
  op's ONNX function attached (:func:`lstm_tvm.onnx.make_model`): the custom-op definition to
  copy into other graphs, runnable in onnxruntime as it is.
- ``README.txt``: how to load it from Python and C++.

:func:`load` opens such a folder with ``tvm.runtime.load_module`` only (never compiles) and
returns callables by op name that check their inputs against the manifest (:mod:`.loader`).
:func:`save_tensor`/:func:`load_tensor` write and read the tensor files of the C++ example
(``examples/cpp``); :func:`cxx_build_command` (from :mod:`lstm_tvm.toolchain`) is its build
line for this installation.
"""

from .loader import ExportedLibrary, ExportedOp, load
from .manifest import ALIGNMENT, FORMAT_VERSION, LIBRARY, MANIFEST, make_manifest, signature
from .tensorfile import load_tensor, save_tensor
from ..toolchain import cxx_build_command
from .writer import export

__all__ = [
    "ALIGNMENT",
    "FORMAT_VERSION",
    "LIBRARY",
    "MANIFEST",
    "ExportedLibrary",
    "ExportedOp",
    "cxx_build_command",
    "export",
    "load",
    "load_tensor",
    "make_manifest",
    "save_tensor",
    "signature",
]
