"""lstm_tvm.tf: the ops as TensorFlow functions with gradients, eagerly and in ``tf.function``.

Truths: ``tf.raw_ops`` for every forward result; TF's ``GradientTape`` through ``BlockLSTM``
(TF 2.21's gradient of ``BlockLSTM`` is right; it pairs ``BlockLSTMV2`` with the wrong grad op
and registers none for ``LSTMBlockCell``); for ``BlockLSTMV2``, central differences of the
float64 reference; ``LSTMBlockCell`` is one step of ``BlockLSTM``, so TF's gradient of a
one-step ``BlockLSTM`` is the truth for the cell's. float32 throughout: the tolerances are
:func:`lstm_tvm.testing.tolerance`'s, with the loss's weights of order one.
"""

import numpy as np
import pytest
import tvm.testing

tf = pytest.importorskip("tensorflow", reason="lstm_tvm.tf needs TensorFlow")

import lstm_tvm.tf as ltf  # noqa: E402
from lstm_tvm import reference, registry, testing  # noqa: E402

T, B, I, H = 5, 3, 4, 6
FLOATS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")


def _attrs(op_name: str, peephole: bool) -> dict:
    """Attributes away from TF's defaults (each must reach the kernels)."""
    attrs = {"use_peephole": peephole, "cell_clip": 1.5, "forget_bias": 0.7}
    return testing.op_attrs(op_name, attrs)


def _inputs(op_name: str, peephole: bool, seq_len_max=None, seed=0) -> dict:
    return testing.make_inputs(op_name, B=B, I=I, H=H, T=T, seq_len_max=seq_len_max,
                               attrs=_attrs(op_name, peephole), seed=seed)


@pytest.mark.parametrize("peephole", [False, True], ids=["plain", "peephole"])
@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_forward_matches_tf(op_name, peephole):
    """Every op, eagerly: the outputs of ``tf.raw_ops.<op>`` (where TF defines them)."""
    seq = T - 2 if registry.get_op(op_name).kind == "sequence" else None
    inputs, attrs = _inputs(op_name, peephole, seq), _attrs(op_name, peephole)
    got = getattr(ltf, op_name)(**inputs, **attrs)
    want = testing.tf_run(op_name, inputs, attrs)
    assert got._fields == registry.get_op(op_name).output_names
    for name, value in got._asdict().items():
        assert isinstance(value, tf.Tensor) and value.dtype == tf.float32
        testing.assert_close(value.numpy(), want[name], "float32", f"{op_name}.{name}",
                             mask=testing.tf_defined_mask(op_name, name, seq, T))


def test_cell_grad_matmul_matches_the_reference():
    inputs = _inputs("LSTMBlockCellGrad", True)
    dicfo = testing.tf_run("LSTMBlockCellGrad", inputs, {"use_peephole": True})["dicfo"]
    got = ltf.cell_grad_matmul(inputs["x"], inputs["h_prev"], inputs["w"], dicfo)
    want = reference.cell_grad_matmul(inputs["x"], inputs["h_prev"], inputs["w"], dicfo)
    for name, value in got._asdict().items():
        testing.assert_close(value.numpy(), want[name], "float32", f"cell_grad_matmul.{name}")


def _loss_weights(shape_of, seed=1) -> dict:
    rng = np.random.default_rng(seed)
    return {n: tf.constant(rng.uniform(-1, 1, shape_of(n)).astype(np.float32))
            for n in ("cs", "h")}


def _tape_gradients(fn, inputs: dict, attrs: dict, weights: dict, *, graph: bool) -> dict:
    """``d/d(float inputs)`` of ``sum(cs * wc) + sum(h * wh)`` (the outputs ``weights``
    names) through ``fn`` (an op's
    ``**kwargs`` function), eagerly or in a ``tf.function`` with a dynamic time axis."""
    variables = {n: tf.Variable(inputs[n]) for n in FLOATS}

    def step(x):
        with tf.GradientTape() as tape:
            kwargs = {**{n: v for n, v in variables.items() if n != "x"}, **attrs}
            if "seq_len_max" in inputs:
                kwargs["seq_len_max"] = inputs["seq_len_max"]
            tape.watch(x)
            out = fn(x=x, **kwargs)
            loss = sum(tf.reduce_sum(getattr(out, n) * w) for n, w in weights.items())
        grads = tape.gradient(loss, [x, *(variables[n] for n in FLOATS[1:])])
        return loss, grads

    if graph:
        step = tf.function(step, input_signature=[tf.TensorSpec(
            [None, *inputs["x"].shape[1:]], tf.float32)], reduce_retracing=True)
    loss, grads = step(tf.constant(inputs["x"]))
    return {"loss": loss.numpy(), **{n: g.numpy() for n, g in zip(FLOATS, grads)}}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("seq_len_max", [T, T - 2], ids=["full", "padded"])
