"""PyTorch -> ONNX -> ONNX Runtime / Relax: ``lstm_tvm.torch.onnx_export`` writes lstm_tvm's
custom-op nodes, and each route that runs them (lstm_tvm's PyOps, plain ONNX Runtime on the
ops' ONNX functions, the Relax importer) reproduces the PyTorch module's outputs. float32
tolerances are :func:`lstm_tvm.testing.tolerance`'s: every route computes in float32, in
another order than the kernels at most (the functions, in ONNX Runtime's ops).
"""

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch", reason="lstm_tvm.torch needs PyTorch")
pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")
onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_extensions", reason="lstm_tvm's PyOp route")

import onnx  # noqa: E402

import lstm_tvm.torch as lt  # noqa: E402
from lstm_tvm import onnx as lo  # noqa: E402
from lstm_tvm import testing  # noqa: E402
from lstm_tvm.onnx import ort  # noqa: E402
from lstm_tvm.torch import onnx_export  # noqa: E402

T, B, I, H = 5, 3, 4, 6  # noqa: E741 - the registry's size symbols
OUTPUTS = ["y", "h_n", "c_n"]


def _array(shape, seed) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


class _WithLengths(torch.nn.Module):
    """``LSTM`` called with sequence lengths: ``seq_len_max`` is computed in the graph."""

    def __init__(self, module):
        super().__init__()
        self.lstm = module

    def forward(self, x, lengths):
        return self.lstm(x, sequence_length=lengths)


class _Step(torch.nn.Module):
    """One ``LSTMBlockCell`` step through the functional API."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.w = torch.nn.Parameter(torch.rand(I + H, 4 * H) - 0.5)
        self.b = torch.nn.Parameter(torch.rand(4 * H) - 0.5)
        self.peepholes = torch.nn.Parameter(torch.rand(3, H) - 0.5)

    def forward(self, x, cs_prev, h_prev):
        wci, wcf, wco = self.peepholes
        out = lt.LSTMBlockCell(x=x, cs_prev=cs_prev, h_prev=h_prev, w=self.w, wci=wci, wcf=wcf,
                               wco=wco, b=self.b, forget_bias=0.25, cell_clip=2.0,
                               use_peephole=True)
        return out.cs, out.h


@pytest.fixture(scope="module")
def lstm():
    torch.manual_seed(0)
    return lt.LSTM(I, H, batch_first=True, use_peephole=True, cell_clip=1.5).eval()


@pytest.fixture(scope="module")
def exported(lstm):
    """The module exported with dynamic batch and time, the ONNX functions attached."""
    dims = {0: "B", 1: "T"}
    return onnx_export.export(lstm, (torch.zeros(B, T, I),), input_names=["x"],
                              output_names=OUTPUTS, dynamic_shapes=(dims,),
                              with_functions=True, verbose=False)


def _want(module, *args):
    with torch.no_grad():
        y, (h_n, c_n) = module(*(torch.from_numpy(a) for a in args))
    return [y.numpy(), h_n.numpy(), c_n.numpy()]


def _check(got, want, route):
    for name, g, w in zip(OUTPUTS, got, want):
        testing.assert_close(g, w, "float32", f"{route} {name}")


def test_export_writes_lstm_tvm_nodes(lstm, exported):
    nodes = [n for n in exported.graph.node if n.domain == lo.DOMAIN]
    assert [n.op_type for n in nodes] == ["BlockLSTM"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs == {"forget_bias": 1.0, "cell_clip": 1.5, "use_peephole": 1}
    assert len(nodes[0].input) == 9 and len(nodes[0].output) == 7
    assert exported.ir_version <= lo.IR_VERSION
    assert {(o.domain, o.version) for o in exported.opset_import} >= {
        ("", lo.ONNX_OPSET), (lo.DOMAIN, lo.DOMAIN_VERSION)}
    assert {f.name for f in exported.functions} == {"BlockLSTM"}
    assert [i.name for i in exported.graph.input] == ["x"]  # weights are initializers
    lo.check_model(exported)


@pytest.mark.parametrize("batch, time", [(B, T), (2, 7), (1, 1)])
def test_ort_routes_match_the_module(lstm, exported, batch, time):
    """lstm_tvm's kernels in ONNX Runtime (PyOps) and plain ONNX Runtime on the functions, at
    the export's sizes and others (the dims are symbolic)."""
    x = _array((batch, time, I), batch * 10 + time)
    want = _want(lstm, x)
    _check(ort.InferenceSession(exported).run(None, {"x": x}), want, "PyOps")
    plain = onnxruntime.InferenceSession(exported.SerializeToString(),
                                         providers=["CPUExecutionProvider"])
    _check(plain.run(None, {"x": x}), want, "functions")


def test_relax_import_matches_the_module(lstm, exported):
    relax_import = pytest.importorskip("lstm_tvm.relax")
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(relax_import.from_onnx(exported), target="llvm"),
                              tvm.cpu())
    for batch, time in ((B, T), (2, 7)):
        x = _array((batch, time, I), batch + time)
        outputs = vm["main"](tvm.runtime.tensor(x))
        _check([o.numpy() for o in outputs], _want(lstm, x), f"Relax B={batch} T={time}")


def test_sequence_lengths_export_and_run(lstm, tmp_path):
    """``seq_len_max`` computed in the graph from the lengths; saved to a file and loaded."""
    model = _WithLengths(lstm).eval()
    x, lengths = _array((B, T, I), 3), np.array([4, 2, 0], np.int64)
    path = tmp_path / "lengths.onnx"
    onnx_export.export(model, (torch.from_numpy(x), torch.from_numpy(lengths)), path,
                       input_names=["x", "lengths"], output_names=OUTPUTS, verbose=False)
    got = ort.InferenceSession(str(path)).run(None, {"x": x, "lengths": lengths})
    _check(got, _want(model, x, lengths), "PyOps with lengths")


def test_cell_op_export_and_run(tmp_path):
    step = _Step().eval()
    feeds = {"x": _array((B, I), 1), "cs_prev": _array((B, H), 2), "h_prev": _array((B, H), 3)}
    model = onnx_export.export(step, tuple(torch.from_numpy(v) for v in feeds.values()),
                               input_names=list(feeds), output_names=["cs", "h"],
                               verbose=False)
    (node,) = [n for n in model.graph.node if n.domain == lo.DOMAIN]
    assert node.op_type == "LSTMBlockCell"
    with torch.no_grad():
        want = [t.numpy() for t in step(*(torch.from_numpy(v) for v in feeds.values()))]
    got = ort.InferenceSession(model).run(None, feeds)
    for name, g, w in zip(("cs", "h"), got, want):
        testing.assert_close(g, w, "float32", f"LSTMBlockCell {name}")


def test_export_refuses_the_torchscript_exporter(lstm):
    with pytest.raises(ValueError, match=r"expected dynamo=True"):
        onnx_export.export(lstm, (torch.zeros(B, T, I),), dynamo=False)


if __name__ == "__main__":
    tvm.testing.main()
