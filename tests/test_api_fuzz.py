"""Property-based fuzz: every malformed input to the six ops is a clean exception, never a crash.

Hypothesis draws a valid case (op, ``raw_ops`` or ``compile()`` path, dtype, ``T``, ``B``,
``seq_len_max``, peephole) and up to two malformations: ranks, dims (zeros and mismatches in
every pairing), dtypes (mixed, integer, float64, bool, complex), ``seq_len_max`` (negative,
``> T``, huge, non-scalar, wrong type), attributes of the wrong type or value, missing and
unexpected names, non-arrays, sizes past ``2**31`` elements, bad ``compile()`` arguments (and
valid NumPy integer sizes) and ``out=`` tensors; on the ``raw_ops`` path also valid odd layouts
(Fortran order, strides, negative strides, big-endian, read-only, broadcast views, TVM tensors).
An oracle written here from the documented rules (docs/guide/semantics.md, Validation; not
from ``validation.py``) says whether the case is valid. Valid cases must match the float64 reference; invalid ones must raise
``ValueError`` or ``TypeError`` whose message starts with ``"<Op>: "`` and names an input,
attribute or argument the case touched.

The fuzz runs in a child Python (``derandomize=True``, a bounded number of examples, the
session's ``LSTM_TVM_CACHE_DIR``), so a segfault or abort shows up as this test failing with the
child's exit code and the case it was running, not as a dead test run. ``I, H`` take two values
so that kernels compile once and stay cached. ``LSTM_TVM_FUZZ_EXAMPLES`` sets the example count.

``test_api_fuzz_callables.py`` reuses this case model and oracle for what only the
callables on TVM tensors see (``CompiledOp`` and the exported library's ``ExportedOp``): inputs
that are not TVM tensors, tensor views, and every kind of bad or overlapping ``out=``. Not fuzzed:
bad ``target=`` values (tested directly in ``test_api_errors.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import numbers
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from lstm_tvm.registry import DTYPES, OPS

HERE = pathlib.Path(__file__).resolve()
EXAMPLES = int(os.environ.get("LSTM_TVM_FUZZ_EXAMPLES", "400"))
#: ``(I, H, dtypes)``: two input/cell sizes, the second in float32 only, to bound compiles.
SIZE_SETS = ((3, 5, ("float32", "float16")), (7, 9, ("float32",)))
MAX_ELEMENTS = 2**31
F32_MAX = float(np.finfo(np.float32).max)
COMPILE_ARGS = ("dtype", "input_size", "cell_size")
#: Paths that take NumPy arrays, so that sizes past ``2**31`` elements are zero-stride views
#: (the others get shape-only objects).
LAZY_VIEW_PATHS = ("raw_ops", "exported")
#: Messages that name the op but no input (reported: ``CompiledOp`` could name 'x'/'cs_prev').
UNNAMED_OK = (r"compiled for (float16|float32), got (float16|float32) inputs$",)


# --- the child: cases, malformations, oracle -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    path: str  # "raw_ops" or "compile"
    dtype: str
    I: int
    H: int
    T: int | None
    B: int
    seq_len_max: int | None
    use_peephole: bool
    seed: int
    mutations: tuple


class FakeTensor:
    """An object with ``.shape`` and ``.dtype`` only: sizes far past memory, no data."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), str(dtype)

    def __repr__(self):
        return f"FakeTensor({self.shape}, {self.dtype})"


class RaisingDLPack:
    """An object whose ``__dlpack__`` fails (as a tensor on an unreachable device would)."""

    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("device not reachable")

    def __dlpack_device__(self):
        return (1, 0)


