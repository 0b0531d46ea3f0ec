"""A target resolved once: what every layer below the public functions takes.

The public functions (``lstm_tvm.compile``, ``raw_ops``, ``build.make_spec``, tuning sessions,
the tuning databases' lookups) accept a target as a kind string, a JSON dict or a
``tvm.target.Target`` and resolve it here, once, into a :class:`ResolvedTarget`: the TVM
target, its cache identity (its JSON), its records key, whether it is a CPU and, for one, its
:class:`~lstm_tvm.schedule.traits.CpuTraits`. Internal functions take that value as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

from ._tvm import resolve_target, target_key, tvm
from .kernels.variant import KernelVariant
from .schedule.traits import CpuTraits, cpu_traits, kernel_variant

__all__ = ["ResolvedTarget", "from_key", "records_key", "resolve"]


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
    :func:`lstm_tvm._tvm.resolve_target` (``"llvm"`` and None: this host's CPU; ``"cuda"``:
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
