"""The float64 references: against TF 2.21's ``tf.raw_ops`` and against finite differences."""

import numpy as np
import pytest

from lstm_tvm import reference, registry, testing

SEQ_SHAPES = [  # (B, I, H, T): B=1, odd I and H, T=1
    (1, 3, 5, 1),
    (4, 7, 9, 5),
    (1, 7, 9, 5),
    (4, 3, 5, 1),
]
CELL_SHAPES = [(1, 3, 5), (4, 7, 9), (3, 16, 8)]
FORWARD_SEQ = [n for n, op in registry.OPS.items()
               if op.kind == "sequence" and op.direction == "forward"]
FORWARD = [n for n, op in registry.OPS.items() if op.direction == "forward"]
BACKWARD = [n for n, op in registry.OPS.items() if op.direction == "backward"]


def _seq_cases():
    for B, I, H, T in SEQ_SHAPES:
        for n in sorted({0, 1, T - 1, T}):
            yield (B, I, H, T, n)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _compare_with_tf(op_name, inputs, attrs, dtype, seq_len_max=None, T=None):
    ref = reference.run(op_name, inputs, attrs)
    got = testing.tf_run(op_name, inputs, attrs)
    assert list(ref) == list(registry.get_op(op_name).output_names)
    for name in ref:
        assert got[name].dtype == np.dtype(dtype), f"{op_name}.{name}: TF dtype {got[name].dtype}"
        mask = testing.tf_defined_mask(op_name, name, seq_len_max, T)
        testing.assert_close(got[name], ref[name], dtype, f"{op_name}.{name}", mask=mask,
                             tol=testing.tf_tolerance(dtype))
    return ref, got


# --- reference vs TF ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("shape", CELL_SHAPES)
@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "LSTMBlockCellGrad"])
def test_cell_ops_match_tf(tf, op_name, shape, use_peephole, dtype):
    B, I, H = shape
    attrs = {"use_peephole": use_peephole}
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, attrs=attrs, seed=B + I)
    _compare_with_tf(op_name, inputs, attrs, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("case", list(_seq_cases()))
@pytest.mark.parametrize("op_name", [n for n, op in registry.OPS.items() if op.kind == "sequence"])
def test_sequence_ops_match_tf(tf, op_name, case, use_peephole, dtype):
    B, I, H, T, n = case
    attrs = {"use_peephole": use_peephole}
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T, seq_len_max=n,
                                 attrs=attrs, seed=T * 10 + n)
    ref, got = _compare_with_tf(op_name, inputs, attrs, dtype, seq_len_max=n, T=T)
    for name, value in ref.items():  # lstm_tvm's choice: every padded step is zero
        if name in ("i", "cs", "f", "o", "ci", "co", "h", "x_grad"):
            assert not value[n:].any(), f"{op_name}.{name}: padded steps not zero"
    for name in set(ref) & {"cs", "h", "x_grad"}:  # ... which TF does for these
        assert not got[name][n:].any(), f"TF {op_name}.{name}: padded steps not zero"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", BACKWARD)
def test_peephole_grads_without_peephole_are_zero(tf, op_name, dtype):
    inputs = testing.make_inputs(op_name, dtype=dtype, B=4, I=7, H=9, T=3,
                                 attrs={"use_peephole": False})
    ref, got = _compare_with_tf(op_name, inputs, {"use_peephole": False}, dtype, 3, 3)
    for name in ("wci_grad", "wcf_grad", "wco_grad"):
        assert not got[name].any() and not ref[name].any(), f"{op_name}.{name}"


def _forget_bias_cases():
    for name in FORWARD:
        has_fb = "forget_bias" in registry.get_op(name).attr_names
        for forget_bias in ([None, 0.0, -0.7, 2.5] if has_fb else [None]):
            yield name, forget_bias


