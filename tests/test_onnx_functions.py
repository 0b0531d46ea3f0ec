"""The ONNX functions of the six ops, run by onnxruntime (CPU), against the reference and TF.

Tolerances: against the float64 reference, :data:`lstm_tvm.testing.TOLERANCE` of the dtype.
The function bodies compute in float32 and round to the model's dtype exactly where lstm_tvm's
TVM kernels do (outputs and the forward's carried state), so the kernels' float16 row applies;
measured worst error of the function route at these shapes (all ops, peephole on/off, 3 seeds):
4.6e-4 of ``max(1, max|expected|)`` for float16 against the 5e-3 row, identical to the TVM
kernels' values at the worst elements. Against TF the bound is the sum of both routes' bounds
to the reference (:func:`lstm_tvm.testing.tf_tolerance` for TF) and only TF's defined elements
are compared (:func:`lstm_tvm.testing.tf_defined_mask`).
"""

import functools
import math

import numpy as np
import onnx
import pytest
from _ort_harness import open_session, run_session

from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.registry import DTYPES, OPS

pytest.importorskip("onnxruntime", reason="the function route needs onnxruntime")

T, B, I, H = 4, 3, 5, 6
SEQ_LENS = (0, 1, T)
CASES = [pytest.param(n, s, id=f"{n}-n{s}") for n, op in OPS.items()
         for s in (SEQ_LENS if op.kind == "sequence" else (None,))]


@functools.cache
def _session(op_name, dtype, attrs=(), pair=False):
    build = lo.make_forward_backward_model if pair else lo.make_model
    model = build(op_name, dtype, input_size=I, cell_size=H, attrs=dict(attrs))
    return open_session(model, quiet=True)  # "Loop had zero iterations" for seq_len_max = 0


def _inputs(op_name, dtype, seq_len_max, attrs, seed=0):
    kw = {} if seq_len_max is None else {"T": T, "seq_len_max": seq_len_max}
    return testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, attrs=attrs, seed=seed, **kw)


def _tf_tol(dtype):
    (r1, a1), (r2, a2) = testing.tolerance(dtype), testing.tf_tolerance(dtype)
    return (r1 + r2, a1 + a2)


def _compare(op_name, out, ref, tf, dtype, seq_len_max):
    op = OPS[op_name]
    for spec in op.outputs:
        name, got = spec.name, out[spec.name]
        label = f"{op_name}.{name}"
        assert got.dtype == np.dtype(dtype) and got.shape == ref[name].shape, label
        testing.assert_close(got, ref[name], dtype, label)
        if tf is not None:
            mask = testing.tf_defined_mask(op_name, name, seq_len_max, T)
            testing.assert_close(got, tf[name], dtype, label + " vs TF", mask=mask,
                                 tol=_tf_tol(dtype))
        if seq_len_max is not None and spec.shape[0] == "T":  # padded steps are zero
            assert not got[seq_len_max:].any(), label


