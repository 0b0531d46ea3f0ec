"""Default CPU schedules: register-tiled GEMMs, parallel outer loops, vectorised inner loops.

Every kernel is made of named blocks of three shapes, and one rule handles each:

- *GEMMs* (a reduction block with two spatial iterators ``m, n``): an ``R x C`` tile of the
  output (``R`` rows, ``C`` contiguous columns) is accumulated over the reduction loop, which
  is unrolled (LLVM keeps the tile in vector registers); tiles run in parallel. The kernels
  round a dynamic row count up to a multiple of ``ROW_TILE`` (padded scratch rows), so the
  tile needs no bounds checks. A :class:`GemmTile` holds the choices (tile, unroll, an
  optional cache block of the reduction); tuning sessions pick them per block.
- *sums* (a reduction block with one spatial iterator): vectorised along it, reduction inside.
- *elementwise* blocks: fused, parallel outside, vectorised inside where the extent allows.
  Consecutive blocks of one fusion group (``spatial(..., group=)``) share one parallel loop.

Blocks inside a serial loop body marked ``LOOP_BODY`` (a time step, a chunk of rows that the
weight gradient reduces over) are scheduled the same way, except that their GEMMs never cut the
reduction into slabs (each slab is a parallel region, launched every iteration); the serial
loops stay serial.
A rule that cannot apply leaves the block as it is (still correct, only slower).
"""

from __future__ import annotations

import dataclasses
import logging

from tvm.s_tir.schedule import Trace
from tvm.sym import Analyzer

from .._tvm import SBlock, Schedule, tirx
from ..kernels._builder import FUSE_GROUP, LOOP_BODY, ROW_TILE, tensor_loads, uses_var
from .traits import CpuTraits, cpu_traits

log = logging.getLogger(__name__)

#: Inner (vectorised) column chunks tried, in elements, first that divides the extent wins.
COLUMN_CHOICES = (32, 64, 16)
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
                 per_step: bool = False, traits: CpuTraits = AVX512) -> GemmTile | None:
    """The untuned tile of a GEMM block with these extents (None: no tiling applies).

    ``a_rows_contiguous``: the left operand is stored ``(M, K)`` (else ``(K, M)``, as in the
    weight gradients). Among fixed rules measured on the GEMMs of the benchmark shapes
    (float32), cutting the reduction into slabs of 256 steps for ``(M, K)`` operands and of 64
    for ``(K, M)`` ones (where the reduction runs over all rows) came within 20% of each GEMM's
    best tile (geometric mean); without slabs, 76%. ``per_step`` (a block inside a time loop,
    or one reducing over a chunk of rows): no slabs, whose initialisation and every slab are
    a thread-pool launch per iteration (see docs/performance.md). The tile holds at most the
    target's :attr:`~lstm_tvm.schedule.traits.CpuTraits.accumulators` (8x32 with AVX-512, 2x32
    with AVX2 or NEON, 2x16 with SSE): a larger one spills its accumulators every step.
    """
    rows, cols = _register_tile(m_extent, n_extent, traits.accumulators)
    if cols is None:
        return None
    slab = 0 if per_step else next((b for b in ((256,) if a_rows_contiguous else (64,))
                                    if _divides(b, k_extent) and not _divides(k_extent, b)), 0)
    # One row per tile (a batch below ROW_TILE): tiles of a column panel run in a row, so a
    # thread reads each panel of the right operand once from memory for all rows.
    return GemmTile(rows, cols, K_UNROLL if _divides(K_UNROLL, k_extent) else 1, slab,
                    n_major=int(rows == 1))


