"""``lstm-tvm bench``: lstm_tvm against TF, PyTorch and the NumPy GEMM roofline
(:mod:`lstm_tvm.bench` runs it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..bench import train as bench_train
from ..bench import worker as peers
from ..bench.cli_common import parse_shapes, split_choices
from ..bench.harness import DEFAULT_SHAPES, ISAS, LATENCY_SHAPES, run
from ..bench.report import WIDTH, render
from ..bench.train import DEFAULT_SHAPES as TRAINING_SHAPES
from ..env import usable_cores
from ..registry import DTYPES

__all__ = ["command"]


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--shapes", default=",".join("x".join(map(str, s)) for s in DEFAULT_SHAPES),
              show_default=True, help="Comma list of TxBxIxH.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="lstm_tvm, TF and torch dtype (the roofline is always float32).")
@click.option("--repeat", default=7, show_default=True, type=click.IntRange(1),
              help="Timed calls per case; the median is reported.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0),
              help="Untimed calls before the timed ones.")
@click.option("--threads", type=click.IntRange(1), default=usable_cores(),
              show_default="all cores", help="Threads of every runtime.")
@click.option("--only", default=",".join(peers.IMPLS), show_default=True,
              help="Comma list of implementations to run.")
@click.option("--cases", default=",".join(peers.CASES), show_default=True,
              help="Comma list of cases.")
@click.option("--v2", is_flag=True, help="Sequence cases use BlockLSTMV2 / BlockLSTMGradV2.")
@click.option("--isolate", type=click.Choice(["case", "impl"]), default="case",
              show_default=True, help="One worker process per (impl, shape, case) or per impl.")
@click.option("--timeout", default=1800.0, show_default=True, help="Seconds per worker.")
@click.option("--no-cache", is_flag=True, help="Compile into a fresh cache (real compile times).")
@click.option("--seed", default=0, show_default=True, help="Seed of the inputs.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results as JSON to this file.")
@click.option("--wide", is_flag=True,
              help=f"Print every column (min ms, GB/s, peak MiB, compile s, what was timed) "
                   f"and the n/a rows; by default the output fits {WIDTH} columns.")
@click.option("--isa", type=click.Choice(list(ISAS)), default="native", show_default=True,
              help="avx2: lstm_tvm builds for an AVX2-only x86 (x86-64-v3) and PyTorch is "
                   "capped at AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), on this machine.")
@click.option("--latency", is_flag=True,
              help="Deployment latency: shapes " + ",".join("x".join(map(str, s))
                                                          for s in LATENCY_SHAPES)
                   + " (T=100, B=1/4/8, I=H=256/512, and a tiny op for per-call overhead) "
                   "unless --shapes is given.")
@click.option("--training", is_flag=True,
              help="A training step (forward + backward) through lstm_tvm.torch and "
                   "lstm_tvm.tf against nn.LSTM and TF's BlockLSTM, and the bare kernels: "
                   "shapes " + ",".join("x".join(map(str, s)) for s in TRAINING_SHAPES)
                   + " unless --shapes is given (--only, --cases and --dtype do not apply).")
@click.option("--no-input-grad", "input_grad", flag_value=False, default=True,
              help="With --training: steps whose input x needs no gradient (a first layer "
                   "fed data); lstm_tvm's backward then leaves out x's gradient.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1),
              help="Run every case (with --training: every impl and shape) in this many "
                   "processes, round after round; report the median of their medians and "
                   "how far apart the processes were.")
def command(shapes, only, cases, json_path, latency, wide, training, rounds, input_grad,
            **opts):
    """Time lstm_tvm, TF (tf.raw_ops), PyTorch (nn.LSTM) and a NumPy GEMM roofline.

    One worker process per implementation and case (--isolate case) times the median of
    --repeat calls and measures the peak extra RSS; the table shows medians, GFLOP/s and
    lstm_tvm's speed ratios (--wide adds min ms, GB/s, peak MiB, compile s and what was timed;
    --json writes every figure with the machine, the versions, the date and the command).
    Peers that are not installed are reported as such. Exits with status 1 if an lstm_tvm case
    did not run.
    """
    default = shapes == ",".join("x".join(map(str, s)) for s in DEFAULT_SHAPES)
    if default and (latency or training):
        shapes = ",".join("x".join(map(str, s)) for s in (TRAINING_SHAPES if training
                                                            else LATENCY_SHAPES))
    try:
        opts["shapes"] = parse_shapes(shapes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes") from None
    if training:
        report = bench_train.run(opts["shapes"], threads=opts["threads"],
                                 warmup=max(opts["warmup"], 1), repeat=opts["repeat"],
                                 rounds=rounds, timeout=opts["timeout"],
                                 input_grad=input_grad)
        click.echo(bench_train.render(report))
        if json_path is not None:
            json_path.write_text(json.dumps(report, indent=2) + "\n")
        failed = [r for r in report["results"] if r["impl"] in ("kernels", "lstm_tvm.torch",
                                                                "lstm_tvm.tf")
                  and r["status"] not in ("ok", "not installed")]
        sys.exit(1 if failed else 0)
    opts["only"] = split_choices(only, peers.IMPLS, "--only")
    opts["cases"] = split_choices(cases, peers.CASES, "--cases")
    opts["rounds"] = rounds
    report = run(opts)
    click.echo(render(report, wide=wide))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    if any(r["impl"] == "lstm_tvm" and r["status"] != "ok" for r in report["results"]):
        sys.exit(1)
