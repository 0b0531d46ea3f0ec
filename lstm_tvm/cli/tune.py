"""``lstm-tvm tune``: a MetaSchedule tuning session."""

from __future__ import annotations

import time

import click

from ..bench.cli_common import format_table, parse_shapes, split_choices, target_option
from ..bench import DEFAULT_SHAPES
from ..registry import DTYPES, OPS
from ..targets import resolve


@click.command("tune")
@click.option("--ops", "ops_", default=",".join(OPS), show_default="all six",
              help=f"Comma list of ops whose GEMM blocks to tune, among {', '.join(OPS)}.")
@click.option("--dtype", "dtypes", default="float32", show_default=True,
              help="Comma list of dtypes (float32, float16).")
@click.option("--shapes", default=",".join("x".join(map(str, s)) for s in DEFAULT_SHAPES),
              show_default=True,
              help="Comma list of TxBxIxH shapes to tune at (the benchmark's by default).")
@target_option(kinds=("llvm",), verb="tunes")
@click.option("--trials", default=32, show_default=True, type=click.IntRange(1),
              help="Distinct measured schedules each task should have on record, at most as "
                   "many as its tile space holds (resumes: tasks already in the database are "
                   "topped up).")
@click.option("--schedules-dir", type=click.Path(file_okay=False),
              help="Root of the databases written (default: the user's records, "
                   "LSTM_TVM_SCHEDULES_DIR or the platform's user data folder; see "
                   "`lstm-tvm schedules`).")
@click.option("--seed", type=int, help="Seed of the search (default: random).")
@click.option("--rpc-tracker", metavar="HOST:PORT",
              help="Measure on the devices of this TVM RPC tracker instead of this machine "
                   "(with --rpc-key; --target names the devices' CPU).")
@click.option("--rpc-key", metavar="KEY",
              help="Key the devices' RPC servers registered with at --rpc-tracker.")
@click.option("--rpc-wait", default=30.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for a server of --rpc-key before giving up.")
def command(ops_, dtypes, shapes, target, trials, schedules_dir, seed, rpc_tracker, rpc_key,
            rpc_wait):
    """Tune the GEMM blocks of the requested kernels with MetaSchedule.

    Every distinct GEMM block (per op, dtype and shape) becomes a static-shape task; the
    search measures up to --trials tile schedules each and commits every measurement to
    MetaSchedule's JSON database under <schedules>/<records key>/ as it goes (interrupt and
    rerun to continue). compile() and raw_ops use the best record of each block for kernels
    of the same target, input and cell size, whatever T and B.

    With --rpc-tracker and --rpc-key the candidates run on the tracker's servers of that key
    (python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY on each device), and the
    records land under --target's records key.
    """
    resolved = resolve(target)
    from ..cross_compile import CrossCompilerMissing
    from ..tuning.database import database_dir
    from ..tuning.remote import RemoteError, Tracker, parse_address
    from ..tuning.session import exhaustion_report, tune

    tracker = None
    if bool(rpc_tracker) != bool(rpc_key):
        raise click.UsageError("--rpc-tracker and --rpc-key go together: the tracker's address "
                               "and the key its devices' servers registered with")
    if rpc_tracker:
        try:
            host, port = parse_address(rpc_tracker)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--rpc-tracker") from None
        tracker = Tracker(host, port, rpc_key, wait=rpc_wait)

    ops = split_choices(ops_, OPS, "--ops")
    dts = split_choices(dtypes, DTYPES, "--dtype")
    try:
        shape_list = parse_shapes(shapes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shapes") from None
    start = time.perf_counter()
    try:
        results = tune(ops, dts, shape_list, resolved, trials, root=schedules_dir, seed=seed,
                       tracker=tracker)
    except (ValueError, RemoteError, CrossCompilerMissing) as exc:
        raise click.ClickException(str(exc)) from None
    rows = []
    for r in results:
        b = r.best
        rows.append((r.task.key, str(r.trials), "-" if b is None else f"{b.seconds * 1e3:.3f}",
                     "-" if b is None else f"{b.gflops:.1f}", "-" if b is None else b.tile))
    click.echo(format_table(("task", "trials", "best ms", "GFLOP/s", "schedule"), rows,
                            right=(1, 2, 3)))
    for line in exhaustion_report(results):
        click.echo(line)
    failures = sum(r.failed for r in results)
    if failures:
        click.echo(f"{failures} measurement{'s' if failures > 1 else ''} failed (recorded as "
                   f"failed, tried again by the next run); MetaSchedule's logs say why")
    click.echo(f"{len(results)} tasks, database {database_dir(resolved, schedules_dir)}, "
               f"{time.perf_counter() - start:.0f} s")

