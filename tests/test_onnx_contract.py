"""One contract, five routes: malformed and edge-case models and feeds through every ONNX route.

The routes: plain onnxruntime on the ops' ONNX functions (``function``), the PyOp route
(``lstm_tvm.onnx.ort.InferenceSession``), the native custom-op library
(``lstm_tvm.onnx.native.InferenceSession``), ``lstm_tvm.relax.from_onnx`` compiled and run on
Relax's VM, and ``lstm_tvm.export.load`` (feeds only: it takes no model). Each route runs the
cases one after another in a child process of its own (a crash or a hang fails that case only:
the cases after it run in a new child) and every (case, route) has its documented outcome: the
float64 reference's values for valid edge cases, or an exception whose
message names the problem. What plain onnxruntime cannot see (an unknown attribute, the
domain's version: it never reads lstm_tvm's schemas) is marked so, and
:func:`lstm_tvm.onnx.check_model`, which the other routes run, refuses it.
"""

import copy
import dataclasses
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from _ort_harness import child_script
from onnx import TensorProto, helper

from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.registry import OPS

ort = pytest.importorskip("onnxruntime", reason="three of the routes run in onnxruntime")
pytest.importorskip("onnxruntime_extensions", reason="the PyOp route")

T, B, I, H = 4, 3, 5, 6
ROUTES = ("function", "pyop", "native", "relax", "export")
REF = ("ref",)
#: Plain onnxruntime runs the function body, which cannot see this; ``check_model`` can.
UNSEEN = ("unseen",)


@dataclasses.dataclass
class Case:
    """A model and feeds of ``op``; ``expect[route]``: ``REF``, ``UNSEEN``, ``None`` (the
    route does not apply: ``export`` takes no model) or a pattern of the error (``"<type>:
    <message>"``)."""

    model: onnx.ModelProto
    feeds: dict
    expect: dict
    op: str = "BlockLSTM"
    dtype: str = "float32"
    #: The model is valid and the feeds are not: no check of the model can see it.
    bad_feeds: bool = False


def _feeds(op="BlockLSTM", dtype="float32", steps=T, batch=B, **kw):
    seq = OPS[op].kind == "sequence"
    return testing.make_inputs(op, dtype=dtype, T=steps, B=batch, I=I, H=H,
                               attrs={"use_peephole": False} if "Grad" in op else None,
                               seq_len_max=kw.pop("seq_len_max", steps) if seq else None,
                               seed=3, **kw)


def _model(op="BlockLSTM", dtype="float32", attrs=None):
    return lo.make_model(op, dtype, input_size=I, cell_size=H, attrs=attrs)


def _with(model, edit):
    model = copy.deepcopy(model)
    edit(model)
    return model


def _input(model, name):
    return next(v for v in model.graph.input if v.name == name)


def _set_attr(name, value):
    def edit(model):
        node = model.graph.node[0]
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, value)])
    return edit


def _domain_version(version):
    def edit(model):
        for imp in list(model.opset_import):
            if imp.domain == lo.DOMAIN:
                if version is None:
                    model.opset_import.remove(imp)
                else:
                    imp.version = version
    return edit


def _double_w(model):
    _input(model, "w").type.tensor_type.elem_type = TensorProto.DOUBLE


def _missing_output(model):
    del model.graph.node[0].output[6]
    del model.graph.output[6]


def _second_writer(model):
    node = copy.deepcopy(model.graph.node[0])
    node.name = "second"
    model.graph.node.append(node)


def _input_size(size):
    def edit(model):
        _input(model, "x").type.tensor_type.shape.dim[2].dim_value = size
        _input(model, "w").type.tensor_type.shape.dim[0].dim_value = size + H
    return edit


def _x_rank_4(model):
    _input(model, "x").type.tensor_type.shape.dim.add().dim_value = 1


def _no_use_peephole(model):
    del model.graph.node[0].attribute[:]


