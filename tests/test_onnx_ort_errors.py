"""Malformed lstm_tvm nodes and inputs in ONNX Runtime: an error (a Python exception), never an abort.

Routes: ``function`` (the ONNX functions in a plain session), ``pyop`` (the PyOps through
:class:`lstm_tvm.onnx.ort.InferenceSession`), ``pyop_plain`` (the PyOps in a plain session, where
a failing PyOp cannot raise: its outputs are zeros and the failure is logged and kept in
:func:`~lstm_tvm.onnx.ort.last_error`) and ``native`` (the C++ library). Graph inputs
are declared without shapes, so malformed inputs reach the nodes instead of onnxruntime's own
input checks.

Each route's cases run in one child process, one after the other, each announced before it
starts: a case that kills the child (an abort, a segfault, a hang) fails as ``aborted`` and the
child is restarted for the cases after it, so one abort fails one test and never the run.
Cases that must run are compared with the float64 reference.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from _ort_harness import ROUTES, child_script
from onnx import AttributeProto, TensorProto, helper

from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.registry import OPS

pytest.importorskip("onnxruntime", reason="these are onnxruntime routes")

T, B, I, H = 4, 3, 5, 6
ATTRS = {"use_peephole": True}
CHILD_TIMEOUT_S = 300


def _feed(**changes):
    def mutate(model, inputs):
        inputs.update({k: f(inputs) for k, f in changes.items()})
    return mutate


def _declare(elem):
    """Declare every float graph input and output as ``elem`` and feed that type."""
    def mutate(model, inputs):
        for v in list(model.graph.input) + list(model.graph.output):
            if v.type.tensor_type.elem_type == TensorProto.FLOAT:
                v.type.tensor_type.elem_type = elem
        np_type = helper.tensor_dtype_to_np_dtype(elem)
        for k, v in inputs.items():
            if v.dtype == np.float32:
                inputs[k] = v.astype(np_type)
    return mutate


def _attr(name, value=None, attr_type=None):
    """Replace (or, with no value, remove) the node's attribute ``name``."""
    def mutate(model, inputs):
        node = model.graph.node[0]
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept)
        if value is not None:
            node.attribute.append(helper.make_attribute(name, value, attr_type=attr_type))
    return mutate


def _zeros(*shape):
    return lambda inputs: np.zeros(shape, np.float32)


def _seq(value, dtype=np.int64):
    return lambda inputs: np.asarray(value, dtype)


