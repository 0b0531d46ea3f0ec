"""The native ONNX Runtime route: the C++ custom-op library running lstm_tvm exports.

The library is built with g++ against ONNX Runtime 1.29's official C API header (fetched and
hash-checked by :func:`lstm_tvm.onnx.native.ort_include_dir`) and run by onnxruntime 1.31; every
result is checked against TF (defined elements) and the float64 reference, float32 and float16.
Errors of this route are exercised in tests/test_onnx_ort_errors.py.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _ort_harness import child_script, open_session, run_child, run_session

from lstm_tvm import onnx as lo
from lstm_tvm.env import usable_cores
from lstm_tvm import reference, testing
from lstm_tvm.registry import OPS

ort = pytest.importorskip("onnxruntime", reason="the native route runs in onnxruntime")
from lstm_tvm.export import export
from lstm_tvm.onnx import native

T, B, I, H = 5, 3, 4, 6
OPS_EXPORTED = ["LSTMBlockCell", "LSTMBlockCellGrad", "BlockLSTMV2", "BlockLSTMGradV2"]
PEEPHOLE = {"use_peephole": True}


def test_the_library_source_is_inside_the_package():
    """The source ships with lstm_tvm (the fixtures below skip on missing tools, never on a
    missing source)."""
    package = Path(native.__file__).resolve().parents[1]
    assert native.SOURCE.is_file() and package in native.SOURCE.resolve().parents


@pytest.fixture(scope="module")
def library():
    """The built library (skips when no compiler or no header source is available)."""
    try:
        return native.build_library()
    except FileNotFoundError as err:  # no g++, no npm, or npm could not fetch the headers
        pytest.skip(f"cannot build the native custom-op library: {err}")


def test_a_build_says_what_it_builds(library, tmp_path, capfd):
    """A compiler run the caller waits on is announced on stderr (the first native session
    otherwise looks hung), and its result is a loadable shared library."""
    source = tmp_path / "probe.cc"
    source.write_text('extern "C" __attribute__((visibility("default"))) int lstm_tvm_probe() '
                      '{ return 7; }\n')
    built = native.build_library(tmp_path / "probe.so", source=source)
    err = capfd.readouterr().err
    assert f"lstm_tvm: building the ONNX Runtime custom-op library {built} with" in err
    assert ctypes.CDLL(str(built)).lstm_tvm_probe() == 7


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Export folders: float32 and float16 with peephole on; float32 BlockLSTMV2 without
    peephole at I+1 (selected by attributes and by dims)."""
    root = tmp_path_factory.mktemp("exports")
    for name, dtype in (("f32", "float32"), ("f16", "float16")):
        export(root / name, OPS_EXPORTED, dtype=dtype, input_size=I, cell_size=H, attrs=PEEPHOLE,
               onnx=False, progress=False)
    export(root / "f32_wide", ["BlockLSTMV2"], dtype="float32", input_size=I + 1, cell_size=H,
           attrs={"use_peephole": False}, onnx=False, progress=False)
    return {p.name: p for p in root.iterdir()}


def _session(model, library, exports, names=("f32", "f16")):
    """``model`` on the native route with the exports ``names``."""
    return open_session(model, "native", exports=[exports[n] for n in names], library=library)


def _tol(dtype):
    (r1, a1), (r2, a2) = testing.tolerance(dtype), testing.tf_tolerance(dtype)
    return (r1 + r2, a1 + a2)


def _check(op_name, out, ref, tf, dtype, seq_len_max=None):
    for name in OPS[op_name].output_names:
        label = f"{op_name}.{name} ({dtype})"
        assert out[name].dtype == np.dtype(dtype) and out[name].shape == ref[name].shape, label
        testing.assert_close(out[name], ref[name], dtype, label)
        mask = testing.tf_defined_mask(op_name, name, seq_len_max, T)
        testing.assert_close(out[name], tf[name], dtype, label + " vs TF", mask=mask,
                             tol=_tol(dtype))


