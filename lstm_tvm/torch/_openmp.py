"""PyTorch's idle OpenMP workers released before a CPU kernel of lstm_tvm runs.

PyTorch's CPU ops run on GNU OpenMP (``libgomp``, bundled with PyTorch's Linux wheels), whose
workers keep spinning on their core for a while after each parallel op (``OMP_WAIT_POLICY``
left unset; ``GOMP_SPINCOUNT``). lstm_tvm's kernels run on TVM's own thread pool, one thread
per core, whose threads meet at a barrier every time step: a spinning OpenMP worker on one of
those cores makes every step wait for a time slice, and a training step that follows a
parallel op (the loss, ``zeros_like``, an optimizer step) ran far slower than the bare kernels
(docs/performance.md, "PyTorch's OpenMP workers").

So before each CPU kernel :func:`release_idle_workers` ends the OpenMP pool of the calling
thread (``omp_pause_resource_all``, OpenMP 5.0: libgomp joins that thread's idle workers;
it refuses inside a parallel region and leaves other threads' pools alone). PyTorch's next
parallel op starts its workers again. Without a pool (no parallel op since the last release)
the call does nothing. ``LSTM_TVM_RELEASE_OPENMP=0`` turns this off; it is also off where
PyTorch's OpenMP is not libgomp (the others' pause semantics differ).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["enabled", "release_idle_workers"]

#: ``omp_pause_soft`` of ``omp_pause_resource_t``.
_OMP_PAUSE_SOFT = 1


def enabled() -> bool:
    """Whether :func:`release_idle_workers` releases anything here (see the module doc)."""
    return _pause_function() is not None


def release_idle_workers() -> None:
    """End the calling thread's OpenMP pool if it has one (see the module doc)."""
    pause = _pause_function()
    if pause is not None:
        pause(_OMP_PAUSE_SOFT)


@functools.cache
def _pause_function():
    if os.environ.get("LSTM_TVM_RELEASE_OPENMP", "1") == "0" or not sys.platform.startswith(
            "linux"):
        return None
    path = _loaded_libgomp()
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0
        return None
    function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function


def _loaded_libgomp() -> str | None:
    """The path of the libgomp this process has loaded (PyTorch's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if os.path.basename(path).startswith("libgomp"):
                    return "/" + path
    except OSError:
        pass
    return None
