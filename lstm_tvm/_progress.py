"""Progress of long steps on stderr: a bar on a terminal, a line per step elsewhere.

A bar redrawn with carriage returns turns into one long line in a log or a captured stream,
and nothing at all is no better for a step that takes a while; so where stderr is not a
terminal, :func:`steps` writes one plain line as each step starts.
"""

from __future__ import annotations

import sys

__all__ = ["steps", "notice"]


class _Lines:
    """The line-per-step form of a ``tqdm`` bar (the subset :func:`steps`' users call)."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n = total, desc, 0

    def set_postfix_str(self, text: str) -> None:
        print(f"{self.desc}: {text} ({self.n + 1}/{self.total})", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def steps(total: int, desc: str, enabled: bool | None = None, unit: str = "step"):
    """A progress reporter for ``total`` steps: ``set_postfix_str(what)`` as a step starts,
    ``update()`` when it ends; use it as a context manager.

    ``enabled``: None shows a bar only on a terminal (nothing elsewhere); True shows a bar on a
    terminal and a line per step elsewhere; False shows nothing.
    """
    from tqdm import tqdm

    if enabled and not sys.stderr.isatty():
        return _Lines(total, desc)
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                disable=None if enabled is None else not enabled)


def notice(text: str) -> None:
    """One line on stderr before a step the caller waits on once (a download, a compiler run),
    so that a first call that takes long does not look hung."""
    print(f"lstm_tvm: {text}", file=sys.stderr, flush=True)
