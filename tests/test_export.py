"""Export: one library + manifest + ONNX models; loaded in a fresh process and from C++."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm.testing
from click.testing import CliRunner

import lstm_tvm.export as lte
from lstm_tvm import build as _build
from lstm_tvm import onnx as lo
from lstm_tvm import reference, testing
from lstm_tvm.cli import main
from lstm_tvm.kernels import WEIGHT_PACKS
from lstm_tvm.registry import OPS
from lstm_tvm.validation import validate_attrs

from _layouts import LAYOUTS, read_only

T, B, I, H, SEQ = 6, 3, 5, 4, 4  # I != H and seq_len_max < T: mix-ups and padding show
ATTRS = {"use_peephole": True, "cell_clip": 2.5}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cpp" / "run_block_lstm_grad.cc"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """All six ops, float32, exported once for this module: ``(folder, manifest)``."""
    out = tmp_path_factory.mktemp("export")
    return out, lte.export(out, input_size=I, cell_size=H, attrs=ATTRS, progress=False)


def _op_attrs(op_name):
    return {k: v for k, v in ATTRS.items() if k in OPS[op_name].attr_names}


def _inputs(op_name, dtype="float32", seed=0):
    seq = OPS[op_name].kind == "sequence"
    return testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T if seq else None,
                               seq_len_max=SEQ if seq else None, attrs=ATTRS, seed=seed)


def _assert_matches_reference(op_name, outputs, inputs, dtype="float32"):
    expected = reference.run(op_name, inputs, _op_attrs(op_name))
    assert list(outputs) == list(OPS[op_name].output_names)
    for name, value in outputs.items():
        testing.assert_close(value, expected[name], dtype, f"{op_name}.{name}")


_FRESH_PROCESS = r"""
import json, sys
import numpy as np
import tvm
import lstm_tvm.build, lstm_tvm.export

def refuse(*args, **kwargs):
    raise AssertionError("the loader compiled something")
tvm.compile = lstm_tvm.build.build = lstm_tvm.build.get_module = refuse

folder, inputs_path, results_path = sys.argv[1:]
data = np.load(inputs_path)
lib = lstm_tvm.export.load(folder)
raw = tvm.runtime.load_module(f"{folder}/{lib.manifest['library']}")
results = {}
for op_name, entry in lib.manifest["ops"].items():
    inputs = {k.split("/")[1]: data[k] for k in data.files if k.startswith(op_name + "/")}
    for name, value in lib[op_name](**inputs)._asdict().items():
        results[f"load/{op_name}/{name}"] = value.numpy()
    # the raw function: destination passing, inputs then outputs in the manifest's order
    args, outputs = [], []
    for p in entry["params"]:
        if p["kind"] == "scalar":
            args.append(int(inputs[p["name"]]))
        elif p["role"] == "input":
            args.append(tvm.runtime.tensor(inputs[p["name"]]))
        else:
            dims = dict(T=inputs["x"].shape[0], B=inputs["x"].shape[-2])
            shape = [dims[d] if isinstance(d, str) else d for d in p["shape"]]
            outputs.append((p["name"], tvm.runtime.empty(shape, p["dtype"])))
    raw[entry["function"]](*args, *(t for _, t in outputs))
    results.update({f"raw/{op_name}/{n}": t.numpy() for n, t in outputs})