_SLM_VALID = {
    "py_int": int, "np_int64": np.int64, "np_int32": np.int32, "np_uint8": np.uint8,
    "0d_int32": lambda n: np.array(n, np.int32), "0d_int64": lambda n: np.array(n, np.int64),
}
_SLM_INVALID = {
    "neg1": lambda n, T: -1, "T+1": lambda n, T: T + 1, "T+7": lambda n, T: T + 7,
    "min_int64": lambda n, T: -(2**63), "2^31": lambda n, T: 2**31,
    "max_int64": lambda n, T: 2**63 - 1, "2^64": lambda n, T: 2**64, "2^100": lambda n, T: 2**100,
    "uint64_max": lambda n, T: np.uint64(2**64 - 1), "int8_neg": lambda n, T: np.int8(-1),
    "float": lambda n, T: float(n), "np_float32": lambda n, T: np.float32(n),
    "bool": lambda n, T: True, "np_bool": lambda n, T: np.bool_(False),
    "str": lambda n, T: str(n), "none": lambda n, T: None, "list": lambda n, T: [n],
    "arr1": lambda n, T: np.array([n]), "arr2": lambda n, T: np.array([n, n]),
    "arr11": lambda n, T: np.array([[n]]), "0d_float": lambda n, T: np.array(float(n)),
    "0d_bool": lambda n, T: np.array(True),
}
_FLOAT_ATTR_BAD = {
    "str": "1.0", "none": None, "bool": True, "np_bool": np.bool_(False), "list": [1.0],
    "complex": 1 + 0j, "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e39": 1e39,
    "-1e300": -1e300, "10**400": 10**400, "0d_array": np.array(1.0), "np_nan": np.float32("nan"),
}
_BOOL_ATTR_BAD = {
    "int1": 1, "int0": 0, "float": 1.0, "str": "true", "none": None, "np_int": np.int64(1),
    "0d_array": np.array(True), "list": [True],
}
_COMPILE_ARG_BAD = {
    "dtype": {"float64": "float64", "int32": "int32", "none": None, "upper": "FLOAT32",
              "np_type": np.float32, "bfloat16": "bfloat16"},
    "input_size": {"zero": 0, "neg": -1, "float": 2.5, "bool": True, "str": "3", "none": None,
                   "np_float": np.float64(3.0), "np_bool": np.bool_(True), "np_neg": np.int8(-1)},
    "cell_size": {"zero": 0, "neg": -1, "float": 2.5, "bool": True, "str": "3", "none": None,
                  "np_float": np.float64(3.0), "np_bool": np.bool_(True), "np_neg": np.int8(-1)},
}
#: Valid ``compile()`` sizes of another integer type (the case's value converted).
_COMPILE_ARG_INT_TYPES = {"np_int64": np.int64, "np_uint16": np.uint16, "np_int32": np.int32}
_BAD_DTYPES = ("float64", "int32", "int64", "uint8", "int8", "bool", "complex64", "other_float")
_NON_ARRAYS = ("list", "ragged", "none", "int", "str", "object", "dlpack_raises")
_LAYOUTS = ("fortran", "strided", "negstride", "bigendian", "readonly", "broadcast", "tvm")
_EXTRA_NAMES = ("bogus", "seq_len_max", "x_grad", "dicfo", "h", "cs_grad")
_UNKNOWN_ATTRS = ("bogus", "T", "forget_bias", "cell_clip", "use_peephole")


def _float_inputs(op):
    return [t.name for t in op.inputs if t.dtype == "T"]


def _mutation_strategy(st, op, path):
    """Hypothesis strategy of one malformation (a tuple of plain values) for ``op``: a kind
    first (all kinds equally likely), then its arguments."""
    return _one_of_kinds(st, mutation_kinds(st, op, path))


def _one_of_kinds(st, by_kind: dict):
    """A strategy drawing a kind (all equally likely), then its arguments: ``(kind, *args)``."""
    kinds = sorted(by_kind)
    return st.sampled_from(kinds).flatmap(
        lambda kind: by_kind[kind].map(lambda args: (kind, *args)))


