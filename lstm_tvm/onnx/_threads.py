"""ONNX Runtime's thread pools beside lstm_tvm's kernels.

ONNX Runtime's pool threads spin while they wait for work (``allow_spinning``, on by default).
An lstm_tvm node runs its kernel on TVM's thread pool, whose threads meet at a barrier every
time step: spinning ONNX Runtime threads take the cores from them, and with the parallel
executor a run became tens of times slower (docs/performance.md). Sessions that run lstm_tvm
kernels therefore have ONNX Runtime's threads sleep when idle, unless the caller chose.

On the parallel executor the thread that called ``run`` spins on a core until the nodes are
done, whatever those entries say: a kernel launched from one of ONNX Runtime's threads then
uses one core fewer (:func:`parallel_executor_threads`), so that its threads never wait for
that core's time slices at a step's barrier.
"""

from __future__ import annotations

from ..env import usable_cores

__all__ = ["SPINNING_ENTRIES", "parallel_executor_threads", "set_unless_given",
           "sleep_when_idle"]

#: The session config entries of ONNX Runtime's spinning pools.
SPINNING_ENTRIES = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def sleep_when_idle(options):
    """``options`` (``onnxruntime.SessionOptions``) with each entry of
    :data:`SPINNING_ENTRIES` the caller did not set turned off; returns ``options``."""
    for key in SPINNING_ENTRIES:
        set_unless_given(options, key, "0")
    return options


def set_unless_given(options, key: str, value: str) -> None:
    """Set the session config entry ``key`` of ``options`` to ``value`` unless the caller set
    it already."""
    try:
        options.get_session_config_entry(key)
    except RuntimeError:  # not set by the caller
        options.add_session_config_entry(key, value)


def parallel_executor_threads() -> int:
    """The CPU threads of a kernel that ONNX Runtime's parallel executor runs: one core fewer
    than the process may use (at least one); see the module doc."""
    return max(1, usable_cores() - 1)