@pytest.mark.parametrize("peephole", [False, True], ids=["plain", "peephole"])
def test_block_lstm_gradients_match_tf(peephole, seq_len_max, graph):
    inputs, attrs = _inputs("BlockLSTM", peephole, seq_len_max), _attrs("BlockLSTM", peephole)
    weights = _loss_weights(lambda n: (T, B, H))
    got = _tape_gradients(ltf.BlockLSTM, inputs, attrs, weights, graph=graph)
    want = _tape_gradients(tf.raw_ops.BlockLSTM, inputs, attrs, weights, graph=graph)
    for name in want:
        testing.assert_close(got[name], want[name], "float32", f"BlockLSTM d/d{name}")


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_a_loss_on_h_alone_matches_tf(graph):
    """A loss that does not reach ``cs`` (TF's tape hands the gradient function zeros for
    it): every gradient against TF's tape through its own ``BlockLSTM``."""
    inputs, attrs = _inputs("BlockLSTM", True, T), _attrs("BlockLSTM", True)
    weights = {"h": _loss_weights(lambda n: (T, B, H))["h"]}
    got = _tape_gradients(ltf.BlockLSTM, inputs, attrs, weights, graph=graph)
    want = _tape_gradients(tf.raw_ops.BlockLSTM, inputs, attrs, weights, graph=graph)
    for name in want:
        testing.assert_close(got[name], want[name], "float32", f"BlockLSTM d/d{name}")


def test_cell_gradients_match_one_step_of_tf_block_lstm():
    """TF has no gradient for ``LSTMBlockCell``; one step of its ``BlockLSTM`` is the cell."""
    inputs, attrs = _inputs("LSTMBlockCell", True), _attrs("LSTMBlockCell", True)
    weights = _loss_weights(lambda n: (B, H))
    got = _tape_gradients(ltf.LSTMBlockCell, inputs, attrs, weights, graph=True)

    def one_step(x, **kwargs):
        out = tf.raw_ops.BlockLSTM(seq_len_max=np.int64(1), x=x[None], **kwargs)
        return type(out)(*(t[0] for t in out))

    want = _tape_gradients(one_step, inputs, attrs, weights, graph=True)
    for name in want:
        testing.assert_close(got[name], want[name], "float32", f"LSTMBlockCell d/d{name}")


@pytest.mark.parametrize("peephole", [False, True], ids=["plain", "peephole"])
def test_block_lstm_v2_gradients_match_finite_differences(peephole):
    """IFCO layout, ``seq_len_max < T``, clipped cell: against central differences of the
    float64 reference (TF's own tape gradient of ``BlockLSTMV2`` is wrong)."""
    inputs, attrs = _inputs("BlockLSTMV2", peephole, T - 1), _attrs("BlockLSTMV2", peephole)
    attrs["cell_clip"] = 0.0  # the clip is not differentiated: keep the reference smooth
    weights = _loss_weights(lambda n: (T, B, H))
    got = _tape_gradients(ltf.BlockLSTMV2, inputs, attrs, weights, graph=False)
    want = testing.reference_loss_gradients(
        "BlockLSTMV2", inputs, attrs, {n: w.numpy() for n, w in weights.items()}, FLOATS)
    for name in FLOATS:
        testing.assert_close(got[name], want[name], "float32", f"BlockLSTMV2 d/d{name}")


def test_static_shapes_and_trace_time_checks():
    inputs, attrs = _inputs("BlockLSTM", False), _attrs("BlockLSTM", False)
    rest = {n: v for n, v in inputs.items() if n not in ("x", "seq_len_max")}

    @tf.function(input_signature=[tf.TensorSpec([None, B, I], tf.float32),
                                  tf.TensorSpec([], tf.int64)])
    def run(x, n):
        return ltf.BlockLSTM(seq_len_max=n, x=x, **rest, **attrs)

    shapes = {k: v.shape.as_list() for k, v in
              run.get_concrete_function().structured_outputs._asdict().items()}
    assert shapes == {n: [None, B, H] for n in registry.get_op("BlockLSTM").output_names}
    # known shapes: refused when traced, with raw_ops' message naming the input
    with pytest.raises(ValueError, match=r"BlockLSTM: input 'w' expected shape \(I\+H, 4H\) = "
                                         r"\(10, 24\), got \(9, 24\)"):
        ltf.BlockLSTM(**{**inputs, "w": inputs["w"][1:]}, **attrs)
    with pytest.raises(TypeError, match="float64"):
        ltf.BlockLSTM(**{**inputs, "b": inputs["b"].astype(np.float64)}, **attrs)
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['peephole'\]"):
        ltf.BlockLSTM(**inputs, peephole=True)
    with pytest.raises(ValueError, match=r"seq_len_max <= T = 5, got 6"):
        ltf.BlockLSTM(**{**inputs, "seq_len_max": 6}, **attrs)
    # shapes known only when it runs: the kernels' check, as TF's error
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"seq_len_max <= T = 2, got 3"):
        run(tf.constant(inputs["x"][:2]), tf.constant(3, tf.int64))


