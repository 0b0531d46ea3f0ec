"""Smoke tests of ``lstm-tvm bench`` (lstm_tvm.bench) on a tiny shape."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import statistics
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner

from lstm_tvm import targets
from lstm_tvm.bench import harness
from lstm_tvm.bench import limits as bench_limits
from lstm_tvm.bench import report as bench_report
from lstm_tvm.bench import train as bench_train
from lstm_tvm.bench import worker as bench_worker
from lstm_tvm.tuning import database
from lstm_tvm.cli import main

TINY = ["--shapes", "4x2x8x8", "--repeat", "1", "--warmup", "0"]
#: harness.plan's options for a tiny lstm_tvm-only run.
_OPTS = {"shapes": [(4, 2, 8, 8)], "cases": ["cell_fwd"], "only": ["lstm_tvm"], "dtype": "float32",
         "threads": 2, "warmup": 0, "repeat": 1, "v2": False, "seed": 0, "isolate": "case"}


@pytest.fixture(autouse=True)
def _short_limits(monkeypatch):
    """The machine's limits measured briefly: these tests are of the bench, not of them."""
    monkeypatch.setenv(bench_limits.SECONDS_ENV, "0.02")


def _invoke(tmp_path, *args):
    report = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", *TINY, *args, "--json", str(report)])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(report.read_text())


def test_every_case_and_impl(tmp_path):
    output, data = _invoke(tmp_path, "--isolate", "impl")
    rows = {(r["case"], r["impl"]): r for r in data["results"]}
    assert set(rows) == {(c, i) for c in bench_worker.CASES for i in bench_worker.IMPLS}
    for (case, impl), r in rows.items():
        assert r["shape"] == [4, 2, 8, 8]
        assert bench_worker.CASES[case] in output
        if (impl, case) in bench_worker.NOT_APPLICABLE:
            assert r["status"] == "n/a"
            continue
        if not bench_worker.is_installed(impl):  # e.g. torch is not in the [test] extra
            assert r["status"] == "not installed"
            continue
        assert r["status"] == "ok", r
        assert r["median_ms"] > 0 and all(t > 0 for t in r["times_ms"])
        assert r["peak_mib"] >= 0 and r["base_mib"] > 0
        if r["flops"] and not (impl == "numpy" and case == "cell_bwd"):
            assert r["gflops"] > 0
        if case.startswith("cell") and impl != "numpy":
            assert r["gbs"] > 0
    for case in bench_worker.CASES:
        mine = rows[case, "lstm_tvm"]
        assert mine["compile_s"] > 0 and mine["vs_roofline"] > 0
        assert (mine["vs_TF"] or 0) > 0 or rows[case, "tf"]["status"] != "ok"
        assert rows[case, "raw_ops"]["over_kernel"] > 0
        assert f"raw_ops / CompiledOp {bench_worker.CASES[case]} 4x2x8x8" in output
    if bench_worker.is_installed("ort"):
        assert rows["seq_fwd", "lstm_tvm"]["vs_ORT"] > 0
    meta = data["meta"]
    assert meta["threads"] >= 1 and meta["repeat"] == 1 and meta["machine"]["cores"] >= 1
    assert f"threads {meta['threads']}, repeat 1" in output and meta["machine"]["cpu"] in output
    # the CPU as the records and the schedules see it, whatever name a VM reports
    target = targets.resolve_target("llvm")
    assert meta["machine"]["records_key"] == database.records_key(target)
    assert meta["machine"]["mcpu"] == targets.host_cpu()
    assert f"records key {database.records_key(target)}" in output
    assert f"LLVM mcpu {targets.host_cpu()}" in output
    # what the performance page shows of a machine, and the command that repeats the run
    assert meta["versions"]["apache-tvm"] == importlib.metadata.version("apache-tvm")
    assert "onnxruntime" in meta["versions"] and meta["python"] == platform.python_version()
    assert abs(datetime.fromisoformat(meta["date"]) - datetime.now(timezone.utc)) < timedelta(
        hours=1)
    assert meta["command"].startswith("lstm-tvm bench --shapes 4x2x8x8 --cases seq_fwd,")
    assert "--repeat 1 --warmup 0 --isolate impl" in meta["command"]


