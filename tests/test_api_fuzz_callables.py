"""Property-based fuzz of the callables on TVM tensors: ``CompiledOp`` (``lstm_tvm.compile``) and
the exported library's ``ExportedOp`` (``lstm_tvm.export.load``), each in a child process.

Cases, malformations and the oracle come from ``test_api_fuzz.py`` (ranks, dims, dtypes,
``seq_len_max``, attributes, names, non-arrays, sizes past ``2**31`` elements, ``compile()``
arguments); added here is what only these callables see:

- inputs that are not TVM tensors: NumPy arrays (``CompiledOp`` refuses them, the loader copies
  them, in odd layouts too), shape-only objects, a TVM tensor as ``seq_len_max``, TVM views at a
  byte offset (the kernels refuse those: either outcome is allowed when no kernel has to run);
- ``out=``: valid, as a tuple, too short or long, not a sequence (a number, one tensor, a NumPy
  array), an entry that is not a TVM tensor, of the wrong shape or dtype, allocated for other
  sizes, the same tensor twice, a tensor sharing memory with an input (the same allocation,
  either way round), partly overlapping views;
- positional calls, too many positionals, an input given twice, attributes passed at call time.

Every case must match the float64 reference within ``lstm_tvm.testing``'s tolerances or raise
``ValueError``/``TypeError`` whose message starts with the op and names an input, output or
argument the case touched; a refused ``out=`` overlap must leave the inputs unchanged. The child
runs derandomized Hypothesis with a bounded example count (``LSTM_TVM_FUZZ_CALLABLE_EXAMPLES``);
a crash fails the test with the case it died in. The exported library is written once per module
and the exported path's child refuses to compile anything.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import tracemalloc

import numpy as np
import pytest
import test_api_fuzz as base

from lstm_tvm.registry import OPS

HERE = pathlib.Path(__file__).resolve()
#: Examples per path (``compiled``, ``exported``): the compiled path's time goes mostly into
#: compiling its 18 kernels; the exported path runs ~200 cases a second.
EXAMPLES = {"compiled": int(os.environ.get("LSTM_TVM_FUZZ_CALLABLE_EXAMPLES", "200")),
            "exported": int(os.environ.get("LSTM_TVM_FUZZ_CALLABLE_EXAMPLES", "600"))}
#: The one library the exported path loads (float32, I=3, H=5, as ``SIZE_SETS[0]``).
EXPORT = {"dtype": "float32", "input_size": 3, "cell_size": 5,
          "attrs": {"use_peephole": True, "cell_clip": 2.5}}
_OUT_KINDS = ("valid", "tuple", "short", "long", "number", "single_tensor", "numpy_array",
              "none_entry", "numpy_entry", "shape_only_entry", "shape", "dtype")
_ALIAS_KINDS = ("alias_same", "alias_input", "alias_partial", "offset_entry")
_TENSOR_KINDS = ("numpy", "numpy_fortran", "numpy_bigendian", "numpy_strided",
                 "numpy_broadcast", "shape_only", "offset_view")


@dataclasses.dataclass
class Plan:
    """How a case is called, beyond its inputs: per-input kinds, ``out=``, call style."""

    kinds: dict = dataclasses.field(default_factory=dict)
    out: tuple | None = None
    style: str = "keywords"
    extra_kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Call:
    """A materialised call and what its construction decided (the oracle's facts)."""

    args: list
    kwargs: dict
    out: object
    overlap: bool = False  # an out= tensor shares bytes with another output or an input
    offset: bool = False  # a TVM view with a byte offset is passed (the kernels refuse it)


# --- the child: strategies, materialising a call, oracle ------------------------------------

def callable_kinds(st, op, path: str) -> dict:
    """The base malformations of the ``compile`` path plus this module's, for ``path``."""
    by_kind = base.mutation_kinds(st, op, "compile")
    by_kind.pop("out")  # out= is drawn apart (out_strategy), in most cases
    if path == "exported":  # attributes and compile() arguments are fixed at export
        for kind in ("attr", "attr_unknown", "attr_missing", "compile_arg"):
            by_kind.pop(kind, None)
    names = [t.name for t in op.inputs if t.dtype == "T"]
    tensor_kind = st.tuples(st.sampled_from(names), st.sampled_from(_TENSOR_KINDS))
    if op.kind == "sequence":  # seq_len_max as a 0-d TVM tensor
        tensor_kind = st.one_of(tensor_kind, st.just(("seq_len_max", "tvm_tensor")))
    by_kind["tensor_kind"] = tensor_kind
    by_kind["call_style"] = st.tuples(st.sampled_from(["positional", "too_many", "dup"]))
    by_kind["attr_kwarg"] = st.tuples(st.sampled_from(list(op.attr_names)))
    return by_kind


def out_strategy(st):
    """``None`` (no ``out=``, half the cases) or an ``out`` / ``out_alias`` mutation."""
    return st.one_of(
        st.none(), st.none(),
        st.tuples(st.just("out"), st.sampled_from(_OUT_KINDS), st.integers(0, 63)),
        st.tuples(st.just("out_alias"), st.sampled_from(_ALIAS_KINDS), st.integers(0, 63),
                  st.integers(0, 63)))


def case_strategy(st, path: str):
    @st.composite
    def cases(draw):
        op_name = draw(st.sampled_from(list(OPS)))
        op = OPS[op_name]
        I, H, dtypes = base.SIZE_SETS[0]
        dtype = draw(st.sampled_from(dtypes)) if path == "compiled" else EXPORT["dtype"]
        # float16 without peephole only: 18 kernels to compile, not 24 (compiles dominate)
        peephole = path == "exported" or (dtype == "float32" and draw(st.booleans()))
        T = draw(st.integers(0, 5)) if op.kind == "sequence" else None
        B = draw(st.integers(0, 3))
        slm = draw(st.integers(0, T)) if T is not None else None
        n = draw(st.sampled_from([0, 0, 1, 1, 2]))
        kinds = base._one_of_kinds(st, callable_kinds(st, op, path))
        mutations = tuple(draw(kinds) for _ in range(n))
        out = draw(out_strategy(st))
        mutations += (out,) if out is not None else ()
        return base.Case(op_name, path, dtype, I, H, T, B, slm, peephole,
                         draw(st.integers(0, 2**16)), mutations)
    return cases()


def build(case: base.Case):
    """``(built, plan)``: the base inputs and malformations, then this module's."""
    ours = {"out", "out_alias", "tensor_kind", "call_style", "attr_kwarg"}
    built = base.build_case(dataclasses.replace(
        case, mutations=tuple(m for m in case.mutations if m[0] not in ours)))
    if case.path == "exported":
        from lstm_tvm.testing import op_attrs
        built.attrs = op_attrs(case.op, EXPORT["attrs"])
    op, plan = OPS[case.op], Plan()
    for kind, *args in (m for m in case.mutations if m[0] in ours):
        if kind in ("out", "out_alias"):
            plan.out = (args[0], *args[1:])
            built.touched.update(("out",) + op.output_names)
            if args[0] == "alias_input":
                built.touched.update(op.input_names)
        elif kind == "tensor_kind":
            plan.kinds[args[0]] = args[1]
            built.touched.add(args[0])
        elif kind == "call_style":
            plan.style = args[0]
            built.touched.update(op.input_names)
        else:  # attr_kwarg: an attribute passed at call time, as if it were an input
            plan.extra_kwargs[args[0]] = op.attr(args[0]).default or True
            built.touched.add(args[0])
    return built, plan


def _view(tvm, shape, dtype, offset: int, data=None):
    """A TVM view of ``shape`` at byte ``offset`` of a fresh allocation (filled from ``data``)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    owner = tvm.runtime.empty((offset + nbytes + 64,), "uint8")
    view = owner._create_view(shape, dtype, offset)
    if data is not None:
        view.copyfrom(np.ascontiguousarray(data))
    return view


def _convert(tvm, case, value, kind):
    """One float input as the call passes it: a TVM tensor unless ``kind`` says otherwise."""
    if not isinstance(value, np.ndarray):
        return value, False
    if kind == "shape_only":
        return base.FakeTensor(value.shape, value.dtype), False
    if kind and kind.startswith("numpy"):
        how = {"numpy_fortran": "fortran", "numpy_bigendian": "bigendian",
               "numpy_strided": "strided", "numpy_broadcast": "broadcast"}.get(kind)
        return (base._layout(value, how) if how and value.size <= base._LAZY else value), False
    if value.dtype.kind == "c" or value.size > base._LAZY:  # no TVM tensor of these
        return (value if case.path == "exported" else base.FakeTensor(value.shape, value.dtype),
                False)
    if kind == "offset_view":
        return _view(tvm, value.shape, value.dtype.name, 64, value), True
    return tvm.runtime.tensor(np.ascontiguousarray(value)), False


def materialise(case, built, plan: Plan, tvm) -> Call:
    """Turn ``built`` and ``plan`` into the call's arguments and ``out=``."""
    op = OPS[case.op]
    inputs, offset = {}, False
    for name, value in built.inputs.items():
        kind = plan.kinds.get(name)
        if name == "seq_len_max":
            as_tensor = kind and isinstance(value, (int, np.integer)) and not isinstance(
                value, (bool, np.bool_)) and -2**63 <= int(value) < 2**63
            inputs[name] = tvm.runtime.tensor(np.asarray(value, np.int64)) if as_tensor else value
        else:
            inputs[name], is_view = _convert(tvm, case, value, kind)
            offset |= is_view
            if isinstance(inputs[name], np.ndarray):  # a broadcast view has other values
                built.inputs[name] = inputs[name]
    call = Call([], {}, None, offset=offset)
    if plan.out is not None:
        call.out = _make_out(case, op, plan.out, inputs, call, tvm)
    present = [n for n in op.input_names if n in inputs]
    k = len(present) if plan.style != "keywords" else 0
    while k and present[:k] != list(op.input_names[:k]):
        k -= 1  # positionally only the prefix that is in order
    call.args = [inputs[n] for n in present[:k]]
    call.kwargs = {n: v for n, v in inputs.items() if n not in present[:k]}
    if plan.style == "too_many":
        call.args = [inputs[n] for n in present] + [None] * (len(op.input_names) + 1
                                                              - len(present))
        call.kwargs = {n: v for n, v in inputs.items() if n not in present}
    elif plan.style == "dup":  # the positional prefix again as keywords
        call.kwargs = dict(inputs)
    call.kwargs.update(plan.extra_kwargs)
    return call


def _make_out(case, op, spec: tuple, inputs: dict, call: Call, tvm):
    """``out=`` for ``spec`` (``(kind, i[, j])``), allocated for the case's own ``T``, ``B``."""
    kind, i, *j = spec
    sizes = {"T": case.T, "B": case.B, "I": case.I, "H": case.H}
    shapes = [t.concrete_shape(sizes) for t in op.outputs]
    out = [tvm.runtime.empty(s, case.dtype) for s in shapes]
    n, i = len(out), spec[1] % len(out)
    nbytes = [int(np.prod(s, dtype=np.int64)) * np.dtype(case.dtype).itemsize for s in shapes]
    other = {"float32": "float16", "float16": "float32"}[case.dtype]
    simple = {
        "valid": lambda: out, "tuple": lambda: tuple(out), "short": lambda: out[:-1],
        "long": lambda: out + [tvm.runtime.empty((1,), case.dtype)], "number": lambda: 3,
        "single_tensor": lambda: out[0], "numpy_array": lambda: np.zeros((n, 2), case.dtype),
        "none_entry": lambda: out[:i] + [None] + out[i + 1:],
        "numpy_entry": lambda: out[:i] + [np.zeros(shapes[i], case.dtype)] + out[i + 1:],
        "shape_only_entry": lambda: out[:i] + [base.FakeTensor(shapes[i], case.dtype)]
        + out[i + 1:],
        "shape": lambda: out[:i] + [tvm.runtime.empty(shapes[i][:-1] + (shapes[i][-1] + 1,),
                                                      case.dtype)] + out[i + 1:],
        "dtype": lambda: out[:i] + [tvm.runtime.empty(shapes[i], other)] + out[i + 1:],
    }
    if kind in simple:
        return simple[kind]()
    if kind == "alias_same":  # the same tensor for two outputs of one shape
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if shapes[a] == shapes[b]]
        a, b = pairs[i % len(pairs)]
        out[b] = out[a]
        call.overlap = nbytes[a] > 0
    elif kind == "alias_input":  # an output and an input in one allocation, both at offset 0
        tensors = [n_ for n_ in op.input_names if isinstance(inputs.get(n_), tvm.runtime.Tensor)
                   and inputs[n_].ndim > 0]
        if tensors:
            name = tensors[j[0] % len(tensors)]
            t = inputs[name]
            t_bytes = t.numel() * t.dtype.itemsize
            if t_bytes >= nbytes[i]:
                out[i] = t._create_view(shapes[i], case.dtype, 0)
            else:  # the input becomes a view of the output's memory, holding its own values
                view = out[i]._create_view(t.shape, str(t.dtype), 0)
                view.copyfrom(t.numpy())
                inputs[name] = view
            call.overlap = nbytes[i] > 0 and t_bytes > 0
    elif kind == "alias_partial":  # output b at byte 64 of output a's allocation
        a, b = i, (i + 1 + j[0] % (n - 1)) % n
        owner = tvm.runtime.empty((64 + max(nbytes) + 64,), "uint8")
        out[a] = owner._create_view(shapes[a], case.dtype, 0)
        out[b] = owner._create_view(shapes[b], case.dtype, 64)
        call.overlap, call.offset = nbytes[a] > 64 and nbytes[b] > 0, True
    else:  # offset_entry: a view at a byte offset of its own allocation
        out[i] = _view(tvm, shapes[i], case.dtype, 64)
        call.offset = True
    return out


