"""GEMMs cut for a register tile whose rows do not divide the kernels' row padding (AVX2's
6x16): the kernels' structure per target, and every op built that way against the float64
reference at batch sizes and row counts on both sides of the cut."""

import re

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm._tvm import tvm
from lstm_tvm.targets import resolve_target
from lstm_tvm.kernels.contract import ROW_TILE
from lstm_tvm.schedule.traits import cpu_traits
from lstm_tvm.validation import validate_attrs

AVX2 = {"kind": "llvm", "mcpu": "haswell"}
TARGETS = {"avx2": AVX2, "x86-64-v3": {"kind": "llvm", "mcpu": "x86-64-v3"},
           "avx512": {"kind": "llvm", "mcpu": "skylake-avx512"},
           "neon": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}}


def _attrs(op_name: str, **given) -> dict:
    op = registry.get_op(op_name)
    required = {a.name: False for a in op.attrs if a.required}
    return validate_attrs(op, {**required, **given})


def _script(op_name: str, target, I=24, H=40, prepacked=False) -> str:
    spec = build.make_spec(op_name, "float32", I, H, _attrs(op_name), resolve_target(target),
                           prepacked=prepacked)
    failures = []
    text = build.primfunc(spec, failures).script()
    assert failures == []
    return text


@pytest.mark.parametrize("name, rows", [("avx2", 6), ("x86-64-v3", 6), ("avx512", 0),
                                        ("neon", 0)])
def test_tile_rows_come_from_the_targets_registers(name, rows):
    traits = cpu_traits(resolve_target(TARGETS[name]))
    assert traits.gemm_tile_rows == rows
    if rows:  # 12 accumulator registers, two for the right operand, one for a broadcast
        assert 2 * rows + 2 + 1 <= traits.vector_registers
        assert ROW_TILE % rows  # else the GEMMs need no cut


@pytest.mark.parametrize("name", ["avx2", "avx512", "neon"])
def test_gemms_are_cut_only_where_the_tile_needs_it(name):
    forward = _script("BlockLSTMV2", TARGETS[name])
    backward = _script("BlockLSTMGradV2", TARGETS[name])
    cut = [f'T.sblock("{block}_rest_update")' for block in ("xw", "gates")]
    cut_back = [f'T.sblock("{block}_rest_update")'
                for block in ("dh", "x_grad_gemm", "w_grad")]  # I+H = 64: 60 + 4 rows
    # CellGradMatmul's xh_grad_t writes column panels (its columns are the padded batch)
    matmul = _script("CellGradMatmul", TARGETS[name])
    if name == "avx2":
        assert all(c in forward for c in cut) and all(c in backward for c in cut_back)
        assert 'T.sblock("xh_grad_t_rest_update")' in matmul
    else:
        assert not re.search(r'T.sblock\("\w+_rest_update"\)', forward + backward + matmul)


def test_the_head_gemm_runs_six_row_tiles_and_the_rest_two():
    """The default AVX2 tile of the cut GEMM is 6x16 (six rows unrolled, 16 lanes: two vectors
    of 8), the rows left run two rows per tile."""
    lines = _script("BlockLSTMV2", AVX2).splitlines()

    def tile_loops(block):
        at = next(k for k, line in enumerate(lines) if f'T.sblock("{block}")' in line)
        return [line.strip() for line in lines[max(0, at - 6):at] if " in T." in line]

    head = " ".join(tile_loops("xw_update"))
    assert re.search(r"T.unroll\((T.int64\()?6\)", head) and "T.vectorized(16)" in head, head
    rest = " ".join(tile_loops("xw_rest_update"))
    assert re.search(r"T.unroll\((T.int64\()?2\)", rest) and "T.vectorized(" in rest, rest


def _host_has_avx2():
    return tvm.target.codegen.llvm_cpu_has_features("avx2", resolve_target("llvm"))


#: Batch sizes on both sides of the cut: below one tile of rows (everything in the rest), one
#: padded tile (6 + 2 rows), 9..16 (12 + 4), 32 (30 + 2).
BATCHES = (1, 5, 8, 9, 13, 32)