np.savez(results_path, **results)
"""


def test_round_trip_in_fresh_process(exported, tmp_path):
    """A new process runs every op through ``load`` and the raw module, without compiling."""
    folder, manifest = exported
    inputs = {op: _inputs(op, seed=k) for k, op in enumerate(OPS)}
    np.savez(tmp_path / "in.npz", **{f"{op}/{k}": v for op in OPS for k, v in inputs[op].items()})
    cache = tmp_path / "cache"
    env = dict(os.environ, LSTM_TVM_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(folder),
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not cache.exists() or not any(cache.rglob("*.so"))
    results = np.load(tmp_path / "out.npz")
    for how in ("load", "raw"):
        for op in OPS:
            got = {n: results[f"{how}/{op}/{n}"] for n in OPS[op].output_names}
            _assert_matches_reference(op, got, inputs[op])


def _cxx_program(tmp_path):
    try:
        cmd = lte.cxx_build_command(EXAMPLE, tmp_path / "run_block_lstm_grad")
    except FileNotFoundError as err:
        pytest.skip(f"no C++ compiler to build examples/cpp: {err}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return tmp_path / "run_block_lstm_grad"


def _run_cxx(program, folder, op_name, inputs, work: Path, *options):
    """Run the C++ example; its output folder ``work/out`` does not exist before (it makes it)."""
    (work / "in").mkdir(parents=True)
    for name, value in inputs.items():
        lte.save_tensor(work / "in" / f"{name}.bin", value)
    return subprocess.run([str(program), str(folder), str(work / "in"), str(work / "out"),
                           op_name, *options], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("options", [(), ("--prepacked", "--repeat", "3")],
                         ids=["plain", "prepacked"])
def test_cpp_example(exported, tmp_path, options):
    """examples/cpp built with the system compiler runs the exported library from files; with
    ``--prepacked`` it packs ``w`` once and calls the prepacked kernel (three times here)."""
    folder, _ = exported
    program = _cxx_program(tmp_path)
    for op_name in ("BlockLSTMGradV2", "BlockLSTM", "LSTMBlockCell"):
        inputs = _inputs(op_name, seed=7)
        proc = _run_cxx(program, folder, op_name, inputs, tmp_path / op_name, *options)
        assert proc.returncode == 0, proc.stderr
        if options:
            assert f"{op_name} (prepacked): 3 calls, median" in proc.stderr
        got = {n: lte.load_tensor(tmp_path / op_name / "out" / f"{n}.bin")
               for n in OPS[op_name].output_names}
        _assert_matches_reference(op_name, got, inputs)
    bad = dict(_inputs("BlockLSTMGradV2"), seq_len_max=np.int64(T + 1))
    proc = _run_cxx(program, folder, "BlockLSTMGradV2", bad, tmp_path / "bad", *options)
    assert proc.returncode == 1 and "seq_len_max" in proc.stderr


def test_cpp_example_refuses(exported, tmp_path):
    """An op without a prepacked kernel, or a bad option: a message and a nonzero exit."""
    folder, _ = exported
    program = _cxx_program(tmp_path)
    inputs = _inputs("LSTMBlockCellGrad")
    proc = _run_cxx(program, folder, "LSTMBlockCellGrad", inputs, tmp_path / "cell",
                    "--prepacked")
    assert proc.returncode == 1 and "no prepacked kernel in this export" in proc.stderr
    assert not (tmp_path / "cell" / "out").exists()  # refused before writing anything
    for options, message in ((("--repeat", "0"), "--repeat expects an integer"),
                             (("--repeat", "x"), "--repeat expects an integer"),
                             (("--fast",), "unknown option --fast")):
        proc = subprocess.run([str(program), str(folder), "in", "out", *options],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and "usage:" in proc.stderr


def test_manifest_matches_registry(exported):
    folder, manifest = exported
    assert json.loads((folder / lte.MANIFEST).read_text()) == manifest
    assert manifest["format_version"] == lte.FORMAT_VERSION and manifest["dtype"] == "float32"
    assert manifest["sizes"] == {"I": I, "H": H} and manifest["target"]["kind"] == "llvm"
    assert list(manifest["ops"]) == list(OPS)
    sizes = {"I": I, "H": H, "T": "T", "B": "B", "4H": 4 * H, "I+H": I + H}
    for name, op in OPS.items():
        entry = manifest["ops"][name]
        attrs = validate_attrs(op, _op_attrs(name))
        spec = _build.make_spec(name, "float32", I, H, attrs, "llvm")
        assert entry["function"] == spec.func_name and entry["attrs"] == attrs
        assert [(r["block"], r["task"]) for r in entry["schedule_records"]] == [
            (block, task) for block, task, _ in spec.tuned]
        params = entry["params"]
        tensors = [(t, "input") for t in op.inputs] + [(t, "output") for t in op.outputs]
        assert [p["name"] for p in params] == [t.name for t, _ in tensors]
        for p, (t, role) in zip(params, tensors):
            assert p["role"] == role
            assert p["dtype"] == ("float32" if t.dtype == "T" else t.dtype)
            assert p["dims"] == list(t.shape)
            assert p["shape"] == [sizes[d] for d in t.shape]
            assert p["dynamic"] == [k for k, d in enumerate(t.shape) if d in ("T", "B")]
            assert p["kind"] == ("tensor" if t.shape else "scalar")


def test_prepacked_kernels_match_the_reference(exported):
    """Each sequence op's prepacked kernel, on panels its pack function made once, over two
    calls with other inputs (the manifest's calling convention: inputs, panels, outputs)."""
    folder, manifest = exported
    lib = lte.load(folder)
    for name, entry in manifest["ops"].items():
        if name not in WEIGHT_PACKS:
            assert "prepacked" not in entry, name
            continue
        packed = entry["prepacked"]
        spec = _build.make_spec(name, "float32", I, H, validate_attrs(OPS[name], _op_attrs(name)),
                                "llvm", prepacked=True)
        assert (packed["function"], packed["pack_function"]) == (spec.func_name,
                                                                 spec.pack_func_name)
        assert [(p["name"], p["shape"]) for p in packed["panels"]] == [
            (p.name, list(p.shape)) for p in WEIGHT_PACKS[name](I, H)]
        w = _inputs(name, seed=7)["w"]
        panels = [tvm.runtime.empty(p["shape"], p["dtype"]) for p in packed["panels"]]
        lib.module[packed["pack_function"]](tvm.runtime.tensor(w), *panels)
        for seed in (1, 2):
            inputs = {**_inputs(name, seed=seed), "w": w}
            args = [int(v) if k == "seq_len_max" else tvm.runtime.tensor(v)
                    for k, v in inputs.items()]
            outs = [tvm.runtime.empty([{"T": T, "B": B}.get(d, d) for d in p["shape"]],
                                      p["dtype"]) for p in entry["params"]
                    if p["role"] == "output"]
            lib.module[packed["function"]](*args, *panels, *outs)
            _assert_matches_reference(name, {p: o.numpy() for p, o in zip(
                OPS[name].output_names, outs)}, inputs)


@pytest.mark.parametrize("op_name", ["BlockLSTMV2", "BlockLSTMGradV2", "LSTMBlockCell"])
def test_loader_bind_holds_weights(exported, op_name):
    """``ExportedOp.bind``: a sequence op runs its prepacked kernel on panels made once; the
    bound arrays are copies (writes after ``bind`` change nothing); refusals named."""
    folder, _ = exported
    op = lte.load(folder)[op_name]
    held = {k: v.copy() for k, v in _inputs(op_name, seed=7).items() if k in ("w", "b")}
    bound = op.bind(**held)
    assert "bound=['b', 'w']" in repr(bound)
    assert (bound.func is not op.func) == (op_name in WEIGHT_PACKS)
    weights = {k: v.copy() for k, v in held.items()}
    for v in held.values():
        v[...] = 0
    for seed in (1, 2):
        inputs = {**_inputs(op_name, seed=seed), **weights}
        got = bound(**{k: v for k, v in inputs.items() if k not in weights})
        _assert_matches_reference(op_name, {k: v.numpy() for k, v in got._asdict().items()},
                                  inputs)
    with pytest.raises(TypeError, match=r"bind\(\) takes inputs whose shape has no T or B "
                                        r"\(\['wci', 'wcf', 'wco'\]\), got 'w'"):
        bound.bind(w=weights["w"])
    with pytest.raises(TypeError, match=r"unexpected inputs \['w', 'b'\].*\(\['b', 'w'\] "
                                        r"bound\)"):
        bound(**_inputs(op_name))
    with pytest.raises(ValueError, match="input 'w' expected shape"):
        op.bind(w=weights["w"][1:])


@pytest.fixture(scope="module")
def exported_wide(tmp_path_factory):
    """LSTMBlockCell and BlockLSTMV2 at I=H=64, float32: ``w`` (128 x 256, 128 KiB) lies past
    the size below which NumPy inputs are always copied, so the loader reads it in place."""
    out = tmp_path_factory.mktemp("export-wide")
    lte.export(out, ["LSTMBlockCell", "BlockLSTMV2"], input_size=64, cell_size=64,
               attrs=ATTRS, onnx=False, progress=False)
    return out


def _wide_inputs(op_name, seed):
    seq = OPS[op_name].kind == "sequence"
    return testing.make_inputs(op_name, dtype="float32", B=B, I=64, H=64, T=T if seq else None,
                               seq_len_max=SEQ if seq else None, attrs=ATTRS, seed=seed)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTMV2"])
def test_loader_takes_numpy_inputs_of_every_layout(exported_wide, op_name, layout, monkeypatch):
    """NumPy inputs of any layout give the reference's answer, twice with the same arrays
    (new values between the calls are seen) and once more with ``out=``; a CPU library reads
    them where they lie or stages them (no per-call device copy); the inputs are unchanged."""
    op = lte.load(exported_wide)[op_name]
    assert op._in_place
    monkeypatch.setattr("lstm_tvm.export.loader._to_device", None)  # a per-call copy fails
    inputs = _wide_inputs(op_name, seed=3)
    odd = {k: layout(v) if v.ndim else v for k, v in inputs.items()}
    before = {k: np.array(v, copy=True) for k, v in odd.items()}
    got = op(**odd)
    _assert_matches_reference(op_name, {k: v.numpy() for k, v in got._asdict().items()}, inputs)
    for k, v in odd.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"input {k} was modified")
    if layout is read_only:
        return
    fresh = _wide_inputs(op_name, seed=4)
    for k, v in odd.items():  # the same arrays, new values
        if v.ndim:
            v[...] = fresh[k]
    again = op(**odd, out=got)
    _assert_matches_reference(op_name, {k: v.numpy() for k, v in again._asdict().items()},
                              fresh)


