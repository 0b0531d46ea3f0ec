"""The search space of a GEMM task: :class:`GemmTile` s whose sizes MetaSchedule samples.

The space has one design per register tile (``rows x cols`` of the output, see :func:`tiles`)
and loop structure (with or without a blocked reduction, row- or column-block-major tile
order); within a design, the tile sizes are ``SampleCategorical`` random variables used
directly as split factors. A tuning record's trace is therefore a complete, replayable
schedule of the block: split factors never name the extents they split, so the same trace
schedules the same-named block of a kernel whose ``T`` and ``B`` are symbolic.

The register tiles depend on the target's vector registers (``traits``, a
:class:`~lstm_tvm.schedule.traits.CpuTraits`; AVX-512's when not given). The space is small and
enumerable (:func:`space_size`): a search asked for more trials than it holds runs out of new
candidates.
"""

from __future__ import annotations

import functools
import itertools

from .._tvm import Schedule
from ..kernels.contract import PANEL, ROW_TILE
from ..schedule.cpu import AVX512, GemmTile, apply_gemm
from ..schedule.traits import CpuTraits
from .tasks import Task, workload

__all__ = ["choices", "describe", "designs", "fingerprint", "fingerprints", "space", "space_size",
           "tiles"]


def choices(task: Task) -> dict[str, list[int]]:
    """The values each tile size may take for ``task`` (all valid for the kernel's block:
    they divide what the kernel guarantees its extents to be multiples of)."""
    rows = [r for r in (1, 2, 4, 8, 16) if task.m_multiple % r == 0 and r <= task.M]
    if task.m_multiple == ROW_TILE:  # dynamic rows, padded to ROW_TILE only
        rows = [r for r in rows if ROW_TILE % r == 0]
    cols = [c for c in (16, 32, 48, 64) if task.N % c == 0
            and (task.n_multiple == 0 or task.n_multiple % c == 0)] or [task.N]
    if task.b.startswith("kp:"):  # a tile's row must lie in one panel
        cols = [c for c in (16, PANEL) if PANEL % c == 0]
    # The default rule's unroll is 4; the others are searched too.
    k_unroll = [u for u in (4, 1, 2, 8) if task.k_multiple % u == 0]
    # Per-step GEMMs never cut the reduction: each slab (and the initialisation before them)
    # is a parallel region of its own, launched every iteration of the loop around the GEMM
    # (see schedule.cpu.gemm.default_tile).
    k_block = [] if task.per_step else [b for b in (64, 128, 256)
                                        if task.k_multiple % b == 0 and b < task.K]
    return {"rows": rows, "cols": cols, "k_unroll": k_unroll, "k_block": k_block}


