"""Default CPU schedules: parallel outer loops, vectorised contiguous inner loops.

Every kernel is made of named blocks of two shapes, and one rule handles each shape:

- *reductions* (GEMMs and sums): the block's last spatial iterator runs along contiguous
  memory in every operand. It is split into a vector-wide inner part, the reduction loops are
  moved inside the outer part, the outer spatial loops are fused and run in parallel, and the
  accumulator's init is split out (``decompose_reduction``).
- *elementwise* blocks: fused, parallel outside, vectorised inside where the extent allows.

Blocks inside a time loop (``step``) are scheduled the same way; the time loop stays serial.
A rule that does not apply leaves the block as it is (still correct, only slower).
"""

from __future__ import annotations

import logging

from .._tvm import Schedule, tirx

log = logging.getLogger(__name__)

#: Widest inner vector chunk tried, in elements (AVX-512: 16 float32 lanes).
VECTOR_LANES = 16
INNER_CHOICES = (32, 64, 16)
#: Output rows computed together in a reduction (the tile is ROWS x 32 floats).
ROWS = 2
#: Per-block overrides of ``(ROWS, INNER_CHOICES)``, by block name.
TILES: dict[str, tuple[int, tuple[int, ...]]] = {
    "w_grad_x": (8, (64, 32, 16)),
    "w_grad_h": (8, (64, 32, 16)),
}


def schedule_for(op_name: str, func, target):
    """``func`` with the default schedule for ``target`` applied (CPU targets only for now)."""
    if str(target.kind.name) != "llvm":
        return func
    sch = Schedule(func)
    for block in _leaf_blocks(sch):
        try:
            _schedule_block(sch, block)
        except Exception as err:  # a block a rule cannot handle keeps its plain loops
            log.debug("lstm_tvm: no default schedule for block %s: %s",
                      sch.get(block).name_hint, err)
    return sch.mod["main"]


def _leaf_blocks(sch: Schedule):
    root = sch.get_sblock("root") if _has_root(sch) else None
    out = []

    def visit(parent):
        for child in sch.get_child_blocks(parent):
            grand = sch.get_child_blocks(child)
            if grand:
                visit(child)
            else:
                out.append(child)

    visit(root)
    return out


def _has_root(sch: Schedule) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def _static_extent(dom) -> int | None:
    ext = dom.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _schedule_block(sch: Schedule, block) -> None:
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
    reduce_ = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce_) != len(loops) or not spatial:
        return
    doms = [iv.dom for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
    inner_ext = _static_extent(doms[-1])
    rows, choices = TILES.get(stmt.name_hint, (ROWS, INNER_CHOICES))
    chunk = next((c for c in choices if inner_ext and inner_ext % c == 0), None)
    if chunk:
        n_o, n_i = sch.split(spatial[-1], [None, chunk])
    else:
        n_o, n_i = None, spatial[-1]
    outer = spatial[:-1]
    m_i = None
    if reduce_ and outer:
        # Register tile: ROWS rows of the output share each loaded vector of the right operand.
        m_o, m_i = sch.split(outer[-1], [None, rows])
        outer = outer[:-1] + [m_o]
    if n_o is not None:
        outer = outer + [n_o]
    if reduce_:
        sch.reorder(*outer, *reduce_, *([m_i] if m_i is not None else []), n_i)
    fused = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if fused is not None:
        sch.parallel(fused)
    if m_i is not None:
        sch.unroll(m_i)
    if chunk:
        sch.vectorize(n_i)
    if reduce_ and stmt.init is not None:
        sch.decompose_reduction(block, reduce_[0])
