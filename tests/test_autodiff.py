"""lstm_tvm.autodiff against central finite differences of the float64 NumPy forward, and TF.

A scalar loss ``L = sum(cs * C_cs) + sum(h * C_h)`` (random C's; ``C_cs = 0`` when only ``h``'s
gradient is given) of one forward call. Central differences (eps 1e-6) of the float64
reference forward on the same float32-rounded inputs give dL/d(every float input) to ~1e-10;
lstm_tvm's float32 gradients must match them within float32's tolerance
(``lstm_tvm.testing.TOLERANCE``). ``cell_clip = 0``: the grad ops differentiate the unclipped
cell (as TF), so finite differences are only comparable where no clipping happens.
"""

import re

import numpy as np
import pytest

from lstm_tvm import autodiff, reference, registry, testing

B, I, H, T = 2, 3, 4, 4
FLOATS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")


def _f64(arrays):
    return {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in arrays.items()}


def _case(op_name, *, seq_len_max=None, h_only=False, seed=0, dtype="float32"):
    """Inputs (``dtype``), loss weights ``{"cs": C_cs, "h": C_h}`` and the loss of the float64
    reference forward with ``attrs``."""
    p = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H,
                            T=None if registry.get_op(op_name).kind == "cell" else T,
                            seq_len_max=seq_len_max, seed=seed)
    shape = registry.get_op(op_name).output("h").concrete_shape({"T": T, "B": B, "H": H})
    c_cs, c_h = np.random.default_rng(seed + 1).uniform(-1, 1, (2, *shape)).astype(dtype)
    weights = {"cs": np.zeros_like(c_cs) if h_only else c_cs, "h": c_h}
    return p, weights


def _fd_grads(op_name, p, weights, attrs):
    p64 = _f64(p)

    def loss(q):
        out = reference.run(op_name, q, attrs)
        return float(sum((out[k] * weights[k]).sum() for k in weights))

    return {n: testing.fd_gradient(loss, p64, n) for n in FLOATS}


def _attrs(op_name, peephole):
    attrs = {"cell_clip": 0.0, "use_peephole": peephole}
    if "forget_bias" in registry.get_op(op_name).attr_names:
        attrs["forget_bias"] = 0.6  # not the default: the forward's attrs must reach it
    return attrs


CASES = [("LSTMBlockCell", None, False), ("LSTMBlockCell", None, True)] + [
    (op, n, h_only) for op in ("BlockLSTM", "BlockLSTMV2")
    for n, h_only in ((T, False), (T - 2, False), (T - 1, True))]


@pytest.mark.parametrize("peephole", [False, True], ids=["no_peephole", "peephole"])
@pytest.mark.parametrize("op_name,seq_len_max,h_only", CASES)
def test_gradients_match_finite_differences(op_name, seq_len_max, h_only, peephole):
    """Every pair (V2 with BlockLSTMGradV2, IFCO), peepholes on/off, seq_len_max < T, and a
    missing ``cs`` gradient (zeros)."""
    attrs = _attrs(op_name, peephole)
    p, weights = _case(op_name, seq_len_max=seq_len_max, h_only=h_only, seed=3)
    outputs, backward = autodiff.vjp(op_name, p, attrs)
    ref = reference.run(op_name, p, attrs)
    for n in ("cs", "h"):
        testing.assert_close(getattr(outputs, n), ref[n], "float32", f"{op_name}.{n}")
    got = backward({"h": weights["h"]} if h_only else weights)
    assert list(got) == list(FLOATS)
    want = _fd_grads(op_name, p, weights, attrs)
    for n in FLOATS:
        assert got[n].dtype == np.float32 and got[n].shape == p[n].shape, n
        testing.assert_close(got[n], want[n], "float32", f"{op_name}.d{n}")
    if not peephole:
        for n in ("wci", "wcf", "wco"):
            assert not got[n].any(), f"{n}: the loss does not depend on it without peepholes"


def test_default_attrs_and_forward_run_inside():
    """``outputs=None`` runs the forward with TF's default attributes (BlockLSTM: forget_bias
    1, cell_clip 3, no peephole); the states stay inside the clip, so differences apply."""
    p, weights = _case("BlockLSTM", seed=7)
    assert np.abs(reference.run("BlockLSTM", p)["cs"]).max() < 3.0  # clip inactive
    got = autodiff.gradients("BlockLSTM", p, None, weights)
    want = _fd_grads("BlockLSTM", p, weights, {})
    for n in FLOATS:
        testing.assert_close(got[n], want[n], "float32", f"BlockLSTM.d{n}")