def _check_pair(fwd_name, out, inputs, dtype, seq_len_max=None):
    """The forward's and the grad's outputs against TF's two ops chained and the reference."""
    fwd, bwd = OPS[fwd_name], OPS[OPS[fwd_name].pair]
    fwd_in = {k: inputs[k] for k in fwd.input_names}
    tf_fwd = testing.tf_run(fwd.name, fwd_in, PEEPHOLE)
    ref_fwd = reference.run(fwd.name, fwd_in, PEEPHOLE)
    _check(fwd.name, out, ref_fwd, tf_fwd, dtype, seq_len_max)
    # the grad's inputs: the forward's outputs as stored (rounded to dtype), resp. TF's
    stored = {k: v.astype(dtype) for k, v in ref_fwd.items() if k in bwd.input_names}
    ref_bwd = reference.run(bwd.name, {**inputs, **stored}, PEEPHOLE)
    tf_stored = {k: v for k, v in tf_fwd.items() if k in bwd.input_names}
    tf_bwd = testing.tf_run(bwd.name, {**inputs, **tf_stored}, PEEPHOLE)
    _check(bwd.name, out, ref_bwd, tf_bwd, dtype, seq_len_max)


def test_headers_are_pinned_and_older_than_the_runtime(library):
    folder = native.ort_include_dir(fetch=False)
    assert native._headers_ok(folder)
    runtime_api = int(ort.__version__.split(".")[1])  # ORT 1.N serves C API versions <= N
    assert native.api_version(library) == native.ORT_HEADERS_API_VERSION <= runtime_api


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("seq_len_max", [T, T - 2])
def test_block_lstm_v2_forward_backward_matches_tf(library, exports, dtype, seq_len_max, tf):
    """BlockLSTMV2 feeding BlockLSTMGradV2 natively; 64-byte aligned feeds: no copies at all."""
    model = lo.make_forward_backward_model("BlockLSTMV2", dtype, input_size=I, cell_size=H,
                                           attrs=PEEPHOLE, with_functions=False)
    inputs = testing.make_inputs("BlockLSTMGradV2", dtype=dtype, B=B, I=I, H=H, T=T,
                                 seq_len_max=seq_len_max, attrs=PEEPHOLE, seed=seq_len_max)
    packed = native.prepacked_count(library)
    session = _session(model, library, exports)
    copies = native.copy_count(library)
    out = run_session(session, inputs, align=True)
    assert native.copy_count(library) == copies  # every tensor passed in place
    assert native.prepacked_count(library) == packed  # w is an input: packed at every call
    _check_pair("BlockLSTMV2", out, inputs, dtype, seq_len_max)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cell_forward_backward_matches_tf(library, exports, dtype, tf):
    model = lo.make_forward_backward_model("LSTMBlockCell", dtype, input_size=I, cell_size=H,
                                           attrs=PEEPHOLE, with_functions=True)  # native wins
    inputs = testing.make_inputs("LSTMBlockCellGrad", dtype=dtype, B=B, I=I, H=H,
                                 attrs=PEEPHOLE, seed=3)
    copies = native.copy_count(library)
    out = run_session(_session(model, library, exports), inputs)
    assert native.copy_count(library) > copies  # NumPy's own buffers: some are misaligned
    _check_pair("LSTMBlockCell", out, inputs, dtype)


_PARALLEL = """
import json
import onnxruntime
from _ort_harness import branch_feeds, branches_model
from lstm_tvm import testing
from lstm_tvm.onnx import native

library, folder = sys.argv[1], sys.argv[2]
threads, sizes = int(sys.argv[3]), json.loads(sys.argv[4])
attrs = {"use_peephole": True}
for op in ("BlockLSTMV2", "BlockLSTMGradV2", "LSTMBlockCellGrad"):
    options = onnxruntime.SessionOptions()  # each session its own: the library registers once
    options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = threads
    model = branches_model(op, 3, input_size=sizes["I"], cell_size=sizes["H"], attrs=attrs)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), native.session_options([folder], library, base=options),
        providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for call in range(4):
        feeds, expected = branch_feeds(op, 3, seed=10 * call, attrs=attrs, **sizes)
        out = dict(zip(names, session.run(None, feeds)))
        for name, ref in expected.items():
            testing.assert_close(out[name], ref, "float32", f"{op} x3 call {call}: {name}")
    print("ok", op, flush=True)
print("kernel threads", native.kernel_threads(library), flush=True)
"""


