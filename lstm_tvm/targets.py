"""Targets as lstm_tvm reads them, resolved once: what every layer below the public functions
takes.

:func:`resolve_target` gives what a target string or dict means here: ``"llvm"`` (and None) this
host's CPU with its ``mcpu`` and :func:`~lstm_tvm.schedule.traits.host_llvm_mattr`'s tuning
flags, ``"cuda"`` the local GPU's architecture (:data:`DEFAULT_CUDA_ARCH` without one), a name
of :data:`TARGET_ALIASES` its dict. The public functions (``lstm_tvm.compile``, ``raw_ops``,
``build.make_spec``, tuning sessions, the tuning databases' lookups) accept a target as a kind
string, a JSON dict or a ``tvm.target.Target`` and resolve it here, once, into a
:class:`ResolvedTarget`: the TVM target, its cache identity (its JSON), its records key,
whether it is a CPU and, for one, its :class:`~lstm_tvm.schedule.traits.CpuTraits`. Internal
functions take that value as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import re

from ._tvm import host_arch, target_arch, target_triple, tvm
from .kernels.variant import KernelVariant
from .schedule.traits import CpuTraits, cpu_traits, host_llvm_mattr, kernel_variant

__all__ = ["DEFAULT_CUDA_ARCH", "ResolvedTarget", "TARGET_ALIASES", "cuda_arch", "from_key",
           "host_cpu", "missing_device_error", "records_key", "resolve", "resolve_target",
           "target_key", "target_name"]


@functools.cache
def host_cpu() -> str:
    """LLVM's name for this machine's CPU (``mcpu``), so that AVX-512/AVX2 get used."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def _host_llvm() -> dict:
    target = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": os.cpu_count() or 1}
    mattr = host_llvm_mattr(platform.machine())  # tuning flags (schedule.traits)
    if mattr:
        target["mattr"] = mattr
    return target


#: Short names of target dicts: ``--target aarch64`` is any 64-bit Arm Linux core with NEON.
TARGET_ALIASES = {
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
}


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
    raise TypeError("target: expected a kind string, a JSON dict or a tvm.target.Target, got "
                    f"{type(target).__name__}")


def target_name(target) -> str:
    """A short readable name of a target: ``"llvm znver4"``, ``"cuda sm_80"``."""
    target = resolve_target(target)
    kind = str(target.kind.name)
    detail = target.attrs.get("arch") if kind == "cuda" else target.attrs.get("mcpu")
    return f"{kind} {detail}" if detail else kind


def target_key(target: "tvm.target.Target") -> str:
    """A stable text identity of a target (its JSON: kind and every attribute), for cache keys."""
    return str(target)


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


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    """A target as resolved for lstm_tvm (see :func:`resolve`); equal, and hashed, by ``key``.

    ``key``: the target's JSON, kind and every attribute (a build's cache identity);
    ``target``: the ``tvm.target.Target`` of that JSON; ``records_key``: the folder of its
    tuning records (:func:`records_key`); ``cpu``: an ``llvm`` target; ``traits``: a CPU's
    :class:`~lstm_tvm.schedule.traits.CpuTraits` (None for a GPU).
    """

    key: str
    target: object = dataclasses.field(compare=False, repr=False)
    records_key: str = dataclasses.field(compare=False)
    cpu: bool = dataclasses.field(compare=False)
    traits: CpuTraits | None = dataclasses.field(compare=False, repr=False)

    @property
    def kind(self) -> str:
        """The target's kind: ``llvm``, ``cuda``."""
        return str(self.target.kind.name)

    def variant(self, prepacked: bool = False) -> KernelVariant:
        """The form of this target's kernels
        (:func:`lstm_tvm.schedule.traits.kernel_variant`), prepacked as given."""
        return kernel_variant(self.target, prepacked)


def resolve(target: object = "llvm") -> ResolvedTarget:
    """``target`` resolved: a :class:`ResolvedTarget` as it is, anything else through
    :func:`resolve_target` (``"llvm"`` and None: this host's CPU; ``"cuda"``:
    the local GPU's architecture; a name of ``TARGET_ALIASES``; a JSON dict or its text; a
    ``tvm.target.Target``)."""
    if isinstance(target, ResolvedTarget):
        return target
    return from_key(target_key(resolve_target(target)))


@functools.lru_cache(maxsize=64)
def from_key(key: str) -> ResolvedTarget:
    """The :class:`ResolvedTarget` of a target's JSON (its ``key``, as a build spec holds it)."""
    target = tvm.target.Target(json.loads(key))
    cpu = str(target.kind.name) == "llvm"
    return ResolvedTarget(key, target, records_key(target), cpu,
                          cpu_traits(target) if cpu else None)


def _machine(target) -> str:
    attrs = target.attrs
    for name in ("mcpu", "arch"):
        if name in attrs and str(attrs[name]):
            return str(attrs[name])
    # a CPU named by its triple alone (--target aarch64): its architecture
    return str(attrs["mtriple"]).split("-")[0] if str(attrs.get("mtriple", "")) else "generic"


def records_key(target) -> str:
    """The folder name of a target's tuning records (a ``tvm.target.Target`` or a
    :class:`ResolvedTarget`): its kind and CPU model or GPU architecture, ``<kind>-<mcpu or
    arch>``."""
    if isinstance(target, ResolvedTarget):
        return target.records_key
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{target.kind.name}-{_machine(target)}")
