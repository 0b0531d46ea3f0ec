"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str):
    """A temporary file beside ``path`` for the block to write; renamed onto ``path`` (one
    atomic step: readers see the old file or the whole new one) when the block ends without an
    exception, removed otherwise."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
