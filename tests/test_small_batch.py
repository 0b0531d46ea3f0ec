"""Deployment batch sizes through the sequence kernels and the cell forward: below
``GATE_ROWS_BELOW`` rows a sequence step's product runs with its gate math, a chunk of units
at a time (a version per batch); below ``SINGLE_ROWS_BELOW`` rows ``LSTMBlockCell``'s GEMM
runs one row per tile without padding; the per-step GEMMs run up to
``SHORT_ROWS`` rows padded to ``SHORT_ROWS``, from there padded to ``ROW_TILE`` rows; every path
against the float64 reference, with peepholes, an active clip, padded steps
(``seq_len_max < T``) and float16. Small elementwise blocks run on one thread below
``ONE_THREAD_BELOW`` elements of work (``by_work``, and constant-size blocks outside a time
step): both sides of it against the reference, for the cell and the sequence ops."""

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm._tvm import Schedule, tirx
from lstm_tvm.kernels.block_lstm import PACK_FROM_ROWS
from lstm_tvm.kernels.cell_grad_matmul import DOTS_BELOW
from lstm_tvm.kernels.contract import (GATE_ROWS_BELOW, ONE_THREAD_BELOW, ROW_TILE, SHORT_ROWS,
                                      SINGLE_ROWS_BELOW)
from lstm_tvm.schedule.blocks import leaf_blocks, time_steps
from lstm_tvm.validation import validate_attrs

SEQ_OPS = [n for n, op in registry.OPS.items() if op.kind == "sequence"]
#: The ops whose GEMMs have small-batch versions.
STEP_GEMM_OPS = SEQ_OPS + ["LSTMBlockCell"]
#: Both sides of each threshold: one row per tile, padded tiles, a whole tile and past it.
BATCHES = sorted({1, SINGLE_ROWS_BELOW - 1, SINGLE_ROWS_BELOW, SHORT_ROWS, SHORT_ROWS + 1,
                  ROW_TILE - 1, ROW_TILE, ROW_TILE + 1})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", STEP_GEMM_OPS)
def test_every_batch_size_matches_the_reference(op_name, dtype):
    op = registry.get_op(op_name)
    attrs = {"use_peephole": True}
    if "cell_clip" in op.attr_names:
        attrs["cell_clip"] = 0.5  # active: the cell state reaches past it
    for B in BATCHES:
        sequence = op.kind == "sequence"
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=8, H=16,
                                     T=6 if sequence else None, seed=B, attrs=attrs)
        if sequence:
            inputs["seq_len_max"] = np.int64(4)
        got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        ref = reference.run(op_name, inputs, attrs)
        for name in op.output_names:
            testing.assert_close(getattr(got, name), ref[name], dtype,
                                 f"{op_name}.{name} B={B}")


@pytest.mark.parametrize("op_name, block", [
    ("BlockLSTMV2", "gates_few1"), ("BlockLSTMV2", "gates_few2"),
    ("BlockLSTMV2", f"gates_rows{SHORT_ROWS}"),
    ("BlockLSTMGradV2", "dh_few1"), ("BlockLSTMGradV2", "dh_few2"),
    ("BlockLSTMGradV2", "dh_first_few1"), ("BlockLSTMGradV2", f"dh_rows{SHORT_ROWS}"),
    ("LSTMBlockCell", "gates_rows"), ("LSTMBlockCell", f"gates_rows{SHORT_ROWS}")])
def test_the_small_batch_blocks_are_scheduled(op_name, block):
    """The small-batch versions of the per-step products (the sequence kernels' batches below
    ``GATE_ROWS_BELOW``: their gate rows, see the tests below) are tiled."""
    op = registry.get_op(op_name)
    spec = build.make_spec(op_name, "float32", 8, 16,
                           validate_attrs(op, {"use_peephole": False}), "llvm")
    failures = []
    text = build.primfunc(spec, failures).script()
    assert failures == []
    assert f'T.sblock("{block}_init")' in text and "T.parallel" in text  # decomposed: tiled


@pytest.mark.parametrize("mcpu, panels_per_tile", [("skylake-avx512", 2), ("haswell", 1)])
def test_one_row_tiles_hold_four_vectors_each_vector_loop_in_one_panel(mcpu, panels_per_tile):
    """A one-row tile over column panels (a prepacked ``LSTMBlockCell``) is four vectors wide
    (AVX-512: 64 columns, two column panels; AVX2: 32) and each vector loop stays inside one
    panel (a loop across two is a gather); checked on the scheduled TIR, so without the
    instruction set."""
    loops = _tile_loops("LSTMBlockCell", mcpu, "gates_rows_update", prepacked=True)
    assert "T.vectorized(32)" in loops[-1], loops
    assert ("T.unroll(2)" in loops[-2]) == (panels_per_tile == 2), loops