def _cases():
    m = _model()
    f = _feeds()
    everywhere = dict.fromkeys(ROUTES, REF)
    model_only = {"export": None}
    fb = r"attribute 'forget_bias' expected a finite float, got nan"
    return {
        "valid": Case(m, f, everywhere),
        "batch-0": Case(m, _feeds(batch=0), everywhere),
        "steps-0": Case(m, _feeds(steps=0), everywhere),
        "float16": Case(_model(dtype="float16"), _feeds(dtype="float16"),
                        {**everywhere, "pyop": r"float16"}, dtype="float16"),
        "w-float64": Case(_with(m, _double_w), dict(f, w=f["w"].astype(np.float64)), {
            "function": r"BlockLSTM_input_check_w_has_the_type_of_x",
            **dict.fromkeys(("pyop", "native", "relax"),
                            r"TypeError: BlockLSTM node 'BlockLSTM': input 'w' expected "
                            r"float32 \(the type of 'x'\), got float64"),
            "export": r"TypeError: BlockLSTM: input 'w' expected dtype float32"}),
        "forget-bias-nan": Case(_with(m, _set_attr("forget_bias", float("nan"))), f, {
            "function": r"BlockLSTM_input_check_forget_bias_is_finite",
            **dict.fromkeys(("pyop", "native"), "ValueError: BlockLSTM node 'BlockLSTM': " + fb),
            "relax": fb, **model_only}),
        "unknown-attribute": Case(_with(m, _set_attr("foo", 1)), f, {
            "function": UNSEEN, **dict.fromkeys(("pyop", "native", "relax"),
                                                r"Unrecognized attribute: foo for operator "
                                                r"BlockLSTM"), **model_only}),
        "domain-version-2": Case(_with(m, _domain_version(2)), f, {
            "function": UNSEEN, **dict.fromkeys(("pyop", "native", "relax"),
                                                r"imports org\.lstm_tvm version 2; lstm_tvm "
                                                r"defines version 1"), **model_only}),
        "domain-not-imported": Case(_with(m, _domain_version(None)), f, {
            "function": r"org\.lstm_tvm", **dict.fromkeys(
                ("pyop", "native", "relax"), r"does not import the domain"), **model_only}),
        "missing-output": Case(_with(m, _missing_output), f, {
            "function": r"output index 6 is out of range; node has 6 outputs",
            **dict.fromkeys(("pyop", "native", "relax"),
                            r"output size 6 not in range \[min=7, max=7\]"), **model_only}),
        "outputs-written-twice": Case(_with(m, _second_writer), f, {
            "function": r"[Dd]uplicate definition", **dict.fromkeys(
                ("pyop", "native", "relax"), r"single static assignment"), **model_only}),
        "input-size-0": Case(_with(m, _input_size(0)),
                             dict(f, x=f["x"][..., :0], w=f["w"][I:]), {
            "function": r"shapes_agree_I_H_at_least_1",
            **dict.fromkeys(("pyop", "native", "relax"),
                            r"input 'x' dim 2 \(I\) expected >= 1, got 0"),
            "export": r"ValueError: BlockLSTM: input 'x' expected shape"}),
        "seq-len-max-above-T": Case(m, dict(f, seq_len_max=np.array(T + 1, np.int64)), {
            "function": r"input_check_0<=seq_len_max<=T",
            **dict.fromkeys(("pyop", "native", "relax", "export"), r"seq_len_max")},
            bad_feeds=True),
        "x-rank-4": Case(_with(m, _x_rank_4), dict(f, x=f["x"][..., None]), {
            "function": r"input_check_0<=seq_len_max<=T_and_shapes_agree",
            **dict.fromkeys(("pyop", "native", "relax"),
                            r"input 'x' expected rank 3, got rank 4"),
            "export": r"input 'x' expected rank 3"}),
        # ONNX Runtime's binding reads a big-endian array's bytes as native: wrong values on
        # the function and native routes (not lstm_tvm's to fix); the wrapper converts it.
        "big-endian-x": Case(m, dict(f, x=f["x"].astype(">f4")), {
            "function": None, "pyop": REF, "native": None, "relax": None, "export": REF}),
        "grad-without-use-peephole": Case(
            _with(_model("BlockLSTMGrad", attrs={"use_peephole": False}), _no_use_peephole),
            _feeds("BlockLSTMGrad"), {
                "function": r"BlockLSTMGrad_attribute_use_peephole_is_given",
                **dict.fromkeys(("pyop", "native", "relax"),
                                r"(?s)Required attribute 'use_peephole' is missing.*"
                                r"OpType: BlockLSTMGrad"), **model_only},
            op="BlockLSTMGrad"),
    }


