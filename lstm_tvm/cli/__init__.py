"""The ``lstm-tvm`` command line: one module per command, assembled into :func:`main` here.

``build`` (compile, verify, time), ``ops``, ``export``, ``cache``, ``bench``, ``tune``,
``schedules`` and ``convert``. Each command module imports the library and
:mod:`lstm_tvm.bench.cli_common`, never another command module.
"""

from __future__ import annotations

import click

from .. import __version__
from ..bench.cli_common import format_table
from . import bench, build, cache, convert, export, ops, schedules, tune
from .ops import op_table_markdown

__all__ = ["main", "op_table_markdown", "format_table"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lstm-tvm")
def main():
    """lstm_tvm: TensorFlow's six LSTM block ops compiled ahead of time by Apache TVM."""


for _name, _command in (("build", build.command), ("ops", ops.command),
                        ("export", export.command), ("cache", cache.cache),
                        ("bench", bench.command), ("tune", tune.command),
                        ("schedules", schedules.command), ("convert", convert.command)):
    main.add_command(_command, _name)