def test_default_output_fits_100_columns_and_wide_has_every_column(tmp_path):
    """The compact table: every line at most 100 columns, no n/a rows, the ratios of the
    report; ``--wide``: every column, as the report (``--json``) holds it."""
    output, data = _invoke(tmp_path, "--only", "lstm_tvm,ort,numpy", "--cases",
                           "seq_fwd,cell_bwd")
    lines = output.splitlines()
    assert max(map(len, lines)) <= bench_report.WIDTH, max(lines, key=len)
    rows = [line.split() for line in lines if line.startswith("4x2x8x8 ")]
    assert len(rows) == 5  # ort's cell bwd is n/a: not a row, a note
    assert "Not shown (n/a): ort cell bwd gates (ONNX's LSTM is a sequence forward op)" \
        in output.replace("\n  ", " ")
    mine = next(r for r in data["results"] if (r["impl"], r["case"]) == ("lstm_tvm", "seq_fwd"))
    row = next(r for r in rows if r[:4] == ["4x2x8x8", "seq", "fwd", "lstm_tvm"])
    assert row[4] == f"{mine['median_ms']:.3f}" and row[-1] == f"{mine['vs_roofline']:.2f}"
    result = CliRunner().invoke(main, ["bench", *TINY, "--only", "lstm_tvm,ort", "--cases",
                                       "cell_bwd", "--wide"])
    assert result.exit_code == 0, result.output
    assert "peak MiB" in result.output and "compile s" in result.output
    assert "LSTMBlockCellGrad (CompiledOp, out=)" in result.output  # what was timed
    assert re.search(r"cell bwd \(gates only\)\s+ort\s+n/a", result.output)  # n/a rows too


def test_rounds_measure_every_case_in_several_processes(tmp_path):
    """``--rounds 2``: each case runs in two worker processes; its row is the median of their
    medians, with every timed call, both medians and their spread, which a note prints."""
    output, data = _invoke(tmp_path, "--only", "lstm_tvm", "--cases", "cell_fwd",
                           "--rounds", "2", "--repeat", "3")
    rows = {r["impl"]: r for r in data["results"]}
    assert set(rows) == {"lstm_tvm"}
    for r in rows.values():
        assert r["status"] == "ok" and len(r["process_ms"]) == 2 and len(r["times_ms"]) == 6
        assert r["median_ms"] == pytest.approx(statistics.median(r["process_ms"]))
        assert r["process_spread"] == pytest.approx(max(r["process_ms"]) / min(r["process_ms"]))
    assert data["meta"]["rounds"] == 2 and "--rounds 2" in data["meta"]["command"]
    note = output.replace("\n  ", " ")
    assert (f"spread over 2 processes a case (slowest median / fastest): lstm_tvm cell fwd "
            f"4x2x8x8 {rows['lstm_tvm']['process_spread']:.2f}") in note
    assert max(map(len, output.splitlines())) <= bench_report.WIDTH


def test_missing_peers_are_reported(tmp_path, monkeypatch):
    real = bench_worker.is_installed
    monkeypatch.setattr(bench_worker, "is_installed", lambda impl: impl == "numpy" and real(impl))
    output, data = _invoke(tmp_path, "--only", "tf,torch,numpy", "--cases", "seq_bwd,cell_bwd")
    rows = {(r["case"], r["impl"]): r for r in data["results"]}
    assert rows["seq_bwd", "tf"]["status"] == "not installed"
    assert rows["seq_bwd", "torch"]["status"] == "not installed"
    assert rows["cell_bwd", "torch"]["status"] == "n/a"  # no gates-only op in PyTorch
    assert rows["seq_bwd", "numpy"]["status"] == "ok"  # default --isolate case: one worker each
    assert rows["cell_bwd", "numpy"]["median_ms"] > 0
    assert output.count("not installed") >= 3  # a note per row, whose table cell says missing
    assert sum("missing" in line.split() for line in output.splitlines()
               if line.startswith("4x2x8x8 ")) == 3
    assert rows["seq_bwd", "tf"]["vs_roofline"] is None


def test_only_lstm_tvm_failure_sets_status(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_worker, "is_installed", lambda impl: False)
    result = CliRunner().invoke(main, ["bench", *TINY, "--only", "lstm_tvm", "--cases",
                                       "cell_fwd"])
    assert result.exit_code == 1 and "not installed" in result.output


