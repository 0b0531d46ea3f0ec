"""ONNX -> Relax import (``lstm_tvm.relax.from_onnx``), compiled with ``tvm.compile`` and run on
Relax's VM, against independent truths.

Truths: ONNX ``LSTM`` against onnxruntime's own LSTM kernel (``layout = 1``, which onnxruntime
refuses, against its time-major twin model with transposed inputs and outputs); lstm_tvm's
custom ops against the float64 NumPy reference (:mod:`lstm_tvm.reference`), one custom-op
model holding standard ops against onnxruntime running the op's ONNX function, and tf.functions
converted by :mod:`lstm_tvm.convert` (the README's flow) against the same tf.function run by TF.

Tolerances: against the float64 reference, the dtype's row of :data:`lstm_tvm.testing.TOLERANCE`
(the kernels' own bound). Against onnxruntime, whose float32 LSTM is itself a float32 result,
the sum of two float32 rows (each side within one row of the exact value; measured differences
here are ~1e-7). float16 imports are compared with onnxruntime's float32 LSTM on the same
float16-rounded values: the float16 row (the kernel, plus the import's single float16 rounding
of ``Wb + Rb``, <= 0.5 ulp of a bias ~0.5) plus the float32 row.
Against TF (float32), our row plus TF's (:func:`lstm_tvm.testing.tf_tolerance`): each side is
within its own row of the exact value.
"""

import functools
import re
import shutil

import numpy as np
import onnx
import pytest
import tvm
import tvm.testing
from _ort_harness import open_session, run_session
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.error import OpAttributeInvalid, OpAttributeUnImplemented, OpNotImplemented

from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.registry import OPS, eval_dim
from lstm_tvm.relax import from_onnx

pytest.importorskip("onnxruntime", reason="onnxruntime is the truth for ONNX LSTM")

T, B, I, H = 5, 3, 4, 6
#: A second (T, B) run by the same compiled module: T and B are symbolic.
T2, B2 = 2, 1
OPSET = 21
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
        "float64": TensorProto.DOUBLE}


def _ort_tol(dtype):
    (r16, a16), (r32, a32) = testing.tolerance(dtype), testing.tolerance("float32")
    return (r16 + r32, a16 + a32)


# --- ONNX LSTM models ---------------------------------------------------------------------

def _lstm_weights(D, dtype, peephole, seed):
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(I + H)
    w = {"W": rng.uniform(-scale, scale, (D, 4 * H, I)),
         "R": rng.uniform(-scale, scale, (D, 4 * H, H)),
         "B": rng.uniform(-0.5, 0.5, (D, 8 * H))}
    if peephole:
        w["P"] = rng.uniform(-0.5, 0.5, (D, 3 * H))
    return {k: v.astype(dtype) for k, v in w.items()}


def lstm_model(direction="forward", layout=0, peephole=False, lengths=False, initial=True,
               weights_as_inputs=False, dtype="float32", opset=OPSET, seed=0, name="lstm",
               **attrs):
    """``(model, weights)``: one LSTM node named ``name``, ``T`` and ``B`` symbolic, weights as
    initializers (or graph inputs), graph outputs Y, Y_h, Y_c."""
    D = 2 if direction == "bidirectional" else 1
    weights = _lstm_weights(D, dtype, peephole, seed)
    elem = ELEM[dtype]
    x_dims = ["B", "T", I] if layout else ["T", "B", I]
    s_dims = ["B", D, H] if layout else [D, "B", H]
    inputs = [helper.make_tensor_value_info("X", elem, x_dims)]
    if lengths:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["B"]))
    if initial:
        inputs += [helper.make_tensor_value_info(n, elem, s_dims)
                   for n in ("initial_h", "initial_c")]
    initializers = []
    for key, value in weights.items():
        if weights_as_inputs:
            inputs.append(helper.make_tensor_value_info(key, elem, list(value.shape)))
        else:
            initializers.append(numpy_helper.from_array(value, key))
    node_inputs = ["X", "W", "R", "B", "sequence_lens" if lengths else "",
                   "initial_h" if initial else "", "initial_c" if initial else "",
                   "P" if peephole else ""]
    if layout:
        attrs["layout"] = layout
    node = helper.make_node("LSTM", node_inputs, ["Y", "Y_h", "Y_c"], name=name,
                            direction=direction, hidden_size=H, **attrs)
    y_dims = ["B", "T", D, H] if layout else ["T", D, "B", H]
    outputs = [helper.make_tensor_value_info("Y", elem, y_dims)] + [
        helper.make_tensor_value_info(n, elem, s_dims) for n in ("Y_h", "Y_c")]
    graph = helper.make_graph([node], "lstm", inputs, outputs, initializers)
    return _model(graph, opset), weights


def _model(graph, opset=OPSET, domains=()):
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=lo.IR_VERSION)


def lstm_feeds(model, weights, steps=T, batch=B, seed=1):
    """Random values of ``model``'s graph inputs (weights from ``weights``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.name in weights:
            feeds[value.name] = weights[value.name]
            continue
        dims = [{"T": steps, "B": batch}.get(d.dim_param, d.dim_value)
                for d in value.type.tensor_type.shape.dim]
        if value.name == "sequence_lens":
            lens = [steps, max(1, steps - 3), 0] + [steps] * batch
            feeds[value.name] = np.array(lens[:batch], np.int32)
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feeds[value.name] = rng.uniform(-1, 1, dims).astype(dtype)
    return feeds


@functools.cache
def _vm(model_bytes, **kw):
    model = onnx.load_from_string(model_bytes)
    mod = from_onnx(model, **kw)
    return mod, relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def compiled(model, **kw):
    """``(IRModule, VirtualMachine)`` of ``model`` imported with ``from_onnx(**kw)`` (cached)."""
    return _vm(model.SerializeToString(), **kw)


def vm_run(vm, model, feeds, params=()):
    """The VM's outputs in graph output order, as NumPy arrays."""
    args = [tvm.runtime.tensor(feeds[v.name]) for v in model.graph.input if v.name in feeds]
    out = vm["main"](*args, *params)
    out = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return [o.numpy() for o in out]


