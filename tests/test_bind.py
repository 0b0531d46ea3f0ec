"""``CompiledOp.bind``: inputs held constant over many calls. The sequence ops' bound kernels
take the panels of ``w`` made once at ``bind`` (a prepacked build); every op, float32 and
float16, peepholes and an active clip, short and long sequences (both sides of the forward's
``PACK_FROM_ROWS``), ``seq_len_max < T`` and batches off every row tile, against the float64
reference."""

import numpy as np
import pytest
import tvm

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm.kernels import WEIGHT_PACKS
from lstm_tvm.schedule.blocks import leaf_blocks

I, H = 8, 16
#: (T, B, seq_len_max): one row; rows below and past the forward's packing threshold; a batch
#: past a row tile; padded steps.
CASES = [(1, 1, 1), (6, 2, 5), (20, 1, 20), (5, 9, 3)]


def _attrs(op_name: str) -> dict:
    attrs = {"use_peephole": True}
    if "cell_clip" in registry.get_op(op_name).attr_names:
        attrs["cell_clip"] = 0.5  # active: the cell state reaches past it
    return attrs


def _run_bound(bound, op_name, inputs, dtype):
    """``bound`` on ``inputs`` less its bound ones, as NumPy outputs by name."""
    free = {n: (int(v) if n == "seq_len_max" else tvm.runtime.tensor(v, bound.device))
            for n, v in inputs.items() if n not in bound._bound}
    out = bound(**free)
    return {n: getattr(out, n).numpy() for n in registry.get_op(op_name).output_names}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_a_bound_op_matches_the_reference(op_name, dtype):
    attrs = _attrs(op_name)
    fn = lstm_tvm.compile(op_name, dtype=dtype, input_size=I, cell_size=H, **attrs)
    op = registry.get_op(op_name)
    weights = testing.make_inputs(op_name, dtype=dtype, B=1, I=I, H=H,
                                  T=1 if op.kind == "sequence" else None, attrs=attrs)
    held = {n: weights[n] for n in ("w", "b")}
    bound = fn.bind(**held)
    assert bound.spec.prepacked == (op_name in WEIGHT_PACKS)
    for T, B, steps in CASES if op.kind == "sequence" else [(None, B, 0) for B in (1, 3, 9)]:
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T, seed=B + 7,
                                     attrs=attrs)
        inputs.update(held)
        if T is not None:
            inputs["seq_len_max"] = np.int64(steps)
        got = _run_bound(bound, op_name, inputs, dtype)
        ref = reference.run(op_name, inputs, testing.op_attrs(op_name, attrs))
        for name in op.output_names:
            testing.assert_close(got[name], ref[name], dtype, f"{op_name}.{name} T={T} B={B}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_bound_cell_grad_matmul_matches_the_reference(dtype):
    """The helper's prepacked kernel: ``x_grad`` and ``h_prev_grad`` from ``w``'s transposed
    panels as a step's GEMMs, every batch path (one-row, four-row and padded tiles, B = 0)."""
    fn = lstm_tvm.compile("CellGradMatmul", dtype=dtype, input_size=I, cell_size=H)
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (I + H, 4 * H)).astype(dtype)
    bound = fn.bind(w=w)
    assert bound.spec.prepacked
    for B in (0, 1, 2, 3, 5, 9):
        args = [rng.uniform(-1, 1, s).astype(dtype) for s in ((B, I), (B, H), (B, 4 * H))]
        got = bound(*(tvm.runtime.tensor(a) for a in args))
        ref = reference.cell_grad_matmul(args[0], args[1], w, args[2])
        for name in got._fields:
            testing.assert_close(getattr(got, name).numpy(), ref[name], dtype, f"{name} B={B}")


@pytest.mark.parametrize("source", ["numpy", "tvm"])
def test_bind_copies_what_it_holds(source):
    """Writes to the bound arrays after ``bind`` change nothing (as an initializer)."""
    op_name, attrs = "BlockLSTMV2", _attrs("BlockLSTMV2")
    fn = lstm_tvm.compile(op_name, input_size=I, cell_size=H, **attrs)
    inputs = testing.make_inputs(op_name, B=3, I=I, H=H, T=7, attrs=attrs)
    w = inputs["w"].copy() if source == "numpy" else tvm.runtime.tensor(inputs["w"])
    bound = fn.bind(w=w)
    if source == "numpy":
        w[:] = 0
    else:
        w.copyfrom(np.zeros_like(inputs["w"]))
    got = _run_bound(bound, op_name, inputs, "float32")
    ref = reference.run(op_name, inputs, attrs)
    testing.assert_close(got["h"], ref["h"], "float32", "h")


