"""TF graphs -> ONNX through lstm_tvm.convert (tf2onnx + lstm_tvm's handlers), run in onnxruntime.

Truths: TF's own results (the same tf.function run by TF) for the six ops and for a training
step through BlockLSTM; for BlockLSTMV2, whose tape gradient TF 2.21 gets wrong, central finite
differences of the float64 reference forward and tf.raw_ops.BlockLSTMGradV2 called directly.
Each model runs on the function route (plain onnxruntime) and on the TVM-kernel route
(lstm_tvm.onnx.ort PyOps, float32). Converted models are shared per module. Captured
tf.constants and tf.Variables must become initializers holding their values; the command, run as
a child process, must print none of TF's start-up lines (which TF itself prints: seen with -v).
"""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from lstm_tvm import reference, testing
from lstm_tvm.onnx.domain import DOMAIN, IR_VERSION, ONNX_OPSET
from lstm_tvm.registry import OPS, eval_dim

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions")
from _ort_harness import open_session, run_session
from click.testing import CliRunner

from lstm_tvm import convert
from lstm_tvm.cli import main as cli_main
from lstm_tvm.convert import tf_import

T, B, I, H = 5, 3, 4, 6
SEQ = T - 2  # seq_len_max < T: TF leaves padded forward activations undefined
#: Non-default attributes of the peephole node of each forward op (clip active: |cs_prev| <= 2).
ON_ATTRS = {"LSTMBlockCell": {"forget_bias": 0.5, "cell_clip": 1.5},
            "BlockLSTM": {"forget_bias": 0.5, "cell_clip": 1.5},
            "BlockLSTMV2": {"cell_clip": 1.5}}
PARAMS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
#: This module's routes (test ids) and the harness's: the ONNX functions, the TVM kernels' PyOps.
ROUTES = {"functions": "function", "tvm": "pyop"}


def _tol(dtype):
    """Ours vs TF: both carry their own error against the exact result."""
    (r1, a1), (r2, a2) = testing.tolerance(dtype), testing.tf_tolerance(dtype)
    return (r1 + r2, a1 + a2)


def _spec(name, dims, dtype):
    shape = [None if d in ("T", "B") else eval_dim(d, {"I": I, "H": H}) for d in dims]
    return tf.TensorSpec(shape, getattr(tf, dtype), name=name)


def _op_specs(op_name, dtype):
    return [_spec(s.name, s.shape, "int64" if s.dtype == "int64" else dtype)
            for s in OPS[op_name].inputs]


def _run(model, route, inputs):
    return run_session(open_session(model, ROUTES[route]), inputs)


def _tf_call(fn, names, inputs):
    out = fn(*[tf.constant(inputs[n]) for n in names])
    return {k: v.numpy() for k, v in out.items()}


# --- (a) the six ops, each as a tf.function ------------------------------------------------------

def _op_function(op_name):
    """Two nodes of ``op_name`` on the same inputs: ``off_*`` (peephole off, TF's defaults
    otherwise) and ``on_*`` (peephole on, non-default forward attributes)."""
    op = OPS[op_name]
    off_attrs = {"use_peephole": False} if op.direction == "backward" else {}
    on_attrs = {"use_peephole": True, **ON_ATTRS.get(op_name, {})}
    raw = getattr(tf.raw_ops, op_name)

    def fn(*args):
        kwargs = dict(zip(op.input_names, args))
        result = {}
        for tag, attrs in (("off", off_attrs), ("on", on_attrs)):
            outputs = raw(**kwargs, **attrs)
            result.update({f"{tag}_{k}": v for k, v in zip(op.output_names, outputs)})
        return result

    return tf.function(fn)


@pytest.fixture(scope="module")
def op_models():
    """(op, dtype) -> (tf.function, converted model), converted on first use."""
    cache = {}

    def get(op_name, dtype="float32"):
        if (op_name, dtype) not in cache:
            fn = _op_function(op_name)
            cache[op_name, dtype] = fn, convert.from_function(fn, _op_specs(op_name, dtype))
        return cache[op_name, dtype]

    return get


def _op_inputs(op_name, dtype):
    kw = {"T": T, "seq_len_max": SEQ} if OPS[op_name].kind == "sequence" else {}
    return testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, seed=3,
                               attrs={"use_peephole": True}, **kw)


