"""Shared fixtures: a private compile cache and user records root for the test session, and the
CPU targets tests parametrize over."""

import os
import tempfile

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
    # Tests never read or write the user's cache: a fresh one per session.
    if "LSTM_TVM_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_CACHE_DIR"] = tempfile.mkdtemp(prefix="lstm_tvm_test_cache_")
    # Nor the user's tuning records: an empty user root (the shipped records still apply).
    if "LSTM_TVM_SCHEDULES_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_SCHEDULES_DIR"] = tempfile.mkdtemp(prefix="lstm_tvm_test_schedules_")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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
