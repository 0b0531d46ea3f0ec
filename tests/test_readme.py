"""Every Python example of README.md runs as written, in order, and computes what the reference
computes.

Each ```python block runs in a fresh namespace, in one temporary working folder shared by the
blocks in README order (a block may read a file an earlier block wrote, e.g. ``step.onnx``).
Where a truth exists, the block's results are compared with the float64 reference under the
tolerance of their dtype (:data:`CHECKS`); the quick start and the ONNX example check
themselves. A block skips only when an optional dependency is missing (the ``convert`` extra,
the native route's compiler or headers).
"""

import re
from pathlib import Path

import numpy as np
import pytest

from lstm_tvm import reference, testing

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
#: Optional modules: a block importing a missing one skips.
OPTIONAL = ("tensorflow", "tf2onnx", "onnxruntime", "onnxruntime_extensions", "torch")


def _id(block: str) -> str:
    first = next(line for line in block.splitlines() if line and not line.startswith(("import",
                                                                                       "from")))
    return re.sub(r"\W+", "_", first)[:40]



def _check_raw_ops(ns):
    inputs, fwd = ns["inputs"], ns["fwd"]
    ref_fwd = reference.run("BlockLSTM", inputs, {})
    testing.assert_close(fwd.h, ref_fwd["h"], "float32", "h")
    ref = reference.run("BlockLSTMGrad", {**inputs, **ref_fwd, "cs_grad": np.zeros_like(fwd.cs),
                                          "h_grad": np.ones_like(fwd.h)},
                        {"use_peephole": False})
    testing.assert_close(ns["grads"].w_grad, ref["w_grad"], "float32", "w_grad")


def _check_compile(ns):
    ref = reference.run("BlockLSTMV2", ns["inputs"], {"use_peephole": True})
    testing.assert_close(ns["out"].h.numpy(), ref["h"], "float32", "h")


def _check_export(ns):
    ref = reference.run("BlockLSTMV2", ns["inputs"], {"use_peephole": True})
    testing.assert_close(ns["out"].h.numpy(), ref["h"], "float32", "h")


def _check_native(ns):
    ref = reference.run("BlockLSTMV2", ns["feeds"], {"use_peephole": True})
    testing.assert_close(ns["h"], ref["h"], "float16", "h")


def _check_relax(ns):
    ref = reference.run("BlockLSTMV2", ns["inputs"], {"use_peephole": True})
    testing.assert_close(ns["outputs"][6].numpy(), ref["h"], "float32", "h")


def _check_autodiff(ns):
    inputs, outputs = ns["inputs"], ns["outputs"]
    fwd = reference.run("BlockLSTM", inputs, {})
    ref = reference.run("BlockLSTMGrad", {**inputs, **fwd, "cs_grad": np.zeros_like(outputs.cs),
                                          "h_grad": np.ones_like(outputs.h)},
                        {"use_peephole": False})
    testing.assert_close(ns["grads"]["w"], ref["w_grad"], "float32", "w_grad")
    testing.assert_close(ns["grads"]["x"], ref["x_grad"], "float32", "x_grad")


def _check_tf(ns):
    inputs = {**ns["inputs"], "w": ns["w"].numpy()}
    fwd = reference.run("BlockLSTMV2", inputs, {})
    ref = reference.run("BlockLSTMGradV2", {**inputs, **fwd, "cs_grad": np.zeros_like(fwd["cs"]),
                                            "h_grad": np.ones_like(fwd["h"])},
                        {"use_peephole": False})
    testing.assert_close(ns["dw"].numpy(), ref["w_grad"], "float32", "w_grad")