def ort_run(model, feeds):
    """onnxruntime's outputs of ``model`` in graph output order (``feeds`` may hold more)."""
    return list(run_session(open_session(model), feeds).values())


def ort_lstm_truth(direction, layout, peephole, lengths, initial, feeds, dtype):
    """onnxruntime's float32 LSTM on ``feeds`` (``layout = 1``: through the time-major twin)."""
    twin, _ = lstm_model(direction, 0, peephole, lengths, initial, weights_as_inputs=True)
    feeds = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}
    if layout:
        feeds = {k: np.swapaxes(v, 0, 1) if k in ("X", "initial_h", "initial_c") else v
                 for k, v in feeds.items()}
    y, y_h, y_c = ort_run(twin, feeds)
    if layout:
        return [np.transpose(y, (2, 0, 1, 3)), np.swapaxes(y_h, 0, 1), np.swapaxes(y_c, 0, 1)]
    return [y, y_h, y_c]


def check_lstm(case, dtype="float32", sizes=((T, B),), **kw):
    model, weights = lstm_model(dtype=dtype, **case)
    _, vm = compiled(model, **kw)
    params = ()
    if kw.get("keep_params_in_input"):
        params = [tvm.runtime.tensor(weights[k]) for k in weights]
    for steps, batch in sizes:
        feeds = lstm_feeds(model, weights, steps, batch)
        got = vm_run(vm, model, feeds, params)
        want = ort_lstm_truth(case.get("direction", "forward"), case.get("layout", 0),
                              case.get("peephole", False), case.get("lengths", False),
                              case.get("initial", True), {**weights, **feeds}, dtype)
        for name, g, w in zip(("Y", "Y_h", "Y_c"), got, want):
            assert g.dtype == np.dtype(dtype), name
            testing.assert_close(g, w, dtype, f"LSTM {case} {name} T={steps} B={batch}",
                                 tol=_ort_tol(dtype))


LSTM_CASES = {
    "forward": {},
    "peephole": {"peephole": True},
    "reverse": {"direction": "reverse", "peephole": True},
    "bidirectional": {"direction": "bidirectional", "peephole": True},
    "no-initial-states": {"initial": False},
    "lengths": {"lengths": True},
    "lengths-reverse": {"direction": "reverse", "lengths": True},
    "lengths-bidirectional": {"direction": "bidirectional", "lengths": True, "initial": False},
    "layout1": {"layout": 1, "peephole": True},
    "layout1-bidirectional-lengths": {"direction": "bidirectional", "layout": 1,
                                      "lengths": True},
}


@pytest.mark.parametrize("case", LSTM_CASES.values(), ids=LSTM_CASES.keys())
def test_lstm_matches_onnxruntime(case):
    """Every direction, layout, peepholes, per-row lengths (one row of length 0) and omitted
    initial states, each compiled once and run at two (T, B)."""
    check_lstm(case, sizes=((T, B), (T2, B2)))


@pytest.mark.parametrize("opset", [13, 22])
def test_lstm_other_opsets(opset):
    """LSTM-7 semantics (opset 13, no ``layout``) and LSTM-22 import alike."""
    check_lstm({"direction": "bidirectional", "opset": opset})


def test_lstm_float16():
    check_lstm({"direction": "bidirectional", "peephole": True, "lengths": True},
               dtype="float16")


@pytest.mark.parametrize("keep_params", [False, True], ids=["weights-inputs", "keep-params"])
def test_lstm_weights_not_constant(keep_params):
    """Weights that are not constants are re-laid out by Relax ops at run time (graph inputs,
    or initializers kept as parameters); constant ones are folded at import."""
    case = {"direction": "bidirectional", "peephole": True, "weights_as_inputs": not keep_params}
    check_lstm(case, keep_params_in_input=keep_params)
    mod, _ = compiled(lstm_model(**case)[0], keep_params_in_input=keep_params)
    assert "R.concat" in mod["main"].script()
    folded, _ = compiled(lstm_model(direction="bidirectional", peephole=True)[0])
    assert "R.concat" not in folded["main"].script()


