"""AArch64 deployment, verified under emulation: ``lstm-tvm export --target aarch64`` builds an
AArch64 library with the cross compiler; the C++ example, cross-compiled against TVM's AArch64
runtime, runs every op in it under qemu-user, against the float64 reference.

Needs Debian's ``g++-aarch64-linux-gnu`` and ``qemu-user-static`` and TVM's AArch64 wheels
(fetched with pip); ``.ci/run`` installs them. Without them these tests skip, saying what is
missing. Emulated runs say nothing of speed: nothing here is timed.
"""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lstm_tvm.export as lte
from lstm_tvm import cross_compile, env, reference, testing
from lstm_tvm._tvm import host_arch
from lstm_tvm.targets import resolve_target
from lstm_tvm.cli import main
from lstm_tvm.kernels import WEIGHT_PACKS
from lstm_tvm.registry import OPS
from lstm_tvm.tuning import database

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cpp" / "run_block_lstm_grad.cc"
CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64-static"
SYSROOT = Path("/usr/aarch64-linux-gnu")
I, H = 8, 16
#: ``e_machine`` of an AArch64 ELF file.
EM_AARCH64 = 183

pytestmark = pytest.mark.skipif(host_arch() == "aarch64",
                                reason="this machine is AArch64: nothing to cross-build")


def _need_tools():
    if shutil.which(CXX) is None:
        pytest.skip(f"no {CXX}: apt-get install g++-aarch64-linux-gnu")
    if shutil.which(QEMU) is None or not SYSROOT.is_dir():
        pytest.skip(f"no {QEMU} or {SYSROOT}: apt-get install qemu-user-static "
                    f"g++-aarch64-linux-gnu")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """The C++ example cross-compiled for AArch64 against TVM's AArch64 runtime."""
    _need_tools()
    folder = Path(os.environ.get("LSTM_TVM_CROSS_RUNTIME_DIR")
                  or env.cache_dir() / "cross-runtime" / "aarch64")
    try:
        libs = cross_compile.fetch_runtime("aarch64", folder)
    except RuntimeError as err:
        pytest.skip(f"TVM's AArch64 runtime could not be fetched: {err}")
    program = tmp_path_factory.mktemp("aarch64") / "run_op"
    cmd = lte.cxx_build_command(EXAMPLE, program, compiler=CXX, libraries=libs)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    assert _elf_machine(program) == EM_AARCH64
    return program


def _elf_machine(path) -> int:
    return int.from_bytes(Path(path).read_bytes()[18:20], "little")


def _export(folder, dtype, ops=None, peephole=True, sizes=(I, H)):
    result = CliRunner().invoke(main, [
        "export", "--target", "aarch64", "--dtype", dtype, "--input-size", str(sizes[0]),
        "--cell-size", str(sizes[1]), "--use-peephole" if peephole else "--no-use-peephole",
        "--no-onnx", "-o", str(folder), *(["--ops", ",".join(ops)] if ops else [])])
    assert result.exit_code == 0, result.output
    assert _elf_machine(folder / "lstm_tvm_ops.so") == EM_AARCH64
    return folder


def _run(program, folder, op_name, inputs, work: Path, *options):
    (work / "in").mkdir(parents=True)
    (work / "out").mkdir()
    for name, value in inputs.items():
        lte.save_tensor(work / "in" / f"{name}.bin", value)
    proc = subprocess.run([QEMU, "-L", str(SYSROOT), str(program), str(folder),
                           str(work / "in"), str(work / "out"), op_name, *options],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {n: lte.load_tensor(work / "out" / f"{n}.bin") for n in OPS[op_name].output_names}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_op_of_an_aarch64_export_matches_the_reference_under_qemu(runner, tmp_path,
                                                                        dtype):
    ops = None if dtype == "float32" else ["LSTMBlockCell", "BlockLSTMV2", "BlockLSTMGradV2"]
    folder = _export(tmp_path / "export", dtype, ops)
    attrs = {"use_peephole": True}
    for op_name in ops or OPS:
        # B=3 and T=5: no tile divides them; seq_len_max below T pads the last steps
        for B, T, steps in ((3, 5, 5), (1, 4, 2)):
            inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, attrs=attrs,
                                         seed=B * 10 + T, T=T if OPS[op_name].kind ==
                                         "sequence" else None)
            if "seq_len_max" in inputs:
                inputs["seq_len_max"] = np.int64(steps)
            ref = reference.run(op_name, inputs, attrs)
            # ops that pack w: also their prepacked kernel, on panels packed once
            runs = [()] + ([("--prepacked",)] if op_name in WEIGHT_PACKS and B > 1 else [])
            for options in runs:
                got = _run(runner, folder, op_name, inputs,
                           tmp_path / f"{op_name}-{B}{''.join(options)}", *options)
                for name, value in got.items():
                    testing.assert_close(value, ref[name], dtype,
                                         f"{op_name}.{name} B={B} {' '.join(options)}")