@pytest.mark.parametrize("rows", range(1, GATE_ROWS_BELOW))
@pytest.mark.parametrize("mcpu, accumulators", [("skylake-avx512", 256), ("haswell", 64)])
@pytest.mark.parametrize("op_name, product, copy, members", [
    ("BlockLSTMV2", "gates", "h_rows", ("gate_act", "cell", "state_update")),
    ("BlockLSTMGradV2", "dh", "dh_rows", ("cell_grad", "dcs_update"))])
def test_gate_row_tiles_hold_every_gate_of_each_row(op_name, product, copy, members, mcpu,
                                                     accumulators, rows):
    """A sequence step's product at batch 1 and 2 (a version per batch, as many rows) holds,
    per row, the four gate blocks of a run of units in registers, at most half the vector
    registers' floats (AVX-512: 256, AVX2: 64), as wide as that allows up to the chunk of 32
    units, and runs in one parallel loop with the gate math of those units, after the chunk's
    copy of the rows it reads (schedule/cpu/gate_rows.py)."""
    columns = min(32, accumulators // (4 * rows))
    loops = _tile_loops(op_name, mcpu, f"{product}_few{rows}_update", inner=4)
    assert f"T.vectorized({columns})" in loops[-1], loops
    assert "T.unroll(4)" in loops[-2] and f"T.unroll({rows})" in loops[-3], loops
    sch = _schedule(op_name, 64)
    blocks = (f"{copy}_few{rows}", f"{product}_few{rows}_update",
              *(f"{m}_few{rows}" for m in members))
    (loop,) = {sch.get(sch.get_loops(sch.get_sblock(name))[0]) for name in blocks}
    assert loop.kind == tirx.ForKind.PARALLEL
    text = sch.mod["main"].script()
    assert text.index(f'T.sblock("{blocks[0]}")') < text.index(f'T.sblock("{blocks[1]}")')


@pytest.mark.parametrize("op_name, product, copy", [("BlockLSTM", "gates", "h_rows"),
                                                    ("BlockLSTMGrad", "dh", "dh_rows")])
def test_gate_row_products_read_weights_beyond_the_l2_in_place(op_name, product, copy):
    """Where a step's weights outgrow a core's L2 (H=1024: 16 MiB) the product reads the rows
    other threads wrote in place: no per-chunk copies (kb.row_copy_scratch)."""
    text = build.primfunc(build.make_spec(
        op_name, "float32", 8, 1024,
        validate_attrs(registry.get_op(op_name), {"use_peephole": False}), "llvm")).script()
    assert f'T.sblock("{copy}_few1")' not in text
    assert f'T.sblock("{product}_few1_update")' in text


@pytest.mark.parametrize("mcpu, vector_loops", [("skylake-avx512", 8), ("haswell", 2)])
def test_one_row_tiles_over_a_row_major_weight_fill_the_accumulators(mcpu, vector_loops):
    """``LSTMBlockCell`` reads ``w`` in place, row-major: its one-row tile is as wide as the
    accumulators allow (AVX-512: 256 columns, eight 32-wide vector loops; AVX2: 64, two), so
    each reduction step reads a long run of a row of ``w``; the sequence kernels, whose
    weights are panels, keep four vectors (the test above)."""
    loops = _tile_loops("LSTMBlockCell", mcpu, "gates_rows_update")
    assert "T.vectorized(32)" in loops[-1], loops
    assert f"T.unroll({vector_loops})" in loops[-2], loops


def _tile_loops(op_name: str, mcpu: str, block: str, inner: int = 2,
                prepacked: bool = False) -> list[str]:
    """The ``inner`` innermost loops around ``block`` in ``op_name``'s scheduled TIR (I=8,
    H=64) for an x86 ``mcpu`` (its prepacked kernel with ``prepacked``): for a one-row tile
    the panel (or unrolled chunk) loop, then the vector loop."""
    op = registry.get_op(op_name)
    attrs = validate_attrs(op, testing.op_attrs(op_name, {"use_peephole": False}))
    spec = build.make_spec(op_name, "float32", 8, 64, attrs,
                           {"kind": "llvm", "mcpu": mcpu})
    if prepacked:
        spec = spec.with_prepacked_weights()
    text = build.primfunc(spec).script()
    return text[:text.index(f'T.sblock("{block}")')].splitlines()[-inner - 1:-1]


CELL_OPS = ["LSTMBlockCell", "LSTMBlockCellGrad"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", CELL_OPS)
def test_the_cell_ops_match_the_reference_on_both_sides_of_one_thread_work(op_name, dtype):
    H = 16
    attrs = {"use_peephole": True}
    if "cell_clip" in registry.get_op(op_name).attr_names:
        attrs["cell_clip"] = 0.5
    edge = ONE_THREAD_BELOW // (4 * H)  # the cell ops measure their work as B * 4H
    for B in (edge - 1, edge):
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=8, H=H, seed=B, attrs=attrs)
        got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        ref = reference.run(op_name, inputs, attrs)
        for name in registry.get_op(op_name).output_names:
            testing.assert_close(getattr(got, name), ref[name], dtype, f"{op_name}.{name} B={B}")


@pytest.mark.parametrize("op_name, block", [("LSTMBlockCell", "cell"),
                                            ("LSTMBlockCell", "xh"),
                                            ("LSTMBlockCellGrad", "cell_grad"),
                                            ("LSTMBlockCellGrad", "dicfo")])
def test_the_one_thread_version_of_a_block_has_no_parallel_loop(op_name, block):
    op = registry.get_op(op_name)
    spec = build.make_spec(op_name, "float32", 16, 16,
                           validate_attrs(op, {"use_peephole": True}), "llvm")
    failures = []
    sch = Schedule(build.primfunc(spec, failures))
    assert failures == []

    def kinds(name):
        return [sch.get(loop).kind for loop in sch.get_loops(sch.get_sblock(name))]

    assert tirx.ForKind.PARALLEL in kinds(block)
    assert tirx.ForKind.PARALLEL not in kinds(f"{block}_1t")
    assert tirx.ForKind.VECTORIZED in kinds(f"{block}_1t")


def _schedule(op_name, size):
    op = registry.get_op(op_name)
    spec = build.make_spec(op_name, "float32", size, size,
                           validate_attrs(op, {"use_peephole": True}), "llvm")
    failures = []
    sch = Schedule(build.primfunc(spec, failures))
    assert failures == []
    return sch


def _parallel(sch, name) -> bool:
    return any(sch.get(loop).kind == tirx.ForKind.PARALLEL
               for loop in sch.get_loops(sch.get_sblock(name)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", [n for n in SEQ_OPS
                                     if registry.get_op(n).direction == "backward"])
def test_the_sequence_backward_reads_no_row_past_the_zeros_it_writes(op_name, dtype):
    """A long sequence first leaves its rows of ``dicfo`` in the kernel's scratch; a short one
    then must read, past its last row, only the zero rows it writes there (``dicfo_zero_rows``:
    the first step of a batch below ``GATE_ROWS_BELOW``, the last rows rounded up to
    ``ROW_TILE``). Inputs with infinities leave NaN in the scratch, which a read past the
    zeros carries into the weight gradient even where the operand beside it is zero."""
    attrs = {"use_peephole": True}
    T = 24
    run = getattr(lstm_tvm.raw_ops, op_name)
    for B in (1, 2, 3, 9):
        long_inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=8, H=16, T=T, seed=B,
                                          attrs=attrs)
        long_inputs["h_grad"] = np.full_like(long_inputs["h_grad"], np.inf)
        run(**long_inputs, **attrs)
        for seq_len_max in (5, 13):
            inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=8, H=16, T=T,
                                         seq_len_max=seq_len_max, seed=B + seq_len_max,
                                         attrs=attrs)
            got = run(**inputs, **attrs)
            ref = reference.run(op_name, inputs, attrs)
            for name in registry.get_op(op_name).output_names:
                testing.assert_close(getattr(got, name), ref[name], dtype,
                                     f"{op_name}.{name} B={B} seq_len_max={seq_len_max}")


