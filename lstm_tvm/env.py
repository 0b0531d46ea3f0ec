"""Paths and knobs, with environment-variable overrides.

- ``LSTM_TVM_CACHE_DIR``: where compiled modules are cached (default: the platform's user cache
  folder, ``~/.cache/lstm_tvm`` on Linux).
- ``LSTM_TVM_SCHEDULES_DIR``: the user's tuning databases, written by ``lstm-tvm tune`` and
  looked up before the shipped ones (default: the platform's user data folder,
  ``~/.local/share/lstm_tvm/schedules`` on Linux).
- ``LSTM_TVM_SHIPPED_SCHEDULES``: ``0`` (or ``off``, ``false``, ``no``) ignores the tuning
  records shipped with lstm_tvm, e.g. to compare with the rule-based schedules.
- ``LSTM_TVM_CUDA_TENSOR_CORES``: ``1`` builds the float16 CUDA kernels with their input
  projection on tensor cores (:func:`cuda_tensor_cores`; experimental, off by default).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import platformdirs

PACKAGE_DIR = Path(__file__).resolve().parent

#: The folder of the shipped records inside an installed package (a wheel puts the repository's
#: ``schedules/`` there).
PACKAGED_SCHEDULES = PACKAGE_DIR / "_schedules"

_APP = "lstm_tvm"

#: How many times a worker of TVM's CPU thread pool yields, waiting for more work after a
#: parallel loop, before it sleeps (``TVM_THREAD_POOL_SPIN_COUNT``; lstm_tvm's default where it
#: is unset). Enough to bridge the gaps between a kernel's parallel loops and between calls in a
#: loop; TVM's own 300000 kept a core busy long after a kernel, in the way of the threads of
#: PyTorch, TensorFlow or ONNX Runtime that ran next (docs/performance.md, "TVM's spinning
#: workers").
POOL_SPIN_COUNT = 1000


def cuda_tensor_cores() -> bool:
    """Whether float16 CUDA kernels put their input projection on tensor cores
    (``LSTM_TVM_CUDA_TENSOR_CORES=1``; WMMA 16x16x16 products with float32 accumulators,
    :func:`lstm_tvm.schedule.gpu.schedule_gpu`). Off until a GPU has measured it against the
    float32-FMA GEMMs (docs/guide/cuda.md)."""
    return os.environ.get("LSTM_TVM_CUDA_TENSOR_CORES", "0") == "1"


def cache_dir() -> Path:
    """The root of the on-disk cache of compiled modules (not created here)."""
    override = os.environ.get("LSTM_TVM_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return platformdirs.user_cache_path(_APP)


def schedules_dir() -> Path:
    """The user's tuning databases, one sub-folder per records key: where tuning sessions write
    and the first place lookups search (not created here)."""
    override = os.environ.get("LSTM_TVM_SCHEDULES_DIR")
    if override:
        return Path(override).expanduser()
    return _user_data_dir() / "schedules"


@functools.cache
def _user_data_dir() -> Path:
    return platformdirs.user_data_path(_APP)


def shipped_schedules_dir() -> Path | None:
    """The tuning databases shipped with lstm_tvm: inside the installed package, or the
    repository's ``schedules/`` in a source checkout; None when there are none or
    ``LSTM_TVM_SHIPPED_SCHEDULES`` turns them off."""
    if os.environ.get("LSTM_TVM_SHIPPED_SCHEDULES", "").strip().lower() in ("0", "off", "false",
                                                                            "no"):
        return None
    return _shipped_dir()


@functools.cache
def _shipped_dir() -> Path | None:
    if PACKAGED_SCHEDULES.is_dir():
        return PACKAGED_SCHEDULES
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "schedules").is_dir():
        return checkout / "schedules"
    return None


def schedule_roots() -> tuple[tuple[str, Path], ...]:
    """The roots lookups search, in order of preference: ``("user", ...)`` then, when there are
    any, ``("shipped", ...)``."""
    return _roots(schedules_dir(), shipped_schedules_dir())


@functools.lru_cache(maxsize=8)
def _roots(user: Path, shipped: Path | None) -> tuple[tuple[str, Path], ...]:
    roots = (("user", user),)
    if shipped is not None and shipped.resolve() != user.resolve():
        roots += (("shipped", shipped),)
    return roots


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1
