"""Fusion groups: consecutive 2-D elementwise blocks of one group share a parallel loop."""

from __future__ import annotations

import logging

from tvm.sym import Analyzer

from ..._tvm import Schedule, tirx
from ..blocks import leaf_blocks
from ._loops import fusion_group

log = logging.getLogger(__name__)


def merge_groups(sch: Schedule, op_name: str) -> Schedule:
    """Run each run of consecutive same-group 2-D blocks (see :func:`kernels._builder.spatial`)
    with equal extents in one parallel loop (one thread-pool launch instead of several); the
    outer loop of a grouped block is left serial by :mod:`.loops` for this."""
    runs: list[list] = []  # [(block name, outer loop, group)]
    for block in leaf_blocks(sch):
        group, loops = fusion_group(sch, block), sch.get_loops(block)
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