def mutation_kinds(st, op, path) -> dict:
    """``{kind: strategy of its arguments}``: the malformations that apply to ``op`` on
    ``path`` (``"raw_ops"`` or ``"compile"``)."""
    floats = _float_inputs(op)
    names = st.sampled_from(floats)
    by_kind = {
        "rank": st.tuples(names, st.sampled_from(["append", "drop", "scalar", "prepend"])),
        "dim": st.tuples(names, st.integers(0, 2),
                         st.sampled_from(["zero", "minus1", "plus1", "plus7"])),
        "dtype": st.tuples(names, st.sampled_from(_BAD_DTYPES)),
        "all_dtype": st.tuples(st.sampled_from(["float64", "int32", "bool", "other_float"])),
        "seq_len_max": st.tuples(st.sampled_from(sorted(_SLM_INVALID) + sorted(_SLM_VALID))),
        "attr": st.one_of([st.tuples(st.just(a.name), st.sampled_from(
            sorted(_BOOL_ATTR_BAD if a.type is bool else _FLOAT_ATTR_BAD))) for a in op.attrs]),
        "attr_unknown": st.tuples(st.sampled_from(
            [a for a in _UNKNOWN_ATTRS if a not in op.attr_names])),
        "missing": st.tuples(st.sampled_from(list(op.input_names))),
        "extra": st.tuples(st.sampled_from([e for e in _EXTRA_NAMES if e not in op.input_names])),
        "non_array": st.tuples(names, st.sampled_from(_NON_ARRAYS)),
        "huge": st.tuples(st.sampled_from(["x", "all"])),
    }
    if any(a.required for a in op.attrs):
        by_kind["attr_missing"] = st.just(())
    if path == "raw_ops":
        by_kind["layout"] = st.tuples(names, st.sampled_from(_LAYOUTS))
    else:
        by_kind["compile_arg"] = st.one_of([st.tuples(st.just(arg), st.sampled_from(
            sorted(bad) + (sorted(_COMPILE_ARG_INT_TYPES) if arg != "dtype" else [])))
            for arg, bad in _COMPILE_ARG_BAD.items()])
        by_kind["out"] = st.tuples(st.sampled_from(["short", "shape", "dtype", "valid"]))
    return by_kind


def _case_strategy(st):
    @st.composite
    def cases(draw):
        op_name = draw(st.sampled_from(list(OPS)))
        op = OPS[op_name]
        path = draw(st.sampled_from(["raw_ops", "compile"]))
        I, H, dtypes = draw(st.sampled_from(SIZE_SETS))
        dtype = draw(st.sampled_from(dtypes))
        T = draw(st.integers(0, 5)) if op.kind == "sequence" else None
        B = draw(st.integers(0, 3))
        slm = draw(st.integers(0, T)) if T is not None else None
        n = draw(st.sampled_from([0, 1, 1, 1, 2]))
        mutations = tuple(draw(_mutation_strategy(st, op, path)) for _ in range(n))
        return Case(op_name, path, dtype, I, H, T, B, slm, draw(st.booleans()),
                    draw(st.integers(0, 2**16)), mutations)
    return cases()


@dataclasses.dataclass
class Built:
    """A case made concrete: the call's inputs, attrs, compile() arguments and ``out=``."""

    inputs: dict
    attrs: dict
    compile_kw: dict
    out: str | None = None
    touched: set = dataclasses.field(default_factory=set)
    dtype: str | None = None  # the inputs' dtype, set by the oracle for a valid case


def _other_float(dtype):
    return "float16" if dtype == "float32" else "float32"


#: Arrays with more elements are kept as zero-stride views: a malformation applied after
#: ``huge`` must not materialise gigabytes (the harness, not the library, would then OOM).
_LAZY = 2**20


def _new_array(shape, dtype, rng):
    if math.prod(shape) > _LAZY:
        return np.broadcast_to(np.zeros((), dtype), shape)
    return rng.uniform(-1, 1, shape).astype(dtype)


def _astype(arr, dtype):
    if arr.size > _LAZY:
        return np.broadcast_to(np.zeros((), dtype), arr.shape)
    return arr.astype(dtype)


