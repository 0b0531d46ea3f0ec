"""Default CUDA schedules: every leaf block bound to GPU threads, the time loop kept serial.

TVM cuts a kernel out of every loop nest bound to ``blockIdx``/``threadIdx``; what is not bound
stays in host code. So the time loop of the sequence kernels (block ``step``) runs on the host
and each of its child blocks is its own kernel, launched once per step (a persistent or fused
step kernel is future work). One rule per block kind:

- *GEMMs* (two spatial iterators ``m, n``, one reduction ``k``; :class:`GpuGemmTile`): a thread
  block computes a ``BM x BN`` tile, each thread a ``tm x tn`` register tile (``cache_write``
  to ``local``) over the whole reduction, which runs in slabs of ``bk``. Operands that are plain
  loads (a buffer element, possibly widened) are staged per slab in shared memory by all
  threads of the block; operands behind a condition (the kernels' ``if_then_else`` guards) are
  read from global memory (staging would load what the guard keeps out). Tile factors divide
  their extents, so no access needs a bounds predicate.
- *sums* (one spatial iterator, reductions): 32 consecutive outputs per block row
  (``threadIdx.x``, coalesced); each of 8 ``threadIdx.y`` lanes sums every 8th row and TVM's
  cross-thread reduction adds the 8 partial sums.
- *elementwise* blocks (and the fallback of every rule): spatial loops fused, split by the
  thread count, bound to ``blockIdx.x``/``threadIdx.x``; reductions serial per thread. The
  blocks of one fusion group (:func:`~lstm_tvm.schedule.blocks.fusion_runs`: a step's gate
  math, which reads and writes only at its own point) first share one loop nest, so they are
  one kernel: a sequence step launches two kernels (its GEMM and its gate math), not four.

TVM 0.27's ``compute_at``/``reverse_compute_at`` need their scope to be a *stage pipeline*; the
kernels' scopes are not (a step reads what the previous step wrote; padded rows are read past
what their producer writes). Each GEMM is therefore scheduled on a copy of the kernel in which
its loop nest is alone in its scope (:func:`~lstm_tvm.schedule.gpu_ir.isolated`), then put back
between its siblings: every transformation stays inside the GEMM's own loop nest.

TVM's CUDA runtime launches a zero-sized grid as one block, and a split whose factor divides a
dynamic extent has no bounds predicate, so an empty launch (e.g. the padded steps when
``seq_len_max == T``) would run one block out of bounds:
:func:`~lstm_tvm.schedule.gpu_ir.guard_empty_launches` wraps each launch with a dynamic grid in
``if grid > 0`` (GEMMs excepted; see there).

``tvm.s_tir.dlight``'s GPU rules (``Matmul``, ``GEMV``, ``Reduction``, ``GeneralReduction``)
match whole PrimFuncs with one main reduction and return None on every lstm_tvm kernel;
``Fallback`` rejects the sequence forward and runs the whole time loop of the sequence
backward in one GPU thread. The rules here work per block, inside the kernels' structure.
"""

from __future__ import annotations

import dataclasses
import logging

from .._tvm import Schedule, tirx
from ..kernels.tir_analysis import divides
from .gpu_ir import (declared_views, guard_empty_launches, hoist_allocations, isolated,
                     restore_views, unbound_blocks)
from .blocks import fusion_runs, in_time_step, leaf_blocks

log = logging.getLogger(__name__)

#: Threads per block of elementwise kernels.
ELEMENTWISE_THREADS = 256
#: ``threadIdx.x`` x ``threadIdx.y`` of the sum kernels (outputs x reduction lanes).
SUM_THREADS = (32, 8)
#: Shortest reduction slab worth staging in shared memory.
MIN_STAGED_SLAB = 4


