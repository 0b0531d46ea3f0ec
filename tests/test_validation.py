"""Tests for lstm_tvm.validation: every rule, for every op it applies to, both ways.

Inputs are built from the registry shapes (``TensorSpec.concrete_shape``), never typed by hand.
Malformed cases assert the exception type and that the message starts with the op name and
names the offending argument.
"""

from __future__ import annotations

import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lstm_tvm.registry import OPS
from lstm_tvm.validation import (
    MAX_ELEMENTS,
    Signature,
    expected_output_shapes,
    validate_attrs,
    validate_inputs,
)

SIZES = {"T": 3, "B": 2, "I": 5, "H": 4}
OP_NAMES = list(OPS)
SEQ_OPS = [n for n, op in OPS.items() if op.kind == "sequence"]
FLOAT_INPUTS = [(n, t.name) for n, op in OPS.items() for t in op.inputs if t.dtype == "T"]
ATTRS = [(n, a.name) for n, op in OPS.items() for a in op.attrs]
FLOAT_ATTRS = [(n, a) for n, a in ATTRS if OPS[n].attr(a).type is float]
BOOL_ATTRS = [(n, a) for n, a in ATTRS if OPS[n].attr(a).type is bool]
GRAD_OPS = [n for n, op in OPS.items() if any(a.required for a in op.attrs)]


def _sizes(op, **overrides):
    sizes = {**SIZES, **overrides}
    return sizes if op.kind == "sequence" else {k: v for k, v in sizes.items() if k != "T"}


def make_inputs(op, sizes=None, dtype="float32", seq_len_max=None, lazy=False):
    """Valid inputs of ``op`` for ``sizes``; ``lazy`` broadcasts a scalar (no memory)."""
    sizes = _sizes(op) if sizes is None else sizes
    rng = np.random.default_rng(0)
    inputs = {}
    for t in op.inputs:
        if t.dtype != "T":
            inputs[t.name] = np.int64(sizes["T"] if seq_len_max is None else seq_len_max)
        elif lazy:
            inputs[t.name] = np.broadcast_to(np.zeros((), dtype), t.concrete_shape(sizes))
        else:
            inputs[t.name] = rng.standard_normal(t.concrete_shape(sizes)).astype(dtype)
    return inputs


def names(op_name, *args):
    """Regex: message starts with ``<op_name>: `` and quotes every name in ``args``."""
    return f"^{re.escape(op_name)}: " + "".join(f"(?=.*'{re.escape(a)}')" for a in args) + ".*"


def _with(inputs, name, value):
    return {**inputs, name: value}


# --- valid inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_valid_inputs_pass(op_name, dtype):
    op = OPS[op_name]
    sig = validate_inputs(op, make_inputs(op, dtype=dtype))
    assert sig == Signature(dtype=dtype, sizes=_sizes(op), seq_len_max=SIZES["T"]
                            if op.kind == "sequence" else None)
    assert list(sig.sizes) == (["T"] if op.kind == "sequence" else []) + ["B", "I", "H"]
    assert hash(sig) == hash(Signature(dtype, dict(sig.sizes), sig.seq_len_max))


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_empty_batch_passes(op_name):
    op = OPS[op_name]
    sig = validate_inputs(op, make_inputs(op, _sizes(op, B=0)))
    assert sig.sizes["B"] == 0


@pytest.mark.parametrize("op_name", SEQ_OPS)
def test_empty_sequence_passes(op_name):
    op = OPS[op_name]
    sig = validate_inputs(op, make_inputs(op, _sizes(op, T=0), seq_len_max=0))
    assert (sig.sizes["T"], sig.seq_len_max) == (0, 0)


@pytest.mark.parametrize(
    "value",
    [0, 2, 3, np.int64(2), np.int32(2), np.uint8(2), np.array(2), np.array(2, dtype=np.int32)],
    ids=repr,
)
@pytest.mark.parametrize("op_name", SEQ_OPS)
def test_seq_len_max_forms_pass(op_name, value):
    op = OPS[op_name]
    sig = validate_inputs(op, _with(make_inputs(op), "seq_len_max", value))
    assert sig.seq_len_max == int(value) and type(sig.seq_len_max) is int


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_just_under_element_limit_passes(op_name):
    op = OPS[op_name]
    big = MAX_ELEMENTS // 4 - 1  # the largest tensor is the (rows, 4H) gates with H = 1
    sizes = _sizes(op, T=big, B=1, I=1, H=1) if op.kind == "sequence" else _sizes(op, B=big,
                                                                                  I=1, H=1)
    sig = validate_inputs(op, make_inputs(op, sizes, seq_len_max=0, lazy=True))
    assert sig.sizes == sizes


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_expected_output_shapes(op_name):
    op = OPS[op_name]
    sizes = _sizes(op)
    shapes = expected_output_shapes(op, sizes)
    assert list(shapes) == list(op.output_names)
    assert shapes == {t.name: t.concrete_shape(sizes) for t in op.outputs}
    assert all(all(type(d) is int for d in s) for s in shapes.values())


