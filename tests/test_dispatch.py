"""raw_ops' CPU dispatch: configurations remembered, inputs read in place or copied once,
outputs written where they are returned. Every case checks results against the float64
reference; none measures time."""

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import _host_arrays, api, build, reference, registry, testing
from lstm_tvm._tvm import tvm

from _layouts import (LAYOUTS, aligned_copy, big_endian, misaligned_copy,
                      unaligned_copy)

SEQ = "BlockLSTMGradV2"
ATTRS = {"use_peephole": True}


def _inputs(op_name=SEQ, B=3, seed=0, dtype="float32", T=6, I=20, H=24):
    return testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T, seed=seed,
                               attrs=ATTRS)


def _check(got, inputs, op_name=SEQ, dtype="float32"):
    ref = reference.run(op_name, inputs, ATTRS)
    for name in registry.get_op(op_name).output_names:
        testing.assert_close(getattr(got, name), ref[name], dtype, f"{op_name}.{name}")


def _run(inputs, op_name=SEQ):
    return getattr(lstm_tvm.raw_ops, op_name)(**inputs, **ATTRS)


def test_outputs_the_caller_keeps_are_never_written_by_a_later_call():
    first_in, second_in = _inputs(seed=1), _inputs(seed=2)
    first = _run(first_in)
    kept_view = first.x_grad[1:]  # a view alone keeps the memory too
    h_grad = first.h_prev_grad
    del first
    second = _run(second_in)
    third = _run(second_in)
    _check(second, second_in)
    _check(third, second_in)
    ref = reference.run(SEQ, first_in, ATTRS)
    testing.assert_close(kept_view, ref["x_grad"][1:], "float32", "kept view of x_grad")
    testing.assert_close(h_grad, ref["h_prev_grad"], "float32", "kept h_prev_grad")
    for a in second:
        for b in third:
            assert not np.shares_memory(a, b)


def test_a_loop_that_drops_its_outputs_reuses_their_memory():
    inputs = _inputs(seed=3)
    pointers = []
    for _ in range(3):
        got = _run(inputs)
        _check(got, inputs)
        pointers.append(got.x_grad.__array_interface__["data"][0])
        del got
    assert pointers[1] == pointers[2], "no output kept: the same memory is written again"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("big", [False, True], ids=["small", "past the copy threshold"])
def test_inputs_of_every_layout_give_the_right_answer(layout, big):
    # big: x alone holds T*B*I float32s past the size below which inputs are always copied
    inputs = _inputs(seed=4, T=40, B=9, I=32) if big else _inputs(seed=4)
    if big:
        assert inputs["x"].nbytes >= _host_arrays._COPY_BELOW
    odd = {k: (layout(v) if v.ndim else v) for k, v in inputs.items()}
    before = {k: np.array(v, copy=True) for k, v in odd.items()}
    for _ in range(2):  # the second call reuses the staging buffers
        _check(_run(odd), inputs)
    for k, v in odd.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"input {k} was modified")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_input_aligned_to_its_element_is_read_in_place(dtype):
    for layout in (aligned_copy, misaligned_copy):
        a = layout(np.ones((128, 64), dtype))
        with _host_arrays.staged_inputs([a], f"in-place test {layout.__name__}") as (tensor,):
            assert np.shares_memory(np.from_dlpack(tensor), a), layout.__name__
    b = unaligned_copy(np.ones((128, 64), dtype))
    assert not b.flags.aligned
    with _host_arrays.staged_inputs([b], "copy test") as (copied,):
        assert not np.shares_memory(np.from_dlpack(copied), b)


@pytest.mark.parametrize("B", [1, 2, 3, 5, 8, 9])
@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTMV2", "BlockLSTMGrad"])
def test_batch_sizes_through_the_dispatch(op_name, B):
    inputs = _inputs(op_name, B=B, seed=B, T=3, I=8, H=16)
    _check(_run(inputs, op_name), inputs, op_name)


def test_seq_len_max_is_checked_on_every_call():
    inputs = _inputs(seed=5)
    _check(_run(inputs), inputs)
    with pytest.raises(ValueError, match=r"BlockLSTMGradV2: input 'seq_len_max' expected 0 <= "
                                         r"seq_len_max <= T = 6, got 7"):
        _run({**inputs, "seq_len_max": np.int64(7)})
    shorter = {**inputs, "seq_len_max": np.int64(2)}
    _check(_run(shorter), shorter)


