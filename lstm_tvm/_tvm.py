"""The one place that touches TVM's moving names (``tvm.tirx``, ``tvm.s_tir``, targets).

TVM 0.27 renamed the tensor-level IR to ``tvm.tirx`` and scheduling to ``tvm.s_tir``, and
takes targets as JSON dicts. Everything else in lstm_tvm imports TVM through here.
"""

from __future__ import annotations

import functools
import json
import os

import tvm
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as TB

__all__ = ["tvm", "tirx", "T", "TB", "IRBuilder", "Schedule", "resolve_target", "target_key", "host_cpu", "device_for",
           "configure_threads"]


@functools.cache
def host_cpu() -> str:
    """LLVM's name for this machine's CPU (``mcpu``), so that AVX-512/AVX2 get used."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def _host_llvm() -> dict:
    return {"kind": "llvm", "mcpu": host_cpu(), "num-cores": os.cpu_count() or 1}


def resolve_target(target: object = "llvm") -> "tvm.target.Target":
    """Turn a kind string, a JSON dict (or its string) or a ``Target`` into a ``Target``.

    ``"llvm"`` (and ``None``) mean this host's CPU with its ``mcpu``; a dict or JSON string is
    passed to ``tvm.target.Target`` as it is; ``"cuda"`` means CUDA with TVM's defaults.
    """
    if target is None or target == "llvm":
        return tvm.target.Target(_host_llvm())
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, dict):
        return tvm.target.Target(target)
    if isinstance(target, str):
        text = target.strip()
        if text.startswith("{"):
            return tvm.target.Target(json.loads(text))
        return tvm.target.Target({"kind": text})
    raise TypeError(
        f"target: expected a kind string, a JSON dict or a tvm.target.Target, got {type(target).__name__}"
    )


def target_key(target: "tvm.target.Target") -> str:
    """A stable text identity of a target (its JSON: kind and every attribute), for cache keys."""
    return str(target)


@functools.cache
def configure_threads() -> int:
    """Give TVM's CPU thread pool one worker per usable core; returns the worker count.

    TVM defaults to half of ``hardware_concurrency`` on x86 (it assumes hyper-threading), which
    leaves half the cores idle on machines without it. ``TVM_NUM_THREADS`` or
    ``OMP_NUM_THREADS``, when set, win as in TVM; otherwise ``TVM_NUM_THREADS`` is set to the
    number of cores this process may run on. TVM reads it when its thread pool starts, so this
    runs before lstm_tvm launches any kernel.
    """
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            return int(os.environ[var])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ["TVM_NUM_THREADS"] = str(cores or 1)
    return cores or 1


def device_for(target: "tvm.target.Target", index: int = 0):
    """The runtime device a target's code runs on (``tvm.cpu`` or ``tvm.cuda``)."""
    kind = str(target.kind.name)
    return tvm.device("cpu" if kind in ("llvm", "c") else kind, index)
