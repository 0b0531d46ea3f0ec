"""The public API: ``compile`` on TVM tensors, ``raw_ops`` conveniences, caching, edge sizes."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm

import lstm_tvm
from lstm_tvm import build, reference, registry, testing


def _tvm_inputs(inputs, dev):
    return {k: (int(v) if k == "seq_len_max" else tvm.runtime.tensor(v, dev))
            for k, v in inputs.items()}


def test_compile_runs_on_tvm_tensors_with_dynamic_time_and_batch():
    fn = lstm_tvm.compile("BlockLSTMGradV2", dtype="float32", input_size=5, cell_size=4,
                          use_peephole=True)
    assert isinstance(fn, lstm_tvm.CompiledOp) and "BlockLSTMGradV2" in repr(fn)
    for T, B in [(3, 2), (6, 1), (2, 5)]:
        inputs = testing.make_inputs("BlockLSTMGradV2", B=B, I=5, H=4, T=T, seed=T)
        out = fn(**_tvm_inputs(inputs, fn.device))
        ref = reference.run("BlockLSTMGradV2", inputs, {"use_peephole": True})
        for name in out._fields:
            testing.assert_close(getattr(out, name).numpy(), ref[name], "float32", name)


def test_compile_accepts_positional_inputs_and_out():
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=3, cell_size=2)
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=3, H=2)
    args = [tvm.runtime.tensor(inputs[n]) for n in registry.get_op("LSTMBlockCell").input_names]
    out = [tvm.runtime.empty((2, 2), "float32") for _ in range(7)]
    result = fn(*args, out=out)
    assert result.h is out[-1]
    testing.assert_close(out[-1].numpy(), reference.run("LSTMBlockCell", inputs, {})["h"],
                         "float32", "h")
    with pytest.raises(ValueError, match="output 'i' expected"):
        fn(*args, out=[tvm.runtime.empty((3, 2), "float32")] + out[1:])


def test_compile_reuses_the_memory_of_dropped_outputs_only():
    """A CPU call without ``out=`` writes the memory of an earlier call's outputs once every
    one of them was dropped, and never the memory of outputs still held, whether in Python or
    only by TVM (a ``tvm_ffi`` array): each result against the float64 reference."""
    import tvm_ffi

    fn = lstm_tvm.compile("BlockLSTM", input_size=3, cell_size=4)
    calls = [testing.make_inputs("BlockLSTM", T=5, B=2, I=3, H=4, seed=s) for s in range(4)]
    want = [reference.run("BlockLSTM", inputs, {})["h"] for inputs in calls]

    def address(tensor):
        return np.from_dlpack(tensor).__array_interface__["data"][0]

    first = fn(**_tvm_inputs(calls[0], fn.device))
    first_h = address(first.h)
    del first
    second = fn(**_tvm_inputs(calls[1], fn.device))
    assert address(second.h) == first_h  # every output of the first call was dropped
    held_by_tvm = tvm_ffi.convert([second.h])
    del second
    for k in (2, 3):  # the memory held by the TVM array is not written
        out = fn(**_tvm_inputs(calls[k], fn.device))
        assert address(out.h) != first_h
        testing.assert_close(out.h.numpy(), want[k], "float32", f"h of call {k}")
        testing.assert_close(held_by_tvm[0].numpy(), want[1], "float32", "h held by TVM")
        del out


@pytest.mark.parametrize("target", ["llvm", {"kind": "llvm"}, '{"kind": "llvm"}'])
def test_compile_target_forms(target):
    fn = lstm_tvm.compile("LSTMBlockCellGrad", target=target, input_size=3, cell_size=2,
                          use_peephole=False)
    assert fn.target.kind.name == "llvm"
    if target == "llvm":
        assert "mcpu" in str(fn.target), "'llvm' means this host, with its CPU model"


def test_compile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'LSTM'"):
        lstm_tvm.compile("LSTM", input_size=1, cell_size=1)
    with pytest.raises(TypeError, match="dtype expected"):
        lstm_tvm.compile("BlockLSTM", dtype="float64", input_size=1, cell_size=1)
    with pytest.raises(ValueError, match="cell_size expected an int >= 1, got 0"):
        lstm_tvm.compile("BlockLSTM", input_size=1, cell_size=0)
    with pytest.raises(TypeError, match="use_peephole"):
        lstm_tvm.compile("BlockLSTMGrad", input_size=1, cell_size=1)
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=3, cell_size=2)
    other = testing.make_inputs("LSTMBlockCell", B=2, I=4, H=2)
    with pytest.raises(ValueError, match="input .x. gives I=4; this op was compiled for I=3"):
        fn(**{k: tvm.runtime.tensor(v) for k, v in other.items()})


@pytest.mark.parametrize("int_type", [np.int64, np.int32, np.uint8])
def test_compile_accepts_numpy_integer_sizes(int_type):
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=int_type(3), cell_size=int_type(2))
    plain = lstm_tvm.compile("LSTMBlockCell", input_size=3, cell_size=2)
    assert fn.spec == plain.spec and type(fn.spec.input_size) is int  # one cache entry
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=3, H=2)
    out = fn(**_tvm_inputs(inputs, fn.device))
    testing.assert_close(out.h.numpy(), reference.run("LSTMBlockCell", inputs, {})["h"],
                         "float32", "h")


@pytest.mark.parametrize(("value", "error", "shown"), [
    (2.0, TypeError, "float 2.0"), (np.float64(2.0), TypeError, "float64"),
    (True, TypeError, "bool True"), (np.bool_(True), TypeError, "bool"),
    ("2", TypeError, "str '2'"), (0, ValueError, "0"), (np.int64(-1), ValueError, "-1"),
], ids=repr)
def test_compile_refuses_sizes_that_are_not_positive_integers(value, error, shown):
    with pytest.raises(error, match=f"^LSTMBlockCell: input_size expected an int >= 1, "
                                    f"got {re.escape(shown)}"):
        lstm_tvm.compile("LSTMBlockCell", input_size=value, cell_size=2)


def _alias_case():
    """``(fn, inputs as NumPy, inputs as TVM tensors, fresh outputs)`` of BlockLSTMGrad: two
    outputs and inputs of one shape, ``(B, H)`` (without the check, ``out=`` with one tensor
    for both ``cs_prev_grad`` and ``h_prev_grad`` returns a wrong ``cs_prev_grad``)."""
    fn = lstm_tvm.compile("BlockLSTMGrad", input_size=3, cell_size=2, use_peephole=True)
    inputs = testing.make_inputs("BlockLSTMGrad", B=2, I=3, H=2, T=4, seed=3)
    args = _tvm_inputs(inputs, fn.device)
    return fn, inputs, args, list(fn(**args))


def test_compiled_op_refuses_the_same_out_tensor_twice():
    fn, _, args, out = _alias_case()
    twice = out[:2] + [out[1]] + out[3:]  # h_prev_grad is cs_prev_grad
    with pytest.raises(ValueError, match="^BlockLSTMGrad: output 'h_prev_grad' shares memory "
                                         "with output 'cs_prev_grad'"):
        fn(**args, out=twice)


@pytest.mark.parametrize(("output", "input_"), [("cs_prev_grad", "cs_prev"),
                                                ("h_prev_grad", "h_prev")])
def test_compiled_op_refuses_an_out_tensor_that_is_an_input(output, input_):
    fn, inputs, args, out = _alias_case()
    names = registry.get_op("BlockLSTMGrad").output_names
    bad = [args[input_] if n == output else t for n, t in zip(names, out)]
    with pytest.raises(ValueError, match=f"^BlockLSTMGrad: output '{output}' shares memory "
                                         f"with input '{input_}'"):
        fn(**args, out=bad)
    np.testing.assert_array_equal(args[input_].numpy(), inputs[input_])  # nothing ran


def test_compiled_op_refuses_partly_overlapping_out_tensors():
    fn, _, args, out = _alias_case()
    owner = tvm.runtime.empty((256,), "uint8")
    first = owner._create_view((2, 2), "float32", 0)  # bytes [0, 16)
    second = owner._create_view((2, 2), "float32", 8)  # bytes [8, 24)
    with pytest.raises(ValueError, match="^BlockLSTMGrad: output 'h_prev_grad' shares memory "
                                         "with output 'cs_prev_grad'"):
        fn(**args, out=out[:1] + [first, second] + out[3:])


def test_compiled_op_runs_distinct_out_tensors_and_reuses_them():
    fn, inputs, args, out = _alias_case()
    want = reference.run("BlockLSTMGrad", inputs, {"use_peephole": True})
    fresh = [tvm.runtime.empty(t.shape, "float32") for t in out]
    for _ in range(2):  # the second call reuses the same tensors (the overlap check's memo)
        result = fn(**args, out=fresh)
        for name, got, given in zip(result._fields, result, fresh):
            assert got is given
            testing.assert_close(got.numpy(), want[name], "float32", name)
    with pytest.raises(ValueError, match="shares memory"):  # the memo forgets nothing bad
        fn(**args, out=fresh[:2] + [fresh[1]] + fresh[3:])
    # the same outputs with another input tensor: checked again (the call memo holds objects)
    with pytest.raises(ValueError, match="^BlockLSTMGrad: input 'w' expected shape"):
        fn(**dict(args, x=tvm.runtime.empty((4, 2, 5), "float32")), out=fresh)


@pytest.mark.parametrize("out", [3, "outputs", np.zeros((8, 2), np.float32)], ids=repr)
def test_compiled_op_names_an_out_that_is_not_a_sequence(out):
    fn, _, args, outputs = _alias_case()
    fn(**args, out=outputs)  # a checked out= call first: the next call must not skip checks
    with pytest.raises(TypeError, match="^BlockLSTMGrad: out= expected a sequence of 8 "
                                        "tensors"):
        fn(**args, out=out)


def test_compiled_op_names_a_view_the_kernel_refuses():
    """Views at a byte offset (``Tensor._create_view``) fail the kernel's own argument check;
    the error names the op and the tensor."""
    fn, inputs, args, _ = _alias_case()
    view = tvm.runtime.empty((128,), "uint8")._create_view((2, 2), "float32", 64)
    view.copyfrom(inputs["cs_prev"])
    with pytest.raises(ValueError, match="^BlockLSTMGrad: the kernel refused input 'cs_prev'"):
        fn(**{**args, "cs_prev": view})


def test_raw_ops_mirror_tf_signatures(tf):
    import inspect
    for name, op in registry.OPS.items():
        ours = inspect.signature(getattr(lstm_tvm.raw_ops, name))
        theirs = inspect.signature(getattr(tf.raw_ops, name))
        assert set(ours.parameters) == set(theirs.parameters), name
        for a in op.attrs:
            assert ours.parameters[a.name].default == (
                inspect.Parameter.empty if a.required else a.default)
    with pytest.raises(TypeError, match="unexpected argument"):
        lstm_tvm.raw_ops.LSTMBlockCell(x=np.zeros((1, 1), "float32"), bogus=1)


def test_raw_ops_accept_dlpack_objects():
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=3, H=4)
    as_tvm = {k: tvm.runtime.tensor(v) for k, v in inputs.items()}
    got = lstm_tvm.raw_ops.LSTMBlockCell(**as_tvm)
    testing.assert_close(got.h, reference.run("LSTMBlockCell", inputs, {})["h"], "float32", "h")


@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_empty_batch_and_empty_sequence_give_zeros(op_name):
    op = registry.get_op(op_name)
    cases = [dict(B=0, T=3 if op.kind == "sequence" else None)]
    if op.kind == "sequence":
        cases.append(dict(B=2, T=0))
    for sizes in cases:
        inputs = testing.make_inputs(op_name, I=3, H=2, seed=1, **sizes)
        attrs = {"use_peephole": True}
        got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        ref = reference.run(op_name, inputs, attrs)
        for name in op.output_names:
            value = getattr(got, name)
            assert value.shape == ref[name].shape and value.dtype == np.float32
            assert not value.any()


def test_seq_len_max_zero_gives_zero_grads_with_nonempty_inputs():
    inputs = testing.make_inputs("BlockLSTMGrad", B=2, I=3, H=16, T=3, seq_len_max=0)
    got = lstm_tvm.raw_ops.BlockLSTMGrad(**inputs, use_peephole=True)
    assert all(not np.asarray(v).any() for v in got)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cell_grad_matmul_matches_reference(dtype):
    rng = np.random.default_rng(0)
    B, I, H = 3, 5, 4
    x, h_prev = rng.uniform(-1, 1, (B, I)), rng.uniform(-1, 1, (B, H))
    w, dicfo = rng.uniform(-1, 1, (I + H, 4 * H)), rng.uniform(-1, 1, (B, 4 * H))
    args = [a.astype(dtype) for a in (x, h_prev, w, dicfo)]
    got = lstm_tvm.cell_grad_matmul(*args)
    ref = reference.cell_grad_matmul(*args)
    for name in got._fields:
        testing.assert_close(getattr(got, name), ref[name], dtype, name)
    with pytest.raises(ValueError, match="input 'w' expected shape"):
        lstm_tvm.cell_grad_matmul(args[0], args[1], args[2][1:], args[3])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cell_grad_matmul_kernel_zeroes_every_output_for_an_empty_batch(dtype):
    """Called directly (as from an exported library) with B = 0, whatever the output
    tensors held before."""
    I, H = 5, 4
    spec = build.make_spec(registry.CELL_GRAD_MATMUL, dtype, I, H, {})
    func = build.get_module(spec)[spec.func_name]
    args = [tvm.runtime.tensor(np.zeros(s, dtype)) for s in ((0, I), (0, H), (I + H, 4 * H),
                                                               (0, 4 * H))]
    outs = [tvm.runtime.tensor(np.ones(s, dtype)) for s in ((0, I), (0, H), (I + H, 4 * H),
                                                            (4 * H,))]
    func(*args, *outs)
    assert all(not o.numpy().any() for o in outs)


_CHILD = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    import numpy as np, lstm_tvm
    from lstm_tvm import testing
    inputs = testing.make_inputs("BlockLSTM", B=2, I=3, H=17, T=2)
    print(float(np.abs(lstm_tvm.raw_ops.BlockLSTM(**inputs).h).sum()))
""")


def _child(cache_dir):
    env = {**os.environ, "LSTM_TVM_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_disk_cache_spares_the_second_process_a_compile(tmp_path):
    first = _child(tmp_path)
    assert "compiling BlockLSTM" in first
    second = _child(tmp_path)
    assert "compiling" not in second
    assert first.splitlines()[-1] == second.splitlines()[-1]


def test_corrupted_cache_entry_is_rebuilt(tmp_path):
    first = _child(tmp_path)
    (path,) = tmp_path.glob("*/BlockLSTM-*.so")
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])  # a truncated entry, as a crash mid-copy leaves it
    second = _child(tmp_path)
    assert "discarding cache entry" in second and "compiling BlockLSTM" in second
    assert first.splitlines()[-1] == second.splitlines()[-1]
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["sha256"] == build._file_sha256(path)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