@pytest.mark.parametrize("op_name, block", [("BlockLSTMV2", "w_panels"),
                                            ("BlockLSTMGradV2", "w_t_h")])
def test_a_small_constant_block_outside_the_time_step_runs_on_one_thread(op_name, block):
    """At I=H=16 the block is far below ``ONE_THREAD_BELOW`` points, at I=H=256 above it; the
    time step's blocks stay parallel either way, and the time loop one launch of the pool."""
    small, large = _schedule(op_name, 16), _schedule(op_name, 256)
    assert not _parallel(small, block) and _parallel(large, block)
    for sch in (small, large):
        step = sch.get_sblock("step")
        assert all(_parallel(sch, sch.get(b).name_hint) for b in _leaves(sch, step))
        assert "pragma_parallel_launch_point" in sch.mod["main"].script()


def _leaves(sch, block):
    children = sch.get_child_blocks(block)
    return [leaf for c in children for leaf in (_leaves(sch, c) or [c])]


@pytest.mark.parametrize("op_name", SEQ_OPS)
def test_the_sequence_ops_match_the_reference_on_both_sides_of_one_thread_work(op_name):
    """The state copies and the padded steps' zeros (``B * H`` and ``(T - seq_len_max) * B *
    H`` points) run on one thread below ``ONE_THREAD_BELOW`` and in parallel from there."""
    H = 16
    attrs = {"use_peephole": True}
    if "cell_clip" in registry.get_op(op_name).attr_names:
        attrs["cell_clip"] = 0.5
    edge = ONE_THREAD_BELOW // H
    for B in (edge - 1, edge):
        inputs = testing.make_inputs(op_name, dtype="float32", B=B, I=8, H=H, T=3, seed=B,
                                     attrs=attrs)
        inputs["seq_len_max"] = np.int64(2)
        got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        ref = reference.run(op_name, inputs, attrs)
        for name in registry.get_op(op_name).output_names:
            testing.assert_close(getattr(got, name), ref[name], "float32",
                                 f"{op_name}.{name} B={B}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMV2"])