@pytest.mark.parametrize("cell_clip", [None, 0.0, -1.0, 0.5, 10.0])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize(("op_name", "forget_bias"), list(_forget_bias_cases()))
def test_forward_attrs_match_tf(tf, op_name, forget_bias, cell_clip, use_peephole):
    """``None`` omits the attribute: the registry default must be TF's."""
    op = registry.get_op(op_name)
    attrs = {"use_peephole": use_peephole}
    attrs.update({k: v for k, v in (("forget_bias", forget_bias), ("cell_clip", cell_clip))
                  if v is not None})
    T = 4 if op.kind == "sequence" else None
    inputs = testing.make_inputs(op_name, B=4, I=7, H=9, T=T, attrs=attrs, seed=3)
    ref, _ = _compare_with_tf(op_name, inputs, attrs, "float32", T, T)
    if cell_clip == 0.5:  # the test data must really clip, and the clip must be the bound
        assert (np.abs(ref["cs"]) == 0.5).sum() >= 5, "cell_clip=0.5 did not clip"
        assert np.abs(ref["cs"]).max() == 0.5


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("op_name", BACKWARD)
def test_grad_ops_on_clipped_activations_match_tf(tf, op_name, use_peephole, dtype):
    """Neither TF nor the reference differentiates through the clip: same result on clipped data."""
    fwd = registry.get_op(registry.get_op(op_name).pair)
    attrs = {"use_peephole": use_peephole, "cell_clip": 0.5}
    T = 4 if fwd.kind == "sequence" else None
    inputs = testing.make_inputs(op_name, dtype=dtype, B=4, I=7, H=9, T=T, attrs=attrs, seed=5)
    assert (np.abs(inputs["cs"].astype(np.float64)) == 0.5).sum() >= 5, "no clipping in the data"
    _compare_with_tf(op_name, inputs, testing.op_attrs(op_name, attrs), dtype, T, T)


def test_cell_grad_matmul_matches_tf_python_gradient(tf):
    """As TF's ``_LSTMBlockCellGrad``: ``dicfo @ w^T`` split, ``[x, h]^T @ dicfo``, BiasAddGrad."""
    inputs = testing.make_inputs("LSTMBlockCellGrad", B=4, I=7, H=9, attrs={"use_peephole": True})
    dicfo = testing.tf_run("LSTMBlockCellGrad", inputs, {"use_peephole": True})["dicfo"]
    x, h_prev, w = (tf.constant(inputs[k]) for k in ("x", "h_prev", "w"))
    xh_grad = tf.matmul(dicfo, w, transpose_b=True)
    expected = {
        "x_grad": xh_grad[:, :7], "h_prev_grad": xh_grad[:, 7:],
        "w_grad": tf.matmul(tf.concat([x, h_prev], 1), dicfo, transpose_a=True),
        "b_grad": tf.raw_ops.BiasAddGrad(out_backprop=dicfo),
    }
    got = reference.cell_grad_matmul(inputs["x"], inputs["h_prev"], inputs["w"], dicfo)
    assert list(got) == ["x_grad", "h_prev_grad", "w_grad", "b_grad"]
    for name, value in expected.items():
        testing.assert_close(value.numpy(), got[name], "float32", name)


@pytest.mark.parametrize("use_peephole", [False, True])
def test_cell_pipeline_equals_one_step_sequence_grad(tf, use_peephole):
    """LSTMBlockCellGrad + cell_grad_matmul == BlockLSTMGrad over T=1 (in TF and the reference)."""
    attrs = {"use_peephole": use_peephole}
    seq = testing.make_inputs("BlockLSTMGrad", B=3, I=5, H=7, T=1, attrs=attrs, seed=11)
    cell_inputs = {n: seq[n][0] if np.ndim(seq[n]) == 3 else seq[n]
                   for n in registry.get_op("LSTMBlockCellGrad").input_names}
    for run in (reference.run, testing.tf_run):
        cell = run("LSTMBlockCellGrad", cell_inputs, attrs)
        mm = reference.cell_grad_matmul(cell_inputs["x"], cell_inputs["h_prev"], cell_inputs["w"],
                                        cell["dicfo"])
        whole = run("BlockLSTMGrad", seq, attrs)
        combined = {**cell, **mm}
        for name, value in whole.items():
            got = combined[name][None] if name == "x_grad" else combined[name]
            testing.assert_close(got, value, "float32", f"{run.__module__}:{name}")


# --- finite differences (float64) --------------------------------------------------------------

FD_PARAMS = ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")
# Central differences with eps = 1e-6 in float64: truncation ~eps^2 = 1e-12, roundoff
# ~u |L| / eps ~ 1e-10 |L| (|L| ~ 1-10 here); measured worst 7e-10 in max(1, max|grad|) units.
FD_TOL = (1e-8, 1e-8)


def _f64_inputs(op_name, **kwargs):
    return testing.make_inputs(op_name, dtype="float64", **kwargs)


