"""Sequence backward kernels that leave out ``x_grad`` or ``w_grad``
(:meth:`lstm_tvm.build.BuildSpec.without`), and the PyTorch layer that uses them when autograd
asks for no gradient of ``x`` (a first layer fed data) or of ``w`` (frozen weights).

The outputs such a kernel computes are checked against the float64 reference and against the
full kernel (the same blocks, so the same bits); the ones it leaves out must keep what their
buffers held. The layer's gradients are checked against TF's tape through
``tf.raw_ops.BlockLSTM``.
"""

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import raw_ops, reference, testing
from lstm_tvm._tvm import tvm
from lstm_tvm.build import make_spec
from lstm_tvm.registry import get_op
from lstm_tvm.validation import validate_attrs

T, B, I, H = 7, 3, 5, 8  # noqa: E741 - the registry's size symbols
SEQ_LEN_MAX = 5  # steps past it are zero in every output


@pytest.mark.parametrize("op_name, dtype, skipped", [
    ("BlockLSTMGrad", "float32", ("x_grad",)),
    ("BlockLSTMGrad", "float32", ("w_grad",)),
    ("BlockLSTMGradV2", "float32", ("w_grad", "x_grad")),
    ("BlockLSTMGradV2", "float16", ("x_grad",)),
])
def test_a_kernel_without_outputs_computes_the_rest_and_leaves_them_unwritten(
        op_name, dtype, skipped):
    attrs = {"use_peephole": True}
    inputs = testing.make_inputs(op_name, dtype=dtype, T=T, B=B, I=I, H=H,
                                 seq_len_max=SEQ_LEN_MAX, attrs=attrs, seed=3)
    full = lstm_tvm.compile(op_name, dtype=dtype, input_size=I, cell_size=H, **attrs)
    partial = full._without(skipped)
    assert partial.spec.skipped == tuple(sorted(skipped))
    dev = tvm.cpu()
    args = {n: v if n == "seq_len_max" else tvm.runtime.tensor(v, dev)
            for n, v in inputs.items()}
    want = reference.run(op_name, inputs, attrs)
    every = full(**args)
    sentinel = np.full((), np.nan, dtype)
    out = [tvm.runtime.tensor(np.broadcast_to(sentinel, t.shape).copy(), dev) for t in every]
    got = partial(**args, out=out)
    for name in got._fields:
        value = getattr(got, name).numpy()
        if name in skipped:
            assert np.isnan(value).all(), f"{name} was written"
            continue
        np.testing.assert_array_equal(value, getattr(every, name).numpy(), err_msg=name)
        testing.assert_close(value, want[name], dtype, f"{op_name}.{name}")


def test_only_sequence_backward_ops_leave_out_their_gemm_outputs():
    def spec_of(op_name):
        attrs = validate_attrs(get_op(op_name), {"use_peephole": False})
        return make_spec(op_name, "float32", I, H, attrs, "llvm")

    spec = spec_of("BlockLSTMGrad")
    assert spec.without(["x_grad"]).without(["w_grad"]).skipped == ("w_grad", "x_grad")
    assert spec.without(["x_grad"]).func_name.endswith("_without_x_grad")
    with pytest.raises(ValueError, match=r"'b_grad'\].*among \['w_grad', 'x_grad'\]"):
        spec.without(["b_grad"])
    for op_name in ("BlockLSTM", "LSTMBlockCellGrad"):
        with pytest.raises(ValueError, match="only a sequence backward op"):
            spec_of(op_name).without(["x_grad"])


torch = pytest.importorskip("torch", reason="lstm_tvm.torch needs PyTorch")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is the oracle")
import lstm_tvm.torch as lt  # noqa: E402


def _tf_gradients(module, x: np.ndarray, loss_w: np.ndarray, wrt: list) -> dict:
    """TF's gradients of ``sum(output * loss_w)`` (the module's layer as ``tf.raw_ops.BlockLSTM``
    with zero initial state) with respect to the names in ``wrt`` (``x`` and weight names)."""
    variables = {"x": tf.Variable(x), **{n: tf.Variable(v)
                                         for n, v in module.tf_weights().items()}}
    zeros = tf.zeros((x.shape[1], module.hidden_size))
    with tf.GradientTape() as tape:
        out = tf.raw_ops.BlockLSTM(
            seq_len_max=x.shape[0], cs_prev=zeros, h_prev=zeros, forget_bias=1.0,
            cell_clip=-1.0, use_peephole=True,
            **{n: variables[n] for n in ("x", "w", "wci", "wcf", "wco", "b")})
        loss = tf.reduce_sum(out.h * loss_w)
    return dict(zip(wrt, tape.gradient(loss, [variables[n] for n in wrt])))