def expected_outcome(case, built, plan: Plan, call: Call, tvm):
    """True: must succeed; False: must raise; None: either (success must then be right)."""
    op = OPS[case.op]
    saved, built.out = built.out, None  # out= is judged here, not by the base oracle
    try:
        valid = base.expected_valid(dataclasses.replace(case, path="compile"), built)
    finally:
        built.out = saved
    if not valid or plan.style in ("too_many", "dup") or plan.extra_kwargs:
        return False
    for kind in plan.kinds.values():
        if kind in ("shape_only", "tvm_tensor") or (
                kind.startswith("numpy") and case.path == "compiled"):
            return False
    if call.out is not None:
        x, cs = built.inputs["x"].shape, built.inputs["cs_prev"].shape
        sizes = {"T": x[0], "B": x[-2], "I": x[-1], "H": cs[1]}
        want = [t.concrete_shape(sizes) for t in op.outputs]
        out = call.out
        if not isinstance(out, (list, tuple)) or len(out) != len(want):
            return False
        for t, shape in zip(out, want):
            if not isinstance(t, tvm.runtime.Tensor) or tuple(t.shape) != shape \
                    or str(t.dtype) != built.dtype:
                return False
        if call.overlap:
            return False
    return None if call.offset else True


class CallableRunner(base.Runner):
    """Runs callable cases: ``CompiledOp`` (``compiled``) or the exported library."""

    def __init__(self, progress_path, path: str, export_dir: str | None):
        super().__init__(progress_path)
        self.path, self.library = path, None
        if path == "exported":
            from lstm_tvm import build as _build
            from lstm_tvm import export

            def refuse(*args, **kwargs):
                raise AssertionError("the exported path compiled something")
            _build.build = _build.get_module = self.tvm.compile = refuse
            self.library = export.load(export_dir)

    def run(self, case: base.Case) -> None:
        with open(self.progress_path, "w") as fh:
            fh.write(repr(case))
        self.stats["cases"] += 1
        self.stats[f"op {case.op}"] += 1
        for m in case.mutations:
            self.stats[f"mutation {m[0]}" + (f" {m[1]}" if m[0].startswith("out") else "")] += 1
        built, plan = build(case)
        call = materialise(case, built, plan, self.tvm)
        expected = expected_outcome(case, built, plan, call, self.tvm)
        built.out = plan.out[0] if plan.out else None
        before = self._snapshot(call) if call.overlap else None
        try:
            result = self._function(case, built)(*call.args, **call.kwargs, out=call.out)
        except (ValueError, TypeError) as err:
            assert expected is not True, f"valid case raised {type(err).__name__}: {err}\n{case}"
            self._check_message(case, built, err)
            self.stats["refused (either allowed)" if expected is None else "refused"] += 1
            if before is not None:
                assert self._snapshot(call) == before, f"a refused call changed inputs\n{case}"
                self.stats["overlapping out= refused"] += 1
            return
        except Exception as err:
            raise AssertionError(f"{type(err).__name__} (expected ValueError or TypeError): "
                                 f"{err}\n{case}") from err
        assert expected is not False, f"invalid case returned without an error\n{case}"
        if call.out is not None:
            assert all(r is o for r, o in zip(result, call.out)), "out= tensors not returned"
        self.stats["accepted (either allowed)" if expected is None else "accepted"] += 1
        self._check_result(case, OPS[case.op], built,
                           type(result)(*(t.numpy() for t in result)))

    def _function(self, case, built):
        if self.library is not None:
            return self.library[case.op]
        kw = built.compile_kw
        key = (case.op, repr(kw), repr(sorted(built.attrs.items(), key=str)))
        if key not in self.compiled:
            self.compiled[key] = self.lstm_tvm.compile(case.op, **kw, **built.attrs)
        return self.compiled[key]

    def _snapshot(self, call):
        values = [*call.args, *call.kwargs.values()]
        return [v.numpy().tobytes() for v in values if isinstance(v, self.tvm.runtime.Tensor)]


