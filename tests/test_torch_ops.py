"""lstm_tvm.torch's custom ops: ``torch.ops.lstm_tvm.<Op>`` against TF and the reference.

Truths: ``tf.raw_ops`` for every forward result; TF's ``GradientTape`` through ``BlockLSTM``
(right in TF 2.21) for its gradients and, one step of it, for ``LSTMBlockCell``'s (TF registers
none); for ``BlockLSTMV2`` (whose TF tape gradient is wrong) central differences of the float64
reference; the float64 reference for ``CellGradMatmul`` and float16. float32 tolerances are
:func:`lstm_tvm.testing.tolerance`'s (the loss's weights are of order one).
"""

import concurrent.futures
import os
import re

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch", reason="lstm_tvm.torch needs PyTorch")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is the oracle")

import lstm_tvm.torch as lt  # noqa: E402
import lstm_tvm.api  # noqa: E402
from lstm_tvm import raw_ops, reference, registry, testing  # noqa: E402
from lstm_tvm.torch import _cpu, _openmp  # noqa: E402

T, B, I, H = 5, 3, 4, 6  # noqa: E741 - the registry's size symbols
FLOATS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
#: Overloads by how seq_len_max is given: an int64 tensor, or an int.
SEQ_KINDS = ("tensor", "int")
#: How a call reaches the kernels: ``lstm_tvm.torch.<Op>`` in plain eager mode (the eager
#: route, an autograd.Function), or ``torch.ops.lstm_tvm.<Op>`` (PyTorch's dispatcher and
#: torch.library's autograd, what torch.compile traces).
ROUTES = ("eager", "dispatcher")


def _attrs(op_name: str) -> dict:
    """Attributes away from TF's defaults (each must reach the kernels)."""
    return testing.op_attrs(op_name, {"use_peephole": True, "cell_clip": 1.5,
                                      "forget_bias": 0.7})


def _inputs(op_name: str, seq_len_max=None, seed=0, dtype="float32") -> dict:
    return testing.make_inputs(op_name, B=B, I=I, H=H, T=T, seq_len_max=seq_len_max,
                               attrs=_attrs(op_name), seed=seed, dtype=dtype)


def _tensors(inputs: dict, seq_kind: str = "tensor", grad: bool = False) -> dict:
    out = {}
    for name, value in inputs.items():
        if name == "seq_len_max":
            out[name] = torch.tensor(int(value)) if seq_kind == "tensor" else int(value)
        else:
            out[name] = torch.from_numpy(value).requires_grad_(grad)
    return out


@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_schemas_follow_the_registry(op_name):
    op = registry.get_op(op_name)
    packet = getattr(torch.ops.lstm_tvm, op_name)
    kinds = {"default": "Tensor", "int": "SymInt"}
    assert set(packet.overloads()) == ({"default", "int"} if op.kind == "sequence"
                                       else {"default"})
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        args = {a.name: a for a in schema.arguments}
        assert list(args) == [*op.input_names, *op.attr_names]
        for spec in op.inputs:
            want = "Tensor" if spec.dtype == "T" else kinds[overload]
            assert re.search(rf"\b{want} {spec.name}[,)]", str(schema))
            assert not args[spec.name].kwarg_only
        for spec in op.attrs:
            assert args[spec.name].kwarg_only
            assert args[spec.name].default_value == spec.default
        assert len(schema.returns) == len(op.outputs)


@pytest.mark.parametrize("op_name, seq_kind", [
    (name, kind) for name, op in registry.OPS.items()
    for kind in (SEQ_KINDS if op.kind == "sequence" else SEQ_KINDS[:1])])
def test_forward_matches_tf(op_name, seq_kind):
    """Every op on CPU tensors: the outputs of ``tf.raw_ops.<op>`` where TF defines them,
    ``seq_len_max < T`` as a tensor or an int."""
    op = registry.get_op(op_name)
    seq = T - 2 if op.kind == "sequence" else None
    inputs, attrs = _inputs(op_name, seq), _attrs(op_name)
    got = getattr(lt, op_name)(**_tensors(inputs, seq_kind), **attrs)
    raw = getattr(torch.ops.lstm_tvm, op_name)(**_tensors(inputs, seq_kind), **attrs)
    want = testing.tf_run(op_name, inputs, attrs)
    assert got._fields == op.output_names
    for k, (name, value) in enumerate(got._asdict().items()):
        assert isinstance(value, torch.Tensor) and value.dtype == torch.float32
        assert torch.equal(value, raw[k])
        testing.assert_close(value.numpy(), want[name], "float32", f"{op_name}.{name}",
                             mask=testing.tf_defined_mask(op_name, name, seq, T))