@pytest.mark.parametrize("op_name, seq_len_max", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_peephole", [False, True])
def test_function_matches_reference_and_tf(op_name, seq_len_max, dtype, use_peephole, tf):
    attrs = {"use_peephole": use_peephole}
    inputs = _inputs(op_name, dtype, seq_len_max, attrs)
    out = run_session(_session(op_name, dtype, tuple(attrs.items())), inputs)
    ref = reference.run(op_name, inputs, attrs)
    _compare(op_name, out, ref, testing.tf_run(op_name, inputs, attrs), dtype, seq_len_max)


@pytest.mark.parametrize("op_name", [n for n, op in OPS.items() if op.direction == "forward"])
@pytest.mark.parametrize("use_peephole", [False, True])
def test_function_attributes(op_name, use_peephole, tf):
    """Non-default forget_bias and an active cell_clip reach the body (``ref_attr_name``)."""
    attrs = {"cell_clip": 0.8, "use_peephole": use_peephole}
    if "forget_bias" in OPS[op_name].attr_names:
        attrs["forget_bias"] = 0.3
    n = None if OPS[op_name].kind == "cell" else T
    inputs = _inputs(op_name, "float32", n, attrs, seed=1)
    ref = reference.run(op_name, inputs, attrs)
    assert np.isclose(np.abs(ref["cs"]), 0.8).any()  # the clip is active
    out = run_session(_session(op_name, "float32", tuple(attrs.items())), inputs)
    _compare(op_name, out, ref, testing.tf_run(op_name, inputs, attrs), "float32", n)


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM", "BlockLSTMV2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cell_clip_keeps_nan_like_tf(op_name, dtype, tf):
    """NaN in ``cs`` survives an active ``cell_clip`` (TF's clip and lstm_tvm's kernels keep it),
    +-Inf is clipped: the same NaN positions and values as TF in every output."""
    attrs = {"cell_clip": 0.5, "use_peephole": False}
    n = None if OPS[op_name].kind == "cell" else T
    inputs = _inputs(op_name, dtype, n, attrs, seed=5)
    rng = np.random.default_rng(5)
    special = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0]), size=(B, H),
                         p=[0.3, 0.15, 0.15, 0.4])
    inputs["cs_prev"] = np.where(special != 0, special, inputs["cs_prev"]).astype(dtype)
    assert np.isnan(inputs["cs_prev"]).any() and np.isinf(inputs["cs_prev"]).any()
    out = run_session(_session(op_name, dtype, tuple(attrs.items())), inputs)
    expected = testing.tf_run(op_name, inputs, attrs)
    for name in OPS[op_name].output_names:
        nan = np.isnan(expected[name])
        first = nan if n is None else nan[0]  # later steps: NaN h spreads into every gate
        assert first.any() == (name in ("cs", "co", "h")), name  # NaN first meets the clip
        np.testing.assert_array_equal(np.isnan(out[name]), nan, err_msg=f"{op_name}.{name}")
        testing.assert_close(out[name], expected[name], dtype, f"{op_name}.{name} vs TF",
                             mask=~nan, tol=_tf_tol(dtype))


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM", "BlockLSTMV2"])
def test_function_attribute_defaults(op_name):
    """A node without its optional attributes gets TF's defaults from the function."""
    model = lo.make_model(op_name, "float32", input_size=I, cell_size=H)
    node = model.graph.node[0]
    del node.attribute[:]
    inputs = _inputs(op_name, "float32", None if "Cell" in op_name else T, {}, seed=2)
    out = run_session(open_session(model, quiet=True), inputs)
    _compare(op_name, out, reference.run(op_name, inputs, {}), None, "float32", None)


