"""The contract between the kernels and what schedules and tunes them: block names and
annotations the kernels emit, the tiles their buffers are padded to, and the description of
a GEMM block (:class:`GemmBlock`) that tuning tasks are cut from.

Schedules (:mod:`lstm_tvm.schedule`) and tuning (:mod:`lstm_tvm.tuning`) read kernels through
these names only; how the kernels emit them is :mod:`._builder`'s business.
"""

from __future__ import annotations

import dataclasses

__all__ = ["COLUMN_CHOICES", "FUSE_GROUP", "GATES", "GATE_ROW", "GATE_ROW_COPY",
           "GATE_ROWS_BELOW", "GemmBlock", "K_SLAB", "LOOP_BODY", "ONE_THREAD",
           "ONE_THREAD_BELOW", "PANEL", "ROW_TILE", "SHORT_ROWS", "SINGLE_ROWS_BELOW",
           "STEP_BLOCK", "TIME_STEP", "TRANSPOSE_LANES", "TRANSPOSE_TILE", "unit_chunk"]

#: Output rows a GEMM block computes together. GEMM blocks run over their row count rounded
#: up to a multiple of ROW_TILE (``padded``), so a schedule can tile rows without bounds
#: checks; their left operand and output are scratch buffers with room for the extra rows.
ROW_TILE = 8
#: Columns of a panel (see ``panels``): the register tile's width of GEMMs that read one.
PANEL = 32
#: Rows of the source a transposing ``panels`` copy walks per tile (one panel wide), where it
#: copies element by element (GPU builds, row counts :data:`TRANSPOSE_LANES` does not divide).
TRANSPOSE_TILE = 32
#: The side of the square tiles a CPU's transposing ``panels`` copy moves through vector
#: registers (a divisor of :data:`PANEL`).
TRANSPOSE_LANES = 16
#: Block annotation of ``KernelBuilder.spatial`` blocks in a fusion group (see there).
FUSE_GROUP = "lstm_tvm.fuse_group"
#: Block annotation of a product of a few rows inside a time step whose ``4H`` columns are
#: ``GATES`` blocks of ``H`` units each (the four gates of the forward's units; the backward's
#: ``dh`` summed over its four gate blocks) (``KernelBuilder.gate_rows``); its value names the
#: fusion group of the gate math that reads it. A schedule may compute each chunk of units'
#: columns in the iteration of the group's loop that reads them, so a step needs one barrier,
#: not two.
GATE_ROW = "lstm_tvm.gate_row"
#: Block annotation of a copy of the rows a ``GATE_ROW`` product reads, one copy per chunk of
#: units (:func:`unit_chunk`), made in that chunk's iteration of the group's loop (its value
#: the group's name): each thread then reads the state that other threads wrote in one burst
#: of loads rather than line by line in the product's reduction (``KernelBuilder.row_copies``).
GATE_ROW_COPY = "lstm_tvm.gate_row_copy"
#: Inner (vectorised) column chunks tried, in elements: the first that divides the extent
#: wins.
COLUMN_CHOICES = (32, 64, 16)
#: Gates per unit: a step's product has ``GATES`` blocks of ``H`` columns.
GATES = 4
#: Batches below this run a sequence step's product with the gate math that reads it, a chunk
#: of units at a time (``KernelBuilder.gate_rows``), in a version per batch (``few_rows``):
#: the product's rows then share each pass over ``W_h``, and a row's four gates fill the
#: register tile.
GATE_ROWS_BELOW = 3
#: Row multiple of reductions over all ``T*B`` rows (the weight gradients): their operands are
#: zero past the last row up to this multiple, so a schedule may block the reduction by any
#: divisor of it without bounds checks.
K_SLAB = 256
#: Name of the block that holds one step of a sequence kernel's time loop (``time_loop``;
#: a second ``version`` of the loop adds its suffix).
STEP_BLOCK = "step"
#: Block annotation of every time step block (of each version).
TIME_STEP = "lstm_tvm.time_step"
#: Block annotation of a serial loop's body whose GEMMs are ``per_step`` (see
#: :class:`GemmBlock`): a time step, or a chunk of ``row_chunks`` with ``per_step``.
LOOP_BODY = "lstm_tvm.loop_body"
#: Block annotation of blocks whose loops stay on the calling thread: those of
#: ``by_work``'s small versions, and small constant-size blocks (see ``spatial``).
ONE_THREAD = "lstm_tvm.one_thread"
#: Work (elements, see ``by_work``) below which blocks run on one thread: a launch of the
#: thread pool costs more than it saves below it (the cell ops' gate math at H=256 on 2 cores:
#: one thread is faster up to B=32, ``B * 4H`` = 32768, two from B=64; docs/performance.md).
ONE_THREAD_BELOW = 65536
#: Batches below this many rows run their per-step GEMMs one row per tile, without padding.
#: A one-row tile holds two vectors of accumulators, too few to hide the FMA latency, so from
#: 3 rows on a tile of several rows is as fast or faster (docs/performance.md).
SINGLE_ROWS_BELOW = 3
#: Batches of ``SINGLE_ROWS_BELOW`` up to this many rows run their per-step GEMMs padded to
#: this many rows, not ``ROW_TILE`` (half the arithmetic at B = 4): a tile of 4 rows holds
#: enough accumulators with AVX2, NEON and AVX-512 alike.
SHORT_ROWS = 4


@dataclasses.dataclass(frozen=True)
class GemmBlock:
    """What one GEMM block computes, as seen by tuning: its name, ``M x N x K`` extents (with
    ``seq_len_max`` bound to ``T`` in a kernel of constant sizes,
    :attr:`.variant.KernelVariant.fixed_sizes`), and each operand's layout (``"mk"``/``"km"``
    for ``a``, ``"kn"``/``"nk"`` for ``b``: the second letter is the contiguous axis; ``"kp"``
    for a ``b`` stored as column panels, ``KernelBuilder.panels``) and storage dtype;
    ``per_step``: the block runs once per iteration of a serial loop, a time step or a chunk of
    ``KernelBuilder.row_chunks`` (``per_step``): cutting its reduction into slabs would add a
    parallel region per iteration and re-read its output."""

    name: str
    M: object
    N: object
    K: object
    a_layout: str
    a_dtype: str
    b_layout: str
    b_dtype: str
    per_step: bool = False


def unit_chunk(units: int) -> int | None:
    """The units of a ``GATE_ROW`` product's chunk (each iteration of its group's loop): the
    first of :data:`COLUMN_CHOICES` dividing ``units``; None where none does."""
    return next((c for c in COLUMN_CHOICES if units % c == 0), None)