def schedule_for(op_name: str, func, target, failures: list | None = None,
                 tuned: dict | None = None):
    """``func`` with the default schedule for ``target`` applied (CPU targets only for now).

    ``tuned`` maps block names to tuning-record traces in their JSON form (``Trace.as_json``
    of a task with one block of that name, see :mod:`lstm_tvm.tuning`), replayed on the
    block instead of its rule (the rule is the fallback if a trace does not apply). Blocks
    nothing could schedule keep their plain loops; their names and errors are appended to
    ``failures`` when given (tests require it to stay empty).
    """
    if str(target.kind.name) != "llvm":
        return func
    traits = cpu_traits(target)
    sch = Schedule(func)
    names = [sch.get(b).name_hint for b in leaf_blocks(sch)]
    for name in names:
        ways = [lambda s, name=name: _schedule_block(s, s.get_sblock(name), traits)]
        if tuned and name in tuned:
            ways.insert(0, lambda s, trace=tuned[name]: Trace.apply_json_to_schedule(trace, s))
        for way in ways:
            trial = sch.copy()
            try:
                way(trial)
            except Exception as err:  # noqa: BLE001 (any failure: the trial is discarded)
                log.warning("lstm_tvm: %s: block %s: %s %s failed: %s", op_name, name,
                            "tuned" if len(ways) > 1 and way is ways[0] else "default",
                            "schedule", str(err).splitlines()[-1][:200])
                if failures is not None:
                    failures.append((name, err))
            else:
                sch = trial
                break
    return _merge_groups(sch, op_name).mod["main"]


def leaf_blocks(sch: Schedule) -> list:
    """Every block of ``sch`` without child blocks (inside ``step`` blocks too), in order."""
    out = []

    def visit(parent):
        for child in sch.get_child_blocks(parent):
            if sch.get_child_blocks(child):
                visit(child)
            else:
                out.append(child)

    visit(sch.get_sblock("root"))
    return out


