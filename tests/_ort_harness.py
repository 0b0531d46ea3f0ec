"""The tests' ONNX Runtime harness: an lstm_tvm model in a session on one route, fed by name.

Routes: ``function`` (a plain session: the ONNX functions, or standard ops only), ``pyop`` (the
PyOps through :class:`lstm_tvm.onnx.ort.InferenceSession`), ``pyop_plain`` (the PyOps in a plain
session) and ``native`` (the C++ custom-op library running exports). onnxruntime and the route's
module are imported on first use, so importing this module needs neither. A child process
imports it through :func:`child_script`.
"""

import textwrap
from pathlib import Path

ROUTES = ("function", "pyop", "pyop_plain", "native")
PROVIDERS = ["CPUExecutionProvider"]
HERE = Path(__file__).resolve().parent


def _plain_options(route, exports, library):
    """``onnxruntime.SessionOptions`` of a plain session on ``route``."""
    if route == "pyop_plain":
        from lstm_tvm.onnx import ort as lort

        return lort.session_options()
    if route == "native":
        from lstm_tvm.onnx import native

        return native.session_options(exports, library=library)
    import onnxruntime

    return onnxruntime.SessionOptions()


def open_session(model, route="function", *, exports=(), library=None, quiet=False,
                 float16="error"):
    """``model`` (a ``ModelProto``) in an onnxruntime session on ``route``, on the CPU.

    ``exports`` and ``library``: the native route's export folders and built library;
    ``quiet``: a plain session logs errors only; ``float16``: the ``pyop`` wrapper's handling of
    float16 nodes (:func:`lstm_tvm.onnx.ort.prepare_model`).
    """
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; routes: {ROUTES}")
    if route == "pyop":
        from lstm_tvm.onnx import ort as lort

        return lort.InferenceSession(model, float16=float16)
    import onnxruntime

    options = _plain_options(route, exports, library)
    if quiet:
        options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=PROVIDERS)


def session_feeds(session, inputs, align=False):
    """The arrays of ``inputs`` that ``session`` takes, by name (other keys are left out);
    ``align``: 64-byte aligned copies, which the native route passes in place."""
    if align:
        from lstm_tvm.onnx import native

        return {i.name: native.aligned_copy(inputs[i.name]) for i in session.get_inputs()}
    return {i.name: inputs[i.name] for i in session.get_inputs()}


def run_session(session, inputs, align=False):
    """``session``'s outputs by name, in graph order, on :func:`session_feeds` of ``inputs``."""
    outputs = session.run(None, session_feeds(session, inputs, align))
    return dict(zip([o.name for o in session.get_outputs()], outputs))


def child_script(body):
    """``body`` (dedented) as a ``python -c`` program that can import this module."""
    return f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body)