@dataclasses.dataclass(frozen=True)
class GpuGemmTile:
    """How one GEMM block is scheduled on a GPU.

    ``ty x tx`` threads per block; each accumulates ``tm`` consecutive rows times ``tn``
    consecutive columns in registers, so a block covers ``ty * tm`` rows and ``tx * tn``
    columns. The reduction runs in slabs of ``bk`` (unrolled); with ``stage`` the plain-load
    operands of a slab are first copied to shared memory. Every factor divides its extent.
    """

    ty: int
    tx: int
    tm: int
    tn: int
    bk: int
    stage: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def default_gpu_tile(m_extent, n_extent, k_extent, in_step: bool = False) -> GpuGemmTile:
    """The untuned tile of a GEMM with these extents (ints or symbolic): the largest preferred
    factors that provably divide them (``tm, tn <= 4``, ``ty <= 8``, ``tx <= 32``,
    ``bk <= 16``); shared-memory staging when the slab has at least :data:`MIN_STAGED_SLAB`
    steps. ``in_step`` (a GEMM inside a time step, whose rows are the batch): one output per
    thread (``tm = tn = 1``) for the most blocks and warps, since at deployment batch sizes
    a step's GEMM has few rows (at B=1 it halves the forward's time on an H100 against 4x4
    outputs per thread: docs/performance.md, "Earlier figures moved here from code comments")."""
    tm = 1 if in_step else _first_divisor((4, 2, 1), m_extent)
    ty = _first_divisor((8, 4, 2, 1), m_extent, tm)
    tn = 1 if in_step else _first_divisor((4, 2, 1), n_extent)
    tx = _first_divisor((32, 16, 8, 4, 2, 1), n_extent, tn)
    bk = _first_divisor((16, 8, 4, 2, 1), k_extent)
    return GpuGemmTile(ty=ty, tx=tx, tm=tm, tn=tn, bk=bk, stage=bk >= MIN_STAGED_SLAB)


@dataclasses.dataclass(frozen=True)
class StepGemmTile:
    """How a GEMM inside a time step (rows: the batch, padded to 8) is scheduled on a GPU when
    its reduction is split over threads: a thread block computes ``rows x cols`` outputs with
    ``cols x lanes`` threads; each thread accumulates its ``rows`` outputs of one column over
    every ``lanes``-th step of the reduction (``rfactor``), ``unroll`` steps at a time (that
    many independent weight loads in flight), and TVM's cross-thread reduction adds the
    ``lanes`` partial sums. ``lanes_in_warp``: the lanes are ``threadIdx.x``, inside a warp
    (warp shuffles add the partial sums; each lane loads its own weight row), else
    ``threadIdx.y`` (the columns are ``threadIdx.x``: coalesced weight loads; the partial sums
    are added through shared memory).
    """

    rows: int
    cols: int
    lanes: int
    lanes_in_warp: bool
    unroll: int = 1

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


#: Threads per block of a step GEMM whose reduction is split (``cols x lanes``).
STEP_GEMM_THREADS = 256
#: Column blocks a split step GEMM aims for: about one per SM of a large GPU.
STEP_GEMM_BLOCKS = 128
#: The block-tile rule's column blocks (at 8 rows) from which a step GEMM keeps that rule:
#: with fewer its grid leaves SMs idle and splitting the reduction wins (docs/performance.md).
SPLIT_BELOW_BLOCKS = 64
#: The longest per-lane sum for which the lanes sit inside a warp (the cross-thread sum
#: then dominates); longer sums want coalesced weight loads.
IN_WARP_MAX_STEPS = 16