def test_cell_grad_matmul_matches_the_reference():
    inputs = _inputs("LSTMBlockCellGrad")
    dicfo = testing.tf_run("LSTMBlockCellGrad", inputs, {"use_peephole": True})["dicfo"]
    args = {n: torch.from_numpy(inputs[n]) for n in ("x", "h_prev", "w")}
    got = lt.CellGradMatmul(**args, dicfo=torch.from_numpy(dicfo.copy()))
    want = reference.cell_grad_matmul(inputs["x"], inputs["h_prev"], inputs["w"], dicfo)
    assert got._fields == registry.get_op("CellGradMatmul").output_names
    for name, value in got._asdict().items():
        testing.assert_close(value.numpy(), want[name], "float32", f"CellGradMatmul.{name}")


def test_float16_matches_the_reference():
    """float16 tensors in and out (the grad op: quick to build; the dtype's path is the
    same for every op)."""
    inputs = testing.make_inputs("LSTMBlockCellGrad", B=B, I=I, H=H, dtype="float16",
                                 attrs=_attrs("LSTMBlockCell"))
    got = lt.LSTMBlockCellGrad(**_tensors(inputs), use_peephole=True)
    want = reference.run("LSTMBlockCellGrad", inputs, {"use_peephole": True})
    for name, value in got._asdict().items():
        assert value.dtype == torch.float16
        testing.assert_close(value.numpy(), want[name], "float16", f"LSTMBlockCellGrad.{name}")


def test_outputs_are_the_kernels_buffers():
    """Outputs are tensors over the buffers the kernel wrote (aligned, no copy): a buffer
    whose outputs were dropped is written by the next call, one whose outputs are held is
    not."""
    inputs, attrs = _tensors(_inputs("BlockLSTM")), _attrs("BlockLSTM")
    first = torch.ops.lstm_tvm.BlockLSTM(**inputs, **attrs)
    address = first[6].data_ptr()
    assert address % 64 == 0
    del first
    kept = torch.ops.lstm_tvm.BlockLSTM(**inputs, **attrs)
    assert kept[6].data_ptr() == address  # the dropped call's buffer, written again
    before = [t.clone() for t in kept]
    other = torch.ops.lstm_tvm.BlockLSTM(**{**inputs, "x": inputs["x"] * 0.5}, **attrs)
    assert other[6].data_ptr() != address
    assert all(torch.equal(a, b) for a, b in zip(kept, before))
    assert not torch.equal(other[6], kept[6])