def test_lstm_in_a_larger_model():
    """Two stacked LSTMs (sharing one kernel) -> Squeeze -> MatMul -> Add: the standard ops go
    through TVM's converters; the result matches onnxruntime."""
    rng = np.random.default_rng(3)
    w1, w2 = _lstm_weights(1, "float32", True, 4), _lstm_weights(1, "float32", True, 5)
    for w in (w1, w2):  # I = H: both layers use one kernel
        w["W"] = rng.uniform(-0.4, 0.4, (1, 4 * H, H)).astype(np.float32)
    proj = rng.uniform(-1, 1, (H, 2)).astype(np.float32)
    bias = rng.uniform(-1, 1, (2,)).astype(np.float32)
    axis1 = np.array([1], np.int64)
    inits = [numpy_helper.from_array(v, f"{k}{n}") for n, w in ((1, w1), (2, w2))
             for k, v in w.items()]
    inits += [numpy_helper.from_array(v, k) for k, v in
              (("proj", proj), ("bias", bias), ("axis1", axis1), ("axis0", axis1 - 1))]
    nodes = [
        helper.make_node("LSTM", ["X", "W1", "R1", "B1", "", "", "", "P1"], ["Y1"],
                         name="layer1", hidden_size=H),
        helper.make_node("Squeeze", ["Y1", "axis1"], ["X2"]),
        helper.make_node("MatMul", ["X2", "proj_in"], ["X2p"]),
        helper.make_node("LSTM", ["X2p", "W2", "R2", "B2", "", "", "", "P2"], ["", "Y_h"],
                         name="layer2", hidden_size=H),
        helper.make_node("Squeeze", ["Y_h", "axis0"], ["h"]),
        helper.make_node("MatMul", ["h", "proj"], ["hp"]),
        helper.make_node("Add", ["hp", "bias"], ["out"]),
    ]
    eye = numpy_helper.from_array(np.eye(H, dtype=np.float32) * 0.9, "proj_in")
    graph = helper.make_graph(
        nodes, "stack", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", H])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 2])], inits + [eye])
    model = _model(graph)
    mod, vm = compiled(model)
    script = mod["main"].script()
    assert script.count("lstm_tvm_BlockLSTM_float32_i6_h6") == 2
    assert "R.matmul" in script and "R.add" in script
    kernels = [gv.name_hint for gv in mod.get_global_vars() if "BlockLSTM" in gv.name_hint]
    assert len(kernels) == 1, kernels
    for steps, batch in ((T, B), (T2, B2)):
        feeds = {"X": np.random.default_rng(steps).uniform(-1, 1, (steps, batch, H))
                 .astype(np.float32)}
        (got,), (want,) = vm_run(vm, model, feeds), ort_run(model, feeds)
        testing.assert_close(got, want, "float32", f"stacked out T={steps}",
                             tol=_ort_tol("float32"))


def test_lstm_inside_if_branches():
    """LSTM nodes of If branches (converted by TVM's subgraph walk) use the kernel too."""
    branches = {}
    for tag, direction in (("then", "forward"), ("else", "reverse")):
        model, weights = lstm_model(direction=direction, name=f"{tag}_lstm", seed=len(tag))
        node = model.graph.node[0]
        node.input[:] = ["X", *(f"{k}_{tag}" for k in ("W", "R", "B"))]
        node.output[:] = ["", f"Y_h_{tag}"]
        branches[f"{tag}_branch"] = helper.make_graph(
            [node], tag, [], [helper.make_tensor_value_info(f"Y_h_{tag}", TensorProto.FLOAT,
                                                            [1, "B", H])],
            [numpy_helper.from_array(v, f"{k}_{tag}") for k, v in weights.items()])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["out"], **branches)], "if",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", I])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "B", H])])
    model = _model(graph)
    _, vm = compiled(model)
    x = np.random.default_rng(0).uniform(-1, 1, (T, B, I)).astype(np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "X": x}
        (got,), (want,) = vm_run(vm, model, feeds), ort_run(model, feeds)
        testing.assert_close(got, want, "float32", f"If({cond})", tol=_ort_tol("float32"))


# --- lstm_tvm's custom ops ---------------------------------------------------------------

def _custom_attrs(op_name, use_peephole):
    """Every attribute of the op's forward: non-default forget_bias and an active cell_clip."""
    fwd = OPS[op_name] if OPS[op_name].direction == "forward" else OPS[OPS[op_name].pair]
    attrs = {"use_peephole": use_peephole, "cell_clip": 0.8}
    if "forget_bias" in fwd.attr_names:
        attrs["forget_bias"] = 0.3
    return attrs


def check_custom_op(op_name, dtype, use_peephole):
    attrs = _custom_attrs(op_name, use_peephole)
    op = OPS[op_name]
    model = lo.make_model(op_name, dtype, input_size=I, cell_size=H,
                          attrs=testing.op_attrs(op_name, attrs))
    _, vm = compiled(model)
    runs = ((T, B, 3), (T2, B2, T2)) if op.kind == "sequence" else ((None, B, None),
                                                                     (None, B2, None))
    for steps, batch, seq_len_max in runs:
        kw = {} if steps is None else {"T": steps, "seq_len_max": seq_len_max}
        inputs = testing.make_inputs(op_name, dtype=dtype, B=batch, I=I, H=H, attrs=attrs,
                                     seed=batch, **kw)
        ref = reference.run(op_name, inputs, {**op.defaults(),
                                              **testing.op_attrs(op_name, attrs)})
        for spec, got in zip(op.outputs, vm_run(vm, model, inputs)):
            assert got.dtype == np.dtype(dtype), spec.name
            testing.assert_close(got, ref[spec.name], dtype,
                                 f"{op_name}.{spec.name} T={steps} B={batch}")


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("use_peephole", [False, True])
def test_custom_op_float32(op_name, use_peephole):
    """Each op (every attribute given), compiled once, at two (T, B), seq_len_max < T as a
    run-time tensor."""
    check_custom_op(op_name, "float32", use_peephole)


@pytest.mark.parametrize("op_name", list(OPS))
def test_custom_op_float16(op_name):
    check_custom_op(op_name, "float16", True)


def test_custom_op_with_standard_ops_matches_onnxruntime():
    """A BlockLSTMV2 node (constant seq_len_max) whose ``h`` feeds MatMul, against onnxruntime
    running the op's ONNX function."""
    op = OPS["BlockLSTMV2"]
    inputs = testing.make_inputs(op.name, B=B, I=I, H=H, T=T, seed=7)
    proj = np.random.default_rng(7).uniform(-1, 1, (H, 3)).astype(np.float32)
    node = lo.make_node(op.name, outputs=[f"{n}_out" for n in op.output_names], name="block",
                        cell_clip=0.5)
    mm = helper.make_node("MatMul", ["h_out", "proj"], ["y"])
    dims = {"T": "T", "B": "B", "I": I, "H": H, "4H": 4 * H, "I+H": I + H}
    graph = helper.make_graph(
        [node, mm], "mixed", [lo.models.value_info(t, "float32", dims) for t in op.inputs[1:]],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "B", 3])],
        [numpy_helper.from_array(np.asarray(3, np.int64), "seq_len_max"),
         numpy_helper.from_array(proj, "proj")])
    model = helper.make_model(graph, opset_imports=lo.models.opset_imports(),
                              ir_version=lo.IR_VERSION, functions=[lo.make_function(op.name)])
    _, vm = compiled(model)
    (got,), (want,) = vm_run(vm, model, inputs), ort_run(model, inputs)
    testing.assert_close(got, want, "float32", "BlockLSTMV2 -> MatMul", tol=_ort_tol("float32"))
    assert not got[3:].any()  # steps past seq_len_max are zero


