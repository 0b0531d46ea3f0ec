"""This machine's limits as ``lstm-tvm bench`` measures them (lstm_tvm.bench.limits): the
program builds and its output parses, the floor is the hand-computed one, and the bench's
report carries the limits and each row's distance from them.

Measurements here are short (a few hundredths of a second each) and the machine may be busy:
the figures are only checked to be positive and consistent with one another, never for speed.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from lstm_tvm import env
from lstm_tvm.bench import harness
from lstm_tvm.bench import limits as bench_limits
from lstm_tvm.bench import report as bench_report
from lstm_tvm.cli import main

SHORT = 0.02  # seconds a measurement lasts here


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_the_program_builds_and_its_output_parses():
    """Every figure is positive; the best run is the one reported; the rates, the slice and the
    pass time agree; the ISA is the widest this CPU has (as /proc/cpuinfo lists it)."""
    if bench_limits.compiler() is None:
        pytest.skip("no C compiler on PATH")
    threads = env.usable_cores()
    sizes = [bench_limits.wh_bytes(256), bench_limits.wh_bytes(16)]
    limits = bench_limits.measure(threads, sizes, seconds=SHORT, repeats=2)
    assert limits["status"] == "ok", limits
    assert limits["threads"] == threads and limits["repeats"] == 2
    assert len(limits["fma_gflops"]) == 2 and min(limits["fma_gflops"]) > 0
    # %.6g in the program's JSON: equal to 6 significant digits
    assert limits["fma_peak_gflops"] == pytest.approx(max(limits["fma_gflops"]), rel=1e-5)
    assert limits["fma_one_core_gflops"] > 0
    assert limits["core_scaling"] == pytest.approx(
        limits["fma_peak_gflops"] / (threads * limits["fma_one_core_gflops"]))
    vector_bytes = limits["vector_bits"] // 8
    assert [s["wh_bytes"] for s in limits["stream"]] == sizes
    for s in limits["stream"]:
        share = -(-s["wh_bytes"] // threads)
        # rounded up to whole groups of 8 vectors, the program's streaming step
        assert share <= s["slice_bytes"] < share + 8 * vector_bytes
        assert s["slice_bytes"] % (8 * vector_bytes) == 0
        assert s["pass_s"] > 0 and s["pass_s"] == pytest.approx(min(s["pass_runs_s"]), rel=1e-5)
        assert s["gbs_per_core"] == pytest.approx(s["slice_bytes"] / s["pass_s"] / 1e9, rel=1e-4)
        assert s["gbs"] == pytest.approx(threads * s["gbs_per_core"], rel=1e-4)
    # I = H = 256 float32: 256 x 1024 floats, 1 MiB over the cores
    assert limits["stream"][0]["wh_bytes"] == 2**20
    flags, arch = _cpu_flags(), platform.machine()
    if arch == "x86_64" and flags:
        want = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
                else "AVX" if "avx" in flags else "SSE2")
        assert (limits["isa"], limits["fma"]) == (want, "fma" in flags)
    elif arch == "aarch64":
        assert limits["isa"] in ("NEON", "SVE") and limits["fma"]
    # built once: the second call finds the program in the cache
    program, _ = bench_limits.build()
    mtime = program.stat().st_mtime_ns
    assert bench_limits.build()[0] == program and program.stat().st_mtime_ns == mtime
    assert str(program) in limits["build"]


def test_without_a_compiler_the_limits_are_na(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert bench_limits.compiler() is None
    limits = bench_limits.measure(2, seconds=SHORT)
    assert limits["status"] == "n/a" and "no C compiler" in limits["error"]
    assert bench_limits.describe(limits)[0].startswith("limits: n/a (no C compiler")
    row = bench_limits.case_limits(limits, "seq_fwd", (4, 1, 16, 16), 4, 1.0, 2.0)
    assert row == {"peak_fraction": None, "floor_ms": None, "over_floor": None}


def test_the_aarch64_build_runs_under_emulation(tmp_path):
    """The same file, cross-compiled for AArch64 (NEON: vector extensions, no intrinsics), runs
    under qemu-user and prints the JSON the x86 build does. Nothing is timed."""
    cc, qemu = "aarch64-linux-gnu-gcc", "qemu-aarch64-static"
    missing = [tool for tool in (cc, qemu) if shutil.which(tool) is None]
    if missing or platform.machine() == "aarch64":
        pytest.skip(f"missing {missing}" if missing else "this machine is AArch64")
    program = tmp_path / "bench_limits"
    subprocess.run([cc, "-O3", "-march=armv8-a", "-ffp-contract=fast", "-pthread",
                    str(bench_limits.SOURCE), "-o", str(program)], check=True, timeout=300)
    proc = subprocess.run([qemu, "-L", "/usr/aarch64-linux-gnu", str(program), "2", "0.005",
                           "1", "4096"], capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(proc.stdout)
    assert (out["isa"], out["vector_bits"], out["fma"]) == ("NEON", 128, True)
    assert out["fma_peak_gflops"] > 0 and out["stream"][0]["slice_bytes"] == 4096
    assert out["stream"][0]["gbs_per_core"] > 0


def test_the_floor_is_the_hand_computed_one():
    """floor_s against the formula worked by hand (docs/guide/benchmark.md), on both sides of
    its max: the pass over W_h, or the step's own FLOPs at the peak."""
    P, t_pass = 80.0, 13.8e-6  # GFLOP/s; seconds a pass over W_h
    # T=100, B=1, I=H=256: a step's FLOPs 8*1*256*256 = 524288 take 6.5536 us < t_pass.
    # Forward: x @ W_x, 8*100*1*256*256 = 52428800 FLOPs.
    assert bench_limits.floor_s("seq_fwd", 100, 1, 256, 256, P, t_pass) == pytest.approx(
        100 * 13.8e-6 + 52_428_800 / 80e9, rel=1e-12)
    # Backward: the x gradient (52428800) and the w gradient 8*100*1*256*512 = 104857600.
    assert bench_limits.floor_s("seq_bwd", 100, 1, 256, 256, P, t_pass) == pytest.approx(
        100 * 13.8e-6 + 157_286_400 / 80e9, rel=1e-12)
    # The cells run one step whatever T is.
    assert bench_limits.floor_s("cell_fwd", 100, 1, 256, 256, P, t_pass) == pytest.approx(
        13.8e-6 + 524_288 / 80e9, rel=1e-12)
    assert bench_limits.floor_s("cell_bwd_full", 7, 2, 256, 256, P, t_pass) == pytest.approx(
        13.8e-6 + 8 * 2 * 256 * 768 / 80e9, rel=1e-12)
    assert bench_limits.floor_s("cell_bwd", 100, 1, 256, 256, P, t_pass) is None
    # A slow peak: T=3, B=2, I=128, H=256 at 1 GFLOP/s, a pass of 1 us; a step's FLOPs
    # 8*2*256*256 = 1048576 take 1048.576 us, more than the pass.
    assert bench_limits.floor_s("seq_fwd", 3, 2, 128, 256, 1.0, 1e-6) == pytest.approx(
        3 * 1048.576e-6 + 8 * 3 * 2 * 256 * 128 / 1e9, rel=1e-12)
    # The recurrent and the other FLOPs are all of the case's (the bench's count).
    assert 100 * 524_288 + 52_428_800 == harness.case_flops("seq_fwd", 100, 1, 256, 256)
    assert 100 * 524_288 + 157_286_400 == harness.case_flops("seq_bwd", 100, 1, 256, 256)


