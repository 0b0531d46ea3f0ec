"""Binding a call's positional and keyword inputs to input names (shared by the callables)."""

from __future__ import annotations

from typing import Sequence


def bind_inputs(where: str, names: Sequence[str], args: Sequence, kwargs: dict) -> dict:
    """``{name: value}`` from positional ``args`` (in ``names`` order) and keyword ``kwargs``.

    Raises ``TypeError`` starting with ``where`` for too many positionals or a name given twice.
    """
    if len(args) > len(names):
        raise TypeError(f"{where}: expected at most {len(names)} inputs, got {len(args)}")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(f"{where}: input {key!r} given twice")
        values[key] = value
    return values
