"""GEMMs cut for a register tile whose rows do not divide the kernels' row padding (AVX2's
6x16): the kernels' structure per target, and every op built that way against the float64
reference at batch sizes and row counts on both sides of the cut."""

import re

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm._tvm import resolve_target, tvm
from lstm_tvm.kernels._builder import ROW_TILE
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
    assert traits.tile_rows == rows
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
    if name == "avx2":
        assert all(c in forward for c in cut) and all(c in backward for c in cut_back)
    else:
        assert not re.search(r'T.sblock\("\w+_rest_update"\)', forward + backward)


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


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_every_op_built_for_avx2_matches_the_reference(op_name, dtype):
    """I+H = 64 (60 + 4 rows of the weight gradient), T*B up to 288 rows: the backward's
    weight gradient over a whole chunk of 256 rows and a tail; ``seq_len_max < T`` too."""
    if not _host_has_avx2():
        pytest.skip("this CPU has no AVX2")
    I, H = 24, 40
    attrs = _attrs(op_name, **({"use_peephole": True} if op_name != "CellGradMatmul" else {}))
    f = lstm_tvm.compile(op_name, target=AVX2, dtype=dtype, input_size=I, cell_size=H,
                         **attrs)
    op = registry.get_op(op_name)
    for B in BATCHES:
        T = 9 if op.kind == "sequence" else None
        seq_len_max = 7 if op.kind == "sequence" and B == 13 else None
        if op_name == registry.CELL_GRAD_MATMUL:
            rng = np.random.default_rng(B)
            inputs = dict(zip(("x", "h_prev", "w", "dicfo"), (
                rng.uniform(-1, 1, shape).astype(dtype)
                for shape in ((B, I), (B, H), (I + H, 4 * H), (B, 4 * H)))))
        else:
            inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                                         seq_len_max=seq_len_max, attrs=f.attrs, seed=B)
        got = f(**{k: tvm.runtime.tensor(v) if v.ndim else int(v) for k, v in inputs.items()})
        got = got if isinstance(got, tuple) else (got,)
        ref = reference.run(op_name, inputs, f.attrs)
        names = [spec.name for spec in op.outputs]
        for name, value in zip(names, got):
            testing.assert_close(np.asarray(value.numpy()), ref[name], dtype,
                                 f"{op_name}.{name} B={B}")