def test_the_forward_matches_the_reference_on_both_sides_of_packing_w(op_name, dtype):
    """Below ``PACK_FROM_ROWS`` rows (``seq_len_max * B``) the forward reads ``w`` in place,
    from there it packs ``w`` into panels first."""
    attrs = {"use_peephole": True, "cell_clip": 0.5}
    for B in (1, 3):
        edge = -(-PACK_FROM_ROWS // B)  # the fewest steps whose rows reach PACK_FROM_ROWS
        for steps in (edge - 1, edge):
            _check_forward(op_name, dtype, attrs, T=edge + 1, B=B, steps=steps)


def _check_forward(op_name, dtype, attrs, *, T, B, steps):
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=8, H=16, T=T, seed=steps * B,
                                 attrs=attrs)
    inputs["seq_len_max"] = np.int64(steps)
    got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
    ref = reference.run(op_name, inputs, attrs)
    for name in registry.get_op(op_name).output_names:
        testing.assert_close(getattr(got, name), ref[name], dtype,
                             f"{op_name}.{name} rows={steps * B}")


def test_a_short_sequence_reads_w_in_place():
    sch = _schedule("BlockLSTMV2", 16)
    names = {sch.get(b).name_hint for b in leaf_blocks(sch)}
    assert {"w_panels", "xw_update", "xw_short_update", "gates_short_few1_update"} <= names
    assert "w_panels_short" not in names
    assert len(time_steps(sch)) == 2


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("I, H", [(8, 16), (5, 3)])  # 4H = 12: partial sums of 4 lanes
def test_cell_grad_matmul_on_both_sides_of_its_dot_products(I, H, dtype):
    """Below ``DOTS_BELOW`` rows the unbound ``CellGradMatmul`` computes ``x_grad`` and
    ``h_prev_grad`` as dot products along ``w``'s rows, from there as the transposed GEMM;
    both sides (and an empty batch) against the float64 reference."""
    for B in sorted({0, 1, 2, DOTS_BELOW - 1, DOTS_BELOW, DOTS_BELOW + 2}):
        rng = np.random.default_rng(B)
        args = [rng.uniform(-1, 1, shape).astype(dtype)
                for shape in ((B, I), (B, H), (I + H, 4 * H), (B, 4 * H))]
        got = lstm_tvm.cell_grad_matmul(*args)
        ref = reference.cell_grad_matmul(*args)
        for name in got._fields:
            testing.assert_close(getattr(got, name), ref[name], dtype, f"{name} B={B}")


def test_cell_grad_matmul_dot_products_are_scheduled():
    """The dot products' partial sums are vectorised along their lanes, the reduction outside
    (a lane loop of 16 float32 per row of ``w``)."""
    spec = build.make_spec(registry.CELL_GRAD_MATMUL, "float32", 8, 16, {}, "llvm")
    failures = []
    text = build.primfunc(spec, failures).script()
    assert failures == []
    assert 'T.sblock("xh_grad_t_init")' in text  # the GEMM of the larger batches
    lines = text.splitlines()
    update = next(k for k, line in enumerate(lines) if 'T.sblock("xh_grad_lanes_update")' in line)
    assert "in T.vectorized(16)" in lines[update - 1]
    assert "in T.serial(" in lines[update - 2] or "in range(" in lines[update - 2]  # 4H / 16