def test_custom_op_seq_len_max_checked():
    """A constant seq_len_max > T is refused at import; a run-time one by the kernel."""
    model = lo.make_model("BlockLSTM", input_size=I, cell_size=H, seq_len=T)
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(T + 1, np.int64),
                                                           "seq_len_max"))
    with pytest.raises(ValueError, match=r"BlockLSTM node 'BlockLSTM': input 'seq_len_max' "
                                         r"expected <= T = 5, got 6"):
        from_onnx(model)
    model = lo.make_model("BlockLSTM", input_size=I, cell_size=H)
    _, vm = compiled(model)
    inputs = testing.make_inputs("BlockLSTM", B=B, I=I, H=H, T=T, seq_len_max=T)
    inputs["seq_len_max"] = np.asarray(T + 1, np.int64)
    with pytest.raises(ValueError, match=r"seq_len_max must be in \[0, T\]"):
        vm_run(vm, model, inputs)


# --- TF -> ONNX (lstm_tvm.convert) -> Relax, as in the README ------------------------------

#: How a TF function computes ``seq_len_max`` from ``x``, and whether ``T``, ``B`` are static.
#: With dynamic dims TVM's ONNX frontend hands ``Shape`` -> ``Slice`` -> ``Squeeze`` (and
#: arithmetic on it) to the converter as a ``PrimExpr`` symbolic in ``T``, not a tensor; through
#: an int32 ``Cast`` it is a tensor; with static dims TF folds it into a constant.
TF_SEQ_LEN_CASES = {
    "int64-shape": (lambda tf, x: tf.shape(x, out_type=tf.int64)[0], False),  # the README's
    "shape-minus-one": (lambda tf, x: tf.shape(x, out_type=tf.int64)[0] - 1, False),
    "int32-shape-cast": (lambda tf, x: tf.cast(tf.shape(x)[0], tf.int64), False),
    "int64-shape-static": (lambda tf, x: tf.shape(x, out_type=tf.int64)[0], True),
}
FWD_PARAMS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")


def _specs(tf, op, static):
    """float32 specs of ``op``'s float inputs (``T``, ``B`` unknown unless ``static``)."""
    sizes = {"T": T, "B": B, "I": I, "H": H}
    return [tf.TensorSpec([eval_dim(d, sizes) if static or d not in ("T", "B") else None
                           for d in s.shape], tf.float32, name=s.name)
            for s in op.inputs if s.dtype == "T"]


def _convert(tf, fn, op, static):
    """``fn`` converted by ``lstm_tvm.convert`` at :func:`_specs`."""
    pytest.importorskip("tf2onnx", reason="lstm_tvm.convert needs tf2onnx")
    from lstm_tvm import convert

    return convert.from_function(fn, _specs(tf, op, static))


@pytest.mark.parametrize("seq_len, static", TF_SEQ_LEN_CASES.values(),
                         ids=TF_SEQ_LEN_CASES.keys())
def test_converted_tf_function_matches_tf(tf, seq_len, static):
    """The README's flow: a tf.function calling BlockLSTMV2 with ``seq_len_max`` computed from
    ``x``'s shape -> ``lstm_tvm.convert`` -> ``from_onnx`` -> ``tvm.compile`` -> VM, against the
    same tf.function run by TF where TF defines the outputs (dynamic T, B: at two sizes)."""
    op = OPS["BlockLSTMV2"]

    @tf.function
    def block(x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = tf.raw_ops.BlockLSTMV2(seq_len_max=seq_len(tf, x), x=x, cs_prev=cs_prev,
                                     h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
                                     use_peephole=True)
        return dict(zip(op.output_names, out))

    model = _convert(tf, block, op, static)
    _, vm = compiled(model)
    (r1, a1), (r2, a2) = testing.tolerance("float32"), testing.tf_tolerance("float32")
    for steps, batch in ((T, B),) if static else ((T, B), (T2, B2)):
        inputs = testing.make_inputs(op.name, B=batch, I=I, H=H, T=steps, seed=steps)
        feeds = {n: inputs[n] for n in FWD_PARAMS}
        want = {k: v.numpy() for k, v in block(**feeds).items()}
        seq = int(seq_len(tf, feeds["x"]))
        for output, got in zip(model.graph.output, vm_run(vm, model, feeds)):
            mask = testing.tf_defined_mask(op.name, output.name, seq, steps)
            testing.assert_close(got, want[output.name], "float32",
                                 f"{output.name} T={steps} B={batch}", mask=mask,
                                 tol=(r1 + r2, a1 + a2))


def _seq_len_model(nodes, initializers=()):
    """A BlockLSTM model whose ``seq_len_max`` is computed by ``nodes`` (from ``x``)."""
    model = lo.make_model("BlockLSTM", input_size=I, cell_size=H)
    graph = model.graph
    graph.input.remove(next(v for v in graph.input if v.name == "seq_len_max"))
    block = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *block])
    graph.initializer.extend([*initializers, numpy_helper.from_array(np.int64(0), "zero"),
                              numpy_helper.from_array(np.int64(1), "one")])
    return model


def _from_shape(*nodes):
    """``nodes`` after ``steps = Shape(x)[0]`` (a scalar ``Gather``)."""
    return [helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "zero"], ["steps"]), *nodes]


#: ``seq_len_max`` forms TF's converter does not write: ``(nodes, seq_len_max at T)``.
SEQ_LEN_FORMS = {
    "int32-from-shape": (_from_shape(helper.make_node("Cast", ["steps"], ["seq_len_max"],
                                                      to=TensorProto.INT32)),
                         lambda steps: steps),
    "arithmetic-on-shape": (_from_shape(helper.make_node("Sub", ["steps", "one"],
                                                         ["seq_len_max"])),
                            lambda steps: steps - 1),
    "int32-constant": ([helper.make_node("Constant", [], ["seq_len_max"],
                                         value=numpy_helper.from_array(np.int32(3)))],
                       lambda steps: 3),
}


