"""One thread-pool launch per sequence: the time loop runs on every thread of the pool.

A time step's blocks each run a parallel loop, and each parallel loop is a launch of TVM's
thread pool (a fork and a join). At small batches a step is a few microseconds of
arithmetic, so the launches are a large share of it. With the time loop
marked ``pragma_parallel_launch_point`` every thread runs the whole loop; each parallel loop
inside gives each thread its static share of the iterations (the same share every step, so
a thread's slice of the recurrent weights stays in its own cache), and
``pragma_parallel_barrier_when_finish`` ends it with a barrier of the pool, cheaper than a
fork and a join (docs/performance.md, "one launch per sequence").

Every thread runs whatever in the loop is not inside a parallel loop: the launch is only
safe where each block of the step lies inside a parallel loop that starts directly under the
time loop (no loop of a block's own, no serial slab loop, runs outside its parallel loop).
Where that does not hold the time loop keeps a launch per parallel loop.
"""

from __future__ import annotations

from ..._tvm import Schedule, tirx
from ..blocks import time_steps

#: Annotations of TVM's LLVM code generator (lowered from loop annotations to ``AttrStmt``).
LAUNCH_POINT = "pragma_parallel_launch_point"
BARRIER = "pragma_parallel_barrier_when_finish"


def launch_per_sequence(sch: Schedule) -> Schedule:
    """``sch`` with each time loop (a time step block's, one per version of the loop) made one
    launch of the thread pool where that is safe (see the module doc), and left as it is
    otherwise (the cell ops have none)."""
    for step in time_steps(sch):
        parallel = _step_parallel_loops(sch, step)
        if parallel is None:
            continue
        sch.annotate(sch.get_loops(step)[-1], LAUNCH_POINT, 1)
        for loop in parallel:
            sch.annotate(loop, BARRIER, 1)
    return sch


def _step_parallel_loops(sch: Schedule, step) -> list | None:
    """The parallel loops of the step's blocks (each block's outermost loop inside the step),
    or None where a block of the step has a loop, or no loop, outside a parallel one, or
    blocks of its own."""
    found: list = []
    for block in sch.get_child_blocks(step):
        loops = sch.get_loops(block)  # those inside the step block
        if (sch.get_child_blocks(block) or not loops
                or sch.get(loops[0]).kind != tirx.ForKind.PARALLEL):
            return None
        if not any(sch.get(loop).same_as(sch.get(loops[0])) for loop in found):
            found.append(loops[0])
    return found
