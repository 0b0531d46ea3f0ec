"""The GEMM rule: register-tiled GEMM blocks.

A GEMM block (two spatial iterators ``m, n`` and one reduction) gets an ``R x C`` tile of the
output (``R`` rows, ``C`` contiguous columns) accumulated over the reduction loop, which is
unrolled (LLVM keeps the tile in vector registers); tiles run in parallel. The kernels round a
dynamic row count up to a multiple of ``ROW_TILE`` (padded scratch rows), so the tile needs no
bounds checks. A :class:`GemmTile` holds the choices (tile, unroll, an optional cache block of
the reduction); tuning sessions pick them per block. Inside a serial loop body (a time step, a
chunk of rows the weight gradient reduces over) the reduction is never cut into slabs: each
slab is a parallel region, launched every iteration.
"""

from __future__ import annotations

import dataclasses

from ..._tvm import Schedule, tirx
from ...kernels.contract import PANEL, ROW_TILE
from ...kernels.tir_analysis import at_most, is_static, tensor_loads, uses_var
from ..traits import CpuTraits
from ..blocks import in_loop_body
from .loop_facts import COLUMN_CHOICES, block_loops, divides

#: Unroll factor of the reduction loop in GEMMs.
K_UNROLL = 4
#: The traits schedules assume when given none: an AVX-512 x86 (the register tile of 8x32
#: float32 accumulators).
AVX512 = CpuTraits("x86_64", 512, 32)


@dataclasses.dataclass(frozen=True)
class GemmTile:
    """How one GEMM block is scheduled.

    ``rows x cols`` output elements per tile (``cols`` vectorised); the reduction loop
    unrolled by ``k_unroll``. With ``k_block > 0`` the reduction is cut into slabs of that
    many steps that run outside the parallel tile loop: every tile consumes one slab of both
    operands before the next (the cache blocking that GEMMs with a long reduction need).
    ``n_major`` orders the tiles column block first (consecutive tiles share the right
    operand's panel) instead of row block first.
    """

    rows: int
    cols: int
    k_unroll: int = K_UNROLL
    k_block: int = 0
    n_major: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def default_tile(m_extent, n_extent, k_extent, a_rows_contiguous: bool = True,
                 per_step: bool = False, traits: CpuTraits = AVX512,
                 b_layout: str = "kp", out_panels: bool = False) -> GemmTile | None:
    """The untuned tile of a GEMM block with these extents (None: no tiling applies).

    ``a_rows_contiguous``: the left operand is stored ``(M, K)`` (else ``(K, M)``, as in the
    weight gradients). Among fixed rules measured on the GEMMs of the benchmark shapes
    (float32), cutting the reduction into slabs of 256 steps for ``(M, K)`` operands and of 64
    for ``(K, M)`` ones (where the reduction runs over all rows) came within 20% of each GEMM's
    best tile (geometric mean); without slabs, 76%. ``per_step`` (a block inside a time loop,
    or one reducing over a chunk of rows): no slabs, whose initialisation and every slab are
    a thread-pool launch per iteration (see docs/performance.md). The tile holds at most the
    target's :attr:`~lstm_tvm.schedule.traits.CpuTraits.accumulators` (8x32 with AVX-512, 4x16
    with AVX2 or NEON, 2x16 with SSE): a larger one spills its accumulators every step; but
    AVX2's 6x16, with 3 registers to spare, where 6 divides the rows.

    ``b_layout``: how the right operand is stored, as in
    :class:`~lstm_tvm.kernels.contract.GemmBlock` (``"kp"`` column panels, ``"kn"`` a
    row-major ``(K, N)`` matrix, ``"nk"`` its transpose). ``"kn"``: a tile
    of few rows then widens to fill the accumulators (AVX-512: 1x256, 4x64): each reduction
    step reads a longer run of a row, where a narrow tile walks the matrix a few cache lines
    per row, a page apart (``LSTMBlockCell``'s product at B=1 runs about three times faster
    with the wide tile: docs/performance.md, "Earlier figures moved here from code comments").

    A GEMM with at least as many columns as reduction steps (``N >= K``: the forward's input
    product ``xw``, ``LSTMBlockCell``'s product with prepacked weights), its right operand in
    panels, outside a loop body: no slabs, tiles column block first. A thread then keeps one
    column panel (``K x cols``) in its cache and streams the left operand's rows past it,
    where row blocks first stream all of ``B`` (or a slab ``N x 256`` of it, 2 MB at ``N`` =
    2048: more than an L2) once per row block. Measured 1.0-1.2x the slabbed tile's speed at
    every such shape tried (AVX-512 and AVX2); where ``K > N`` (the backward's ``x_grad``,
    whose left operand ``M x 4H`` grows to tens of MB) column blocks first ran 11-16% slower
    at two of the shapes tried, so those keep the slabs (docs/performance.md).

    A GEMM of at most ``ROW_TILE`` rows (the sequence backward's last rows of ``x_grad``): no
    slabs either. Its left operand is a few rows, which no cache blocking helps, and each slab
    would be a thread-pool launch of its own.

    ``out_panels``: the output is stored as column panels. Inside a loop body such a GEMM
    (the sequence backward's weight gradient, accumulated chunk by chunk) runs column blocks
    first too: each thread adds to the same columns every iteration, a panel's rows one
    contiguous run. The per-step GEMMs with row-major outputs keep row blocks first (the gate
    math after a step's GEMM reads whole rows; column blocks first made BlockLSTMV2
    64x32x256x256 4% slower).
    """
    rows, cols = _register_tile(m_extent, n_extent, traits)
    if cols is None:
        return None
    while b_layout == "kn" and 2 * rows * cols <= traits.accumulators and divides(
            2 * cols, n_extent):
        cols *= 2
    panel_major = (not per_step and a_rows_contiguous and b_layout == "kp"
                   and _at_least(n_extent, k_extent))
    slab = 0 if per_step or panel_major or at_most(m_extent, ROW_TILE) else next(
        (b for b in ((256,) if a_rows_contiguous else (64,))
         if divides(b, k_extent) and not divides(k_extent, b)), 0)
    # One row per tile (a batch below ROW_TILE): tiles of a column panel run in a row, so a
    # thread reads each panel of the right operand once from memory for all rows.
    return GemmTile(rows, cols, K_UNROLL if divides(K_UNROLL, k_extent) else 1, slab,
                    n_major=int(rows == 1 or panel_major or (per_step and out_panels)))