def test_loader_rechecks_what_changed_between_calls(exported_wide):
    """A repeated call skips only the checks its arguments cannot have changed: the same TVM
    tensors with new values are computed again; a NumPy array reshaped in place, another
    ``seq_len_max`` and an ``out=`` of another shape are checked again."""
    op = lte.load(exported_wide)["BlockLSTMV2"]
    inputs = _wide_inputs("BlockLSTMV2", seed=5)
    tensors = {k: v if k == "seq_len_max" else tvm.runtime.tensor(v) for k, v in inputs.items()}
    out = op(**tensors)
    op(**tensors, out=out)
    fresh = _wide_inputs("BlockLSTMV2", seed=6)
    tensors["x"].copyfrom(fresh["x"])
    got = op(**tensors, out=out)
    _assert_matches_reference("BlockLSTMV2", {k: v.numpy() for k, v in got._asdict().items()},
                              {**inputs, "x": fresh["x"]})
    with pytest.raises(ValueError, match=r"input 'seq_len_max' expected 0 <= seq_len_max <= 6"):
        op(**{**tensors, "seq_len_max": T + 1}, out=out)
    short = op(**{**tensors, "x": tvm.runtime.tensor(fresh["x"][:-1])})
    with pytest.raises(ValueError, match="output 'i' expected float32"):
        op(**tensors, out=short)
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    op(**arrays)
    arrays["x"].shape = (T * B, 1, 64)  # the same array object, another shape
    with pytest.raises(ValueError, match=r"input 'cs_prev' expected shape \['B', 64\] "
                                         r"\(T=18, B=1\)"):
        op(**arrays)