def test_non_contiguous_inputs_give_the_same_results():
    inputs = _tensors(_inputs("BlockLSTM"))
    strided = {**inputs, "w": inputs["w"].t().contiguous().t(),
               "x": inputs["x"].transpose(0, 1).contiguous().transpose(0, 1)}
    assert not strided["w"].is_contiguous() and not strided["x"].is_contiguous()
    want = torch.ops.lstm_tvm.BlockLSTM(**inputs, **_attrs("BlockLSTM"))
    got = torch.ops.lstm_tvm.BlockLSTM(**strided, **_attrs("BlockLSTM"))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_repeated_calls_match_the_reference():
    """A configuration's later calls skip the checks and pass the tensors to the kernel as
    they are (:mod:`lstm_tvm.torch._cpu`): strided inputs (a gradient that is one value
    broadcast, another value each call; a ``cs_grad`` expanded along the batch; a transposed
    ``x``; an ``h_prev`` one element into its storage), every ``seq_len_max`` in ``0..T``
    as an int or a tensor, each against the float64 reference; an earlier call's outputs
    stay as they were."""
    inputs = _inputs("BlockLSTMGrad")
    attrs = {"use_peephole": True}
    tensors = _tensors(inputs)
    first = lt.BlockLSTMGrad(**tensors, **attrs)  # checked and planned
    kept = [t.clone() for t in first]
    flat_h = tensors["h_prev"].flatten()
    strided = {**tensors,
               "cs_grad": tensors["cs_grad"][:, :1].expand(T, B, H),
               "x": tensors["x"].transpose(0, 1).contiguous().transpose(0, 1),
               # contiguous, one element into its storage (not 64-byte aligned)
               "h_prev": torch.cat([flat_h[:1], flat_h])[1:].view(B, H)}
    assert not strided["cs_grad"].is_contiguous() and not strided["x"].is_contiguous()
    assert strided["h_prev"].is_contiguous() and strided["h_prev"].storage_offset() == 1
    values = tensors["h_grad"].flatten()
    for seq in range(T + 1):
        for k, kind in enumerate(SEQ_KINDS):
            h_grad = values[2 * seq + k].expand(T, B, H)
            args = {**strided, "h_grad": h_grad,
                    "seq_len_max": torch.tensor(seq) if kind == "tensor" else seq}
            got = lt.BlockLSTMGrad(**args, **attrs)
            arrays = {n: np.array(v.numpy()) if isinstance(v, torch.Tensor)
                      else np.asarray(v) for n, v in args.items()}
            want = reference.run("BlockLSTMGrad", arrays, attrs)
            for name, value in got._asdict().items():
                testing.assert_close(value.numpy(), want[name], "float32",
                                     f"BlockLSTMGrad.{name} seq_len_max={seq} ({kind})")
    assert all(torch.equal(a, b) for a, b in zip(first, kept))


def test_a_sparse_input_is_refused_by_name():
    """A sparse tensor has no memory the kernels can read: a TypeError naming the input,
    whether or not a dense call of the same shapes came first."""
    tensors = _tensors(_inputs("BlockLSTM"))
    sparse = {**tensors, "x": tensors["x"].to_sparse()}
    for _ in range(2):
        with pytest.raises(TypeError, match=r"BlockLSTM: input 'x' expected a dense tensor "
                                            r"\(layout torch.strided\), got layout "
                                            r"torch.sparse_coo"):
            lt.BlockLSTM(**sparse)
        lt.BlockLSTM(**tensors)  # planned: the next sparse call meets the planned path


def test_single_value_is_read_only_from_a_broadcast():
    """Only a tensor whose every stride is 0 counts as one value (and not when NaN)."""
    from lstm_tvm.torch._constants import single_value

    base = torch.tensor([[0.5, -2.0]])
    assert single_value(base[:, 1:].expand(3, 4)) == -2.0
    assert single_value(torch.tensor(-0.0).expand(2, 2)) == 0.0
    assert single_value(base.expand(3, 2)) is None  # strides (0, 1): two values
    assert single_value(base.t()) is None
    assert single_value(torch.tensor(0.25)) is None  # not broadcast: nothing to save
    assert single_value(torch.tensor(float("nan")).expand(2)) is None


@pytest.mark.parametrize("case", ["seq_too_long", "seq_negative", "seq_float", "w_shape",
                                  "b_float64"])
def test_bad_inputs_after_a_good_call_raise_as_raw_ops(case):
    """A call of a planned configuration is checked as the first one was: ``seq_len_max``'s
    value, and any other shape or dtype (a new configuration, checked fully)."""
    inputs = _inputs("BlockLSTM")
    good = _tensors(inputs)
    torch.ops.lstm_tvm.BlockLSTM(**good)
    bad = {"seq_too_long": {"seq_len_max": np.asarray(T + 1)},
           "seq_negative": {"seq_len_max": np.asarray(-1)},
           "seq_float": {"seq_len_max": np.asarray(2.0, np.float32)},
           "w_shape": {"w": inputs["w"][1:]}, "b_float64": {"b": inputs["b"].astype(np.float64)}
           }[case]
    arrays = {**inputs, **bad}
    want = _raised(lambda: raw_ops.BlockLSTM(**arrays))
    tensors = {n: torch.from_numpy(np.asarray(v)) for n, v in arrays.items()}
    assert _raised(lambda: torch.ops.lstm_tvm.BlockLSTM(**tensors)) == want
    assert _raised(lambda: lt.BlockLSTM(**tensors)) == want