def _at_least(a, b) -> bool:
    """``a >= b`` for extents known at build time (False where either is symbolic)."""
    return is_static(a) and is_static(b) and int(a) >= int(b)


def rule(sch: Schedule, block, traits: CpuTraits) -> GemmTile | None:
    """Tile ``block`` if it is a GEMM a register tile fits (:func:`default_tile`); the tile
    applied, or None where the rule does not apply."""
    loops = _gemm_loops(sch, block)
    if loops is None:
        return None
    stmt = sch.get(block)
    m, n, k = (iv.var for iv in stmt.iter_vars)
    tile = default_tile(*loops.extents, sch.get(loops.reduce[0]).extent,
                        _rows_contiguous(stmt, m, n, k), in_loop_body(sch, block), traits,
                        _right_layout(stmt, m, n, k), len(getattr(stmt.body, "indices", ())) == 3)
    if tile is not None:
        _gemm(sch, block, loops.spatial, loops.reduce[0], tile)
    return tile


def apply_gemm(sch: Schedule, block, tile: GemmTile) -> None:
    """Schedule a GEMM block (iterators ``m, n`` spatial and ``k`` a reduction, in that order)
    with ``tile`` (whose fields may be sampled random variables of a tuning space)."""
    loops = _gemm_loops(sch, block)
    if loops is None:
        raise ValueError(f"block {sch.get(block).name_hint!r} is not a GEMM (m, n, k)")
    _gemm(sch, block, loops.spatial, loops.reduce[0], tile)