CASES = _cases()

_CHILD = r"""
import json, sys, traceback
import numpy as np
import onnx
route, jobs = sys.argv[1], json.load(open(sys.argv[2]))
exports, library = sys.argv[3], sys.argv[4]

def function():
    import onnxruntime
    s = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {n: feeds[n] for n in names})

def pyop():
    from lstm_tvm.onnx import ort
    return ort.InferenceSession(model).run(None, {n: feeds[n] for n in names})

def native():
    from lstm_tvm.onnx import native as nat
    s = nat.InferenceSession(model, exports.split(","), library=library)
    return s.run(None, {n: nat.aligned_copy(feeds[n]) for n in names})

def relax():
    import tvm
    from tvm import relax as rx
    from lstm_tvm.relax import from_onnx
    vm = rx.VirtualMachine(tvm.compile(from_onnx(model), "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names])
    return [o.numpy() for o in out]

def export():
    from lstm_tvm.export import load
    folder = [e for e in exports.split(",") if e.endswith(meta["dtype"])][0]
    given = dict(feeds)
    if "seq_len_max" in given:
        given["seq_len_max"] = int(given["seq_len_max"])
    out = load(folder)[meta["op"]](**given)
    return [o.numpy() for o in out]

for job in jobs:
    case_dir = job["dir"]
    print("START " + job["name"], flush=True)
    meta = json.load(open(f"{case_dir}/meta.json"))
    model = onnx.load(f"{case_dir}/model.onnx")
    feeds = dict(np.load(f"{case_dir}/feeds.npz"))
    names = [v.name for v in model.graph.input]
    try:
        out = globals()[route]()
        np.savez(f"{case_dir}/{route}.npz", *[np.asarray(o) for o in out])
        row = {"route": route, "ran": True}
    except Exception as err:
        row = {"route": route, "ran": False, "error": f"{type(err).__name__}: {err}"}
    print("DONE " + json.dumps(row), flush=True)
"""


@pytest.fixture(scope="module")
def native_setup(tmp_path_factory):
    """``(export folders, library)``: BlockLSTM and BlockLSTMGrad exported at TF's default
    attributes, float32 and float16 (the folder name ends with the dtype)."""
    from lstm_tvm.export import export
    from lstm_tvm.onnx import native

    try:
        library = native.build_library()
    except FileNotFoundError as err:
        pytest.skip(f"cannot build the native custom-op library: {err}")
    root = tmp_path_factory.mktemp("contract_exports")
    folders = []
    for dtype in ("float32", "float16"):
        export(root / dtype, ["BlockLSTM", "BlockLSTMGrad"], dtype=dtype, input_size=I,
               cell_size=H, attrs={"use_peephole": False}, onnx=False, progress=False)
        folders.append(str(root / dtype))
    return ",".join(folders), library


def _write_case(name, folder):
    """The case's model, feeds and op in ``folder``; returns its job for the child."""
    case = CASES[name]
    folder.mkdir()
    onnx.save(case.model, folder / "model.onnx")
    np.savez(folder / "feeds.npz", **case.feeds)
    (folder / "meta.json").write_text(json.dumps({"op": case.op, "dtype": case.dtype}))
    return {"name": name, "dir": str(folder)}


def _run_child(route, spec, exports, library):
    """The child on ``route`` and the jobs in ``spec``: ``(stdout, how it ended)``, the second
    None when it exited normally."""
    cmd = [sys.executable, "-c", child_script(_CHILD), route, str(spec), exports, library]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else err.stdout or ""
        return out, f"the child hung (900 s); stderr:\n{err.stderr}"
    if done.returncode != 0:
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        return done.stdout, f"the child failed ({how}); stderr:\n{done.stderr[-6000:]}"
    return done.stdout, None