@pytest.mark.parametrize("threads", [2, 4])
def test_parallel_executor_runs_the_native_route(library, exports, threads):
    """Three independent nodes at once on onnxruntime's inter-op threads (threads Python did
    not make), each on inputs of its own; in a child process: a crash fails this test only."""
    out = run_child(_PARALLEL, library, exports["f32"], threads,
                    json.dumps({"T": T, "B": B, "I": I, "H": H}))
    assert out.split().count("ok") == 3, out
    # the thread that called run spins on a core: each kernel ran on one core fewer
    assert f"kernel threads {max(1, usable_cores() - 1)}" in out, out


def test_kernel_threads_entry_is_checked(library, exports):
    """The library refuses a CONFIG_KERNEL_THREADS that is not an int >= 1 when registered,
    naming the entry and the value; the sequential executor leaves the entry unset."""
    for bad in ("0", "two", "-3", "1.5"):
        options = ort.SessionOptions()
        options.add_session_config_entry(native.CONFIG_KERNEL_THREADS, bad)
        with pytest.raises(Exception, match=f"{native.CONFIG_KERNEL_THREADS}: expected an int "
                                            f"from 1 to 4096 .*got '{bad}'"):
            native.session_options([exports["f32"]], library, base=options)
    options = native.session_options([exports["f32"]], library)
    with pytest.raises(RuntimeError):
        options.get_session_config_entry(native.CONFIG_KERNEL_THREADS)


def test_cmake_example_builds_the_library(exports, tmp_path):
    """``examples/ort/CMakeLists.txt`` (the guide's command) builds a library with the same
    definitions as :func:`native.build_command`, which registers and runs a node."""
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("g++") is None:
        pytest.skip("no cmake or g++ here")
    try:
        native.ort_include_dir()
    except FileNotFoundError as err:
        pytest.skip(f"no ONNX Runtime headers: {err}")
    example = Path(__file__).resolve().parents[1] / "examples" / "ort"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for cmd in ([cmake, "-S", str(example), "-B", str(tmp_path),
                 f"-DPython3_EXECUTABLE={sys.executable}"],
                [cmake, "--build", str(tmp_path), "--", "VERBOSE=1"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name, value in native.compile_definitions().items():
        assert f"-D{name}={value}".replace('"', '\\"') in done.stdout, name
    built = tmp_path / "liblstm_tvm_ort.so"
    assert native.api_version(built) == native.ORT_HEADERS_API_VERSION
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T, attrs=PEEPHOLE, seed=5)
    model = lo.make_model("BlockLSTMV2", "float32", input_size=I, cell_size=H, attrs=PEEPHOLE,
                          with_functions=False)
    session = open_session(model, "native", exports=[exports["f32"]], library=built)
    out = run_session(session, inputs, align=True)
    for name, expected in reference.run("BlockLSTMV2", inputs, PEEPHOLE).items():
        testing.assert_close(out[name], expected, "float32", name)


def test_export_chosen_by_attributes_and_dims(library, exports):
    """use_peephole=0 with I+1 runs on the f32_wide export; the same node at I fits no export
    (run-time error); a cell_clip no export has fails at session creation."""
    attrs = {"use_peephole": False}
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I + 1, H=H, T=T, attrs=attrs, seed=4)
    model = lo.make_model("BlockLSTMV2", "float32", input_size=I + 1, cell_size=H, attrs=attrs,
                          with_functions=False)
    session = _session(model, library, exports, names=("f32", "f32_wide"))
    out = run_session(session, inputs, align=True)
    for name, expected in reference.run("BlockLSTMV2", inputs, attrs).items():
        testing.assert_close(out[name], expected, "float32", name)
    narrow = lo.make_model("BlockLSTMV2", "float32", input_size=I, cell_size=H, attrs=attrs,
                           with_functions=False)
    session = _session(narrow, library, exports, names=("f32", "f32_wide"))
    inputs = testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T, attrs=attrs, seed=4)
    with pytest.raises(Exception, match="no loaded export fits these inputs"):
        run_session(session, inputs, align=True)
    clipped = lo.make_model("BlockLSTMV2", "float32", input_size=I, cell_size=H,
                            attrs={"use_peephole": True, "cell_clip": 0.5}, with_functions=False)
    with pytest.raises(Exception, match="no loaded export has this node's attributes"):
        _session(clipped, library, exports)


