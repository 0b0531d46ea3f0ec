"""The rule for every other block: sums (a reduction with one spatial iterator), vectorised
along it with the reduction inside, and elementwise blocks, parallel outside and vectorised
inside where the extent allows. The outer loop of a block in a fusion group is left serial:
:mod:`.fusion` runs the group's blocks in one parallel loop; that of a block marked to run on
one thread (``by_work`` in the kernels) stays serial."""

from __future__ import annotations

from ..._tvm import Schedule
from ..traits import CpuTraits
from ..blocks import fusion_group, one_thread
from .loop_facts import block_loops, column_chunk


def rule(sch: Schedule, block, traits: CpuTraits) -> bool | None:
    """Schedule ``block``'s loops; True, or None where its loops are not one per iterator."""
    del traits  # the vector width is LLVM's to pick for these loops
    loops = block_loops(sch, block)
    if loops is None:
        return None
    spatial, reduce_ = loops.spatial, loops.reduce
    chunk = column_chunk(loops.extents[-1])
    if chunk:
        n_o, n_i = sch.split(spatial[-1], [None, chunk])
        outer = spatial[:-1] + [n_o]
    else:
        n_i, outer = spatial[-1], spatial[:-1]
    if reduce_:
        sch.reorder(*outer, *reduce_, n_i)
    if outer:
        outer = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        grouped = fusion_group(sch, block) is not None and len(spatial) == 2 and not reduce_
        if not grouped and not one_thread(sch, block):
            sch.parallel(outer)  # a grouped block's in fusion.merge_groups
    if chunk:
        sch.vectorize(n_i)
    if reduce_ and loops.has_init:
        sch.decompose_reduction(block, reduce_[0])
    return True