def _apply(case: Case, built: Built, mutation, rng) -> None:
    """Apply one malformation to ``built`` in place; record the names it touched."""
    op = OPS[case.op]
    kind, args = mutation[0], mutation[1:]
    inputs, attrs = built.inputs, built.attrs
    if kind in ("rank", "dim", "dtype", "non_array", "layout"):
        name = args[0]
        arr = inputs.get(name)
        if not isinstance(arr, np.ndarray):
            return  # an earlier malformation removed or replaced it
        if arr.size > _LAZY and kind in ("non_array", "layout"):
            return  # no list or copy of a huge view
        built.touched.add(name)
        if kind == "rank":
            shape = {"append": arr.shape + (2,), "drop": arr.shape[:-1], "scalar": (),
                     "prepend": (1,) + arr.shape}[args[1]]
            inputs[name] = _new_array(shape, arr.dtype, rng)
        elif kind == "dim":
            if arr.ndim == 0:
                return
            axis = args[1] % arr.ndim
            shape = list(arr.shape)
            d = shape[axis]
            shape[axis] = {"zero": 0, "minus1": max(d - 1, 0), "plus1": d + 1,
                           "plus7": d + 7}[args[2]]
            inputs[name] = _new_array(shape, arr.dtype, rng)
            if name == "x" and axis == 0 and op.kind == "sequence":
                built.touched.add("seq_len_max")  # a new T can put seq_len_max out of range
        elif kind == "dtype":
            dt = _other_float(case.dtype) if args[1] == "other_float" else args[1]
            inputs[name] = _astype(arr, dt)
        elif kind == "non_array":
            inputs[name] = {
                "list": lambda: arr.tolist(), "ragged": lambda: [[1.0], [1.0, 2.0]],
                "none": lambda: None, "int": lambda: 3, "str": lambda: "abc",
                "object": lambda: object(), "dlpack_raises": lambda: RaisingDLPack(),
            }[args[1]]()
        else:  # layout: valid, odd memory layouts (raw_ops copies them)
            inputs[name] = _layout(arr, args[1])
    elif kind == "all_dtype":
        dt = _other_float(case.dtype) if args[0] == "other_float" else args[0]
        for name in _float_inputs(op):
            if isinstance(inputs.get(name), np.ndarray):
                inputs[name] = _astype(inputs[name], dt)
                built.touched.add(name)
    elif kind == "seq_len_max":
        built.touched.add("seq_len_max")
        token = args[0]
        n, T = case.seq_len_max or 0, case.T or 0
        inputs["seq_len_max"] = (_SLM_VALID[token](n) if token in _SLM_VALID
                                 else _SLM_INVALID[token](n, T))
    elif kind == "attr":
        built.touched.add(args[0])
        bad = _BOOL_ATTR_BAD if op.attr(args[0]).type is bool else _FLOAT_ATTR_BAD
        attrs[args[0]] = bad[args[1]]
    elif kind == "attr_unknown":
        built.touched.add(args[0])
        attrs[args[0]] = 1.0
    elif kind == "attr_missing":
        built.touched.update(a.name for a in op.attrs if a.required)
        for a in op.attrs:
            if a.required:
                attrs.pop(a.name, None)
    elif kind == "missing":
        built.touched.add(args[0])
        inputs.pop(args[0], None)
    elif kind == "extra":
        built.touched.add(args[0])
        inputs[args[0]] = np.zeros(1, case.dtype)
    elif kind == "huge":
        _huge(case, built, args[0])
    elif kind == "compile_arg":
        built.touched.add(args[0])
        if args[1] in _COMPILE_ARG_INT_TYPES:  # valid: the same size as a NumPy integer
            value = _COMPILE_ARG_INT_TYPES[args[1]](built.compile_kw[args[0]])
        else:
            value = _COMPILE_ARG_BAD[args[0]][args[1]]
        built.compile_kw[args[0]] = value
    elif kind == "out":
        built.touched.update(("out",) + op.output_names)
        built.out = args[0]
    else:
        raise AssertionError(kind)


