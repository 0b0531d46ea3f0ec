"""``lstm-tvm bench --training``: one training step (forward and backward of a sequence LSTM)
through each framework's route to lstm_tvm's kernels against the framework's own LSTM.

Implementations (each shape in its own worker process, so thread pools never mix):

- ``kernels``: lstm_tvm's ``BlockLSTM`` and ``BlockLSTMGrad`` as :class:`~lstm_tvm.api.CompiledOp`
  calls on TVM tensors made beforehand, outputs reused: the bare kernels, what the framework
  layers add to is measured against it;
- ``lstm_tvm.torch``: :class:`lstm_tvm.torch.LSTM`'s forward and ``backward()``;
- ``torch``: ``torch.nn.LSTM``'s forward and ``backward()``;
- ``lstm_tvm.tf``: :func:`lstm_tvm.tf.BlockLSTM` in a ``tf.function`` with a ``GradientTape``;
- ``tf``: ``tf.raw_ops.BlockLSTM`` the same way (TF's own kernels and gradient).

A step's loss is ``sum(h)`` over every step and batch row; its gradients are those of ``x``
and of the weights (``w`` and ``b``; ``nn.LSTM``: its four parameters), or of the weights
alone with ``input_grad=False`` (a first layer fed data: lstm_tvm's backward kernel then
computes no ``x_grad``, the bare kernels' row runs that kernel too). No peepholes, no clip,
float32, ``forget_bias=1`` where the op has one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np

from . import harness as _bench

__all__ = ["IMPLS", "DEFAULT_SHAPES", "run", "render", "measure_step", "paired_ratio"]

IMPLS = ("kernels", "lstm_tvm.torch", "torch", "lstm_tvm.tf", "tf")
#: T=100, I=H=256 at batches 1, 8 and 32.
DEFAULT_SHAPES = tuple((100, b, 256, 256) for b in (1, 8, 32))
_ATTRS = {"forget_bias": 1.0, "cell_clip": -1.0, "use_peephole": False}


def _inputs(T, B, I, H, seed=0) -> dict:
    from ..testing import make_inputs

    return make_inputs("BlockLSTM", T=T, B=B, I=I, H=H, seed=seed)


def _kernels_step(inputs: dict, threads: int, input_grad: bool):
    import lstm_tvm
    from .._tvm import tvm

    T, B, I = inputs["x"].shape
    H = inputs["cs_prev"].shape[1]
    fwd = lstm_tvm.compile("BlockLSTM", input_size=I, cell_size=H, **_ATTRS)
    grad = lstm_tvm.compile("BlockLSTMGrad", input_size=I, cell_size=H, use_peephole=False)
    if not input_grad:
        grad = grad._without(("x_grad",))
    dev = tvm.cpu()
    ins = {k: (v if k == "seq_len_max" else tvm.runtime.tensor(v, dev)) for k, v in inputs.items()}
    outs = fwd(**ins)
    ones = tvm.runtime.tensor(np.ones((T, B, H), np.float32), dev)
    zeros = tvm.runtime.tensor(np.zeros((T, B, H), np.float32), dev)
    grads = grad(**ins, **outs._asdict(), cs_grad=zeros, h_grad=ones)

    def step():
        fwd(**ins, out=outs)
        grad(**ins, **outs._asdict(), cs_grad=zeros, h_grad=ones, out=grads)
    return step


def _torch_step(inputs: dict, threads: int, ours: bool, input_grad: bool):
    import torch

    torch.set_num_threads(threads)
    T, B, I = inputs["x"].shape
    H = inputs["cs_prev"].shape[1]
    if ours:
        import lstm_tvm.torch as lt

        model = lt.LSTM(I, H, forget_bias=_ATTRS["forget_bias"])
    else:
        model = torch.nn.LSTM(I, H)
    x = torch.from_numpy(inputs["x"]).requires_grad_(input_grad)

    def step():
        model.zero_grad(set_to_none=True)
        x.grad = None
        out, _ = model(x)
        out.sum().backward()
    return step


def _tf_step(inputs: dict, threads: int, ours: bool, input_grad: bool):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    if ours:
        import lstm_tvm.tf as ltf

        block_lstm = ltf.BlockLSTM
    else:
        block_lstm = tf.raw_ops.BlockLSTM
    x = tf.constant(inputs["x"])
    w, b = tf.Variable(inputs["w"]), tf.Variable(inputs["b"])
    rest = {k: tf.constant(inputs[k]) for k in ("cs_prev", "h_prev", "wci", "wcf", "wco")}
    seq_len_max = tf.constant(int(inputs["seq_len_max"]), tf.int64)

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            if input_grad:
                tape.watch(x)
            out = block_lstm(seq_len_max=seq_len_max, x=x, w=w, b=b, **rest, **_ATTRS)
            loss = tf.reduce_sum(out.h)
        return tape.gradient(loss, [x, w, b] if input_grad else [w, b])

    def step():
        for g in grads():  # wait for the values, not only the dispatch
            g.numpy()
    return step


def measure_step(impl: str, shape, threads: int, warmup: int, repeat: int,
                 input_grad: bool = True) -> dict:
    """Median, mean and spread of ``repeat`` steps of ``impl`` at ``shape`` (T, B, I, H), after
    ``warmup`` untimed ones (the first builds, traces or compiles); with ``input_grad``, the
    step's gradients include ``x``'s. The mean is what a training loop gets: a few slow steps
    move it, not the median."""
    inputs = _inputs(*shape)
    makers = {"kernels": _kernels_step,
              "lstm_tvm.torch": lambda i, t, g: _torch_step(i, t, True, g),
              "torch": lambda i, t, g: _torch_step(i, t, False, g),
              "lstm_tvm.tf": lambda i, t, g: _tf_step(i, t, True, g),
              "tf": lambda i, t, g: _tf_step(i, t, False, g)}
    step = makers[impl](inputs, threads, input_grad)
    for _ in range(max(1, warmup)):
        step()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    ms = sorted(t * 1e3 for t in times)
    return {"median_ms": float(np.median(ms)), "mean_ms": float(np.mean(ms)), "min_ms": ms[0],
            "max_ms": ms[-1]}


def _worker(impl: str, shape, threads: int, warmup: int, repeat: int, timeout: float,
            input_grad: bool) -> dict:
    row = {"impl": impl, "shape": list(shape)}
    cmd = [sys.executable, "-m", "lstm_tvm.bench.train", impl, "x".join(map(str, shape)),
           str(threads), str(warmup), str(repeat), "x_grad" if input_grad else "no_x_grad"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TVM_NUM_THREADS=str(threads))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**row, "status": f"timed out after {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        missing = "ModuleNotFoundError" in done.stderr or "ImportError" in done.stderr
        return {**row, "status": "not installed" if missing else "failed", "error": last}
    return {**row, "status": "ok", **json.loads(lines[-1])}


def run(shapes=DEFAULT_SHAPES, impls=IMPLS, threads: int | None = None, warmup: int = 3,
        repeat: int = 15, rounds: int = 1, timeout: float = 900.0,
        progress: bool | None = None, input_grad: bool = True) -> dict:
    """Time a training step of every implementation at every shape, each (implementation,
    shape) in ``rounds`` processes of its own (round after round, so that a slow spell of the
    machine falls on every implementation alike); with ``input_grad`` False, steps whose
    ``x`` needs no gradient. Returns the report (``meta`` and ``results``: per
    (implementation, shape) the median of its processes' medians, their ``process_ms``, the
    mean step of them all, the fastest and slowest step)."""
    from .._progress import steps
    from ..env import usable_cores

    threads = threads or usable_cores()
    jobs = [(impl, tuple(shape)) for shape in shapes for impl in impls]
    runs: dict = {job: [] for job in jobs}
    with steps(len(jobs) * rounds, "bench --training", progress, unit="process") as bar:
        for _ in range(rounds):
            for impl, shape in jobs:
                bar.set_postfix_str(f"{impl} {'x'.join(map(str, shape))}")
                runs[(impl, shape)].append(_worker(impl, shape, threads, warmup, repeat,
                                                   timeout, input_grad))
                bar.update()
    meta = {"machine": _bench.machine(), "versions": _bench.versions(), "threads": threads,
            "warmup": warmup, "repeat": repeat, "rounds": rounds, "input_grad": input_grad,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": list(os.getloadavg())}
    return {"meta": meta, "results": [_combined(rows) for rows in runs.values()]}


def _combined(rows: list) -> dict:
    """One (implementation, shape)'s processes as one result
    (:func:`lstm_tvm.bench.harness.median_of_processes`), with the mean, fastest and slowest
    step of them all (every process times as many steps)."""
    row = _bench.median_of_processes(rows)
    if row["status"] == "ok":
        row.update(mean_ms=float(np.mean([r["mean_ms"] for r in rows])),
                   min_ms=min(r["min_ms"] for r in rows), max_ms=max(r["max_ms"] for r in rows))
    return row


def paired_ratio(num: dict, den: dict) -> float | None:
    """``num``'s time over ``den``'s (two results of one shape): with more than one round, the
    median of the rounds' ratios (each round ran both back to back, so a slow spell of the
    machine falls on both), else the ratio of the medians; None without both."""
    a, b = num.get("process_ms") or [], den.get("process_ms") or []
    if len(a) > 1 and len(a) == len(b):
        return float(np.median([x / y for x, y in zip(a, b)]))
    if num.get("median_ms") and den.get("median_ms"):
        return num["median_ms"] / den["median_ms"]
    return None


#: The implementation each row's ``speed-up vs own`` is taken against.
_PEERS = {"kernels": "torch", "lstm_tvm.torch": "torch", "lstm_tvm.tf": "tf"}


def render(report: dict) -> str:
    """The report as a table of at most 100 columns: each implementation's median and mean
    step, the fastest and slowest of its processes' medians (with more than one round), how
    much faster lstm_tvm's routes are than the framework's own LSTM (``speed-up vs own``: its
    time over ours; on the ``kernels`` row ``torch.nn.LSTM``'s over the bare kernels', the
    most a PyTorch layer over them could reach) and what a route adds to the bare kernels
    (``over kernels``), both by :func:`paired_ratio`."""
    from .cli_common import format_table

    meta = report["meta"]
    rounds = meta.get("rounds", 1)
    runs = (f"; median over {rounds} processes each, run in {rounds} rounds; ratios are "
            f"medians of the rounds' ratios" if rounds > 1 else "")
    grads = "" if meta.get("input_grad", True) else ", x needs no gradient"
    header = (f"machine: {_bench.describe_machine(meta['machine'])}. Training step (forward + "
              f"backward{grads}), float32, {meta['threads']} threads, median and mean of "
              f"{meta['repeat']} after {meta['warmup']} warm-up{runs}; load average "
              f"{meta['load_average'][0]:.2f}")
    lines = textwrap.wrap(header, 100, subsequent_indent="  ")
    by = {(r["impl"], tuple(r["shape"])): r for r in report["results"]}
    rows = []
    for r in report["results"]:
        shape = tuple(r["shape"])
        med = r.get("median_ms")
        peer = _PEERS.get(r["impl"])
        speed_up = over = None
        if peer:
            speed_up = paired_ratio(by.get((peer, shape), {}), r)
        if r["impl"] in ("lstm_tvm.torch", "lstm_tvm.tf"):
            over = paired_ratio(r, by.get(("kernels", shape), {}))
        spread = "-"
        if len(r.get("process_ms", ())) > 1:
            spread = f"{min(r['process_ms']):.2f}-{max(r['process_ms']):.2f}"
        mean = r.get("mean_ms")
        rows.append(["x".join(map(str, shape)), r["impl"],
                     f"{med:.3f}" if med else r["status"], f"{mean:.3f}" if mean else "-",
                     spread, "-" if speed_up is None else f"{speed_up:.2f}",
                     "-" if over is None else f"{(over - 1) * 100:+.1f}%"])
    lines.append(format_table(["TxBxIxH", "impl", "median ms", "mean ms", "processes ms",
                               "speed-up vs own", "over kernels"], rows))
    return "\n".join(lines)


def main(argv=None) -> int:
    """Worker: ``python -m lstm_tvm.bench.train IMPL TxBxIxH THREADS WARMUP REPEAT
    [x_grad|no_x_grad]``."""
    args = (argv or sys.argv[1:])
    impl, shape, threads, warmup, repeat = args[:5]
    input_grad = (args[5] if len(args) > 5 else "x_grad") == "x_grad"
    result = measure_step(impl, tuple(int(v) for v in shape.split("x")), int(threads),
                          int(warmup), int(repeat), input_grad)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
