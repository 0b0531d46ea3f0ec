"""Checks an installed (non-editable) lstm-tvm as a user meets it, from outside the checkout.

Usage: python check_installed.py REPO [--count-file PATH]

Run by .ci/run in a fresh environment holding only the wheel and its core dependencies. Each
check prints ``ok`` or ``FAIL`` and a line of what it saw; the last line counts them. Exits 1
if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import traceback
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
CHECKS = []


def check(func):
    CHECKS.append(func)
    return func


def _cli(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
    """``lstm-tvm ARGS`` through the installed console script, with no ``LSTM_TVM_*`` variable
    but those of ``env`` (a user's defaults)."""
    exe = Path(sys.executable).with_name("lstm-tvm")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LSTM_TVM_")}
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                          env={**environ, **(env or {})}, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"lstm-tvm {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def _site_files() -> set[str]:
    return {str(p.relative_to(SITE)) for p in SITE.rglob("*")
            if "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


@check
def dependencies_are_complete_and_cpu_only(repo: Path) -> str:
    from importlib import metadata

    import cloudpickle  # noqa: F401  (MetaSchedule pickles tasks with it)
    import xgboost  # noqa: F401  (MetaSchedule's default cost model)

    names = sorted(d.metadata["Name"] for d in metadata.distributions())
    gpu_only = [n for n in names if n.lower().startswith("nvidia-")]
    assert not gpu_only, f"GPU-only packages installed: {gpu_only}"
    return f"{len(names)} distributions, no nvidia-* package"


@check
def imported_from_site_packages(repo: Path) -> str:
    import lstm_tvm

    where = Path(lstm_tvm.__file__).resolve()
    assert SITE in where.parents, f"lstm_tvm imported from {where}, not {SITE}"
    assert repo.resolve() not in where.parents, f"lstm_tvm imported from the checkout {where}"
    return str(where.parent)


@check
def shipped_records_are_package_data(repo: Path) -> str:
    from lstm_tvm import env

    shipped = env.shipped_schedules_dir()
    assert shipped == env.PACKAGED_SCHEDULES, f"shipped records at {shipped}"
    files = sorted(p.relative_to(repo / "schedules") for p in (repo / "schedules").rglob("*.json"))
    assert files, f"no records under {repo / 'schedules'}"
    for rel in files:
        got = shipped / rel
        assert got.is_file(), f"{rel} is not in the installed package"
        assert got.read_bytes() == (repo / "schedules" / rel).read_bytes(), f"{rel} differs"
    return f"{len(files)} files in {shipped}, identical to the repository's"


@check
def shipped_records_are_used_for_their_key(repo: Path) -> str:
    from lstm_tvm import build, env
    from lstm_tvm.targets import resolve_target
    from lstm_tvm.tuning import database

    seen = []
    for folder in sorted(p for p in env.shipped_schedules_dir().iterdir() if p.is_dir()):
        with open(folder / database.RECORD_FILE, encoding="utf-8") as f:
            target = json.loads(f.readline())[1][2]
        if target["kind"] != "llvm":
            continue
        resolved = resolve_target(target)
        own = [s for s in database.sources(resolved) if not s.borrowed]
        assert [(s.origin, s.key) for s in own] == [("shipped", folder.name)], \
            f"{folder.name}: own sources {own}"
        spec = build.make_spec("BlockLSTMGrad", "float32", 256, 256, {"use_peephole": False},
                               target=resolved)
        assert spec.tuned, f"{folder.name}: no record applied to BlockLSTMGrad at I=H=256"
        seen.append(f"{folder.name}: {len(spec.tuned)} blocks of BlockLSTMGrad 256x256")
    assert seen, "no CPU records shipped"
    return "; ".join(seen)


@check
def schedules_command_names_the_records(repo: Path) -> str:
    from lstm_tvm import env

    out = _cli("schedules").stdout
    assert "uses:" in out and str(env.shipped_schedules_dir()) in out, out
    return out.strip().splitlines()[-1]


@check
def main_job_builds_and_verifies(repo: Path) -> str:
    out = _cli("build", "--ops", "LSTMBlockCell,BlockLSTMGradV2", "--repeat", "3").stdout
    return out.strip().splitlines()[-1]


@check
def tune_writes_user_records_outside_site_packages(repo: Path) -> str:
    before = _site_files()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"XDG_DATA_HOME": str(Path(tmp) / "data"), "LSTM_TVM_CACHE_DIR": str(Path(tmp) / "c")}
        _cli("tune", "--ops", "LSTMBlockCell", "--shapes", "1x5x8x16", "--trials", "2",
             "--seed", "1", env=env)
        records = list((Path(tmp) / "data").rglob("database_tuning_record.json"))
        assert len(records) == 1, f"records written: {records}"
        times = [min(json.loads(line)[1][1]) for line in records[0].read_text().splitlines()]
        assert times and max(times) < 1.0, f"record times {times}"
        uses = _cli("schedules", env=env).stdout.strip().splitlines()[-1]
        assert "user records in " + str(records[0].parent) in uses, uses
    added = _site_files() - before
    assert not added, f"files added to site-packages: {sorted(added)[:10]}"
    return f"{len(times)} records in <user data>/{records[0].parent.relative_to(Path(tmp))}"


@check
def native_ort_route_builds_from_its_shipped_source(repo: Path) -> str:
    from lstm_tvm.onnx import native

    assert SITE in native.SOURCE.resolve().parents, f"source at {native.SOURCE}"
    assert native.SOURCE.is_file(), f"{native.SOURCE} missing"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lib = native.build_library(Path(tmp) / "liblstm_tvm_ort.so")
        except FileNotFoundError as err:  # no compiler or headers on this machine
            return f"source {native.SOURCE} found; library not built: {err}"
        return f"built {lib.name} ({lib.stat().st_size} bytes) from {native.SOURCE}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--count-file", type=Path)
    args = parser.parse_args()
    failed = 0
    for func in CHECKS:
        try:
            print(f"ok   {func.__name__}: {func(args.repo)}", flush=True)
        except Exception:  # noqa: BLE001 (every check reports)
            failed += 1
            print(f"FAIL {func.__name__}:\n{traceback.format_exc()}", flush=True)
    print(f"installed: {len(CHECKS) - failed} passed, {failed} failed")
    if args.count_file:
        args.count_file.write_text(str(len(CHECKS)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