def default_step_tile(n_extent: int, k_extent: int) -> StepGemmTile | None:
    """The split-reduction tile of a step GEMM with ``n_extent`` columns and a ``k_extent``
    reduction (ints), or None when the block-tile rule (:func:`default_gpu_tile`) suits it
    better or nothing divides.

    The reduction is split when the block tile's 32 columns would give fewer than
    :data:`SPLIT_BELOW_BLOCKS` blocks at one row block (the backward's ``dh``, ``N = H``,
    ``K = 4H``; the forward's gates at ``H <= 256``). Columns per block: the widest of 32, 16,
    8 (a 32-byte sector of float32) that still gives :data:`STEP_GEMM_BLOCKS` blocks; the
    rest of :data:`STEP_GEMM_THREADS` as lanes, each summing at least 4 steps.
    """
    if n_extent % 32 == 0 and n_extent // 32 >= SPLIT_BELOW_BLOCKS:
        return None
    cols = next((c for c in (32, 16, 8) if n_extent % c == 0
                 and n_extent // c >= STEP_GEMM_BLOCKS), None)
    if cols is None:
        cols = next((c for c in (8, 16, 32) if n_extent % c == 0), None)
    if cols is None:
        return None
    lanes = next((n for n in (32, 16, 8, 4, 2) if cols * n <= STEP_GEMM_THREADS
                  and k_extent % n == 0 and k_extent // n >= 4), None)
    if lanes is None:
        return None
    steps = k_extent // lanes
    return StepGemmTile(rows=8, cols=cols, lanes=lanes, lanes_in_warp=steps <= IN_WARP_MAX_STEPS,
                        unroll=next(u for u in (8, 4, 2, 1) if steps % u == 0))


def _first_divisor(choices, extent, times: int = 1) -> int:
    return next(c for c in choices if divides(c * times, extent))


def schedule_gpu(op_name: str, func, target, failures: list | None = None):
    """``func`` with every leaf block bound to GPU threads (see the module doc).

    A block whose rule fails gets the elementwise rule (fused spatial loops bound to threads,
    reductions serial) so that the kernel still builds; its name and the rule's error are
    appended to ``failures`` when given. A block nothing could bind is reported the same way
    (the CUDA build then fails on it).
    """
    func, followers = _merge_groups(hoist_allocations(func), op_name)
    views = declared_views(func)
    max_threads = _max_threads(target)
    sch = Schedule(func)
    blocks = [(sch.get(b).name_hint, _rule_for(sch, b)) for b in leaf_blocks(sch)]
    for name, rule in blocks:
        if name in followers:  # bound with the first block of its fusion run
            continue
        try:
            if rule is _schedule_gemm:
                block = sch.get_sblock(name)
                if _tensor_core_gemm(sch, block):
                    func = restore_views(isolated(func, name, _schedule_gemm_wmma), views)
                    continue
                in_step = in_time_step(sch, block)
                gemm = _schedule_step_gemm if in_step and _sums_from_zero(
                    sch.get(block)) else _schedule_gemm
                func = restore_views(isolated(func, name, lambda s, b: gemm(
                    s, b, max_threads, views=views, in_step=in_step)), views)
            else:
                trial = Schedule(func)
                rule(trial, trial.get_sblock(name), max_threads)
                func = trial.mod["main"]
            continue
        except Exception as err:  # noqa: BLE001 - any schedule error: the rule's work is discarded
            log.warning("lstm_tvm: %s: GPU rule %s failed on block %s: %s", op_name,
                        rule.__name__, name, str(err).splitlines()[-1][:200])
            if failures is not None:
                failures.append((name, err))
        try:
            trial = Schedule(func)
            _schedule_flat(trial, trial.get_sblock(name), max_threads)
            func = trial.mod["main"]
        except Exception as err:  # noqa: BLE001 - reported; the block stays unbound
            if failures is not None:
                failures.append((name, err))
    func = guard_empty_launches(func)
    for name in unbound_blocks(func):
        if failures is not None and all(name != f[0] for f in failures):
            failures.append((name, RuntimeError(f"block {name} is not bound to GPU threads")))
    return func


def _merge_groups(func, op_name: str):
    """``func`` with the loop nests of each fusion run (two or more blocks) merged into one,
    and the names of the blocks after the first of each merged run."""
    sch = Schedule(func)
    followers = set()
    for names in fusion_runs(sch):
        if len(names) < 2:
            continue
        trial = sch.copy()
        try:
            for depth in (-2, -1):  # rows, then the columns under the merged rows
                trial.merge(*[trial.get_loops(trial.get_sblock(n))[depth] for n in names])
        except Exception as err:  # noqa: BLE001 - the blocks then stay kernels of their own
            log.warning("lstm_tvm: %s: merging the loops of %s failed: %s", op_name,
                        ", ".join(names), str(err).splitlines()[-1][:200])
            continue
        sch = trial
        followers.update(names[1:])
    return sch.mod["main"], followers


def _max_threads(target) -> int:
    for key in ("max_threads_per_block", "max_num_threads"):
        value = target.attrs.get(key)
        if value is not None:
            return int(value)
    return 1024


def _const(extent):
    if isinstance(extent, int):
        return extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def _axes(sch: Schedule, block):
    """The block's own loops split into spatial and reduction ones."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)[-len(stmt.iter_vars):] if stmt.iter_vars else []
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
    reduce_ = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce_) != len(loops):
        raise ValueError(f"block {stmt.name_hint}: iterators other than spatial/reduction")
    return spatial, reduce_


def _rule_for(sch: Schedule, block):
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    S, R = tirx.IterVar.DataPar, tirx.IterVar.CommReduce
    if kinds == [S, S, R]:
        return _schedule_gemm
    if len(kinds) > 1 and kinds[0] == S and all(k == R for k in kinds[1:]):
        return _schedule_sum
    return _schedule_flat


def _schedule_flat(sch: Schedule, block, max_threads: int) -> None:
    """Fuse the spatial loops, split by the thread count, bind; reductions stay serial."""
    spatial, reduce_ = _axes(sch, block)
    if not spatial:
        spatial = [sch.add_unit_loop(block)]
    if reduce_:
        sch.reorder(*spatial, *reduce_)
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    threads = min(ELEMENTWISE_THREADS, max_threads)
    extent = _const(sch.get(fused).extent)
    if extent is not None:  # no idle threads for small constant extents
        threads = min(threads, max(32, 1 << max(extent - 1, 0).bit_length()))
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if reduce_ and sch.get(block).init is not None:
        sch.decompose_reduction(block, reduce_[0])


def _schedule_sum(sch: Schedule, block, max_threads: int) -> None:
    """Outputs over ``threadIdx.x``, the reduction over ``threadIdx.y``: each thread sums every
    ``n_y``-th row, then TVM's cross-thread reduction adds the ``n_y`` partial sums."""
    spatial, reduce_ = _axes(sch, block)
    n_x, n_y = SUM_THREADS
    if len(reduce_) > 1:
        reduce_ = [sch.fuse(*reduce_)]
    bx, tx = sch.split(spatial[0], [None, n_x])
    r_o, ty = sch.split(reduce_[0], [None, n_y])
    sch.reorder(bx, tx, ty, r_o)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.bind(ty, "threadIdx.y")


def _plain_operands(stmt) -> list[str]:
    """Names of the buffers a GEMM block reads as plain loads (``a(m, k)`` / ``b(k, n)`` being a
    buffer element, possibly cast), from its body ``out = out + a * b``."""
    value = stmt.body.value
    names = []
    product = value.b if isinstance(value, tirx.Add) else None
    if isinstance(product, tirx.Mul):
        for operand in (product.a, product.b):
            while isinstance(operand, tirx.Cast):
                operand = operand.value
            if type(operand).__name__ in ("TensorLoad", "BufferLoad"):  # TensorLoad in 0.27
                names.append(operand.source.name)
    return names


def _schedule_gemm(sch: Schedule, block, max_threads: int, tile: GpuGemmTile | None = None,
                   views=(), in_step: bool = False) -> None:
    """Register-tiled GEMM with shared-memory staging (see :class:`GpuGemmTile`). Needs the
    block's loop nest alone in its scope (:func:`lstm_tvm.schedule.gpu_ir.isolated`).
    ``views``: names of row views (:func:`~lstm_tvm.schedule.gpu_ir.declared_views`), read
    in place: their clamped row indices leave no static region to stage. ``in_step``: see
    :func:`default_gpu_tile`."""
    (m, n), (k,) = _axes(sch, block)
    if tile is None:
        tile = default_gpu_tile(sch.get(m).extent, sch.get(n).extent, sch.get(k).extent,
                                in_step)
    if tile.ty * tile.tx > max_threads:
        raise ValueError(f"tile {tile} needs more than {max_threads} threads")
    stmt = sch.get(block)
    out_name = stmt.writes[0].source.name
    staged = [b for b in dict.fromkeys(_plain_operands(stmt)) if b != out_name and b not in views]
    staged = staged if tile.stage else []
    bm, ty, im = sch.split(m, [None, tile.ty, tile.tm])
    bn, tx, jn = sch.split(n, [None, tile.tx, tile.tn])
    ko, ki = sch.split(k, [None, tile.bk])
    sch.reorder(bm, bn, ty, tx, ko, ki, im, jn)
    # Rows (possibly dynamic) on blockIdx.x, columns (static) on blockIdx.y.
    sch.bind(bm, "blockIdx.x")
    sch.bind(bn, "blockIdx.y")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
    for name in staged:
        reads = [r.source.name for r in sch.get(block).reads]
        copy = sch.cache_read(block, reads.index(name), "shared", consumer_blocks=[block])
        sch.compute_at(copy, ko, preserve_unit_loops=True)
        ndim = len(sch.get(copy).iter_vars)
        fetch = sch.fuse(*sch.get_loops(copy)[-ndim:])
        _, fy, fx = sch.split(fetch, [None, tile.ty, tile.tx])
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
    sch.decompose_reduction(block, ko)
    for loop in (ki, im, jn):
        sch.unroll(loop)


def _sums_from_zero(stmt) -> bool:
    """Whether a reduction block's init stores zero (what ``rfactor`` needs)."""
    init = stmt.init
    value = getattr(init, "value", None)
    return isinstance(value, (tirx.FloatImm, tirx.IntImm)) and float(value.value) == 0.0


def _schedule_step_gemm(sch: Schedule, block, max_threads: int, tile: StepGemmTile | None = None,
                        views=(), in_step: bool = True) -> None:
    """A step GEMM with its reduction split over threads (see :class:`StepGemmTile`), or
    :func:`_schedule_gemm` where :func:`default_step_tile` gives no split tile."""
    (m, n), (k,) = _axes(sch, block)
    n_extent, k_extent = _const(sch.get(n).extent), _const(sch.get(k).extent)
    if tile is None and n_extent is not None and k_extent is not None:
        tile = default_step_tile(n_extent, k_extent)
    if tile is None or tile.cols * tile.lanes > max_threads or not divides(
            tile.rows, sch.get(m).extent):
        _schedule_gemm(sch, block, max_threads, views=views, in_step=in_step)
        return
    bm, im = sch.split(m, [None, tile.rows])
    bn, tx = sch.split(n, [None, tile.cols])
    ko, lane = sch.split(k, [None, tile.lanes])
    sch.reorder(bm, bn, lane, tx, ko, im)
    partial = sch.rfactor(lane, factor_axis=0)
    sch.set_scope(partial, 0, "local")
    bm, bn, lane, tx, ko, im = sch.get_loops(partial)[-6:]
    lane_axis, col_axis = (("threadIdx.x", "threadIdx.y") if tile.lanes_in_warp else
                           ("threadIdx.y", "threadIdx.x"))
    if tile.lanes_in_warp:
        sch.reorder(tx, lane)
    sch.bind(bm, "blockIdx.x")
    sch.bind(bn, "blockIdx.y")
    sch.bind(lane, lane_axis)
    sch.bind(tx, col_axis)
    ko, ku = sch.split(ko, [None, tile.unroll])
    sch.decompose_reduction(partial, ko)
    sch.unroll(ku)
    sch.unroll(im)
    # The sum of the lanes' partial sums: each (row, column) of the block by a cross-thread
    # reduction over the lane axis.
    sch.reverse_compute_at(block, bn, preserve_unit_loops=True)
    lane_f, im_f, tx_f = sch.get_loops(block)[-3:]
    sch.reorder(tx_f, im_f, lane_f)
    sch.bind(tx_f, col_axis)
    sch.bind(lane_f, lane_axis)


#: Warps of a tensor-core GEMM's thread block (rows x columns) and 16x16 fragments per warp.
WMMA_WARPS = (2, 4)
WMMA_FRAGMENTS = (2, 2)
WMMA_K_FRAGMENTS = 2


def _tensor_core_gemm(sch: Schedule, block) -> bool:
    """Whether a GEMM block suits :func:`_schedule_gemm_wmma`: ``out += f32(a16) * f32(b16)``
    with a float32 output (the tensor cores' float16 product with float32 sums; only a
    tensor-core variant's kernels have such blocks, see
    :attr:`~lstm_tvm.kernels.variant.KernelVariant.tensor_cores`), its extents multiples of a
    thread block's tile."""
    stmt = sch.get(block)
    value = stmt.body.value
    product = value.b if isinstance(value, tirx.Add) else None
    if not isinstance(product, tirx.Mul) or str(stmt.writes[0].source.dtype) != "float32":
        return False
    if not all(isinstance(o, tirx.Cast) and hasattr(o.value, "source")
               and str(o.value.source.dtype) == "float16" for o in (product.a, product.b)):
        return False  # every GEMM of the other kernels ends here, before any proof
    (m, n), (k,) = _axes(sch, block)
    wy, wx = WMMA_WARPS
    fy, fx = WMMA_FRAGMENTS
    return (divides(16 * wy * fy, sch.get(m).extent) and divides(16 * wx * fx, sch.get(n).extent)
            and divides(16 * WMMA_K_FRAGMENTS, sch.get(k).extent))


def _schedule_gemm_wmma(sch: Schedule, block) -> None:
    """A float16 GEMM on tensor cores (WMMA 16x16x16, float32 accumulators): each warp computes
    ``WMMA_FRAGMENTS`` 16x16 tiles of a thread block's ``WMMA_WARPS`` grid; both operands are
    staged per reduction slab in dynamic shared memory. The rows must be a multiple of the
    block's (the kernel pads them), the columns and the reduction of its tile."""
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    from .._tvm import meta_schedule

    meta_schedule()  # registers the tensor intrinsics
    (m, n), (k,) = _axes(sch, block)
    wy, wx = WMMA_WARPS
    fy, fx = WMMA_FRAGMENTS
    m, mi = sch.split(m, [None, 16])
    n, ni = sch.split(n, [None, 16])
    k, ki = sch.split(k, [None, 16])
    sch.reorder(m, n, k, mi, ni, ki)
    inner = block
    outer = sch.blockize(mi)
    m0, m1, m2 = sch.split(m, [None, wy, fy])
    n0, n1, n2 = sch.split(n, [None, wx, fx])
    k0, k1 = sch.split(k, [None, WMMA_K_FRAGMENTS])
    sch.reorder(m0, n0, m1, n1, k0, k1, m2, n2)
    sch.bind(m0, "blockIdx.x")  # rows (possibly dynamic) apart from the static columns
    sch.bind(n0, "blockIdx.y")
    # warps on two thread axes: fusing the (int64) row and (int32) column loops would put a
    # cast in the bindings, which blockize (tensorize) cannot divide
    sch.bind(m1, "threadIdx.z")
    sch.bind(n1, "threadIdx.y")
    warp = n1

    def to_shared(index):
        copy = sch.cache_read(outer, index, "shared.dyn")
        sch.compute_at(copy, k0)
        fused = sch.fuse(*sch.get_loops(copy)[-2:])
        _, tz, ty, tx, vec = sch.split(fused, [None, wy, wx, 32, 4])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tz, "threadIdx.z")
        sch.vectorize(vec)
        sch.storage_align(copy, 0, axis=-2, factor=16, offset=8)

    to_shared(0)
    to_shared(1)
    frag_a = sch.cache_read(outer, 0, "wmma.matrix_a")
    frag_b = sch.cache_read(outer, 1, "wmma.matrix_b")
    sch.compute_at(frag_a, k1)
    sch.compute_at(frag_b, k1)
    staged_out = sch.cache_write(outer, 0, "shared.dyn")
    acc = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(acc, warp)
    sch.reverse_compute_at(staged_out, warp)
    group = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn",
                                  in_dtype="float16", out_dtype="float32", trans_b=False)

    def tiles_of(b):
        rows, cols = sch.get_loops(b)[-2:]
        r0, r1 = sch.split(rows, [None, 16])
        c0, c1 = sch.split(cols, [None, 16])
        sch.reorder(r0, c0, r1, c1)
        return r1

    init = sch.decompose_reduction(outer, k0)
    init_inner = sch.get_child_blocks(init)[0]
    sch.tensorize(tiles_of(frag_a), group["load_a"])
    sch.tensorize(tiles_of(frag_b), group["load_b"])
    sch.tensorize(sch.get_loops(init_inner)[-2], group["init"])
    sch.tensorize(tiles_of(acc), group["store"])
    sch.tensorize(sch.get_loops(inner)[-3], group["compute"])
    fused = sch.fuse(*sch.get_loops(staged_out)[-2:])
    _, tx, vec = sch.split(fused, [None, 32, 4])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
