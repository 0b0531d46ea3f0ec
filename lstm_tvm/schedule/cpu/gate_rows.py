"""Products of a few rows computed where their gate math runs: one barrier per step.

At batch 1 or 2 a sequence step is a product of a few rows (forward: ``h @ W_h``, ``4H``
columns, the four gates of ``H`` units; backward: ``dh``, one column block per gate, summed
where it is read) and the gate math of the ``H`` units. Run as two parallel loops, a step
costs two barriers of the thread pool, and each thread's gate math reads values that another
thread computed. A block marked ``GATE_ROW`` (``KernelBuilder.gate_rows``) is instead
tiled by chunks of units: iteration ``u`` of its outer loop computes each gate block of every
row for the units that iteration ``u`` of the gate math's loop reads, and the two loops become
one. Each thread then streams its own slice of ``W_h`` once a step for all rows, reads only
values it computed, and the step ends with the one barrier that the next step's product needs
(what it reads is double-buffered by the kernel or another row, so no thread overwrites what
another still reads).

:func:`rule` tiles the product (each row's four gate vectors accumulated over the whole
reduction in registers) and the gate math's blocks (unit chunk outermost);
:func:`merge_gate_rows` joins their loops. Where they cannot be joined, each runs in a
parallel loop of its own: correct, with a barrier more.

The rows the product reads (the state the previous step's threads wrote) come through a copy
per chunk (a ``GATE_ROW_COPY`` block, ``KernelBuilder.row_copies``) made first in the chunk's
iteration: the thread loads the lines other cores wrote in one burst instead of one miss at a
time as the reduction reaches them (docs/performance.md).
"""

from __future__ import annotations

import logging

from ..._tvm import Schedule
from ...kernels.contract import GATE_ROW, GATE_ROW_COPY, GATES, unit_chunk
from ...kernels.tir_analysis import divides, is_static
from ..blocks import fusion_group, leaf_blocks
from ..traits import CpuTraits
from .gemm import K_UNROLL
from .loop_facts import block_loops, column_chunk

log = logging.getLogger(__name__)

#: Where :func:`rule` leaves the loops :func:`merge_gate_rows` works on: a product's reduction
#: loop (after the unit chunk and the part of it), a gate math block's unit chunk loop (before
#: the rows and the vector).
_PRODUCT_K, _MEMBER_CHUNK = 2, -3


def rule(sch: Schedule, block, traits: CpuTraits, tiled: set | None = None) -> bool | None:
    """Tile a ``GATE_ROW`` block by unit chunks (the chunk :func:`~.loop_facts.column_chunk`
    gives its ``H``), and the blocks of the fusion group it names (unit chunks outermost, then
    the rows); None for other blocks and where the sizes do not divide. The unit chunk loops
    are left serial for :func:`merge_gate_rows`. ``tiled``: :func:`tiled_groups` of the
    function, where the caller has it (else found here, a scan of every block)."""
    if GATE_ROW in sch.get(block).annotations:
        return _product(sch, block, traits)
    if GATE_ROW_COPY in sch.get(block).annotations:
        tiled = tiled_groups(sch, traits) if tiled is None else tiled
        return _row_copy(sch, block, traits, str(sch.get(block).annotations[GATE_ROW_COPY])
                         in tiled)
    group = fusion_group(sch, block)
    if group is None or group not in (tiled_groups(sch, traits) if tiled is None else tiled):
        return None
    loops = block_loops(sch, block)
    if loops is None or len(loops.spatial) != 2 or loops.reduce:
        return None
    chunk = column_chunk(loops.extents[1])
    if chunk is None:
        return None
    n, k = loops.spatial
    k_o, k_i = sch.split(k, [None, chunk])
    sch.reorder(k_o, n, k_i)
    sch.vectorize(k_i)
    return True