def test_a_configuration_is_compiled_once_until_the_cache_is_cleared(monkeypatch):
    inputs = _inputs(seed=6)
    calls = []
    real = api.compile

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr("lstm_tvm.raw_ops._compile", counting)
    _run(inputs)
    _run(_inputs(seed=7))  # same shapes, dtypes, attributes: the same configuration
    assert len(calls) <= 1
    seen = len(calls)
    build.clear_memory_cache()
    _check(_run(inputs), inputs)
    assert len(calls) == seen + 1


def test_an_output_changed_in_place_and_dropped_is_not_handed_out_again():
    inputs = _inputs(seed=8)
    got = _run(inputs)
    got.x_grad.shape = (-1,)
    got.h_prev_grad.flags.writeable = False
    del got
    again = _run(inputs)
    _check(again, inputs)
    assert again.h_prev_grad.flags.writeable


def test_an_attribute_equal_to_a_valid_one_but_of_another_type_is_still_refused():
    inputs = _inputs("LSTMBlockCell", B=2, seed=9, T=None)
    lstm_tvm.raw_ops.LSTMBlockCell(**inputs, use_peephole=True)
    with pytest.raises(TypeError, match="use_peephole"):
        lstm_tvm.raw_ops.LSTMBlockCell(**inputs, use_peephole=1.0)  # 1.0 == True


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
def test_cell_grad_matmul_takes_every_layout_and_keeps_kept_outputs(layout):
    rng = np.random.default_rng(10)
    B, I, H = 5, 12, 16
    args = [rng.standard_normal(s).astype(np.float32)
            for s in ((B, I), (B, H), (I + H, 4 * H), (B, 4 * H))]
    first = lstm_tvm.cell_grad_matmul(*(layout(a) for a in args))
    other = [a[::-1].copy() for a in args]
    second = lstm_tvm.cell_grad_matmul(*other)
    for got, inputs in ((first, args), (second, other)):
        ref = reference.cell_grad_matmul(*inputs)
        for name, value in zip(got._fields, got):
            testing.assert_close(value, ref[name], "float32", f"cell_grad_matmul.{name}")


def test_seq_len_max_is_checked_on_every_call_with_an_empty_batch_too():
    inputs = _inputs(B=0, seed=11)
    got = _run(inputs)
    assert all(a.size == 0 or not a.any() for a in got)
    with pytest.raises(ValueError, match="seq_len_max"):
        _run({**inputs, "seq_len_max": np.int64(7)})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_every_op_reads_inputs_off_a_64_byte_boundary_in_place(op_name, dtype):
    """Inputs one element off TVM's 64-byte alignment are passed to the kernels as they are
    (no staging copy): the kernels load them without assuming more than the element's
    alignment."""
    inputs = _inputs(op_name, B=9, seed=7, dtype=dtype, T=40, I=64, H=48)
    odd = {k: (misaligned_copy(v) if v.ndim else v) for k, v in inputs.items()}
    big = [k for k, v in odd.items() if v.ndim and v.nbytes >= _host_arrays._COPY_BELOW]
    assert "w" in big
    with _host_arrays.staged_inputs([odd[k] for k in big], f"offset test {op_name}") as tensors:
        assert all(np.shares_memory(np.from_dlpack(t), odd[k]) for t, k in zip(tensors, big))
    _check(_run(odd, op_name), inputs, op_name, dtype)


def _planning_counted(monkeypatch) -> list:
    calls = []
    real = lstm_tvm.raw_ops._planned

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr("lstm_tvm.raw_ops._planned", counting)
    return calls


def test_a_loop_of_calls_of_one_configuration_is_planned_once(monkeypatch):
    planned = _planning_counted(monkeypatch)
    for step in range(3):  # fresh arrays and a new ``name`` each call, as a serving loop has
        inputs = _inputs("LSTMBlockCellGrad", B=2, seed=20 + step, T=None, I=7, H=12)
        got = lstm_tvm.raw_ops.LSTMBlockCellGrad(**inputs, **ATTRS, name=f"step{step}")
        _check(got, inputs, "LSTMBlockCellGrad")
    assert planned == ["LSTMBlockCellGrad"]