def _check_declared(model, op_name, dtype):
    """Every graph output has the op's dtype and its static dims (I, H, 4H, I+H)."""
    op = OPS[op_name]
    outputs = {o.name: o.type.tensor_type for o in model.graph.output}
    for tag in ("off", "on"):
        for spec in op.outputs:
            tt = outputs[f"{tag}_{spec.name}"]
            assert tt.elem_type == onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            want = [None if d in ("T", "B") else eval_dim(d, {"I": I, "H": H})
                    for d in spec.shape]
            assert dims == want, f"{op_name}.{spec.name}: {dims} != {want}"


def _check_op_outputs(op_name, out, expected, dtype, route):
    op = OPS[op_name]
    seq = SEQ if op.kind == "sequence" else None
    for tag in ("off", "on"):
        for name in op.output_names:
            key = f"{tag}_{name}"
            assert out[key].dtype == np.dtype(dtype), key
            testing.assert_close(out[key], expected[key], dtype, f"{op_name} {route} {key}",
                                 mask=testing.tf_defined_mask(op_name, name, seq, T),
                                 tol=_tol(dtype))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_op_matches_tf(op_models, op_name, route):
    fn, model = op_models(op_name)
    assert [n.op_type for n in model.graph.node if n.domain == DOMAIN] == [op_name] * 2
    assert sorted(f.name for f in model.functions) == [op_name]
    _check_declared(model, op_name, "float32")
    inputs = _op_inputs(op_name, "float32")
    expected = _tf_call(fn, OPS[op_name].input_names, inputs)
    _check_op_outputs(op_name, _run(model, route, inputs), expected, "float32", route)


@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMGradV2"])
def test_float16_function_route_matches_tf(op_models, op_name):
    fn, model = op_models(op_name, "float16")
    _check_declared(model, op_name, "float16")
    inputs = _op_inputs(op_name, "float16")
    expected = _tf_call(fn, OPS[op_name].input_names, inputs)
    _check_op_outputs(op_name, _run(model, "functions", inputs), expected, "float16",
                      "functions")


def test_model_versions_and_attributes(op_models):
    _, model = op_models("BlockLSTM")
    assert model.ir_version == IR_VERSION
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets[""] == ONNX_OPSET and opsets[DOMAIN] == 1
    nodes = [n for n in model.graph.node if n.domain == DOMAIN]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
    assert sorted(attrs, key=lambda a: a["use_peephole"]) == [
        {"forget_bias": 1.0, "cell_clip": 3.0, "use_peephole": 0},
        {"forget_bias": 0.5, "cell_clip": 1.5, "use_peephole": 1}]


# --- (b), (c) training steps through BlockLSTM and BlockLSTMV2 ------------------------------------

def _train_step(fwd_name):
    """Loss and the gradients of every parameter and of ``h_weight`` (which broadcasts, so
    the tape emits BroadcastGradientArgs) by ``tf.GradientTape``."""
    raw = getattr(tf.raw_ops, fwd_name)

    def step(x, cs_prev, h_prev, w, wci, wcf, wco, b, target, h_weight, cs_weight):
        params = [x, cs_prev, h_prev, w, wci, wcf, wco, b, h_weight]
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = raw(seq_len_max=tf.shape(x, out_type=tf.int64)[0], x=x, cs_prev=cs_prev,
                      h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b, use_peephole=True)
            loss = (tf.reduce_mean(tf.square(out.h - target) * h_weight)
                    + tf.reduce_mean(out.cs * cs_weight))
        grads = tape.gradient(loss, params)
        return {"loss": loss, **{f"{n}_grad": g for n, g in zip(PARAMS + ("h_weight",), grads)}}

    return tf.function(step)


TRAIN_NAMES = PARAMS + ("target", "h_weight", "cs_weight")
TRAIN_DIMS = {**{s.name: s.shape for s in OPS["BlockLSTM"].inputs},
              "target": ("T", "B", "H"), "h_weight": ("H",), "cs_weight": ("T", "B", "H")}


def _train_specs():
    return [_spec(n, TRAIN_DIMS[n], "float32") for n in TRAIN_NAMES]


