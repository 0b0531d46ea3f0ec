"""The benchmark's worker: runners for lstm_tvm, TF, PyTorch and the NumPy roofline.

:mod:`lstm_tvm.bench.harness` plans the runs, writes every case's inputs to ``.npz`` files and
prints the table; a worker process runs one job (one implementation, one or more (shape, case)
items): ``python lstm_tvm/bench/worker.py JOB.json OUT.json``. It is started as a script, not with
``-m``, so that the TF, PyTorch and NumPy workers never import ``lstm_tvm`` (and with it TVM
and LLVM) beside their own runtime; only the lstm_tvm worker does. It prints one ``@@done``
line per finished item (the parent's progress bar) and rewrites OUT.json after each item.

Memory: before the first measured call, one call on a tiny input (``T = B = 1``) starts the
runtimes (thread pools, TF's eager kernel cache), freed heap is returned to the OS
(``malloc_trim``) and the kernel's RSS high-water mark is reset (``/proc/self/clear_refs``);
``peak_mib`` is then ``VmHWM`` after all warm-up and timed calls minus ``VmRSS`` just before
them. Where ``clear_refs`` cannot be written it falls back to ``ru_maxrss`` growth, a lower
bound (``peak_exact`` is False).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import importlib.util
import json
import resource
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

#: Case key -> label. ``cell_bwd`` is LSTMBlockCellGrad alone (gate gradients, no GEMM);
#: ``cell_bwd_full`` adds the matmul part (what TF's Python gradient of LSTMBlockCell does).
CASES = {"seq_fwd": "seq fwd", "seq_bwd": "seq bwd", "cell_fwd": "cell fwd",
         "cell_bwd": "cell bwd (gates only)", "cell_bwd_full": "cell bwd (gates+matmul)"}
#: Implementation key -> the importable package it needs.
PACKAGES = {"lstm_tvm": "tvm", "bound": "tvm", "raw_ops": "tvm", "tf": "tensorflow",
            "torch": "torch", "ort": "onnxruntime", "numpy": "numpy"}
IMPLS = tuple(PACKAGES)
#: (impl, case) pairs with no counterpart: reported "n/a" with this reason, never run.
NOT_APPLICABLE = {("torch", "cell_bwd"): "PyTorch has no gates-only cell gradient",
                  **{("ort", case): "ONNX's LSTM is a sequence forward op" for case in CASES
                     if case != "seq_fwd"}}
DONE_MARK = "@@done"


def is_installed(impl: str) -> bool:
    """Whether the package an implementation needs can be imported (without importing it)."""
    return importlib.util.find_spec(PACKAGES[impl]) is not None


# --- memory -----------------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Return freed heap to the OS and reset the RSS high-water mark; False where impossible."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _status_kib("VmHWM")
        return True
    except OSError:
        return False


def _maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# --- timing -----------------------------------------------------------------------------------

def _noop():
    return None


@dataclasses.dataclass
class Runner:
    """One implementation of one case on pre-made inputs.

    ``call`` is the timed region; ``prepare`` runs untimed before each call (PyTorch's forward
    before a timed backward); ``keep`` holds objects that must stay alive while it runs.
    """

    call: Callable[[], object]
    what: str
    prepare: Callable[[], object] = _noop
    compile_s: float | None = None
    cached: bool | None = None
    keep: object = None


def measure(runner: Runner, warmup: int, repeat: int) -> dict:
    """Median time and peak extra RSS of ``warmup`` untimed then ``repeat`` timed calls.

    Returns
    -------
    dict
        ``times_ms`` (the timed calls), ``median_ms``, ``peak_mib`` (peak RSS minus the RSS
        before the first call), ``base_mib`` (that RSS) and ``peak_exact`` (see the module doc).
    """
    runner.prepare()
    exact = _reset_peak()
    base = _status_kib("VmRSS") if exact else _maxrss_kib()
    times = []
    gc.disable()
    try:
        for k in range(warmup + repeat):
            start = time.perf_counter()
            runner.call()
            elapsed = time.perf_counter() - start
            if k >= warmup:
                times.append(1e3 * elapsed)
            runner.prepare()
    finally:
        gc.enable()
    peak = _status_kib("VmHWM") if exact else _maxrss_kib()
    return {"times_ms": times, "median_ms": float(np.median(times)),
            "peak_mib": max(0, peak - base) / 1024, "base_mib": base / 1024, "peak_exact": exact}


# --- lstm_tvm ---------------------------------------------------------------------------------

def _tvm_op(ctx: dict, op_name: str, dtype: str, I: int, H: int, target="llvm"):
    """A CompiledOp, its compile seconds and cache hit; memoised."""
    from lstm_tvm import build as _build
    from lstm_tvm.api import compile as _compile
    from lstm_tvm.registry import get_op
    from lstm_tvm.validation import plain_attrs

    key = (op_name, dtype, I, H)
    if key not in ctx:
        op = get_op(op_name)
        attrs = plain_attrs(op)
        cached = _build.cache_path(_build.make_spec(op_name, dtype, I, H, attrs, target)).exists()
        start = time.perf_counter()
        fn = _compile(op_name, target=target, dtype=dtype, input_size=I, cell_size=H, **attrs)
        ctx[key] = (fn, time.perf_counter() - start, cached)
    return ctx[key]


def make_lstm_tvm(item: dict, inputs: dict, dtype: str, ctx: dict,
                  bound: bool = False) -> Runner:
    """CompiledOp calls on TVM tensors made beforehand, outputs reused with ``out=``; with
    ``bound``, of the op with ``w`` bound (:meth:`~lstm_tvm.api.CompiledOp.bind`, outside the
    timed calls)."""
    from lstm_tvm import build as _build
    from lstm_tvm._tvm import tvm
    from lstm_tvm.registry import get_op

    op = get_op(item["ops"][0])
    T, B, I, H = _sizes(inputs)
    fn, compile_s, cached = _tvm_op(ctx, op.name, dtype, I, H, ctx.get("target", "llvm"))
    dev = fn.device
    args = {k: int(v) if k == "seq_len_max" else tvm.runtime.tensor(v, dev)
            for k, v in inputs.items() if k in op.input_names}
    w = args.pop("w") if bound else None
    if bound:
        cached = cached and _build.cache_path(fn.spec.with_prepacked_weights()).exists()
        start = time.perf_counter()
        fn = fn.bind(w=w)
        compile_s += time.perf_counter() - start
    how = "w bound" if bound else "out="
    sizes = {"T": T, "B": B, "I": I, "H": H}
    # Outputs written once here, so that their pages are resident before the baseline.
    outs = [tvm.runtime.tensor(np.zeros(s.concrete_shape(sizes), dtype), dev) for s in op.outputs]
    if len(item["ops"]) == 1:
        return Runner(lambda: fn(**args, out=outs), f"{op.name} (CompiledOp, {how})",
                      compile_s=compile_s, cached=cached, keep=(args, outs))
    mm, mm_s, mm_cached = _tvm_op(ctx, item["ops"][1], dtype, I, H, ctx.get("target", "llvm"))
    mm_args = {"x": args["x"], "h_prev": args["h_prev"]}
    if bound:
        mm = mm.bind(w=w)
    else:
        mm_args["w"] = args["w"]
    mm_outs = [tvm.runtime.tensor(np.zeros(s.concrete_shape(sizes), dtype), dev)
               for s in mm.op.outputs]

    def call():
        grads = fn(**args, out=outs)
        mm(**mm_args, dicfo=grads.dicfo, out=mm_outs)

    return Runner(call, f"LSTMBlockCellGrad + cell_grad_matmul ({how})",
                  compile_s=compile_s + mm_s, cached=cached and mm_cached,
                  keep=(args, outs, mm_outs))


def make_bound(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """:func:`make_lstm_tvm` with ``w`` bound: the weights packed once, as ONNX Runtime packs
    an initializer once per session."""
    return make_lstm_tvm(item, inputs, dtype, ctx, bound=True)


def _sizes(inputs: dict) -> tuple[int, int, int, int]:
    """``(T, B, I, H)`` of a case's inputs (``T = 1`` for cell ops)."""
    x = inputs["x"]
    return (x.shape[0] if x.ndim == 3 else 1), x.shape[-2], x.shape[-1], inputs["cs_prev"].shape[1]