def _layout(arr, how):
    if how == "fortran":
        return np.asfortranarray(arr)
    if how == "strided":
        return np.repeat(arr, 2, axis=-1)[..., ::2] if arr.ndim else arr
    if how == "negstride":
        return np.flip(np.flip(arr).copy()) if arr.ndim else arr
    if how == "bigendian":
        return arr.astype(arr.dtype.newbyteorder(">"))
    if how == "readonly":
        arr = arr.copy()
        arr.flags.writeable = False
        return arr
    if how == "broadcast":  # zero strides: every element equal to the first one
        return np.broadcast_to(arr.reshape(-1)[:1].reshape((1,) * arr.ndim), arr.shape) \
            if arr.size else arr
    import tvm
    return tvm.runtime.tensor(arr) if arr.dtype.kind != "c" else arr


def _huge(case: Case, built: Built, where: str) -> None:
    """Sizes past 2**31 elements, as zero-stride views (raw_ops) or shape-only objects."""
    op = OPS[case.op]
    big = {"T": 2**16, "B": 2**15} if op.kind == "sequence" else {"B": 2**29}
    sizes = {"T": case.T, "B": case.B, "I": case.I, "H": case.H, **big}
    names = ["x"] if where == "x" else _float_inputs(op)
    for name in names:
        if name not in built.inputs:
            continue
        shape = op.input(name).concrete_shape(sizes)
        built.inputs[name] = (np.broadcast_to(np.zeros((), case.dtype), shape)
                              if case.path in LAZY_VIEW_PATHS else FakeTensor(shape, case.dtype))
    if op.kind == "sequence" and where == "all" and "seq_len_max" in built.inputs:
        built.inputs["seq_len_max"] = 0
    built.touched.update(op.input_names)
    built.touched.update(op.output_names)
    built.touched.update(("xh", "gates"))


def build_case(case: Case) -> Built:
    """The valid inputs of ``case`` with its malformations applied."""
    from lstm_tvm import testing

    op = OPS[case.op]
    attrs = {"use_peephole": case.use_peephole}
    inputs = testing.make_inputs(case.op, dtype=case.dtype, B=case.B, I=case.I, H=case.H,
                                 T=case.T, seq_len_max=case.seq_len_max, attrs=attrs,
                                 seed=case.seed)
    if op.kind == "sequence":
        inputs["seq_len_max"] = int(case.seq_len_max)
    built = Built(inputs, attrs, {"dtype": case.dtype, "input_size": case.I,
                                  "cell_size": case.H})
    rng = np.random.default_rng(case.seed)
    for mutation in case.mutations:
        _apply(case, built, mutation, rng)
    return built


def _is_tensor(value) -> bool:
    """An array: NumPy (the compile path turns these into TVM tensors) or TVM."""
    import tvm
    return isinstance(value, (np.ndarray, tvm.runtime.Tensor, FakeTensor))


def _dtype_of(value) -> str:
    try:
        return np.dtype(value.dtype).name
    except TypeError:
        return str(value.dtype)


def _int_scalar(value):
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        return int(value)
    return None