def test_float16():
    """float16 in, float16 gradients out (the kernels read float16 activations: 5e-3)."""
    p, weights = _case("BlockLSTMV2", seed=9, dtype="float16")
    got = autodiff.gradients("BlockLSTMV2", p, None, weights, {"use_peephole": True})
    want = _fd_grads("BlockLSTMV2", p, weights, {"use_peephole": True})
    for n in FLOATS:
        assert got[n].dtype == np.float16, n
        testing.assert_close(got[n], want[n], "float16", f"BlockLSTMV2.d{n}")


def test_grad_op_comes_from_the_registry(monkeypatch):
    """The grad op run is the forward op's ``pair``; the cell adds ``CellGradMatmul``, fed
    with the grad op's ``dicfo`` (:func:`lstm_tvm.autodiff.grad_route`)."""
    calls = []
    real_run = autodiff.run

    def run(op_name, *args, **kwargs):
        calls.append(op_name)
        return real_run(op_name, *args, **kwargs)

    monkeypatch.setattr(autodiff, "run", run)
    for op_name in autodiff.forward_ops():
        calls.clear()
        p, weights = _case(op_name)
        autodiff.gradients(op_name, p, None, weights, {"use_peephole": True})
        pair = registry.get_op(op_name).pair
        cell = op_name == "LSTMBlockCell"
        assert calls == [op_name, pair] + ([registry.CELL_GRAD_MATMUL] if cell else [])
        route = autodiff.grad_route(op_name)
        assert route.grad.name == pair
        assert set(route.from_grad) | set(route.from_matmul) == set(route.float_inputs)
        assert (route.matmul_sources[-1] == ("grad", "dicfo")) if cell else not route.from_matmul
    assert autodiff.forward_ops() == ("LSTMBlockCell", "BlockLSTM", "BlockLSTMV2")
    assert autodiff.differentiable_outputs("BlockLSTMV2") == ("cs", "h")


# --- TensorFlow's BlockLSTMV2 gradient bug ---------------------------------------------------

def _tf_tape_grads(tf, op_name, p, weights, attrs):
    tens = {n: tf.constant(p[n]) for n in FLOATS}
    with tf.device("/CPU:0"), tf.GradientTape() as tape:
        tape.watch(list(tens.values()))
        out = getattr(tf.raw_ops, op_name)(seq_len_max=tf.constant(int(p["seq_len_max"]),
                                                                   tf.int64), **tens, **attrs)
        loss = tf.reduce_sum(out.cs * weights["cs"]) + tf.reduce_sum(out.h * weights["h"])
    grads = tape.gradient(loss, [tens[n] for n in FLOATS])
    return {n: np.asarray(g) for n, g in zip(FLOATS, grads)}


def _rel_err(got, want):
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def test_tf_gradient_tape_through_block_lstm_v2_is_wrong(tf):
    """TF 2.21 registers BlockLSTM's gradient (BlockLSTMGrad, ICFO) for BlockLSTMV2 too, so
    ``tf.GradientTape`` reads V2's IFCO gates as ICFO: its gradients are off by O(1).
    ``tf.raw_ops.BlockLSTMGradV2`` called directly, and lstm_tvm's pairing, are right; the
    tape through BlockLSTM (V1) is right too, so the fault is the V2 registration only."""
    attrs = {"cell_clip": 0.0, "use_peephole": True}
    p, weights = _case("BlockLSTMV2", seed=11)
    want = _fd_grads("BlockLSTMV2", p, weights, attrs)

    tape = _tf_tape_grads(tf, "BlockLSTMV2", p, weights, attrs)
    errors = {n: _rel_err(tape[n], want[n]) for n in FLOATS}
    # 1e-2 is 1000x the float32 tolerance; measured: 0.1 to 1.2 (peephole grads 0.03 to 0.07).
    wrong = [n for n in ("x", "cs_prev", "h_prev", "w", "b") if errors[n] > 1e-2]
    assert wrong == ["x", "cs_prev", "h_prev", "w", "b"], errors

    fwd = testing.tf_run("BlockLSTMV2", p, attrs)
    direct = testing.tf_run("BlockLSTMGradV2", {**p, **fwd, "cs_grad": weights["cs"],
                                                "h_grad": weights["h"]}, {"use_peephole": True})
    ours = autodiff.gradients("BlockLSTMV2", p, None, weights, attrs)
    for n in FLOATS:
        testing.assert_close(direct[f"{n}_grad"], want[n], "float32", f"TF BlockLSTMGradV2.d{n}",
                             tol=testing.tf_tolerance("float32"))
        testing.assert_close(ours[n], want[n], "float32", f"lstm_tvm BlockLSTMV2.d{n}")

    v1_attrs = {**attrs, "forget_bias": 1.0}
    p1, _ = _case("BlockLSTM", seed=11)
    tape_v1 = _tf_tape_grads(tf, "BlockLSTM", p1, weights, v1_attrs)
    want_v1 = _fd_grads("BlockLSTM", p1, weights, v1_attrs)
    for n in FLOATS:
        testing.assert_close(tape_v1[n], want_v1[n], "float32", f"TF tape BlockLSTM.d{n}",
                             tol=testing.tf_tolerance("float32"))


