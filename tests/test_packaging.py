"""The distributions carry the package's data: the tuning records and the native ORT source.

Builds the sdist of this checkout and the wheel from that sdist, as ``python -m build`` does
for a release (the installed wheel itself is checked by .ci/run's second stage,
.ci/check_installed.py).
"""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from lstm_tvm import env
from lstm_tvm.onnx import native

REPO = Path(__file__).resolve().parents[1]


def _records() -> dict[str, bytes]:
    root = REPO / "schedules"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.json")}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The folder holding the sdist and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> zipfile.ZipFile:
    (path,) = dist.glob("lstm_tvm-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_ships_the_tuning_records_inside_the_package(wheel):
    records = _records()
    assert records
    prefix = env.PACKAGED_SCHEDULES.relative_to(env.PACKAGE_DIR.parent).as_posix()
    for rel, data in records.items():
        assert wheel.read(f"{prefix}/{rel}") == data, rel
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert top == {"lstm_tvm", next(t for t in top if t.endswith(".dist-info"))}, top


def test_the_wheel_ships_the_native_ort_source(wheel):
    rel = native.SOURCE.relative_to(env.PACKAGE_DIR.parent).as_posix()
    assert wheel.read(rel) == native.SOURCE.read_bytes()


def test_the_sdist_holds_the_records_at_the_top(dist):
    (path,) = dist.glob("lstm_tvm-*.tar.gz")
    with tarfile.open(path) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        for rel, data in _records().items():
            assert tar.extractfile(names[f"schedules/{rel}"]).read() == data, rel
        assert "pyproject.toml" in names and "lstm_tvm/onnx/lstm_tvm_ort_ops.cc" in names
