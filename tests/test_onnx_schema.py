"""ONNX schemas of the six ops: registration, checker, strict shape inference, rejections."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, defs, helper

from lstm_tvm import onnx as lo
from lstm_tvm.registry import DTYPES, OPS
from lstm_tvm.validation import validate_attrs

I, H = 5, 6
DIMS = {"T": "T", "B": "B", "I": I, "H": H, "4H": 4 * H, "I+H": I + H}
FORWARD_OPS = [n for n, op in OPS.items() if op.direction == "forward"]


@pytest.fixture(scope="module", autouse=True)
def schemas():
    """Register the schemas for this module; deregister them afterwards."""
    yield lo.register_schemas()
    lo.deregister_schemas()


def _model(op_name, dtype="float32", *, with_functions=False, **attrs):
    attrs.setdefault("use_peephole", True)
    return lo.make_model(op_name, dtype, input_size=I, cell_size=H, attrs=attrs,
                         with_functions=with_functions)


def _check(model):
    onnx.checker.check_model(model, full_check=True)
    onnx.checker.check_model(model, check_custom_domain=True)
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def _infer(model):
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def _untyped_outputs(model):
    """``model`` with its graph outputs' types removed (so inference has to provide them)."""
    outputs = [o.name for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in outputs)
    return model


def _dims(value_info):
    dims = value_info.type.tensor_type.shape.dim
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims]


def test_register_is_idempotent():
    first = lo.register_schemas()
    second = lo.register_schemas()
    assert [s.name for s in first] == [s.name for s in second] == list(OPS)
    for name in OPS:
        assert defs.has(name, lo.DOMAIN_VERSION, lo.DOMAIN)
        schema = defs.get_schema(name, lo.DOMAIN_VERSION, lo.DOMAIN)
        assert schema.domain == lo.DOMAIN and schema.since_version == lo.DOMAIN_VERSION
    assert lo.DOMAIN == "org.lstm_tvm" and lo.DOMAIN_VERSION == 1


def test_deregister_then_register():
    lo.deregister_schemas()
    lo.deregister_schemas()  # idempotent too
    assert not any(defs.has(n, lo.DOMAIN_VERSION, lo.DOMAIN) for n in OPS)
    assert len(lo.register_schemas()) == len(OPS)
    assert all(defs.has(n, lo.DOMAIN_VERSION, lo.DOMAIN) for n in OPS)


@pytest.mark.parametrize("op_name", list(OPS))
def test_schema_matches_registry(op_name):
    op = OPS[op_name]
    schema = defs.get_schema(op_name, lo.DOMAIN_VERSION, lo.DOMAIN)
    assert [p.name for p in schema.inputs] == list(op.input_names)
    assert [p.name for p in schema.outputs] == list(op.output_names)
    assert set(schema.attributes) == set(op.attr_names)
    for spec in op.attrs:
        attr = schema.attributes[spec.name]
        assert attr.required == spec.required
        if not spec.required:
            value = helper.get_attribute_value(attr.default_value)
            assert value == (int(spec.default) if spec.type is bool else spec.default)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    assert allowed["T"] == {"tensor(float)", "tensor(float16)"}
    if op.kind == "sequence":
        assert allowed["I64"] == {"tensor(int64)"}


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_functions", [False, True])
def test_single_op_model_checks(op_name, dtype, with_functions):
    model = _model(op_name, dtype, with_functions=with_functions)
    assert model.ir_version == lo.IR_VERSION
    assert {o.domain: o.version for o in model.opset_import} == {
        "": lo.ONNX_OPSET, lo.DOMAIN: lo.DOMAIN_VERSION}
    _check(model)


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_inferred_output_types(op_name, dtype):
    inferred = _infer(_untyped_outputs(_model(op_name, dtype)))
    op = OPS[op_name]
    for spec, out in zip(op.outputs, inferred.graph.output):
        assert out.name == spec.name
        assert out.type.tensor_type.elem_type == lo.domain.elem_type(dtype), spec.name
        assert _dims(out) == [DIMS[s] for s in spec.shape], spec.name


def test_symbolic_and_concrete_dims_are_carried():
    model = lo.make_model("BlockLSTMGradV2", "float32", input_size=I, cell_size=H,
                          attrs={"use_peephole": False}, with_functions=False,
                          seq_len="time", batch=7)
    inferred = _infer(_untyped_outputs(model))
    shapes = {o.name: _dims(o) for o in inferred.graph.output}
    assert shapes["x_grad"] == ["time", 7, I]
    assert shapes["w_grad"] == [I + H, 4 * H]
    assert shapes["h_prev_grad"] == [7, H]


