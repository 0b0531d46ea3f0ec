"""``lstm-tvm schedules``: which tuning records a target's kernels use, block by block, and
with ``--compare`` whether they beat the kernel without some of them
(:mod:`lstm_tvm.bench.records`)."""

from __future__ import annotations

import textwrap

import click

from .. import build as _build
from .. import env
from .._progress import steps
from ..bench.cli_common import format_table, parse_shapes, split_choices, target_option
from ..bench import DEFAULT_SHAPES
from ..bench.records import AGAINST, CALLS, compare
from ..bench.harness import describe_machine, machine
from ..registry import DTYPES, KERNEL_OPS, get_op
from ..targets import resolve
from ..tuning import database
from ..validation import plain_attrs

__all__ = ["command"]

#: The input and cell sizes of the benchmark's shapes, the sizes the shipped records are tuned at.
DEFAULT_SIZES = tuple(dict.fromkeys((i, h) for _, _, i, h in DEFAULT_SHAPES))


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"256x256,512x512"`` -> ``[(256, 256), (512, 512)]`` (I, H)."""
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        dims = part.lower().split("x")
        if len(dims) != 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise click.BadParameter(f"{part!r}: expected IxH with positive ints, e.g. 256x256",
                                     param_hint="--sizes")
        sizes.append((int(dims[0]), int(dims[1])))
    if not sizes:
        raise click.BadParameter("no size given", param_hint="--sizes")
    return list(dict.fromkeys(sizes))


@click.command("schedules")
@target_option()
@click.option("--ops", "ops_", default=",".join(KERNEL_OPS), show_default="all",
              help=f"Comma list of kernels to report, among {', '.join(KERNEL_OPS)}.")
@click.option("--dtype", "dtypes", default="float32", show_default=True,
              help="Comma list of dtypes (float32, float16).")
@click.option("--sizes", default=",".join(f"{i}x{h}" for i, h in DEFAULT_SIZES),
              show_default=True, help="Comma list of IxH (input and cell sizes) to report at.")
@click.option("--compare", "compare_shapes", default=None, metavar="SHAPES",
              help="Comma list of TxBxIxH: also time each kernel of --ops and --dtype at these "
                   "shapes with its records against the same kernel --against fewer, both in "
                   "this process, in turns (w bound).")
@click.option("--against", type=click.Choice(list(AGAINST)), default="shipped",
              show_default=True,
              help="What --compare's other kernel leaves out: the user's records (shipped), "
                   "the target's own key's (borrowed) or every record (rules).")
@click.option("--turns", type=click.IntRange(min=1), default=11, show_default=True,
              help=f"Turns of --compare ({CALLS} calls of each kernel a turn).")
def command(target, ops_, dtypes, sizes, compare_shapes, against, turns):
    """Say which tuning records a target's kernels use, block by block, and where they come from.

    Lookups read the user's records (written by `lstm-tvm tune`; LSTM_TVM_SCHEDULES_DIR
    overrides the folder), then those shipped with lstm_tvm (LSTM_TVM_SHIPPED_SCHEDULES=0
    turns them off). A CPU also borrows the records of one CPU with the same architecture and
    vector extension (and, on x86, vendor). Each GEMM block of a kernel (a tuning task) takes
    its own key's record if there is one, else the borrowed key's, else keeps the rule-based
    schedule: the table says which, per kernel, dtype and size (T and B do not matter).

    With --compare, each kernel is also built --against fewer records and both are timed in
    turns in one process; the ratio (the other's time over this one's, the median over the
    turns, quartiles in brackets) is above 1 where the records make the kernel faster.
    """
    kernels = split_choices(ops_, KERNEL_OPS, "--ops")
    dts = split_choices(dtypes, DTYPES, "--dtype")
    size_list = parse_sizes(sizes)
    resolved = resolve(target)
    key = resolved.records_key
    click.echo(f"target: {key} ({database.isa_class(resolved)})" if resolved.cpu
               else f"target: {key}")
    for origin, root in env.schedule_roots():
        click.echo(f"{origin} records: {root}{'' if root.is_dir() else ' (none yet)'}")
    if env.shipped_schedules_dir() is None:
        click.echo("shipped records: off (LSTM_TVM_SHIPPED_SCHEDULES)")
    used = {s.folder: "borrowed" if s.borrowed else "own" for s in database.sources(resolved)}
    rows = [(origin, folder.name, isa, str(len(database.tasks_in(folder))), used.get(folder, ""))
            for origin, folder, isa in database.databases()]
    if rows:
        click.echo(format_table(("origin", "key", "ISA", "tasks", "used"), rows, right=(3,)))
    click.echo(database.uses_table([((name, dtype, f"{i}x{h}"), _uses(name, dtype, i, h, resolved))
                                    for name in kernels for dtype in dts for i, h in size_list],
                                   headers=("op", "dtype", "IxH")))
    click.echo(f"uses: {database.describe_use(resolved)}")
    if compare_shapes is not None:
        try:
            shapes = parse_shapes(compare_shapes)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--compare") from None
        _print_comparisons(kernels, dts, shapes, against, turns, resolved)


def _print_comparisons(kernels, dts, shapes, against, turns, resolved) -> None:
    cases = [(name, dtype, shape) for name in kernels for dtype in dts for shape in shapes]
    results = []
    with steps(len(cases), "compare", unit="kernel") as progress:
        for name, dtype, shape in cases:
            progress.set_postfix_str(f"{name} {dtype} {'x'.join(map(str, shape))}")
            results.append(compare(name, shape, against, dtype=dtype, target=resolved,
                                   turns=turns))
            progress.update()
    click.echo("")
    click.echo(textwrap.fill(f"machine: {describe_machine(machine())}", 100,
                             subsequent_indent="  "))
    click.echo(textwrap.fill(f"compared {AGAINST[against]} (--against {against}), w "
                             f"bound, {turns} turns of {CALLS} calls each, in one process:", 100,
                             subsequent_indent="  "))
    rows = []
    for r in results:
        timed = r.ratio is not None
        rows.append((r.op, r.dtype, "x".join(map(str, r.shape)), r.records, r.against,
                     f"{r.ms:.3f}" if timed else "-", f"{r.against_ms:.3f}" if timed else "-",
                     f"{r.ratio:.3f} ({r.quartiles[0]:.3f}-{r.quartiles[1]:.3f})" if timed
                     else "same records"))
    click.echo(format_table(("op", "dtype", "TxBxIxH", "records", "against", "ms",
                             "against ms", "against / records"), rows, right=(5, 6)))


def _uses(name: str, dtype: str, input_size: int, cell_size: int, target) -> list:
    """``(block, label)`` of each GEMM block of the kernel at TF's default attributes."""
    spec = _build.make_spec(name, dtype, input_size, cell_size, plain_attrs(get_op(name)), target,
                            tuned=False)
    return [(u.block, u.label) for u in _build.record_uses(spec)]