def _to_numpy(value):
    return value.numpy() if isinstance(value, tvm.runtime.Tensor) else np.asarray(value)


@pytest.mark.parametrize("change, error", [
    (lambda kw: {**kw, "use_peephole": False}, None),
    (lambda kw: {**kw, "cell_clip": 0.25}, None),
    (lambda kw: {**kw, "x": big_endian(kw["x"])}, None),
    (lambda kw: {**kw, "h_prev": tvm.runtime.tensor(kw["h_prev"])}, None),
    (lambda kw: {**kw, "target": "llvm"}, None),
    (lambda kw: {**kw, "seq_len_max": np.array(3)}, None),
    (lambda kw: {**kw, "x": kw["x"][:, :-1]}, (ValueError, "'x'")),
    (lambda kw: {**kw, "b": kw["b"].astype("float16")}, (TypeError, "'b'")),
    (lambda kw: {k: v for k, v in kw.items() if k != "wco"}, (TypeError, "'wco'")),
    (lambda kw: {**kw, "bogus": 1}, (TypeError, "bogus")),
    (lambda kw: {**kw, "use_peephole": 1}, (TypeError, "use_peephole")),
    (lambda kw: {**kw, "seq_len_max": 2.0}, (TypeError, "seq_len_max")),
], ids=["attribute", "new attribute", "big-endian", "DLPack object", "target", "0-d seq_len_max",
        "shape", "dtype", "missing input", "unknown argument", "attribute type",
        "float seq_len_max"])
def test_a_call_unlike_the_last_is_planned_and_checked_anew(change, error):
    """The call before each case is the same op with ``base``: the case's call must not be
    taken for a repeat of it."""
    op_name = "BlockLSTMV2"
    op = registry.get_op(op_name)
    inputs = {**_inputs(op_name, B=2, seed=30, T=5, I=6, H=8), "seq_len_max": np.int64(4)}
    base = {**inputs, **ATTRS}
    _check(lstm_tvm.raw_ops.BlockLSTMV2(**base), inputs, op_name)
    _check(lstm_tvm.raw_ops.BlockLSTMV2(**base), inputs, op_name)  # now a repeat
    call = change(base)
    if error is not None:
        with pytest.raises(error[0], match=error[1]):
            lstm_tvm.raw_ops.BlockLSTMV2(**call)
        return
    got = lstm_tvm.raw_ops.BlockLSTMV2(**call)
    attrs = {k: call[k] for k in op.attr_names if k in call}
    ref = reference.run(op_name, {k: _to_numpy(call[k]) for k in op.input_names}, attrs)
    for name in op.output_names:
        testing.assert_close(getattr(got, name), ref[name], "float32", f"{op_name}.{name}")


@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_an_input_found_unread_does_not_change_the_outputs(op_name, peephole):
    """``raw_ops`` copies no small input that ``kernels.unread_inputs`` finds unread: the
    compiled kernel, given NaN there, must still match the reference on the real inputs."""
    from lstm_tvm.kernels import unread_inputs
    from lstm_tvm.validation import validate_attrs

    op = registry.KERNEL_OPS[op_name]
    attrs = {"use_peephole": peephole} if "use_peephole" in op.attr_names else {}
    full = validate_attrs(op, attrs)
    I, H, B, T = 6, 8, 3, 4
    unread = unread_inputs(op_name, "float32", I, H, tuple(sorted(full.items())))
    if op_name == "LSTMBlockCellGrad":  # TF reads x, h_prev, w and b for their shapes alone
        assert {"x", "h_prev", "w", "b"} <= unread
    if not unread:
        return
    inputs = testing.make_inputs(op_name, dtype="float32", B=B, I=I, H=H,
                                 T=T if op.kind == "sequence" else None, seed=40, attrs=attrs)
    compiled = lstm_tvm.compile(op_name, input_size=I, cell_size=H, **attrs)
    args = {n: (v if n == "seq_len_max" else
                tvm.runtime.tensor(np.full_like(v, np.nan) if n in unread else v))
            for n, v in inputs.items()}
    got = compiled(**args)
    ref = reference.run(op_name, inputs, attrs) if op_name in registry.OPS else \
        reference.cell_grad_matmul(*(inputs[n] for n in op.input_names))
    for name, value in zip(op.output_names, got):
        testing.assert_close(value.numpy(), ref[name], "float32", f"{op_name}.{name}")