def test_parse_shapes_and_flops():
    assert harness.parse_shapes("4x2x8x8, 64X32x256x256") == [(4, 2, 8, 8), (64, 32, 256, 256)]
    for bad in ("4x2x8", "4x2x8x0", "axbxcxd", ""):
        with pytest.raises(ValueError):
            harness.parse_shapes(bad)
    T, B, I, H = 64, 32, 256, 256
    assert harness.case_flops("seq_bwd", T, B, I, H) == 16 * T * B * H * (I + H)
    assert harness.case_flops("seq_fwd", T, B, I, H) == 8 * T * B * H * (I + H)
    assert harness.case_flops("cell_bwd_full", T, B, I, H) == 16 * B * H * (I + H)
    assert harness.case_flops("cell_bwd", T, B, I, H) is None
    # LSTMBlockCell: x (B, I), 2 states + 7 outputs (B, H), w (I+H, 4H), 3 peepholes, b (4H).
    want = B * I + 9 * B * H + (I + H) * 4 * H + 3 * H + 4 * H
    assert harness.case_bytes("cell_fwd", "float16", T, B, I, H) == 2 * want


def test_bad_options():
    result = CliRunner().invoke(main, ["bench", "--shapes", "4x2", "--only", "numpy"])
    assert result.exit_code == 2 and "--shapes" in result.output
    result = CliRunner().invoke(main, ["bench", "--only", "mxnet"])
    assert result.exit_code == 2 and "--only" in result.output


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__]))


def test_the_onnx_runtime_peer_computes_the_same_lstm():
    pytest.importorskip("onnxruntime")
    from lstm_tvm import reference, registry, testing

    op = registry.get_op("BlockLSTMV2")
    inputs = testing.make_inputs(op.name, B=3, I=5, H=8, T=4, seed=1,
                                 attrs={"use_peephole": False})
    item = {"layout": op.gate_layout, "forget_bias": 0.0, "case": "seq_fwd"}
    runner = bench_worker.make_ort(item, inputs, "float32", {"threads": 1})
    y = runner.call()[0][:, 0]  # (T, num_directions, B, H)
    want = reference.run(op.name, inputs, {"use_peephole": False})["h"]
    testing.assert_close(y, want, "float32", "ORT LSTM Y vs BlockLSTMV2 h")


def test_latency_preset_runs_the_deployment_shapes(tmp_path, monkeypatch):
    captured = {}
    monkeypatch.setattr("lstm_tvm.cli.bench.run",
                        lambda opts: captured.update(opts) or {"meta": {}, "results": []})
    monkeypatch.setattr("lstm_tvm.cli.bench.render", lambda report, wide: "")
    result = CliRunner().invoke(main, ["bench", "--latency", "--only", "numpy"])
    assert result.exit_code == 0, result.output
    assert captured["shapes"] == list(harness.LATENCY_SHAPES)
    assert (100, 1, 256, 256) in captured["shapes"] and (1, 1, 16, 16) in captured["shapes"]


def test_isa_avx2_builds_lstm_tvm_for_avx2_and_caps_pytorch(tmp_path):
    output, data = _invoke(tmp_path, "--isa", "avx2", "--only", "lstm_tvm,raw_ops",
                           "--cases", "cell_fwd")
    assert data["meta"]["isa"] == "avx2" and "isa avx2" in output
    assert all(r["status"] == "ok" for r in data["results"])
    env = harness.worker_env(2, "avx2")
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    jobs, _ = harness.plan({**_OPTS, "isa": "avx2"}, tmp_path)
    assert all(job["target"]["mcpu"] == "x86-64-v3" for job in jobs)


def test_cuda_bench_runs_its_comparison_on_the_cpu():
    """``python -m lstm_tvm.bench.cuda`` (lstm_tvm's CUDA build against cuDNN) on the CPU:
    the same weights give PyTorch's ``h`` and ``x_grad`` (float32, values of order 1: a few
    ulp apart after 3 steps)."""
    pytest.importorskip("torch")
    from lstm_tvm.bench import cuda as bench_cuda

    rows = bench_cuda.run([(3, 2, 8, 16)], ["float32"], warmup=0, repeat=2, target="llvm",
                          log=lambda line: None)
    assert [r["case"] for r in rows] == ["seq_fwd", "seq_bwd"]
    assert rows[0]["h_max_diff"] < 1e-5 and rows[1]["x_grad_max_diff"] < 1e-5
    assert all(r["lstm_tvm_ms"] > 0 and r["cudnn_ms"] > 0 for r in rows)