def _tile(sch: Schedule, block, traits: CpuTraits) -> tuple | None:
    """``(rows, units, chunk, cols)`` of a ``GATE_ROW`` block: its rows, the units ``H``, the
    unit chunk and the columns of a gate that a register tile holds; None where it does not
    tile."""
    loops = block_loops(sch, block)
    if loops is None or len(loops.spatial) != 2 or len(loops.reduce) != 1:
        return None
    m_extent, n_extent = loops.extents
    if not (is_static(m_extent) and is_static(n_extent)) or int(n_extent) % GATES:
        return None
    rows, units = int(m_extent), int(n_extent) // GATES
    chunk = unit_chunk(units)  # the kernel's row copies are made per such chunk
    if chunk is None:
        return None
    # Every row's four gates of ``cols`` columns in registers, at most half the vector
    # registers (the rest hold the loads and the broadcast elements): one row takes 4x32
    # with AVX-512, 4x16 with AVX2 and NEON.
    cols = next((c for c in (chunk, chunk // 2, chunk // 4, chunk // 8)
                 if c and chunk % c == 0 and rows * GATES * c <= traits.accumulators), None)
    return None if cols is None else (rows, units, chunk, cols)


def _product(sch: Schedule, block, traits: CpuTraits) -> bool | None:
    tile = _tile(sch, block, traits)
    if tile is None:
        return None
    _, units, chunk, cols = tile
    loops = block_loops(sch, block)
    m, n = loops.spatial
    k = loops.reduce[0]
    g, u, part, c = sch.split(n, [GATES, units // chunk, chunk // cols, cols])
    k_i = None
    if divides(K_UNROLL, sch.get(k).extent):
        k, k_i = sch.split(k, [None, K_UNROLL])
    sch.reorder(u, part, k, *([k_i] if k_i is not None else []), m, g, c)
    if k_i is not None:
        sch.unroll(k_i)
    sch.unroll(m)
    sch.unroll(g)
    sch.vectorize(c)
    return True


#: Vector registers a ``GATE_ROW_COPY`` block moves an iteration: loads in flight together.
_COPY_VECTORS = 4


def _row_copy(sch: Schedule, block, traits: CpuTraits, tiled: bool) -> bool:
    """A ``GATE_ROW_COPY`` block (loops: unit chunk, row, element): the elements in runs of
    :data:`_COPY_VECTORS` vectors, the chunk loop left to :func:`merge_gate_rows`; where its
    product is not ``tiled`` (so the chunks are not its loop's), inlined into the product,
    which then reads the rows in place."""
    if not tiled:
        sch.compute_inline(block)
        return True
    k = sch.get_loops(block)[-1]
    width = traits.lanes() * _COPY_VECTORS
    if divides(width, sch.get(k).extent):
        k = sch.split(k, [None, width])[1]
    sch.vectorize(k)
    return True


def tiled_groups(sch: Schedule, traits: CpuTraits) -> set:
    """The fusion groups named by ``GATE_ROW`` blocks that :func:`rule` tiles. It reads the
    blocks' iterators, not their loops, so scheduling other blocks does not change it: one
    scan serves a whole function."""
    return {str(sch.get(b).annotations[GATE_ROW]) for b in leaf_blocks(sch)
            if GATE_ROW in sch.get(b).annotations and _tile(sch, b, traits) is not None}


def merge_gate_rows(sch: Schedule, op_name: str, failures: list | None = None) -> Schedule:
    """Join each ``GATE_ROW`` block's unit chunk loop with those of its fusion group's blocks
    (all tiled by :func:`rule`) into one parallel loop; where that fails (the block's name
    and the error appended to ``failures``), each is made a parallel loop of its own. Blocks
    tiled otherwise are left as they are."""
    for name in [sch.get(b).name_hint for b in leaf_blocks(sch)
                 if GATE_ROW in sch.get(b).annotations]:
        block = sch.get_sblock(name)
        if sch.get(block).init is None:
            continue  # decomposed: scheduled by another rule
        group = str(sch.get(block).annotations[GATE_ROW])
        leaves = leaf_blocks(sch)
        copies = [sch.get(b).name_hint for b in leaves
                  if str(sch.get(b).annotations.get(GATE_ROW_COPY, "")) == group]
        members = [sch.get(b).name_hint for b in leaves if fusion_group(sch, b) == group]
        # the copies first: the merged loop runs the bodies in this order
        outer = [lambda s, b=b: s.get_loops(s.get_sblock(b))[0] for b in copies]
        outer += [lambda s: s.get_loops(s.get_sblock(name))[0]]
        outer += [lambda s, b=b: s.get_loops(s.get_sblock(b))[_MEMBER_CHUNK] for b in members]
        trial = sch.copy()
        try:
            trial.parallel(trial.merge(*[loop(trial) for loop in outer]))
        except Exception as err:  # noqa: BLE001 (fall back to a parallel loop each)
            log.warning("lstm_tvm: %s: joining %s with its gate math failed: %s", op_name,
                        name, str(err).splitlines()[-1][:200])
            if failures is not None:
                failures.append((name, err))
            for loop in outer:
                sch.parallel(loop(sch))
        else:
            sch = trial
        # Decomposed after the loop is made parallel: a parallel loop's blocks must each be
        # the only writer of what they write.
        sch.decompose_reduction(sch.get_sblock(name),
                                 sch.get_loops(sch.get_sblock(name))[_PRODUCT_K])
    return sch