def expected_valid(case: Case, built: Built) -> bool:
    """The oracle, from the documented rules: does this call have to succeed?"""
    op = OPS[case.op]
    inputs, attrs = built.inputs, built.attrs
    if set(inputs) != set(op.input_names) or not set(attrs) <= set(op.attr_names):
        return False
    if any(a.required and a.name not in attrs for a in op.attrs):
        return False
    for name, value in attrs.items():
        if op.attr(name).type is bool:
            if not isinstance(value, (bool, np.bool_)):
                return False
        elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            return False
        else:
            try:
                number = float(value)
            except OverflowError:
                return False
            # TF takes any cell_clip (NaN, +-inf: no clipping); other floats must be finite
            if name != "cell_clip" and not abs(number) <= F32_MAX:  # NaN fails this too
                return False
    if case.path == "compile":
        kw = built.compile_kw
        if kw["dtype"] not in DTYPES or any(
                isinstance(kw[k], (bool, np.bool_)) or not isinstance(kw[k], numbers.Integral)
                or kw[k] < 1 for k in ("input_size", "cell_size")):
            return False
    floats = _float_inputs(op)
    if not all(_is_tensor(inputs[n]) for n in floats):
        return False
    dtypes = {_dtype_of(inputs[n]) for n in floats}
    if len(dtypes) != 1 or not dtypes <= set(DTYPES):
        return False
    if case.path == "compile" and dtypes != {built.compile_kw["dtype"]}:
        return False
    (built.dtype,) = dtypes
    shapes = {n: tuple(inputs[n].shape) for n in floats}
    if any(len(shapes[n]) != len(op.input(n).shape) for n in floats):
        return False
    x, cs = shapes["x"], shapes["cs_prev"]
    sizes = {"B": x[-2], "I": x[-1], "H": cs[1]}
    if op.kind == "sequence":
        sizes["T"] = x[0]
    if sizes["I"] < 1 or sizes["H"] < 1:
        return False
    if any(shapes[n] != op.input(n).concrete_shape(sizes) for n in floats):
        return False
    if op.kind == "sequence":
        n = _int_scalar(inputs["seq_len_max"])
        if n is None or not 0 <= n <= sizes["T"]:
            return False
    rows = sizes.get("T", 1) * sizes["B"]
    counts = [math.prod(t.concrete_shape(sizes)) for t in op.inputs + op.outputs]
    counts += [rows * (sizes["I"] + sizes["H"]), rows * 4 * sizes["H"]]
    if max(counts) >= MAX_ELEMENTS:
        return False
    if case.path == "compile":
        if (sizes["I"], sizes["H"]) != (built.compile_kw["input_size"],
                                        built.compile_kw["cell_size"]):
            return False
        if any(isinstance(inputs[n], FakeTensor) for n in floats):
            raise AssertionError("the fuzz passes shape-only objects only with bad sizes")
        if built.out in ("short", "shape", "dtype"):
            return False
        if built.out and op.kind == "sequence" and (sizes["T"], sizes["B"]) != (case.T, case.B):
            return False  # out= was allocated for the case's T and B
        if built.out and sizes["B"] != case.B:
            return False
    return True


def _reference_inputs(op, inputs):
    out = {}
    for name in op.input_names:
        value = inputs[name]
        if name == "seq_len_max":
            out[name] = int(np.asarray(value))
        else:
            out[name] = np.asarray(value.numpy() if hasattr(value, "numpy") else value,
                                   dtype=np.float64)
    return out