def _train_inputs(fwd_name):
    inputs = testing.make_inputs(fwd_name, B=B, I=I, H=H, T=T, seed=5)
    del inputs["seq_len_max"]
    rng = np.random.default_rng(6)
    for name in ("target", "h_weight", "cs_weight"):
        shape = [eval_dim(d, {"T": T, "B": B, "H": H}) for d in TRAIN_DIMS[name]]
        inputs[name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return inputs


def _loss64(fwd_name, arrays):
    out = reference.run(fwd_name, {"seq_len_max": T, **{n: arrays[n] for n in PARAMS}},
                        {"use_peephole": True})
    return (np.mean((out["h"] - arrays["target"]) ** 2 * arrays["h_weight"])
            + np.mean(out["cs"] * arrays["cs_weight"]))


@pytest.fixture(scope="module")
def train_models():
    cache = {}

    def get(fwd_name, fix=True):
        if (fwd_name, fix) not in cache:
            fn = _train_step(fwd_name)
            cache[fwd_name, fix] = fn, convert.from_function(fn, _train_specs(),
                                                             fix_v2_gradient=fix)
        return cache[fwd_name, fix]

    return get


@pytest.fixture(scope="module")
def v2_truth():
    """BlockLSTMV2 step: inputs, finite-difference gradients of the float64 reference loss,
    and TF's tape result."""
    inputs = _train_inputs("BlockLSTMV2")
    arrays = {k: v.astype(np.float64) for k, v in inputs.items()}
    fd = {f"{n}_grad": testing.fd_gradient(lambda a: _loss64("BlockLSTMV2", a), arrays, n)
          for n in PARAMS + ("h_weight",)}
    fd["loss"] = np.asarray(_loss64("BlockLSTMV2", arrays))
    tape = _tf_call(_train_step("BlockLSTMV2"), TRAIN_NAMES, inputs)
    return inputs, fd, tape


def _direct_v2_grads(inputs):
    """tf.raw_ops.BlockLSTMV2, then tf.raw_ops.BlockLSTMGradV2 called directly with the
    loss's gradients of ``h`` and ``cs`` (computed by hand)."""
    fwd_in = {"seq_len_max": np.int64(T), **{n: inputs[n] for n in PARAMS}}
    fwd = testing.tf_run("BlockLSTMV2", fwd_in, {"use_peephole": True})
    n = T * B * H
    h_grad = 2 * (fwd["h"] - inputs["target"]) * inputs["h_weight"] / n
    cs_grad = inputs["cs_weight"] / n
    grads = testing.tf_run("BlockLSTMGradV2", {**fwd_in, **fwd, "h_grad": h_grad,
                                               "cs_grad": cs_grad}, {"use_peephole": True})
    return {k: v for k, v in grads.items() if k in {f"{p}_grad" for p in PARAMS}}


@pytest.mark.parametrize("route", ROUTES)
def test_block_lstm_training_step_matches_tf(train_models, route):
    fn, model = train_models("BlockLSTM")
    assert sorted(f.name for f in model.functions) == ["BlockLSTM", "BlockLSTMGrad"]
    assert convert.METADATA_GRADIENT_FIXES not in {p.key for p in model.metadata_props}
    inputs = _train_inputs("BlockLSTM")
    expected = _tf_call(fn, TRAIN_NAMES, inputs)
    out = _run(model, route, inputs)
    assert set(out) == set(expected)
    for name, value in expected.items():
        testing.assert_close(out[name], value, "float32", f"{route} {name}", tol=_tol("float32"))


def test_tf_tape_gradient_through_block_lstm_v2_is_wrong(v2_truth):
    """TF 2.21's bug: the tape uses BlockLSTM's gradient (ICFO) for BlockLSTMV2 (IFCO).
    Calling BlockLSTMGradV2 directly gives the finite-difference gradients; the tape does not."""
    inputs, fd, tape = v2_truth
    testing.assert_close(tape["loss"], fd["loss"], "float32", "loss", tol=_tol("float32"))
    direct = _direct_v2_grads(inputs)
    for name, value in direct.items():
        testing.assert_close(value, fd[name], "float32", f"direct {name}")
    for name in ("w_grad", "b_grad", "x_grad"):
        err = np.abs(tape[name] - fd[name]).max()
        assert err > 0.1 * np.abs(fd[name]).max(), f"tape {name} is right now (error {err:g})"


@pytest.mark.parametrize("route", ROUTES)
def test_block_lstm_v2_training_step_gets_correct_gradients(train_models, v2_truth, route):
    _, model = train_models("BlockLSTMV2")
    ops = sorted(n.op_type for n in model.graph.node if n.domain == DOMAIN)
    assert ops == ["BlockLSTMGradV2", "BlockLSTMV2"]
    fixes = json.loads(next(p.value for p in model.metadata_props
                            if p.key == convert.METADATA_GRADIENT_FIXES))
    assert [f["forward"] for f in fixes] == ["BlockLSTMV2"]
    inputs, fd, tape = v2_truth
    out = _run(model, route, inputs)
    direct = _direct_v2_grads(inputs)
    for name, value in fd.items():
        testing.assert_close(out[name], value, "float32", f"{route} {name} vs FD")
        if name in direct:
            testing.assert_close(out[name], direct[name], "float32", f"{route} {name} vs direct",
                                 tol=_tol("float32"))
    assert np.abs(out["w_grad"] - tape["w_grad"]).max() > 0.1 * np.abs(fd["w_grad"]).max()


def test_v2_gradient_fix_is_logged_and_can_be_turned_off(train_models, v2_truth, caplog):
    with caplog.at_level("WARNING", logger="lstm_tvm.convert"):
        convert.from_function(_train_step("BlockLSTMV2"), _train_specs())
    assert "converted as BlockLSTMGradV2" in caplog.text
    _, model = train_models("BlockLSTMV2", fix=False)
    ops = sorted(n.op_type for n in model.graph.node if n.domain == DOMAIN)
    assert ops == ["BlockLSTMGrad", "BlockLSTMV2"]
    inputs, _, tape = v2_truth
    out = _run(model, "functions", inputs)  # TF's graph as it is: TF's (wrong) gradients
    for name, value in tape.items():
        testing.assert_close(out[name], value, "float32", name, tol=_tol("float32"))


# --- (d) the command line ------------------------------------------------------------------------

class _Trainer(tf.Module):
    """A BlockLSTMV2 with weights in variables; its signature returns h, the loss and the
    gradients of the weights (through the tape, i.e. TF's wrong gradient op)."""

    def __init__(self, inputs):
        super().__init__()
        self.w = tf.Variable(inputs["w"])
        self.b = tf.Variable(inputs["b"])

    @tf.function(input_signature=[_spec("x", ("T", "B", "I"), "float32"),
                                  _spec("target", ("T", "B", "H"), "float32")])
    def train(self, x, target):
        batch = tf.shape(x)[1]
        zeros_bh, zeros_h = tf.zeros(tf.stack([batch, H])), tf.zeros([H])
        with tf.GradientTape() as tape:
            out = tf.raw_ops.BlockLSTMV2(
                seq_len_max=tf.shape(x, out_type=tf.int64)[0], x=x, cs_prev=zeros_bh,
                h_prev=zeros_bh, w=self.w, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=self.b)
            loss = tf.reduce_mean(tf.square(out.h - target))
        w_grad, b_grad = tape.gradient(loss, [self.w, self.b])
        return {"h": out.h, "loss": loss, "w_grad": w_grad, "b_grad": b_grad}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    inputs = _train_inputs("BlockLSTMV2")
    inputs["cs_prev"] = inputs["h_prev"] = np.zeros((B, H), np.float32)
    for p in ("wci", "wcf", "wco"):
        inputs[p] = np.zeros(H, np.float32)
    module = _Trainer(inputs)
    path = tmp_path_factory.mktemp("saved") / "trainer"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.train})
    expected = {k: v.numpy() for k, v in module.train(inputs["x"], inputs["target"]).items()}
    return path, inputs, expected


