"""Run lstm_tvm nodes in ONNX Runtime with lstm_tvm's TVM kernels (onnxruntime-extensions PyOps).

Two routes run a model holding :data:`~.domain.DOMAIN` nodes in onnxruntime:

- **Function route** (no custom kernel): build the model with its ONNX functions attached
  (:func:`~.models.make_model`, ``with_functions=True``) and open it with a plain
  ``onnxruntime.InferenceSession``; onnxruntime inlines the functions (standard ops, native
  speed). float32 and float16.
- **PyOp route** (this module): :func:`register_ort_ops` registers one PyOp per registry op
  (op type ``"org.lstm_tvm::<Op>"``) that calls :func:`lstm_tvm.raw_ops.run`;
  :func:`session_options` returns ``SessionOptions`` with the extensions library registered
  (and ONNX Runtime's idle threads sleeping: :func:`._threads.sleep_when_idle`).
  A registered PyOp takes precedence over an attached function. **float32 only.**
  :class:`InferenceSession` wraps both steps and adds the safety below.

Safety of the PyOp route (onnxruntime-extensions 0.15.2, measured):

- A PyOp declaring a float16 input aborts the process when it runs, so the PyOps declare
  float32 only; onnxruntime then refuses a float16 model at session creation with an
  ``InvalidGraph`` exception (no abort). :class:`InferenceSession` raises a ``TypeError``
  naming the node before that, or with ``float16="cast"`` inserts ``Cast`` nodes around each
  float16 lstm_tvm node (float32 kernels on float16-rounded inputs, outputs rounded to float16).
- A Python exception escaping a PyOp aborts the process. So the PyOps never raise: a failing
  call (e.g. an input of the wrong shape) is logged, remembered (:func:`last_error`), returns
  zeros and sets ``terminate`` on the ``RunOptions`` of the :class:`InferenceSession` run in
  progress, which then raises the original ``ValueError``/``TypeError`` (and logs nothing). In
  a plain ``onnxruntime`` session the failing node's outputs are zeros and only the log tells.
- Every declared attribute must be on the node: :func:`~.models.make_node` writes TF's
  defaults; :func:`prepare_model` adds missing ones to nodes built elsewhere.

Inputs are copied into NumPy and outputs travel through Python lists: the route is for
correctness and convenience, not speed
(:func:`lstm_tvm.bench.ort_routes.compare_routes` measures it).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import onnx

from .. import raw_ops
from ..registry import OPS, OpSpec, eval_dim
from ._prepare import float16_nodes, prepare_model
from .contract import check_model
from ._threads import parallel_executor_threads, sleep_when_idle
from .domain import DOMAIN

__all__ = [
    "PYOP_TYPES",
    "InferenceSession",
    "float16_nodes",
    "last_error",
    "prepare_model",
    "register_ort_ops",
    "session_options",
]

log = logging.getLogger(__name__)

#: The onnxruntime-extensions op type of each registry op (the domain is part of the name).
PYOP_TYPES = {name: f"{DOMAIN}::{name}" for name in OPS}

_REGISTERED: dict[str, object] = {}
_LOCK = threading.Lock()
_STATE = threading.local()  # .run: this thread's InferenceSession.run in progress
_ACTIVE: list[dict] = []  # every InferenceSession.run in progress: {"options", "error"}
_LAST_ERROR: list = [None]


def _extensions():
    try:
        import onnxruntime_extensions as ortx
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("lstm_tvm.onnx.ort needs onnxruntime-extensions "
                          "(pip install 'lstm-tvm[ort]')") from exc
    return ortx


def last_error() -> BaseException | None:
    """The exception of the most recent failing PyOp call (any thread), or None."""
    return _LAST_ERROR[0]


def _fallback_outputs(op: OpSpec, arrays) -> tuple[np.ndarray, ...]:
    """Zeros of the registry shapes, sizes read from ``x``/``cs_prev`` where possible."""
    sizes = {"T": 0, "B": 0, "I": 0, "H": 0}
    try:
        x, cs_prev = (np.shape(arrays[op.input_names.index(n)]) for n in ("x", "cs_prev"))
        if len(x) == len(op.input("x").shape):
            sizes.update(zip(op.input("x").shape, (int(d) for d in x)))
        if len(cs_prev) == 2:
            sizes["H"] = int(cs_prev[1])
    except Exception as exc:  # noqa: BLE001 - best effort: keep the zero sizes
        log.debug("no sizes for the fallback outputs of %s: %s", op.name, exc)
    return tuple(np.zeros([eval_dim(d, sizes) for d in t.shape], np.float32)
                 for t in op.outputs)


def _current_run() -> dict | None:
    run = getattr(_STATE, "run", None)
    if run is None:
        with _LOCK:  # a kernel on an onnxruntime pool thread: the only run in progress
            run = _ACTIVE[0] if len(_ACTIVE) == 1 else None
    return run


def _fail(op: OpSpec, exc: BaseException, arrays):
    """Zeros for a failed call; the error is raised by the :class:`InferenceSession` run in
    progress, or, in a plain onnxruntime session that cannot raise it, logged."""
    _LAST_ERROR[0] = exc
    run = _current_run()
    if run is not None:
        run["error"] = exc
        run["options"].terminate = True  # onnxruntime stops before the next node
        log.debug("lstm_tvm PyOp %s failed, raised by the run: %s", op.name, exc)
    else:
        log.error("lstm_tvm PyOp %s failed (outputs are zeros): %s: %s", op.name,
                  type(exc).__name__, exc)
    return _fallback_outputs(op, arrays)


def _kernel_threads() -> int | None:
    """The CPU threads a PyOp's kernel may use: one core fewer on a thread ONNX Runtime
    started (its parallel executor runs nodes there while the thread that called ``run``
    spins on a core until they are done: a kernel on every core, its threads meeting at a
    barrier every step, would wait for that core's time slices; docs/performance.md); None
    (every core) on a thread Python started (the sequential executor runs nodes on the
    caller's thread)."""
    if isinstance(threading.current_thread(), threading._DummyThread):
        return parallel_executor_threads()
    return None


def _make_kernel(op: OpSpec):
    bools = {a.name for a in op.attrs if a.type is bool}

    def kernel(*arrays, **attrs):
        try:
            if len(arrays) != len(op.inputs):
                raise TypeError(f"{op.name}: expected {len(op.inputs)} inputs, got {len(arrays)}")
            bad = {k: v for k, v in attrs.items() if k in bools and v not in (0, 1)}
            if bad:
                raise TypeError(f"{op.name}: attributes {bad} expected 0 or 1")
            attrs = {k: (bool(v) if k in bools else float(v)) for k, v in attrs.items()}
            out = raw_ops.run(op.name, dict(zip(op.input_names, arrays)), attrs,
                              threads=_kernel_threads())
            return tuple(np.ascontiguousarray(o, dtype=np.float32) for o in out)
        except BaseException as exc:  # noqa: BLE001 - an escaping exception aborts the process
            return _fail(op, exc, arrays)

    kernel.__name__ = op.name
    return kernel


def register_ort_ops() -> list[str]:
    """Register the PyOps of all registry ops (idempotent); return their op types."""
    ortx = _extensions()
    dt = ortx.PyCustomOpDef
    with _LOCK:
        for op in OPS.values():
            if op.name in _REGISTERED:
                continue
            types = [dt.dt_int64 if t.dtype == "int64" else dt.dt_float for t in op.inputs]
            attrs = {a.name: dt.dt_int64 if a.type is bool else dt.dt_float for a in op.attrs}
            _REGISTERED[op.name] = ortx.onnx_op(
                op_type=PYOP_TYPES[op.name], inputs=types,
                outputs=[dt.dt_float] * len(op.outputs), attrs=attrs)(_make_kernel(op))
    return [PYOP_TYPES[n] for n in OPS]


def session_options(base=None, *, register: bool = True):
    """``onnxruntime.SessionOptions`` (``base`` or new) with the extensions library registered.

    With ``register`` (default) the PyOps are registered first (:func:`register_ort_ops`).
    Only float32 models run on this route (see the module doc).

    .. warning::
       In a plain ``onnxruntime.InferenceSession`` opened with these options, **a failing
       lstm_tvm node does not raise**: an exception escaping a PyOp would abort the process, so
       the PyOp catches it, logs ``lstm_tvm PyOp <Op> failed (outputs are zeros): ...`` (logger
       ``lstm_tvm.onnx.ort``), keeps it in :func:`last_error` and returns **zeros**; later nodes
       compute on those zeros and ``run`` returns normally. Use :class:`InferenceSession`, which
       re-raises the node's own ``ValueError``/``TypeError`` from ``run``, or check
       :func:`last_error` yourself. Errors onnxruntime finds before a PyOp runs (input types,
       declared dims, attributes missing or of the wrong type) raise in both.
    """
    import onnxruntime

    if register:
        register_ort_ops()
    options = sleep_when_idle(base if base is not None else onnxruntime.SessionOptions())
    options.register_custom_ops_library(_extensions().get_library_path())
    return options


class InferenceSession:
    """An ``onnxruntime.InferenceSession`` on the PyOp route, with the safety of the module doc.

    ``model`` is a ``ModelProto``, serialized bytes or a path, checked by
    :func:`lstm_tvm.onnx.check_model` first; ``float16`` as :func:`prepare_model`; other
    keyword arguments go to ``onnxruntime.InferenceSession`` (``providers`` defaults to CPU).
    :meth:`run` raises the PyOp's own exception (e.g. ``ValueError`` for a wrong shape) when
    an lstm_tvm node fails.
    """

    def __init__(self, model, *, float16: str = "error", sess_options=None, **kwargs):
        import onnxruntime

        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_model_from_string(model) if isinstance(model, bytes) \
                else onnx.load(model)
        check_model(model)
        self.model = prepare_model(model, float16=float16)
        kwargs.setdefault("providers", ["CPUExecutionProvider"])
        self.session = onnxruntime.InferenceSession(
            self.model.SerializeToString(), session_options(sess_options), **kwargs)

    def __getattr__(self, name):
        return getattr(self.session, name)

    def run(self, output_names, input_feed, run_options=None):
        """As ``onnxruntime.InferenceSession.run``; a failing lstm_tvm node raises its error.
        A NumPy feed in non-native byte order is converted first (ONNX Runtime's binding
        would read its bytes as native order)."""
        import onnxruntime

        input_feed = {name: _native_order(value) for name, value in input_feed.items()}
        run = {"options": run_options if run_options is not None else onnxruntime.RunOptions(),
               "error": None}
        with _LOCK:
            _ACTIVE.append(run)
        _STATE.run = run
        try:
            result = self.session.run(output_names, input_feed, run["options"])
        except Exception as exc:
            if run["error"] is not None:
                raise run["error"] from exc
            raise
        finally:
            if run["error"] is not None:
                run["options"].terminate = False  # set by the failing PyOp
            _STATE.run = None
            with _LOCK:
                _ACTIVE[:] = [r for r in _ACTIVE if r is not run]
        if run["error"] is not None:  # the failing node was the last one to run
            raise run["error"]
        return result


def _native_order(value):
    if isinstance(value, np.ndarray) and not value.dtype.isnative:
        return value.astype(value.dtype.newbyteorder("="))
    return value