INPUT_TYPE = "Unexpected input data type"
SEQ_RANGE = r"seq_len_max"
NO_FIT = r"no loaded export fits"
OK = None  # the case runs and matches the reference
# name: (op, batch, mutation, {route: expected error regex or OK}); "*" is every other route
CASES = {
    "x_rank_2": ("BlockLSTMV2", B, _feed(x=lambda i: i["x"][0]),
                 {"function": r"Slice|input_check", "native": NO_FIT, "*": r"'x' expected rank"}),
    "cell_x_rank_1": ("LSTMBlockCell", B, _feed(x=lambda i: i["x"][0]),
                      {"function": "input_check", "native": NO_FIT, "*": r"'x' expected rank"}),
    "w_shape": ("BlockLSTMV2", B, _feed(w=_zeros(I + H + 1, 4 * H)),
                {"function": "input_check", "native": NO_FIT, "*": r"'w' expected shape"}),
    "h_grad_T_disagrees": ("BlockLSTMGradV2", B, _feed(h_grad=_zeros(T + 1, B, H)),
                           {"function": "input_check", "native": r"input h_grad: dim 0 \(T\)",
                            "*": r"'h_grad' expected shape"}),
    "h_prev_B_disagrees": ("BlockLSTMV2", B, _feed(h_prev=_zeros(B + 1, H)),
                           {"function": "input_check", "native": r"input h_prev: dim 0 \(B\)",
                            "*": r"'h_prev' expected shape"}),
    "x_fed_float64": ("BlockLSTMV2", B, _feed(x=lambda i: i["x"].astype(np.float64)),
                      {"*": INPUT_TYPE}),
    "seq_len_max_fed_int32": ("BlockLSTMV2", B, _feed(seq_len_max=_seq(T, np.int32)),
                              {"*": INPUT_TYPE}),
    "model_float64": ("BlockLSTMV2", B, _declare(TensorProto.DOUBLE),
                      {"function": "dtype_is_float_or_float16", "pyop": "float64",
                       "*": r"Type 'tensor\(double\)' of input parameter \(x\)"}),
    "model_int32": ("BlockLSTMGradV2", B, _declare(TensorProto.INT32),
                    {"function": "dtype_is_float_or_float16", "pyop": "int32",
                     "*": r"Type 'tensor\(int32\)' of input parameter \(x\)"}),
    "seq_len_max_above_T": ("BlockLSTMV2", B, _feed(seq_len_max=_seq(T + 1)), {"*": SEQ_RANGE}),
    "seq_len_max_negative": ("BlockLSTMGradV2", B, _feed(seq_len_max=_seq(-1)),
                             {"*": SEQ_RANGE}),
    "seq_len_max_vector": ("BlockLSTMV2", B, _feed(seq_len_max=_seq([T])),
                           {"function": "input_check", "native": NO_FIT, "*": "seq_len_max"}),
    "use_peephole_missing": ("BlockLSTMGradV2", B, _attr("use_peephole"),
                             {"function": "Constant", "*": "use_peephole"}),
    "use_peephole_float": ("BlockLSTMV2", B, _attr("use_peephole", 1.0, AttributeProto.FLOAT),
                           {"function": "value_int", "*": "use_peephole"}),
    "use_peephole_2": ("BlockLSTMV2", B, _attr("use_peephole", 2, AttributeProto.INT),
                       {"function": "use_peephole_0_or_1", "*": "use_peephole"}),
    "cell_clip_int": ("LSTMBlockCell", B, _attr("cell_clip", 3, AttributeProto.INT),
                      {"function": "value_float", "*": "cell_clip"}),
    "cell_clip_string": ("BlockLSTMV2", B, _attr("cell_clip", b"3", AttributeProto.STRING),
                         {"function": "value_float", "*": "cell_clip"}),
    # optional attribute left out: TF's default, except natively (exports bake attributes) and
    # in a plain session with the PyOps (onnxruntime-extensions wants every declared attribute)
    "cell_clip_missing": ("BlockLSTMV2", B, _attr("cell_clip"),
                          {"native": "attribute cell_clip", "pyop_plain": "cell_clip", "*": OK}),
    "empty_batch_sequence": ("BlockLSTMV2", 0, _feed(), {"*": OK}),
    "empty_batch_grad": ("BlockLSTMGradV2", 0, _feed(), {"*": OK}),
    "empty_batch_cell": ("LSTMBlockCell", 0, _feed(), {"*": OK}),
    "seq_len_max_0": ("BlockLSTMGradV2", B, _feed(seq_len_max=_seq(0)), {"*": OK}),
}
EXPORT_OPS = sorted({op for op, *_ in CASES.values()})


def _expected(case, route):
    table = CASES[case][3]
    return table.get(route, table.get("*"))


def _inputs(case):
    op, batch, _, _ = CASES[case]
    kw = {} if OPS[op].kind == "cell" else {"T": T}
    return testing.make_inputs(op, B=batch, I=I, H=H, attrs=ATTRS, seed=0, **kw)


def _write_case(case, route, folder):
    """The case's model (graph inputs without shapes) and feeds, written into ``folder``."""
    op, _, mutate, _ = CASES[case]
    model = lo.make_model(op, "float32", input_size=I, cell_size=H, attrs=ATTRS,
                          with_functions=route == "function")
    for v in model.graph.input:
        v.type.tensor_type.ClearField("shape")
    inputs = _inputs(case)
    mutate(model, inputs)
    onnx.save(model, folder / f"{case}.onnx")
    np.savez(folder / f"{case}.in.npz", **inputs)
    return {"name": case, "model": str(folder / f"{case}.onnx"),
            "feeds": str(folder / f"{case}.in.npz"), "out": str(folder / f"{case}.out.npz")}