def test_cli_converts_saved_model(saved_model, tmp_path):
    path, inputs, expected = saved_model
    out_path = tmp_path / "trainer.onnx"
    result = CliRunner().invoke(cli_main, ["convert", "--saved-model", str(path),
                                           "--output", str(out_path)])
    assert result.exit_code == 0, result.output
    assert "converted as BlockLSTMGradV2" in result.output
    assert f"wrote {out_path}" in result.output
    model = onnx.load(str(out_path))
    assert sorted(f.name for f in model.functions) == ["BlockLSTMGradV2", "BlockLSTMV2"]
    out = _run(model, "functions", inputs)
    for name in ("h", "loss"):
        testing.assert_close(out[name], expected[name], "float32", name, tol=_tol("float32"))
    n = T * B * H
    h_grad = 2 * (out["h"] - inputs["target"]) / n
    fwd_in = {"seq_len_max": np.int64(T), **{p: inputs[p] for p in PARAMS}}
    fwd = testing.tf_run("BlockLSTMV2", fwd_in)
    direct = testing.tf_run("BlockLSTMGradV2", {**fwd_in, **fwd, "h_grad": h_grad,
                                                "cs_grad": np.zeros_like(h_grad)},
                            {"use_peephole": False})
    for name in ("w_grad", "b_grad"):
        testing.assert_close(out[name], direct[name], "float32", name, tol=_tol("float32"))