def test_each_row_is_set_against_its_limit():
    """case_limits: the peak fraction for every timed GEMM case, the floor up to B = 2, the
    floor's W_h streamed at its own H and dtype."""
    limits = {"status": "ok", "fma_peak_gflops": 50.0,
              "stream": [{"wh_bytes": 4 * 256 * 256 * 4, "pass_s": 4e-5},
                         {"wh_bytes": 4 * 256 * 256 * 2, "pass_s": 2e-5}]}
    small = bench_limits.case_limits(limits, "seq_fwd", (10, 1, 64, 256), 2, 3.0, 5.0)
    # float16 W_h: the second entry's pass (a step's FLOPs take 10.48576 us at the peak)
    floor = 10 * 2e-5 + 8 * 10 * 1 * 256 * 64 / 50e9
    assert small["floor_ms"] == pytest.approx(floor * 1e3, rel=1e-12)
    assert small["over_floor"] == pytest.approx(3.0 / (floor * 1e3), rel=1e-12)
    assert small["peak_fraction"] == pytest.approx(0.1)
    large = bench_limits.case_limits(limits, "seq_fwd", (10, 4, 64, 256), 4, 3.0, 20.0)
    assert large == {"peak_fraction": pytest.approx(0.4), "floor_ms": None, "over_floor": None}
    # no streaming measured at this H: no floor
    assert bench_limits.case_limits(limits, "seq_fwd", (10, 1, 64, 128), 4, 3.0,
                                    5.0)["floor_ms"] is None
    assert bench_limits.needed_wh_bytes([(10, 1, 64, 128), (10, 8, 64, 512)],
                                        ["seq_fwd", "cell_bwd"], 2) == [2**20, 4 * 128 * 128 * 2]
    assert bench_limits.needed_wh_bytes([(10, 1, 64, 128)], ["cell_bwd"], 4) == [2**20]


