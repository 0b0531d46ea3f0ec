"""The one place that touches TVM's moving names (``tvm.tirx``, ``tvm.s_tir``, targets).

TVM 0.27 renamed the tensor-level IR to ``tvm.tirx`` and scheduling to ``tvm.s_tir``, and
takes targets as JSON dicts. Everything else in lstm_tvm imports TVM through here. What a
target string or dict means to lstm_tvm (the host CPU, aliases, the default CUDA architecture)
is decided in :mod:`lstm_tvm.targets`; here are TVM's names, a target's triple, and the device
and build helpers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

import tvm
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.stmt import SBlock, SBlockRealize
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as TB

from .env import POOL_SPIN_COUNT, usable_cores

__all__ = ["tvm", "tirx", "T", "TB", "IRBuilder", "Schedule", "SBlock", "SBlockRealize",
           "device_for", "configure_threads", "build_scope", "device_exists", "nvcc_compile",
           "host_arch", "target_arch", "target_triple", "meta_schedule"]


def meta_schedule():
    """``tvm.s_tir.meta_schedule``, with TVM's tensor intrinsics (which every ``TuneContext``
    imports) registered cheaply.

    Each of their few hundred TVMScript functions calls ``inspect.stack()``; for a frame of
    ``<frozen importlib._bootstrap>`` (an import in progress) ``inspect.getmodule`` finds no
    file to cache and scans all of ``sys.modules``, every frame, every function: most of a
    short tuning session's time (docs/performance.md). Naming those frames' modules in
    ``inspect``'s own file-to-module cache first makes each lookup a dictionary access. The
    frames of code TVMScript compiles and runs (files ``<string>`` and ``<ast>``) belong to no
    module: each lookup scanned ``sys.modules`` to find none. While the intrinsics register,
    the cache names a module that does not exist for them, which gives the same answer (None)
    at once; those two entries are removed afterwards (elsewhere ``inspect`` may find a
    ``<string>`` function in ``__main__``).
    """
    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    unowned = [f for f in ("<string>", "<ast>") if f not in inspect.modulesbyfile]
    for name in unowned:
        inspect.modulesbyfile[name] = _NO_MODULE
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401 (registers the intrinsics)
    finally:
        for name in unowned:
            if inspect.modulesbyfile.get(name) == _NO_MODULE:
                del inspect.modulesbyfile[name]
    from tvm.s_tir import meta_schedule as ms
    return ms


#: A module name no module has (``inspect.modulesbyfile``'s answer for files of no module).
_NO_MODULE = "<no module>"


@functools.cache
def _system_triple() -> str:
    return str(tvm.target.codegen.llvm_get_system_triple())


def target_triple(target) -> str:
    """An ``llvm`` target's triple: its ``mtriple``, else this machine's."""
    return str(target.attrs.get("mtriple", "") or _system_triple())


def target_arch(target) -> str:
    """An ``llvm`` target's architecture (``x86_64``, ``aarch64``), from its triple."""
    return target_triple(target).split("-")[0]


def host_arch() -> str:
    """This machine's architecture, as LLVM names it (``x86_64``, ``aarch64``)."""
    return _system_triple().split("-")[0]


def build_scope(target: tvm.target.Target):
    """The context to compile ``target`` in: CUDA targets are entered, since TVM's nvcc/NVRTC
    callback takes the architecture from ``Target.current()`` (without it, from the local
    GPU); other targets need nothing."""
    return target if str(target.kind.name) == "cuda" else contextlib.nullcontext()


def nvcc_compile(source: str, arch: str) -> bytes:
    """Compile CUDA ``source`` to a cubin for ``arch`` (``"sm_80"``) with ``nvcc``.

    Without a CUDA driver, ``tvm.compile`` for CUDA only generates source (its module carries the
    source, compiled when loaded on a GPU machine); this checks ahead of time that the source
    compiles for ``arch``. Raises ``RuntimeError`` with nvcc's messages when it does not.
    """
    from tvm.support import nvcc  # pylint: disable=import-outside-toplevel

    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        return bytes(nvcc.compile_cuda(source, target_format="cubin", arch=arch, compiler="nvcc"))


def device_exists(device) -> bool:
    """Whether ``device`` (a ``tvm.runtime.Device``) is present on this machine."""
    return device.dlpack_device_type() == 1 or bool(device.exist)


@functools.cache
def configure_threads() -> int:
    """Give TVM's CPU thread pool one worker per usable core, not pinned; returns the worker
    count.

    TVM defaults to half of ``hardware_concurrency`` on x86 (it assumes hyper-threading), which
    leaves half the cores idle on machines without it. ``TVM_NUM_THREADS`` or
    ``OMP_NUM_THREADS``, when set, win as in TVM; otherwise ``TVM_NUM_THREADS`` is set to the
    number of cores this process may run on. TVM also pins each worker to a core of its own but
    leaves the calling thread free, so the OS may run the caller on a worker's core: the two
    then take turns on it, and a sequence kernel, whose threads meet at a barrier every step,
    runs 2.5-2.8x slower until the OS moves the caller (docs/performance.md). So
    ``TVM_BIND_THREADS`` is set to 0 unless set already, and ``TVM_THREAD_POOL_SPIN_COUNT`` to
    :data:`lstm_tvm.env.POOL_SPIN_COUNT`. TVM reads them when its thread pool starts, so this
    runs before lstm_tvm launches any kernel.
    """
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(POOL_SPIN_COUNT))
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            return int(os.environ[var])
    cores = usable_cores()
    os.environ["TVM_NUM_THREADS"] = str(cores)
    return cores


def device_for(target: "tvm.target.Target", index: int = 0):
    """The runtime device a target's code runs on (``tvm.cpu`` or ``tvm.cuda``)."""
    kind = str(target.kind.name)
    return tvm.device("cpu" if kind in ("llvm", "c") else kind, index)