def test_manifest_input_alignment_is_the_element_size(exported):
    """A CPU library's kernels read inputs aligned to their element (the in-place reads
    above rely on it); what callers allocate stays 64-byte aligned."""
    _, manifest = exported
    assert manifest["input_alignment"] == 4 and manifest["alignment"] == 64


@pytest.fixture
def schemas():
    yield lo.register_schemas()
    lo.deregister_schemas()


def test_onnx_models_check(exported, schemas):
    folder, manifest = exported
    for name, entry in manifest["ops"].items():
        model = onnx.load(folder / entry["onnx_model"])
        onnx.checker.check_model(model, full_check=True)
        onnx.checker.check_model(model, check_custom_domain=True)
        (node,) = model.graph.node
        assert (node.op_type, node.domain) == (name, lo.DOMAIN)
        assert [f.name for f in model.functions] == [name]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == pytest.approx({k: int(v) if isinstance(v, bool) else v
                                       for k, v in entry["attrs"].items()})


def test_loader_checks_inputs(exported, tmp_path):
    folder, _ = exported
    lib = lte.load(folder)
    op = lib["BlockLSTMGradV2"]
    good = _inputs("BlockLSTMGradV2")
    with pytest.raises(TypeError, match="BlockLSTMGradV2: input 'x' expected dtype float32"):
        op(**dict(good, x=good["x"].astype(np.float64)))
    with pytest.raises(ValueError, match="input 'x' expected shape"):
        op(**dict(good, x=good["x"][..., :-1]))
    with pytest.raises(ValueError, match="input 'cs_prev' expected shape"):
        op(**dict(good, cs_prev=good["cs_prev"][:-1]))
    with pytest.raises(ValueError, match="seq_len_max <= 6, got 7"):
        op(**dict(good, seq_len_max=7))
    with pytest.raises(TypeError, match="missing inputs \\['b'\\]"):
        op(**{k: v for k, v in good.items() if k != "b"})
    with pytest.raises(KeyError, match="not exported"):
        lib["Nope"]
    reuse = op(**good)
    assert op(**good, out=reuse) is not None
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    with open(copy / lte.LIBRARY, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ValueError, match="checksum"):
        lte.load(copy)


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("steps, batch", [(T, 0), (0, B), (0, 0)])
def test_loader_runs_empty_batches_and_sequences(exported, op_name, steps, batch):
    """B = 0 and T = 0 with NumPy inputs (zero-size arrays, whose NumPy strides are 0) against
    the reference: empty outputs of the right shapes, a cell's outputs for B rows."""
    folder, _ = exported
    seq = OPS[op_name].kind == "sequence"
    if not seq and steps == 0 and batch != 0:
        pytest.skip("a cell op has no T")
    inputs = testing.make_inputs(op_name, B=batch, I=I, H=H, T=steps if seq else None,
                                 seq_len_max=steps if seq else None, attrs=ATTRS, seed=1)
    out = lte.load(folder)[op_name](**inputs)
    _assert_matches_reference(op_name, {k: v.numpy() for k, v in out._asdict().items()},
                              inputs)