def _gemm_loops(sch: Schedule, block):
    """The block's loops if it is GEMM-shaped (spatial ``m, n``, then a reduction ``k``)."""
    loops = block_loops(sch, block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if loops is None or kinds != [tirx.IterVar.DataPar, tirx.IterVar.DataPar,
                                  tirx.IterVar.CommReduce]:
        return None
    return loops


def _rows_contiguous(stmt, m, n, k) -> bool:
    """Whether the GEMM block's left operand (the load indexed by ``m`` and ``k``) is
    contiguous along ``k``."""
    for load in tensor_loads(getattr(stmt.body, "value", stmt.body)):
        if (any(uses_var(i, m) for i in load.indices)
                and any(uses_var(i, k) for i in load.indices)):
            return not uses_var(load.indices[-1], m)
    return True


def _right_layout(stmt, m, n, k) -> str | None:
    """How the GEMM block's right operand (the load indexed by ``n`` and ``k``, not ``m``) is
    stored: ``"kp"`` (three indices: column panels), ``"kn"`` (contiguous along ``n``) or
    ``"nk"``; None where no such load is found."""
    for load in tensor_loads(getattr(stmt.body, "value", stmt.body)):
        uses = [any(uses_var(i, v) for i in load.indices) for v in (m, n, k)]
        if uses == [False, True, True]:
            if len(load.indices) != 2:
                return "kp"
            return "kn" if uses_var(load.indices[-1], n) else "nk"
    return None


def _register_tile(m_extent, n_extent, traits: CpuTraits) -> tuple[int, int | None]:
    """Rows and columns of a GEMM's register tile for a target's ``traits``: the most rows among
    ``ROW_TILE`` and its divisors that divide the row extent and fit its
    :attr:`~lstm_tvm.schedule.traits.CpuTraits.accumulators` with columns at least two vectors
    (float32 :meth:`~lstm_tvm.schedule.traits.CpuTraits.lanes`) wide, the columns the first of
    :data:`COLUMN_CHOICES` that divides and fits (AVX-512: 8x32; AVX2 and NEON: 4x16 rather than
    2x32, docs/performance.md); with no such rows, one row of the first dividing columns that
    leave room for two, widened to four vectors where they divide (AVX-512: 1x64; two vectors of
    accumulators leave the FMA latency exposed: at T=100, I=H=256 the forward ran 3% faster at
    B=1, 25% at B=2, the backward 16-19%; docs/performance.md). Its
    :attr:`~lstm_tvm.schedule.traits.CpuTraits.gemm_tile_rows` come first where they divide the
    rows (AVX2: 6x16; the kernels cut GEMMs so that they do, see ``kernels._builder.gemm``)."""
    accumulators, lanes, tile_rows = traits.accumulators, traits.lanes(), traits.gemm_tile_rows
    dividing = [c for c in COLUMN_CHOICES if divides(c, n_extent)]
    if not dividing:
        return 1, None
    if tile_rows and divides(tile_rows, m_extent) and divides(2 * lanes, n_extent):
        return tile_rows, 2 * lanes
    wide = [c for c in dividing if c >= 2 * lanes] or dividing
    for rows in (ROW_TILE, 4, 2):
        fit = [c for c in wide if rows * c <= accumulators]
        if fit and divides(rows, m_extent):
            return rows, fit[0]
    cols = next((c for c in dividing if 2 * c <= accumulators), min(dividing))
    return 1, max(cols, 4 * lanes) if divides(4 * lanes, n_extent) else cols


def _gemm(sch, block, spatial, k, tile: GemmTile) -> None:
    """Tile a GEMM block. Tile fields may be ints or sampled ``ExprRV`` s (tuning spaces);
    ``k_block`` and ``k_unroll`` split only when given (an RV, or an int other than 0 / 1)."""
    m_o, m_i = sch.split(spatial[0], [None, tile.rows])
    n_o, n_i = sch.split(spatial[1], [None, tile.cols])
    n_p = None
    if isinstance(tile.cols, int) and tile.cols > PANEL and tile.cols % PANEL == 0:
        # One vector loop per column panel (see kernels._builder.panels): a vector spanning
        # two panels of a panel-major operand is a gather (4x slower at B=1).
        n_p, n_i = sch.split(n_i, [None, PANEL])
    k_o = k_i = None
    if _given(tile.k_block, 0):
        k_o, k = sch.split(k, [None, tile.k_block])
    if _given(tile.k_unroll, 1):
        k, k_i = sch.split(k, [None, tile.k_unroll])
    tiles = [n_o, m_o] if tile.n_major else [m_o, n_o]
    sch.reorder(*([k_o] if k_o is not None else []), *tiles, k,
                *([k_i] if k_i is not None else []), m_i, *([n_p] if n_p is not None else []),
                n_i)
    sch.parallel(sch.fuse(*tiles))
    if k_i is not None:
        sch.unroll(k_i)
    sch.unroll(m_i)
    if n_p is not None:
        sch.unroll(n_p)
    sch.vectorize(n_i)
    # The init block's loop count depends on which tile loops have unit extent, so a
    # replayed trace must not address its loops (LLVM vectorises the zeroing by itself).
    sch.decompose_reduction(block, k_o if k_o is not None else k)


def _given(value, absent: int) -> bool:
    return not isinstance(value, int) or value != absent