def test_bench_report_has_the_limits(tmp_path, monkeypatch):
    """lstm-tvm bench (lstm_tvm alone, a tiny shape at B = 1 and at B = 4): the JSON holds the
    limits and each row's distance from them, as recomputed from them; the table shows them
    within 100 columns; a report without limits (older, or no compiler) still renders."""
    if bench_limits.compiler() is None:
        pytest.skip("no C compiler on PATH")
    monkeypatch.setenv(bench_limits.SECONDS_ENV, str(SHORT))
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", "--shapes", "4x1x16x16,4x4x16x16", "--only", "lstm_tvm", "--cases",
        "seq_fwd", "--repeat", "1", "--warmup", "0", "--isolate", "impl",
        "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    limits = report["meta"]["limits"]
    assert limits["status"] == "ok" and limits["fma_peak_gflops"] > 0
    assert limits["seconds"] == SHORT and limits["threads"] == report["meta"]["threads"]
    assert [s["wh_bytes"] for s in limits["stream"]] == [2**20, 4 * 16 * 16 * 4]
    assert all(s["gbs_per_core"] > 0 for s in limits["stream"])
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= bench_report.WIDTH, max(lines, key=len)
    assert any(line.startswith("limits: ") for line in lines)
    assert f"FMA peak {limits['fma_peak_gflops']:.1f} GFLOP/s" in result.output
    if limits["threads"] > 1:
        assert (f"{limits['core_scaling']:.2f} of {limits['threads']}x one core alone "
                f"({limits['fma_one_core_gflops']:.1f})") in re.sub(r"\s+", " ", result.output)
    for r in report["results"]:
        assert r["status"] == "ok", r
        T, B, I, H = r["shape"]
        assert r["peak_fraction"] == pytest.approx(
            harness.case_flops(r["case"], T, B, I, H) / (r["median_ms"] * 1e6)
            / limits["fma_peak_gflops"], rel=1e-9)
        cells = next(line.split() for line in lines
                     if line.startswith(f"{T}x{B}x{I}x{H} ") and " ".join(line.split()[1:3])
                     == bench_report.SHORT_CASES[r["case"]])
        if B == 1:
            floor = bench_limits.floor_s(r["case"], T, B, I, H, limits["fma_peak_gflops"],
                                         limits["stream"][1]["pass_s"])
            assert r["floor_ms"] == pytest.approx(floor * 1e3, rel=1e-9)
            assert r["over_floor"] == pytest.approx(r["median_ms"] / r["floor_ms"], rel=1e-9)
            assert cells[6].endswith("x")
        else:
            assert r["floor_ms"] is None and r["over_floor"] is None
            assert cells[6] == f"{r['peak_fraction'] * 100:.0f}%"
    wide = bench_report.render(report, wide=True)
    assert "% peak" in wide and "x floor" in wide and "floor ms" in wide
    # no compiler: n/a; an older report without the limits renders as before
    report["meta"]["limits"] = {"status": "n/a", "error": "no C compiler"}
    assert "limits: n/a (no C compiler)" in bench_report.render(report)
    del report["meta"]["limits"]
    for r in report["results"]:
        for key in ("peak_fraction", "floor_ms", "over_floor"):
            del r[key]
    text = bench_report.render(report)
    assert not any(line.startswith("limits:") for line in text.splitlines())
    assert max(map(len, text.splitlines())) <= bench_report.WIDTH
    assert bench_report.render(report, wide=True)