def _inputs(op_name, dtype, B, I, H, T, seq_len_max, attrs, seed):
    """Inputs of ``op_name`` (``CellGradMatmul``: uniform ``x, h_prev, w, dicfo``)."""
    if op_name == registry.CELL_GRAD_MATMUL:
        rng = np.random.default_rng(seed)
        return dict(zip(("x", "h_prev", "w", "dicfo"), (
            rng.uniform(-1, 1, shape).astype(dtype)
            for shape in ((B, I), (B, H), (I + H, 4 * H), (B, 4 * H)))))
    return testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                               seq_len_max=seq_len_max, attrs=attrs, seed=seed)


def _check(f, op_name, inputs, dtype, label, held=()):
    """``f`` on ``inputs`` (but those it holds, ``held``) against the float64 reference, every
    output."""
    got = f(**{k: tvm.runtime.tensor(v) if v.ndim else int(v) for k, v in inputs.items()
               if k not in held})
    got = got if isinstance(got, tuple) else (got,)
    ref = reference.run(op_name, inputs, f.attrs)
    for spec, value in zip(registry.get_op(op_name).outputs, got):
        testing.assert_close(np.asarray(value.numpy()), ref[spec.name], dtype,
                             f"{op_name}.{spec.name} {label}")


def _compile(op_name, dtype, I, H):
    attrs = _attrs(op_name, **({"use_peephole": True} if op_name != "CellGradMatmul" else {}))
    return lstm_tvm.compile(op_name, target=AVX2, dtype=dtype, input_size=I, cell_size=H,
                            **attrs)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_every_op_built_for_avx2_matches_the_reference(op_name, dtype):
    """I+H = 64 (60 + 4 rows of the weight gradient), T*B up to 288 rows: the backward's
    weight gradient over a whole chunk of 256 rows and a tail; ``seq_len_max < T`` too."""
    if not _host_has_avx2():
        pytest.skip("this CPU has no AVX2")
    f = _compile(op_name, dtype, 24, 40)
    sequence = registry.get_op(op_name).kind == "sequence"
    for B in BATCHES:
        seq_len_max = 7 if sequence and B == 13 else None
        inputs = _inputs(op_name, dtype, B, 24, 40, 9 if sequence else None, seq_len_max,
                         f.attrs, B)
        _check(f, op_name, inputs, dtype, f"B={B}")


@pytest.mark.parametrize("op_name", ["BlockLSTMV2", "BlockLSTMGrad", "LSTMBlockCell",
                                     "CellGradMatmul"])
def test_empty_and_tiny_row_counts_built_for_avx2(op_name):
    """No rows at all (B = 0, T = 0, ``seq_len_max`` = 0: both blocks empty), fewer rows than a
    tile (B = 7, T = 1: 8 padded rows, 6 + 2), and I+H = 8 (the weight gradient 6 + 2), against
    the float64 reference."""
    if not _host_has_avx2():
        pytest.skip("this CPU has no AVX2")
    f = _compile(op_name, "float32", 5, 3)
    sequence = registry.get_op(op_name).kind == "sequence"
    cases = ((0, 4, None), (3, 4, 0), (3, 0, None), (7, 1, None)) if sequence else (
        (0, None, None), (7, None, None))
    for B, T, seq_len_max in cases:
        inputs = _inputs(op_name, "float32", B, 5, 3, T, seq_len_max, f.attrs, 1)
        _check(f, op_name, inputs, "float32", f"B={B} T={T} seq_len_max={seq_len_max}")


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTMV2", "BlockLSTMGradV2",
                                     "CellGradMatmul"])
def test_prepacked_kernels_built_for_avx2(op_name):
    """``bind(w=...)`` runs the prepacked kernel, whose GEMMs over the panels are cut too (the
    cell gradient's matmul: its step GEMMs ``x_grad_rows``, ``h_grad_rows``)."""
    if not _host_has_avx2():
        pytest.skip("this CPU has no AVX2")
    f = _compile(op_name, "float32", 24, 40)
    sequence = registry.get_op(op_name).kind == "sequence"
    for B in (7, 13, 32):
        inputs = _inputs(op_name, "float32", B, 24, 40, 9 if sequence else None, None,
                         f.attrs, B)
        bound = f.bind(w=inputs["w"])
        assert bound.spec.prepacked
        _check(bound, op_name, inputs, "float32", f"bound B={B}", held=("w",))
