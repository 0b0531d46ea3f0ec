"""Paths and knobs, with environment-variable overrides.

- ``LSTM_TVM_CACHE_DIR``: where compiled modules are cached
  (default ``$XDG_CACHE_HOME/lstm_tvm`` or ``~/.cache/lstm_tvm``).
- ``LSTM_TVM_SCHEDULES_DIR``: the tuning databases (default: the repository's ``schedules/``).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """The root of the on-disk cache of compiled modules (not created here)."""
    override = os.environ.get("LSTM_TVM_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lstm_tvm"


def schedules_dir() -> Path:
    """The folder holding MetaSchedule databases, one sub-folder per target key."""
    override = os.environ.get("LSTM_TVM_SCHEDULES_DIR")
    if override:
        return Path(override).expanduser()
    return PACKAGE_DIR.parent / "schedules"