# --- bad input -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seq_call():
    p, weights = _case("BlockLSTM", seed=13)
    outputs, _ = autodiff.vjp("BlockLSTM", p)
    return p, outputs._asdict(), weights


def test_unknown_op_and_grad_op_names():
    p, weights = _case("BlockLSTM")
    with pytest.raises(ValueError, match=r"unknown op 'LSTM'; expected a forward op, one of "
                                         r"\['LSTMBlockCell', 'BlockLSTM', 'BlockLSTMV2'\]"):
        autodiff.gradients("LSTM", p, None, weights)
    with pytest.raises(ValueError, match=r"'BlockLSTMGradV2' is a gradient op; expected a "
                                         r"forward op.*is 'BlockLSTMV2'"):
        autodiff.gradients("BlockLSTMGradV2", p, None, weights)
    with pytest.raises(ValueError, match="'LSTMBlockCellGrad' is a gradient op"):
        autodiff.vjp("LSTMBlockCellGrad", p)


def test_output_grad_of_wrong_shape(seq_call):
    p, outputs, weights = seq_call
    with pytest.raises(ValueError, match=re.escape(
            "BlockLSTM: output_grads['h'] expected shape (T, B, H) = (4, 2, 4), got (4, 2)")):
        autodiff.gradients("BlockLSTM", p, outputs, {"h": weights["h"][..., 0]})
    with pytest.raises(ValueError, match=re.escape(
            "BlockLSTM: output_grads['cs'] expected shape (T, B, H) = (4, 2, 4), got (2, 4)")):
        autodiff.gradients("BlockLSTM", p, outputs, {"cs": weights["cs"][0]})


def test_output_grad_of_wrong_dtype(seq_call):
    p, outputs, weights = seq_call
    with pytest.raises(TypeError, match=re.escape(
            "BlockLSTM: output_grads['h'] expected dtype float32 (the dtype of the inputs), "
            "got float64")):
        autodiff.gradients("BlockLSTM", p, outputs, {"h": weights["h"].astype(np.float64)})


def test_unknown_and_non_differentiable_output_grads(seq_call):
    p, outputs, weights = seq_call
    with pytest.raises(TypeError, match=r"unknown output\(s\) \['h_grad'\] in output_grads"):
        autodiff.gradients("BlockLSTM", p, outputs, {"h_grad": weights["h"]})
    with pytest.raises(ValueError, match=r"output_grads\['i'\] is nonzero, but BlockLSTMGrad "
                                         r"propagates only the gradients of \['cs', 'h'\]"):
        autodiff.gradients("BlockLSTM", p, outputs, {"i": weights["h"]})
    zero_i = autodiff.gradients("BlockLSTM", p, outputs, {"i": np.zeros_like(weights["h"]),
                                                          "h": weights["h"]})
    h_only = autodiff.gradients("BlockLSTM", p, outputs, {"h": weights["h"]})
    for n in FLOATS:
        np.testing.assert_array_equal(zero_i[n], h_only[n])


def test_bad_forward_outputs_and_inputs(seq_call):
    p, outputs, weights = seq_call
    partial = {k: v for k, v in outputs.items() if k != "ci"}
    with pytest.raises(TypeError, match=r"outputs is missing \['ci'\]; BlockLSTMGrad needs"):
        autodiff.gradients("BlockLSTM", p, partial, weights)
    bad = {**outputs, "cs": outputs["cs"][:2]}
    with pytest.raises(ValueError, match=re.escape(
            "BlockLSTM: outputs['cs'] expected shape (T, B, H) = (4, 2, 4), got (2, 2, 4)")):
        autodiff.gradients("BlockLSTM", p, bad, weights)
    with pytest.raises(ValueError, match=r"BlockLSTM: input 'w' expected shape \(I\+H, 4H\)"):
        autodiff.gradients("BlockLSTM", {**p, "w": p["w"][1:]}, outputs, weights)
    with pytest.raises(TypeError, match=r"BlockLSTM: missing input\(s\) \['b'\]"):
        autodiff.gradients("BlockLSTM", {k: v for k, v in p.items() if k != "b"}, outputs,
                           weights)