def _speech_model(block_lstm, params, feats, labels, lengths):
    """A TF1-style acoustic model: a dense layer with a clipped ReLU, ``BlockLSTM`` as
    ``LSTMBlockFusedCell`` runs it (``forget_bias=0``, ``cell_clip=-1``, zero peepholes,
    ``seq_len_max`` the longest sequence), a dense layer to the classes and the CTC loss over
    each sequence's own length."""
    T_, B_, F = feats.shape
    dense = tf.minimum(tf.nn.relu(tf.reshape(feats, [-1, F]) @ params["w1"] + params["b1"]), 20)
    x = tf.reshape(dense, [T_, B_, -1])
    zeros = tf.zeros([B_, H])
    out = block_lstm(seq_len_max=tf.cast(tf.reduce_max(lengths), tf.int64), x=x, cs_prev=zeros,
                     h_prev=zeros,
                     w=params["w"], wci=tf.zeros([H]), wcf=tf.zeros([H]), wco=tf.zeros([H]),
                     b=params["b"], forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
    logits = tf.reshape(tf.reshape(out.h, [-1, H]) @ params["w2"] + params["b2"], [T_, B_, -1])
    loss = tf.nn.ctc_loss(labels, logits, label_length=None, logit_length=lengths,
                          logits_time_major=True, blank_index=-1)
    return tf.reduce_mean(loss)


def test_tf1_speech_model_loss_and_every_weight_gradient_match_tf():
    rng = np.random.default_rng(3)
    F, classes, T_ = 7, 5, 9
    shapes = {"w1": (F, I), "b1": (I,), "w": (I + H, 4 * H), "b": (4 * H,),
              "w2": (H, classes), "b2": (classes,)}
    params = {n: tf.Variable(rng.uniform(-0.5, 0.5, s).astype(np.float32))
              for n, s in shapes.items()}
    feats = tf.constant(rng.normal(size=(T_, B, F)).astype(np.float32))
    lengths = tf.constant([9, 6, 4], tf.int32)  # the longest is T_: every step runs
    labels = tf.sparse.from_dense(tf.constant([[1, 2, 3], [2, 2, 0], [3, 0, 0]], tf.int32))
    labels = tf.SparseTensor(labels.indices, labels.values, labels.dense_shape)

    @tf.function
    def grads(block_lstm, lengths):
        with tf.GradientTape() as tape:
            loss = _speech_model(block_lstm, params, feats, labels, lengths)
        return loss, tape.gradient(loss, params)

    for lens in (lengths, tf.constant([7, 6, 4], tf.int32)):  # and padded steps past 7
        got_loss, got = grads(ltf.BlockLSTM, lens)
        want_loss, want = grads(tf.raw_ops.BlockLSTM, lens)
        testing.assert_close(got_loss.numpy(), want_loss.numpy(), "float32", "ctc loss")
        for name in shapes:
            testing.assert_close(got[name].numpy(), want[name].numpy(), "float32",
                                 f"d loss/d {name}")


def test_training_matches_tf_step_by_step():
    """Ten Adam steps of a sequence model through lstm_tvm.tf and through TF's ``BlockLSTM``:
    the same losses and weights (float32 rounding of different summation orders only)."""
    rng = np.random.default_rng(5)
    x = tf.constant(rng.uniform(-1, 1, (T, B, I)).astype(np.float32))
    target = tf.constant(rng.uniform(-1, 1, (B, 1)).astype(np.float32))
    init = {"w": rng.uniform(-0.5, 0.5, (I + H, 4 * H)), "b": np.zeros(4 * H),
            "wci": rng.uniform(-0.5, 0.5, H), "wcf": rng.uniform(-0.5, 0.5, H),
            "wco": rng.uniform(-0.5, 0.5, H), "out": rng.uniform(-0.5, 0.5, (H, 1))}

    def train(block_lstm):
        weights = {n: tf.Variable(v.astype(np.float32)) for n, v in init.items()}
        optimizer = tf.keras.optimizers.Adam(0.05)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                zeros = tf.zeros([B, H])
                out = block_lstm(seq_len_max=np.int64(T), x=x, cs_prev=zeros, h_prev=zeros,
                                 w=weights["w"], wci=weights["wci"], wcf=weights["wcf"],
                                 wco=weights["wco"], b=weights["b"], use_peephole=True)
                loss = tf.reduce_mean((out.h[-1] @ weights["out"] - target) ** 2)
            variables = list(weights.values())
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        losses = [float(step()) for _ in range(10)]
        return losses, {n: v.numpy() for n, v in weights.items()}

    got_losses, got = train(ltf.BlockLSTM)
    want_losses, want = train(tf.raw_ops.BlockLSTM)
    assert want_losses[-1] < 0.5 * want_losses[0]  # it trains
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


if __name__ == "__main__":
    tvm.testing.main()