@pytest.mark.parametrize("nodes, seq_len", SEQ_LEN_FORMS.values(), ids=SEQ_LEN_FORMS.keys())
def test_custom_op_seq_len_max_forms(nodes, seq_len):
    """``seq_len_max`` as a shape-derived int32 ``PrimExpr``, arithmetic on a shape, and an
    int32 constant, against the float64 reference at two (T, B). int32 is outside the ops'
    schema (int64): the importer takes it with ``check_model=False``."""
    model = _seq_len_model(nodes)
    int32 = any(n.op_type == "Constant" and n.attribute[0].t.data_type == TensorProto.INT32
                or n.op_type == "Cast" for n in nodes)
    if int32:
        with pytest.raises(TypeError, match=r"input 'seq_len_max' expected int64, got int32"):
            from_onnx(model)
    _, vm = compiled(model, check_model=not int32)
    for steps, batch in ((T, B), (T + 1, B2)):
        inputs = testing.make_inputs("BlockLSTM", B=batch, I=I, H=H, T=steps,
                                     seq_len_max=seq_len(steps))
        ref = reference.run("BlockLSTM", inputs, OPS["BlockLSTM"].defaults())
        del inputs["seq_len_max"]
        for spec, got in zip(OPS["BlockLSTM"].outputs, vm_run(vm, model, inputs)):
            testing.assert_close(got, ref[spec.name], "float32", f"{spec.name} T={steps}")


def test_custom_op_seq_len_max_refusals():
    """A float ``seq_len_max`` and a rank-1 shape are refused at import, naming the input."""
    model = _seq_len_model([], [numpy_helper.from_array(np.float32(3), "seq_len_max")])
    with pytest.raises(TypeError, match=r"BlockLSTM node 'BlockLSTM': input 'seq_len_max' "
                                        r"expected int64, got float32"):
        from_onnx(model)
    with pytest.raises(TypeError, match=r"BlockLSTM node 'BlockLSTM': input 'seq_len_max' "
                                        r"expected int64 \(or int32\), got float32"):
        from_onnx(model, check_model=False)
    model = _seq_len_model([helper.make_node("Shape", ["x"], ["seq_len_max"], end=1)])
    with pytest.raises(TypeError, match=r"input 'seq_len_max' expected an int64 scalar \(a "
                                        r"tensor, or a value computed from shapes\), got "
                                        r"R\.Shape"):
        from_onnx(model)


# --- TF1-style models with a dynamic batch --------------------------------------------------

#: The speech model's feature and dense sizes (its LSTM's I, H are the module's).
FEATURES = 5


