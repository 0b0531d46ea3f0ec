"""What several ``lstm-tvm`` commands share: the ``--target`` option, comma lists of choices,
``TxBxIxH`` shapes and plain-text tables. Below every command module, so none of them imports
another; in :mod:`lstm_tvm.bench`, whose modules use its shapes and tables too, since
:mod:`lstm_tvm.cli` imports the bench (so it could not live there without an import cycle)."""

from __future__ import annotations

import json

import click

from ..targets import resolve_target

__all__ = ["format_table", "parse_shapes", "split_choices", "target_option"]


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
                        help=f'TVM target: {quoted} ("llvm": this CPU, with its -mcpu), '
                             f'"aarch64" (64-bit Arm with NEON, built with a cross compiler) or '
                             f"a target JSON dict.")


def split_choices(value: str, allowed, option: str) -> list[str]:
    """The distinct items of the comma list ``value``, each one of ``allowed``; else a usage
    error naming ``option``."""
    items = [s.strip() for s in value.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise click.BadParameter(f"unknown {bad or [value]}; expected a comma list of "
                                 f"{list(allowed)}", param_hint=option)
    return list(dict.fromkeys(items))


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """``"32x16x128x128,64x32x256x256"`` -> ``[(32, 16, 128, 128), ...]`` (T, B, I, H)."""
    shapes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        dims = part.lower().split("x")
        if len(dims) != 4 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"shape {part!r}: expected TxBxIxH with positive ints, e.g. 4x2x8x8")
        shapes.append(tuple(int(d) for d in dims))
    if not shapes:
        raise ValueError("no shape given")
    return shapes


def format_table(headers, rows, right=()) -> str:
    """Plain fixed-width text: a header, a rule and one line per row (cells are ``str()``-ed).

    ``right`` holds the indices of right-aligned (numeric) columns.
    """
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(headers))]

    def line(row):
        parts = [c.rjust(w) if k in right else c.ljust(w)
                 for k, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])