def test_training_step_bench_runs_each_route_in_its_own_process():
    """The training-step bench at a tiny shape (the TF routes and the bare kernels, each in its
    own process; the PyTorch routes run the same worker code): every route runs, the table
    fits 100 columns, and the ratios are the report's medians divided."""
    pytest.importorskip("tensorflow", reason="the TF routes")
    report = bench_train.run([(6, 2, 8, 8)], impls=("kernels", "lstm_tvm.tf", "tf"), warmup=1,
                             repeat=3)
    rows = {r["impl"]: r for r in report["results"]}
    for impl in ("kernels", "lstm_tvm.tf", "tf"):
        assert rows[impl]["status"] == "ok" and rows[impl]["median_ms"] > 0, rows[impl]
        assert rows[impl]["process_ms"] == [rows[impl]["median_ms"]]
    assert report["meta"]["machine"]["records_key"] and report["meta"]["repeat"] == 3
    assert report["meta"]["rounds"] == 1
    lines = bench_train.render(report).splitlines()
    assert lines[0].startswith("machine: ") and max(map(len, lines)) <= 100
    ours = next(line for line in lines if " lstm_tvm.tf " in line).split()
    assert ours[3] == f"{rows['lstm_tvm.tf']['mean_ms']:.3f}"
    assert rows["kernels"]["min_ms"] <= rows["kernels"]["mean_ms"] <= rows["kernels"]["max_ms"]
    assert ours[4] == "-"  # one process: no spread
    want = rows["tf"]["median_ms"] / rows["lstm_tvm.tf"]["median_ms"]
    assert ours[5] == f"{want:.2f}"
    over = rows["lstm_tvm.tf"]["median_ms"] / rows["kernels"]["median_ms"] - 1
    assert ours[6] == f"{over * 100:+.1f}%"


def test_training_rounds_combine_the_processes_of_each_route():
    """``--rounds``: a route's result is the median of its processes' medians, the mean, fastest
    and slowest step of all; a failed process makes the route's result that failure."""
    def row(impl, ms):
        return {"impl": impl, "shape": [6, 2, 8, 8], "status": "ok", "median_ms": ms,
                "mean_ms": ms * 1.1, "min_ms": ms * 0.9, "max_ms": ms * 1.5}

    runs = {"kernels": [row("kernels", m) for m in (2.0, 3.0, 2.5)],
            "lstm_tvm.tf": [row("lstm_tvm.tf", m) for m in (4.0, 3.0, 9.0)],
            "tf": [row("tf", 30.0), {"impl": "tf", "shape": [6, 2, 8, 8],
                                     "status": "timed out after 1 s"}],
            "torch": [row("torch", m) for m in (5.0, 6.0, 5.0)]}
    results = [bench_train._combined(r) for r in runs.values()]
    kernels, ours, tf_row, _ = results
    assert kernels["median_ms"] == statistics.median([2.0, 3.0, 2.5])
    assert (kernels["min_ms"], kernels["max_ms"]) == (2.0 * 0.9, 3.0 * 1.5)
    assert kernels["mean_ms"] == pytest.approx(statistics.mean([2.2, 3.3, 2.75]))
    assert ours["process_ms"] == [4.0, 3.0, 9.0] and ours["median_ms"] == 4.0
    assert tf_row["status"] == "timed out after 1 s"
    meta = {"machine": {"cpu": "test CPU", "cores": 2}, "threads": 2, "repeat": 3, "warmup": 1,
            "rounds": 3, "load_average": [0.5, 0.5, 0.5]}
    text = bench_train.render({"meta": meta, "results": results})
    line = next(line for line in text.splitlines() if " lstm_tvm.tf " in line).split()
    assert line[2:5] == ["4.000", f"{statistics.mean([4.4, 3.3, 9.9]):.3f}", "3.00-9.00"]
    # ratios within each round (4/2, 3/3, 9/2.5), then their median: not 4.0 / 2.5
    assert line[6] == f"{(statistics.median([2.0, 1.0, 3.6]) - 1) * 100:+.1f}%"
    # the kernels row: nn.LSTM's time over the kernels', round by round (5/2, 6/3, 5/2.5)
    line = next(line for line in text.splitlines() if " kernels " in line).split()
    assert line[5:] == [f"{statistics.median([2.5, 2.0, 2.0]):.2f}", "-"]
    assert "median over 3 processes each" in text.replace("\n  ", " ")
    assert "ratios are medians of the rounds' ratios" in text.replace("\n  ", " ")