def callables_main(path: str, examples: int, out_path: str, export_dir: str | None) -> int:
    """The child's entry point: run the property for ``path``, write the statistics as JSON."""
    runner = CallableRunner(out_path + ".case", path, export_dir)
    return base.run_property(runner, lambda st: case_strategy(st, path), examples, out_path)


# --- the tests -------------------------------------------------------------------------------

def summarise(report: dict) -> dict:
    """The figures a closing note reports: cases, valid (matched the reference), errors by
    type, outcomes where either was allowed, distinct normalised messages, compiles."""
    stats = report["stats"]
    errors = {k[len("error "):]: v for k, v in stats.items() if k.startswith("error ")}
    return {"cases": stats["cases"], "valid": stats.get("valid", 0),
            "errors": sum(errors.values()), "errors_by_type": errors,
            "either_accepted": stats.get("accepted (either allowed)", 0),
            "either_refused": stats.get("refused (either allowed)", 0),
            "overlapping_out_refused": stats.get("overlapping out= refused", 0),
            "distinct_messages": len(report["messages"]), "kernels_compiled": report["builds"],
            "child_seconds": round(report["seconds"], 1)}


def _run_child(path: str, tmp_path, export_dir=None) -> dict:
    out = tmp_path / f"fuzz-{path}.json"
    code = (f"import sys; sys.path.insert(0, {str(HERE.parent)!r}); "
            f"import {HERE.stem} as m; "
            f"sys.exit(m.callables_main({path!r}, {EXAMPLES[path]}, {str(out)!r}, "
            f"{str(export_dir) if export_dir else None!r}))")
    report, _ = base.run_child(code, out)
    figures = summarise(report)
    print(f"\nfuzz {path}: {figures} (crashes: 0, the child exited cleanly)")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(report["stats"].items())
                           if k.startswith("mutation")))
    assert figures["cases"] >= min(EXAMPLES[path], 100)
    assert figures["valid"] >= figures["cases"] // 10, "too few valid cases to mean much"
    assert figures["errors"] >= figures["cases"] // 3, "too few malformed cases to mean much"
    assert report["stats"].get("overlapping out= refused", 0) > 0
    return figures


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """All six ops exported once for this module (float32, ``I=3``, ``H=5``, peephole on)."""
    import lstm_tvm.export
    out = tmp_path_factory.mktemp("fuzz_export")
    lstm_tvm.export.export(out, input_size=EXPORT["input_size"], cell_size=EXPORT["cell_size"],
                           dtype=EXPORT["dtype"], attrs=EXPORT["attrs"], onnx=False,
                           progress=False)
    return out


