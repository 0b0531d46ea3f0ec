"""The README's Python examples run as written and compute what the reference computes.

Each example is taken from README.md by a line it holds, run in a fresh namespace in a temporary
working folder, and its results compared with the float64 reference under the tolerance of
their dtype.
"""

import re
from pathlib import Path

import pytest

from lstm_tvm import reference, registry, testing

README = Path(__file__).resolve().parents[1] / "README.md"


def _example(marker: str) -> str:
    """The README's ```python block holding ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def _run(marker: str, folder: Path, monkeypatch) -> dict:
    monkeypatch.chdir(folder)
    namespace: dict = {}
    exec(compile(_example(marker), f"README.md example ({marker})", "exec"), namespace)
    return namespace


def _inputs_of(op_name: str, values: dict) -> dict:
    return {name: values[name] for name in registry.get_op(op_name).input_names}


def test_relax_example(tmp_path, monkeypatch):
    ns = _run("lstm_tvm.relax.from_onnx(model)", tmp_path, monkeypatch)
    ref = reference.run("BlockLSTMV2", ns["inputs"], {"use_peephole": True})
    testing.assert_close(ns["h"], ref["h"], "float32", "h")


def test_native_onnx_runtime_example(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from lstm_tvm.onnx import native

    try:
        native.ort_include_dir()
    except FileNotFoundError as err:  # no npm, or it could not fetch the headers
        pytest.skip(f"cannot build the native custom-op library: {err}")
    ns = _run("native.session_options(", tmp_path, monkeypatch)
    feeds, results = ns["feeds"], ns["results"]
    attrs = {"use_peephole": True}
    fwd = reference.run("BlockLSTMV2", _inputs_of("BlockLSTMV2", feeds), attrs)
    bwd = reference.run("BlockLSTMGradV2", _inputs_of("BlockLSTMGradV2", {**feeds, **fwd}), attrs)
    for name, want in [("h", fwd["h"]), ("cs", fwd["cs"]), ("x_grad", bwd["x_grad"]),
                       ("w_grad", bwd["w_grad"])]:
        testing.assert_close(results[name], want, "float16", name)


def test_dynamic_training_step_imports_into_relax(tmp_path, monkeypatch, tf):
    """The converted training step (written to step.onnx) imports with shared ``T``, ``B``,
    compiles and runs; its loss against the same tf.function run by TF."""
    pytest.importorskip("tf2onnx")
    import numpy as np
    import tvm
    from tvm import relax

    step = _run('output_path="step.onnx"', tmp_path, monkeypatch)["step"]
    ns = _run("shape_dict={", tmp_path, monkeypatch)
    vm = relax.VirtualMachine(tvm.compile(ns["mod"], "llvm"), tvm.cpu())
    inputs = testing.make_inputs("BlockLSTMV2", T=3, B=2, I=32, H=64)
    inputs["target"] = np.random.default_rng(0).standard_normal((3, 2, 64)).astype(np.float32)
    names = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b", "target")
    results = vm["main"](*[tvm.runtime.tensor(inputs[n]) for n in names])
    order = [o.name for o in ns["onnx"].load(tmp_path / "step.onnx").graph.output]
    got = dict(zip(order, results))["loss"].numpy()
    want = step(**{n: inputs[n] for n in names})["loss"].numpy()
    tol = tuple(a + b for a, b in zip(testing.tolerance("float32"),
                                      testing.tf_tolerance("float32")))
    testing.assert_close(got, want, "float32", "loss", tol=tol)