class Runner:
    """Runs cases, checks outcomes and keeps the statistics."""

    def __init__(self, progress_path):
        import tvm

        import lstm_tvm
        from lstm_tvm import build, reference, testing

        self.tvm, self.lstm_tvm, self.reference, self.testing = tvm, lstm_tvm, reference, testing
        self.progress_path = progress_path
        self.compiled = {}
        self.stats = collections.Counter()
        self.messages = collections.Counter()
        self.unnamed = collections.Counter()
        self.builds = 0
        original = build.build

        def counting_build(spec):
            self.builds += 1
            return original(spec)

        build.build = counting_build

    def run(self, case: Case) -> None:
        with open(self.progress_path, "w") as fh:  # the case a crash would have died in
            fh.write(repr(case))
        self.stats["cases"] += 1
        self.stats[f"path {case.path}"] += 1
        self.stats[f"op {case.op}"] += 1
        for m in case.mutations:
            self.stats[f"mutation {m[0]}"] += 1
        built = self._current = build_case(case)
        valid = expected_valid(case, built)
        op = OPS[case.op]
        try:
            result = self._call(case, built)
        except (ValueError, TypeError) as err:
            assert not valid, f"valid case raised {type(err).__name__}: {err}\n{case}"
            self._check_message(case, built, err)
            return
        except Exception as err:
            raise AssertionError(f"{type(err).__name__} (expected ValueError or TypeError): "
                                 f"{err}\n{case}") from err
        assert valid, f"invalid case returned without an error\n{case}"
        self._check_result(case, op, built, result)

    def _call(self, case: Case, built: Built):
        op = OPS[case.op]
        if case.path == "raw_ops":
            kwargs = {**built.inputs, **built.attrs}  # one keyword even if named in both
            return getattr(self.lstm_tvm.raw_ops, case.op)(**kwargs)
        kw = built.compile_kw
        key = (case.op, repr(kw), repr(sorted(built.attrs.items(), key=str)))
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.lstm_tvm.compile(case.op, **kw, **built.attrs)
            self.compiled[key] = fn
        args = {n: self._to_tvm(v) if n != "seq_len_max" else v
                for n, v in built.inputs.items()}
        out = self._out(case, op, fn) if built.out else None
        result = fn(**args, out=out)
        return type(result)(*(t.numpy() for t in result))

    def _to_tvm(self, value):
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "c" or value.size > _LAZY:
                return FakeTensor(value.shape, value.dtype)
            return self.tvm.runtime.tensor(np.ascontiguousarray(value))
        return value

    def _out(self, case: Case, op, fn):
        sizes = {"T": case.T, "B": case.B, "I": case.I, "H": case.H}
        shapes = [t.concrete_shape(sizes) for t in op.outputs]
        kind = self._current.out
        if kind == "short":
            shapes = shapes[:-1]
        dtypes = [case.dtype] * len(shapes)
        if kind == "shape":
            shapes[0] = shapes[0] + (1,)
        if kind == "dtype":
            dtypes[0] = _other_float(case.dtype)
        return [self.tvm.runtime.empty(s, d, fn.device) for s, d in zip(shapes, dtypes)]

    def _check_message(self, case: Case, built: Built, err) -> None:
        msg = str(err)
        assert msg.startswith(f"{case.op}: "), f"message does not start with the op: {msg!r}"
        touched = built.touched | ({"out"} if built.out else set())
        named = any(f"'{n}'" in msg for n in touched) or any(
            re.search(rf"\b{n}\b", msg) for n in touched & {*COMPILE_ARGS, "out"})
        if not named:
            pattern = next((p for p in UNNAMED_OK if re.search(p, msg)), None)
            assert pattern, f"message names none of {sorted(touched)}: {msg!r}\n{case}"
            self.unnamed[pattern] += 1
        self.stats[f"error {type(err).__name__}"] += 1
        self.messages[normalise(msg)] += 1

    def _check_result(self, case: Case, op, built: Built, result) -> None:
        self.stats["valid"] += 1
        ref = self.reference.run(case.op, _reference_inputs(op, built.inputs), built.attrs)
        assert result._fields == op.output_names
        for name in op.output_names:
            value = getattr(result, name)
            assert value.dtype == np.dtype(built.dtype), f"{case.op}.{name}: {value.dtype}"
            self.testing.assert_close(value, ref[name], built.dtype, f"{case.op}.{name}")


def normalise(msg: str) -> str:
    """An error message with addresses and numbers replaced, to count distinct messages."""
    msg = re.sub(r"0x[0-9a-fA-F]+", "ADDR", msg)  # numbers, not the digits of names (float32)
    return re.sub(r"(?<![A-Za-z_\d])\d+(\.\d+)?(e[+-]?\d+)?", "N", msg)


def fuzz_main(examples: int, out_path: str) -> int:
    """The child's entry point: run the property, write the statistics as JSON."""
    return run_property(Runner(out_path + ".case"), lambda st: _case_strategy(st), examples,
                        out_path)