def test_cli_no_functions_runs_on_tvm_kernels(saved_model, tmp_path):
    path, inputs, expected = saved_model
    out_path = tmp_path / "trainer.onnx"
    result = CliRunner().invoke(cli_main, ["convert", "--saved-model", str(path), "-o",
                                           str(out_path), "--no-functions", "--opset", "18"])
    assert result.exit_code == 0, result.output
    model = onnx.load(str(out_path))
    assert not model.functions
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    out = _run(model, "tvm", inputs)
    testing.assert_close(out["h"], expected["h"], "float32", "h", tol=_tol("float32"))


def test_cli_errors(saved_model, tmp_path, monkeypatch):
    path = saved_model[0]
    runner = CliRunner()
    base = ["convert", "--saved-model", str(path), "-o", str(tmp_path / "m.onnx")]
    result = runner.invoke(cli_main, base + ["--signature", "nope"])
    assert result.exit_code != 0
    assert "'nope'" in result.output and "serving_default" in result.output
    result = runner.invoke(cli_main, base + ["--opset", "23"])
    assert result.exit_code != 0 and "--opset" in result.output and "21..22" in result.output
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    result = runner.invoke(cli_main, base)
    assert result.exit_code != 0 and 'pip install -e ".[convert]"' in result.output
    assert not (tmp_path / "m.onnx").exists()


# --- (e) clear errors ----------------------------------------------------------------------------

def _v2_function(**attrs):
    def fn(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = tf.raw_ops.BlockLSTMV2(seq_len_max=seq_len_max, x=x, cs_prev=cs_prev,
                                     h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b, **attrs)
        return {"h": out.h}

    return tf.function(fn)


def test_wrong_weight_shape_names_node_and_input():
    specs = _op_specs("BlockLSTMV2", "float32")
    specs[4] = tf.TensorSpec([I + H + 1, 4 * H], tf.float32, name="w")
    with pytest.raises(convert.ConversionError,
                       match=r"node 'BlockLSTMV2' \(BlockLSTMV2\): input 'w' has shape "
                             r"\(11, 24\), expected \(I\+H, 4H\) with I\+H = 10"):
        convert.from_function(_v2_function(), specs)


@pytest.mark.parametrize("route", ROUTES)
def test_infinite_cell_clip_converts_like_tf(route):
    """TF takes ``cell_clip=inf`` (no clipping): the node gets 0 (no clipping either) and the
    model computes TF's ``h`` on cell states past the default clip of 3."""
    fn = _v2_function(cell_clip=float("inf"), use_peephole=True)
    model = convert.from_function(fn, _op_specs("BlockLSTMV2", "float32"))
    node = next(n for n in model.graph.node if n.domain == DOMAIN)
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {
        "cell_clip": 0.0, "use_peephole": 1}
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T, seed=3, scale=3.0)
    tf_cs = tf.raw_ops.BlockLSTMV2(**{k: tf.constant(v) for k, v in inputs.items()},
                                   cell_clip=float("inf"), use_peephole=True).cs.numpy()
    assert np.abs(tf_cs).max() > 3.5, "no |cs| a clip would cut"
    expected = _tf_call(fn, OPS["BlockLSTMV2"].input_names, inputs)
    got = _run(model, route, inputs)
    testing.assert_close(got["h"], expected["h"], "float32", f"{route} h", tol=_tol("float32"))


