"""The one place that touches TVM's moving names (``tvm.tirx``, ``tvm.s_tir``, targets).

TVM 0.27 renamed the tensor-level IR to ``tvm.tirx`` and scheduling to ``tvm.s_tir``, and
takes targets as JSON dicts. Everything else in lstm_tvm imports TVM through here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import platform

import tvm
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.stmt import SBlock, SBlockRealize
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as TB

from .env import POOL_SPIN_COUNT, usable_cores

__all__ = ["tvm", "tirx", "T", "TB", "IRBuilder", "Schedule", "SBlock", "SBlockRealize",
           "resolve_target", "target_key", "host_cpu", "device_for", "configure_threads",
           "DEFAULT_CUDA_ARCH", "cuda_arch", "target_name", "build_scope", "device_exists",
           "missing_device_error", "nvcc_compile", "TARGET_ALIASES", "host_arch", "target_arch",
           "target_triple", "meta_schedule"]


def meta_schedule():
    """``tvm.s_tir.meta_schedule``, with TVM's tensor intrinsics (which every ``TuneContext``
    imports) registered cheaply.

    Each of their few hundred TVMScript functions calls ``inspect.stack()``; for a frame of
    ``<frozen importlib._bootstrap>`` (an import in progress) ``inspect.getmodule`` finds no
    file to cache and scans all of ``sys.modules``, every frame, every function: most of a
    short tuning session's time (docs/performance.md). Naming those frames' modules in
    ``inspect``'s own file-to-module cache first makes each lookup a dictionary access.
    """
    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    import tvm.s_tir.tensor_intrin  # noqa: F401 (registers the intrinsics)
    from tvm.s_tir import meta_schedule as ms
    return ms


@functools.cache
def host_cpu() -> str:
    """LLVM's name for this machine's CPU (``mcpu``), so that AVX-512/AVX2 get used."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def _host_llvm() -> dict:
    target = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": os.cpu_count() or 1}
    if platform.machine().lower() in ("x86_64", "amd64"):
        # LLVM's tuning for many AVX-512 CPUs (Ice Lake and later Intel cores) prefers 256-bit
        # vectors: the vectorised gate math then ran in ymm halves. Without the preference it
        # uses zmm, and nothing got slower (docs/performance.md, "512-bit vectors for the gate
        # math"). A tuning flag only: CPUs without AVX-512 are unaffected.
        target["mattr"] = ["-prefer-256-bit"]
    return target


#: Short names of target dicts: ``--target aarch64`` is any 64-bit Arm Linux core with NEON.
TARGET_ALIASES = {
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
}


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


#: The CUDA architecture of a CUDA target that names none when no GPU is visible: ``sm_80``
#: (A100; the oldest architecture with the Ampere feature set, whose machine code also runs on
#: the later 8.x GPUs). TVM's own default here is ``sm_50``, which CUDA 13 no longer supports.
DEFAULT_CUDA_ARCH = "sm_80"


def cuda_arch(index: int = 0) -> str:
    """``sm_XY`` of CUDA GPU ``index`` when one is visible, else :data:`DEFAULT_CUDA_ARCH`."""
    dev = tvm.cuda(index)
    if dev.exist:
        return "sm_" + str(dev.compute_version).replace(".", "")
    return DEFAULT_CUDA_ARCH


def resolve_target(target: object = "llvm") -> "tvm.target.Target":
    """Turn a kind string, a JSON dict (or its string) or a ``Target`` into a ``Target``.

    ``"llvm"`` (and ``None``) mean this host's CPU with its ``mcpu``; ``"cuda"`` (or a CUDA dict
    without ``arch``) means CUDA for the local GPU's architecture, or :data:`DEFAULT_CUDA_ARCH`
    without one; a name of :data:`TARGET_ALIASES` (``"aarch64"``) its dict; any other dict or
    JSON string is passed to ``tvm.target.Target`` as it is, e.g.
    ``{"kind": "cuda", "arch": "sm_90"}``.
    """
    if target is None or target == "llvm":
        return tvm.target.Target(_host_llvm())
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and target.strip() in TARGET_ALIASES:
        return tvm.target.Target(TARGET_ALIASES[target.strip()])
    if isinstance(target, str):
        text = target.strip()
        target = json.loads(text) if text.startswith("{") else {"kind": text}
    if isinstance(target, dict):
        if target.get("kind") == "cuda" and "arch" not in target:
            target = {**target, "arch": cuda_arch()}
        return tvm.target.Target(target)
    raise TypeError(
        f"target: expected a kind string, a JSON dict or a tvm.target.Target, got {type(target).__name__}"
    )


def target_name(target) -> str:
    """A short readable name of a target: ``"llvm znver4"``, ``"cuda sm_80"``."""
    target = resolve_target(target)
    kind = str(target.kind.name)
    detail = target.attrs.get("arch") if kind == "cuda" else target.attrs.get("mcpu")
    return f"{kind} {detail}" if detail else kind


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


def missing_device_error(where: str, device, target) -> RuntimeError:
    """The error raised when a kernel built for ``target`` is asked to run without its device."""
    resolved = resolve_target(target)
    kind = str(resolved.kind.name)
    if kind == "llvm" and target_arch(resolved) != host_arch():
        return RuntimeError(
            f"{where}: code built for {target_triple(resolved)} cannot run on this "
            f"{host_arch()} machine (export it with lstm-tvm export and run it on the device; "
            f"building works here)")
    what = "no CUDA device" if kind == "cuda" else f"no {kind} device"
    return RuntimeError(
        f"{where}: {what}: {device} is not present on this machine, so the kernel built for "
        f"{target_name(target)} cannot run here (building works without one)")


def target_key(target: "tvm.target.Target") -> str:
    """A stable text identity of a target (its JSON: kind and every attribute), for cache keys."""
    return str(target)


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
