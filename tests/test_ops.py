"""The compiled kernels (through ``lstm_tvm.raw_ops``) against TF 2.21 and the float64 reference.

Every op x {float32, float16} x {peephole off, on} x shapes with B = 1, odd I and H, T = 1;
sequence ops with seq_len_max in {0, 1, T-1, T}; forward attributes including active clipping.
Against TF, TF's own float16 error bounds the comparison (``tf_tolerance``); against the
float64 reference lstm_tvm's tighter table applies (``TOLERANCE``).
"""

import math

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import reference, registry, testing
from lstm_tvm.targets import resolve_target
from lstm_tvm.kernels.block_lstm_grad import W_GRAD_TRANSPOSED_FROM, w_grad_chunk
from lstm_tvm.schedule.traits import kernel_variant

# (B, I, H, T): B = 1, odd sizes, T = 1, and one shape wide enough for the vectorised paths.
SHAPES = [(1, 3, 5, 1), (4, 7, 9, 5), (3, 16, 16, 4)]
DTYPES = ["float32", "float16"]
CELL_OPS = [n for n, op in registry.OPS.items() if op.kind == "cell"]
SEQ_OPS = [n for n, op in registry.OPS.items() if op.kind == "sequence"]


def _check(op_name, inputs, attrs, dtype, *, tf_outputs=None, T=None):
    """Run lstm_tvm on ``inputs``; compare with the reference and (if given) TF."""
    op = registry.get_op(op_name)
    got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
    assert got._fields == op.output_names
    ref = reference.run(op_name, inputs, attrs)
    n = inputs.get("seq_len_max")
    for name in op.output_names:
        value = getattr(got, name)
        assert value.dtype == np.dtype(dtype), f"{op_name}.{name}: dtype {value.dtype}"
        testing.assert_close(value, ref[name], dtype, f"{op_name}.{name} vs reference")
        if tf_outputs is not None:
            mask = testing.tf_defined_mask(op_name, name, n, T)
            testing.assert_close(value, tf_outputs[name], dtype, f"{op_name}.{name} vs TF",
                                 mask=mask, tol=testing.tf_tolerance(dtype))
    return got


@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op_name", CELL_OPS)
def test_cell_ops(tf, op_name, shape, dtype, use_peephole):
    B, I, H, _ = shape
    attrs = {"use_peephole": use_peephole}
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, attrs=attrs, seed=I * H)
    _check(op_name, inputs, attrs, dtype, tf_outputs=testing.tf_run(op_name, inputs, attrs))


@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op_name", SEQ_OPS)
def test_sequence_ops(tf, op_name, shape, dtype, use_peephole):
    B, I, H, T = shape
    attrs = {"use_peephole": use_peephole}
    for seq_len_max in sorted({0, 1, T - 1, T}):
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                                     seq_len_max=seq_len_max, attrs=attrs, seed=seq_len_max)
        got = _check(op_name, inputs, attrs, dtype, T=T,
                     tf_outputs=testing.tf_run(op_name, inputs, attrs))
        _assert_padding_zero(op_name, got, seq_len_max)


@pytest.mark.parametrize("I, H", [(16, 8), (264, 248)], ids=["rows", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", [n for n, op in registry.OPS.items()
                                     if op.kind == "sequence" and op.direction == "backward"])
def test_weight_gradient_over_several_chunks_of_rows(tf, op_name, dtype, I, H):
    """The sequence backward's w_grad reduces a chunk of rows of the sequence (t*B + n) at a
    time: seq_len_max = T makes two whole chunks and a partial one, 11 one whole and a partial
    one, 10 a single partial chunk; with B = 24 the rows of the initial state (h_prev for
    t = 0) lie in the first chunk only. From ``I+H = W_GRAD_TRANSPOSED_FROM`` on, CPU builds
    pack the chunk's rows transposed."""
    B, T = 24, 24
    assert (I + H >= W_GRAD_TRANSPOSED_FROM) == (I > 16)
    chunk = w_grad_chunk(I, H, kernel_variant(resolve_target("llvm")).l2_bytes)
    assert [divmod(n * B, chunk) for n in (T, 11, 10)] == [(2, 64), (1, 8), (0, 240)]
    attrs = {"use_peephole": True}
    for seq_len_max in (T, 11, 10):
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                                     seq_len_max=seq_len_max, attrs=attrs, seed=seq_len_max)
        _check(op_name, inputs, attrs, dtype, T=T,
               tf_outputs=testing.tf_run(op_name, inputs, attrs))


