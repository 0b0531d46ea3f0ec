"""Timing one op by each route that runs it in ONNX Runtime, beside lstm_tvm's own:
:func:`compare_routes`.

The routes are those of :mod:`lstm_tvm.onnx.ort` (PyOps, ONNX functions) and
:mod:`lstm_tvm.onnx.native` (the custom-op library on an export folder), so this sits above
both :mod:`lstm_tvm.onnx` and :mod:`lstm_tvm.export`.
"""

from __future__ import annotations

import atexit
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from .. import raw_ops, testing
from .._tvm import tvm
from ..api import compile as tvm_compile
from ..export import export
from ..onnx import native
from ..onnx._threads import sleep_when_idle
from ..onnx.models import make_model
from ..onnx.ort import InferenceSession
from ..registry import OPS

__all__ = ["compare_routes"]


def _median_ms(routes: dict, repeat: int) -> dict[str, float]:
    """Median ms per route; the routes take turns so that load drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in routes}
    for fn in routes.values():
        fn()  # warm-up (compiles, allocates)
    for _ in range(repeat):
        for name, fn in routes.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _no_spinning(onnxruntime):
    """Session options whose idle threads sleep
    (:func:`lstm_tvm.onnx._threads.sleep_when_idle`), for the function route's session too:
    the routes' calls are interleaved."""
    return sleep_when_idle(onnxruntime.SessionOptions())


def _native_routes(op_name, dtype, I, H, attrs, inputs, options: Callable) -> dict:
    """``session.run`` of the native library on an export of ``op_name`` in a temporary
    folder (64-byte aligned feeds, as onnxruntime allocates): ``ort_native`` with every input
    fed, ``ort_native_w_init`` with ``w`` an initializer (packed once where the op packs it);
    none when the library cannot be built. ``options()`` makes each session's options."""
    import onnxruntime

    try:
        library = native.build_library()
    except FileNotFoundError as err:
        print(f"ort_native: not timed ({err})")
        return {}
    folder = tempfile.mkdtemp(prefix="lstm_tvm_native_")
    # the sessions have loaded the export's library by the time the process ends
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    export(folder, [op_name], dtype=dtype, input_size=I, cell_size=H, attrs=attrs, onnx=False,
           progress=False)

    def route(initializers):
        model = make_model(op_name, dtype, input_size=I, cell_size=H, attrs=attrs,
                           with_functions=False, initializers=initializers)
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), native.session_options([folder], library, base=options()),
            providers=["CPUExecutionProvider"])
        feeds = {k: native.aligned_copy(v) for k, v in inputs.items() if k not in initializers}
        return lambda: session.run(None, feeds)

    return {"ort_native": route({}), "ort_native_w_init": route({"w": inputs["w"]})}


def compare_routes(op_name: str = "BlockLSTMGradV2", *, T: int = 64, B: int = 32, I: int = 256,
                   H: int = 256, dtype: str = "float32", use_peephole: bool = False,
                   repeat: int = 5, seed: int = 0, native: bool = True) -> dict[str, float]:
    """Time one call of ``op_name`` by each route and print a table (median ms of ``repeat``).

    Routes: ``tvm`` (the compiled TVM op on TVM tensors made beforehand: the kernel alone),
    ``raw_ops`` (:func:`lstm_tvm.raw_ops.run` on NumPy arrays: validation and copies added),
    ``ort_pyop`` (onnxruntime with the PyOp calling ``raw_ops``,
    :class:`lstm_tvm.onnx.ort.InferenceSession`), ``ort_function`` (onnxruntime running the
    op's ONNX function, no TVM; float16 via ``Cast`` nodes on the PyOp route) and, with
    ``native`` and when :mod:`lstm_tvm.onnx.native` can build its library,
    ``ort_native`` (onnxruntime with the native library on an export of the op, aligned
    feeds) and ``ort_native_w_init`` (the same with ``w`` an initializer: the ops with a
    prepacked kernel pack it once per session). Returns ``{route: ms}``.
    """
    import onnxruntime

    op = OPS[op_name]
    attrs = {"use_peephole": use_peephole}
    kw = {"T": T} if op.kind == "sequence" else {}
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, attrs=attrs, seed=seed,
                                 **kw)
    compiled = tvm_compile(op_name, dtype=dtype, input_size=I, cell_size=H, **attrs)
    tensors = {n: int(v) if n == "seq_len_max" else tvm.runtime.tensor(v, compiled.device)
               for n, v in inputs.items()}
    out = compiled(**tensors)
    model = make_model(op_name, dtype, input_size=I, cell_size=H, attrs=attrs,
                       with_functions=False)
    pyop = InferenceSession(model, float16="cast", sess_options=_no_spinning(onnxruntime))
    function = onnxruntime.InferenceSession(
        make_model(op_name, dtype, input_size=I, cell_size=H, attrs=attrs).SerializeToString(),
        _no_spinning(onnxruntime), providers=["CPUExecutionProvider"])
    routes = {
        "tvm": lambda: compiled(**tensors, out=out),
        "raw_ops": lambda: raw_ops.run(op_name, inputs, attrs),
        "ort_pyop": lambda: pyop.run(None, inputs),
        "ort_function": lambda: function.run(None, inputs),
    }
    if native:
        routes.update(_native_routes(op_name, dtype, I, H, attrs, inputs,
                                     lambda: _no_spinning(onnxruntime)))
    result = _median_ms(routes, repeat)
    base = result["raw_ops"]
    print(f"{op_name} {dtype} T={T} B={B} I={I} H={H} use_peephole={use_peephole}, "
          f"median of {repeat} calls")
    print(f"{'route':<18}{'ms':>10}{'- raw_ops ms':>14}{'/ raw_ops':>11}")
    for name, ms in result.items():
        print(f"{name:<18}{ms:>10.3f}{ms - base:>+14.3f}{ms / base:>10.2f}x")
    return result
