"""``lstm-tvm schedules``: which tuning records a target's kernels use, block by block."""

from __future__ import annotations

import click

from .. import build as _build
from .. import env
from ..bench.cli_common import format_table, split_choices, target_option
from ..bench import DEFAULT_SHAPES
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
def command(target, ops_, dtypes, sizes):
    """Say which tuning records a target's kernels use, block by block, and where they come from.

    Lookups read the user's records (written by `lstm-tvm tune`; LSTM_TVM_SCHEDULES_DIR
    overrides the folder), then those shipped with lstm_tvm (LSTM_TVM_SHIPPED_SCHEDULES=0
    turns them off). A CPU also borrows the records of one CPU with the same architecture and
    vector extension (and, on x86, vendor). Each GEMM block of a kernel (a tuning task) takes
    its own key's record if there is one, else the borrowed key's, else keeps the rule-based
    schedule: the table says which, per kernel, dtype and size (T and B do not matter).
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


def _uses(name: str, dtype: str, input_size: int, cell_size: int, target) -> list:
    """``(block, label)`` of each GEMM block of the kernel at TF's default attributes."""
    spec = _build.make_spec(name, dtype, input_size, cell_size, plain_attrs(get_op(name)), target,
                            tuned=False)
    return [(u.block, u.label) for u in _build.record_uses(spec)]
