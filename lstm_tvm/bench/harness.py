"""The benchmark behind ``lstm-tvm bench`` (:mod:`lstm_tvm.cli.bench`): lstm_tvm against TF
2.21, PyTorch and a NumPy GEMM roofline, one table.

For each shape ``(T, B, I, H)`` and case (sequence forward and backward, cell forward, cell
backward with and without the matmul part) it times every implementation on inputs made
beforehand and prints medians, GFLOP/s, GB/s (cell cases), peak extra memory and the speed
ratios of lstm_tvm. Each (implementation, shape, case) runs in its own worker process
(:mod:`lstm_tvm.bench.worker`, ``--isolate case``), so thread pools and RSS high-water marks
never mix; ``--isolate impl`` runs one worker per implementation instead (faster start-up).

What is timed (``median`` of ``--repeat`` calls after ``--warmup`` untimed ones):

- lstm_tvm: the :class:`~lstm_tvm.api.CompiledOp` call (with its input checks) on TVM tensors
  made beforehand, outputs reused with ``out=``; compiling is outside, reported as ``compile s``.
  bound: the same with ``w`` bound (:meth:`~lstm_tvm.api.CompiledOp.bind`: the sequence ops'
  and ``LSTMBlockCell``'s weights packed once, outside the timed calls, as ONNX Runtime packs
  its initializers).
- TF: the eager ``tf.raw_ops.<Op>(...)`` call on ``tf.constant`` inputs (eager dispatch, about
  tens of microseconds, is included; outputs are allocated by TF in every call).
- PyTorch: ``nn.LSTM`` / ``nn.LSTMCell`` forward with autograd on (it saves what backward needs,
  as BlockLSTM outputs its activations); for the backward cases the forward runs untimed before
  each call and only ``backward()`` is timed (gradients of x, h0, c0 and the weights).
- NumPy: float32 ``matmul`` of ``(T*B, I+H) x (I+H, 4H)`` (once forward, twice backward: the
  case's FLOPs), whatever ``--dtype``; ``cell bwd (gates only)`` has no GEMM, so its roofline is
  a copy moving the case's bytes.

Before the workers start, the bench measures this machine's limits
(:mod:`lstm_tvm.bench.limits`: the float32 FMA peak on the bench's threads, and how fast each
core streams its slice of ``W_h``) and gives each row how far it is from them: the fraction of
the FMA peak it reaches, and at a batch of at most 2 its median over a floor
(:func:`lstm_tvm.bench.limits.floor_s`: the passes over ``W_h`` at the measured streaming rate
and the other GEMM FLOPs at the peak).

The report (``--json``) holds every row and, in ``meta``, the machine, its limits, the package
versions, the date and the command that repeats the run; :mod:`lstm_tvm.bench.report` prints
it and makes the documentation's performance page from it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np

from ..env import usable_cores
from ..registry import forget_bias_of, get_op
from . import limits as bench_limits
from . import worker as peers
from .cli_common import parse_shapes
from .limits import case_flops

__all__ = ["DEFAULT_SHAPES", "LATENCY_SHAPES", "run", "parse_shapes", "case_ops", "case_flops",
           "case_bytes", "command_line", "measure_limits"]

DEFAULT_SHAPES = ((32, 16, 128, 128), (64, 32, 256, 256), (100, 64, 512, 512))
#: ``lstm-tvm bench --latency``: deployment batch sizes, and a tiny op for per-call overhead.
LATENCY_SHAPES = tuple((100, b, n, n) for n in (256, 512) for b in (1, 4, 8)) + ((1, 1, 16, 16),)
PEER_NAMES = {"lstm_tvm": "lstm_tvm", "tf": "TF", "torch": "torch", "ort": "ORT",
              "numpy": "roofline"}
#: ``--isa``: what each implementation may use. ``avx2``: lstm_tvm builds for an AVX2-only
#: x86 (``x86-64-v3``: Haswell's instruction sets), PyTorch's oneDNN and ATen kernels are
#: capped at AVX2 through their environment variables.
ISAS = {"native": ({}, None), "avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2",
                                         "ATEN_CPU_CAPABILITY": "avx2"}, "x86-64-v3")}
#: Rows whose speed ratios against the peers are shown: lstm_tvm's three paths.
OURS = ("lstm_tvm", "bound", "raw_ops")


def case_ops(case: str, v2: bool = False) -> tuple[str, ...]:
    """The op(s) a case runs in lstm_tvm and TF; ``v2`` picks the V2 sequence ops."""
    v = "V2" if v2 else ""
    return {"seq_fwd": (f"BlockLSTM{v}",), "seq_bwd": (f"BlockLSTMGrad{v}",),
            "cell_fwd": ("LSTMBlockCell",), "cell_bwd": ("LSTMBlockCellGrad",),
            "cell_bwd_full": ("LSTMBlockCellGrad", "CellGradMatmul")}[case]


def case_bytes(case: str, dtype: str, T: int, B: int, I: int, H: int) -> int:
    """Bytes of all inputs and outputs of a case's op(s) at ``dtype`` (``dicfo`` counted once)."""
    sizes = {"T": T, "B": B, "I": I, "H": H}
    elems = {}
    for name in case_ops(case):  # a tensor two ops share (dicfo, x, w, ...) counts once
        for spec in get_op(name).inputs + get_op(name).outputs:
            if spec.dtype == "T":
                elems.setdefault(spec.name, int(np.prod(spec.concrete_shape(sizes))))
    return sum(elems.values()) * np.dtype(dtype).itemsize