def test_registration_errors_raise(library, exports, tmp_path):
    with pytest.raises(ValueError, match="export_dirs"):  # checked in Python first
        native.session_options([tmp_path], library=library)
    options = ort.SessionOptions()  # the library itself: no config entry, a broken folder
    with pytest.raises(Exception, match=native.CONFIG_EXPORT_DIRS):
        options.register_custom_ops_library(str(library))
    options.add_session_config_entry(native.CONFIG_EXPORT_DIRS, str(tmp_path))
    with pytest.raises(Exception, match="manifest.json"):
        options.register_custom_ops_library(str(library))


_DAMAGED = """
import sys
from lstm_tvm.onnx import native
try:
    native.session_options([sys.argv[2]], library=sys.argv[1])
except Exception as err:
    print("refused:", err)
"""


@pytest.mark.parametrize("keep", [0.25, 0.55])
def test_a_damaged_export_is_refused_before_it_is_mapped(library, exports, tmp_path, keep):
    """An export whose library was truncated (to a quarter: mapping it is a SIGBUS; to 55%: it
    would load) fails registration naming the file and the manifest's checksum; in a child
    process, so a crash fails this test only."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(exports["f32"], damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    lib = damaged / manifest["library"]
    data = lib.read_bytes()
    lib.write_bytes(data[:int(len(data) * keep)])
    out = run_child(_DAMAGED, library, damaged)
    assert "refused:" in out and "does not match the manifest's library_sha256" in out, out
    assert str(lib) in out, out


#: Forward op -> kernels of its pair with a prepacked kernel (LSTMBlockCellGrad reads no w).
PREPACKED_PAIR = {"BlockLSTMV2": 2, "LSTMBlockCell": 1}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fwd_name", list(PREPACKED_PAIR))
def test_a_constant_w_is_packed_once_per_kernel(library, exports, fwd_name, dtype, tf):
    """``w`` an initializer: the session's kernels with a prepacked kernel (the sequence ops',
    LSTMBlockCell's) pack it once and run it; calls with other inputs against TF and the
    reference (``w`` a graph input: nothing packed, see the test above)."""
    sequence = OPS[fwd_name].kind == "sequence"
    w = testing.make_inputs(fwd_name, dtype=dtype, B=1, I=I, H=H, T=1 if sequence else None,
                            seed=20)["w"]
    model = lo.make_forward_backward_model(fwd_name, dtype, input_size=I, cell_size=H,
                                           attrs=PEEPHOLE, with_functions=False,
                                           initializers={"w": w})
    packed = native.prepacked_count(library)
    session = _session(model, library, exports)
    assert native.prepacked_count(library) == packed + PREPACKED_PAIR[fwd_name]
    for seq_len_max in (T, T - 2) if sequence else (None,):
        kw = {"T": T, "seq_len_max": seq_len_max} if sequence else {}
        inputs = testing.make_inputs(OPS[fwd_name].pair, dtype=dtype, B=B, I=I, H=H,
                                     attrs=PEEPHOLE, seed=seq_len_max or 5, **kw)
        inputs["w"] = w
        out = run_session(session, inputs, align=True)
        _check_pair(fwd_name, out, inputs, dtype, seq_len_max)
    assert native.prepacked_count(library) == packed + PREPACKED_PAIR[fwd_name]


def test_a_constant_w_packs_every_panel_of_a_wide_forward(library, tmp_path):
    """Where 32 divides ``H`` the sequence forward's prepacked kernel takes two panels (the
    column panels and ``w_units``, read at batch 1 and 2): the session packs both from the
    initializer; batches 1-3 against the reference."""
    cell = 64
    export(tmp_path / "wide", ["BlockLSTMV2", "BlockLSTMGradV2"], dtype="float32",
           input_size=I, cell_size=cell, attrs=PEEPHOLE, onnx=False, progress=False)
    w = testing.make_inputs("BlockLSTMV2", B=1, I=I, H=cell, T=1, seed=20)["w"]
    model = lo.make_forward_backward_model("BlockLSTMV2", "float32", input_size=I,
                                           cell_size=cell, attrs=PEEPHOLE,
                                           with_functions=False, initializers={"w": w})
    session = open_session(model, "native", exports=[tmp_path / "wide"], library=library)
    fwd = OPS["BlockLSTMV2"]
    for batch in (1, 2, 3):
        inputs = {**testing.make_inputs("BlockLSTMGradV2", B=batch, I=I, H=cell, T=T,
                                        attrs=PEEPHOLE, seed=batch), "w": w}
        out = run_session(session, inputs, align=True)
        ref = reference.run(fwd.name, {k: inputs[k] for k in fwd.input_names}, PEEPHOLE)
        for name in fwd.output_names:
            testing.assert_close(out[name], ref[name], "float32", f"{name} B={batch}")


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))


_THREADS_CHILD = child_script("""
    import ctypes, json, os, sys
    import numpy as np, onnx
    from _ort_harness import open_session, run_session

    def threads():
        return {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

    library, export, model, feeds = sys.argv[1:5]
    session = open_session(onnx.load(model), "native", exports=[export], library=library)
    before = threads()  # ONNX Runtime's own threads (it pins its intra-op pool by default)
    run_session(session, dict(np.load(feeds)), align=True)  # TVM's pool starts here
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    print(json.dumps({
        "allowed": sorted(os.sched_getaffinity(0)),
        "env": {v: (getenv(v.encode()) or b"").decode()
                for v in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")},
        "tvm": [cores for t, cores in threads().items() if t not in before],
    }))
""")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux thread affinities and at least 2 usable cores")
def test_the_library_gives_tvm_a_worker_per_usable_core_and_pins_none(library, exports,
                                                                         tmp_path):
    """As ``lstm_tvm._tvm.configure_threads`` does in Python, in a fresh process whose only
    TVM kernels run through the library: the workers TVM's pool starts are not pinned."""
    attrs = {"use_peephole": True}
    model = lo.make_model("BlockLSTMV2", "float32", input_size=I, cell_size=H, attrs=attrs,
                          with_functions=False)
    model_path, feeds = tmp_path / "model.onnx", tmp_path / "feeds.npz"
    model_path.write_bytes(model.SerializeToString())
    np.savez(feeds, **testing.make_inputs("BlockLSTMV2", B=B, I=I, H=H, T=T, attrs=attrs))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_BIND_THREADS")}
    done = subprocess.run([sys.executable, "-c", _THREADS_CHILD, str(library),
                           str(exports["f32"]), str(model_path), str(feeds)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    pool = json.loads(done.stdout.strip().splitlines()[-1])
    assert pool["env"] == {"TVM_NUM_THREADS": str(len(pool["allowed"])),
                           "TVM_BIND_THREADS": "0"}
    assert len(pool["tvm"]) >= len(pool["allowed"]) - 1, pool  # the caller is worker 0
    assert all(cores == pool["allowed"] for cores in pool["tvm"]), pool
