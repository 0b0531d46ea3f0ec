"""Convert TF graphs holding the six LSTM block ops to ONNX models with lstm_tvm's custom ops.

:func:`from_function` (a ``tf.function``), :func:`from_graph_def` and :func:`from_saved_model`
run ``tf2onnx`` with the handlers of :mod:`.handlers` (TF's LSTM block ops become
:data:`~lstm_tvm.onnx.domain.DOMAIN` nodes; ``BlockLSTMGrad`` fed by ``BlockLSTMV2`` becomes
``BlockLSTMGradV2``) and of :mod:`.tf_ops` (``BroadcastGradientArgs``, which gradients of
dynamic-shape graphs need and tf2onnx lacks), add the custom domain to the opset imports
(tf2onnx's Python API does not), then :func:`.model.finish_model`: ``ai.onnx`` opset 21 by
default, IR version 10, the ONNX functions of the ops used attached (a plain
``onnxruntime.InferenceSession`` runs the model; :class:`lstm_tvm.onnx.ort.InferenceSession`
runs the same model on lstm_tvm's TVM kernels), and onnx's checker. Every node tf2onnx or the
handlers cannot convert raises :class:`~.handlers.ConversionError` naming it.

A function's arguments become the model's inputs; the variables and tensors it captures
become initializers (:mod:`.freeze`). Needs TensorFlow and tf2onnx
(``pip install -e ".[convert]"``), imported without TF's start-up lines (:mod:`.tf_import`).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper

from ..onnx.domain import DOMAIN, DOMAIN_VERSION
from . import tf_ops
from .handlers import ConversionError, Handlers
from .freeze import freeze_function, function_io
from .model import TF2ONNX_MAX_OPSET, check_opset, finish_model, lstm_op_types
from .tf_import import import_tensorflow, tf_deprecations_silenced

__all__ = ["from_function", "from_graph_def", "from_saved_model", "require",
           "saved_model_signatures"]

log = logging.getLogger("lstm_tvm.convert")

INSTALL_HINT = 'pip install -e ".[convert]"'


def require(cpp_log_level: str | None = "1"):
    """Import and return ``(tensorflow, tf2onnx)``; ``ImportError`` naming the extra to install
    when one is missing.

    When this imports TF, TF's start-up lines are dropped from stderr and
    ``TF_CPP_MIN_LOG_LEVEL`` is set to ``cpp_log_level`` unless set already
    (:func:`.tf_import.import_tensorflow`; ``None`` leaves TF's logging alone).
    """
    try:
        return import_tensorflow(cpp_log_level)
    except ImportError as err:
        raise ImportError(f"lstm_tvm.convert needs TensorFlow and tf2onnx ({err.name or err} is "
                          f"not installed): {INSTALL_HINT}") from err


def _tf2onnx_kwargs(handlers: Handlers, opset: int, kwargs: dict) -> dict:
    for reserved in ("output_path", "extra_opset", "custom_ops", "large_model"):
        if reserved in kwargs:
            raise TypeError(f"{reserved}: not supported by lstm_tvm.convert (set by it or "
                            f"unavailable), got {kwargs[reserved]!r}")
    ours = handlers.custom_op_handlers()
    theirs = dict(kwargs.pop("custom_op_handlers", None) or {})
    clash = sorted(set(theirs) & set(ours))
    if clash:
        raise TypeError(f"custom_op_handlers: {clash} are converted by lstm_tvm; expected "
                        f"handlers for other ops only")
    return {**kwargs, "opset": min(opset, TF2ONNX_MAX_OPSET),
            "custom_op_handlers": {**tf_ops.HANDLERS, **theirs, **ours},
            "extra_opset": [helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]}


def _finish(model: onnx.ModelProto, handlers: Handlers, opset: int, functions: bool,
            output_path) -> onnx.ModelProto:
    if handlers.errors:
        raise ConversionError("; ".join(str(e) for e in handlers.errors))
    model = finish_model(model, opset=opset, functions=functions,
                         gradient_fixes=handlers.gradient_fixes)
    counts = Counter(handlers.converted.values())
    log.info("converted %d lstm_tvm node(s) (%s), %d nodes in all, opset %d, IR %d, %s",
             sum(counts.values()), ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
             len(model.graph.node), opset, model.ir_version,
             f"functions of {', '.join(lstm_op_types(model))} attached" if model.functions
             else "no functions attached")
    if output_path is not None:
        onnx.save(model, str(output_path))
        log.info("wrote %s", output_path)
    return model


def from_function(fn, input_signature, *, opset: int | None = None, output_path=None,
                  attach_functions: bool = True, fix_v2_gradient: bool = True,
                  **tf2onnx_kwargs) -> onnx.ModelProto:
    """Convert the ``tf.function`` ``fn`` traced at ``input_signature`` to an ONNX model.

    Parameters
    ----------
    fn : tf.function
    input_signature : sequence of tf.TensorSpec
        As ``tf2onnx.convert.from_function``; the specs' names name the model's inputs, and a
        dict returned by ``fn`` names its outputs. The model's inputs are ``fn``'s arguments
        only: the ``tf.Variable`` s and tensors (``tf.constant`` s) ``fn`` captures are frozen
        into initializers (:mod:`.freeze`).
    opset : int, optional
        ``ai.onnx`` opset of the model (default 21; at most 26, onnxruntime 1.31's limit; at
        least 21 with functions attached). tf2onnx converts at ``min(opset, 18)`` and onnx's
        version converter takes the standard ops the rest of the way.
    output_path : path, optional
        Where to save the model.
    attach_functions : bool
        Attach the ONNX functions of the lstm_tvm ops used, so plain onnxruntime runs them.
    fix_v2_gradient : bool
        Convert ``BlockLSTMGrad`` nodes fed by ``BlockLSTMV2`` as ``BlockLSTMGradV2`` (TF's
        tape emits the wrong gradient op for BlockLSTMV2; see :mod:`.handlers`).
    **tf2onnx_kwargs
        More arguments of ``tf2onnx.convert.from_function`` (``shape_override``,
        ``custom_op_handlers`` for other ops, ...).

    Returns
    -------
    onnx.ModelProto
        IR version 10 (higher only when the opset needs it), opset imports ``ai.onnx`` and
        ``org.lstm_tvm`` version 1, checked by ``onnx.checker`` (full check).

    Raises
    ------
    ConversionError
        A node that cannot be converted (named, with the input or attribute at fault), or a
        captured resource that is not a ``tf.Variable`` (a lookup table, ...), named.
    ValueError
        An ``opset`` out of range, or no tensor argument in ``input_signature``.
    ImportError
        TensorFlow or tf2onnx missing.
    """
    opset = check_opset(opset, attach_functions)
    _, tf2onnx = require()
    handlers = Handlers(fix_v2_gradient=fix_v2_gradient)
    kwargs = _tf2onnx_kwargs(handlers, opset, tf2onnx_kwargs)
    name = getattr(fn, "__name__", str(fn))
    log.info("converting %s with tf2onnx %s", name, tf2onnx.__version__)
    concrete = fn.get_concrete_function(*input_signature)
    inputs, outputs = function_io(concrete)
    if not inputs:
        raise ValueError(f"input_signature: expected at least one tensor argument of {name} "
                         f"(the model's inputs), got {list(input_signature)!r}")
    renames = tf2onnx.convert.tensor_names_from_structed(concrete, inputs, outputs)
    with tf_deprecations_silenced():
        graph_def = freeze_function(concrete, inputs, outputs, name)
        model, _ = tf2onnx.convert.from_graph_def(graph_def, name=name, input_names=inputs,
                                                  output_names=outputs,
                                                  tensors_to_rename=renames, **kwargs)
    return _finish(model, handlers, opset, attach_functions, output_path)


def from_graph_def(graph_def, input_names, output_names, *, opset: int | None = None,
                   output_path=None, attach_functions: bool = True,
                   fix_v2_gradient: bool = True, **tf2onnx_kwargs) -> onnx.ModelProto:
    """Convert a TF ``GraphDef`` (tensor names ``"node:0"`` as ``input_names``/``output_names``)
    to an ONNX model; the other arguments and the result as :func:`from_function`."""
    opset = check_opset(opset, attach_functions)
    _, tf2onnx = require()
    handlers = Handlers(fix_v2_gradient=fix_v2_gradient)
    kwargs = _tf2onnx_kwargs(handlers, opset, tf2onnx_kwargs)
    log.info("converting a GraphDef of %d nodes with tf2onnx %s", len(graph_def.node),
             tf2onnx.__version__)
    with tf_deprecations_silenced():
        model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=list(input_names),
                                                  output_names=list(output_names), **kwargs)
    return _finish(model, handlers, opset, attach_functions, output_path)


def saved_model_signatures(path) -> list[str]:
    """The signature keys of the SavedModel at ``path`` (read from ``saved_model.pb``);
    ``ValueError`` naming the file when it is not a SavedModel proto."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    file = Path(path) / "saved_model.pb"
    try:
        proto.ParseFromString(file.read_bytes())
    except DecodeError as err:
        raise ValueError(f"saved model: expected a SavedModel proto in {str(file)!r}, got a "
                         f"file that does not parse ({err})") from err
    return sorted({k for mg in proto.meta_graphs for k in mg.signature_def
                   if not k.startswith("__")})


def from_saved_model(path, *, signature: str = "serving_default", tag: str = "serve",
                     opset: int | None = None, output_path=None, attach_functions: bool = True,
                     fix_v2_gradient: bool = True, **tf2onnx_kwargs) -> onnx.ModelProto:
    """Convert signature ``signature`` of the SavedModel at ``path`` (variables frozen into
    constants; inputs and outputs named as the signature's) to an ONNX model; the other
    arguments and the result as :func:`from_function`.

    Raises ``FileNotFoundError`` when ``path`` holds no ``saved_model.pb`` and ``ValueError``
    listing the model's signatures when ``signature`` is not one of them.
    """
    opset = check_opset(opset, attach_functions)
    _, tf2onnx = require()
    path = Path(path)
    if not (path / "saved_model.pb").is_file():
        raise FileNotFoundError(f"saved model: expected a SavedModel folder holding "
                                f"saved_model.pb, got {str(path)!r}")
    found = saved_model_signatures(path)
    if signature not in found:
        raise ValueError(f"signature: {signature!r} is not in the SavedModel {str(path)!r}; "
                         f"expected one of {found}")
    log.info("loading SavedModel %s (signature %s, tag %s)", path, signature, tag)
    handlers = Handlers(fix_v2_gradient=fix_v2_gradient)
    kwargs = _tf2onnx_kwargs(handlers, opset, tf2onnx_kwargs)
    with tf_deprecations_silenced():
        graph_def, inputs, outputs, renames = tf2onnx.tf_loader.from_saved_model(
            str(path), None, None, tag=[tag], signatures=[signature],
            return_tensors_to_rename=True)
        log.info("converting %d TF nodes with tf2onnx %s", len(graph_def.node),
                 tf2onnx.__version__)
        model, _ = tf2onnx.convert.from_graph_def(graph_def, name=str(path),
                                                  input_names=inputs, output_names=outputs,
                                                  tensors_to_rename=renames, **kwargs)
    return _finish(model, handlers, opset, attach_functions, output_path)
