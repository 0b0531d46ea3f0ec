"""ONNX Runtime's thread pools beside lstm_tvm's kernels.

ONNX Runtime's pool threads spin while they wait for work (``allow_spinning``, on by default).
An lstm_tvm node runs its kernel on TVM's thread pool, whose threads meet at a barrier every
time step: spinning ONNX Runtime threads take the cores from them, and with the parallel
executor a run became tens of times slower (docs/performance.md). Sessions that run lstm_tvm
kernels therefore have ONNX Runtime's threads sleep when idle, unless the caller chose.
"""

from __future__ import annotations

__all__ = ["SPINNING_ENTRIES", "sleep_when_idle"]

#: The session config entries of ONNX Runtime's spinning pools.
SPINNING_ENTRIES = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def sleep_when_idle(options):
    """``options`` (``onnxruntime.SessionOptions``) with each entry of
    :data:`SPINNING_ENTRIES` the caller did not set turned off; returns ``options``."""
    for key in SPINNING_ENTRIES:
        try:
            options.get_session_config_entry(key)
        except RuntimeError:  # not set by the caller
            options.add_session_config_entry(key, "0")
    return options