def _run_route(route, jobs, folder, native_setup):
    """``case -> row`` of ``route`` on every job, the cases one after another in a child
    process of this route alone. A case the child died or hung in gets ``{"crashed": ...}``
    and the cases after it run in a new child: a crash fails that case only."""
    exports, library = native_setup
    results, remaining, attempt = {}, list(jobs), 0
    while remaining:
        attempt += 1
        spec = folder / f"{route}.{attempt}.json"
        spec.write_text(json.dumps(remaining))
        out, crash = _run_child(route, spec, exports, library)
        started = None
        for line in out.splitlines():
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("DONE "):
                results[started], started = json.loads(line[len("DONE "):]), None
        if started is not None or crash is not None:
            where = started or next(j["name"] for j in remaining if j["name"] not in results)
            results[where] = {"route": route, "crashed": crash or "the child stopped in it"}
        remaining = [j for j in remaining if j["name"] not in results]
    return results


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, native_setup):
    """``(case -> route -> row, case -> folder)``: every case on each route that applies to it
    (a row: ``{"ran": ..., "error": ...}``; the route's outputs in the case's folder as
    ``<route>.npz``)."""
    folder = tmp_path_factory.mktemp("contract_cases")
    jobs = {name: _write_case(name, folder / f"case{k}") for k, name in enumerate(CASES)}
    by_case = {name: {} for name in CASES}
    for route in ROUTES:
        applies = [jobs[n] for n, case in CASES.items() if case.expect.get(route) is not None]
        for name, row in _run_route(route, applies, folder, native_setup).items():
            by_case[name][route] = row
    return by_case, {name: Path(job["dir"]) for name, job in jobs.items()}


def _expected(case):
    names = OPS[case.op].attr_names  # an unknown attribute is ignored where it runs
    attrs = {a.name: helper.get_attribute_value(a) for a in case.model.graph.node[0].attribute
             if a.name in names}
    attrs = {k: bool(v) if k == "use_peephole" else v for k, v in attrs.items()}
    return reference.run(case.op, case.feeds, attrs)


@pytest.mark.parametrize("name", list(CASES))
def test_every_route_keeps_the_contract(name, outcomes):
    """Each route's outcome for the case is its documented one."""
    case = CASES[name]
    by_case, folders = outcomes
    results, case_dir = by_case[name], folders[name]
    for route, row in results.items():
        assert "crashed" not in row, f"{name} on the {route} route: {row['crashed']}"
    assert sorted(results) == sorted(r for r in ROUTES if case.expect.get(r) is not None)
    for route, row in results.items():
        expect = case.expect[route]
        label = f"{name} on the {route} route"
        if expect in (REF, UNSEEN):
            assert row["ran"], f"{label}: {row.get('error')}"
            got = np.load(case_dir / f"{route}.npz")
            want = _expected(case)
            for k, out_name in enumerate(OPS[case.op].output_names):
                testing.assert_close(got[f"arr_{k}"], want[out_name], case.dtype,
                                     f"{label}: {out_name}")
        else:
            assert not row["ran"], f"{label}: ran, expected an error matching {expect!r}"
            assert re.search(expect, row["error"]), f"{label}: {row['error'][:2000]}"
    if UNSEEN in case.expect.values():  # what plain onnxruntime cannot see, the contract does
        with pytest.raises((TypeError, ValueError)):
            lo.check_model(case.model)


def test_routes_that_check_agree():
    """Where the PyOp, native and Relax routes check a model, they refuse it with one
    message (the contract's), and ``check_model`` gives it too."""
    for name, case in CASES.items():
        patterns = {case.expect[r] for r in ("pyop", "native", "relax")} - {REF, None}
        if case.dtype == "float16" or case.bad_feeds or not patterns:
            continue
        try:
            lo.check_model(case.model)
        except (TypeError, ValueError) as err:
            message = f"{type(err).__name__}: {err}"
            for pattern in patterns:
                assert re.search(pattern, message), f"{name}: {message}"
        else:
            raise AssertionError(f"{name}: check_model accepted a model the routes refuse")
