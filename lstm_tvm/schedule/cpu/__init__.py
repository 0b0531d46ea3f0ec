"""Default CPU schedules (LLVM targets of any architecture), as a list of rules.

Each rule (one per file) takes a block, a schedule and the target's
:class:`~lstm_tvm.schedule.traits.CpuTraits` and schedules the block, or returns None where it
does not apply; the first that applies wins (as TVM's ``s_tir.dlight`` rules do):

- :mod:`.gate_rows`: a sequence step's product of one or two rows and the gate math that
  reads it, tiled by chunks of units;
- :mod:`.gemm`: GEMM blocks, register-tiled to the target's vector registers;
- :mod:`.elementwise`: sums and elementwise blocks, parallel outside and vectorised inside.

Then :mod:`.gate_rows` joins those products' loops with their gate math's, :mod:`.fusion`
runs each other fusion group's blocks in one parallel loop, and :mod:`.team`
makes a sequence kernel's time loop one launch of the thread pool. A tuning record of a
block (its trace) is tried before the rules. A block nothing applies to keeps its plain loops:
still correct, only slower.
"""

from __future__ import annotations

import functools
import logging

from tvm.s_tir.schedule import Trace

from ..._tvm import Schedule
from ..blocks import leaf_blocks
from ..traits import cpu_traits
from . import elementwise, gate_rows, gemm
from .fusion import merge_groups
from .gemm import AVX512, K_UNROLL, GemmTile, apply_gemm, default_tile
from .team import launch_per_sequence

log = logging.getLogger(__name__)

#: The rules, tried in order on every block.
RULES = (gate_rows.rule, gemm.rule, elementwise.rule)


def schedule_cpu(op_name: str, func, target, failures: list | None = None,
                 tuned: dict | None = None):
    """``func`` with the default schedule for the LLVM ``target`` applied.

    ``tuned`` maps block names to tuning-record traces in their JSON form (``Trace.as_json``
    of a task with one block of that name, see :mod:`lstm_tvm.tuning`), replayed on the
    block instead of the rules (the rules are the fallback if a trace does not apply). Blocks
    nothing could schedule keep their plain loops; their names and errors are appended to
    ``failures`` when given (tests require it to stay empty).
    """
    traits = cpu_traits(target)
    sch = Schedule(func)
    tiled = gate_rows.tiled_groups(sch, traits)
    rules = tuple(functools.partial(r, tiled=tiled) if r is gate_rows.rule else r for r in RULES)
    for name in [sch.get(b).name_hint for b in leaf_blocks(sch)]:
        ways = [lambda s, name=name: _apply_rules(s, s.get_sblock(name), traits, rules)]
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
    return launch_per_sequence(merge_groups(gate_rows.merge_gate_rows(sch, op_name, failures),
                                            op_name)).mod["main"]


def _apply_rules(sch: Schedule, block, traits, rules) -> None:
    for rule in rules:
        if rule(sch, block, traits) is not None:
            return


__all__ = ["AVX512", "K_UNROLL", "RULES", "GemmTile", "apply_gemm", "default_tile",
           "schedule_cpu"]
