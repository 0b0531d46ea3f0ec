"""Fusion groups: consecutive 2-D elementwise blocks of one group share a parallel loop."""

from __future__ import annotations

import logging

from ..._tvm import Schedule, tirx
from ..blocks import fusion_runs, one_thread

log = logging.getLogger(__name__)


def merge_groups(sch: Schedule, op_name: str) -> Schedule:
    """Run each run of consecutive same-group 2-D blocks (see ``KernelBuilder.spatial``)
    with equal extents in one parallel loop (one thread-pool launch instead of several), or
    one serial loop where they are marked to run on one thread; the outer loop of a grouped
    block is left serial by :mod:`.elementwise` for this."""
    # A block already inside a parallel loop (see .gate_rows) is not regrouped.
    runs = fusion_runs(sch, lambda s, loops: s.get(loops[-2]).kind == tirx.ForKind.SERIAL
                       and all(s.get(lp).kind != tirx.ForKind.PARALLEL for lp in loops))

    def outer_loop(s, name):
        return s.get_loops(s.get_sblock(name))[-2]

    for names in runs:
        parallel = not one_thread(sch, sch.get_sblock(names[0]))  # alike within a group
        if len(names) > 1:
            trial = sch.copy()
            try:
                merged = trial.merge(*[outer_loop(trial, n) for n in names])
                if parallel:
                    trial.parallel(merged)
            except Exception as err:  # noqa: BLE001 (fall back to a loop each)
                log.warning("lstm_tvm: %s: merging the loops of %s failed: %s", op_name,
                            ", ".join(names), str(err).splitlines()[-1][:200])
            else:
                sch = trial
                continue
        if parallel:
            for n in names:
                sch.parallel(outer_loop(sch, n))
    return sch
