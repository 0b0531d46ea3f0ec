"""``lstm-tvm export``: ops compiled into one deployable library with a manifest."""

from __future__ import annotations

from pathlib import Path

import click

from ..bench.cli_common import split_choices, target_option
from ..registry import DTYPES, OPS

__all__ = ["command"]


@click.command("export")
@click.option("--ops", "ops_", default=",".join(OPS), show_default="all six",
              help=f"Comma list of ops to export, among {', '.join(OPS)}.")
@target_option()
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--input-size", default=32, show_default=True, type=click.IntRange(1), help="I.")
@click.option("--cell-size", default=32, show_default=True, type=click.IntRange(1), help="H.")
@click.option("--use-peephole/--no-use-peephole", default=False, show_default=True,
              help="use_peephole of every op.")
@click.option("--forget-bias", type=float, help="forget_bias (default TF's: 1.0; V2 has none).")
@click.option("--cell-clip", type=float, help="cell_clip (default TF's: 3.0, BlockLSTMV2 0.0).")
@click.option("--no-onnx", is_flag=True, help="Do not write the onnx/ models.")
@click.option("--prepacked/--no-prepacked", default=True, show_default=True,
              help="Also compile the kernels that take w packed once (ONNX "
                   "Runtime's native route uses them where w is an initializer).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Report each step on stderr (a bar on a terminal, a line per step "
                   "elsewhere).")
@click.option("-o", "--output", required=True,
              type=click.Path(file_okay=False, path_type=Path), help="The folder to write.")
def command(ops_, output, no_onnx, use_peephole, forget_bias, cell_clip, progress, **opts):
    """Compile ops into one shared library for deployment, with manifest.json, ONNX models
    (onnx/<Op>.onnx) and a README.txt; load it with lstm_tvm.export.load(DIR) or from C++
    (examples/cpp). T and B stay dynamic; I, H, dtype and attributes are fixed."""
    from ..cross_compile import CrossCompilerMissing
    from ..export import export

    attrs = {"use_peephole": use_peephole}
    attrs.update({k: v for k, v in (("forget_bias", forget_bias), ("cell_clip", cell_clip))
                  if v is not None})
    try:
        manifest = export(output, split_choices(ops_, OPS, "--ops"), attrs=attrs,
                          onnx=not no_onnx, progress=progress, **opts)
    except (TypeError, ValueError, CrossCompilerMissing) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"{output / manifest['library']}: {manifest['dtype']}, I={opts['input_size']}, "
               f"H={opts['cell_size']}, target {manifest['target']['kind']}")
    for name, entry in manifest["ops"].items():
        click.echo(f"  {entry['function']}  {entry['attrs']}")
