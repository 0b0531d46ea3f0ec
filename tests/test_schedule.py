"""Default schedules: every block of every kernel gets one, under named CPU targets."""

import os
import subprocess
import sys

import pytest
import tvm_ffi

from lstm_tvm import build, registry, testing, validation
from lstm_tvm._tvm import SBlock, Schedule, tirx
from lstm_tvm.targets import resolve_target
from lstm_tvm.kernels import BUILDERS, KernelVariant
from lstm_tvm.kernels.contract import STEP_BLOCK, TIME_STEP
from lstm_tvm.schedule import schedule_for
from lstm_tvm.schedule.blocks import leaf_blocks
from lstm_tvm.schedule.cpu import gemm, team
from lstm_tvm.schedule.traits import cpu_traits


@pytest.mark.parametrize("sizes", [(256, 256), (7, 9), (32, 48)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_every_block_is_scheduled(op_name, dtype, sizes, cpu_target):
    op = registry.get_op(op_name)
    attrs = validation.validate_attrs(op, testing.op_attrs(op_name, {"use_peephole": True}))
    func = BUILDERS[op_name](op, dtype, *sizes, attrs, KernelVariant())
    failures = []
    schedule_for(op_name, func, resolve_target(cpu_target), failures)
    assert failures == []


def test_scheduled_kernel_has_parallel_and_vector_loops():
    spec = build.make_spec("BlockLSTMGradV2", "float32", 64, 64, {"use_peephole": True})
    text = build.primfunc(spec).script()
    assert "T.parallel(" in text and "T.vectorized(" in text


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_gemm_outputs_have_constant_row_strides(op_name, dtype):
    """Every reduction block (the GEMMs among them) of a kernel with symbolic T and B writes
    a buffer whose row strides are constants: with a symbolic one LLVM stored the
    accumulators at every reduction step (CellGradMatmul's xh_grad_t at 64x512x512 with a
    (I+H, padded B) result: 3.6 ms, as panels 2.2 ms)."""
    attrs = validation.validate_attrs(registry.get_op(op_name),
                                      testing.op_attrs(op_name, {"use_peephole": True}))
    func = build.kernel_func(op_name, dtype, 48, 40, attrs, KernelVariant())
    written = []

    def visit(block):
        if any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars):
            written.extend((block.name_hint, region.source) for region in block.writes)

    tvm_ffi.structural_walk(func.body, [(SBlock, visit)])
    assert written
    for name, buffer in written:
        strides = list(buffer.shape[1:])
        assert all(isinstance(d, (int, tirx.IntImm)) for d in strides), (name, buffer.shape)


@pytest.mark.parametrize("target", [{"kind": "llvm", "mcpu": "skylake-avx512"},
                                    {"kind": "llvm", "mcpu": "haswell"}], ids=["avx512", "avx2"])
def test_gemms_over_wide_panels_run_column_blocks_first(target):
    """The rule's tile order and reduction slabs, per GEMM block of the kernels as built (rows
    symbolic): the forward's input product ``xw`` (N = 4H >= K = I, panels, outside the time
    loop) runs column blocks first without slabs; the backward's ``x_grad_gemm`` (K = 4H >
    N = I) keeps row blocks first and its slabs of 256, but not ``x_grad_tail``, its last rows
    (fewer than ``ROW_TILE``: each slab a launch, for no reuse); the recurrent product
    ``gates`` (a time step's) neither. The weight gradient's per-chunk GEMM ``w_grad``, which
    accumulates in column panels, runs column blocks first without slabs. A GEMM over a
    single row per tile runs column blocks first."""
    traits = cpu_traits(resolve_target(target))

    def tiles(op_name, input_size, cell_size):
        op = registry.get_op(op_name)
        attrs = validation.validate_attrs(op, testing.op_attrs(op_name, {"use_peephole": False}))
        sch = Schedule(BUILDERS[op_name](op, "float32", input_size, cell_size, attrs,
                                                   KernelVariant()))
        return {sch.get(b).name_hint: gemm.rule(sch, b, traits) for b in leaf_blocks(sch)
                if sch.get(b).name_hint in ("xw", "x_grad_gemm", "x_grad_tail", "gates",
                                            "w_grad")}

    fwd = tiles("BlockLSTMV2", 512, 256)  # N = 1024 >= K = 512
    assert (fwd["xw"].n_major, fwd["xw"].k_block) == (1, 0)
    assert (fwd["gates"].n_major, fwd["gates"].k_block) == (0, 0)
    assert tiles("BlockLSTMV2", 2048, 256)["xw"].k_block == 256  # K = 2048 > N
    bwd = tiles("BlockLSTMGradV2", 256, 128)  # N = 256 < K = 512
    assert (bwd["x_grad_gemm"].n_major, bwd["x_grad_gemm"].k_block) == (0, 256)
    assert bwd["x_grad_tail"].k_block == 0
    assert (bwd["w_grad"].n_major, bwd["w_grad"].k_block) == (1, 0)
    one_row = gemm.default_tile(1, 1024, 2048, traits=traits)
    assert (one_row.rows, one_row.n_major) == (1, 1)


def _step_block(func):
    steps = []
    tvm_ffi.structural_walk(func.body, [(SBlock, lambda node: steps.append(node)
                                         if node.name_hint == STEP_BLOCK else None)])
    assert len(steps) == 1
    return steps[0]


def _parallel_loops(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, [(tirx.For, lambda node: found.append(node)
                                    if node.kind == tirx.ForKind.PARALLEL else None)])
    return found


def _versions(stmt) -> list:
    """The statements of an ``if`` chain on the batch (the statement, or the first of a
    sequence): each branch's then-case, and the last else-case."""
    if isinstance(stmt, tirx.SeqStmt):
        stmt = next(s for s in stmt.seq if isinstance(s, tirx.IfThenElse))
    if not isinstance(stmt, tirx.IfThenElse):
        return [stmt]
    assert stmt.else_case is not None
    return [stmt.then_case, *_versions(stmt.else_case)]


def _block_names(stmt) -> set:
    found = set()
    tvm_ffi.structural_walk(stmt, [(SBlock, lambda node: found.add(node.name_hint))])
    return found


@pytest.mark.parametrize("op_name,sizes", [("BlockLSTM", (64, 512)), ("BlockLSTMGrad", (64, 128))])
def test_each_step_is_one_launch_per_sequence_with_a_barrier_per_parallel_loop(op_name, sizes):
    """The recurrent GEMM (whose reduction, of 512 here, a GEMM outside the time loop would cut
    into slabs, each a parallel loop) and the gate math: one parallel loop each per step. At
    batch 1 and 2 (a version each) the product and the gate math run in one parallel loop, a
    chunk of units per iteration (:mod:`lstm_tvm.schedule.cpu.gate_rows`); from 3 rows on the
    GEMM has two versions, 4-row tiles for 3 or 4, 8-row tiles from 5 on (the branches of an
    ``if`` chain on ``B``): a step runs one of them. The time loop is one launch of the thread
    pool and each parallel loop ends in a barrier (:mod:`lstm_tvm.schedule.cpu.team`), not a
    launch each."""
    op = registry.get_op(op_name)
    attrs = validation.validate_attrs(op, {"use_peephole": False})
    func = BUILDERS[op_name](op, "float32", *sizes, attrs, KernelVariant())
    scheduled = schedule_for(op_name, func, resolve_target())
    step = _step_block(scheduled)
    product, members = (("gates", ("gate_act", "cell")) if op.direction == "forward"
                        else ("dh", ("cell_grad", "dcs_update")))
    versions = _versions(step.body)  # the gate math after the GEMM's versions is in none
    assert len(versions) == 4
    for rows, version in zip((1, 2), versions):
        (loop,) = _parallel_loops(version)  # the product and the gate math, one barrier
        assert ({f"{product}_few{rows}_update", *(f"{m}_few{rows}" for m in members)}
                <= _block_names(loop))
    assert [len(_parallel_loops(v)) for v in versions] == [1] * len(versions)
    assert len(_parallel_loops(step.body)) == len(versions) + 1  # and the gate math
    assert all(team.BARRIER in loop.annotations for loop in _parallel_loops(step.body))
    launches, steps = [], []
    tvm_ffi.structural_walk(scheduled.body, [(tirx.For, lambda node: launches.append(node)
                                              if team.LAUNCH_POINT in node.annotations
                                              else None)])
    tvm_ffi.structural_walk(scheduled.body, [(SBlock, lambda node: steps.append(node)
                                              if TIME_STEP in node.annotations else None)])
    # one launch per time loop: the forward has a second one, for sequences short enough to
    # read w in place (block step_short)
    assert len(steps) == (2 if op.direction == "forward" else 1)
    assert len(launches) == len(steps)
    assert all(loop.kind == tirx.ForKind.SERIAL for loop in launches)
    assert any(loop.body.block.same_as(step) for loop in launches)  # this time loop
    assert all(any(loop.body.block.same_as(s) for s in steps) for loop in launches)


def test_a_step_with_a_serial_block_keeps_a_launch_per_loop():
    """Every thread of a launch runs what lies outside its parallel loops: a step whose block
    is not inside one (here: the unscheduled kernel, all loops serial) is not made a launch."""
    op = registry.get_op("BlockLSTMV2")
    func = BUILDERS["BlockLSTMV2"](op, "float32", 8, 16, validation.validate_attrs(op, {}),
                                   KernelVariant())
    sch = team.launch_per_sequence(Schedule(func))
    found = []
    tvm_ffi.structural_walk(sch.mod["main"].body, [(tirx.For, lambda node: found.append(node)
                                                    if node.annotations else None)])
    assert found == []


def test_cpu_thread_pool_uses_every_core():
    """TVM alone would use half the cores on x86; lstm_tvm asks for all of them."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    code = ("import os, lstm_tvm; lstm_tvm.compile('LSTMBlockCell', input_size=2, cell_size=2);"
            "import tvm; print(os.environ['TVM_NUM_THREADS'], len(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out[0] == out[1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
