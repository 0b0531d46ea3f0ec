"""Shared fixtures: a private compile cache and user records root for the test session, and the
target list."""

import os
import tempfile

import pytest


def pytest_configure(config):
    # Tests never read or write the user's cache: a fresh one per session.
    if "LSTM_TVM_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_CACHE_DIR"] = tempfile.mkdtemp(prefix="lstm_tvm_test_cache_")
    # Nor the user's tuning records: an empty user root (the shipped records still apply).
    if "LSTM_TVM_SCHEDULES_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["LSTM_TVM_SCHEDULES_DIR"] = tempfile.mkdtemp(prefix="lstm_tvm_test_schedules_")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def tf():
    """TensorFlow (the oracle); tests that need it skip when it is not installed."""
    return pytest.importorskip("tensorflow")