@pytest.mark.parametrize("I, H", [(16, 8), (264, 248)], ids=["rows", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", [n for n, op in registry.OPS.items()
                                     if op.kind == "sequence" and op.direction == "backward"])
def test_weight_gradient_when_whole_chunks_cover_the_rows(tf, op_name, dtype, I, H):
    """Rows of the sequence that the chunk divides: a float32 CPU kernel's last GEMM (over no
    rows then) still moves the accumulated chunks into ``w_grad``."""
    B, T = 8, 64
    chunk = w_grad_chunk(I, H, kernel_variant(resolve_target("llvm")).l2_bytes)
    attrs = {"use_peephole": False}
    for seq_len_max in (chunk // B, 2 * chunk // B):
        assert seq_len_max <= T and seq_len_max * B % chunk == 0
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                                     seq_len_max=seq_len_max, attrs=attrs, seed=seq_len_max)
        _check(op_name, inputs, attrs, dtype, T=T,
               tf_outputs=testing.tf_run(op_name, inputs, attrs))


def _assert_padding_zero(op_name, got, seq_len_max):
    """lstm_tvm zero-fills every time-major output at t >= seq_len_max (TF leaves some undefined)."""
    for name, spec in zip(got._fields, registry.get_op(op_name).outputs):
        if spec.shape[0] == "T":
            assert not getattr(got, name)[seq_len_max:].any(), f"{op_name}.{name}: padding not zero"


#: cell_clip: off (0 and negative, as TF), active, and above every cell state.
CLIPS = (0.0, -1.0, 0.5, 10.0)
#: The forget_bias each clip is paired with by default (every bias appears; 2.5 with the active
#: clip, where it clips most); the rest of the product is marked slow: each pair compiles a
#: kernel of its own.
_DEFAULT_BIAS = {0.0: -0.7, -1.0: 0.0, 0.5: 2.5, 10.0: 0.0}


def _forward_attr_cases():
    for op_name in (n for n, op in registry.OPS.items() if op.direction == "forward"):
        op = registry.get_op(op_name)
        biases = [0.0, -0.7, 2.5] if "forget_bias" in op.attr_names else [None]
        for fb in biases:
            for clip in CLIPS:
                default = fb is None or _DEFAULT_BIAS[clip] == fb
                yield pytest.param(op_name, fb, clip,
                                   marks=() if default else (pytest.mark.slow,))


@pytest.mark.parametrize("op_name,forget_bias,cell_clip", list(_forward_attr_cases()))
def test_forward_attributes(tf, op_name, forget_bias, cell_clip):
    op = registry.get_op(op_name)
    attrs = {"cell_clip": cell_clip, "use_peephole": True}
    if forget_bias is not None:
        attrs["forget_bias"] = forget_bias
    T = 3 if op.kind == "sequence" else None
    inputs = testing.make_inputs(op_name, B=4, I=5, H=6, T=T, seed=3, scale=2.0)
    got = _check(op_name, inputs, attrs, "float32", T=T,
                 tf_outputs=testing.tf_run(op_name, inputs, attrs))
    if cell_clip == 0.5:  # the clip must really have been active in this data
        assert (np.abs(got.cs) == np.float32(0.5)).sum() >= 5


@pytest.mark.parametrize("op_name", [n for n, op in registry.OPS.items() if op.direction == "backward"])
def test_grad_ops_on_clipped_activations(tf, op_name):
    """The clip is not differentiated: grads of clipped activations still match TF."""
    T = 3 if registry.get_op(op_name).kind == "sequence" else None
    fwd_attrs = {"cell_clip": 0.3, "use_peephole": True}
    inputs = testing.make_inputs(op_name, B=3, I=4, H=8, T=T, attrs=fwd_attrs, seed=5)
    attrs = {"use_peephole": True}
    _check(op_name, inputs, attrs, "float32", T=T, tf_outputs=testing.tf_run(op_name, inputs, attrs))