def test_forward_backward_model_checks():
    model = lo.make_forward_backward_model("BlockLSTMV2", "float16", input_size=I,
                                           cell_size=H, attrs={"use_peephole": True})
    _check(model)
    assert [n.op_type for n in model.graph.node] == ["BlockLSTMV2", "BlockLSTMGradV2"]
    assert [i.name for i in model.graph.input][-2:] == ["cs_grad", "h_grad"]


def _retype(model, names, elem):
    for vi in list(model.graph.input) + list(model.graph.output):
        typed = vi.type.tensor_type
        if (names is None or vi.name in names) and typed.elem_type != TensorProto.INT64:
            typed.elem_type = elem
    return model


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTMGrad"])
def test_float64_rejected(op_name):
    model = _retype(_model(op_name), None, TensorProto.DOUBLE)
    with pytest.raises(Exception, match="tensor\\(double\\)"):
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(Exception, match="tensor\\(double\\)"):
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def test_mixed_float_types_rejected():
    model = _retype(_model("BlockLSTMV2", "float32"), {"w"}, TensorProto.FLOAT16)
    with pytest.raises(Exception, match="T"):
        onnx.checker.check_model(model, full_check=True)


def test_int32_seq_len_max_rejected():
    model = _retype(_model("BlockLSTM"), set(), TensorProto.FLOAT)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(Exception, match="int32"):
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("op_name", [n for n, op in OPS.items() if op.direction == "backward"])
def test_missing_required_attribute_rejected(op_name):
    model = _model(op_name)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != "use_peephole"]
    del node.attribute[:]
    node.attribute.extend(kept)
    with pytest.raises(onnx.checker.ValidationError, match="use_peephole"):
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(TypeError, match="use_peephole"):
        lo.make_node(op_name)


def test_make_node_validates_attributes():
    node = lo.make_node("BlockLSTM", use_peephole=True, cell_clip=0)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"forget_bias": 1.0, "cell_clip": 0.0, "use_peephole": 1}
    assert node.domain == lo.DOMAIN and node.op_type == "BlockLSTM"
    with pytest.raises(TypeError, match="forget_bias"):
        lo.make_node("BlockLSTMV2", forget_bias=1.0)  # V2 has no forget_bias
    with pytest.raises(TypeError, match="use_peephole"):
        lo.make_node("BlockLSTM", use_peephole="yes")
    with pytest.raises(ValueError, match="cell_clip"):
        lo.make_node("LSTMBlockCell", cell_clip=10**400)  # TF: OverflowError
    with pytest.raises(ValueError, match="inputs"):
        lo.make_node("LSTMBlockCell", ["x"], None)


def test_conflicting_sizes_rejected():
    model = _model("LSTMBlockCell")
    w = next(v for v in model.graph.input if v.name == "w")
    w.type.tensor_type.shape.dim[0].dim_value = I + H + 1
    with pytest.raises(Exception, match="I\\+H"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


def test_wrong_rank_rejected():
    model = _model("BlockLSTM")
    seq = model.graph.input[0]
    seq.type.tensor_type.shape.dim.add().dim_value = 1
    with pytest.raises(Exception, match="seq_len_max"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


#: ``cell_clip`` values TF 2.21 accepts (each turns clipping off but 3.4e38) and one it refuses.
CELL_CLIPS = [math.inf, -math.inf, math.nan, 1e-40, 3.4e38, 1e39, -1e39, 10**400]


def _tf_accepts_cell_clip(tf, value) -> bool:
    one = np.ones((1, 1), np.float32)
    try:
        tf.raw_ops.LSTMBlockCell(x=one, cs_prev=one, h_prev=one, w=np.ones((2, 4), np.float32),
                                 wci=one[0], wcf=one[0], wco=one[0], b=np.ones(4, np.float32),
                                 cell_clip=value)
    except Exception:  # noqa: BLE001 - any refusal by TF counts
        return False
    return True


@pytest.mark.parametrize("op_name", FORWARD_OPS)
def test_make_node_takes_the_cell_clips_tf_takes(op_name, tf):
    """A ``cell_clip`` TF accepts makes a checked model whose attribute is the finite value
    :func:`lstm_tvm.validation.validate_attrs` gives; one TF refuses is a ``ValueError``."""
    for value in CELL_CLIPS:
        if not _tf_accepts_cell_clip(tf, value):
            with pytest.raises(ValueError, match=f"^{op_name}: attribute 'cell_clip'"):
                lo.make_node(op_name, cell_clip=value)
            continue
        model = _model(op_name, with_functions=True, cell_clip=value)
        _check(model)
        got = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
        want = validate_attrs(OPS[op_name], {"cell_clip": value})["cell_clip"]
        assert got["cell_clip"] == np.float32(want) and math.isfinite(got["cell_clip"]), value


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))
