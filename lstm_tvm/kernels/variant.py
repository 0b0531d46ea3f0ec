"""Which form of a kernel to build: every choice besides the op, dtype, sizes and attributes
that changes the code a kernel builder emits.

A :class:`KernelVariant` is a plain value passed to every kernel builder
(``kernel_func(op, dtype, I, H, attrs, variant)``). ``lstm_tvm.schedule.traits.kernel_variant``
makes the one a target takes; ``lstm_tvm.build.BuildSpec.variant`` the one a spec builds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["KernelVariant", "SKIPPABLE_OUTPUTS"]

#: The outputs a sequence backward's kernel can leave out (:attr:`KernelVariant.skipped`):
#: each is a GEMM over every step and batch row.
SKIPPABLE_OUTPUTS = ("w_grad", "x_grad")


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """The form of a kernel.

    ``cpu``: the CPU form (else the GPU form): it takes the versions only a CPU schedule
    handles, the small-batch versions of a step's GEMMs, the weight gradient's tail chunk (the
    GPU tiles need constant extents), and inputs that need only their element's alignment (x86
    and AArch64 load vectors from any address, at the aligned speed on aligned data, so callers
    pass any C-contiguous array in place; the GPU form keeps TVM's 64 bytes; outputs keep 64
    bytes either way). ``gemm_tile_rows``: rows of the target's GEMM register tile (0: one that
    divides ``ROW_TILE``); CPU GEMMs whose rows it does not divide are cut in two blocks.
    ``prepacked``: the kernel takes its weight panels as parameters (see :mod:`._weights`).
    ``fixed_sizes``: constant ``T`` and ``B`` as sorted ``(name, value)`` pairs (tuning tasks
    are cut from such static-shape kernels); empty: symbolic ones. ``l2_bytes``: the L2
    cache per core that working sets cut into chunks are sized for (the target's
    ``CpuTraits.l2_bytes``; the GPU form keeps this default, the CPU figure).
    ``tensor_cores`` (GPU form only): a float16 sequence forward keeps ``x`` and ``w`` in
    float16 for its input projection, whose rows are padded for tensor-core tiles, and adds the
    bias in the gate math (see :mod:`.block_lstm`). ``skipped``: outputs of a sequence
    backward the kernel neither computes nor writes (sorted names among
    :data:`SKIPPABLE_OUTPUTS`): a caller that needs no gradient of ``x`` (the first layer of a
    model, fed data) or of ``w`` (frozen weights) leaves out a GEMM over the whole sequence.
    """

    cpu: bool = True
    gemm_tile_rows: int = 0
    prepacked: bool = False
    fixed_sizes: tuple = ()
    l2_bytes: int = 2 * 2**20
    tensor_cores: bool = False
    skipped: tuple = ()

    def with_sizes(self, **sizes: int) -> KernelVariant:
        """This variant with constant sizes, e.g. ``with_sizes(T=64, B=32)``."""
        return dataclasses.replace(
            self, fixed_sizes=tuple(sorted((k, int(v)) for k, v in sizes.items())))

    def input_align(self, dtype: str) -> int:
        """The alignment an input buffer of ``dtype`` declares: its element's size for the CPU
        form, else 0 (TVM's allocation alignment, 64 bytes)."""
        return np.dtype(dtype).itemsize if self.cpu else 0