def test_unsupported_tf_op_names_node():
    @tf.function
    def gru(x, h_prev, w_ru, w_c, b_ru, b_c):
        return {"h": tf.raw_ops.GRUBlockCell(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                                             b_c=b_c).h}

    specs = [tf.TensorSpec(s, tf.float32) for s in
             ([None, I], [None, H], [I + H, 2 * H], [I + H, H], [2 * H], [H])]
    with pytest.raises(convert.ConversionError, match=r"'GRUBlockCell' \(GRUBlockCell\)"):
        convert.from_function(gru, specs)


def test_bad_arguments():
    specs = _op_specs("BlockLSTMV2", "float32")
    with pytest.raises(ValueError, match=r"opset: expected an int in 21\.\.22"):
        convert.from_function(_v2_function(), specs, opset=18)
    with pytest.raises(ValueError, match=r"opset: expected an int in 13\.\.26"):
        convert.from_function(_v2_function(), specs, opset=27, attach_functions=False)
    with pytest.raises(TypeError, match="custom_op_handlers.*BlockLSTMV2"):
        convert.from_function(_v2_function(), specs,
                              custom_op_handlers={"BlockLSTMV2": (lambda *a: None, [])})
    with pytest.raises(FileNotFoundError, match="saved_model.pb"):
        convert.from_saved_model("/nonexistent/model")
    weights = tf.constant(np.ones((I + H, 4 * H), np.float32))
    with pytest.raises(ValueError, match="input_signature: expected at least one tensor"):
        convert.from_function(tf.function(lambda: {"w": weights * 2}), [])


def test_missing_dependencies_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    with pytest.raises(ImportError, match=r'tf2onnx.*pip install -e "\.\[convert\]"'):
        convert.from_function(_v2_function(), _op_specs("BlockLSTMV2", "float32"))


def test_from_graph_def_matches_tf():
    fn = _v2_function(use_peephole=True)
    concrete = fn.get_concrete_function(*_op_specs("BlockLSTMV2", "float32"))
    names = [t.name for t in concrete.inputs]
    model = convert.from_graph_def(concrete.graph.as_graph_def(), names,
                                   [concrete.outputs[0].name])
    inputs = _op_inputs("BlockLSTMV2", "float32")
    op_inputs = (inputs[k] for k in OPS["BlockLSTMV2"].input_names)
    out = _run(model, "functions", dict(zip(names, op_inputs)))  # tensor names: "x:0", ...
    expected = _tf_call(fn, OPS["BlockLSTMV2"].input_names, inputs)["h"]
    testing.assert_close(next(iter(out.values())), expected, "float32", "h",
                         tol=_tol("float32"))


