"""The registry is the single source of truth: every consumer covers every op, in its order."""

import pytest

import lstm_tvm
from lstm_tvm import build, reference, registry, testing, validation
from lstm_tvm.kernels import BUILDERS


def test_every_op_has_a_kernel_a_reference_and_a_raw_op():
    assert list(BUILDERS) == list(registry.KERNEL_OPS)
    assert list(registry.KERNEL_OPS) == [*registry.OPS, *registry.HELPERS]
    for name, op in registry.KERNEL_OPS.items():
        assert callable(getattr(lstm_tvm.raw_ops, name, None)) == op.tf_op
        inputs = testing.make_inputs(name, B=1, I=2, H=3, T=2 if op.kind == "sequence" else None)
        attrs = testing.op_attrs(name, {"use_peephole": False})
        assert tuple(reference.run(name, inputs, attrs)) == op.output_names


@pytest.mark.parametrize("op_name", list(registry.KERNEL_OPS))
def test_kernel_parameters_follow_the_registry_order(op_name):
    op = registry.get_op(op_name)
    attrs = validation.validate_attrs(op, testing.op_attrs(op_name, {"use_peephole": True}))
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


def test_the_helper_is_named_only_by_its_own_files_and_its_users():
    """CellGradMatmul has no special case: besides its registry entry, kernel and reference,
    only the code that runs it (lstm_tvm.cell_grad_matmul, the benchmark's case) names it."""
    import ast
    import pathlib

    def names_it(node):
        return (isinstance(node, ast.Constant) and node.value == "CellGradMatmul"
                or isinstance(node, ast.Name) and node.id == "CELL_GRAD_MATMUL"
                or isinstance(node, ast.Attribute) and node.attr == "CELL_GRAD_MATMUL"
                or isinstance(node, ast.alias) and node.name == "CELL_GRAD_MATMUL")

    root = pathlib.Path(lstm_tvm.__file__).parent
    naming = {str(p.relative_to(root)) for p in root.rglob("*.py")
              if any(names_it(n) for n in ast.walk(ast.parse(p.read_text())))}
    assert "registry.py" in naming and "raw_ops.py" in naming  # the check sees names
    assert naming - {"registry.py", "kernels/__init__.py", "reference/block_lstm.py",
                     "raw_ops.py", "bench/harness.py"} == set()


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__]))