def test_binding_more_inputs_keeps_the_packed_weights():
    op_name, attrs = "BlockLSTMGradV2", {"use_peephole": True}
    fn = lstm_tvm.compile(op_name, input_size=I, cell_size=H, **attrs)
    inputs = testing.make_inputs(op_name, B=2, I=I, H=H, T=9, seq_len_max=6, attrs=attrs)
    bound = fn.bind(w=inputs["w"]).bind(b=inputs["b"], wco=inputs["wco"])
    assert sorted(bound._bound) == ["b", "w", "wco"] and "bound=['b', 'w', 'wco']" in repr(bound)
    got = _run_bound(bound, op_name, inputs, "float32")
    ref = reference.run(op_name, inputs, attrs)
    for name in registry.get_op(op_name).output_names:
        testing.assert_close(got[name], ref[name], "float32", name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMV2"])
def test_a_bound_forward_at_small_batches_reads_the_unit_panels(op_name, dtype):
    """Where 32 divides ``H`` a bound sequence forward also holds ``W_h`` in panels of unit
    chunks (``w_units``), which its steps at batch 1 and 2 read (``GATE_ROWS_BELOW``), the
    others the column panels: both against the reference, over several chunks of units."""
    attrs, cell = _attrs(op_name), 64
    fn = lstm_tvm.compile(op_name, dtype=dtype, input_size=I, cell_size=cell, **attrs)
    held = {n: v for n, v in testing.make_inputs(op_name, dtype=dtype, B=1, I=I, H=cell, T=1,
                                                 attrs=attrs).items() if n in ("w", "b")}
    bound = fn.bind(**held)
    assert "w_units" in [p.name for p in WEIGHT_PACKS[op_name](I, cell)]
    for B in (1, 2, 3):
        inputs = {**testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=cell, T=7,
                                        seq_len_max=6, seed=B, attrs=attrs), **held}
        got = _run_bound(bound, op_name, inputs, dtype)
        ref = reference.run(op_name, inputs, attrs)
        for name in registry.get_op(op_name).output_names:
            testing.assert_close(got[name], ref[name], dtype, f"{op_name}.{name} B={B}")


@pytest.mark.parametrize("op_name", list(WEIGHT_PACKS))
def test_a_prepacked_kernel_takes_the_panels_and_copies_no_weights(op_name):
    attrs = testing.op_attrs(op_name, {"use_peephole": False, "cell_clip": 0.0})
    spec = build.make_spec(op_name, "float32", I, H, attrs, "llvm", tuned=False, prepacked=True)
    plain = build.primfunc(build.make_spec(op_name, "float32", I, H, attrs, "llvm", tuned=False))
    funcs = build.primfuncs(spec)
    kernel, pack = funcs[spec.func_name], funcs[spec.pack_func_name]
    packs = [p.name for p in WEIGHT_PACKS[op_name](I, H)]
    inputs = len(registry.get_op(op_name).inputs)
    names = [p.name for p in plain.params]
    assert [p.name for p in kernel.params] == names[:inputs] + packs + names[inputs:]
    assert [p.name for p in pack.params] == ["w"] + packs

    def blocks(func):
        sch = tvm.s_tir.Schedule(func)
        return {sch.get(b).name_hint for b in leaf_blocks(sch)}

    assert set(packs) <= blocks(pack) and not set(packs) & blocks(kernel)
    # the sequence ops copy w into panels at every call, LSTMBlockCell reads it in place
    assert (packs[0] in blocks(plain)) == (registry.get_op(op_name).kind == "sequence")


def test_bind_names_what_it_refuses():
    fn = lstm_tvm.compile("BlockLSTMV2", input_size=I, cell_size=H)
    inputs = testing.make_inputs("BlockLSTMV2", B=2, I=I, H=H, T=3)
    with pytest.raises(TypeError, match=r"bind\(\) takes inputs whose shape has no T or B "
                                        r"\(\['w', 'wci', 'wcf', 'wco', 'b'\]\), got 'x'"):
        fn.bind(x=inputs["x"])
    with pytest.raises(TypeError, match="got 'weights'"):
        fn.bind(weights=inputs["w"])
    with pytest.raises(ValueError, match=r"input 'w' expected float32\[24, 64\], got "
                                         r"float32\[23, 64\]"):
        fn.bind(w=inputs["w"][:-1])
    with pytest.raises(ValueError, match=r"input 'b' expected float32\[64\], got float64\[64\]"):
        fn.bind(b=inputs["b"].astype(np.float64))
    with pytest.raises(TypeError, match="input 'w' expected a tvm.runtime.Tensor or "
                                        "numpy.ndarray, got list"):
        fn.bind(w=inputs["w"].tolist())
    bound = fn.bind(w=inputs["w"])
    with pytest.raises(TypeError, match="got 'w'"):
        bound.bind(w=inputs["w"])
    free = {n: tvm.runtime.tensor(v) for n, v in inputs.items() if n != "seq_len_max"}
    with pytest.raises(TypeError, match=r"input\(s\) \['w'\] are bound"):
        bound(seq_len_max=3, **free)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", ["BlockLSTMGrad", "BlockLSTMGradV2"])
def test_the_backward_transposes_w_through_vector_tiles(op_name, dtype):
    """At I=32, H=64 the backward's transposed panels of ``w`` (``panels(transpose=True)``:
    ``w_t_x`` one panel, ``w_t_h`` two) are copied through vector registers, in the kernel
    that packs ``w`` per call and in ``bind``'s pack: both match the reference."""
    from lstm_tvm.kernels.contract import PANEL, TRANSPOSE_LANES

    I_, H_ = 32, 64
    # the vector-tile copy applies to both panels
    assert I_ % PANEL == H_ % PANEL == 0 and 4 * H_ % TRANSPOSE_LANES == 0
    attrs = {"use_peephole": True}
    fn = lstm_tvm.compile(op_name, dtype=dtype, input_size=I_, cell_size=H_, **attrs)
    inputs = testing.make_inputs(op_name, dtype=dtype, B=2, I=I_, H=H_, T=4, seed=3,
                                 attrs=attrs)
    ref = reference.run(op_name, inputs, testing.op_attrs(op_name, attrs))
    unbound = lstm_tvm.raw_ops.run(op_name, inputs, attrs)
    bound = _run_bound(fn.bind(w=inputs["w"]), op_name, inputs, dtype)
    for name in registry.get_op(op_name).output_names:
        testing.assert_close(getattr(unbound, name), ref[name], dtype, f"{name} (packed per call)")
        testing.assert_close(bound[name], ref[name], dtype, f"{name} (bound)")