def tiles(task: Task, traits: CpuTraits = AVX512) -> list[tuple[int, int]]:
    """The ``(rows, cols)`` register tiles searched: those that fit the target's accumulators
    (``traits.accumulators``) and hold at least a quarter of them, at least two vectors wide
    where the task allows (e.g. ``8x32``, ``4x64``, ``4x32`` and ``2x32`` with AVX-512;
    ``4x16``, ``2x32``, ``2x16`` and ``1x32`` with AVX2). Larger tiles spill registers, much
    smaller ones leave FMA latency exposed, and narrower ones load a broadcast per FMA or two.
    A target's :attr:`~lstm_tvm.schedule.traits.CpuTraits.gemm_tile_rows` add their tile (AVX2:
    ``6x16``) where they divide the rows."""
    options = choices(task)
    pairs = [(r, c) for r in options["rows"] for c in options["cols"]
             if traits.accumulators // 4 <= r * c <= traits.accumulators]
    wide, rows = 2 * traits.lanes("float32"), traits.gemm_tile_rows
    if rows and task.m_multiple % rows == 0 and rows <= task.M and wide in options["cols"]:
        pairs.insert(0, (rows, wide))
    if not pairs:
        fit = [(r, c) for r in options["rows"] for c in options["cols"]
               if r * c <= traits.accumulators]
        pairs = [max(fit, key=lambda p: p[0] * p[1])] if fit else [
            (min(options["rows"]), min(options["cols"]))]
    return [(r, c) for r, c in pairs if c >= 2 * traits.lanes("float32")] or pairs


def designs(task: Task, sch, traits: CpuTraits = AVX512) -> list:
    """``sch`` (a schedule of ``task``'s workload) copied once per register tile and loop
    structure, with the remaining tile sizes sampled; the space :func:`space` searches."""
    options = choices(task)
    out = []
    for rows, cols in tiles(task, traits):
        for blocked in ([False, True] if options["k_block"] else [False]):
            for n_major in (0, 1):
                design = sch.copy()

                def sample(cands, design=design):
                    return design.sample_categorical(cands, [1.0 / len(cands)] * len(cands))

                tile = GemmTile(rows=sample([rows]), cols=sample([cols]),
                                k_unroll=sample(options["k_unroll"]),
                                k_block=sample(options["k_block"]) if blocked else 0,
                                n_major=n_major)
                apply_gemm(design, design.get_sblock(task.name), tile)
                out.append(design)
    return out


def space(task: Task, traits: CpuTraits = AVX512):
    """A MetaSchedule ``ScheduleFn`` space over ``task``'s tiles (see :func:`designs`)."""
    from tvm.s_tir.meta_schedule.space_generator import ScheduleFn

    return ScheduleFn(lambda sch: designs(task, sch, traits), sch_rules=[], postprocs=[],
                      mutator_probs={})


def space_size(task: Task, traits: CpuTraits = AVX512) -> int:
    """How many distinct schedules ``task``'s space holds: every design with every combination
    of its sampled sizes, told apart as MetaSchedule does (by the scheduled module, so that the
    two tile orders of a tile with a single block of rows or columns are one schedule)."""
    return len(fingerprints(task, traits))


@functools.lru_cache(maxsize=256)
def fingerprints(task: Task, traits: CpuTraits = AVX512) -> frozenset[int]:
    """The :func:`fingerprint` of every schedule in ``task``'s space."""
    return frozenset(fingerprint(task, trace) for trace in _traces(task, traits))


def fingerprint(task: Task, trace) -> int:
    """The structural hash of ``task``'s workload scheduled by ``trace``: equal for traces that
    make the same schedule (MetaSchedule measures each such module once per search)."""
    import tvm_ffi

    sch = Schedule(_workload(task))
    trace.apply_to_schedule(sch, remove_postproc=True)
    return tvm_ffi.structural_hash(sch.mod)


def _traces(task: Task, traits: CpuTraits):
    """Every trace of ``task``'s space: each design with each choice of its sampled sizes."""
    for design in designs(task, Schedule(_workload(task)), traits):
        trace = design.trace
        samples = [inst for inst in trace.insts if inst.kind.name == "SampleCategorical"]
        for picks in itertools.product(*(range(len(inst.attrs[0])) for inst in samples)):
            chosen = trace
            for inst, pick in zip(samples, picks):
                chosen = chosen.with_decision(inst, pick, remove_postproc=True)
            yield chosen


@functools.lru_cache(maxsize=256)
def _workload(task: Task):
    return workload(task)


def describe(trace) -> str:
    """The tile sizes a trace of :func:`space` chose, e.g. ``8x32 unroll 4, k slabs of 256``."""
    values = [int(inst.attrs[0][int(trace.decisions[inst])]) for inst in trace.insts
              if inst.kind.name == "SampleCategorical"]
    if len(values) == 3:
        rows, cols, unroll = values
        text = f"{rows}x{cols} unroll {unroll}"
    elif len(values) == 4:
        rows, cols, unroll, block = values
        text = f"{rows}x{cols} unroll {unroll}, k slabs of {block}"
    else:
        return "?"
    fuse = next((i for i in trace.insts if i.kind.name == "Fuse"), None)
    split_m = next((i for i in trace.insts if i.kind.name == "Split"), None)
    if fuse is not None and split_m is not None and not fuse.inputs[0].same_as(split_m.outputs[0]):
        text += ", column blocks first"
    return text