def test_the_backward_transposes_its_weights_in_vector_registers_under_qemu(runner, tmp_path):
    """At I=H=32 the backward's transposed weight panels are copied in square tiles through
    vector registers (``KernelBuilder.panels``, two-vector shuffles that NEON lowers its own
    way): the gradients, of the kernel that packs ``w`` and of the prepacked one, match the
    reference."""
    from lstm_tvm.kernels.contract import PANEL, TRANSPOSE_LANES

    size = 32
    assert size % PANEL == 0 and 4 * size % TRANSPOSE_LANES == 0  # the vector-tile copy applies
    folder = _export(tmp_path / "export", "float32", ["BlockLSTMGrad"], sizes=(size, size))
    inputs = testing.make_inputs("BlockLSTMGrad", dtype="float32", B=2, I=size, H=size,
                                 attrs={"use_peephole": True}, seed=7, T=3)
    ref = reference.run("BlockLSTMGrad", inputs, {"use_peephole": True})
    for options in ((), ("--prepacked",)):
        got = _run(runner, folder, "BlockLSTMGrad", inputs,
                   tmp_path / f"run{''.join(options)}", *options)
        for name, value in got.items():
            testing.assert_close(value, ref[name], "float32", f"{name} {' '.join(options)}")


def test_export_without_the_cross_compiler_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv(cross_compile.CROSS_CXX_ENV, raising=False)
    monkeypatch.setattr(cross_compile.shutil, "which", lambda name: None)
    result = CliRunner().invoke(main, ["export", "--target", "aarch64", "--ops", "LSTMBlockCell",
                                       "--no-onnx", "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "apt-get install g++-aarch64-linux-gnu" in result.output
    assert cross_compile.CROSS_CXX_ENV in result.output
    assert not (tmp_path / "out" / "lstm_tvm_ops.so").exists()
    monkeypatch.setenv(cross_compile.CROSS_CXX_ENV, "no-such-g++")
    result = CliRunner().invoke(main, ["export", "--target", "aarch64", "--ops", "LSTMBlockCell",
                                       "--no-onnx", "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "'no-such-g++' is not an executable" in result.output


def test_build_for_aarch64_compiles_every_case_and_skips_running_it(tmp_path):
    result = CliRunner().invoke(main, ["build", "--target", "aarch64", "--ops", "BlockLSTMV2",
                                       "--dtype", "float32", "--seq-len", "3", "--batch", "2",
                                       "--input-size", "8", "--cell-size", "16"])
    assert result.exit_code == 0, result.output
    assert "SKIP" in result.output and "FAIL" not in result.output
    assert "cannot run on this" in result.output


def test_the_aarch64_alias_and_its_records_key():
    target = resolve_target("aarch64")
    assert str(target.attrs["mtriple"]) == "aarch64-linux-gnu"
    assert list(target.attrs["mattr"]) == ["+neon"]
    assert database.records_key(target) == "llvm-aarch64"
    # a CPU named by no model: its architecture, so x86 and Arm records never share a key
    assert database.records_key(resolve_target({"kind": "llvm"})) == f"llvm-{host_arch()}"
    assert cross_compile.is_cross(target)
    assert not cross_compile.is_cross(resolve_target("llvm"))
    assert cross_compile.export_options(resolve_target("llvm")) == {}