def _speech_forward(tf, activation):
    """A TF1 speech model's layers around ``BlockLSTM`` (``LSTMBlockFusedCell``'s settings:
    ``forget_bias=0``, ``cell_clip=-1``, no peepholes): batch-major features to time-major, a
    dense layer, ``reshape(..., [-1, batch_size, I])`` with ``batch_size = tf.shape(x)[0]``,
    the LSTM over ``max(seq_length)`` steps from zero state, and its ``h`` flattened."""

    def forward(x, seq_length, w1, b1, w, b):
        batch_size = tf.shape(x)[0]
        dense = tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, FEATURES])
        dense = activation(tf.matmul(dense, w1) + b1)
        dense = tf.reshape(dense, [-1, batch_size, I])
        zeros = tf.zeros([batch_size, H])
        no_peephole = tf.zeros([H])
        out = tf.raw_ops.BlockLSTM(
            seq_len_max=tf.cast(tf.reduce_max(seq_length), tf.int64), x=dense, cs_prev=zeros,
            h_prev=zeros, w=w, wci=no_peephole, wcf=no_peephole, wco=no_peephole, b=b,
            forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
        return tf.reshape(out[6], [-1, H])

    return forward


def _speech_specs(tf):
    return [tf.TensorSpec([None, None, FEATURES], tf.float32, name="x"),
            tf.TensorSpec([None], tf.int32, name="seq_length"),
            tf.TensorSpec([FEATURES, I], tf.float32, name="w1"),
            tf.TensorSpec([I], tf.float32, name="b1"),
            tf.TensorSpec([I + H, 4 * H], tf.float32, name="w"),
            tf.TensorSpec([4 * H], tf.float32, name="b")]


def _speech_feeds(steps, batch, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, steps + 1, batch).astype(np.int32)
    lengths[0] = steps  # TF defines every output row up to max(seq_length)
    return {"x": rng.standard_normal((batch, steps, FEATURES)).astype(np.float32),
            "seq_length": lengths,
            "w1": rng.uniform(-0.5, 0.5, (FEATURES, I)).astype(np.float32),
            "b1": rng.uniform(-0.5, 0.5, I).astype(np.float32),
            "w": rng.uniform(-0.5, 0.5, (I + H, 4 * H)).astype(np.float32),
            "b": rng.uniform(-0.5, 0.5, 4 * H).astype(np.float32)}


def _check_against_tf(fn, model, what):
    """``model`` (``fn`` converted) imported, compiled once and run at two (T, B), against
    ``fn`` run by TF."""
    _, vm = compiled(model)
    tol = tuple(a + b for a, b in zip(testing.tolerance("float32"),
                                      testing.tf_tolerance("float32")))
    for steps, batch in ((T, B), (T2 + 1, B2 + 1)):
        feeds = _speech_feeds(steps, batch, seed=steps)
        want = {k: v.numpy() for k, v in fn(**feeds).items()}
        for output, got in zip(model.graph.output, vm_run(vm, model, feeds)):
            testing.assert_close(got, want[output.name], "float32",
                                 f"{what} {output.name} T={steps} B={batch}", tol=tol)


def test_tf1_dynamic_batch_model_matches_tf(tf):
    """A TF1 speech model exported with a dynamic batch: ``Reshape`` and ``Expand`` take shapes
    computed from ``tf.shape`` through int32 casts, slices and concats (TVM's own converters
    refuse the ``Reshape``); ``logits`` against TF at two (T, B) of one compiled module."""
    pytest.importorskip("tf2onnx", reason="lstm_tvm.convert needs tf2onnx")
    from lstm_tvm import convert

    forward = _speech_forward(tf, lambda z: tf.minimum(tf.nn.relu(z), 20.0))
    fn = tf.function(lambda x, seq_length, w1, b1, w, b:
                     {"logits": forward(x, seq_length, w1, b1, w, b)})
    model = convert.from_function(fn, _speech_specs(tf))
    mod, _ = compiled(model)
    # Every shape followed at import: no reshape waits for a shape read back at run time.
    assert "reshape_dim" not in str(mod["main"])
    logits = mod["main"].ret_ty
    assert logits.ndim == 2 and int(logits.shape.values[1]) == H, logits
    _check_against_tf(fn, model, "forward")


def test_tf1_dynamic_batch_gradient_matches_tf(tf):
    """The same model's training gradients (dense layer linear: tf2onnx has no ``ReluGrad``),
    ``BlockLSTMGrad`` fed by shapes computed from ``BlockLSTM``'s outputs, against TF's tape."""
    pytest.importorskip("tf2onnx", reason="lstm_tvm.convert needs tf2onnx")
    from lstm_tvm import convert

    forward = _speech_forward(tf, lambda z: z)

    def gradients(x, seq_length, w1, b1, w, b):
        with tf.GradientTape() as tape:
            tape.watch([w1, b1, w, b])
            loss = tf.reduce_sum(tf.square(forward(x, seq_length, w1, b1, w, b)))
        grads = tape.gradient(loss, [w1, b1, w, b])
        return {"loss": loss, **dict(zip(("g_w1", "g_b1", "g_w", "g_b"), grads))}

    fn = tf.function(gradients)
    model = convert.from_function(fn, _speech_specs(tf))
    assert "BlockLSTMGrad" in {n.op_type for n in model.graph.node}
    _check_against_tf(fn, model, "gradient")


def _training_step(tf):
    """The README's training step through ``BlockLSTM`` (whose tape gradient TF gets right):
    ``loss`` against a ``target`` fed as its own graph input."""

    @tf.function
    def step(x, cs_prev, h_prev, w, wci, wcf, wco, b, target):
        params = [x, cs_prev, h_prev, w, wci, wcf, wco, b]
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = tf.raw_ops.BlockLSTM(seq_len_max=tf.shape(x, out_type=tf.int64)[0], x=x,
                                       cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf,
                                       wco=wco, b=b, use_peephole=True)
            loss = tf.reduce_mean(tf.square(out.h - target))
        grads = tape.gradient(loss, params)
        return {"loss": loss, **{f"{n}_grad": g for n, g in zip(FWD_PARAMS, grads)}}

    return step


def test_training_step_with_dynamic_shapes(tf):
    """A training step converted with ``T`` and ``B`` unknown: ``out.h - target`` broadcasts
    two graph inputs' distinct unknown dims, so Relax loses the shape and the import says so,
    naming the node and the inputs; with ``T`` and ``B`` shared through ``shape_dict`` it
    imports (``BroadcastGradientArgs``' run-time axes resolved at import) and every output
    matches TF at three (T, B), batch 1 included (its size-1 axes are summed or not alike)."""
    pytest.importorskip("tf2onnx", reason="lstm_tvm.convert needs tf2onnx")
    from tvm import tirx

    from lstm_tvm import convert

    step = _training_step(tf)
    op = OPS["BlockLSTM"]
    specs = [*_specs(tf, op, static=False),
             tf.TensorSpec([None, None, H], tf.float32, name="target")]
    model = convert.from_function(step, specs)
    with pytest.raises(ValueError, match=(
            r"Relax does not know the shape of input '.*': it was lost at Sub node 'sub' on "
            r"'BlockLSTM:6' \(unk__\d+, unk__\d+, 6\), 'target' \(unk__\d+, unk__\d+, 6\).*"
            r"shape_dict=.* for the graph inputs x \(unk__\d+, unk__\d+, 4\), cs_prev")):
        from_onnx(model)
    steps, batch = tirx.Var("T", "int64"), tirx.Var("B", "int64")
    shared = {"x": [steps, batch, I], "cs_prev": [batch, H], "h_prev": [batch, H],
              "target": [steps, batch, H]}
    vm = relax.VirtualMachine(tvm.compile(from_onnx(model, shape_dict=shared), "llvm"),
                              tvm.cpu())
    tol = tuple(a + b for a, b in zip(testing.tolerance("float32"),
                                      testing.tf_tolerance("float32")))
    for t, b in ((T, B), (T2, B2), (1, 1)):
        inputs = testing.make_inputs(op.name, T=t, B=b, I=I, H=H, seed=t)
        feeds = {k: inputs[k] for k in FWD_PARAMS}
        feeds["target"] = np.random.default_rng(t).standard_normal((t, b, H)).astype(np.float32)
        want = {k: v.numpy() for k, v in step(**feeds).items()}
        for output, got in zip(model.graph.output, vm_run(vm, model, feeds)):
            testing.assert_close(got, want[output.name], "float32",
                                 f"{output.name} T={t} B={b}", tol=tol)


def _reshape_model(target=None):
    """``Y = Reshape(X, shape)``: ``shape`` a graph input, or computed from ``X``'s shape with
    ``target``'s nodes; ``X`` of shape ``(a, b, 6)``."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b", 6])
    inputs = [x]
    nodes = list(target or [])
    if target is None:
        inputs.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [3]))
    node = helper.make_node("Reshape", ["X", "shape"], ["Y"])
    graph = helper.make_graph([*nodes, node], "reshape", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                             ["y0", "y1", "y2"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=lo.IR_VERSION)


def _const(name, values, dtype=np.int64):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(values, dtype)))


#: ``Reshape`` targets computed from ``X``'s shape: int32 casts, a ``0``, arithmetic.
RESHAPE_TARGETS = {
    "int32-concat": [helper.make_node("Shape", ["X"], ["s"]),
                     helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
                     _const("one", [1], np.int32), _const("two", [2], np.int32),
                     helper.make_node("Slice", ["s32", "one", "two"], ["b32"]),
                     _const("head", [-1], np.int32), _const("tail", [3], np.int32),
                     helper.make_node("Concat", ["head", "b32", "tail"], ["t32"], axis=0),
                     helper.make_node("Cast", ["t32"], ["shape"], to=TensorProto.INT64)],
    "zero-and-product": [helper.make_node("Shape", ["X"], ["s"]),
                         _const("zero", 0), _const("one", 1),
                         helper.make_node("Gather", ["s", "zero"], ["a"]),
                         helper.make_node("Gather", ["s", "one"], ["b"]),
                         helper.make_node("Mul", ["a", "b"], ["ab"]),
                         _const("axes", [0]),
                         helper.make_node("Unsqueeze", ["ab", "axes"], ["ab1"]),
                         _const("rest", [-1, 1]),
                         helper.make_node("Concat", ["ab1", "rest"], ["shape"], axis=0)],
}


@pytest.mark.parametrize("target", RESHAPE_TARGETS.values(), ids=RESHAPE_TARGETS.keys())
def test_reshape_to_a_shape_computed_from_shapes(target):
    """Shapes followed through TVM's conversion: ``Y``'s dims are symbolic expressions of
    ``X``'s (no run-time reshape of a read-back shape), values against onnxruntime at two
    shapes."""
    model = _reshape_model(target)
    mod, vm = compiled(model)
    assert mod["main"].ret_ty.shape is not None and "reshape_dim" not in str(mod["main"])
    for shape in ((2, 4, 6), (3, 1, 6)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (got,), (want,) = vm_run(vm, model, {"X": x}), ort_run(model, {"X": x})
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(0, -1, 3), (-1, 2, 3), (2, 0, 6), (4, 6, -1)])
def test_reshape_to_a_shape_read_at_run_time(shape):
    """A ``Reshape`` target fed as a graph input: ``0`` and ``-1`` resolved at run time, values
    against onnxruntime; a target that does not hold ``X``'s elements exactly (fewer, or
    negative dims whose product matches) raises instead of viewing part of ``X``."""
    model = _reshape_model()
    _, vm = compiled(model)
    x = np.arange(2 * 4 * 6, dtype=np.float32).reshape(2, 4, 6)
    feeds = {"X": x, "shape": np.array(shape, np.int64)}
    (got,), (want,) = vm_run(vm, model, feeds), ort_run(model, feeds)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(AssertionError, match=r"Reshape node \(unnamed, output 'Y'\): the target "
                                             r"shape \[ 5 -1  3\] does not fit the data's shape "
                                             r"\[2 4 6\]"):
        vm_run(vm, model, {"X": x, "shape": np.array((5, -1, 3), np.int64)})
    with pytest.raises(AssertionError, match=r"the target shape \[-2 -4  6\] does not fit"):
        vm_run(vm, model, {"X": x, "shape": np.array((-2, -4, 6), np.int64)})


# --- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs, error, text", [
    ({"activations": ["Relu", "Tanh", "Tanh"]}, OpAttributeUnImplemented,
     r"LSTM node 'lstm': attribute 'activations' = \['Relu', 'Tanh', 'Tanh'\] is not supported"),
    ({"activation_alpha": [0.5]}, OpAttributeUnImplemented,
     r"LSTM node 'lstm': attribute 'activation_alpha' = \[0.5\] is not supported"),
    ({"activation_beta": [0.5]}, OpAttributeUnImplemented,
     r"LSTM node 'lstm': attribute 'activation_beta' = \[0.5\] is not supported"),
    ({"clip": 3.0}, OpAttributeUnImplemented,
     (r"LSTM node 'lstm': attribute 'clip' = 3.0 is not supported: ONNX clips the gate "
      r"pre-activations")),
    ({"input_forget": 1}, OpAttributeUnImplemented,
     r"LSTM node 'lstm': attribute 'input_forget' = 1 is not supported"),
    ({"layout": 2}, OpAttributeInvalid, r"LSTM node 'lstm': attribute 'layout' = 2; expected"),
])
def test_lstm_refusals(attrs, error, text):
    model, _ = lstm_model(**attrs)
    with pytest.raises(error, match=text):
        from_onnx(model)


def test_lstm_default_activations_accepted():
    model, _ = lstm_model(direction="bidirectional",
                          activations=["Sigmoid", "Tanh", "Tanh"] * 2)
    from_onnx(model)


def test_lstm_refusals_listed_together():
    """Every refused node is named in one error, before anything is converted."""
    bad1, _ = lstm_model(clip=1.0, name="first")
    bad2, _ = lstm_model(input_forget=1, name="second")
    graph = bad1.graph
    node = bad2.graph.node[0]
    node.output[:] = ["Y2", "", ""]
    graph.node.append(node)
    with pytest.raises(OpAttributeUnImplemented) as info:
        from_onnx(bad1)
    assert "LSTM node 'first': attribute 'clip'" in str(info.value)
    assert "LSTM node 'second': attribute 'input_forget'" in str(info.value)


def test_lstm_layout_needs_opset_14():
    """onnx's checker refuses it first; unchecked, the converter names the attribute."""
    model, _ = lstm_model(layout=1, opset=13)
    with pytest.raises(ValueError, match=r"onnx.checker rejects it: .*Unrecognized attribute: "
                                         r"layout for operator LSTM"):
        from_onnx(model)
    with pytest.raises(OpAttributeInvalid, match=r"unknown attribute\(s\) \['layout'\] for "
                                                 r"LSTM opset 13"):
        from_onnx(model, check_model=False)