def machine() -> dict:
    """The CPU: its model name, vendor, family and model (from /proc/cpuinfo; a VM may report
    only a generic name), LLVM's name for it (``mcpu``), its widest vector extension, the key
    its tuning records go under, and the number of usable cores."""
    from ..targets import host_cpu, resolve_target
    from ..schedule.traits import cpu_traits
    from ..tuning.database import records_key

    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    target = resolve_target("llvm")
    return {"cpu": fields.get("model name", "unknown CPU"), "vendor": fields.get("vendor_id"),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "mcpu": host_cpu(), "extension": cpu_traits(target).extension,
            "records_key": records_key(target), "cores": usable_cores()}


def describe_machine(m: dict) -> str:
    """``machine()`` in one phrase, as the bench headers print it."""
    ident = " ".join(f"{k} {m[k]}" for k in ("family", "model") if m.get(k) is not None)
    vendor = f"{m['vendor']} {ident}".strip() if m.get("vendor") else ident
    return (f"{m['cpu']}{f' ({vendor})' if vendor else ''}, LLVM mcpu {m.get('mcpu', '?')}, "
            f"{m.get('extension', '?')}, records key {m.get('records_key', '?')}, "
            f"{m['cores']} cores")


def versions() -> dict:
    """Installed versions of the measured packages (None when missing), without importing them."""
    out = {}
    for dist in ("lstm-tvm", "apache-tvm", "tensorflow-cpu", "tensorflow", "torch", "onnxruntime",
                 "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def command_line(opts: dict) -> str:
    """The ``lstm-tvm bench`` command that repeats a run of ``opts``: every option that changes
    the figures spelled out, ``--threads`` only where it is not all usable cores, no ``--json``."""
    shapes = ",".join("x".join(map(str, s)) for s in opts["shapes"])
    words = ["lstm-tvm", "bench", "--shapes", shapes, "--cases", ",".join(opts["cases"]),
             "--only", ",".join(opts["only"]), "--dtype", opts["dtype"],
             "--repeat", str(opts["repeat"]), "--warmup", str(opts["warmup"]),
             "--isolate", opts["isolate"], "--isa", opts.get("isa", "native"),
             "--seed", str(opts["seed"])]
    words += ["--rounds", str(opts["rounds"])] * (opts.get("rounds", 1) > 1)
    words += ["--threads", str(opts["threads"])] * (opts["threads"] != usable_cores())
    words += ["--v2"] * bool(opts["v2"]) + ["--no-cache"] * bool(opts["no_cache"])
    return shlex.join(words)


# --- planning -----------------------------------------------------------------------------------

def _write_inputs(folder: Path, shape, case: str, opts: dict, done: dict) -> dict:
    """Write (once) the real and tiny inputs of a case's first op; return the item's fields."""
    T, B, I, H = shape
    op = get_op(case_ops(case, opts["v2"])[0])
    from ..testing import make_inputs

    paths = []
    for t, b in ((T, B), (1, 1)):
        key = (op.name, t, b, I, H)
        if key not in done:
            done[key] = str(folder / f"in{len(done)}.npz")
            np.savez(done[key], **make_inputs(
                op.name, dtype=opts["dtype"], B=b, I=I, H=H, seed=opts["seed"],
                T=t if op.kind == "sequence" else None, attrs={"use_peephole": False}))
        paths.append(done[key])
    fwd = op if op.direction == "forward" else get_op(op.pair)
    return {"inputs": paths[0], "tiny_inputs": paths[1], "layout": op.gate_layout,
            "forget_bias": forget_bias_of(fwd, fwd.defaults()),
            "bytes": case_bytes(case, opts["dtype"], T, B, I, H)}


def plan(opts: dict, folder: Path, bar=None) -> tuple[list[dict], list[dict]]:
    """Worker jobs (inputs written to ``folder``), and rows decided without running."""
    jobs, fixed, done = {}, [], {}
    items = [(s, c, i) for s in opts["shapes"] for c in opts["cases"] for i in opts["only"]]
    for shape, case, impl in items:
        row = {"impl": impl, "shape": list(shape), "case": case}
        if (impl, case) in peers.NOT_APPLICABLE:
            fixed.append(dict(row, status="n/a", error=peers.NOT_APPLICABLE[impl, case]))
        elif not peers.is_installed(impl):
            fixed.append(dict(row, status="not installed",
                              error=f"package {peers.PACKAGES[impl]!r} not found"))
        else:
            item = dict(row, ops=case_ops(case, opts["v2"]),
                        **_write_inputs(folder, shape, case, opts, done))
            key = impl if opts["isolate"] == "impl" else (impl, tuple(shape), case)
            jobs.setdefault(key, {"impl": impl, "items": []})["items"].append(item)
        if bar is not None:
            bar.update(1)
    common = {k: opts[k] for k in ("dtype", "threads", "warmup", "repeat", "v2", "seed")}
    mcpu = ISAS[opts.get("isa", "native")][1]
    common["target"] = ("llvm" if mcpu is None else
                        {"kind": "llvm", "mcpu": mcpu, "num-cores": opts["threads"]})
    return [dict(job, **common) for job in jobs.values()], fixed


def worker_env(threads: int, isa: str = "native") -> dict:
    """The workers' environment: every runtime's thread count and, with ``isa``, its
    instruction-set cap (:data:`ISAS`), set before it starts."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **ISAS[isa][0])
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def run_worker(job: dict, folder: Path, env: dict, timeout: float, bar) -> list[dict]:
    """Run one job in a fresh process; items it did not finish become error rows."""
    n = len(list(folder.glob("job*.json")))
    job_path, out_path, err_path = (folder / f"job{n}.json", folder / f"out{n}.json",
                                    folder / f"err{n}.txt")
    job_path.write_text(json.dumps(job))
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, peers.__file__, str(job_path), str(out_path)],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        timed_out = threading.Event()
        timer = threading.Timer(timeout, lambda: (timed_out.set(), proc.kill()))
        timer.start()
        for line in proc.stdout:
            if line.startswith(peers.DONE_MARK):
                bar.update(1)
        proc.wait()
        timer.cancel()
    results = json.loads(out_path.read_text()) if out_path.exists() else []
    status = "timeout" if timed_out.is_set() else "error"
    tail = err_path.read_text()[-600:].strip()
    for item in job["items"][len(results):]:
        bar.update(1)
        results.append({"impl": job["impl"], "shape": item["shape"], "case": item["case"],
                        "status": status, "error": f"worker exit {proc.returncode}: {tail}"})
    return results


def measure_limits(opts: dict) -> dict:
    """This machine's limits for a run of ``opts`` (:func:`lstm_tvm.bench.limits.measure`): the
    FMA peak on ``opts["threads"]`` threads, built for the ISA lstm_tvm is built for
    (``--isa``), and the streaming of ``W_h`` at ``I = H = 256`` float32 and at every ``H``
    whose floor the run needs."""
    from tqdm import tqdm

    sizes = bench_limits.needed_wh_bytes(opts["shapes"], opts["cases"],
                                         np.dtype(opts["dtype"]).itemsize)
    with tqdm(total=1, desc="limits", file=sys.stderr, disable=None, leave=False) as bar:
        limits = bench_limits.measure(opts["threads"], sizes,
                                      march=ISAS[opts.get("isa", "native")][1])
        bar.update(1)
    return limits


def run(opts: dict) -> dict:
    """Measure the limits, plan, run every worker and aggregate; returns ``{"meta": ...,
    "results": [...]}``."""
    from tqdm import tqdm

    start, load = time.perf_counter(), [os.getloadavg()[0]]
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    limits = measure_limits(opts)
    env = worker_env(opts["threads"], opts.get("isa", "native"))
    with tempfile.TemporaryDirectory(prefix="lstm-tvm-bench-") as tmp:
        folder = Path(tmp)
        if opts["no_cache"]:
            env["LSTM_TVM_CACHE_DIR"] = str(folder / "cache")
        n_items = len(opts["shapes"]) * len(opts["cases"]) * len(opts["only"])
        with tqdm(total=n_items, desc="inputs", file=sys.stderr, disable=None, leave=False) as bar:
            jobs, results = plan(opts, folder, bar)
        rounds = opts.get("rounds", 1)
        total = sum(len(j["items"]) for j in jobs) * rounds
        runs = []
        with tqdm(total=total, desc="bench", unit="case", file=sys.stderr, disable=None,
                  leave=False) as bar:
            for _ in range(rounds):
                for job in jobs:
                    bar.set_postfix_str(f"{job['impl']} {job['items'][0]['case']}")
                    runs += run_worker(job, folder, env, opts["timeout"], bar)
        results += combine_processes(runs)
    meta = {k: opts[k] for k in ("dtype", "threads", "repeat", "warmup", "isolate", "v2",
                                 "seed", "no_cache")}
    meta["rounds"] = opts.get("rounds", 1)
    meta["isa"] = opts.get("isa", "native")
    meta.update(shapes=[list(s) for s in opts["shapes"]], cases=opts["cases"],
                impls=opts["only"], machine=machine(), limits=limits, versions=versions(),
                sequence_ops=list(case_ops("seq_fwd", opts["v2"]) + case_ops("seq_bwd",
                                                                             opts["v2"])),
                load_avg=load + [os.getloadavg()[0]], wall_s=time.perf_counter() - start,
                python=platform.python_version(), date=date,
                command=command_line(opts))
    return {"meta": meta, "results": aggregate(results, opts, limits)}


# --- aggregation and output ---------------------------------------------------------------------

def median_of_processes(rows: list[dict]) -> dict:
    """One measurement made in several processes (each row with ``status`` and, where "ok",
    ``median_ms``): the first failure if a process failed, else the first row with the median
    of the processes' medians (``median_ms``) and the medians (``process_ms``)."""
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        return failed[0]
    medians = [r["median_ms"] for r in rows]
    return {**rows[0], "median_ms": float(np.median(medians)), "process_ms": medians}


def combine_processes(rows: list[dict]) -> list[dict]:
    """The rows of one case measured in several processes (``--rounds``) as one row each, in
    first-seen order (a case run once keeps its row): :func:`median_of_processes`, with every
    timed call (``times_ms``), ``process_spread`` (the slowest median over the fastest) and
    the largest ``peak_mib``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["impl"], tuple(r["shape"]), r["case"]), []).append(r)
    combined = []
    for group in groups.values():
        row = group[0] if len(group) == 1 else median_of_processes(group)
        if "process_ms" in row:
            medians = row["process_ms"]
            peaks = [r["peak_mib"] for r in group if r.get("peak_mib") is not None]
            row.update(times_ms=[t for r in group for t in r["times_ms"]],
                       process_spread=max(medians) / min(medians),
                       peak_mib=max(peaks) if peaks else None)
        combined.append(row)
    return combined


def aggregate(results: list[dict], opts: dict, limits: dict | None = None) -> list[dict]:
    """Sort rows as the table shows them and add FLOPs, GFLOP/s, GB/s, speed ratios and, with
    ``limits`` (:func:`measure_limits`), how far each row is from them
    (:func:`lstm_tvm.bench.limits.case_limits`: ``peak_fraction``, ``floor_ms``,
    ``over_floor``; the NumPy roofline runs no recurrence, so it gets no floor)."""
    order = {(tuple(s), c, i): k for k, (s, c, i) in enumerate(
        (s, c, i) for s in opts["shapes"] for c in opts["cases"] for i in opts["only"])}
    rows = sorted(results, key=lambda r: order[tuple(r["shape"]), r["case"], r["impl"]])
    ms = {(tuple(r["shape"]), r["case"], r["impl"]): r.get("median_ms") for r in rows
          if r["status"] == "ok"}
    for r in rows:
        T, B, I, H = r["shape"]
        r["label"] = peers.CASES[r["case"]]
        r["flops"] = case_flops(r["case"], T, B, I, H)
        r["bytes"] = case_bytes(r["case"], opts["dtype"], T, B, I, H)
        t = r.get("median_ms") if r["status"] == "ok" else None
        copy = r["impl"] == "numpy" and r["case"] == "cell_bwd"
        r["gflops"] = r["flops"] / (t * 1e6) if t and r["flops"] and not copy else None
        cell_row = r["case"].startswith("cell") and (r["impl"] != "numpy" or copy)
        r["gbs"] = r["bytes"] / (t * 1e6) if t and cell_row else None
        peers_ms = {p: ms.get((tuple(r["shape"]), r["case"], p))
                    for p in ("tf", "torch", "ort", "numpy")}
        for peer, their in peers_ms.items():
            mine = r["impl"] in OURS or (peer == "numpy" and r["impl"] != "numpy")
            r[f"vs_{PEER_NAMES[peer]}"] = their / t if t and their and mine else None
        kernel = ms.get((tuple(r["shape"]), r["case"], "lstm_tvm"))
        r["over_kernel"] = t / kernel if r["impl"] == "raw_ops" and t and kernel else None
        r.update(bench_limits.case_limits(limits, r["case"], r["shape"],
                                          np.dtype(opts["dtype"]).itemsize, t, r["gflops"]))
        if r["impl"] == "numpy":
            r.update(floor_ms=None, over_floor=None)
    return rows