@pytest.mark.parametrize("cell_clip", [0.0, 50.0])
@pytest.mark.parametrize("gate_layout", list(registry.GATE_LAYOUTS))
def test_cell_grad_finite_differences(gate_layout, cell_clip):
    B, I, H = 3, 4, 5
    p = _f64_inputs("LSTMBlockCell", B=B, I=I, H=H, seed=7)
    rng = np.random.default_rng(8)
    c_cs, c_h = rng.uniform(-1, 1, (2, B, H))
    kw = {"forget_bias": 0.6, "cell_clip": cell_clip, "use_peephole": True,
          "gate_layout": gate_layout}

    cell_inputs = registry.get_op("LSTMBlockCell").input_names

    def loss(q):
        out = reference.lstm_block_cell(*(q[n] for n in cell_inputs), **kw)
        return float((out["cs"] * c_cs).sum() + (out["h"] * c_h).sum())

    args = [p[n] for n in cell_inputs]
    fwd = reference.lstm_block_cell(*args, **kw)
    assert np.abs(fwd["cs"]).max() < 50.0  # clip inactive
    acts = [fwd[k] for k in ("i", "cs", "f", "o", "ci", "co")]
    bwd = reference.lstm_block_cell_grad(*args, *acts, c_cs, c_h, use_peephole=True,
                                         gate_layout=gate_layout)
    analytic = {**reference.cell_grad_matmul(p["x"], p["h_prev"], p["w"], bwd["dicfo"]),
                "cs_prev_grad": bwd["cs_prev_grad"], "wci_grad": bwd["wci_grad"],
                "wcf_grad": bwd["wcf_grad"], "wco_grad": bwd["wco_grad"]}
    for name in FD_PARAMS:
        numeric = testing.fd_gradient(loss, p, name)
        testing.assert_close(analytic[f"{name}_grad"], numeric, "float64", f"d{name}",
                             tol=FD_TOL)


@pytest.mark.parametrize("seq_len_max", [4, 2])
@pytest.mark.parametrize("op_name", FORWARD_SEQ)
def test_sequence_grad_finite_differences(op_name, seq_len_max):
    B, I, H, T = 2, 3, 4, 4
    p = _f64_inputs(op_name, B=B, I=I, H=H, T=T, seq_len_max=seq_len_max, seed=9)
    rng = np.random.default_rng(10)
    c_cs, c_h = rng.uniform(-1, 1, (2, T, B, H))
    attrs = {"use_peephole": True, "cell_clip": 0.0}

    def loss(q):
        out = reference.run(op_name, q, attrs)
        return float((out["cs"] * c_cs).sum() + (out["h"] * c_h).sum())

    grad_op = registry.get_op(op_name).pair
    fwd = reference.run(op_name, p, attrs)
    analytic = reference.run(grad_op, {**p, **fwd, "cs_grad": c_cs, "h_grad": c_h},
                             {"use_peephole": True})
    for name in FD_PARAMS:
        numeric = testing.fd_gradient(loss, p, name)
        testing.assert_close(analytic[f"{name}_grad"], numeric, "float64", f"{grad_op}.d{name}",
                             tol=FD_TOL)
    assert not analytic["x_grad"][seq_len_max:].any()


# --- the reference's own contract ---------------------------------------------------------------

def test_run_rejects_bad_calls():
    inputs = testing.make_inputs("BlockLSTM", B=2, I=3, H=4, T=3)
    with pytest.raises(ValueError, match="unknown attributes"):
        reference.run("BlockLSTMV2", inputs, {"forget_bias": 1.0})
    grad_inputs = testing.make_inputs("BlockLSTMGrad", B=2, I=3, H=4, T=3)
    with pytest.raises(ValueError, match="missing required attributes"):
        reference.run("BlockLSTMGrad", grad_inputs, {})
    with pytest.raises(ValueError, match="seq_len_max"):
        reference.run("BlockLSTM", {**inputs, "seq_len_max": 4}, {})
    with pytest.raises(TypeError, match="seq_len_max"):
        reference.run("BlockLSTM", {**inputs, "seq_len_max": 1.5}, {})
    with pytest.raises(ValueError, match="expected w of shape"):
        reference.run("BlockLSTM", {**inputs, "w": inputs["w"][1:]}, {})
    with pytest.raises(KeyError, match="unknown op"):
        reference.run("LSTMBlockCellV3", inputs, {})


@pytest.mark.parametrize("op_name", BACKWARD)
def test_make_inputs_grad_activations_are_consistent(op_name):
    attrs = {"use_peephole": True, "cell_clip": 0.5}
    op = registry.get_op(op_name)
    T = 3 if op.kind == "sequence" else None
    inputs = testing.make_inputs(op_name, B=2, I=3, H=4, T=T, attrs=attrs)
    assert list(inputs) == list(op.input_names)
    fwd = reference.run(op.pair, {n: inputs[n] for n in registry.get_op(op.pair).input_names},
                        testing.op_attrs(op.pair, attrs))
    for name, value in fwd.items():
        if name in inputs:
            np.testing.assert_array_equal(inputs[name], value.astype(np.float32), err_msg=name)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))