def test_loader_reports_a_manifest_that_does_not_match_its_library(exported, tmp_path):
    """A manifest whose ``I`` (sizes and every static dim) differs from the library's: the
    kernel's refusal is reported as the manifest's shape not matching the library."""
    folder, _ = exported
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / lte.MANIFEST).read_text())
    manifest["sizes"]["I"] = I + 1
    for entry in manifest["ops"].values():
        for param in entry["params"]:
            param["shape"] = [s + 1 if d in ("I", "I+H") else s
                              for s, d in zip(param["shape"], param["dims"])]
    (copy / lte.MANIFEST).write_text(json.dumps(manifest))
    inputs = testing.make_inputs("BlockLSTM", B=B, I=I + 1, H=H, T=T, attrs=ATTRS)
    with pytest.raises(ValueError, match=r"BlockLSTM: the library's function takes another "
                                         r"shape for input 'x' than the manifest's \['T', 'B', "
                                         rf"{I + 1}\].*the manifest does not match its library"):
        lte.load(copy)["BlockLSTM"](**inputs)


def test_cli_export_float16(tmp_path):
    """``lstm-tvm export`` writes a loadable float16 library (one op, no ONNX)."""
    result = CliRunner().invoke(main, ["export", "--ops", "LSTMBlockCell", "--dtype", "float16",
                                       "--input-size", str(I), "--cell-size", str(H),
                                       "--use-peephole", "--cell-clip", "2.5", "--no-onnx",
                                       "-o", str(tmp_path / "f16")])
    assert result.exit_code == 0, result.output
    assert "lstm_tvm_LSTMBlockCell_float16" in result.stdout
    # stderr is not a terminal here: a line per step, in order, none of tqdm's redrawn bar
    progress = [line for line in result.stderr.splitlines() if line.startswith("export: ")]
    assert progress[:2] == ["export: scheduling LSTMBlockCell (1/4)",
                            "export: scheduling LSTMBlockCell prepacked (2/4)"], result.stderr
    assert len(progress) == 3 and re.fullmatch(r"export: compiling \d+ functions \(3/4\)",
                                               progress[2]), result.stderr
    assert "\r" not in result.stderr
    lib = lte.load(tmp_path / "f16")
    assert list(lib) == ["LSTMBlockCell"] and lib.manifest["dtype"] == "float16"
    assert not (tmp_path / "f16" / "onnx").exists()
    inputs = _inputs("LSTMBlockCell", dtype="float16")
    got = {k: v.numpy() for k, v in lib["LSTMBlockCell"](**inputs)._asdict().items()}
    _assert_matches_reference("LSTMBlockCell", got, inputs, dtype="float16")


def test_cli_export_without_prepacked_kernels(tmp_path):
    result = CliRunner().invoke(main, ["export", "--ops", "BlockLSTMV2", "--input-size", str(I),
                                       "--cell-size", str(H), "--no-onnx", "--no-prepacked",
                                       "-o", str(tmp_path / "plain")])
    assert result.exit_code == 0, result.output
    lib = lte.load(tmp_path / "plain")
    assert "prepacked" not in lib.manifest["ops"]["BlockLSTMV2"]
    with pytest.raises(AttributeError, match="prepacked"):
        lib.module["lstm_tvm_BlockLSTMV2_float32_prepacked"]


def test_export_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown ops"):
        lte.export(tmp_path, ["LSTMBlock"])
    with pytest.raises(TypeError, match="unknown attributes"):
        lte.export(tmp_path, attrs={"peephole": True})
    with pytest.raises(TypeError, match="dtype"):
        lte.export(tmp_path, dtype="float64")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("array", [np.int64(3), np.zeros((0, 3), np.float32),
                                   np.arange(24, dtype=np.float16).reshape(2, 3, 4)])
def test_tensor_file_round_trip(tmp_path, array):
    lte.save_tensor(tmp_path / "t.bin", array)
    back = lte.load_tensor(tmp_path / "t.bin")
    assert back.dtype == np.asarray(array).dtype and back.shape == np.shape(array)
    np.testing.assert_array_equal(back, array)


if __name__ == "__main__":
    tvm.testing.main()