def test_defaults_match_tf(tf):
    """Omitted attributes take TF's defaults (forward ops)."""
    for op_name, op in registry.OPS.items():
        if op.direction != "forward":
            continue
        T = 2 if op.kind == "sequence" else None
        inputs = testing.make_inputs(op_name, B=2, I=3, H=4, T=T, seed=11)
        _check(op_name, inputs, {}, "float32", T=T, tf_outputs=testing.tf_run(op_name, inputs, {}))


FORWARD_OPS = [n for n, op in registry.OPS.items() if op.direction == "forward"]


def _forward_inputs(op_name, dtype, *, use_peephole, scale):
    op = registry.get_op(op_name)
    T = 3 if op.kind == "sequence" else None
    inputs = testing.make_inputs(op_name, dtype=dtype, B=4, I=5, H=6, T=T, seed=7, scale=scale,
                                 attrs={"use_peephole": use_peephole})
    return inputs, T


def _assert_no_nan(op_name, *results):
    """No NaN in any output of ``results`` (``assert_close`` passes any value where the
    expected one is NaN, so a NaN reference or TF output would make a comparison vacuous)."""
    for k, outputs in enumerate(results):
        bad = [name for name, value in outputs.items() if np.isnan(value).any()]
        assert not bad, f"{op_name}: NaN in outputs {bad} of result {k} (lstm_tvm, TF, ref)"


@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", FORWARD_OPS)
def test_infinite_cell_clip_matches_tf(tf, op_name, dtype, use_peephole):
    """``cell_clip=inf`` (TF: no clipping) on cell states past the default clip of 3: the same
    outputs as TF and the reference, none of them NaN."""
    attrs = {"cell_clip": float("inf"), "use_peephole": use_peephole}
    inputs, T = _forward_inputs(op_name, dtype, use_peephole=use_peephole, scale=3.0)
    expected = testing.tf_run(op_name, inputs, attrs)
    assert np.abs(expected["cs"]).max() > 3.5, "no |cs| that a finite clip would cut"
    got = _check(op_name, inputs, attrs, dtype, tf_outputs=expected, T=T)
    _assert_no_nan(op_name, got._asdict(), expected, reference.run(op_name, inputs, attrs))


#: Values TF accepts for ``cell_clip`` beyond the usual ones (TF 2.21: all but 3.4e38 turn
#: clipping off; 3.4e38 clips an infinite cell state to 3.4e38).
EDGE_CELL_CLIPS = [-math.inf, math.nan, 1e-50, 1e-40, 3.4e38, 1e39, -1e39]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", FORWARD_OPS)
def test_edge_cell_clip_values_match_tf(tf, op_name, dtype):
    """``cell_clip`` NaN, ``-inf``, float32 denormals and values at and past float32's range
    compute what TF computes. In float32 ``cs_prev`` holds +-inf, so that any active clip
    shows (the peepholes are off: an infinite state times a peephole weight would be NaN)."""
    inputs, T = _forward_inputs(op_name, dtype, use_peephole=False, scale=3.0)
    if dtype == "float32":
        inputs["cs_prev"].flat[::5] = np.inf
        inputs["cs_prev"].flat[1::5] = -np.inf
    tf_cs = {}
    for value in EDGE_CELL_CLIPS:
        attrs = {"cell_clip": value, "use_peephole": False}
        expected = testing.tf_run(op_name, inputs, attrs)
        tf_cs[value] = expected["cs"]
        got = _check(op_name, inputs, attrs, dtype, tf_outputs=expected, T=T)
        _assert_no_nan(op_name, got._asdict(), expected, reference.run(op_name, inputs, attrs))
    if dtype == "float32":  # the data tells an active clip from none
        assert not np.array_equal(tf_cs[3.4e38], tf_cs[1e39])


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__]))
