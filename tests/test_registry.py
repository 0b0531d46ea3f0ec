"""The registry is the single source of truth: every consumer covers every op, in its order."""

import pytest

import lstm_tvm
from lstm_tvm import build, reference, registry, testing, validation
from lstm_tvm.kernels import BUILDERS


def test_every_op_has_a_kernel_a_reference_and_a_raw_op():
    assert set(BUILDERS) == set(registry.OPS)
    for name in registry.OPS:
        assert callable(getattr(lstm_tvm.raw_ops, name))
        op = registry.get_op(name)
        inputs = testing.make_inputs(name, B=1, I=2, H=3, T=2 if op.kind == "sequence" else None)
        assert tuple(reference.run(name, inputs, {"use_peephole": False})) == op.output_names


@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_kernel_parameters_follow_the_registry_order(op_name):
    op = registry.get_op(op_name)
    attrs = validation.validate_attrs(op, {"use_peephole": True})
    func = build.primfunc(build.make_spec(op_name, "float32", 3, 2, attrs))
    names = [p.name.removesuffix("_h") for p in func.params]
    assert names == list(op.input_names + op.output_names)
    assert func.attrs["global_symbol"] == f"lstm_tvm_{op_name}_float32"


def test_gate_layouts_and_pairs():
    for op in registry.OPS.values():
        assert sorted(op.gates) == ["c", "f", "i", "o"]
        assert registry.get_op(op.pair).pair == op.name
        assert registry.get_op(op.pair).gate_layout == op.gate_layout
    assert registry.get_op("BlockLSTMV2").gates == ("i", "f", "c", "o")
    assert registry.get_op("BlockLSTM").gates == ("i", "c", "f", "o")


def test_registry_matches_tf_op_defs(tf):
    from tensorflow.python.framework import op_def_registry

    for name, op in registry.OPS.items():
        od = op_def_registry.get(name)
        assert tuple(a.name for a in od.input_arg) == op.input_names
        assert tuple(a.name for a in od.output_arg) == op.output_names
        tf_attrs = {a.name: a for a in od.attr if a.name != "T"}
        assert set(tf_attrs) == set(op.attr_names)
        for a in op.attrs:
            has_default = tf_attrs[a.name].HasField("default_value")
            assert has_default == (not a.required), (name, a.name)
            if has_default:
                field = "b" if a.type is bool else "f"
                assert getattr(tf_attrs[a.name].default_value, field) == a.default, (name, a.name)


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__]))