def test_constant_seq_len_max():
    @tf.function
    def fn(x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = tf.raw_ops.BlockLSTM(seq_len_max=tf.constant(SEQ, tf.int64), x=x, cs_prev=cs_prev,
                                   h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b)
        return {"cs": out.cs, "h": out.h}

    model = convert.from_function(fn, _op_specs("BlockLSTM", "float32")[1:])
    assert [i.name for i in model.graph.input] == list(PARAMS)
    inputs = _op_inputs("BlockLSTM", "float32")
    expected = _tf_call(fn, PARAMS, inputs)
    for route in ROUTES:
        out = _run(model, route, inputs)
        for name in ("cs", "h"):
            testing.assert_close(out[name], expected[name], "float32", f"{route} {name}",
                                 tol=_tol("float32"))


# --- (f) captured tensors and variables become initializers --------------------------------------

WEIGHTS = ("w", "wci", "wcf", "wco", "b")
ARGS = ("x", "cs_prev", "h_prev")


def _captured_block_lstm(arrays, variables):
    """A tf.function of ``(x, cs_prev, h_prev)`` running BlockLSTM (peephole on, non-default
    attributes) on weights it captures: ``tf.Variable`` for the names in ``variables``,
    ``tf.constant`` for the others."""
    captured = {n: tf.Variable(arrays[n]) if n in variables else tf.constant(arrays[n])
                for n in WEIGHTS}

    @tf.function
    def fn(x, cs_prev, h_prev):
        out = tf.raw_ops.BlockLSTM(seq_len_max=tf.shape(x, out_type=tf.int64)[0], x=x,
                                   cs_prev=cs_prev, h_prev=h_prev, use_peephole=True,
                                   **ON_ATTRS["BlockLSTM"], **captured)
        return {"cs": out.cs, "h": out.h}

    return fn


def _check_weights_frozen(model, arrays):
    """The BlockLSTM node reads each weight from an initializer holding its exact value."""
    node = next(n for n in model.graph.node if n.op_type == "BlockLSTM")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    fed = dict(zip(OPS["BlockLSTM"].input_names, node.input))
    for name in WEIGHTS:
        assert fed[name] in inits, f"{name}: {fed[name]!r} is not an initializer"
        np.testing.assert_array_equal(inits[fed[name]], arrays[name], err_msg=name)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("variables", [(), ("w", "b")], ids=["constants", "mixed"])
def test_captured_weights_become_initializers(variables, route):
    """Before, tf2onnx made each captured tf.constant a graph input ("Required inputs ...
    missing" in onnxruntime); now the arguments alone are inputs and TF's results come out."""
    arrays = testing.make_inputs("BlockLSTM", B=B, I=I, H=H, T=T, seed=7,
                                 attrs={"use_peephole": True})
    fn = _captured_block_lstm(arrays, variables)
    specs = [_spec(n, s.shape, "float32") for n in ARGS
             for s in OPS["BlockLSTM"].inputs if s.name == n]
    model = convert.from_function(fn, specs)
    assert [i.name for i in model.graph.input] == list(ARGS)
    _check_weights_frozen(model, arrays)
    expected = _tf_call(fn, ARGS, arrays)
    out = _run(model, route, arrays)
    for name in ("cs", "h"):
        testing.assert_close(out[name], expected[name], "float32", f"{route} {name}",
                             tol=_tol("float32"))


def test_captured_resource_that_is_not_a_variable_is_named():
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant([1, 2], tf.int64),
                                            tf.constant([0.5, 2.0])), default_value=1.0)

    @tf.function
    def scaled(x, keys):
        return {"y": x * table.lookup(keys)}

    specs = [tf.TensorSpec([None], tf.float32, name="x"),
             tf.TensorSpec([None], tf.int64, name="keys")]
    with pytest.raises(convert.ConversionError,
                       match=r"scaled: captured '[^']*table_handle' \(a resource, not a "
                             r"tf\.Variable\) cannot be frozen"):
        convert.from_function(scaled, specs)


# --- (g) TF's start-up lines, in child processes ------------------------------------------------

#: What TF 2.21 prints while it loads (CPU and CUDA builds), in the words of its messages.
TF_STARTUP_MARKERS = ("oneDNN custom operations are on", "absl::InitializeLog()",
                      "This TensorFlow binary is optimized", "Unable to register cuDNN factory",
                      "Unable to register cuBLAS factory", "TF-TRT Warning")


def _startup_lines(stderr):
    return [line for line in stderr.splitlines() if any(m in line for m in TF_STARTUP_MARKERS)]


def _child(args, *, tf_log_level=None, code=None):
    """``lstm-tvm convert <args>`` (or the Python ``code``) in a child process, with
    ``TF_CPP_MIN_LOG_LEVEL`` unset unless ``tf_log_level``."""
    env = {k: v for k, v in os.environ.items() if k != tf_import.LOG_LEVEL_VAR}
    if tf_log_level is not None:
        env[tf_import.LOG_LEVEL_VAR] = tf_log_level
    code = code or "from lstm_tvm.cli import main; main(prog_name='lstm-tvm')"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=300)


class _CapturingModule(tf.Module):
    """BlockLSTM whose ``w`` is a variable and whose other weights are captured constants."""

    def __init__(self, arrays):
        super().__init__()
        self.w = tf.Variable(arrays["w"])
        self.consts = {n: tf.constant(arrays[n]) for n in WEIGHTS if n != "w"}

    @tf.function(input_signature=[_spec("x", ("T", "B", "I"), "float32")])
    def run(self, x):
        zeros = tf.zeros(tf.stack([tf.shape(x)[1], H]))
        out = tf.raw_ops.BlockLSTM(seq_len_max=tf.shape(x, out_type=tf.int64)[0], x=x,
                                   cs_prev=zeros, h_prev=zeros, w=self.w, use_peephole=True,
                                   **self.consts)
        return {"h": out.h}


