"""Measuring tuning candidates on other machines through a TVM RPC tracker.

The devices run TVM's RPC server registered under a key (``python -m tvm.exec.rpc_server
--tracker HOST:PORT --key KEY``); the tracker (``python -m tvm.exec.rpc_tracker``) hands each
measurement to a free server of that key. Candidates are compiled here into shared libraries
(with a cross compiler for another architecture), so the devices need TVM's runtime only.

A session checks first that the tracker answers and holds a server of the key, within a
bounded wait, and fails with one error naming both otherwise, before anything is written. A
server that dies mid-session fails the candidates it held (MetaSchedule records them with its
failure time, see :func:`lstm_tvm.tuning.database.failed`), and the remaining servers carry on;
with none left, each measurement fails at once instead of waiting for a server that will not
come.
"""

from __future__ import annotations

import dataclasses
import socket
import time

__all__ = ["RemoteError", "Tracker", "parse_address", "runner", "wait_for_servers"]


class RemoteError(RuntimeError):
    """The tracker or its servers cannot take a tuning session."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; ``ValueError`` naming the text otherwise."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9190), got {text!r}")
    return host, int(port)


@dataclasses.dataclass(frozen=True)
class Tracker:
    """Where the devices are: the tracker's address and the key their servers registered
    with; ``session_timeout``: seconds one measurement may hold a server; ``wait``: seconds
    to wait for a server of the key at the start."""

    host: str
    port: int
    key: str
    session_timeout: float = 120.0
    wait: float = 30.0

    def __str__(self) -> str:
        return f"key {self.key!r} at tracker {self.host}:{self.port}"

    def config(self):
        """MetaSchedule's ``RPCConfig`` for this tracker and key."""
        from tvm.s_tir.meta_schedule.runner import RPCConfig

        return RPCConfig(tracker_host=self.host, tracker_port=self.port, tracker_key=self.key,
                         session_timeout_sec=int(self.session_timeout))


def _count_servers(tracker: Tracker) -> int:
    """Servers registered under the tracker's key now; :class:`RemoteError` if the tracker
    does not answer."""
    from tvm import rpc

    try:
        # TVM's own connect retries for a minute; a refused or silent address fails here at once.
        socket.create_connection((tracker.host, tracker.port), timeout=5).close()
        summary = rpc.connect_tracker(tracker.host, tracker.port).summary()
    except (OSError, RuntimeError, ValueError) as err:
        raise RemoteError(f"cannot reach the RPC tracker at {tracker.host}:{tracker.port} "
                          f"(for {tracker}): {err}") from None
    return sum(1 for item in summary.get("server_info", [])
               if str(item.get("key", "")).partition(":")[2] == tracker.key)


def wait_for_servers(tracker: Tracker) -> int:
    """The number of servers of the tracker's key, waiting up to ``tracker.wait`` seconds for
    the first; :class:`RemoteError` naming the tracker and the key when none comes."""
    deadline = time.monotonic() + tracker.wait
    while True:
        count = _count_servers(tracker)
        if count or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if not count:
        raise RemoteError(
            f"no RPC server registered with {tracker} within {tracker.wait:g} s; start one on "
            f"each device: python -m tvm.exec.rpc_server --tracker "
            f"{tracker.host}:{tracker.port} --key {tracker.key}")
    return count


def _create_session(rpc_config):
    """A session on a free server of the key, or an error at once when the tracker holds no
    server of it any more (TVM's request would wait for one forever)."""
    if not rpc_config.count_num_servers(allow_missing=True):
        raise RemoteError(f"no RPC server left with key {rpc_config.tracker_key!r} at tracker "
                          f"{rpc_config.tracker_host}:{rpc_config.tracker_port}")
    return rpc_config.connect_server()


def runner(tracker: Tracker, evaluator_config, workers: int):
    """MetaSchedule's ``RPCRunner`` measuring on the tracker's servers, ``workers``
    measurements at a time."""
    from tvm.s_tir.meta_schedule.runner import RPCRunner

    return RPCRunner(rpc_config=tracker.config(), evaluator_config=evaluator_config,
                     f_create_session=_create_session, max_workers=max(1, workers))
