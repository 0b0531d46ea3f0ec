"""``lstm-tvm cache info|clear``: the disk cache of compiled modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from .. import env

__all__ = ["cache"]


@click.group("cache")
def cache():
    """Inspect or clear the disk cache of compiled modules (LSTM_TVM_CACHE_DIR)."""


def _cache_dirs(root: Path) -> list[Path]:
    """The per-TVM-version folders that lstm_tvm writes under the cache root."""
    return sorted(p for p in root.glob("tvm-*") if p.is_dir()) if root.is_dir() else []


@cache.command("info")
def cache_info():
    """Print the cache path, its number of compiled modules and its size on disk."""
    root = env.cache_dir()
    files = [f for d in _cache_dirs(root) for f in d.rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    click.echo(f"path:    {root}")
    click.echo(f"entries: {sum(1 for f in files if f.suffix == '.so')}")
    click.echo(f"size:    {size / 2**20:.1f} MiB ({size} bytes)")


@cache.command("clear")
def cache_clear():
    """Delete every compiled module in the cache (only the tvm-* folders lstm_tvm writes)."""
    root = env.cache_dir()
    dirs = _cache_dirs(root)
    count = sum(1 for d in dirs for f in d.rglob("*.so"))
    for d in dirs:
        shutil.rmtree(d)
    click.echo(f"removed {count} entries from {root}")
