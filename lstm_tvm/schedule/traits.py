"""What a CPU target offers the schedules and kernels: vector width, vector registers, f16
arithmetic, vendor, L2 cache.

Derived from the target's ``mtriple``, ``mcpu`` and ``mattr`` through LLVM's own CPU feature
tables (the host's when the target names none), so a target is described without its hardware:
an AVX2-only x86 (``{"kind": "llvm", "mcpu": "haswell"}``), an AVX-512 x86, an AArch64 NEON core
(``{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}``). Also the LLVM
tuning flags lstm_tvm gives a target for this host's CPU (:func:`host_llvm_mattr`).
"""

from __future__ import annotations

import dataclasses
import functools
import json

from .._tvm import target_arch, tvm
from ..env import cuda_tensor_cores
from ..kernels.contract import ROW_TILE
from ..kernels.variant import KernelVariant

__all__ = ["CpuTraits", "cpu_traits", "cut_tile_rows", "host_llvm_mattr", "kernel_variant"]

#: x86 vector extensions, widest first: (LLVM feature, vector bits, vector registers).
_X86_VECTORS = (("avx512f", 512, 32), ("avx", 256, 16), ("sse2", 128, 16))
#: LLVM's names of AMD x86 CPUs start with one of these (the rest are Intel's, or generic).
_AMD_CPUS = ("znver", "bdver", "btver", "amdfam", "athlon", "opteron", "barcelona", "k8", "k6",
             "geode")
