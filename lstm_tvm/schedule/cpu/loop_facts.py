"""Loop facts the CPU rules share: which loops a block has, what divides an extent (whether a
block runs inside a serial loop body and its fusion group: :mod:`lstm_tvm.schedule.blocks`)."""

from __future__ import annotations

import dataclasses

from ..._tvm import Schedule, tirx
from ...kernels.contract import COLUMN_CHOICES
from ...kernels.tir_analysis import divides



@dataclasses.dataclass(frozen=True)
class BlockLoops:
    """A block's own loops (the innermost, one per iterator) split by kind, with the extents
    of its spatial iterators; ``None`` from :func:`block_loops` when they do not line up."""

    spatial: list
    reduce: list
    extents: list
    has_init: bool


def block_loops(sch: Schedule, block) -> BlockLoops | None:
    """The :class:`BlockLoops` of ``block``, or None (no spatial iterator, or loops that are
    not one per iterator)."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
    reduce_ = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce_) != len(loops) or not spatial:
        return None
    extents = [iv.dom.extent for iv, k in zip(stmt.iter_vars, kinds) if k == tirx.IterVar.DataPar]
    return BlockLoops(spatial, reduce_, extents, stmt.init is not None)




def column_chunk(extent) -> int | None:
    """The first of :data:`COLUMN_CHOICES` dividing ``extent`` (None: none does)."""
    return next((c for c in COLUMN_CHOICES if divides(c, extent)), None)