def run_property(runner, strategy, examples: int, out_path: str) -> int:
    """Run ``runner.run`` on ``examples`` derandomized cases drawn from ``strategy(st)`` and
    write the runner's statistics to ``out_path`` as JSON (the fuzz children's main)."""
    import faulthandler
    import warnings

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    faulthandler.enable()
    warnings.simplefilter("ignore")
    start = time.perf_counter()

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=strategy(st))
    def prop(case):
        runner.run(case)

    prop()
    with open(out_path, "w") as fh:
        json.dump({"stats": dict(runner.stats), "messages": dict(runner.messages),
                   "unnamed": dict(runner.unnamed), "builds": runner.builds,
                   "seconds": time.perf_counter() - start}, fh, indent=1)
    return 0


# --- the test --------------------------------------------------------------------------------

def run_child(code: str, out: pathlib.Path) -> tuple[dict, float]:
    """Run ``python -c code`` (a fuzz driver writing its JSON report to ``out`` and the case it
    is on to ``out.case``); returns the report and the wall seconds. A child that did not exit
    cleanly (an exception, or a crash by signal) fails the test with its last case."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    wall = time.perf_counter() - start
    case_file = pathlib.Path(str(out) + ".case")
    last = case_file.read_text() if case_file.exists() else "(none)"
    assert done.returncode == 0, (
        f"fuzz child exited with {done.returncode}"
        f"{f' (killed by signal {-done.returncode})' if done.returncode < 0 else ''}; "
        f"last case: {last}\n--- stderr (tail) ---\n{done.stderr[-6000:]}")
    return json.loads(out.read_text()), wall


def test_fuzz_all_ops_in_a_child_process(tmp_path):
    out = tmp_path / "fuzz.json"
    code = (f"import runpy, sys; ns = runpy.run_path({str(HERE)!r}); "
            f"sys.exit(ns['fuzz_main']({EXAMPLES}, {str(out)!r}))")
    report, wall = run_child(code, out)
    stats = report["stats"]
    errors = sum(v for k, v in stats.items() if k.startswith("error "))
    print(f"\nfuzz: {stats['cases']} cases in {wall:.1f} s (child {report['seconds']:.1f} s, "
          f"{report['builds']} kernels compiled): {stats.get('valid', 0)} valid and matched "
          f"the reference, {errors} raised ({stats.get('error ValueError', 0)} ValueError, "
          f"{stats.get('error TypeError', 0)} TypeError); "
          f"{len(report['messages'])} distinct error messages after normalising numbers")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.items())
                           if k.startswith(("path", "op", "mutation"))))
    if report["unnamed"]:
        print(f"  messages naming the op but no input (CompiledOp): {report['unnamed']}")
    assert stats["cases"] >= min(EXAMPLES, 100)
    assert stats.get("valid", 0) >= stats["cases"] // 10, "too few valid cases to mean much"
    assert errors >= stats["cases"] // 2, "too few malformed cases to mean much"
    assert stats["path raw_ops"] and stats["path compile"]


def test_oracle_agrees_with_a_few_known_cases():
    """The oracle itself: a valid base case, and one malformation of each family."""
    base = Case("BlockLSTM", "raw_ops", "float32", 3, 5, 4, 2, 3, False, 0, ())
    assert expected_valid(base, build_case(base))
    for mutation in [("rank", "w", "drop"), ("dim", "b", 0, "plus1"), ("dtype", "x", "int32"),
                     ("seq_len_max", "T+1"), ("attr", "cell_clip", "10**400"), ("missing", "b"),
                     ("extra", "dicfo"), ("non_array", "x", "ragged"), ("huge", "all"),
                     ("attr_unknown", "bogus")]:
        case = dataclasses.replace(base, mutations=(mutation,))
        assert not expected_valid(case, build_case(case)), mutation
    for mutation in [("layout", "w", "bigendian"), ("seq_len_max", "0d_int32"),
                     ("attr", "cell_clip", "1e39"), ("attr", "cell_clip", "nan"),
                     ("dim", "x", 0, "plus7")]:  # x alone carries T in the forward
        case = dataclasses.replace(base, mutations=(mutation,))
        assert expected_valid(case, build_case(case)), mutation


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