def make_raw_ops(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """``lstm_tvm.raw_ops`` on the NumPy inputs, in a process that has imported TF and PyTorch
    (when installed) as a TF user's has: the drop-in path, dispatch included."""
    for package in ("tensorflow", "torch"):
        if importlib.util.find_spec(package) is not None:
            importlib.import_module(package)
    import lstm_tvm

    name = item["ops"][0]
    fn = getattr(lstm_tvm.raw_ops, name)
    args = {k: np.int64(v) if k == "seq_len_max" else v for k, v in inputs.items()}
    target = ctx.get("target", "llvm")
    if len(item["ops"]) == 1:
        return Runner(lambda: fn(**args, use_peephole=False, target=target),
                      f"lstm_tvm.raw_ops.{name}", keep=args)

    def call():
        grads = fn(**args, use_peephole=False, target=target)
        return lstm_tvm.cell_grad_matmul(args["x"], args["h_prev"], args["w"], grads.dicfo,
                                         target=target)

    return Runner(call, "raw_ops.LSTMBlockCellGrad + cell_grad_matmul", keep=args)


# --- TensorFlow -------------------------------------------------------------------------------

def make_tf(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """Eager ``tf.raw_ops`` calls on ``tf.constant`` inputs made beforehand."""
    import tensorflow as tf

    name = item["ops"][0]
    consts = {k: tf.constant(int(v), tf.int64) if k == "seq_len_max" else tf.constant(v)
              for k, v in inputs.items()}
    raw = getattr(tf.raw_ops, name)
    if len(item["ops"]) == 1:
        return Runner(lambda: raw(**consts, use_peephole=False), f"tf.raw_ops.{name}",
                      keep=consts)
    I = inputs["x"].shape[1]

    def call():  # as TF's Python gradient of LSTMBlockCell (lstm_ops._LSTMBlockCellGrad)
        grads = raw(**consts, use_peephole=False)
        xh = tf.concat([consts["x"], consts["h_prev"]], 1)
        xh_grad = tf.linalg.matmul(grads.dicfo, consts["w"], transpose_b=True)
        return (xh_grad[:, :I], xh_grad[:, I:],
                tf.linalg.matmul(xh, grads.dicfo, transpose_a=True),
                tf.raw_ops.BiasAddGrad(out_backprop=grads.dicfo))

    return Runner(call, "raw_ops.LSTMBlockCellGrad + 2 MatMul + BiasAddGrad", keep=consts)


# --- PyTorch ----------------------------------------------------------------------------------

def _torch_module(item: dict, inputs: dict, dtype: str):
    """nn.LSTM or nn.LSTMCell with the case's weights, gates reordered to torch's i, f, g, o."""
    import torch

    _, _, I, H = _sizes(inputs)
    cols = np.concatenate([np.arange(H) + H * item["layout"].index(g) for g in "IFCO"])
    bias = inputs["b"][cols].astype(np.float32)
    bias[H:2 * H] += item["forget_bias"]
    seq = item["case"].startswith("seq")
    mod = torch.nn.LSTM(I, H) if seq else torch.nn.LSTMCell(I, H)
    suffix = "_l0" if seq else ""
    with torch.no_grad():
        w = inputs["w"].astype(np.float32)
        getattr(mod, f"weight_ih{suffix}").copy_(torch.from_numpy(w[:I, cols].T.copy()))
        getattr(mod, f"weight_hh{suffix}").copy_(torch.from_numpy(w[I:, cols].T.copy()))
        getattr(mod, f"bias_ih{suffix}").copy_(torch.from_numpy(bias))
        getattr(mod, f"bias_hh{suffix}").zero_()
    return mod.to(getattr(torch, dtype))


def make_torch(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """nn.LSTM / nn.LSTMCell forward, or ``backward()`` alone after an untimed forward."""
    import torch

    mod = _torch_module(item, inputs, dtype)
    seq = item["case"].startswith("seq")
    t = {k: torch.from_numpy(inputs[k]).requires_grad_() for k in ("x", "cs_prev", "h_prev")}
    state = (t["h_prev"][None], t["cs_prev"][None]) if seq else (t["h_prev"], t["cs_prev"])
    name = "nn.LSTM" if seq else "nn.LSTMCell"
    if item["case"].endswith("fwd"):
        return Runner(lambda: mod(t["x"], state), f"{name} forward (autograd on)",
                      keep=(mod, t))
    h_grad, cs_grad = torch.from_numpy(inputs["h_grad"]), torch.from_numpy(inputs["cs_grad"])
    graph = {}

    def prepare():  # untimed: fresh gradients and a fresh forward graph
        for p in list(mod.parameters()) + list(t.values()):
            p.grad = None
        graph["out"] = mod(t["x"], state)

    def call():
        if seq:  # the per-step outputs get h_grad; torch exposes no per-step cell state
            graph["out"][0].backward(h_grad)
        else:
            torch.autograd.backward(graph["out"], (h_grad, cs_grad))

    return Runner(call, f"{name} backward() only", prepare=prepare, keep=(mod, t, graph))


# --- ONNX Runtime -----------------------------------------------------------------------------

def make_ort(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """ONNX Runtime's built-in ``LSTM`` (the standard ONNX op, CPU execution provider) with the
    case's weights, gates reordered to ONNX's i, o, f, c; inputs fed as NumPy arrays."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    T, B, I, H = _sizes(inputs)
    cols = np.concatenate([np.arange(H) + H * item["layout"].index(g) for g in "IOFC"])
    bias = inputs["b"][cols].astype(np.float32)
    bias[2 * H:3 * H] += item["forget_bias"]
    w = inputs["w"].astype(np.float32)
    weights = [numpy_helper.from_array(w[:I, cols].T[None].copy(), "W"),
               numpy_helper.from_array(w[I:, cols].T[None].copy(), "R"),
               numpy_helper.from_array(np.concatenate([bias, np.zeros_like(bias)])[None], "B")]
    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["X", "W", "R", "B", "", "initial_h", "initial_c"],
                          ["Y", "Y_h", "Y_c"], hidden_size=H)],
        "lstm", [helper.make_tensor_value_info("X", elem, [T, B, I]),
                 helper.make_tensor_value_info("initial_h", elem, [1, B, H]),
                 helper.make_tensor_value_info("initial_c", elem, [1, B, H])],
        [helper.make_tensor_value_info("Y", elem, [T, 1, B, H]),
         helper.make_tensor_value_info("Y_h", elem, [1, B, H]),
         helper.make_tensor_value_info("Y_c", elem, [1, B, H])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.get("threads", 0)
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    feeds = {"X": inputs["x"], "initial_h": inputs["h_prev"][None],
             "initial_c": inputs["cs_prev"][None]}
    return Runner(lambda: sess.run(None, feeds), "onnxruntime LSTM (CPU EP)", keep=(sess, feeds))


# --- NumPy roofline ---------------------------------------------------------------------------

def make_numpy(item: dict, inputs: dict, dtype: str, ctx: dict) -> Runner:
    """float32 GEMM(s) of the case's FLOPs; for ``cell_bwd`` a copy moving the case's bytes."""
    T, B, I, H = _sizes(inputs)
    rng = np.random.default_rng(0)
    if item["case"] == "cell_bwd":
        half = item["bytes"] // 2
        # np.full writes every page now (np.zeros' calloc would defer it into the timed calls).
        src, dst = rng.integers(0, 255, half, dtype=np.uint8), np.full(half, 0, np.uint8)
        return Runner(lambda: np.copyto(dst, src), f"memcpy {half / 1e6:.3g} MB (read+write)",
                      keep=(src, dst))
    m = T * B
    a = rng.standard_normal((m, I + H), dtype=np.float32)
    b = rng.standard_normal((I + H, 4 * H), dtype=np.float32)
    c = np.full((m, 4 * H), 0.0, np.float32)
    n = 1 if item["case"].endswith("fwd") else 2

    def call():
        for _ in range(n):
            np.matmul(a, b, out=c)

    times = f" x{n}" if n > 1 else ""
    return Runner(call, f"f32 GEMM ({m},{I + H})@({I + H},{4 * H}){times}", keep=(a, b, c))


MAKERS = {"lstm_tvm": make_lstm_tvm, "bound": make_bound, "raw_ops": make_raw_ops, "tf": make_tf,
          "torch": make_torch, "ort": make_ort, "numpy": make_numpy}


# --- worker -----------------------------------------------------------------------------------

def configure_threads(impl: str, threads: int) -> None:
    """Set the runtime's thread counts before it starts (env variables come from the parent)."""
    if impl == "tf":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    elif impl == "torch":
        import torch

        torch.set_num_threads(threads)


def _load(path: str) -> dict:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def run_item(job: dict, item: dict, ctx: dict) -> dict:
    """Build, call once on the tiny inputs, then measure one (shape, case); never raises."""
    res = {"impl": job["impl"], "shape": item["shape"], "case": item["case"], "status": "ok"}
    make = MAKERS[job["impl"]]
    try:
        tiny = make(dict(item, bytes=128), _load(item["tiny_inputs"]), job["dtype"], ctx)
        tiny.prepare()
        tiny.call()
        runner = make(item, _load(item["inputs"]), job["dtype"], ctx)
        res.update(what=runner.what, compile_s=runner.compile_s, cached=runner.cached)
        res.update(measure(runner, job["warmup"], job["repeat"]))
        del tiny, runner
    except ImportError as exc:
        res.update(status="not installed", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # e.g. a dtype PyTorch has no CPU kernel for: report, go on
        res.update(status="n/a", error=f"{type(exc).__name__}: {exc}")
    return res


def run_job(job: dict, out_path: Path) -> list[dict]:
    """Run every item of ``job``, rewriting ``out_path`` after each (a crash keeps the rest)."""
    results = []
    try:
        configure_threads(job["impl"], job["threads"])
    except ImportError:
        pass  # each item then reports "not installed"
    ctx: dict = {"threads": job["threads"], "target": job.get("target", "llvm")}
    for item in job["items"]:
        results.append(run_item(job, item, ctx))
        out_path.write_text(json.dumps(results))
        print(DONE_MARK, flush=True)
    return results


def main(argv=None) -> int:
    """Worker entry point: ``python lstm_tvm/bench/worker.py JOB.json OUT.json``."""
    argv = sys.argv[1:] if argv is None else argv
    here = str(Path(__file__).resolve().parent)
    # Run as a script: import lstm_tvm (the lstm_tvm worker) as the package, not its folder.
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    sys.path.insert(0, str(Path(here).parents[1]))
    job = json.loads(Path(argv[0]).read_text())
    run_job(job, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
