"""Default CPU schedules: register-tiled GEMMs, parallel outer loops, vectorised inner loops.

Every kernel is made of named blocks of three shapes, and one rule handles each:

- *GEMMs* (a reduction block with two spatial iterators ``m, n``): an ``R x C`` tile of the
  output (``R`` rows, ``C`` contiguous columns) is accumulated over the reduction loop, which
  is unrolled by 4 (LLVM keeps the tile in vector registers); tiles run in parallel. The
  kernels round a dynamic row count up to a multiple of ``ROW_TILE`` (padded scratch rows), so
  the tile needs no bounds checks.
- *sums* (a reduction block with one spatial iterator): vectorised along it, reduction inside.
- *elementwise* blocks: fused, parallel outside, vectorised inside where the extent allows.

Blocks inside a time loop (``step``) are scheduled the same way; the time loop stays serial.
A rule that cannot apply leaves the block as it is (still correct, only slower).
"""

from __future__ import annotations

import logging

from tvm.sym import Analyzer

from .._tvm import Schedule, tirx
from ..kernels._builder import ROW_TILE

log = logging.getLogger(__name__)

#: Inner (vectorised) column chunks tried, in elements, first that divides the extent wins.
COLUMN_CHOICES = (32, 64, 16)
#: Unroll factor of the reduction loop in GEMMs.
K_UNROLL = 4


def schedule_for(op_name: str, func, target, failures: list | None = None):
    """``func`` with the default schedule for ``target`` applied (CPU targets only for now).

    Blocks a rule could not schedule keep their plain loops; their names and errors are
    appended to ``failures`` when given (tests require it to stay empty).
    """
    if str(target.kind.name) != "llvm":
        return func
    sch = Schedule(func)
    names = [sch.get(b).name_hint for b in _leaf_blocks(sch)]
    for name in names:
        trial = sch.copy()
        try:
            _schedule_block(trial, trial.get_sblock(name))
        except Exception as err:  # the block keeps its plain loops (trial discarded)
            log.warning("lstm_tvm: %s: no default schedule for block %s: %s",
                        op_name, name, str(err).splitlines()[-1][:200])
            if failures is not None:
                failures.append((name, err))
        else:
            sch = trial
    return sch.mod["main"]


def _leaf_blocks(sch: Schedule):
    out = []

    def visit(parent):
        for child in sch.get_child_blocks(parent):
            if sch.get_child_blocks(child):
                visit(child)
            else:
                out.append(child)

    visit(sch.get_sblock("root"))
    return out


def _schedule_block(sch: Schedule, block) -> None:
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
    reduce_ = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
    extents = [iv.dom.extent for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
    if len(spatial) + len(reduce_) != len(loops) or not spatial:
        return
    rows = _row_tile(extents[0]) if len(spatial) == 2 else 1
    if len(reduce_) == 1 and rows > 1:
        _gemm(sch, block, spatial, reduce_[0], extents, rows)
    else:
        _generic(sch, block, spatial, reduce_, extents, stmt.init is not None)


def _divides(factor: int, extent) -> bool:
    """Whether ``factor`` provably divides ``extent`` (symbolic extents included)."""
    rem = Analyzer().simplify(tirx.floormod(extent, factor))
    return isinstance(rem, tirx.IntImm) and rem.value == 0


def _row_tile(extent) -> int:
    """Rows per GEMM tile: ``ROW_TILE`` if it divides the row extent, else a divisor of it."""
    return next((r for r in (ROW_TILE, 4, 2) if _divides(r, extent)), 1)


def _column_chunk(extent):
    return next((c for c in COLUMN_CHOICES if _divides(c, extent)), None)


def _gemm(sch, block, spatial, k, extents, rows) -> None:
    chunk = _column_chunk(extents[1])
    if chunk is None:
        return _generic(sch, block, spatial, [k], extents, True)
    m_o, m_i = sch.split(spatial[0], [None, rows])
    n_o, n_i = sch.split(spatial[1], [None, chunk])
    k_i = None
    if _divides(K_UNROLL, sch.get(k).extent):
        k, k_i = sch.split(k, [None, K_UNROLL])
        sch.reorder(m_o, n_o, k, k_i, m_i, n_i)
    else:
        sch.reorder(m_o, n_o, k, m_i, n_i)
    sch.parallel(sch.fuse(m_o, n_o))
    if k_i is not None:
        sch.unroll(k_i)
    sch.unroll(m_i)
    sch.vectorize(n_i)
    init = sch.decompose_reduction(block, k)
    sch.vectorize(sch.get_loops(init)[-1])


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
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    if chunk:
        sch.vectorize(n_i)
    if reduce_ and has_init:
        sch.decompose_reduction(block, reduce_[0])