#: LLVM's names of x86 CPUs of no vendor: the baseline and the x86-64 feature levels.
_GENERIC_CPUS = ("", "generic", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
#: L2 cache per core assumed of every CPU: LLVM's tables hold no cache sizes. 2 MiB, as on the
#: machine the weight gradient's chunks were measured on (others have 1 MiB).
_L2_BYTES = 2 * 2**20


@dataclasses.dataclass(frozen=True)
class CpuTraits:
    """A CPU target's facts that schedules depend on.

    ``arch``: the triple's architecture (``x86_64``, ``aarch64``); ``vector_bits``: the widest
    vector register; ``vector_registers``: how many the ISA has; ``f16_arithmetic``: whether
    float16 arithmetic is native (AVX512-FP16, Armv8.2 FP16), else float16 is widened;
    ``extension``: the widest vector extension by LLVM's name (``avx512f``, ``avx2``, ``sve``,
    ``neon``, else ``generic``), which names the ISA class of tuning records; ``vendor``: an
    x86 CPU's maker by its LLVM name (``intel``, ``amd``, or ``generic`` for the baseline and
    feature levels), empty for other architectures; ``l2_bytes``: the L2 cache per core that
    kernels size chunked working sets for.
    """

    arch: str
    vector_bits: int
    vector_registers: int
    f16_arithmetic: bool = False
    extension: str = "generic"
    vendor: str = ""
    l2_bytes: int = _L2_BYTES

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register."""
        return max(1, self.vector_bits // tvm.DataType(dtype).bits)

    @property
    def accumulators(self) -> int:
        """float32 outputs a GEMM register tile may hold: half the vector registers (the rest
        hold the operands), enough independent FMAs to hide their latency without spilling
        (256 with AVX-512, 64 with AVX2 or NEON)."""
        return self.vector_registers // 2 * self.lanes("float32")

    @property
    def gemm_tile_rows(self) -> int:
        """Rows of a float32 GEMM register tile two vectors wide beyond what
        :attr:`accumulators` allow, or 0. With AVX2's 16 registers: 6 (6x16, 12 accumulator
        registers, two for the right operand's row and one for a broadcast), against 4x16's 8,
        which leave the FMA latency exposed (Haswell keeps 10 in flight; measured close to the
        AVX2 FMA peak with 6 rows, well below it with 4: docs/performance.md, "Earlier
        figures moved here from code comments"). AVX-512 gained nothing from taller tiles, others are not
        measured: 0."""
        x86_avx = self.arch == "x86_64" and self.vector_bits == 256
        return (self.vector_registers - 3) // 2 if x86_avx else 0


def cpu_traits(target) -> CpuTraits:
    """The :class:`CpuTraits` of an ``llvm`` target (a ``tvm.target.Target``)."""
    return _traits(str(target))  # its JSON text


@functools.lru_cache(maxsize=64)
def _traits(target_json: str) -> CpuTraits:
    target = tvm.target.Target(json.loads(target_json))
    arch = target_arch(target)
    has = functools.partial(tvm.target.codegen.llvm_cpu_has_features, target=target)
    extension = next((f for f in ("avx512f", "avx2", "sve", "neon") if has(f)), "generic")
    if arch in ("x86_64", "i386", "i686"):
        bits, regs = next(((b, r) for f, b, r in _X86_VECTORS if has(f)), (64, 8))
        return CpuTraits(arch, bits, regs if arch == "x86_64" or bits == 512 else 8,
                         bool(has("avx512fp16")), extension,
                         _x86_vendor(str(target.attrs.get("mcpu", ""))))
    if arch in ("aarch64", "arm64"):
        # SVE's width is set by the hardware, not the target: NEON's 128 bits are what
        # every AArch64 core has.
        return CpuTraits(arch, 128, 32, bool(has("fullfp16")), extension)
    return CpuTraits(arch, 128, 16, False, extension)


def host_llvm_mattr(machine: str) -> list[str]:
    """The LLVM ``mattr`` flags of a target for this host's CPU (``"llvm"``), by the host's
    architecture as ``platform.machine()`` names it: tuning flags, not features."""
    if machine.lower() in ("x86_64", "amd64"):
        # LLVM's tuning for many AVX-512 CPUs (Ice Lake and later Intel cores) prefers 256-bit
        # vectors: the vectorised gate math then ran in ymm halves. Without the preference it
        # uses zmm, and nothing got slower (docs/performance.md, "512-bit vectors for the gate
        # math"). A tuning flag only: CPUs without AVX-512 are unaffected.
        return ["-prefer-256-bit"]
    return []


def _x86_vendor(mcpu: str) -> str:
    return ("generic" if mcpu in _GENERIC_CPUS else
            "amd" if mcpu.startswith(_AMD_CPUS) else "intel")


@functools.cache
def cut_tile_rows() -> tuple[int, ...]:
    """The register tile rows, among every x86 vector extension's, that do not divide
    ``ROW_TILE``: the rows a CPU kernel may cut its GEMMs for (AVX2: 6; see
    :attr:`CpuTraits.gemm_tile_rows`)."""
    rows = (CpuTraits("x86_64", bits, regs).gemm_tile_rows for _, bits, regs in _X86_VECTORS)
    return tuple(r for r in dict.fromkeys(rows) if r and ROW_TILE % r)


def tensor_cores(target) -> bool:
    """Whether ``target``'s float16 kernels put their input projection on tensor cores: a CUDA
    target, with :func:`lstm_tvm.env.cuda_tensor_cores`."""
    return str(target.kind.name) == "cuda" and cuda_tensor_cores()


def kernel_variant(target, prepacked: bool = False) -> KernelVariant:
    """The :class:`~lstm_tvm.kernels.variant.KernelVariant` of ``target``'s kernels (a
    ``tvm.target.Target``): the CPU form for an ``llvm`` target (GEMMs cut for its register
    tile's rows, :attr:`CpuTraits.gemm_tile_rows`; chunks sized for its
    :attr:`CpuTraits.l2_bytes`), else the GPU form (with :func:`tensor_cores` as it says);
    ``prepacked`` as given."""
    if str(target.kind.name) != "llvm":
        return KernelVariant(cpu=False, prepacked=prepacked, tensor_cores=tensor_cores(target))
    traits = cpu_traits(target)
    return KernelVariant(cpu=True, gemm_tile_rows=traits.gemm_tile_rows, prepacked=prepacked,
                         l2_bytes=traits.l2_bytes)
