"""Each thread of a CPU kernel on a core of its own: TVM's pool workers pinned, the caller
kept on the core left while its kernels run.

A sequence kernel's threads meet at a barrier every time step. Left to the OS, the thread
that launches a kernel and its pool's worker sometimes share one core for the life of the
process (both stay busy, so neither is ever moved): every step then waits for a time slice,
and the process runs at about a single thread's speed. TVM's own pinning
(``TVM_BIND_THREADS=1``) pins the workers but not the caller, which the OS may still put on a
worker's core (docs/performance.md has both cases).

So, on Linux, at a thread's first launch its pool is made (TVM makes a thread's pool when
first asked for its size) and its workers, the threads that appeared meanwhile, are pinned
one per core to all the cores of the process's affinity but the first; the launching thread
runs each of its kernels on that first core. A thread found elsewhere when its kernel starts
is pinned there for the kernel, its own affinity restored after; one already there is left
as it is (the OS keeps a busy thread on its core, and pinning and restoring cost two system
calls a kernel, much of a small cell op's time: docs/performance.md).
``LSTM_TVM_PIN_THREADS=0`` turns this off, as does ``TVM_BIND_THREADS=1`` (TVM then places
the workers).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

__all__ = ["Placement", "enabled"]

log = logging.getLogger(__name__)

_UNPINNED = -1


def enabled() -> bool:
    """Whether lstm_tvm places its kernels' threads (see the module doc)."""
    return (sys.platform.startswith("linux") and hasattr(os, "sched_setaffinity")
            and os.environ.get("LSTM_TVM_PIN_THREADS", "1") != "0"
            and os.environ.get("TVM_BIND_THREADS", "0") in ("", "0"))


def _cpu_reader():
    """glibc's ``sched_getcpu`` (the core the calling thread runs on, -1 on failure), or a
    function returning -1 where the C library has none."""
    try:
        read = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return lambda: -1
    read.restype, read.argtypes = ctypes.c_int, []
    return read


_current_cpu = _cpu_reader()


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


class Placement:
    """The core each launching thread runs its kernels on (see the module doc); with ``pin``
    False, none: the OS places every thread."""

    def __init__(self, pin: bool = True):
        self._core: dict[int, int] = {}  # launching thread -> its core, or _UNPINNED
        self._on = pin and enabled()

    def run(self, func, args):
        """``func(*args)`` (a kernel) with the calling thread on its core (moved there and
        pinned for the call only where it runs elsewhere)."""
        if not self._on:
            return func(*args)
        ident = threading.get_ident()
        core = self._core.get(ident)
        if core is None:
            core = self._core[ident] = self._place_pool()
        if core == _UNPINNED or _current_cpu() == core:
            return func(*args)
        saved = os.sched_getaffinity(0)
        if saved == {core}:
            return func(*args)
        try:
            os.sched_setaffinity(0, {core})
        except OSError:  # the process's cores changed since: leave the threads be
            self._core[ident] = _UNPINNED
            return func(*args)
        try:
            return func(*args)
        finally:
            os.sched_setaffinity(0, saved)

    def _place_pool(self) -> int:
        """Make the calling thread's pool and pin its workers (see :meth:`_pin`); returns the
        core the thread's kernels run on, or ``_UNPINNED`` where its pool existed already
        (its workers unknown), has no workers or is not the size lstm_tvm gave it, and where
        this TVM cannot be asked for it."""
        from ._tvm import configure_threads, tvm  # the pool's size, set before any kernel

        size = configure_threads()
        make_pool = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
        if make_pool is None:
            return _UNPINNED
        before = _threads()
        make_pool()  # returns the pool's size, making the pool where there is none
        started = _threads() - before
        # Only a pool's whole set of workers (its threads but the caller) is pinned: other
        # threads the process started meanwhile are left alone.
        return self._pin(sorted(started)) if started and len(started) == size - 1 else _UNPINNED

    @staticmethod
    def _pin(workers: list[int]) -> int:
        """Pin ``workers`` one per core after the first of the caller's cores; returns that
        first core, or ``_UNPINNED`` where the cores are too few or the OS refuses."""
        cores = sorted(os.sched_getaffinity(0))
        if len(workers) + 1 > len(cores):
            return _UNPINNED
        try:
            for tid, core in zip(workers, cores[1:]):
                os.sched_setaffinity(tid, {core})
        except OSError as err:
            log.debug("lstm_tvm: could not pin the kernel threads: %s", err)
            return _UNPINNED
        return cores[0]