def test_validation_imports_neither_tvm_nor_tensorflow():
    pkg = pathlib.Path(__file__).resolve().parents[1] / "lstm_tvm"
    code = (
        "import sys, types; m = types.ModuleType('lstm_tvm'); m.__path__ = [%r]; "
        "sys.modules['lstm_tvm'] = m; import lstm_tvm.validation; "
        "bad = [k for k in sys.modules if k.split('.')[0] in ('tvm', 'tensorflow')]; "
        "assert not bad, bad" % str(pkg)
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- names -----------------------------------------------------------------------------------

ALL_INPUTS = [(n, t) for n in OPS for t in OPS[n].input_names]
EXTRA_INPUTS = [(n, e) for n in OPS for e in ("bogus", "seq_len_max", "x_grad", "dicfo")
                if e not in OPS[n].input_names]
UNKNOWN_ATTRS = [(n, b) for n in OPS for b in ("bogus", "forget_bias", "cell_clip", "T")
                 if b not in OPS[n].attr_names]


@pytest.mark.parametrize(("op_name", "input_name"), ALL_INPUTS)
def test_missing_input(op_name, input_name):
    op = OPS[op_name]
    inputs = make_inputs(op)
    del inputs[input_name]
    with pytest.raises(TypeError, match=names(op_name, input_name) + "missing"):
        validate_inputs(op, inputs)


@pytest.mark.parametrize(("op_name", "extra"), EXTRA_INPUTS)
def test_unexpected_input(op_name, extra):
    op = OPS[op_name]
    with pytest.raises(TypeError, match=names(op_name, extra) + "unexpected"):
        validate_inputs(op, _with(make_inputs(op), extra, np.zeros(1, np.float32)))


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_inputs_not_a_mapping(op_name):
    with pytest.raises(TypeError, match=names(op_name) + "expected inputs as a mapping"):
        validate_inputs(OPS[op_name], list(make_inputs(OPS[op_name]).values()))


@pytest.mark.parametrize(("op_name", "input_name"), FLOAT_INPUTS)
def test_input_not_an_array(op_name, input_name):
    op = OPS[op_name]
    with pytest.raises(TypeError, match=names(op_name, input_name) + "got list"):
        validate_inputs(op, _with(make_inputs(op), input_name, [1.0, 2.0]))


# --- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["float64", "int32", "int64", "bool", "complex64"])
@pytest.mark.parametrize(("op_name", "input_name"), FLOAT_INPUTS)
def test_wrong_dtype(op_name, input_name, bad):
    op = OPS[op_name]
    inputs = make_inputs(op)
    inputs[input_name] = inputs[input_name].astype(bad)
    with pytest.raises(TypeError, match=names(op_name, input_name)
                       + f"has dtype {bad}; expected float16 or float32"):
        validate_inputs(op, inputs)


@pytest.mark.parametrize(("base", "odd"), [("float32", "float16"), ("float16", "float32")])
@pytest.mark.parametrize(("op_name", "input_name"), FLOAT_INPUTS)
def test_mixed_dtypes(op_name, input_name, base, odd):
    op = OPS[op_name]
    inputs = make_inputs(op, dtype=base)
    inputs[input_name] = inputs[input_name].astype(odd)
    first = next(t.name for t in op.inputs if t.dtype == "T")
    with pytest.raises(TypeError, match=names(op_name, input_name, first) + "share one dtype"):
        validate_inputs(op, inputs)


# --- ranks, sizes and shapes -----------------------------------------------------------------

@pytest.mark.parametrize("delta", [-1, 1])
@pytest.mark.parametrize(("op_name", "input_name"), FLOAT_INPUTS)
def test_wrong_rank(op_name, input_name, delta):
    op = OPS[op_name]
    inputs = make_inputs(op)
    arr = inputs[input_name]
    inputs[input_name] = arr[..., None] if delta > 0 else arr[..., 0]
    rank = len(op.input(input_name).shape)
    with pytest.raises(ValueError, match=names(op_name, input_name) + f"expected rank {rank} "):
        validate_inputs(op, inputs)


def _non_source_dims():
    """(op, input, dim) for every dim not read as a size: all but x's dims and cs_prev's H."""
    return [(n, name, d) for n, name in FLOAT_INPUTS
            for d in range(len(OPS[n].input(name).shape))
            if name != "x" and (name, d) != ("cs_prev", 1)]


@pytest.mark.parametrize("op_name", list(OPS))
def test_sizes_are_read_from_x_and_cs_prev(op_name):
    op = OPS[op_name]
    x_axes = {"T": 0, "B": 1, "I": 2} if op.kind == "sequence" else {"B": 0, "I": 1}
    assert op.size_sources == {**{s: ("x", a) for s, a in x_axes.items()}, "H": ("cs_prev", 1)}


@pytest.mark.parametrize("delta", [-1, 1])
@pytest.mark.parametrize(("op_name", "input_name", "dim"), _non_source_dims())
def test_wrong_shape(op_name, input_name, dim, delta):
    op = OPS[op_name]
    spec = op.input(input_name)
    shape = list(spec.concrete_shape(_sizes(op)))
    shape[dim] += delta
    inputs = _with(make_inputs(op), input_name, np.zeros(shape, np.float32))
    want = re.escape(f"expected shape ({', '.join(spec.shape)}) = "
                     f"{spec.concrete_shape(_sizes(op))}, got {tuple(shape)}")
    with pytest.raises(ValueError, match=names(op_name, input_name) + want):
        validate_inputs(op, inputs)


@pytest.mark.parametrize(("op_name", "input_name", "dim"),
                         [(n, "x", d) for n in OPS for d in range(len(OPS[n].input("x").shape))]
                         + [(n, "cs_prev", 1) for n in OPS])
def test_size_source_disagrees(op_name, input_name, dim):
    """A size read from x or cs_prev that other inputs contradict is reported on those."""
    op = OPS[op_name]
    inputs = make_inputs(op)
    shape = list(inputs[input_name].shape)
    shape[dim] += 1
    inputs[input_name] = np.zeros(shape, np.float32)
    if op.kind == "sequence" and op.direction == "forward" and input_name == "x" and dim == 0:
        assert validate_inputs(op, inputs).sizes["T"] == SIZES["T"] + 1  # only x carries T
        return
    with pytest.raises(ValueError, match=names(op_name, input_name) + "expected shape"):
        validate_inputs(op, inputs)


@pytest.mark.parametrize("extra_cols", [1, 2, 3, -1])
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_w_columns_not_4h(op_name, extra_cols):
    op = OPS[op_name]
    inputs = make_inputs(op)
    rows, cols = inputs["w"].shape
    inputs["w"] = np.zeros((rows, cols + extra_cols), np.float32)
    with pytest.raises(ValueError, match=names(op_name, "w") + re.escape("(I+H, 4H)")):
        validate_inputs(op, inputs)


@pytest.mark.parametrize(("symbol", "source", "what"),
                         [("I", "x", "input size I"), ("H", "cs_prev", "cell size H")])
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_zero_size(op_name, symbol, source, what):
    op = OPS[op_name]
    inputs = make_inputs(op, _sizes(op, **{symbol: 0}))
    with pytest.raises(ValueError, match=names(op_name, source) + f"{what} must be >= 1, got"):
        validate_inputs(op, inputs)


# --- seq_len_max -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "exc", "fragment"),
    [
        (-1, ValueError, "expected 0 <= seq_len_max <= T = 3, got -1"),
        (4, ValueError, "expected 0 <= seq_len_max <= T = 3, got 4"),
        (2**62, ValueError, f"got {2**62}"),
        (-(2**62), ValueError, f"got {-(2**62)}"),
        (2**100, ValueError, f"got {2**100}"),
        (np.int64(2**62), ValueError, f"got {2**62}"),
        (np.uint64(2**64 - 1), ValueError, f"got {2**64 - 1}"),
        (np.array(2**62), ValueError, f"got {2**62}"),
        (np.int8(-1), ValueError, "got -1"),
        (2.0, TypeError, "expected an integer scalar, got float"),
        (np.float64(2.0), TypeError, "expected an integer scalar, got float64"),
        (np.float32(2.0), TypeError, "expected an integer scalar, got float32"),
        (np.array(2.0), TypeError, "expected an integer scalar, got an array of dtype float64"),
        (True, TypeError, "expected an integer scalar, got bool"),
        (np.bool_(True), TypeError, "expected an integer scalar, got bool"),
        (np.array(True), TypeError, "expected an integer scalar, got an array of dtype bool"),
        ("2", TypeError, "expected an integer scalar, got str"),
        (None, TypeError, "expected an integer scalar, got NoneType"),
        (np.array([1, 2]), ValueError, "expected a scalar, got shape (2,)"),
        (np.array([2]), ValueError, "expected a scalar, got shape (1,)"),
        (np.zeros((1, 1), np.int64), ValueError, "expected a scalar, got shape (1, 1)"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("op_name", SEQ_OPS)
def test_bad_seq_len_max(op_name, value, exc, fragment):
    op = OPS[op_name]
    with pytest.raises(exc, match=names(op_name, "seq_len_max") + re.escape(fragment)):
        validate_inputs(op, _with(make_inputs(op), "seq_len_max", value))


# --- element-count guard ---------------------------------------------------------------------

def _oversize_cases():
    cases = []
    for n, op in OPS.items():
        seq = op.kind == "sequence"
        lead = {"T": 2**16, "B": 2**15} if seq else {"B": 2**31}
        cases.append((n, "x", _sizes(op, **lead, I=1, H=1)))
        cases.append((n, "w", _sizes(op, T=1, B=1, I=2**29, H=1)))
        lead = {"T": 2**30, "B": 1} if seq else {"B": 2**30}
        cases.append((n, "i" if seq else "cs_prev", _sizes(op, **lead, I=1, H=2)))
        lead = {"T": 2**29, "B": 1} if seq else {"B": 2**29}
        cases.append((n, "dicfo" if "dicfo" in op.output_names else "gates",
                      _sizes(op, **lead, I=1, H=1)))
    return cases


@pytest.mark.parametrize(("op_name", "tensor", "sizes"), _oversize_cases(), ids=str)
def test_oversize(op_name, tensor, sizes):
    op = OPS[op_name]
    inputs = make_inputs(op, sizes, seq_len_max=0, lazy=True)
    with pytest.raises(ValueError, match=names(op_name, tensor) + r"fewer than 2\*\*31"):
        validate_inputs(op, inputs)


# --- attributes ------------------------------------------------------------------------------

def _required(op):
    return {a.name: False for a in op.attrs if a.required}


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_attr_defaults(op_name):
    op = OPS[op_name]
    out = validate_attrs(op, _required(op))
    assert list(out) == list(op.attr_names)
    assert out == {**op.defaults(), **_required(op)}


@pytest.mark.parametrize(("op_name", "attr"), ATTRS)
def test_attr_normalized(op_name, attr):
    op = OPS[op_name]
    if op.attr(attr).type is float:
        for value in (2, np.float32(0.5), np.int64(-1), 0.25):
            out = validate_attrs(op, {**_required(op), attr: value})[attr]
            assert type(out) is float and out == float(value)
    else:
        for value in (True, np.bool_(False)):
            out = validate_attrs(op, {**_required(op), attr: value})[attr]
            assert type(out) is bool and out == bool(value)


@pytest.mark.parametrize(("op_name", "bogus"), UNKNOWN_ATTRS)
def test_unknown_attr(op_name, bogus):
    op = OPS[op_name]
    valid = re.escape(str(list(op.attr_names)))
    with pytest.raises(TypeError, match=names(op_name, bogus) + f"{valid}"):
        validate_attrs(op, {**_required(op), bogus: 1.0})


@pytest.mark.parametrize("op_name", GRAD_OPS)
def test_missing_required_attr(op_name):
    with pytest.raises(TypeError, match=names(op_name, "use_peephole") + "missing required"):
        validate_attrs(OPS[op_name], {})


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_attrs_not_a_mapping(op_name):
    with pytest.raises(TypeError, match=names(op_name) + "expected attrs as a mapping"):
        validate_attrs(OPS[op_name], [("use_peephole", True)])


@pytest.mark.parametrize("value", [True, np.bool_(False), "1.0", None, [1.0], 1 + 0j],
                         ids=repr)
@pytest.mark.parametrize(("op_name", "attr"), FLOAT_ATTRS)
def test_float_attr_wrong_type(op_name, attr, value):
    op = OPS[op_name]
    with pytest.raises(TypeError, match=names(op_name, attr) + "expected a float, got"):
        validate_attrs(op, {**_required(op), attr: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")], ids=repr)
@pytest.mark.parametrize(("op_name", "attr"), [(n, a) for n, a in FLOAT_ATTRS if a != "cell_clip"])
def test_float_attr_not_finite(op_name, attr, value):
    """TF takes these for ``cell_clip`` too: see test_cell_clip_accepted_and_rejected_like_tf."""
    op = OPS[op_name]
    with pytest.raises(ValueError, match=names(op_name, attr) + "expected a finite float"):
        validate_attrs(op, {**_required(op), attr: value})


@pytest.mark.parametrize("value", [1, 0, 1.0, "true", None, np.int64(1), np.array(True)],
                         ids=repr)
@pytest.mark.parametrize(("op_name", "attr"), BOOL_ATTRS)
def test_bool_attr_wrong_type(op_name, attr, value):
    op = OPS[op_name]
    with pytest.raises(TypeError, match=names(op_name, attr) + "expected a bool, got"):
        validate_attrs(op, {**_required(op), attr: value})


# --- properties ------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(op_name=st.sampled_from(OP_NAMES), dtype=st.sampled_from(["float32", "float16"]),
       t=st.integers(0, 4), b=st.integers(0, 3), i=st.integers(1, 4), h=st.integers(1, 4),
       data=st.data())
def test_random_sizes_pass_and_one_bad_dim_fails(op_name, dtype, t, b, i, h, data):
    op = OPS[op_name]
    sizes = _sizes(op, T=t, B=b, I=i, H=h)
    slm = data.draw(st.integers(0, t))
    inputs = make_inputs(op, sizes, dtype=dtype, seq_len_max=slm)
    sig = validate_inputs(op, inputs)
    assert (sig.dtype, sig.sizes) == (dtype, sizes)
    assert sig.seq_len_max == (slm if op.kind == "sequence" else None)
    name, dim = data.draw(st.sampled_from([(n, d) for o, n, d in _non_source_dims()
                                           if o == op_name]))
    shape = list(inputs[name].shape)
    shape[dim] += data.draw(st.sampled_from([-1, 1, 7]))
    if shape[dim] >= 0:
        with pytest.raises(ValueError, match=names(op_name, name) + "expected shape"):
            validate_inputs(op, _with(inputs, name, np.zeros(shape, dtype)))


# --- cell_clip: what TF accepts --------------------------------------------------------------

#: ``cell_clip`` values to hold against TF: non-finite, past float32's range, zero, negative,
#: float32 denormals, float32's largest, an int beyond float64's range.
CELL_CLIP_VALUES = [math.inf, -math.inf, math.nan, np.float32("inf"), np.float16("nan"), 0.0,
                    -0.0, -1.0, 1e-50, 1e-40, 3.4e38, 3.4028235e38, 1e39, -1e39, 1e300,
                    -1e300, 10**400]
FORWARD_OPS = [n for n, op in OPS.items() if "cell_clip" in op.attr_names]


def _tf_accepts_cell_clip(tf, op, value) -> bool:
    """Whether ``tf.raw_ops.<op>`` runs with ``cell_clip=value`` (passed to TF as given)."""
    inputs = make_inputs(op, _sizes(op, T=1, B=1, I=1, H=1))
    kwargs = {n: tf.constant(v) for n, v in inputs.items()}
    try:
        getattr(tf.raw_ops, op.name)(**kwargs, cell_clip=value, use_peephole=False)
    except Exception:  # noqa: BLE001 - any refusal by TF counts
        return False
    return True


@pytest.mark.parametrize("op_name", FORWARD_OPS)
def test_cell_clip_accepted_and_rejected_like_tf(tf, op_name):
    """Every ``cell_clip`` TF accepts is accepted (as a finite float, so attribute sets stay
    comparable and JSON-safe); every one TF refuses is a ``ValueError`` naming it."""
    op = OPS[op_name]
    wrong = []
    for value in CELL_CLIP_VALUES:
        try:
            got = validate_attrs(op, {"cell_clip": value})["cell_clip"]
        except ValueError as err:
            got = err
        tf_ok = _tf_accepts_cell_clip(tf, op, value)
        if tf_ok and not (isinstance(got, float) and math.isfinite(got)):
            wrong.append(f"{value!r}: TF accepts it, lstm_tvm gave {got!r}")
        if not tf_ok and not (isinstance(got, ValueError)
                              and re.match(names(op_name, "cell_clip"), str(got))):
            wrong.append(f"{value!r}: TF refuses it, lstm_tvm gave {got!r}")
    assert not wrong, "\n".join(wrong)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))