def _check_torch(ns):
    lstm, x = ns["lstm"], ns["x"].numpy()
    weights = lstm.tf_weights()
    T, B, _ = x.shape
    H = weights["wci"].shape[0]
    inputs = {"seq_len_max": T, "x": x, "cs_prev": np.zeros((B, H), np.float32),
              "h_prev": np.zeros((B, H), np.float32), **weights}
    attrs = {"use_peephole": True, "forget_bias": 1.0, "cell_clip": -1.0}
    fwd = reference.run("BlockLSTM", inputs, attrs)
    testing.assert_close(ns["output"].detach().numpy(), fwd["h"], "float32", "output")
    ref = reference.run("BlockLSTMGrad", {**inputs, **fwd, "cs_grad": np.zeros_like(fwd["cs"]),
                                          "h_grad": np.ones_like(fwd["h"])},
                        {"use_peephole": True})
    testing.assert_close(lstm.w_l0.grad.numpy(), ref["w_grad"], "float32", "w_grad")


#: A line of the block -> the check of its results.
CHECKS = {
    "fwd = raw_ops.BlockLSTM(**inputs)": _check_raw_ops,
    "bound = op.bind(": _check_compile,
    'ops = lstm_tvm.export.load("lstm_export")': _check_export,
    "session = native.InferenceSession(": _check_native,
    "mod = lstm_tvm.relax.from_onnx(model)": _check_relax,
    "autodiff.vjp(": _check_autodiff,
    "out = ltf.BlockLSTMV2(": _check_tf,
    "output, (h_n, c_n) = lstm(x)": _check_torch,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The working folder all blocks share, in README order."""
    return tmp_path_factory.mktemp("readme")


def test_every_block_is_checked_or_checks_itself():
    """No block goes unchecked: each has a check here or asserts its own result."""
    for block in BLOCKS:
        checked = any(marker in block for marker in CHECKS)
        asserts = "assert_close(" in block
        reads_earlier_file = "onnx.load(" in block or "output_path=" in block
        assert checked or asserts or reads_earlier_file, block[:200]


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[_id(b) for b in BLOCKS])
def test_readme_block(index, folder, monkeypatch):
    block = BLOCKS[index]
    for module in OPTIONAL:
        if re.search(rf"^\s*(import|from) {module}\b", block, re.M):
            pytest.importorskip(module)
    if "native." in block:
        from lstm_tvm.onnx import native

        try:
            native.ort_include_dir()
        except FileNotFoundError as err:  # no npm, or it could not fetch the headers
            pytest.skip(f"cannot build the native custom-op library: {err}")
    if 'onnx.load("step.onnx")' in block and not (folder / "step.onnx").exists():
        pytest.skip("needs step.onnx from the TF-graph example (the convert extra)")
    monkeypatch.chdir(folder)
    namespace: dict = {}
    exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
    for marker, check in CHECKS.items():
        if marker in block:
            check(namespace)


def test_converted_training_step_runs_in_relax(folder, monkeypatch, tf):
    """The README's converted training step (step.onnx, imported with shared T, B) compiles
    and runs; its loss against the same step run by TF."""
    pytest.importorskip("tf2onnx")
    import onnx
    import tvm
    from tvm import relax, tirx

    import lstm_tvm.relax

    (convert_block,) = [b for b in BLOCKS if 'output_path="step.onnx"' in b]
    monkeypatch.chdir(folder)
    ns: dict = {}
    exec(compile(convert_block, "README.md (convert)", "exec"), ns)
    steps, batch = tirx.Var("T", "int64"), tirx.Var("B", "int64")
    model = onnx.load(folder / "step.onnx")
    mod = lstm_tvm.relax.from_onnx(model, shape_dict={
        "x": [steps, batch, 32], "cs_prev": [batch, 64], "h_prev": [batch, 64],
        "target": [steps, batch, 64]})
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    inputs = testing.make_inputs("BlockLSTMV2", T=3, B=2, I=32, H=64)
    inputs["target"] = np.random.default_rng(0).standard_normal((3, 2, 64)).astype(np.float32)
    names = [v.name for v in model.graph.input]
    results = vm["main"](*[tvm.runtime.tensor(inputs[n]) for n in names])
    got = dict(zip([o.name for o in model.graph.output], results))["loss"].numpy()
    want = ns["step"](**{n: inputs[n] for n in names})["loss"].numpy()
    tol = tuple(a + b for a, b in zip(testing.tolerance("float32"),
                                      testing.tf_tolerance("float32")))
    testing.assert_close(got, want, "float32", "loss", tol=tol)