def _loss_weights(shape, seed=1) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, shape).astype(np.float32) for n in ("cs", "h")}


def _call(op_name: str, tensors: dict, attrs: dict, route: str = "eager"):
    """The op's outputs (a named tuple) through ``route`` (see :data:`ROUTES`)."""
    if route == "eager":
        return getattr(lt, op_name)(**tensors, **attrs)
    packet = getattr(torch.ops.lstm_tvm, op_name)
    overload = packet.int if isinstance(tensors.get("seq_len_max"), int) else packet.default
    return lstm_tvm.api.output_tuple(op_name)(*overload(**tensors, **attrs))


def _torch_gradients(op_name: str, inputs: dict, attrs: dict, weights: dict, seq_kind: str,
                     route: str = "eager"):
    """``d/d(float inputs)`` of ``sum(cs * wc) + sum(h * wh)`` through the custom op."""
    tensors = _tensors(inputs, seq_kind, grad=True)
    out = _call(op_name, tensors, attrs, route)
    loss = (out.cs * torch.from_numpy(weights["cs"])).sum() + \
        (out.h * torch.from_numpy(weights["h"])).sum()
    loss.backward()
    return {"loss": loss.detach().numpy(), **{n: tensors[n].grad.numpy() for n in FLOATS}}


def _tape_gradients(fn, inputs: dict, attrs: dict, weights: dict) -> dict:
    """The same through a TF function ``fn`` taking the op's keyword arguments."""
    variables = {n: tf.Variable(inputs[n]) for n in FLOATS}
    with tf.GradientTape() as tape:
        kwargs = {**variables, **attrs}
        if "seq_len_max" in inputs:
            kwargs["seq_len_max"] = inputs["seq_len_max"]
        out = fn(**kwargs)
        loss = tf.reduce_sum(out.cs * weights["cs"]) + tf.reduce_sum(out.h * weights["h"])
    grads = tape.gradient(loss, [variables[n] for n in FLOATS])
    return {"loss": loss.numpy(), **{n: g.numpy() for n, g in zip(FLOATS, grads)}}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("seq_kind", SEQ_KINDS)
@pytest.mark.parametrize("seq_len_max", [T, T - 2], ids=["full", "padded"])
def test_block_lstm_gradients_match_tf(seq_len_max, seq_kind, route):
    inputs, attrs = _inputs("BlockLSTM", seq_len_max), _attrs("BlockLSTM")
    weights = _loss_weights((T, B, H))
    got = _torch_gradients("BlockLSTM", inputs, attrs, weights, seq_kind, route)
    want = _tape_gradients(tf.raw_ops.BlockLSTM, inputs, attrs, weights)
    for name in want:
        testing.assert_close(got[name], want[name], "float32", f"BlockLSTM d/d{name}")


@pytest.mark.parametrize("route", ROUTES)
def test_cell_gradients_match_one_step_of_tf_block_lstm(route):
    """TF has no gradient for ``LSTMBlockCell``; one step of its ``BlockLSTM`` is the cell."""
    inputs, attrs = _inputs("LSTMBlockCell"), _attrs("LSTMBlockCell")
    weights = _loss_weights((B, H))
    got = _torch_gradients("LSTMBlockCell", inputs, attrs, weights, "tensor", route)

    def one_step(x, **kwargs):
        out = tf.raw_ops.BlockLSTM(seq_len_max=np.int64(1), x=x[None], **kwargs)
        return type(out)(*(t[0] for t in out))

    want = _tape_gradients(one_step, inputs, attrs, weights)
    for name in want:
        testing.assert_close(got[name], want[name], "float32", f"LSTMBlockCell d/d{name}")


