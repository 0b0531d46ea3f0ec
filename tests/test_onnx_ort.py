"""The PyOp route: onnxruntime running lstm_tvm's TVM kernels through onnxruntime-extensions.

What could abort the process (a float16 tensor at a PyOp, an exception escaping a PyOp) is
exercised in a subprocess that must survive and report what it saw.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _ort_harness import child_script, open_session, run_session

from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.registry import OPS

ort = pytest.importorskip("onnxruntime", reason="the PyOp route needs onnxruntime")
pytest.importorskip("onnxruntime_extensions", reason="the PyOp route needs onnxruntime-extensions")
from lstm_tvm.bench import ort_routes  # noqa: E402
from lstm_tvm.onnx import ort as lort  # noqa: E402

T, B, I, H = 4, 3, 5, 6


def _pair(fwd_name, dtype="float32", **attrs):
    return lo.make_forward_backward_model(fwd_name, dtype, input_size=I, cell_size=H,
                                          attrs=attrs, with_functions=False)


def _pair_inputs(fwd_name, dtype="float32", seq_len_max=T, attrs=None, seed=0):
    bwd = OPS[fwd_name].pair
    kw = {} if OPS[fwd_name].kind == "cell" else {"T": T, "seq_len_max": seq_len_max}
    return testing.make_inputs(bwd, dtype=dtype, B=B, I=I, H=H, attrs=attrs, seed=seed, **kw)


def _check_pair(fwd_name, out, inputs, attrs, dtype="float32"):
    fwd, bwd = OPS[fwd_name], OPS[OPS[fwd_name].pair]
    ref_fwd = reference.run(fwd.name, {k: inputs[k] for k in fwd.input_names}, attrs)
    stored = {k: v.astype(dtype) for k, v in ref_fwd.items() if k in bwd.input_names}
    ref_bwd = reference.run(bwd.name, {**{k: inputs[k] for k in bwd.input_names}, **stored},
                            {"use_peephole": attrs["use_peephole"]})
    for name, expected in {**ref_fwd, **ref_bwd}.items():
        assert out[name].dtype == np.dtype(dtype), name
        testing.assert_close(out[name], expected, dtype, f"{fwd_name} pair: {name}")


def test_register_ort_ops_is_idempotent():
    first = lort.register_ort_ops()
    assert lort.register_ort_ops() == first == [f"org.lstm_tvm::{n}" for n in OPS]
    options = lort.session_options()
    assert isinstance(options, ort.SessionOptions)


@pytest.mark.parametrize("fwd_name, use_peephole, seq_len_max", [
    ("LSTMBlockCell", False, None), ("LSTMBlockCell", True, None),
    ("BlockLSTM", True, T - 1),
    ("BlockLSTMV2", False, T), ("BlockLSTMV2", True, 0), ("BlockLSTMV2", True, T - 2),
])
def test_pyop_forward_backward_matches_reference(fwd_name, use_peephole, seq_len_max):
    attrs = {"use_peephole": use_peephole}
    inputs = _pair_inputs(fwd_name, seq_len_max=seq_len_max, attrs=attrs)
    session = open_session(_pair(fwd_name, **attrs), "pyop")
    _check_pair(fwd_name, run_session(session, inputs), inputs, attrs)


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "LSTMBlockCellGrad"])
def test_pyop_cell_ops_in_plain_session(op_name):
    """A plain onnxruntime session with :func:`session_options` runs the PyOps."""
    attrs = {"use_peephole": True}
    model = lo.make_model(op_name, "float32", input_size=I, cell_size=H, attrs=attrs,
                          with_functions=True)  # the registered PyOp wins over the function
    session = open_session(model, "pyop_plain")
    inputs = testing.make_inputs(op_name, B=B, I=I, H=H, attrs=attrs, seed=1)
    out = run_session(session, inputs)
    for name, expected in reference.run(op_name, inputs, attrs).items():
        testing.assert_close(out[name], expected, "float32", f"{op_name}.{name}")


def test_prepare_model_fills_default_attributes():
    model = lo.make_model("BlockLSTM", "float32", input_size=I, cell_size=H,
                          with_functions=False)
    del model.graph.node[0].attribute[:]
    prepared = lort.prepare_model(model)
    attrs = {a.name: onnx_value(a) for a in prepared.graph.node[0].attribute}
    assert attrs == {"forget_bias": 1.0, "cell_clip": 3.0, "use_peephole": 0}
    inputs = testing.make_inputs("BlockLSTM", B=B, I=I, H=H, T=T, seed=2)
    out = run_session(open_session(model, "pyop"), inputs)
    for name, expected in reference.run("BlockLSTM", inputs, {}).items():
        testing.assert_close(out[name], expected, "float32", name)


def onnx_value(attr):
    from onnx import helper

    return helper.get_attribute_value(attr)


def test_float16_model_refused_with_clear_error():
    with pytest.raises(TypeError, match="float16.*function route"):
        open_session(_pair("BlockLSTMV2", "float16", use_peephole=True), "pyop")
    assert len(lort.float16_nodes(_pair("BlockLSTMV2", "float16"))) == 2
    assert lort.float16_nodes(_pair("BlockLSTMV2", "float32")) == []


def test_wrong_shape_raises_in_process():
    session = open_session(_pair("BlockLSTMV2", use_peephole=False), "pyop")
    inputs = _pair_inputs("BlockLSTMV2", attrs={"use_peephole": False})
    with pytest.raises(ValueError, match="seq_len_max"):
        run_session(session, {**inputs, "seq_len_max": np.asarray(T + 1, np.int64)})
    with pytest.raises(Exception, match="Got invalid dimensions for input: w"):
        run_session(session, {**inputs, "w": np.zeros((I + H + 1, 4 * H), np.float32)})
    # the session still works afterwards
    _check_pair("BlockLSTMV2", run_session(session, inputs), inputs, {"use_peephole": False})


_SURVIVAL_SCRIPT = child_script("""
    import json, sys
    import numpy as np
    from _ort_harness import open_session, run_session, session_feeds
    from lstm_tvm import onnx as lo, reference, testing
    from lstm_tvm.onnx import ort as lort

    T, B, I, H = 4, 3, 5, 6
    seen = {}

    def attempt(key, fn):
        try:
            fn()
            seen[key] = "ok"
        except Exception as exc:
            seen[key] = f"{type(exc).__name__}: {exc}"

    def pair(dtype):
        return lo.make_forward_backward_model("BlockLSTMV2", dtype, input_size=I, cell_size=H,
                                              attrs={"use_peephole": True},
                                              with_functions=False)

    inputs = testing.make_inputs("BlockLSTMGradV2", dtype="float16", B=B, I=I, H=H, T=T,
                                 attrs={"use_peephole": True})
    # float16 on the PyOp route: plain onnxruntime, the wrapper, the wrapper with casts
    attempt("plain_f16", lambda: open_session(pair("float16"), "pyop_plain"))
    attempt("wrapper_f16", lambda: open_session(pair("float16"), "pyop"))
    cast = open_session(pair("float16"), "pyop", float16="cast")
    feeds = session_feeds(cast, inputs)
    out = run_session(cast, inputs)
    ref = reference.run("BlockLSTMV2", {k: inputs[k] for k in
                        ["seq_len_max", "x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b"]},
                        {"use_peephole": True})
    def check():
        for k, v in ref.items():
            assert out[k].dtype == np.float16, k
            testing.assert_close(out[k], v, "float16", k)
    attempt("cast_f16", check)

    # malformed inputs: an inconsistent T among symbolic dims reaches the PyOp
    f32 = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in feeds.items()}
    bad = {**f32, "h_grad": np.zeros((T + 1, B, H), np.float32)}
    plain = open_session(pair("float32"), "pyop_plain")
    def plain_run():
        out = run_session(plain, bad)
        grad = ["x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad",
                "wco_grad", "b_grad"]
        seen["plain_nonzero_grads"] = [k for k in grad if out[k].any()]
        seen["plain_forward_ok"] = all(np.allclose(out[k], v, atol=1e-5) for k, v in ref.items())
    ref = reference.run("BlockLSTMV2", {k: f32[k] for k in
                        ["seq_len_max", "x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b"]},
                        {"use_peephole": True})
    attempt("plain_bad_shape", plain_run)
    seen["plain_last_error"] = f"{type(lort.last_error()).__name__}: {lort.last_error()}"
    wrapped = open_session(pair("float32"), "pyop")
    attempt("wrapper_bad_shape", lambda: run_session(wrapped, bad))
    attempt("wrapper_bad_rank", lambda: run_session(wrapped, {**f32, "x": f32["x"][0]}))
    attempt("wrapper_good", lambda: run_session(wrapped, f32))
    print("SURVIVED " + json.dumps(seen))
