"""Shared fixtures: a private compile cache and user records root for the test session, and the
CPU targets tests parametrize over."""

import os
import shutil
import tempfile

import psutil
import pytest

#: The CPU targets tests parametrize over, by test id: this host's CPU, and named CPUs of each
#: vector extension the schedules know (AVX-512: Intel and AMD Zen 4; AVX2; AArch64 NEON), checked
#: whatever this host is.
CPU_TARGETS = {"host": "llvm",
               "skylake-avx512": {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 4},
               "znver4": {"kind": "llvm", "mcpu": "znver4"},
               "haswell": {"kind": "llvm", "mcpu": "haswell"},
               "neon": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}}


def pytest_configure(config):
    # Under pytest-xdist the controller configures first and starts the workers with its
    # environment: they share its folders (the cache locks each entry while it builds it), so a
    # kernel, the native custom-op library or a fetched runtime is built once per run.
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    # Tests never read or write the user's cache: a fresh one per run.
    if "LSTM_TVM_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_CACHE_DIR"] = _session_folder("lstm_tvm_test_cache_")
    # Nor the user's tuning records: an empty user root (the shipped records still apply).
    if "LSTM_TVM_SCHEDULES_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_SCHEDULES_DIR"] = _session_folder("lstm_tvm_test_schedules_")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


#: The folders :func:`pytest_configure` made (removed when the run ends).
_SESSION_FOLDERS: list[str] = []


def _session_folder(prefix: str) -> str:
    folder = tempfile.mkdtemp(prefix=prefix)
    _SESSION_FOLDERS.append(folder)
    return folder


def pytest_unconfigure(config):
    # The run's cache holds tens of MB of kernels: each run would leave its own behind.
    for folder in _SESSION_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
    _SESSION_FOLDERS.clear()


#: Memory a test worker may take (TensorFlow, ONNX Runtime and TVM loaded, a tuning test's
#: child processes): ``-n auto`` starts no more workers than fit the available memory.
WORKER_MEMORY = 3 * 2**30
MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto`` (pyproject's addopts): one per CPU this process may use, at most
    one per :data:`WORKER_MEMORY` of available memory and :data:`MAX_WORKERS`. A file's tests run
    in one worker (``--dist loadfile``), so the kernels they share compile once."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = psutil.virtual_memory().available // WORKER_MEMORY
    return max(1, min(cpus or 1, memory, MAX_WORKERS))


@pytest.hookimpl(trylast=True)  # after the parametrize marks: the target's id comes last
def pytest_generate_tests(metafunc):
    """A test taking ``cpu_target`` runs on each of :data:`CPU_TARGETS`, as ``lstm_tvm`` takes a
    target (a name or a dict)."""
    if "cpu_target" in metafunc.fixturenames:
        metafunc.parametrize("cpu_target", list(CPU_TARGETS.values()), ids=list(CPU_TARGETS))


@pytest.fixture(scope="session")
def tf():
    """TensorFlow (the oracle); tests that need it skip when it is not installed."""
    return pytest.importorskip("tensorflow")