@pytest.mark.parametrize("route", ROUTES)
def test_block_lstm_v2_gradients_match_finite_differences(route):
    """IFCO layout, ``seq_len_max < T``, peepholes: against central differences (step 1e-6)
    of the float64 reference (TF's own tape gradient of ``BlockLSTMV2`` is wrong). The inputs
    are scaled so that the cell stays inside the clip, which is not differentiated; the
    differences' own error (~1e-10) is far below the float32 tolerance."""
    attrs = _attrs("BlockLSTMV2")
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T, seq_len_max=T - 1,
                                 scale=0.5)
    cs = reference.run("BlockLSTMV2", inputs, {**attrs, "cell_clip": 0.0})["cs"]
    assert np.abs(cs).max() < attrs["cell_clip"]
    weights = _loss_weights((T, B, H))
    got = _torch_gradients("BlockLSTMV2", inputs, attrs, weights, "int", route)
    want = testing.reference_loss_gradients("BlockLSTMV2", inputs, attrs, weights, FLOATS)
    for name in FLOATS:
        testing.assert_close(got[name], want[name], "float32", f"BlockLSTMV2 d/d{name}")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM", "BlockLSTMV2"])
def test_only_cs_and_h_are_differentiable(op_name, route):
    inputs = _inputs(op_name, None if op_name == "LSTMBlockCell" else T)
    out = _call(op_name, _tensors(inputs, grad=True), _attrs(op_name), route)
    assert {n for n, t in out._asdict().items() if t.requires_grad} == {"cs", "h"}


