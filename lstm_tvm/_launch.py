"""Where lstm_tvm's CPU kernels run: on the main thread, or on one thread lstm_tvm owns.

TVM's CPU runtime gives every OS thread that launches a parallel kernel a thread pool of its
own (a worker per core but one, created at that thread's first kernel and spinning for a while
between kernels, even after its thread ended). Calls from ONNX Runtime's or TensorFlow's pool
threads, from a ``ThreadPoolExecutor`` whose workers come and go, or from several threads at
once, would each bring a pool: the process would keep two threads for every thread that ever
called, and concurrent kernels, each using every core and meeting at a barrier every time step,
would take turns on the cores (tens of times slower; docs/performance.md).

So a kernel launched from the main thread runs there, and one launched from any other thread is
handed to a single long-lived thread of lstm_tvm's (:func:`launch`), whose pool serves them all;
and kernels run one at a time in the process (a lock), each with every core. The calling thread
waits, blocked without the GIL, and gets the kernel's result or exception. A process has at
most two TVM pools, whatever the threads that call, and no kernel ever runs on a thread that
may end. Each thread of a kernel runs on a core of its own (:mod:`lstm_tvm._placement`).

A caller that knows a core is taken (ONNX Runtime's parallel executor: the thread that called
``run`` spins on a core until the nodes are done) asks for fewer threads (``threads=``): such
kernels run on another long-lived thread of lstm_tvm's (one more pool for each thread count
asked for), whose pool has that many threads and is not pinned (a pinned thread that shares
its core with a spinning one waits for time slices at every step's barrier;
docs/performance.md).
"""

from __future__ import annotations

import logging
import os
import queue
import threading

from ._placement import Placement

__all__ = ["launch", "launcher_for", "pool_threads"]

log = logging.getLogger(__name__)

_MAIN = threading.main_thread().ident
#: TVM's ``AffinityMode::kBig``: every core (x86 has no little ones); TVM pins the pool only
#: with ``TVM_BIND_THREADS=1``, which lstm_tvm leaves to the user.
_BIG_CORES = 1


def launch(func, *args, threads: int | None = None):
    """``func(*args)`` (a CPU kernel) on the main thread or lstm_tvm's kernel thread (see the
    module doc); returns its result or raises its exception in the calling thread.
    ``threads``: at most this many threads for the kernel (None: :func:`pool_threads`)."""
    if threads is not None and threads < pool_threads():
        return _state.thread(threads).run(func, args)
    if threading.get_ident() == _MAIN:
        with _state.lock:
            return _state.placement.run(func, args)
    return _state.thread().run(func, args)


def pool_threads() -> int:
    """The threads of a kernel launched without ``threads``: TVM's pool size
    (:func:`lstm_tvm._tvm.configure_threads`)."""
    if _state.pool_threads is None:
        from ._tvm import configure_threads

        _state.pool_threads = configure_threads()
    return _state.pool_threads


def launcher_for(device):
    """How to call a kernel on ``device``: :func:`launch` for a CPU, else directly (a GPU
    kernel only queues work on its stream)."""
    return launch if device.dlpack_device_type() == 1 else _call


def _call(func, *args):
    return func(*args)


class _KernelThread:
    """The thread that runs the kernels of every thread but the main one, one job at a time;
    with ``threads``, those asking for that many threads, on a pool of that size."""

    def __init__(self, lock, placement, threads: int | None = None):
        self._lock = lock
        self._placement = placement
        self._threads = threads
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        name = "lstm_tvm kernels" + (f" ({threads} threads)" if threads else "")
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, func, args):
        done = threading.Lock()
        done.acquire()
        job = [func, args, None, None, done]
        self._jobs.put(job)
        done.acquire()  # released by _serve once the kernel returned or raised
        if job[3] is not None:
            error, job[3] = job[3], None
            raise error
        return job[2]

    def _serve(self):
        if self._threads is not None:  # this thread's pool, before its first kernel
            from ._tvm import tvm

            try:
                tvm.get_global_func("runtime.config_threadpool")(_BIG_CORES, self._threads)
            except Exception as err:  # noqa: BLE001 - the kernels still run, on every core
                log.warning("lstm_tvm: could not size a kernel thread's pool to %d threads: %s",
                            self._threads, err)
        while True:
            job = self._jobs.get()
            try:
                with self._lock:
                    job[2] = self._placement.run(job[0], job[1])
            except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
                job[3] = err
            finally:
                job[0] = job[1] = None
                job[4].release()


class _State:
    """The kernel lock, the kernel thread (started at the first kernel of a thread other
    than the main one) and where kernels' threads run (:mod:`lstm_tvm._placement`); all made
    anew in a forked child, which has neither thread nor pool."""

    def __init__(self):
        self.lock = threading.Lock()
        self.placement = Placement()
        self.pool_threads: int | None = None
        self._threads: dict[int | None, _KernelThread] = {}
        self._starting = threading.Lock()

    def thread(self, threads: int | None = None) -> _KernelThread:
        """The kernel thread of kernels asking for ``threads`` (None: every core)."""
        current = self._threads.get(threads)
        if current is None:
            with self._starting:
                if threads not in self._threads:
                    placement = self.placement if threads is None else Placement(pin=False)
                    self._threads[threads] = _KernelThread(self.lock, placement, threads)
                current = self._threads[threads]
        return current


_state = _State()


def _after_fork_in_child():
    global _state, _MAIN
    _state = _State()
    _MAIN = threading.main_thread().ident


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