def test_fuzz_compiled_ops_in_a_child_process(tmp_path):
    figures = _run_child("compiled", tmp_path)
    assert figures["kernels_compiled"] <= 18  # 6 ops x 3 (dtype, peephole): then all cached


def test_fuzz_exported_library_in_a_child_process(tmp_path, export_dir):
    _run_child("exported", tmp_path, export_dir)


# --- the loader's checks, directly ------------------------------------------------------------

def _exported_inputs(op_name, B=2, T=3):
    from lstm_tvm import testing
    seq = OPS[op_name].kind == "sequence"
    return testing.make_inputs(op_name, B=B, I=EXPORT["input_size"], H=EXPORT["cell_size"],
                               T=T if seq else None, attrs=EXPORT["attrs"])


def test_exported_op_refuses_overlapping_out_and_runs_distinct_tensors(export_dir):
    import tvm

    import lstm_tvm.export
    from lstm_tvm import reference, testing
    fn = lstm_tvm.export.load(export_dir)["BlockLSTMGrad"]
    inputs = _exported_inputs("BlockLSTMGrad")
    args = {n: int(v) if n == "seq_len_max" else tvm.runtime.tensor(v) for n, v in inputs.items()}
    out = list(fn(**args))
    twice = out[:2] + [out[1]] + out[3:]  # h_prev_grad is cs_prev_grad
    with pytest.raises(ValueError, match="^BlockLSTMGrad: output 'h_prev_grad' shares memory "
                                         "with output 'cs_prev_grad'"):
        fn(**args, out=twice)
    with pytest.raises(ValueError, match="^BlockLSTMGrad: output 'cs_prev_grad' shares memory "
                                         "with input 'h_prev'"):
        fn(**args, out=out[:1] + [args["h_prev"]] + out[2:])
    assert np.array_equal(args["h_prev"].numpy(), inputs["h_prev"])  # refused before running
    fresh = [tvm.runtime.empty(t.shape, "float32") for t in out]
    result = fn(**args, out=fresh)
    want = reference.run("BlockLSTMGrad", inputs, {"use_peephole": True})
    for name, got, given in zip(result._fields, result, fresh):
        assert got is given
        testing.assert_close(got.numpy(), want[name], "float32", name)


