"""Command-line options shared by several ``lstm-tvm`` commands."""

from __future__ import annotations

import json

import click

from ._tvm import resolve_target


def target_option(kinds=("llvm", "cuda"), verb: str = "builds for"):
    """The ``--target`` option of a command that ``verb`` targets of ``kinds``: the value is
    resolved once before any work starts, and anything else is a usage error (exit status 2)
    naming the option and what is wrong."""
    names = " and ".join(kinds)

    def check(ctx, param, value: str) -> str:
        try:
            kind = str(resolve_target(value).kind.name)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{value!r} is not valid JSON ({exc})", ctx, param) from None
        except Exception as exc:  # noqa: BLE001 (TVM raises several types)
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise click.BadParameter(f"{value!r}: {message}", ctx, param) from None
        if kind not in kinds:
            raise click.BadParameter(f"{value!r}: target kind {kind!r} is not supported; "
                                     f"lstm_tvm {verb} {names}", ctx, param)
        return value

    quoted = ", ".join(f'"{k}"' for k in kinds)
    return click.option("--target", default="llvm", show_default=True, callback=check,
                        help=f'TVM target: {quoted} ("llvm": this CPU, with its -mcpu) or a '
                             f"target JSON dict.")