def test_eager_calls_take_the_eager_route_and_tracers_the_dispatcher():
    """A plain eager call's gradient is the eager route's Function; under a dispatch mode
    (what tracers install) the same call goes through ``torch.ops`` and gives the same
    values; a second derivative through the eager route is refused, not silently wrong."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    inputs, attrs = _inputs("BlockLSTM", T), _attrs("BlockLSTM")
    eager = lt.BlockLSTM(**_tensors(inputs, "int", grad=True), **attrs)
    assert type(eager.h.grad_fn).__name__ == "BlockLSTMFunctionBackward"
    with Seen() as seen:
        traced = lt.BlockLSTM(**_tensors(inputs, "int", grad=True), **attrs)
    assert "lstm_tvm.BlockLSTM.int" in seen.ops
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))
    tensors = _tensors(inputs, "int", grad=True)
    out = lt.BlockLSTM(**tensors, **attrs)
    weight = torch.ones_like(out.h, requires_grad=True)
    (grad_w,) = torch.autograd.grad(out.h, tensors["w"], weight, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_w.sum().backward()


@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_opcheck(op_name):
    """``torch.library.opcheck``: the schema, the fake kernel against the real one, the
    autograd registration and AOT dispatch with dynamic shapes, for every overload."""
    op = registry.get_op(op_name)
    inputs = (_inputs(op_name, T - 1) if op.direction == "forward" else
              testing.make_inputs(op_name, B=B, I=I, H=H, T=T, seq_len_max=T - 1,
                                  attrs=_attrs(registry.get_op(op.pair).name)))
    attrs = _attrs(op_name) if op.direction == "forward" else testing.op_attrs(
        op_name, {"use_peephole": True})
    packet = getattr(torch.ops.lstm_tvm, op_name)
    for overload in packet.overloads():
        tensors = _tensors(inputs, "int" if overload == "int" else "tensor",
                           grad=op.direction == "forward")
        args = [tensors[n] for n in op.input_names]
        result = torch.library.opcheck(getattr(packet, overload), args, attrs)
        assert set(result.values()) == {"SUCCESS"}, result


def _raised(call) -> tuple:
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return info.type, str(info.value)


@pytest.mark.parametrize("case", ["w_shape", "b_float64", "seq_too_long", "seq_float",
                                  "seq_vector"])
def test_bad_inputs_raise_as_raw_ops(case):
    """The same exception and message as ``lstm_tvm.raw_ops``, eagerly and from the fake
    kernel (meta tensors, as ``torch.compile`` traces)."""
    inputs = _inputs("BlockLSTM")
    bad = {"w_shape": {"w": inputs["w"][1:]}, "b_float64": {"b": inputs["b"].astype(np.float64)},
           "seq_too_long": {"seq_len_max": np.asarray(T + 1)},
           "seq_float": {"seq_len_max": np.asarray(2.0, np.float32)},
           "seq_vector": {"seq_len_max": np.asarray([2])}}[case]
    arrays = {**inputs, **bad}
    want = _raised(lambda: raw_ops.BlockLSTM(**arrays))
    tensors = {n: torch.from_numpy(np.asarray(v)) for n, v in arrays.items()}
    assert _raised(lambda: torch.ops.lstm_tvm.BlockLSTM(**tensors)) == want
    meta = {n: v.to("meta") for n, v in tensors.items()}
    if case != "seq_too_long":  # a tensor's value is read only when the kernel runs
        assert _raised(lambda: torch.ops.lstm_tvm.BlockLSTM(**meta)) == want


def test_bad_arguments_raise_type_errors():
    tensors = _tensors(_inputs("BlockLSTM"))
    with pytest.raises(TypeError, match=r"input 'b' has dtype bfloat16; expected float16 or "
                                        r"float32"):
        torch.ops.lstm_tvm.BlockLSTM(**{**tensors, "b": tensors["b"].bfloat16()})
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['peephole'\]"):
        lt.BlockLSTM(**tensors, peephole=True)
    with pytest.raises(TypeError, match=r"missing input\(s\) \['b'\]"):
        lt.BlockLSTM(**{n: v for n, v in tensors.items() if n != "b"})
    with pytest.raises(TypeError, match=r"'seq_len_max' expected an int or an int64 tensor, "
                                        r"got bool True"):
        lt.BlockLSTM(**{**tensors, "seq_len_max": True})
    with pytest.raises(TypeError, match=r"attribute 'forget_bias' expected a float, got bool"):
        lt.BlockLSTM(**tensors, forget_bias=True)
    with pytest.raises(ValueError, match=r"seq_len_max <= T = 5, got 6"):
        torch.ops.lstm_tvm.BlockLSTM.int(6, *[tensors[n] for n in FLOATS])


def test_fake_kernels_give_shapes_with_symbolic_sizes():
    """Under fake tensors with symbolic sizes the outputs' shapes follow the registry's
    expressions and ranks are checked (the rest is checked when the kernel runs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    inputs = _tensors(_inputs("BlockLSTM"))
    with mode:
        fake = {n: mode.from_tensor(v, static_shapes=False) if n == "x" else
                mode.from_tensor(v) for n, v in inputs.items()}
        out = torch.ops.lstm_tvm.BlockLSTM(**fake)
        assert all(isinstance(o.shape[0], torch.SymInt) and o.shape[2] == H for o in out)
        with pytest.raises(ValueError, match=r"input 'x' expected rank 3 \(T, B, I\), got"):
            torch.ops.lstm_tvm.BlockLSTM(**{**fake, "x": fake["x"][0]})


def test_compiled_cell_steps_match_eager():
    """``lstm_tvm.torch.LSTMBlockCell`` in a loop under ``torch.compile(fullgraph=True)``: one
    graph, the cell's gradient (``LSTMBlockCellGrad`` and ``CellGradMatmul``) traced by
    AOTAutograd (the ``aot_eager`` backend: no code generation)."""
    inputs, attrs = _inputs("LSTMBlockCell"), _attrs("LSTMBlockCell")

    def loss(x, cs, h, weights):
        for _ in range(3):
            cs, h = lt.LSTMBlockCell(x=x, cs_prev=cs, h_prev=h, **weights, **attrs)[1::5]
        return (h * cs).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (loss, compiled):
        tensors = _tensors(inputs, grad=True)
        weights = {n: tensors[n] for n in ("w", "wci", "wcf", "wco", "b")}
        value = fn(tensors["x"], tensors["cs_prev"], tensors["h_prev"], weights)
        value.backward()
        results.append([value, *(tensors[n].grad for n in FLOATS)])
    for name, got, want in zip(("loss", *FLOATS), *results):
        testing.assert_close(got.detach().numpy(), want.detach().numpy(), "float32", name)


def test_register_is_idempotent():
    lt.register()
    lt.register()
    assert set(torch.ops.lstm_tvm.BlockLSTM.overloads()) == {"default", "int"}


def test_calls_from_other_threads_match_the_main_thread():
    """Threads lstm_tvm did not create (a pool's) run the ops (lstm_tvm's kernel thread runs
    their kernels) with the main thread's results, forward and backward."""
    inputs, attrs = _inputs("BlockLSTM"), _attrs("BlockLSTM")
    weights = _loss_weights((T, B, H))

    def run(_):
        return _torch_gradients("BlockLSTM", inputs, attrs, weights, "tensor")

    want = run(None)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    for got in results:
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _threads() -> set:
    return set(os.listdir("/proc/self/task"))


def _state(tid: str) -> str:
    """The scheduler state of thread ``tid`` of this process (``R`` running, ``S`` asleep,
    ``gone`` ended)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.skipif(not _openmp.enabled(), reason="PyTorch's OpenMP here is not libgomp on "
                                                   "Linux (its workers are left alone)")
def test_pytorch_openmp_workers_sleep_while_a_kernel_runs(monkeypatch):
    """The OpenMP workers a parallel PyTorch op started (spinning on their cores for a while
    after it) are asleep while an op of lstm_tvm.torch runs its kernel, and still there for
    PyTorch's next parallel op (not stopped and restarted); the op's results are
    ``raw_ops``'s. In a thread of its own: the workers it starts are the thread's OpenMP
    team."""
    inputs = _inputs("BlockLSTM")
    tensors = _tensors(inputs)
    lt.BlockLSTM(**tensors, **_attrs("BlockLSTM"))  # TVM's pool and the plan start here
    seen, started, restarted = [], set(), set()

    def launch(*args):
        seen.append({tid: _state(tid) for tid in started})
        return real_launch(*args)

    def scenario():
        torch.set_num_threads(2)
        before = _threads()
        torch.ones(1 << 22).sum()  # large enough to run on 2 OpenMP threads
        started.update(_threads() - before)
        got = lt.BlockLSTM(**tensors, **_attrs("BlockLSTM"))
        now = _threads()
        restarted.update(started - now)
        torch.ones(1 << 22).sum()
        restarted.update(_threads() - now)
        return got

    real_launch = _cpu.launch
    monkeypatch.setattr(_cpu, "launch", launch)
    threads = torch.get_num_threads()
    try:
        # up to three times, each in a thread (and OpenMP team) of its own: on a loaded
        # machine a worker handed the region may not have reached its wait yet when the
        # kernel starts (runnable, not yet scheduled); one that keeps spinning fails them all
        for _ in range(3):
            seen.clear(), started.clear(), restarted.clear()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                got = pool.submit(scenario).result()
            if seen == [dict.fromkeys(started, "S")]:
                break
    finally:
        torch.set_num_threads(threads)
    assert started, "the parallel op started no OpenMP worker"
    assert seen == [dict.fromkeys(started, "S")], "OpenMP workers ran beside the kernel"
    assert not restarted, "the kernel stopped PyTorch's OpenMP workers (the next op started them)"
    want = raw_ops.BlockLSTM(**inputs, **_attrs("BlockLSTM"))
    for name, value in want._asdict().items():
        np.testing.assert_array_equal(getattr(got, name).numpy(), value, err_msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and PyTorch with "
                                                          "CUDA")
def test_cuda_tensors_match_cpu_tensors():
    inputs, attrs = _inputs("BlockLSTM", T - 1), _attrs("BlockLSTM")
    cpu = _tensors(inputs, grad=True)
    cuda = {n: v.detach().cuda().requires_grad_(n != "seq_len_max") for n, v in cpu.items()}
    want, got = lt.BlockLSTM(**cpu, **attrs), lt.BlockLSTM(**cuda, **attrs)
    (want.h.sum() + want.cs.sum()).backward()
    (got.h.sum() + got.cs.sum()).backward()
    for name in registry.get_op("BlockLSTM").output_names:
        testing.assert_close(getattr(got, name).detach().cpu().numpy(),
                             getattr(want, name).detach().numpy(), "float32", name)
    for name in FLOATS:
        testing.assert_close(cuda[name].grad.cpu().numpy(), cpu[name].grad.numpy(), "float32",
                             f"d/d{name}")


if __name__ == "__main__":
    tvm.testing.main()
