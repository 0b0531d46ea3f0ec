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