_CHILD = child_script("""
    import json, sys
    import numpy as np, onnx
    from _ort_harness import open_session, run_session

    spec = json.load(open(sys.argv[1]))
    route = spec["route"]
    if route.startswith("pyop"):
        from lstm_tvm.onnx import ort as lort

    for job in spec["jobs"]:
        print("START " + job["name"], flush=True)
        result = {"name": job["name"]}
        before = lort.last_error() if route.startswith("pyop") else None
        try:
            s = open_session(onnx.load(job["model"]), route, exports=spec.get("exports", ()),
                             library=spec.get("library"), quiet=True)
            np.savez(job["out"], **run_session(s, dict(np.load(job["feeds"]))))
            result["status"] = "ran"
        except Exception as exc:
            result.update(status="error", message=f"{type(exc).__name__}: {exc}")
        if route.startswith("pyop") and lort.last_error() is not before:
            result["logged"] = repr(lort.last_error())
        print("DONE " + json.dumps(result), flush=True)
""")


def _run_child(spec_path):
    """Run the child; returns (rc, stdout, stderr); a hang counts as rc None."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(spec_path)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ))
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err


def _run_route(route, jobs, folder, extra):
    """Every job of ``route``; a job whose child died is ``aborted``, the rest run anew."""
    results, remaining, attempt = {}, list(jobs), 0
    while remaining:
        attempt += 1
        spec = folder / f"{route}.{attempt}.json"
        spec.write_text(json.dumps({"route": route, "jobs": remaining, **extra}))
        rc, out, err = _run_child(spec)
        started = None
        for line in out.splitlines():
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("DONE "):
                result = json.loads(line[len("DONE "):])
                results[result["name"]] = result
                started = None
        if started is not None:
            results[started] = {"name": started, "status": "aborted",
                                "message": f"child rc={rc}: {err[-2000:]}"}
        elif rc != 0:
            raise AssertionError(f"{route} child failed outside any case (rc={rc}):\n{err}")
        remaining = [j for j in remaining if j["name"] not in results]
    return results


@pytest.fixture(scope="module")
def native_setup(tmp_path_factory):
    """The native library and a float32 export of the ops of the cases (or a skip reason)."""
    from lstm_tvm.export import export
    from lstm_tvm.onnx import native

    try:
        library = native.build_library()
    except FileNotFoundError as err:
        return f"cannot build the native custom-op library: {err}"
    folder = tmp_path_factory.mktemp("export")
    export(folder, EXPORT_OPS, dtype="float32", input_size=I, cell_size=H, attrs=ATTRS,
           onnx=False, progress=False)
    return {"library": str(library), "exports": [str(folder)]}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, native_setup):
    """``route -> case -> result``, each route computed on first use."""
    cache = {}

    def get(route):
        if route not in cache:
            extra = {}
            if route == "native":
                if isinstance(native_setup, str):
                    pytest.skip(native_setup)
                extra = native_setup
            folder = tmp_path_factory.mktemp(route)
            jobs = [_write_case(case, route, folder) for case in CASES]
            cache[route] = (_run_route(route, jobs, folder, extra), folder)
        return cache[route]

    return get


def _check_ran(case, folder):
    op = CASES[case][0]
    got = dict(np.load(folder / f"{case}.out.npz"))
    inputs = dict(np.load(folder / f"{case}.in.npz"))  # as fed
    attrs = {k: v for k, v in ATTRS.items() if k in OPS[op].attr_names}
    for name, expected in reference.run(op, inputs, attrs).items():
        assert got[name].shape == expected.shape, (case, name)
        testing.assert_close(got[name], expected, "float32", f"{case}: {name}")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_node_or_input(case, route, outcomes):
    results, folder = outcomes(route)
    result = results[case]
    assert result["status"] != "aborted", f"{case} killed the {route} process: " \
                                          f"{result['message']}"
    expected = _expected(case, route)
    if expected is OK:
        assert result["status"] == "ran", result
        _check_ran(case, folder)
        return
    if route == "pyop_plain" and result["status"] == "ran":
        # a plain session cannot raise from a PyOp: zero outputs, the failure logged and kept
        got = np.load(folder / f"{case}.out.npz")
        assert all(not got[k].any() for k in got.files), f"{case}: outputs are not zeros"
        assert "logged" in result, f"{case}: the failing PyOp left no last_error()"
        return
    assert result["status"] == "error", f"{case} ({route}) ran: expected an error"
    assert re.search(expected, result["message"]), \
        f"{case} ({route}): {expected!r} not in {result['message']!r}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
