"""The training example (examples/train/train_lstm.py), shortened: lstm_tvm's loss curve
against TensorFlow's (same model, initial parameters, batches and NumPy Adam), within the
example's own bound (:func:`compare`: float32 rounding at step 0, then a multiple of the drift
that float32-sized gradient noise causes in the float64 reference run), and the loss falls."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train" / "train_lstm.py"
#: Smaller than the example's default (T=20, B=16, I=8, H=32, delay 3, 300 steps, lr 1e-2) and
#: an easier task (delay 2) with a larger step, so the loss falls within 60 steps.
SIZES = {"T": 10, "B": 8, "I": 4, "H": 16, "delay": 2, "steps": 60, "lr": 5e-2}


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_lstm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_lstm_tvm_and_tf_train_the_same(example, tf):
    cfg = example.Config(**SIZES)
    curves = {backend: example.train(backend, cfg) for backend in example.BACKENDS}
    drift = example.probe_drift(cfg, curves["reference"])
    summary = example.compare(curves, drift)
    assert summary["rel_diff_step0"] <= example.STEP0_REL_DIFF, summary
    assert summary["rel_diff_max"] <= summary["rel_diff_bound"], summary
    assert summary["loss_ratio_last10pct_first10"] <= example.MIN_LOSS_RATIO, summary
    assert summary["ok"], summary
    # the bound is tight enough to matter: far below the O(1) effect of a wrong gradient
    assert summary["rel_diff_bound"] <= 1e-3, summary


def test_wrong_gradients_fail_the_comparison(example, monkeypatch):
    """A positive control: a run whose ``b`` gradient has its c and f blocks swapped (gates
    read in the wrong layout: TF's BlockLSTMV2 tape bug in miniature) still trains, but fails
    the comparison by a wide margin."""
    cfg = example.Config(**SIZES)
    good = example.train("reference", cfg)
    drift = example.probe_drift(cfg, good)
    real = example.LOSS_AND_GRADS["reference"]

    def swapped(params, x, y):
        loss, grads = real(params, x, y)
        i, c, f, o = np.split(grads["b"], 4)
        return loss, {**grads, "b": np.concatenate([i, f, c, o])}

    monkeypatch.setitem(example.LOSS_AND_GRADS, "reference", swapped)
    bad = example.train("reference", cfg)
    summary = example.compare({"lstm_tvm": bad, "tf": good}, drift)
    assert summary["loss_ratio_last10pct_first10"] <= example.MIN_LOSS_RATIO, summary
    assert not summary["ok"] and summary["rel_diff_max"] > 10 * summary["rel_diff_bound"], summary
