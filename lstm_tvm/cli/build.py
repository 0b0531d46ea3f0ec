"""``lstm-tvm build``: compile, verify and time every (op, dtype, peephole) on one shape.

Each case is compiled for the target, run on one shape, checked output by output against the
float64 NumPy reference with the tolerances of :mod:`lstm_tvm.testing` and timed; one row per
case. Exits with status 1 if any row fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from .. import build as _build
from .. import env, reference, testing
from ..bench.cli_common import format_table, split_choices, target_option
from ..targets import missing_device_error, resolve_target
from ..api import compile as _compile
from ..bench.harness import describe_machine, machine
from ..registry import DTYPES, OPS
from ..tuning.database import describe_use, uses_table

__all__ = ["command"]


def _to_device(inputs: dict, dev) -> dict:
    """TVM tensors on ``dev`` for the float inputs; ``seq_len_max`` stays a Python int."""
    from .._tvm import tvm

    return {k: int(v) if k == "seq_len_max" else tvm.runtime.tensor(np.ascontiguousarray(v), dev)
            for k, v in inputs.items()}


def _verify(op_name: str, outputs, expected: dict, dtype: str) -> dict:
    """Max abs error (and its output) over all outputs, and the assert_close verdicts."""
    worst, max_err, failures = "", 0.0, []
    for name, tensor in zip(outputs._fields, outputs):
        actual = tensor.numpy().astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(actual - expected[name])
        err = float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0))
        if err >= max_err:
            worst, max_err = name, err
        try:
            testing.assert_close(actual, expected[name], dtype, f"{op_name}.{name}")
        except AssertionError as exc:
            failures.append(str(exc))
    return {"max_abs_err": max_err, "worst_output": worst, "failures": failures}


def _run_case(op_name: str, dtype: str, peephole: bool, opts: dict) -> dict:
    """Compile, run, verify and time one (op, dtype, peephole); never raises."""
    op = OPS[op_name]
    rtol, atol = testing.tolerance(dtype)
    row = {"op": op_name, "dtype": dtype, "use_peephole": peephole, "compile_s": None,
           "run_ms": None, "max_abs_err": None, "worst_output": "", "rtol": rtol, "atol": atol,
           "passed": False, "skipped": None, "failures": [], "records": None}
    attrs = {"use_peephole": peephole}
    try:
        inputs = testing.make_inputs(op_name, dtype=dtype, B=opts["batch"], I=opts["input_size"],
                                     H=opts["cell_size"], attrs=attrs, seed=opts["seed"],
                                     T=opts["seq_len"] if op.kind == "sequence" else None)
        start = time.perf_counter()
        compiled = _compile(op_name, target=opts["target"], dtype=dtype,
                            input_size=opts["input_size"], cell_size=opts["cell_size"], **attrs)
        row["compile_s"] = time.perf_counter() - start
        row["records"] = _records(compiled.spec)
        if compiled.func is None:  # built, but it cannot run here (CUDA, no GPU; another CPU)
            row["skipped"] = _no_device_reason(compiled)
            return row
        tensors = _to_device(inputs, compiled.device)
        outputs = compiled(**tensors)
        row.update(_verify(op_name, outputs, reference.run(op_name, inputs, attrs), dtype))
        times = []
        for _ in range(opts["repeat"]):
            start = time.perf_counter()
            compiled(**tensors, out=outputs)
            compiled.device.sync()
            times.append(time.perf_counter() - start)
        row["run_ms"] = 1e3 * statistics.median(times)
        row["passed"] = not row["failures"]
    except Exception as exc:  # a crashing case is a FAIL row, the others still run
        row["failures"].append(f"{type(exc).__name__}: {exc}")
    return row


def _records(spec) -> list[dict]:
    """Each GEMM block of a built kernel: the task whose record it took, and from where."""
    return [{"block": u.block, "task": None if u.best is None else u.best.task.key,
             "records": u.label, "key": None if u.source is None else u.source.key,
             "origin": None if u.source is None else u.source.origin}
            for u in _build.record_uses(spec)]


def _records_table(results) -> str:
    """The records each (op, dtype) built took, block by block (by peephole setting only where
    its kernels' blocks take different ones)."""
    cases: dict[tuple, dict[str, list]] = {}
    for r in results:
        if r["records"] is not None:
            uses = [(u["block"], u["records"]) for u in r["records"]]
            peephole = f"peephole {'on' if r['use_peephole'] else 'off'}"
            cases.setdefault((r["op"], r["dtype"]), {})[peephole] = uses
    rows = []
    for (op, dtype), by_peephole in cases.items():
        if len({repr(u) for u in by_peephole.values()}) == 1:
            rows.append(((op, dtype), next(iter(by_peephole.values()))))
        else:
            rows += [((op, f"{dtype} ({p})"), u) for p, u in by_peephole.items()]
    return uses_table(rows)


def _no_device_reason(compiled) -> str:
    """Why a built case was not run: ``"no CUDA device: cuda:0 is not present ..."``."""
    message = str(missing_device_error(compiled.op.name, compiled.device, compiled.target))
    return message.split(": ", 1)[1]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _result_rows(results):
    return [(r["op"], r["dtype"], "on" if r["use_peephole"] else "off", _fmt(r["compile_s"], ".2f"),
             _fmt(r["run_ms"], ".3f"), _fmt(r["max_abs_err"], ".2e"), r["worst_output"] or "-",
             f"{r['rtol']:g}/{r['atol']:g}", _verdict(r)) for r in results]


def _verdict(row: dict) -> str:
    return "PASS" if row["passed"] else "SKIP" if row["skipped"] else "FAIL"


@contextlib.contextmanager
def _fresh_cache(enabled: bool):
    """With ``enabled``, point ``LSTM_TVM_CACHE_DIR`` at a new temp dir (removed afterwards)."""
    if not enabled:
        yield env.cache_dir()
        return
    old = os.environ.get("LSTM_TVM_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="lstm-tvm-build-") as tmp:
        os.environ["LSTM_TVM_CACHE_DIR"] = tmp
        _build.clear_memory_cache()  # modules loaded earlier in this process would be reused
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop("LSTM_TVM_CACHE_DIR", None)
            else:
                os.environ["LSTM_TVM_CACHE_DIR"] = old


@click.command("build")
@click.option("--ops", "ops_", default=",".join(OPS), show_default="all six",
              help=f"Comma list of ops to build, among {', '.join(OPS)}.")
@click.option("--dtype", "dtypes", default=",".join(DTYPES), show_default=True,
              help="Comma list of dtypes.")
@click.option("--peephole", type=click.Choice(["off", "on", "both"]), default="both",
              show_default=True, help="Build with use_peephole off, on, or both.")
@target_option()
@click.option("--seq-len", default=16, show_default=True, type=click.IntRange(0),
              help="T (sequence ops).")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(0), help="B.")
@click.option("--input-size", default=32, show_default=True, type=click.IntRange(1), help="I.")
@click.option("--cell-size", default=32, show_default=True, type=click.IntRange(1), help="H.")
@click.option("--repeat", default=20, show_default=True, type=click.IntRange(1),
              help="Timed runs per case; the median is reported.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--no-cache", is_flag=True,
              help="Compile into a fresh temporary cache, so compile times are real.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JSON to this file.")
def command(ops_, dtypes, peephole, json_path, no_cache, **opts):
    """Compile, verify and time every (op, dtype, peephole) on one shape.

    Each case is compiled for the target (timed; a disk-cache hit is fast unless --no-cache),
    run once on random inputs and compared output by output with the float64 NumPy reference
    (lstm_tvm.reference) under the lstm_tvm.testing tolerances, then timed: the median of
    --repeat calls of the compiled op on TVM tensors made beforehand (no NumPy copies).
    Without the target's device (--target cuda on a machine without a GPU, or a CPU of another
    architecture: --target aarch64) each case is only compiled and reported as SKIP. Exits with
    status 1 if any case fails.
    """
    ops = split_choices(ops_, OPS, "--ops")
    dts = split_choices(dtypes, DTYPES, "--dtype")
    peeps = {"off": [False], "on": [True], "both": [False, True]}[peephole]
    cases = [(o, d, p) for o in ops for d in dts for p in peeps]
    from tqdm import tqdm

    with _fresh_cache(no_cache) as cache:
        results = []
        bar = tqdm(cases, desc="building", unit="case", file=sys.stderr, disable=None, leave=False)
        for op_name, dtype, peep in bar:
            bar.set_postfix_str(f"{op_name} {dtype} peephole={'on' if peep else 'off'}")
            results.append(_run_case(op_name, dtype, peep, opts))
    shape = {k: opts[k] for k in ("seq_len", "batch", "input_size", "cell_size")}
    click.echo(f"target: {opts['target']}   shape: T={shape['seq_len']} B={shape['batch']} "
               f"I={shape['input_size']} H={shape['cell_size']}   cache: "
               f"{'fresh temporary dir' if no_cache else cache}   repeat: {opts['repeat']}")
    click.echo(f"machine: {describe_machine(machine())}")
    click.echo(f"tuning records: {describe_use(resolve_target(opts['target']))}")
    click.echo(format_table(("op", "dtype", "peephole", "compile s", "run ms", "max abs err",
                             "worst", "tol (rtol/atol)", "result"),
                            _result_rows(results), right=(3, 4, 5)))
    click.echo("PASS: |actual - ref| <= atol * max(1, max|ref|) + rtol * |ref| for every output "
               "(lstm_tvm.testing.assert_close)")
    if any(r["records"] is not None for r in results):
        click.echo("tuning records by GEMM block (a block takes its own key's record, else the "
                   "borrowed key's):")
        click.echo(_records_table(results))
    failed = [r for r in results if not r["passed"] and not r["skipped"]]
    skipped = [r for r in results if r["skipped"]]
    for r in failed:
        click.echo(f"\nFAIL {r['op']} {r['dtype']} peephole={r['use_peephole']}:\n  "
                   + "\n  ".join(r["failures"]), err=True)
    if json_path is not None:
        payload = {"target": opts["target"], "shape": shape, "repeat": opts["repeat"],
                   "seed": opts["seed"], "no_cache": no_cache, "results": results,
                   "passed": not failed, "skipped": len(skipped)}
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
    click.echo(_summary_line(results, failed, skipped))
    if failed:
        sys.exit(1)


def _summary_line(results, failed, skipped) -> str:
    """``"n/N passed"``, with the skipped count and reasons when cases were built but not run."""
    line = f"{len(results) - len(failed) - len(skipped)}/{len(results)} passed"
    if not skipped:
        return line
    reasons = "; ".join(dict.fromkeys(r["skipped"] for r in skipped))
    return f"{line}, {len(skipped)} skipped (compiled, not run or verified)\nskipped: {reasons}"
