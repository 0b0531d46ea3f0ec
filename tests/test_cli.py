"""Tests for the ``lstm-tvm`` command line (lstm_tvm.cli) and the documentation's generated op
table."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from lstm_tvm import build as _build
from lstm_tvm import testing
from lstm_tvm.targets import resolve_target
from lstm_tvm.cli import main, op_table_markdown
from lstm_tvm.registry import OPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--seq-len", "3", "--batch", "2", "--input-size", "4", "--cell-size", "5", "--repeat", "2"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test compiles into its own empty cache (disk, and the in-process module cache)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(path))
    _build.clear_memory_cache()
    return path


def _result_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.split()[:1] and line.split()[0] in OPS]


def test_build_tiny_passes(tmp_path):
    report = tmp_path / "results.json"
    args = ["build", "--ops", "LSTMBlockCell,BlockLSTMGradV2", "--dtype", "float32", *TINY,
            "--json", str(report)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = _result_lines(result.stdout)
    assert len(rows) == 4, result.stdout  # two ops x peephole off/on
    assert all(row.split()[0] in ("LSTMBlockCell", "BlockLSTMGradV2") for row in rows)
    assert all(row.endswith("PASS") for row in rows), result.stdout
    assert "4/4 passed" in result.stdout
    data = json.loads(report.read_text())
    assert data["passed"] is True
    assert [(r["op"], r["use_peephole"]) for r in data["results"]] == [
        ("LSTMBlockCell", False), ("LSTMBlockCell", True),
        ("BlockLSTMGradV2", False), ("BlockLSTMGradV2", True)]
    for r in data["results"]:
        assert (r["rtol"], r["atol"]) == testing.tolerance("float32")
        assert r["max_abs_err"] < r["atol"] and r["run_ms"] > 0 and r["compile_s"] > 0


def test_build_fails_with_status_1(monkeypatch):
    monkeypatch.setitem(testing.TOLERANCE, "float32", (0.0, 0.0))
    args = ["build", "--ops", "BlockLSTM", "--dtype", "float32", "--peephole", "off", *TINY]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    rows = _result_lines(result.stdout)
    assert len(rows) == 1 and rows[0].endswith("FAIL"), result.stdout
    assert "BlockLSTM.h (float32)" in result.stderr  # assert_close's message, per output


@pytest.mark.parametrize("option, value", [("--ops", "BlockLSTM,NoSuchOp"), ("--dtype", "float64")])
def test_build_rejects_unknown_choices(option, value):
    result = CliRunner().invoke(main, ["build", option, value])
    assert result.exit_code == 2
    assert option in result.output and value.split(",")[-1] in result.output


def test_ops_lists_every_registry_op():
    result = CliRunner().invoke(main, ["ops"])
    assert result.exit_code == 0, result.output
    for op in OPS.values():
        assert op.name in result.stdout
        assert op.gate_layout in result.stdout


def test_ops_markdown_is_op_table_markdown():
    result = CliRunner().invoke(main, ["ops", "--markdown"])
    assert result.exit_code == 0, result.output
    assert result.stdout == op_table_markdown() + "\n"
    table_ops = [line.split("|")[1].strip() for line in op_table_markdown().splitlines()[2:]]
    assert table_ops == list(OPS)


def test_docs_op_table_is_generated():
    page = (ROOT / "docs" / "guide" / "semantics.md").read_text()
    begin, end = "<!-- op-table:begin -->", "<!-- op-table:end -->"
    assert page.count(begin) == 1 and page.count(end) == 1
    section = page.split(begin, 1)[1].split(end, 1)[0]
    assert section.strip() == op_table_markdown(), (
        "docs/guide/semantics.md op table is stale: paste `lstm-tvm ops --markdown` between "
        "the markers")


def test_cache_info_and_clear(cache_dir):
    runner = CliRunner()
    args = ["build", "--ops", "LSTMBlockCell", "--dtype", "float32", "--peephole", "off", *TINY]
    assert runner.invoke(main, args).exit_code == 0
    info = runner.invoke(main, ["cache", "info"])
    assert info.exit_code == 0, info.output
    assert str(cache_dir) in info.stdout and "entries: 1" in info.stdout
    cleared = runner.invoke(main, ["cache", "clear"])
    assert cleared.exit_code == 0 and "removed 1 entries" in cleared.stdout
    assert "entries: 0" in runner.invoke(main, ["cache", "info"]).stdout


def test_python_m_lstm_tvm_help():
    proc = subprocess.run([sys.executable, "-m", "lstm_tvm", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("build", "ops", "cache"):
        assert command in proc.stdout


def _cuda_gpu_present() -> bool:
    from lstm_tvm._tvm import tvm

    return bool(tvm.cuda(0).exist)


@pytest.mark.skipif(_cuda_gpu_present(), reason="a CUDA GPU is present, so `build --target cuda` "
                    "runs and verifies the cases (see `pytest -m gpu tests/test_cuda.py`)")
def test_build_cuda_without_gpu_compiles_and_skips_the_run(tmp_path):
    """docs/guide/cuda.md: without a GPU an op still builds but cannot run. `build` compiles each case,
    reports its run as skipped (no CUDA device) rather than a FAIL carrying TVM's InternalError,
    and exits 0, since no case failed."""
    report = tmp_path / "results.json"
    args = ["build", "--target", "cuda", "--ops", "LSTMBlockCell", "--dtype", "float32",
            "--peephole", "off", *TINY, "--json", str(report)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "InternalError" not in result.output and "Traceback" not in result.output
    rows = _result_lines(result.stdout)
    assert len(rows) == 1 and rows[0].endswith("SKIP"), result.stdout
    assert "0/1 passed, 1 skipped" in result.stdout
    assert "skipped: no CUDA device" in result.stdout
    row = json.loads(report.read_text())["results"][0]
    assert row["compile_s"] > 0 and row["run_ms"] is None and row["failures"] == []
    assert row["skipped"].startswith("no CUDA device")


@pytest.mark.parametrize("command", [["build", "--ops", "LSTMBlockCell"],
                                     ["export", "--ops", "LSTMBlockCell", "-o", "out"],
                                     ["tune", "--ops", "LSTMBlockCell", "--schedules-dir", "out"],
                                     ["schedules"]])
@pytest.mark.parametrize("target, problem", [('{"kind": "llvm", "mcpu": 3', "not valid JSON"),
                                             ("nosuchkind", "nosuchkind"),
                                             ('{"kind": "llvm", "mcpu": 3}', "mcpu"),
                                             ("opencl", "not supported")])
def test_bad_target_is_one_usage_error(tmp_path, monkeypatch, command, target, problem):
    """A target that cannot work is rejected once, before any case runs: exit status 2 and one
    error naming --target (not one FAIL row per case, nor a half-written export)."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*command, "--target", target])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--target" in errors[0] and problem in errors[0], result.output
    assert not _result_lines(result.output) and not (tmp_path / "out").exists()


def test_tune_refuses_a_target_it_cannot_tune(tmp_path):
    result = CliRunner().invoke(main, ["tune", "--target", "cuda", "--schedules-dir",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "target kind 'cuda' is not supported; lstm_tvm tunes llvm" in result.output
    assert not (tmp_path / "out").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_build_says_which_machine_and_tuning_records_it_uses(tmp_path, monkeypatch):
    """The summary names the CPU as the schedules and the records see it (LLVM's ``mcpu``, the
    records key), whatever model name the machine reports, and the records it uses."""
    from lstm_tvm.targets import host_cpu
    from lstm_tvm.tuning import database

    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "user"))
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "0")
    args = ["build", "--ops", "LSTMBlockCell", "--dtype", "float32", "--peephole", "off", *TINY]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    key = database.records_key(resolve_target())
    assert f"tuning records: none for {key}: rule-based default schedules" in result.output
    machine = next(line for line in result.output.splitlines() if line.startswith("machine: "))
    assert f"LLVM mcpu {host_cpu()}" in machine and f"records key {key}" in machine
