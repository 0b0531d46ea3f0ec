"""The training example (examples/train/train_lstm.py), shortened: lstm_tvm's loss curve
against TensorFlow's (same model, initial parameters, batches and NumPy Adam), within the
example's own bound (:func:`compare`: float32 rounding at step 0, then a multiple of the drift
that float32-sized gradient noise causes in the float64 reference run), and the loss falls."""

import importlib.util
import sys
import tempfile
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


def _reference_backends(example, monkeypatch, lstm_tvm=None):
    """Every backend computed by the float64 reference's function (no TF, no compiling: fast);
    ``lstm_tvm``, when given, replaces the lstm_tvm backend's."""
    real = example.LOSS_AND_GRADS["reference"]
    monkeypatch.setitem(example.LOSS_AND_GRADS, "tf", real)
    monkeypatch.setitem(example.LOSS_AND_GRADS, "lstm_tvm", lstm_tvm or real)


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())
            if p.is_file()}


def test_default_out_leaves_the_tracked_files_alone(example, monkeypatch, tmp_path, capsys):
    """Without --out the script writes into a new temporary folder, never over the tracked
    loss.png, losses.csv and summary.json next to it (restored here if it ever does)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _reference_backends(example, monkeypatch)
    monkeypatch.setattr(example, "plot", lambda *args: args[3].write_bytes(b"png"))
    before = _snapshot(EXAMPLE.parent)
    try:
        status = example.main(["--steps", "3"])
        assert _snapshot(EXAMPLE.parent) == before, "the tracked files were overwritten"
        assert status == 0, capsys.readouterr().out
    finally:
        for name, (_, data) in before.items():
            if (EXAMPLE.parent / name).read_bytes() != data:
                (EXAMPLE.parent / name).write_bytes(data)
    (out,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert {p.name for p in out.iterdir()} == {"loss.png", "losses.csv", "summary.json"}
    assert f"wrote {out / 'loss.png'}, {out / 'losses.csv'}" in capsys.readouterr().out


def test_checks_are_printed_and_a_failed_one_is_named(example, monkeypatch, tmp_path, capsys):
    """Every rule is printed with its value and threshold; a run whose gradients are wrong
    fails the agreement rule by name, and the loss rule is not applied to a short run."""
    real = example.LOSS_AND_GRADS["reference"]

    def swapped(params, x, y):
        loss, grads = real(params, x, y)
        i, c, f, o = np.split(grads["b"], 4)
        return loss, {**grads, "b": np.concatenate([i, f, c, o])}

    _reference_backends(example, monkeypatch, lstm_tvm=swapped)
    assert example.main(["--steps", "5", "--out", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    rules = lines[lines.index("checks (exit status 1 if any FAILs; 5 steps):") + 1:]
    assert rules[0].startswith("  PASS  |lstm_tvm - TF| / TF at step 0 = ")
    assert rules[1].startswith("  FAIL  max over steps of |lstm_tvm - TF| / TF = ")
    assert "threshold <= 1e-05" in rules[1]
    assert rules[2].startswith("  SKIP  lstm_tvm loss: mean of last 10% of steps")
    assert f"applies from {example.MIN_STEPS_FOR_LOSS_RULE} steps; this run has 5" in rules[2]
    assert rules[3] == "result: FAIL: max over steps of |lstm_tvm - TF| / TF"


@pytest.mark.parametrize("steps", [20, 200])
def test_loss_rule_applies_from_min_steps(example, steps):
    """Two identical flat curves agree; their loss never falls, which fails the run only when
    it is long enough for the loss rule (MIN_STEPS_FOR_LOSS_RULE) to apply."""
    flat = np.full(steps, 0.3)
    summary = example.compare({"lstm_tvm": flat, "tf": flat}, np.zeros(steps))
    applies = steps >= example.MIN_STEPS_FOR_LOSS_RULE
    assert summary["ok"] is not applies, summary
    assert summary["checks"][-1]["passed"] is (False if applies else None), summary
