"""lstm_tvm.torch.LSTM: the module against TF (``tf.raw_ops.BlockLSTM`` with TF's weights, and
``LSTMBlockFusedCell``'s handling of sequence lengths restated in TF ops), against
``torch.nn.LSTM`` (``BlockLSTMV2`` with ``forget_bias = 0`` and no peepholes is the same LSTM),
under ``torch.compile(fullgraph=True)`` and ``torch.export``, and training step by step as TF
does. float32 tolerances are :func:`lstm_tvm.testing.tolerance`'s unless a test says otherwise.
"""

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch", reason="lstm_tvm.torch needs PyTorch")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is the oracle")

import lstm_tvm.torch as lt  # noqa: E402
from lstm_tvm import _host_arrays, testing  # noqa: E402

T, B, I, H = 5, 3, 4, 6  # noqa: E741 - the registry's size symbols
#: TF's LSTMBlockFusedCell turns the clip off with -1 (the module's cell_clip=None).
NO_CLIP = -1.0


def _module(**kwargs) -> "lt.LSTM":
    torch.manual_seed(0)
    return lt.LSTM(I, H, use_peephole=True, **kwargs)


def _array(shape, seed) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _close(got, want, name, **kwargs):
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    want = want.detach() if isinstance(want, torch.Tensor) else want
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    testing.assert_close(got, want, "float32", name, **kwargs)


def _tf_layer(x, h0, c0, weights: dict, lengths=None, **attrs):
    """One layer as TF's ``LSTMBlockFusedCell`` runs it (``LSTMBlockWrapper.call``): the op
    over ``max(lengths)`` steps, outputs zeroed past each row's length, each row's final state
    gathered at its length from the states with the initial one prepended."""
    steps = x.shape[0] if lengths is None else tf.cast(tf.reduce_max(lengths), tf.int64)
    out = tf.raw_ops.BlockLSTM(seq_len_max=steps, x=x, cs_prev=c0, h_prev=h0, **weights,
                               **{"cell_clip": NO_CLIP, "use_peephole": True, **attrs})
    if lengths is None:
        return out.h, out.h[-1], out.cs[-1]
    mask = tf.transpose(tf.sequence_mask(lengths, x.shape[0], dtype=tf.float32))[:, :, None]
    h = out.h * mask
    index = tf.stack([lengths, tf.range(x.shape[1])], axis=1)
    final_h = tf.gather_nd(tf.concat([h0[None], h], 0), index)
    final_c = tf.gather_nd(tf.concat([c0[None], out.cs], 0), index)
    return h, final_h, final_c


