"""PyTorch's idle OpenMP workers kept asleep while a CPU kernel of lstm_tvm runs.

PyTorch's CPU ops run on GNU OpenMP (``libgomp``, bundled with PyTorch's Linux wheels), whose
workers keep spinning on their core for a while after each parallel op (``OMP_WAIT_POLICY``
left unset; ``GOMP_SPINCOUNT``). lstm_tvm's kernels run on TVM's own thread pool, one thread
per core, whose threads meet at a barrier every time step: a spinning OpenMP worker on one of
those cores makes every step wait for a time slice, and a training step that follows a
parallel op (the loss, ``zeros_like``, an optimizer step) ran far slower than the bare kernels
(docs/performance.md, "PyTorch's OpenMP workers").

So :func:`call_with_workers_asleep` runs a kernel inside an OpenMP parallel region of the
calling thread whose workers each wait on a semaphore (asleep in the kernel, off the cores)
until the kernel has returned: the region starts with libgomp's ``GOMP_parallel_start``, which
hands the team its function and returns to the caller, and ends with ``GOMP_parallel_end``
once every worker has been let go. The team is the one PyTorch's next parallel op reuses: no
thread is stopped or started (ending the pool instead, ``omp_pause_resource_all``, made that
op start its workers again; see docs/performance.md). ``LSTM_TVM_RELEASE_OPENMP=0`` turns
this off; it is also off where PyTorch's OpenMP is not libgomp.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading

__all__ = ["enabled", "call_with_workers_asleep"]

_local = threading.local()
#: The most times a thread yields for its workers to take their posts before it ends the
#: region anyway (a few milliseconds).
_YIELDS = 20000


def enabled() -> bool:
    """Whether :func:`call_with_workers_asleep` puts workers to sleep here (see the module
    doc)."""
    return _libraries() is not None


def call_with_workers_asleep(function, *args):
    """``function(*args)`` with the calling thread's OpenMP workers asleep (the module doc);
    returns what it returns."""
    libs = _libraries()
    if libs is None:
        return function(*args)
    start, end, team_size, post, try_wait, get_value, give_way, wait = libs
    sem, value = _semaphore()
    start(wait, sem, 0)  # every worker runs sem_wait(sem); this thread returns at once
    try:
        return function(*args)
    finally:
        for _ in range(team_size() - 1):
            post(sem)
        # libgomp's end of region spins until the workers arrive: let one that woke on this
        # core run first (docs/performance.md, "a region after an idle spell"); bounded, as a
        # worker whose wait a signal cut short (a C library returning EINTR) takes no post
        for _ in range(_YIELDS):
            if get_value(sem, value) != 0 or value.value <= 0:
                break
            give_way()
        end()
        while try_wait(sem) == 0:  # a wait a signal cut short left a post unused
            pass


def _semaphore():
    """The calling thread's semaphore (each thread's region has its own workers) and a place
    for its value."""
    pair = getattr(_local, "pair", None)
    if pair is None:
        sem = ctypes.create_string_buffer(64)  # sem_t: 32 bytes on 64-bit glibc
        if _libc().sem_init(sem, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")
        pair = _local.pair = (sem, ctypes.c_int())
    return pair


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _libraries():
    """``(GOMP_parallel_start, GOMP_parallel_end, omp_get_num_threads, sem_post, sem_trywait,
    sem_getvalue, sched_yield, the address of sem_wait)``, or None where this is off (the
    module doc)."""
    if os.environ.get("LSTM_TVM_RELEASE_OPENMP", "1") == "0" or not sys.platform.startswith(
            "linux"):
        return None
    path = _loaded_libgomp()
    if path is None:
        return None
    try:
        gomp, libc = ctypes.CDLL(path), _libc()
        start, end = gomp.GOMP_parallel_start, gomp.GOMP_parallel_end
        team_size = gomp.omp_get_num_threads
        post, try_wait, get_value = libc.sem_post, libc.sem_trywait, libc.sem_getvalue
        give_way, wait = libc.sched_yield, ctypes.cast(libc.sem_wait, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    start.argtypes, start.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint], None
    end.argtypes, end.restype = [], None
    team_size.argtypes, team_size.restype = [], ctypes.c_int
    for f in (post, try_wait):
        f.argtypes, f.restype = [ctypes.c_char_p], ctypes.c_int
    get_value.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    get_value.restype = give_way.restype = ctypes.c_int
    give_way.argtypes = []
    return start, end, team_size, post, try_wait, get_value, give_way, wait


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