@pytest.mark.parametrize("frozen", ["x", "w"])
def test_the_layer_asks_its_kernel_for_the_gradients_autograd_wants(monkeypatch, frozen):
    """A module whose input needs no gradient, or whose ``w`` is frozen: the other gradients
    against TF's tape, at the configuration's first call (the full kernel, where nothing
    planned it before) and on the route of a training loop, which runs the kernel without the
    unwanted output."""
    torch.manual_seed(0)
    module = lt.LSTM(I, H, use_peephole=True, cell_clip=None)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (T, B, I)).astype(np.float32)
    loss_w = rng.uniform(-1, 1, (T, B, H)).astype(np.float32)
    names = {"w": "w_l0", "b": "b_l0", "wci": "wci_l0", "wcf": "wcf_l0", "wco": "wco_l0"}
    wanted = [n for n in ("x", *names) if n != frozen]
    want = _tf_gradients(module, x, loss_w, wanted)
    left_out = []
    without = raw_ops._Plan.without
    monkeypatch.setattr(raw_ops._Plan, "without",
                        lambda plan, outputs: left_out.append(outputs) or without(plan, outputs))
    if frozen == "w":
        module.w_l0.requires_grad_(False)
    for call in ("first", "training loop"):
        module.zero_grad(set_to_none=True)
        tensor = torch.from_numpy(x).requires_grad_(frozen != "x")
        y, _ = module(tensor)
        (y * torch.from_numpy(loss_w)).sum().backward()
        grads = {"x": tensor.grad, **{n: getattr(module, p).grad for n, p in names.items()}}
        assert grads[frozen] is None
        for name in wanted:
            testing.assert_close(grads[name].numpy(), want[name].numpy(), "float32",
                                 f"d/d{name} ({call})")
    # the training loop's call at least (the first call too where an earlier test planned
    # this configuration)
    assert left_out and set(left_out) == {(f"{frozen}_grad",)}


def test_the_op_route_asks_its_kernel_for_the_gradients_autograd_wants(monkeypatch):
    """``lstm_tvm.torch.BlockLSTM`` in eager mode with an ``x`` that needs no gradient: the
    weights' gradients against TF's tape, on every call, the later ones through the kernel
    without ``x_grad``."""
    rng = np.random.default_rng(2)
    inputs = testing.make_inputs("BlockLSTM", T=T, B=B, I=I, H=H, seed=4)
    attrs = {"forget_bias": 0.5, "cell_clip": -1.0, "use_peephole": True}
    loss_w = rng.uniform(-1, 1, (T, B, H)).astype(np.float32)
    weights = ("w", "wci", "wcf", "wco", "b")
    variables = {n: tf.Variable(inputs[n]) for n in weights}
    with tf.GradientTape() as tape:
        out = tf.raw_ops.BlockLSTM(**{**inputs, **variables}, **attrs)
        tf_loss = tf.reduce_sum(out.h * loss_w)
    want = dict(zip(weights, tape.gradient(tf_loss, list(variables.values()))))
    left_out = []
    without = raw_ops._Plan.without
    monkeypatch.setattr(raw_ops._Plan, "without",
                        lambda plan, outputs: left_out.append(outputs) or without(plan, outputs))
    for call in range(3):
        tensors = {n: torch.from_numpy(v) for n, v in inputs.items()}
        for n in weights:
            tensors[n].requires_grad_()
        got = lt.BlockLSTM(**tensors, **attrs)
        (got.h * torch.from_numpy(loss_w)).sum().backward()
        assert tensors["x"].grad is None
        for n in weights:
            testing.assert_close(tensors[n].grad.numpy(), want[n].numpy(), "float32",
                                 f"d/d{n} (call {call})")
    assert left_out and set(left_out) == {("x_grad",)}