@pytest.fixture(scope="module")
def capturing_saved_model(tmp_path_factory):
    arrays = testing.make_inputs("BlockLSTM", B=B, I=I, H=H, T=T, seed=8)
    module = _CapturingModule(arrays)
    path = tmp_path_factory.mktemp("capturing") / "model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.run})
    return path, arrays, module.run(tf.constant(arrays["x"]))["h"].numpy()


def test_cli_prints_no_tf_startup_lines(capturing_saved_model, tmp_path):
    path, arrays, expected = capturing_saved_model
    out_path = tmp_path / "model.onnx"
    done = _child(["convert", "--saved-model", str(path), "-o", str(out_path)])
    assert done.returncode == 0, done.stderr
    assert not _startup_lines(done.stderr), done.stderr
    assert all(line.startswith("lstm-tvm convert: ") for line in done.stderr.splitlines()), \
        done.stderr
    assert "inputs: x\noutputs: h\n" in done.stdout
    model = onnx.load(str(out_path))
    assert [i.name for i in model.graph.input] == ["x"]
    _check_weights_frozen(model, arrays)
    testing.assert_close(_run(model, "tvm", arrays)["h"], expected, "float32", "h",
                         tol=_tol("float32"))


def test_cli_verbose_shows_tf_and_tf2onnx_logging(capturing_saved_model, tmp_path):
    """TF does print start-up lines here (so the test above can fail); -v keeps them."""
    done = _child(["convert", "--saved-model", str(capturing_saved_model[0]), "-o",
                   str(tmp_path / "model.onnx"), "-v"])
    assert done.returncode == 0, done.stderr
    assert _startup_lines(done.stderr), done.stderr
    assert "lstm-tvm convert: tf2onnx." in done.stderr


def test_cli_keeps_the_users_tf_log_level(capturing_saved_model, tmp_path):
    """TF_CPP_MIN_LOG_LEVEL=0 set by the user: TF's INFO lines of the conversion (grappler's
    sessions) show, its start-up lines still do not."""
    done = _child(["convert", "--saved-model", str(capturing_saved_model[0]), "-o",
                   str(tmp_path / "model.onnx")], tf_log_level="0")
    assert done.returncode == 0, done.stderr
    assert "Starting new session" in done.stderr
    assert not _startup_lines(done.stderr), done.stderr


def test_cli_bad_input_shows_the_error_only(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"\x0a\xff\xff not a proto")
    done = _child(["convert", "--saved-model", str(folder), "-o", str(tmp_path / "m.onnx")])
    assert done.returncode == 1, done.stderr
    assert not _startup_lines(done.stderr), done.stderr
    assert "Error: saved model: expected a SavedModel proto in" in done.stderr
    assert str(folder / "saved_model.pb") in done.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_api_import_sets_level_when_unset(capturing_saved_model):
    """lstm_tvm.convert importing TF: no start-up lines, TF_CPP_MIN_LOG_LEVEL unset before,
    1 (INFO off) after (tf2onnx's import sets 3: errors off)."""
    code = ("import os, sys; from lstm_tvm import convert; "
            "convert.from_saved_model(sys.argv[1]); "
            "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))")
    done = _child([str(capturing_saved_model[0])], code=code)
    assert done.returncode == 0, done.stderr
    assert not _startup_lines(done.stderr), done.stderr
    assert done.stdout.strip() == "1"


def test_startup_line_filter_keeps_other_lines(capfd):
    noise = ("I0000 00:00:1.1 7 port.cc:153] oneDNN custom operations are on. You may see ...\n"
             "E0000 00:00:1.2 7 cuda_dnn.cc:8579] Unable to register cuDNN factory: ...\n")
    real = "E0000 00:00:1.3 7 loader.cc:12] Could not open file: No such file\n"
    with tf_import.filter_startup_lines():
        os.write(2, (noise + real).encode())
    assert capfd.readouterr().err == real
    with pytest.raises(RuntimeError), tf_import.filter_startup_lines():
        os.write(2, noise.encode())
        raise RuntimeError("import failed")
    assert capfd.readouterr().err == noise  # a failed import shows everything