def test_lstm_shape_and_dtype_refusals():
    model, _ = lstm_model(dtype="float64")
    with pytest.raises(TypeError, match=r"LSTM node 'lstm': input 'X' has dtype float64"):
        from_onnx(model)
    model, _ = lstm_model(weights_as_inputs=True)
    w = next(v for v in model.graph.input if v.name == "W")
    w.type.tensor_type.shape.dim[2].dim_param = "n"
    with pytest.raises(ValueError, match=r"LSTM node 'lstm': input 'W' must have a static "
                                         r"shape \(num_directions, 4H, I\).*got \(1, 24, n\)"):
        from_onnx(model)
    model, _ = lstm_model()
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = H + 1
    with pytest.raises(ValueError, match=r"'hidden_size' = 7 but input 'R' has hidden size 6"):
        from_onnx(model)


def _second_writer(model):
    node = onnx.NodeProto()
    node.CopyFrom(model.graph.node[0])
    node.name = "second"
    model.graph.node.append(node)


def _repeated_attribute(model):
    model.graph.node[0].attribute.append(helper.make_attribute("forget_bias", 2.0))


def _missing_output(model):
    del model.graph.node[0].output[6]
    del model.graph.output[6]


def _cycle(model):
    model.graph.node[0].input[1] = "x2"
    model.graph.node.append(helper.make_node("Identity", ["h"], ["x2"], name="loop"))