@pytest.mark.parametrize("op_name", list(OPS))
def test_disabled_peephole_ignores_peephole_weights(op_name):
    """Without peephole, NaN in wci/wcf/wco must not reach any output (no ``0 * NaN``)."""
    attrs = {"use_peephole": False}
    n = None if OPS[op_name].kind == "cell" else T
    inputs = _inputs(op_name, "float32", n, attrs, seed=3)
    ref = reference.run(op_name, inputs, attrs)
    for p in ("wci", "wcf", "wco"):
        inputs[p] = np.full_like(inputs[p], np.nan)
    out = run_session(_session(op_name, "float32", tuple(attrs.items())), inputs)
    _compare(op_name, out, ref, None, "float32", n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("seq_len_max", [T - 1, T])
def test_forward_backward_model(dtype, use_peephole, seq_len_max, tf):
    """BlockLSTMV2 feeding BlockLSTMGradV2 in one model, against TF's two ops chained."""
    attrs = {"use_peephole": use_peephole}
    fwd, bwd = OPS["BlockLSTMV2"], OPS["BlockLSTMGradV2"]
    inputs = _inputs(bwd.name, dtype, seq_len_max, attrs, seed=4)
    out = run_session(_session(fwd.name, dtype, tuple(attrs.items()), pair=True), inputs)
    fwd_in = {k: inputs[k] for k in fwd.input_names}
    tf_fwd = testing.tf_run(fwd.name, fwd_in, attrs)
    tf_bwd = testing.tf_run(bwd.name, {**inputs, **tf_fwd}, attrs)
    ref_fwd = reference.run(fwd.name, fwd_in, attrs)
    # the grad's reference runs on the forward's outputs as stored (rounded to dtype)
    ref_bwd = reference.run(bwd.name, {**inputs, **{k: v.astype(dtype) for k, v in
                                                     ref_fwd.items()}}, attrs)
    _compare(fwd.name, out, ref_fwd, tf_fwd, dtype, seq_len_max)
    _compare(bwd.name, out, ref_bwd, tf_bwd, dtype, seq_len_max)


@pytest.mark.parametrize("op_name, name, bad", [
    ("BlockLSTM", "seq_len_max", np.asarray(T + 1, np.int64)),
    ("BlockLSTMV2", "seq_len_max", np.asarray(-1, np.int64)),
    ("BlockLSTMGradV2", "h_grad", np.zeros((T + 1, B, H), np.float32)),
    ("BlockLSTMGrad", "cs_prev", np.zeros((1, H), np.float32)),
    ("LSTMBlockCellGrad", "i", np.zeros((1, H), np.float32)),
    ("LSTMBlockCell", "h_prev", np.zeros((1, H), np.float32)),
])
def test_inconsistent_inputs_fail_in_onnxruntime(op_name, name, bad):
    """Symbolic dims that disagree (onnxruntime does not check them) or a seq_len_max
    outside 0..T fail at the function's input check instead of broadcasting or reading
    out of range."""
    attrs = {"use_peephole": True}
    n = None if OPS[op_name].kind == "cell" else T
    inputs = _inputs(op_name, "float32", n, attrs)
    session = _session(op_name, "float32", tuple(attrs.items()))
    with pytest.raises(Exception, match=f"{op_name}_input_check"):
        run_session(session, {**inputs, name: bad})


def _all_nodes(nodes):
    for node in nodes:
        yield node
        for attr in node.attribute:
            graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for g in graphs:
                yield from _all_nodes(g.node)


@pytest.mark.parametrize("op_name", list(OPS))
def test_function_uses_standard_ops_only(op_name):
    fn = lo.make_function(op_name)
    assert (fn.domain, fn.name) == (lo.DOMAIN, op_name)
    assert list(fn.input) == list(OPS[op_name].input_names)
    assert list(fn.output) == list(OPS[op_name].output_names)
    assert {o.domain: o.version for o in fn.opset_import} == {"": lo.ONNX_OPSET}
    assert lo.ONNX_OPSET <= 26  # the newest ai.onnx opset onnxruntime 1.31 runs
    for node in _all_nodes(fn.node):
        assert node.domain in ("", "ai.onnx"), node.op_type
        onnx.defs.get_schema(node.op_type, lo.ONNX_OPSET)  # raises for a non-standard op
    required = set(fn.attribute)
    defaults = {a.name for a in fn.attribute_proto}
    assert required | defaults == set(OPS[op_name].attr_names)
    assert required == {a.name for a in OPS[op_name].attrs if a.required}


#: ``cell_clip`` values TF accepts that turn clipping off (all but 3.4e38, which clips an
#: infinite cell state to 3.4e38); 1e39 is ``inf`` as an ONNX (float32) attribute.
EDGE_CELL_CLIPS = [math.inf, -math.inf, math.nan, 1e-40, 3.4e38, 1e39]


def _set_attribute(model, name, value):
    """``model`` with its node's float attribute ``name`` set to ``value`` as is (a model
    written by something other than :func:`lstm_tvm.onnx.make_node`)."""
    attr = next(a for a in model.graph.node[0].attribute if a.name == name)
    attr.f = value
    return model


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM", "BlockLSTMV2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_function_edge_cell_clip_values_like_tf(op_name, dtype, tf):
    """``cell_clip`` +-inf, NaN, a float32 denormal and values at and past float32's range,
    given to :func:`make_model` and written straight into a node: TF's results. Cell states
    reach +-6 (past TF's default clip of 3) and, in float32, +-inf (any active clip shows)."""
    n = None if OPS[op_name].kind == "cell" else T
    kw = {} if n is None else {"T": T, "seq_len_max": n}
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, seed=6, scale=3.0, **kw)
    if dtype == "float32":
        inputs["cs_prev"].flat[::5] = np.inf
        inputs["cs_prev"].flat[1::5] = -np.inf
    for value in EDGE_CELL_CLIPS:
        attrs = {"cell_clip": value, "use_peephole": False}
        expected = testing.tf_run(op_name, inputs, attrs)
        ref = reference.run(op_name, inputs, attrs)
        built = lo.make_model(op_name, dtype, input_size=I, cell_size=H, attrs=attrs)
        raw = _set_attribute(lo.make_model(op_name, dtype, input_size=I, cell_size=H,
                                           attrs={**attrs, "cell_clip": 0.5}), "cell_clip", value)
        for model in (built, raw):
            out = run_session(open_session(model, quiet=True), inputs)
            _compare(op_name, out, ref, expected, dtype, n)
            for result in (out, ref, expected):  # assert_close skips where expected is NaN
                assert not any(np.isnan(v).any() for v in result.values()), value


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))