def test_forward_matches_tf_block_lstm():
    module = _module()
    x, h0, c0 = _array((T, B, I), 1), _array((1, B, H), 2), _array((1, B, H), 3)
    y, (h_n, c_n) = module(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    want = _tf_layer(x, h0[0], c0[0], module.tf_weights())
    for name, got, expected in (("output", y, want[0]), ("h_n", h_n[0], want[1]),
                                ("c_n", c_n[0], want[2])):
        _close(got, expected, name)
    assert h_n.shape == c_n.shape == (1, B, H)


def test_the_zero_initial_state_stays_zero_for_later_calls():
    """Without a state the eager route reads one zero tensor kept between calls: what a call
    returns never shares its memory (writing to a T=0 call's final state, which is the
    initial one, does not change the next call's)."""
    module = _module()
    x = _array((T, B, I), 1)
    want = _tf_layer(x, np.zeros((B, H), np.float32), np.zeros((B, H), np.float32),
                     module.tf_weights())
    _, (h_0, c_0) = module(torch.zeros(0, B, I))
    assert torch.equal(h_0, torch.zeros(1, B, H)) and torch.equal(c_0, torch.zeros(1, B, H))
    h_0.add_(1.0)
    c_0.add_(2.0)
    y, (h_n, c_n) = module(torch.from_numpy(x))
    for name, got, expected in (("output", y, want[0]), ("h_n", h_n[0], want[1]),
                                ("c_n", c_n[0], want[2])):
        _close(got, expected, name)


def test_sequence_lengths_match_tf_forward_and_gradients():
    """Rows of lengths 4, 2 and 0 (``seq_len_max`` 4 < T): outputs, final states and the
    gradients of every input and weight, against TF's tape through the same computation."""
    module = _module()
    lengths = np.array([4, 2, 0], np.int32)
    values = {"x": _array((T, B, I), 1), "h0": _array((B, H), 2), "c0": _array((B, H), 3)}
    loss_w = {"y": _array((T, B, H), 4), "h": _array((B, H), 5), "c": _array((B, H), 6)}

    tensors = {n: torch.from_numpy(v).requires_grad_() for n, v in values.items()}
    y, (h_n, c_n) = module(tensors["x"], (tensors["h0"][None], tensors["c0"][None]),
                           sequence_length=torch.from_numpy(lengths))
    loss = sum((t * torch.from_numpy(loss_w[k])).sum()
               for k, t in (("y", y), ("h", h_n[0]), ("c", c_n[0])))
    loss.backward()

    variables = {n: tf.Variable(v) for n, v in {**values, **module.tf_weights()}.items()}
    with tf.GradientTape() as tape:
        weights = {n: variables[n] for n in ("w", "wci", "wcf", "wco", "b")}
        out = _tf_layer(variables["x"], variables["h0"], variables["c0"], weights,
                        tf.constant(lengths))
        tf_loss = sum(tf.reduce_sum(t * loss_w[k]) for k, t in zip("yhc", out))
    grads = dict(zip(variables, tape.gradient(tf_loss, list(variables.values()))))

    for name, got, expected in (("output", y, out[0]), ("h_n", h_n[0], out[1]),
                                ("c_n", c_n[0], out[2]), ("loss", loss, tf_loss)):
        _close(got, expected, name)
    for name in values:
        _close(tensors[name].grad, grads[name], f"d/d{name}")
    for name, param in module.layer_inputs(0).items():
        _close(param.grad, grads[name], f"d/d{name}")


def test_batch_first_and_unbatched_inputs():
    module, x = _module(), torch.from_numpy(_array((T, B, I), 1))
    y, (h_n, c_n) = module(x)
    first = _module(batch_first=True)
    y_b, (h_b, c_b) = first(x.transpose(0, 1))
    assert torch.equal(y_b, y.transpose(0, 1)) and torch.equal(h_b, h_n)
    y_u, (h_u, c_u) = module(x[:, 0])
    assert y_u.shape == (T, H) and h_u.shape == c_u.shape == (1, H)
    _close(y_u, y[:, 0], "unbatched output")
    _close(c_u, c_n[:, 0], "unbatched c_n")


def test_two_layers_match_chained_tf_calls():
    module = _module(num_layers=2)
    x = _array((T, B, I), 1)
    state = (torch.from_numpy(_array((2, B, H), 2)), torch.from_numpy(_array((2, B, H), 3)))
    y, (h_n, c_n) = module(torch.from_numpy(x), state)
    inputs = x
    for k in range(2):
        h, last_h, last_c = _tf_layer(inputs, state[0][k].numpy(), state[1][k].numpy(),
                                      module.tf_weights(k))
        _close(h_n[k], last_h, f"h_n[{k}]")
        _close(c_n[k], last_c, f"c_n[{k}]")
        inputs = h
    _close(y, inputs, "output")


def _tf_two_layer_gradients(module, x: np.ndarray, loss_w: np.ndarray) -> dict:
    """TF's tape gradients of ``sum(y * loss_w)`` through two chained layers holding the
    module's weights (zero initial state), by the module's parameter names and ``x``."""
    variables = {"x": tf.Variable(x)}
    for k in range(2):
        variables.update({f"{n}_l{k}": tf.Variable(v)
                          for n, v in module.tf_weights(k).items()})
    zeros = np.zeros((x.shape[1], H), np.float32)
    with tf.GradientTape() as tape:
        y = variables["x"]
        for k in range(2):
            weights = {n: variables[f"{n}_l{k}"] for n in ("w", "wci", "wcf", "wco", "b")}
            y = _tf_layer(y, zeros, zeros, weights, forget_bias=1.0)[0]
        loss = tf.reduce_sum(y * loss_w)
    return dict(zip(variables, tape.gradient(loss, list(variables.values()))))


@pytest.mark.parametrize("num_layers", [1, 2])
def test_final_state_gradients_match_tf(num_layers):
    """A loss on the output and on every layer's final state ``h_n``, ``c_n`` (given initial
    state): the gradients of ``x``, of the initial state and of every weight against TF's
    tape through the chained layers, at a configuration's first call and again on the route
    of a training loop (its plans kept)."""
    module = _module(num_layers=num_layers)
    values = {"x": _array((T, B, I), 1), "h0": _array((num_layers, B, H), 2),
              "c0": _array((num_layers, B, H), 3)}
    loss_w = {"y": _array((T, B, H), 4), "h": _array((num_layers, B, H), 5),
              "c": _array((num_layers, B, H), 6)}

    variables = {n: tf.Variable(v) for n, v in values.items()}
    for k in range(num_layers):
        variables.update({f"{n}_l{k}": tf.Variable(v) for n, v in module.tf_weights(k).items()})
    with tf.GradientTape() as tape:
        y, finals = variables["x"], []
        for k in range(num_layers):
            weights = {n: variables[f"{n}_l{k}"] for n in ("w", "wci", "wcf", "wco", "b")}
            y, last_h, last_c = _tf_layer(y, variables["h0"][k], variables["c0"][k], weights,
                                          forget_bias=1.0)
            finals.append((last_h, last_c))
        tf_loss = tf.reduce_sum(y * loss_w["y"]) + sum(
            tf.reduce_sum(h * loss_w["h"][k]) + tf.reduce_sum(c * loss_w["c"][k])
            for k, (h, c) in enumerate(finals))
    want = dict(zip(variables, tape.gradient(tf_loss, list(variables.values()))))

    for call in ("first", "training loop"):
        module.zero_grad()
        tensors = {n: torch.from_numpy(v).requires_grad_() for n, v in values.items()}
        y, (h_n, c_n) = module(tensors["x"], (tensors["h0"], tensors["c0"]))
        loss = sum((t * torch.from_numpy(loss_w[k])).sum()
                   for k, t in (("y", y), ("h", h_n), ("c", c_n)))
        loss.backward()
        _close(loss, tf_loss, f"loss ({call})")
        for name in values:
            _close(tensors[name].grad, want[name], f"d/d{name} ({call})")
        for name, param in module.named_parameters():
            _close(param.grad, want[name], f"d/d{name} ({call})")


def test_no_steps_pass_the_final_state_gradient_to_the_initial_state():
    """With ``T = 0`` the final state is the initial one: its gradient is the loss's weight
    on ``h_n`` and ``c_n``, the weights get none."""
    module = _module(num_layers=2)
    h0, c0 = (torch.from_numpy(_array((2, B, H), s)).requires_grad_() for s in (2, 3))
    loss_h, loss_c = torch.from_numpy(_array((2, B, H), 5)), torch.from_numpy(_array((2, B, H), 6))
    for _ in range(2):
        h0.grad = c0.grad = None
        y, (h_n, c_n) = module(torch.zeros(0, B, I), (h0, c0))
        assert y.shape == (0, B, H)
        ((h_n * loss_h).sum() + (c_n * loss_c).sum()).backward()
        assert torch.equal(h0.grad, loss_h) and torch.equal(c0.grad, loss_c)
        assert all(p.grad is None or not p.grad.any() for p in module.parameters())


def test_layer_gradients_survive_a_later_forward():
    """Two layers, a loss on the output only (no gradient reaches ``c_n``: the layers' ``cs``
    gradients are zeros), and a second forward of the same shapes run before the first one's
    backward: the gate outputs the first backward reads are not overwritten. Every gradient
    against TF's tape."""
    module = _module(num_layers=2)
    x1, x2 = _array((T, B, I), 1), _array((T, B, I), 2)
    loss_w = _array((T, B, H), 3)
    # a step first: the plans of both directions are then kept, and the calls below take the
    # route of a training loop (the backward reads the gates where the forward kernel wrote)
    module(torch.from_numpy(x2).requires_grad_())[0].sum().backward()
    module.zero_grad()
    first = torch.from_numpy(x1).requires_grad_()
    y1, _ = module(first)
    assert type(y1.grad_fn).__name__ == "BlockLSTMLayerFunctionBackward"
    y2, _ = module(torch.from_numpy(x2).requires_grad_())
    (y1 * torch.from_numpy(loss_w)).sum().backward()
    want = _tf_two_layer_gradients(module, x1, loss_w)
    _close(first.grad, want["x"], "d/dx")
    for name, param in module.named_parameters():
        _close(param.grad, want[name], f"d/d{name}")
    del y2


def test_a_change_in_place_before_the_backward_raises():
    """A weight or an output changed in place between a layer's forward and its backward makes
    the backward raise, as PyTorch's own ops do, rather than return a wrong gradient; an input
    that needs no gradient gets none."""
    module = _module()
    x = torch.from_numpy(_array((T, B, I), 1))
    module(x)[0].sum().backward()  # plans kept: the calls below take a training loop's route
    y, _ = module(x)
    with torch.no_grad():
        module.w_l0.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y, _ = module(x)
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    module.zero_grad()
    module(x)[0].sum().backward()
    assert x.grad is None and module.w_l0.grad is not None


def test_kept_final_states_do_not_hold_the_steps_buffers(monkeypatch):
    """A training loop that keeps each step's ``h_n`` (graph and all) reuses the kernels'
    output buffers: what a kept final state holds is its own copy and the layer's graph node,
    not the step's gates (a new buffer a step would fault its pages in every time)."""
    module = _module()
    x = torch.from_numpy(_array((T, B, I), 1))

    def step():
        y, (h_n, _) = module(x)
        y.sum().backward()
        return h_n

    for _ in range(3):
        step()
    made = []
    real_init = _host_arrays.OutputBuffer.__init__

    def counted(self, layout):
        made.append(layout)
        real_init(self, layout)

    monkeypatch.setattr(_host_arrays.OutputBuffer, "__init__", counted)
    kept = [step() for _ in range(5)]
    assert not made, f"{len(made)} output buffers made in 5 steps"
    assert all(h.grad_fn is not None for h in kept)


def test_a_retained_graph_runs_backward_twice():
    """``retain_graph=True`` keeps what the layers saved: a second backward adds the same
    gradients again (TF's tape, doubled)."""
    module = _module(num_layers=2)
    x, loss_w = _array((T, B, I), 1), _array((T, B, H), 3)
    first = torch.from_numpy(x).requires_grad_()
    y, _ = module(first)
    loss = (y * torch.from_numpy(loss_w)).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    want = _tf_two_layer_gradients(module, x, loss_w)
    _close(first.grad, 2 * want["x"].numpy(), "d/dx, twice")
    for name, param in module.named_parameters():
        _close(param.grad, 2 * want[name].numpy(), f"d/d{name}, twice")


def test_block_lstm_v2_module_is_torch_nn_lstm():
    """``torch.nn.LSTM``'s gates are IFCO (i, f, g, o): with its weights stacked as ``w`` and
    its two biases summed, ``BlockLSTMV2`` (no forget bias, no clip, no peepholes) is the same
    LSTM, forward and backward."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, H)
    ours = lt.LSTM(I, H, op="BlockLSTMV2")
    ours.load_tf_weights(w=torch.cat([ref.weight_ih_l0, ref.weight_hh_l0], 1).T,
                         b=ref.bias_ih_l0 + ref.bias_hh_l0)
    x, h0, c0 = (torch.from_numpy(_array(s, k)) for k, s in
                 enumerate([(T, B, I), (1, B, H), (1, B, H)]))
    results = {}
    for name, module in (("ref", ref), ("ours", ours)):
        inputs = [t.clone().requires_grad_() for t in (x, h0, c0)]
        y, (h_n, c_n) = module(inputs[0], (inputs[1], inputs[2]))
        (y.square().sum() + h_n.sum() + 2 * c_n.sum()).backward()
        results[name] = [y, h_n, c_n, *(t.grad for t in inputs)]
    names = ["output", "h_n", "c_n", "d/dx", "d/dh0", "d/dc0"]
    for name, got, want in zip(names, results["ours"], results["ref"]):
        _close(got, want, name)
    _close(ours.w_l0.grad[:I].T, ref.weight_ih_l0.grad, "d/dW_ih")
    _close(ours.w_l0.grad[I:].T, ref.weight_hh_l0.grad, "d/dW_hh")
    _close(ours.b_l0.grad, ref.bias_hh_l0.grad, "d/db")


def test_from_tf_and_load_tf_weights():
    w, b = _array((I + H, 4 * H), 1), _array((4 * H,), 2)
    peepholes = {n: _array((H,), k) for k, n in enumerate(("wci", "wcf", "wco"), 3)}
    module = lt.LSTM.from_tf(w, b, **peepholes, forget_bias=0.5)
    assert (module.input_size, module.hidden_size, module.use_peephole) == (I, H, True)
    assert all(np.array_equal(module.tf_weights()[n], v)
               for n, v in {"w": w, "b": b, **peepholes}.items())
    x = _array((T, B, I), 6)
    y, _ = module(torch.from_numpy(x))
    zeros = np.zeros((B, H), np.float32)
    _close(y, _tf_layer(x, zeros, zeros, {"w": w, "b": b, **peepholes}, forget_bias=0.5)[0],
           "output")
    with pytest.raises(ValueError, match=r"w \(kernel\) expected shape \(10, 24\), got "
                                         r"\(9, 24\)"):
        module.load_tf_weights(w[1:], b, **peepholes)
    with pytest.raises(ValueError, match=r"wci \(w_i_diag\) is required"):
        module.load_tf_weights(w, b)
    with pytest.raises(ValueError, match=r"wci \(w_i_diag\) given, but the module has no "
                                         r"peepholes"):
        lt.LSTM(I, H).load_tf_weights(w, b, **peepholes)


def test_constructor_and_forward_errors():
    with pytest.raises(ValueError, match=r"BlockLSTMV2 has no forget_bias"):
        lt.LSTM(I, H, op="BlockLSTMV2", forget_bias=1.0)
    with pytest.raises(ValueError, match=r"op expected one of \['BlockLSTM', 'BlockLSTMV2'\]"):
        lt.LSTM(I, H, op="LSTMBlockCell")
    with pytest.raises(ValueError, match=r"attribute 'forget_bias' expected a finite float"):
        lt.LSTM(I, H, forget_bias=float("inf"))
    module = _module()
    with pytest.raises(ValueError, match=r"input 'x' expected 3 dims"):
        module(torch.zeros(1, T, B, I))
    with pytest.raises(ValueError, match=r"state 'c_0' expected shape \(num_layers, B, H\) = "
                                         r"\(1, 3, 6\), got \(1, 2, 6\)"):
        module(torch.zeros(T, B, I), (torch.zeros(1, B, H), torch.zeros(1, 2, H)))
    with pytest.raises(ValueError, match=r"sequence_length expected integers of shape \(B,\)"):
        module(torch.zeros(T, B, I), sequence_length=torch.ones(B))
    with pytest.raises(ValueError, match=r"BlockLSTM: input 'w' expected shape \(I\+H, 4H\) = "
                                         r"\(11, 24\), got \(10, 24\)"):
        module(torch.zeros(T, B, I + 1))  # the op's own check


def _loss_fn(module, head):
    def loss(x, lengths=None):
        y, (h_n, c_n) = module(x, sequence_length=lengths)
        return head(y).square().mean() + (h_n * c_n).sum()
    return loss


def _grads(module, head, loss, *args):
    module.zero_grad()
    head.zero_grad()
    value = loss(*args)
    value.backward()
    return value.detach(), [p.grad.clone() for p in (*module.parameters(), *head.parameters())]


def test_torch_compile_fullgraph_matches_eager():
    """Dynamo captures the whole model (``fullgraph=True``: no graph break) and AOTAutograd
    traces the ops' fake kernels and gradients; time length and sequence lengths vary. The
    ``aot_eager`` backend runs every step of that but code generation (Inductor only compiles
    the ops around the custom ops, at a cost of tens of seconds)."""
    module, head = _module(), torch.nn.Linear(H, 2)
    loss = _loss_fn(module, head)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    cases = [(torch.from_numpy(_array((T, B, I), 1)),),
             (torch.from_numpy(_array((T + 2, B, I), 2)),),
             (torch.from_numpy(_array((T, B, I), 3)), torch.tensor([4, 2, 0]))]
    for args in cases:
        want_loss, want = _grads(module, head, loss, *args)
        got_loss, got = _grads(module, head, compiled, *args)
        _close(got_loss, want_loss, "loss")
        for k, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"grad {k}")


@pytest.mark.slow
def test_torch_compile_inductor_matches_eager():
    module, head = _module(), torch.nn.Linear(H, 2)
    loss = _loss_fn(module, head)
    compiled = torch.compile(loss, fullgraph=True)
    x = torch.from_numpy(_array((T, B, I), 1))
    want_loss, want = _grads(module, head, loss, x)
    got_loss, got = _grads(module, head, compiled, x)
    _close(got_loss, want_loss, "loss")
    for k, (g, w) in enumerate(zip(got, want)):
        _close(g, w, f"grad {k}")


def test_torch_export_keeps_the_op_and_dynamic_sizes():
    module = _module()
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    program = torch.export.export(module, (torch.zeros(T, B, I),), dynamic_shapes=(dims,))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "lstm_tvm.BlockLSTM.int" in targets
    x = torch.from_numpy(_array((T + 3, B + 1, I), 1))
    got, want = program.module()(x), module(x)
    _close(got[0], want[0], "output")
    _close(got[1][1], want[1][1], "c_n")


def test_training_matches_tf_step_by_step():
    """Five SGD steps of ``LSTM`` + a linear head on the last output, against the same model in
    TF (``tf.raw_ops.BlockLSTM`` and its gradient): the same losses and weights up to float32
    rounding of different summation orders, compounded over the steps (rtol 1e-4)."""
    module, head = _module(), torch.nn.Linear(H, 1)
    x, target = torch.from_numpy(_array((T, B, I), 1)), torch.from_numpy(_array((B, 1), 2))
    params = {**module.tf_weights(), "head_w": head.weight.detach().numpy().T.copy(),
              "head_b": head.bias.detach().numpy().copy()}
    lr, steps = 0.5, 5
    optimizer = torch.optim.SGD([*module.parameters(), *head.parameters()], lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        y, _ = module(x)
        loss = (head(y[-1]) - target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))

    variables = {n: tf.Variable(v) for n, v in params.items()}
    zeros = tf.zeros([B, H])
    tf_losses = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            weights = {n: variables[n] for n in ("w", "wci", "wcf", "wco", "b")}
            h, _, _ = _tf_layer(x.numpy(), zeros, zeros, weights)
            tf_loss = tf.reduce_mean((h[-1] @ variables["head_w"] + variables["head_b"]
                                      - target.numpy()) ** 2)
        grads = tape.gradient(tf_loss, list(variables.values()))
        for variable, grad in zip(variables.values(), grads):
            variable.assign_sub(lr * grad)
        tf_losses.append(float(tf_loss))

    assert tf_losses[-1] < 0.5 * tf_losses[0]  # it trains
    np.testing.assert_allclose(losses, tf_losses, rtol=1e-4)
    final = {**module.tf_weights(), "head_w": head.weight.detach().numpy().T,
             "head_b": head.bias.detach().numpy()}
    for name, variable in variables.items():
        np.testing.assert_allclose(final[name], variable.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


if __name__ == "__main__":
    tvm.testing.main()