""")


def test_pyop_route_never_aborts():
    proc = subprocess.run([sys.executable, "-c", _SURVIVAL_SCRIPT], check=False,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    line = next(s for s in proc.stdout.splitlines() if s.startswith("SURVIVED "))
    seen = json.loads(line[len("SURVIVED "):])
    assert seen["plain_f16"].startswith("InvalidGraph") and "float16" in seen["plain_f16"]
    assert seen["wrapper_f16"].startswith("TypeError") and "float16" in seen["wrapper_f16"]
    assert seen["cast_f16"] == "ok"
    # a plain session cannot raise from a PyOp: the failing node's outputs are zeros (the
    # forward before it is intact), the error is logged and kept in last_error()
    assert seen["plain_bad_shape"] == "ok"
    assert seen["plain_nonzero_grads"] == [] and seen["plain_forward_ok"]
    assert seen["plain_last_error"].startswith("ValueError") and \
        "h_grad" in seen["plain_last_error"]
    assert proc.stderr.count("lstm_tvm PyOp BlockLSTMGradV2 failed (outputs are zeros): "
                             "ValueError") == 1, proc.stderr[-3000:]  # the plain run's only
    # the wrapper raises the PyOp's own error, naming the input
    assert seen["wrapper_bad_shape"].startswith("ValueError") and "h_grad" in \
        seen["wrapper_bad_shape"]
    assert seen["wrapper_bad_rank"].startswith(("ValueError", "InvalidArgument")), \
        seen["wrapper_bad_rank"]
    assert seen["wrapper_good"] == "ok"


@pytest.mark.parametrize("route", ["pyop", "function"])
def test_weights_stored_as_initializers(route):
    """``initializers=``: ``w`` and ``b`` are in the model, not fed, on every route."""
    attrs = {"use_peephole": True}
    inputs = _pair_inputs("BlockLSTMV2", seq_len_max=T - 1, attrs=attrs, seed=5)
    model = lo.make_forward_backward_model(
        "BlockLSTMV2", "float32", input_size=I, cell_size=H, attrs=attrs,
        with_functions=route == "function", initializers={n: inputs[n] for n in ("w", "b")})
    assert sorted(t.name for t in model.graph.initializer) == ["b", "w"]
    session = open_session(model, route)
    assert {i.name for i in session.get_inputs()}.isdisjoint({"w", "b"})
    _check_pair("BlockLSTMV2", run_session(session, inputs), inputs, attrs)


def test_initializers_are_checked():
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T)

    def model(**initializers):
        return lo.make_model("BlockLSTMV2", input_size=I, cell_size=H,
                             initializers=initializers)

    with pytest.raises(ValueError, match=r"expected inputs among \['w', 'wci', 'wcf', 'wco', "
                                         r"'b'\] \(whose shape has no T or B\), got 'x'"):
        model(x=inputs["x"])
    with pytest.raises(ValueError, match=r"'w' expected float32\[11, 24\], got float32\[10, 24\]"):
        model(w=inputs["w"][1:])
    with pytest.raises(ValueError, match=r"'b' expected float32\[24\], got float64\[24\]"):
        model(b=inputs["b"].astype(np.float64))


def test_compare_routes_smoke(capsys):
    result = ort_routes.compare_routes("LSTMBlockCellGrad", T=1, B=2, I=3, H=4, repeat=1)
    native = {"ort_native", "ort_native_w_init"}
    assert set(result) - native == {"tvm", "raw_ops", "ort_pyop", "ort_function"}
    assert not set(result) & native or set(result) >= native
    assert all(v > 0 for v in result.values())
    assert "ort_pyop" in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
