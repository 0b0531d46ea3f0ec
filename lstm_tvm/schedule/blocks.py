"""What the CPU and GPU schedules both read off a kernel's blocks."""

from __future__ import annotations

from tvm.sym import Analyzer

from .._tvm import SBlock, Schedule
from ..kernels.contract import FUSE_GROUP, LOOP_BODY, ONE_THREAD, TIME_STEP


def _blocks(sch: Schedule, parent=None):
    """Every block below ``parent`` (default: the root), each before its own blocks, in order."""
    for child in sch.get_child_blocks(sch.get_sblock("root") if parent is None else parent):
        yield child
        yield from _blocks(sch, child)


def leaf_blocks(sch: Schedule) -> list:
    """Every block of ``sch`` without child blocks (inside ``step`` blocks too), in order."""
    return [block for block in _blocks(sch) if not sch.get_child_blocks(block)]


def _ancestors(sch: Schedule, block):
    """The blocks around ``block``, innermost first."""
    sref = sch.get_sref(block).parent
    while sref is not None:
        if isinstance(sref.stmt, SBlock):
            yield sref.stmt
        sref = sref.parent


def in_loop_body(sch: Schedule, block) -> bool:
    """Whether ``block`` lies inside a serial loop body marked ``LOOP_BODY`` (a time step,
    a chunk of rows its GEMMs reduce over)."""
    return any(LOOP_BODY in b.annotations for b in _ancestors(sch, block))


def in_time_step(sch: Schedule, block) -> bool:
    """Whether ``block`` lies inside a sequence kernel's time step (a block ``STEP_BLOCK``, of
    any version: marked ``TIME_STEP``)."""
    return any(TIME_STEP in b.annotations for b in _ancestors(sch, block))


def time_steps(sch: Schedule) -> list:
    """The time step blocks of ``sch`` (one per version of the time loop)."""
    return [block for block in _blocks(sch) if TIME_STEP in sch.get(block).annotations]


def one_thread(sch: Schedule, block) -> bool:
    """Whether ``block`` runs on the calling thread alone (marked ``ONE_THREAD``: a block of
    ``by_work``'s small version, or a small constant-size one)."""
    return bool(sch.get(block).annotations.get(ONE_THREAD, False))


def fusion_group(sch: Schedule, block):
    """The fusion group of ``block`` (``spatial(..., group=)`` in the kernels), or None."""
    return sch.get(block).annotations.get(FUSE_GROUP)


def fusion_runs(sch: Schedule, eligible=lambda sch, loops: True) -> list[list[str]]:
    """Names of the blocks that may share one loop nest, run by run: consecutive 2-D blocks
    of one fusion group (``spatial(..., group=)`` in the kernels) whose two loops have equal
    extents under the same parent. A grouped block not ``eligible(sch, loops)`` (its loops)
    ends a run; every other block is a run of one, or ends one."""
    runs: list[list] = []  # [(block name, outer loop, inner loop, group)]
    same = Analyzer().can_prove_equal
    for block in leaf_blocks(sch):
        group = fusion_group(sch, block)
        loops = sch.get_loops(block)
        if (group is None or len(sch.get(block).iter_vars) != 2 or len(loops) < 2
                or not eligible(sch, loops)):
            runs.append([])  # a run never spans another block
            continue
        entry = (sch.get(block).name_hint, loops[-2], loops[-1], group)
        prev = runs[-1][-1] if runs and runs[-1] else None
        if (prev is not None and prev[3] == group
                and sch.get_sref(prev[1]).parent.same_as(sch.get_sref(entry[1]).parent)
                and all(same(sch.get(a).extent, sch.get(b).extent)
                        for a, b in zip(prev[1:3], entry[1:3]))):
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return [[name for name, *_ in run] for run in runs if run]