def test_exported_op_refuses_sizes_past_2_31_elements_before_copying(export_dir):
    import lstm_tvm.export
    fn = lstm_tvm.export.load(export_dir)["BlockLSTM"]
    sizes = {"T": 2**16, "B": 2**15, "I": EXPORT["input_size"], "H": EXPORT["cell_size"]}
    lazy = {t.name: np.broadcast_to(np.zeros((), np.float32), t.concrete_shape(sizes))
            for t in OPS["BlockLSTM"].inputs if t.dtype == "T"}
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^BlockLSTM: input 'x' would have shape "
                           r"\[65536, 32768, 3\].*T=65536, B=32768.*fewer than 2\*\*31"):
            fn(seq_len_max=0, **lazy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated while refusing the call"


def test_callable_oracle_agrees_with_a_few_known_cases():
    """The oracle itself, on materialised calls (no kernel runs)."""
    import tvm
    seq = base.Case("BlockLSTM", "compiled", "float32", 3, 5, 4, 2, 3, False, 0, ())
    cell = dataclasses.replace(seq, op="LSTMBlockCell", T=None, seq_len_max=None)

    def outcome(case, *mutations):
        case = dataclasses.replace(case, mutations=mutations)
        built, plan = build(case)
        return expected_outcome(case, built, plan, materialise(case, built, plan, tvm), tvm)

    assert outcome(seq) is True and outcome(seq, ("out", "valid", 0)) is True
    assert outcome(seq, ("call_style", "positional")) is True
    for mutation in [("out", "short", 0), ("out", "number", 0), ("out", "shape", 3),
                     ("out", "none_entry", 1), ("out_alias", "alias_same", 0, 0),
                     ("out_alias", "alias_input", 0, 0), ("out_alias", "alias_partial", 0, 0),
                     ("tensor_kind", "x", "numpy"), ("tensor_kind", "seq_len_max", "tvm_tensor"),
                     ("call_style", "dup"), ("attr_kwarg", "cell_clip")]:
        assert outcome(seq, mutation) is False, mutation
    assert outcome(seq, ("tensor_kind", "w", "offset_view")) is None
    assert outcome(seq, ("out_alias", "offset_entry", 2, 0)) is None
    empty = dataclasses.replace(cell, B=0)  # nothing to overlap in empty tensors
    assert outcome(empty, ("out_alias", "alias_same", 0, 0)) is True
    exported = dataclasses.replace(seq, path="exported", use_peephole=True)
    assert outcome(exported, ("tensor_kind", "x", "numpy_bigendian")) is True
    assert outcome(exported, ("out_alias", "alias_input", 5, 7)) is False


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