def _unsorted(model):
    model.graph.node[0].input[1] = "x2"
    model.graph.node.append(helper.make_node("Identity", ["x"], ["x2"], name="late"))


#: Invalid graphs TVM's importer would import (or fail on with a bare KeyError): the checker's
#: message (with lstm_tvm's schemas), and what ``check_model=False`` does.
INVALID_GRAPHS = {
    "outputs-written-twice": (_second_writer, "single static assignment", None),
    "repeated-attribute": (_repeated_attribute, "'forget_bias' appeared multiple times", None),
    "missing-output": (_missing_output, r"output size 6 not in range \[min=7, max=7\]", None),
    "cycle": (_cycle, "topologically sorted",
              r"BlockLSTM node 'BlockLSTM': input 'x2' is read before it is defined: written "
              r"by Identity node 'loop', which comes later"),
    "unsorted": (_unsorted, "topologically sorted",
                 r"input 'x2' is read before it is defined: written by Identity node 'late'"),
}


@pytest.mark.parametrize("damage, checker, unchecked", INVALID_GRAPHS.values(),
                         ids=INVALID_GRAPHS.keys())
def test_invalid_graphs_refused(damage, checker, unchecked):
    """``from_onnx`` refuses what onnx's checker rejects, with its message; unsorted nodes are
    refused by name even unchecked."""
    model = lo.make_model("BlockLSTM", input_size=I, cell_size=H)
    damage(model)
    with pytest.raises(ValueError, match=r"model: onnx.checker rejects it: .*" + checker):
        from_onnx(model)
    if unchecked is not None:
        with pytest.raises(ValueError, match=unchecked):
            from_onnx(model, check_model=False)


def test_custom_op_refusals():
    model = lo.make_model("BlockLSTMGrad", input_size=I, cell_size=H,
                          attrs={"use_peephole": True})
    model.graph.node[0].attribute[0].i = 2
    message = r"BlockLSTMGrad node 'BlockLSTMGrad': attribute 'use_peephole' expected 0 or 1, got 2"
    with pytest.raises(ValueError, match=message):  # the contract
        from_onnx(model)
    with pytest.raises(OpAttributeInvalid, match=message):  # the converter
        from_onnx(model, check_model=False)
    model = lo.make_model("LSTMBlockCell", input_size=I, cell_size=H)
    for value in model.graph.input:
        for k, dim in enumerate(value.type.tensor_type.shape.dim):
            dim.dim_param = f"{value.name}_{k}"
    with pytest.raises(ValueError, match=r"LSTMBlockCell node 'LSTMBlockCell': the input size "
                                         r"I must be static"):
        from_onnx(model)
    model = lo.make_model("LSTMBlockCell", input_size=I, cell_size=H)
    model.graph.node[0].op_type = "GRUBlockCell"
    with pytest.raises(ValueError, match=r"org\.lstm_tvm has no op\(s\) \['GRUBlockCell'\]"):
        from_onnx(model)
    with pytest.raises(OpNotImplemented, match=r"org\.lstm_tvm\.GRUBlockCell"):
        from_onnx(model, check_model=False)


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def test_builds_for_cuda_without_a_gpu():
    """The imported module compiles for CUDA: lstm_tvm's kernels as scheduled for CUDA, the
    sequence-length helpers scheduled by TVM's default GPU pipeline; nvcc compiles the source."""
    from lstm_tvm._tvm import nvcc_compile
    from lstm_tvm.targets import resolve_target

    target = resolve_target({"kind": "cuda", "arch": "sm_80"})
    model, _ = lstm_model(direction="bidirectional", lengths=True, peephole=True)
    executable = tvm.compile(from_onnx(model, target=target), target=target)
    cuda = [m for m in _modules(executable.mod) if m.kind == "cuda"]
    assert len(cuda) == 1
    source = cuda[0].inspect_source()
    kernels = re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)
    assert any(k.startswith(f"lstm_tvm_BlockLSTM_float32_i{I}_h{H}") for k in kernels), kernels
    assert any(k.startswith("reverse_steps") for k in kernels), kernels
    if shutil.which("nvcc"):
        assert nvcc_compile(source, "sm_80")


if __name__ == "__main__":
    tvm.testing.main()