def gemm_axes(sch: Schedule, block):
    """``(m, n, k)`` loops and ``(M, N)`` extents of a GEMM-shaped block, else None."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if kinds != [tirx.IterVar.DataPar, tirx.IterVar.DataPar, tirx.IterVar.CommReduce]:
        return None
    return loops, [iv.dom.extent for iv in stmt.iter_vars[:2]]


def apply_gemm(sch: Schedule, block, tile: GemmTile) -> None:
    """Schedule a GEMM-shaped block (see :func:`gemm_axes`) with ``tile`` (whose fields may
    be sampled random variables of a tuning space)."""
    (m, n, k), _ = gemm_axes(sch, block)
    _gemm(sch, block, [m, n], k, tile)


def _schedule_block(sch: Schedule, block, traits: CpuTraits) -> None:
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
    reduce_ = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
    extents = [iv.dom.extent for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
    if len(spatial) + len(reduce_) != len(loops) or not spatial:
        return
    tile = None
    if len(spatial) == 2 and len(reduce_) == 1:
        tile = default_tile(*extents, sch.get(reduce_[0]).extent,
                            _rows_contiguous(stmt, *(iv.var for iv in stmt.iter_vars)),
                            _in_loop_body(sch, block), traits)
    if tile is not None:
        _gemm(sch, block, spatial, reduce_[0], tile)
    else:
        _generic(sch, block, spatial, reduce_, extents, stmt.init is not None)


def _in_loop_body(sch: Schedule, block) -> bool:
    """Whether ``block`` lies inside a serial loop body marked :data:`LOOP_BODY` (a time step,
    a chunk of rows its GEMMs reduce over)."""
    sref = sch.get_sref(block).parent
    while sref is not None:
        stmt = sref.stmt
        if isinstance(stmt, SBlock) and LOOP_BODY in stmt.annotations:
            return True
        sref = sref.parent
    return False


def _rows_contiguous(stmt, m, n, k) -> bool:
    """Whether the GEMM block's left operand (the load indexed by ``m`` and ``k``) is
    contiguous along ``k``."""
    for load in tensor_loads(getattr(stmt.body, "value", stmt.body)):
        if (any(uses_var(i, m) for i in load.indices)
                and any(uses_var(i, k) for i in load.indices)):
            return not uses_var(load.indices[-1], m)
    return True


def _divides(factor: int, extent) -> bool:
    """Whether ``factor`` provably divides ``extent`` (symbolic extents included)."""
    rem = Analyzer().simplify(tirx.floormod(extent, factor))
    return isinstance(rem, tirx.IntImm) and rem.value == 0


def _register_tile(m_extent, n_extent, accumulators: int) -> tuple[int, int | None]:
    """Rows and columns of a GEMM's register tile: the first of :data:`COLUMN_CHOICES` that
    divides the columns and leaves room for two rows, then as many rows as fit
    ``accumulators`` among ``ROW_TILE`` and its divisors that divide the row extent."""
    dividing = [c for c in COLUMN_CHOICES if _divides(c, n_extent)]
    cols = next((c for c in dividing if 2 * c <= accumulators), min(dividing, default=None))
    if cols is None:
        return 1, None
    rows = next((r for r in (ROW_TILE, 4, 2) if r * cols <= accumulators
                 and _divides(r, m_extent)), 1)
    return rows, cols


def _column_chunk(extent):
    return next((c for c in COLUMN_CHOICES if _divides(c, extent)), None)


def _gemm(sch, block, spatial, k, tile: GemmTile) -> None:
    """Tile a GEMM block. Tile fields may be ints or sampled ``ExprRV`` s (tuning spaces);
    ``k_block`` and ``k_unroll`` split only when given (an RV, or an int other than 0 / 1)."""
    m_o, m_i = sch.split(spatial[0], [None, tile.rows])
    n_o, n_i = sch.split(spatial[1], [None, tile.cols])
    k_o = k_i = None
    if _given(tile.k_block, 0):
        k_o, k = sch.split(k, [None, tile.k_block])
    if _given(tile.k_unroll, 1):
        k, k_i = sch.split(k, [None, tile.k_unroll])
    tiles = [n_o, m_o] if tile.n_major else [m_o, n_o]
    sch.reorder(*([k_o] if k_o is not None else []), *tiles, k,
                *([k_i] if k_i is not None else []), m_i, n_i)
    sch.parallel(sch.fuse(*tiles))
    if k_i is not None:
        sch.unroll(k_i)
    sch.unroll(m_i)
    sch.vectorize(n_i)
    # The init block's loop count depends on which tile loops have unit extent, so a
    # replayed trace must not address its loops (LLVM vectorises the zeroing by itself).
    sch.decompose_reduction(block, k_o if k_o is not None else k)


def _group(sch, block):
    return sch.get(block).annotations.get(FUSE_GROUP)


def _merge_groups(sch: Schedule, op_name: str) -> Schedule:
    """Run each run of consecutive same-group 2-D blocks (see :func:`kernels._builder.spatial`)
    with equal extents in one parallel loop (one thread-pool launch instead of several); the
    outer loop of a grouped block is left serial by :func:`_generic` for this."""
    runs: list[list] = []  # [(block name, outer loop, group)]
    for block in leaf_blocks(sch):
        group, loops = _group(sch, block), sch.get_loops(block)
        if (group is None or len(sch.get(block).iter_vars) != 2 or len(loops) < 2
                or sch.get(loops[-2]).kind != tirx.ForKind.SERIAL):
            runs.append([])  # a run never spans another block
            continue
        outer = loops[-2]
        entry = (sch.get(block).name_hint, outer, group)
        prev = runs[-1][-1] if runs and runs[-1] else None
        if (prev is not None and prev[2] == group
                and sch.get_sref(prev[1]).parent.same_as(sch.get_sref(outer).parent)
                and Analyzer().can_prove_equal(sch.get(prev[1]).extent, sch.get(outer).extent)):
            runs[-1].append(entry)
        else:
            runs.append([entry])

    def outer_loop(s, name):
        return s.get_loops(s.get_sblock(name))[-2]

    for run in runs:
        names = [name for name, _, _ in run]
        if len(names) > 1:
            trial = sch.copy()
            try:
                trial.parallel(trial.merge(*[outer_loop(trial, n) for n in names]))
            except Exception as err:  # noqa: BLE001 (fall back to a parallel loop each)
                log.warning("lstm_tvm: %s: merging the loops of %s failed: %s", op_name,
                            ", ".join(names), str(err).splitlines()[-1][:200])
            else:
                sch = trial
                continue
        for n in names:
            sch.parallel(outer_loop(sch, n))
    return sch


def _given(value, absent: int) -> bool:
    return not isinstance(value, int) or value != absent


def _generic(sch, block, spatial, reduce_, extents, has_init) -> None:
    chunk = _column_chunk(extents[-1])
    if chunk:
        n_o, n_i = sch.split(spatial[-1], [None, chunk])
        outer = spatial[:-1] + [n_o]
    else:
        n_i, outer = spatial[-1], spatial[:-1]
    if reduce_:
        sch.reorder(*outer, *reduce_, n_i)
    if outer:
        outer = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        if _group(sch, block) is None or len(spatial) != 2 or reduce_:
            sch.parallel(outer)  # else in _merge_groups
    if chunk:
        sch.vectorize(n_i)
    if reduce_ and has_init:
        sch.decompose_reduction(block, reduce_[0])
