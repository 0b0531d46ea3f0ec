"""Train a small sequence model with lstm_tvm's forward and gradient kernels, and with TF.

The model: ``BlockLSTM`` (no peepholes, ``forget_bias=1``, no cell clip) over ``x`` `(T, B, I)`
from a zero state, then a linear head on every step's ``h``: ``pred = h @ wy + by`` `(T, B, O)`.
The task (synthetic, a new batch per step): reproduce the first ``O`` input features delayed
by ``delay`` steps, ``y[t] = x[t - delay, :, :O]`` (zero for ``t < delay``); MSE loss.
Trainable: ``w``, ``b``, ``wy``, ``by``; optimizer: Adam written in NumPy.

The same initial parameters, batches and optimizer are used by three runs that differ only in
how the loss and its gradients are computed:

- ``lstm_tvm`` (float32): ``lstm_tvm.autodiff.vjp("BlockLSTM", ...)`` runs the compiled
  ``BlockLSTM`` and ``BlockLSTMGrad`` kernels; the head and its gradient in NumPy.
- ``tf`` (float32): ``tf.raw_ops.BlockLSTM`` and the head in TensorFlow, gradients from
  ``tf.GradientTape`` (TF's registered gradient of ``BlockLSTM`` is correct).
- ``reference`` (float64): lstm_tvm's NumPy reference of ``BlockLSTM`` and ``BlockLSTMGrad``.

Run: ``python examples/train/train_lstm.py --steps 300 --out examples/train/`` (the figure in
the README). Writes ``loss.png`` (the loss curves), ``losses.csv`` (one row per step) and
``summary.json`` (the agreement figures and checks) into ``--out``, by default a new temporary
folder; prints each check (rule, value, threshold) and exits with status 1 if one fails (see
:func:`compare`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: The forward op and its attributes. ``cell_clip=0`` turns clipping off, so the gradient the
#: grad op computes (that of the unclipped cell, in lstm_tvm as in TF) is the exact one.
OP = "BlockLSTM"
ATTRS = {"forget_bias": 1.0, "cell_clip": 0.0, "use_peephole": False}
BACKENDS = ("lstm_tvm", "tf", "reference")


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes, task and optimizer settings of a run."""

    T: int = 20  # time steps
    B: int = 16  # batch
    I: int = 8  # input features
    H: int = 32  # LSTM cell size
    O: int = 2  # outputs: the first O input features, delayed
    delay: int = 3
    steps: int = 300
    lr: float = 1e-2
    seed: int = 0


def init_params(cfg: Config) -> dict[str, np.ndarray]:
    """Initial parameters (float32): ``w`` `(I+H, 4H)` and ``wy`` `(H, O)` uniform with
    variance ``1/(3 fan_in)``, biases zero (the forget gate gets ``forget_bias=1``)."""
    rng = np.random.default_rng([cfg.seed, 0])
    rw, ry = 1.0 / np.sqrt(cfg.I + cfg.H), 1.0 / np.sqrt(cfg.H)
    return {
        "w": rng.uniform(-rw, rw, (cfg.I + cfg.H, 4 * cfg.H)).astype(np.float32),
        "b": np.zeros(4 * cfg.H, np.float32),
        "wy": rng.uniform(-ry, ry, (cfg.H, cfg.O)).astype(np.float32),
        "by": np.zeros(cfg.O, np.float32),
    }


def make_batch(cfg: Config, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``step`` (the same for every run): ``x ~ U(-1, 1)`` `(T, B, I)` and the delayed
    copy ``y`` `(T, B, O)`, both float32."""
    rng = np.random.default_rng([cfg.seed, 1, step])
    x = rng.uniform(-1.0, 1.0, (cfg.T, cfg.B, cfg.I)).astype(np.float32)
    y = np.zeros((cfg.T, cfg.B, cfg.O), np.float32)
    y[cfg.delay:] = x[: cfg.T - cfg.delay, :, : cfg.O]
    return x, y


def _lstm_inputs(params, x):
    T, B, _ = x.shape
    H = params["w"].shape[1] // 4
    dt = params["w"].dtype
    zeros = np.zeros(H, dt)
    return {"seq_len_max": np.int64(T), "x": x.astype(dt), "cs_prev": np.zeros((B, H), dt),
            "h_prev": np.zeros((B, H), dt), "w": params["w"], "wci": zeros, "wcf": zeros,
            "wco": zeros, "b": params["b"]}


def _head(params, h, y, lstm_backward):
    """MSE of the linear head on ``h`` and the gradients of every parameter, given
    ``lstm_backward(dh) -> {"w": ..., "b": ...}``."""
    H, O = params["wy"].shape
    pred = h @ params["wy"] + params["by"]
    err = pred - y
    loss = float(np.mean(err.astype(np.float64) ** 2))
    dpred = (2.0 / err.size) * err
    grads = lstm_backward(dpred @ params["wy"].T)
    grads["wy"] = h.reshape(-1, H).T @ dpred.reshape(-1, O)
    grads["by"] = dpred.reshape(-1, O).sum(0)
    return loss, grads


def loss_and_grads_lstm_tvm(params, x, y):
    """Loss and gradients with lstm_tvm's compiled ``BlockLSTM``/``BlockLSTMGrad`` (float32)."""
    from lstm_tvm import autodiff

    outputs, backward = autodiff.vjp(OP, _lstm_inputs(params, x), ATTRS)

    def lstm_backward(dh):
        g = backward({"h": dh})
        return {"w": g["w"], "b": g["b"]}

    return _head(params, outputs.h, y, lstm_backward)


def loss_and_grads_reference(params, x, y):
    """Loss and gradients with lstm_tvm's float64 NumPy reference (``params`` in float64)."""
    from lstm_tvm import reference, registry

    grad_op = registry.get_op(OP).pair
    inputs = _lstm_inputs(params, x)
    outputs = reference.run(OP, inputs, ATTRS)

    def lstm_backward(dh):
        args = {**inputs, **outputs, "cs_grad": np.zeros_like(dh), "h_grad": dh}
        grad_attrs = {"use_peephole": ATTRS["use_peephole"]}
        g = reference.run(grad_op, args, grad_attrs)
        return {"w": g["w_grad"], "b": g["b_grad"]}

    return _head(params, outputs["h"], y, lstm_backward)


def loss_and_grads_tf(params, x, y):
    """Loss and gradients with ``tf.raw_ops.BlockLSTM`` and ``tf.GradientTape`` (float32)."""
    import tensorflow as tf

    H, O = params["wy"].shape
    with tf.device("/CPU:0"):
        p = {k: tf.constant(v) for k, v in params.items()}
        fixed = {k: tf.constant(v) for k, v in _lstm_inputs(params, x).items()
                 if k not in ("w", "b", "seq_len_max")}
        with tf.GradientTape() as tape:
            tape.watch(list(p.values()))
            out = tf.raw_ops.BlockLSTM(seq_len_max=tf.constant(x.shape[0], tf.int64),
                                       w=p["w"], b=p["b"], **fixed, **ATTRS)
            pred = tf.reshape(tf.reshape(out.h, (-1, H)) @ p["wy"], (*x.shape[:2], O))
            loss = tf.reduce_mean(tf.square(pred + p["by"] - y))
        grads = tape.gradient(loss, p)
    return float(loss), {k: np.asarray(v) for k, v in grads.items()}


LOSS_AND_GRADS = {"lstm_tvm": loss_and_grads_lstm_tvm, "tf": loss_and_grads_tf,
                  "reference": loss_and_grads_reference}


class Adam:
    """Adam (Kingma & Ba) in NumPy, in the parameters' dtype: ``m = b1 m + (1-b1) g``,
    ``v = b2 v + (1-b2) g^2``, ``p -= lr * m_hat / (sqrt(v_hat) + eps)``."""

    def __init__(self, params, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads):
        """Update ``params`` in place with ``grads`` (same keys, shapes and dtype)."""
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, p in params.items():
            g = grads[k].astype(p.dtype, copy=False)
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            p -= (self.lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)).astype(
                p.dtype)


def train(backend: str, cfg: Config, grad_noise: float = 0.0, noise_seed: int = 0
          ) -> np.ndarray:
    """Train from :func:`init_params` on :func:`make_batch` for ``cfg.steps`` steps; returns
    the loss of every step (before that step's update), float64. ``backend`` is one of
    :data:`BACKENDS` (``reference`` trains in float64). ``grad_noise > 0`` multiplies every
    gradient element by ``1 + grad_noise * N(0, 1)`` (seeded by ``noise_seed``) before the
    update: a stand-in for the rounding errors of a float32 gradient."""
    loss_and_grads = LOSS_AND_GRADS[backend]
    params = init_params(cfg)
    if backend == "reference":
        params = {k: v.astype(np.float64) for k, v in params.items()}
    opt = Adam(params, lr=cfg.lr)
    noise = np.random.default_rng([cfg.seed, 2, noise_seed])
    losses = np.zeros(cfg.steps)
    for step in range(cfg.steps):
        x, y = make_batch(cfg, step)
        losses[step], grads = loss_and_grads(params, x, y)
        if grad_noise:
            grads = {k: g * (1 + grad_noise * noise.standard_normal(g.shape))
                     for k, g in grads.items()}
        opt.step(params, grads)
    return losses


#: How close lstm_tvm's loss curve must be to TF's (relative difference per step,
#: ``|lstm_tvm - tf| / tf``).
#:
#: Step 0: both start from the same parameters, so the losses differ only by the float32
#: rounding of one forward pass: at most the float32 tolerance of ``lstm_tvm.testing`` (1e-5;
#: measured ~1e-7).
#:
#: Later steps: the runs differ by the rounding of every gradient. At the same parameters,
#: lstm_tvm's and TF's float32 gradients are both within ~1e-6 (max |error| / max |gradient|;
#: measured 2e-7 to 8e-7) of the float64 reference, and the training dynamics amplify such
#: differences (by a factor of ~30 to ~170 over 300 steps of the default run, varying with the
#: noise pattern). That amplification is measured in every run by a probe: the float64
#: reference trained ``PROBES`` times with gradients perturbed by ``PROBE_NOISE`` relative
#: noise, the largest relative difference of each probe's curve from the unperturbed float64
#: curve taken as the float32 noise scale. lstm_tvm vs TF is the difference of two noisy runs
#: (up to twice the drift of one) and the probes sample only a few noise patterns (their
#: drifts spread over ~5x), so the bound is ``PROBE_FACTOR`` times the largest probe drift.
#: A wrong gradient (such as TF's for BlockLSTMV2) gives differences of order 1.
STEP0_REL_DIFF = 1e-5
PROBE_NOISE = 1e-6
PROBES = 8
PROBE_FACTOR = 4.0
#: The training must work (agreement of two curves that never moved would prove little): the
#: mean loss of the last 10% of steps at most this fraction of the mean of the first 10 steps.
MIN_LOSS_RATIO = 0.5
#: ... judged from this many steps on. The default task's loss first plateaus, then falls: the
#: ratio is 0.68 after 50 steps, 0.46 after 70, 0.085 after 100 (seeds 0 to 2) and 0.006 after
#: 300. A shorter run says nothing about whether training works, so the rule is not applied.
MIN_STEPS_FOR_LOSS_RULE = 100


def probe_drift(cfg: Config, reference_losses: np.ndarray | None = None) -> np.ndarray:
    """Per-step relative drift of the float64 reference's loss curve caused by
    ``PROBE_NOISE`` gradient noise: the largest over ``PROBES`` noise patterns."""
    ref = train("reference", cfg) if reference_losses is None else reference_losses
    drift = [np.abs(train("reference", cfg, PROBE_NOISE, k) - ref) / ref for k in range(PROBES)]
    return np.max(drift, axis=0)


def compare(curves: dict[str, np.ndarray], drift: np.ndarray) -> dict:
    """Agreement of the ``lstm_tvm`` and ``tf`` loss curves (``reference`` optional) given the
    :func:`probe_drift`, the :func:`checks` judged on them and whether none failed (``"ok"``)."""
    tvm_, tf_ = curves["lstm_tvm"], curves["tf"]
    rel = np.abs(tvm_ - tf_) / np.abs(tf_)
    tail = max(1, len(tf_) // 10)
    ratio = float(np.mean(tvm_[-tail:]) / np.mean(tvm_[: min(10, len(tvm_))]))
    bound = max(PROBE_FACTOR * float(drift.max()), STEP0_REL_DIFF)
    summary = {
        "steps": len(tf_),
        "rel_diff_step0": float(rel[0]),
        "rel_diff_max": float(rel.max()),
        "rel_diff_max_step": int(rel.argmax()),
        "rel_diff_median": float(np.median(rel)),
        "probe_drift_max": float(drift.max()),
        "rel_diff_bound": bound,
        "loss_first": float(tvm_[0]),
        "loss_last": float(tvm_[-1]),
        "loss_ratio_last10pct_first10": ratio,
    }
    if "reference" in curves:
        ref = curves["reference"]
        summary["rel_diff_tf_vs_float64_max"] = float(np.max(np.abs(tf_ - ref) / ref))
        summary["rel_diff_lstm_tvm_vs_float64_max"] = float(np.max(np.abs(tvm_ - ref) / ref))
    summary["checks"] = checks(summary)
    summary["ok"] = all(c["passed"] is not False for c in summary["checks"])
    return summary


def _check(rule: str, value: float, threshold: float, applies: bool = True,
           note: str = "") -> dict:
    """One ``value <= threshold`` rule; ``passed`` is None when the rule does not apply."""
    return {"rule": rule, "value": value, "threshold": threshold,
            "passed": bool(value <= threshold) if applies else None, "note": note}


def checks(summary: dict) -> list[dict]:
    """The rules :func:`compare` judges a run by, each with its value and threshold."""
    steps = summary["steps"]
    return [
        _check("|lstm_tvm - TF| / TF at step 0", summary["rel_diff_step0"], STEP0_REL_DIFF,
               note="float32 rounding of one forward pass"),
        _check("max over steps of |lstm_tvm - TF| / TF", summary["rel_diff_max"],
               summary["rel_diff_bound"],
               note=f"bound: max({PROBE_FACTOR:g} x probe drift {summary['probe_drift_max']:.2e}, "
                    f"{STEP0_REL_DIFF:g})"),
        _check("lstm_tvm loss: mean of last 10% of steps / mean of first 10",
               summary["loss_ratio_last10pct_first10"], MIN_LOSS_RATIO,
               applies=steps >= MIN_STEPS_FOR_LOSS_RULE,
               note=f"applies from {MIN_STEPS_FOR_LOSS_RULE} steps; this run has {steps}"),
    ]


def format_checks(summary: dict) -> str:
    """One line per check: PASS, FAIL or SKIP (not applied), the value, the threshold, a note."""
    marks = {True: "PASS", False: "FAIL", None: "SKIP"}
    lines = [f"checks (exit status 1 if any FAILs; {summary['steps']} steps):"]
    for c in summary["checks"]:
        lines.append(f"  {marks[c['passed']]}  {c['rule']} = {c['value']:.3g} "
                     f"(threshold <= {c['threshold']:.3g}; {c['note']})")
    lines.append("result: " + ("PASS" if summary["ok"] else "FAIL: " + "; ".join(
        c["rule"] for c in summary["checks"] if c["passed"] is False)))
    return "\n".join(lines)


def plot(curves: dict[str, np.ndarray], drift: np.ndarray, bound: float, path: Path,
         cfg: Config) -> None:
    """The loss curves (log scale) over their relative differences and the probe's drift."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(len(curves["tf"]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    styles = {"lstm_tvm": ("lstm_tvm: BlockLSTM + BlockLSTMGrad kernels (float32)", "-", 3.0),
              "tf": ("TensorFlow: tf.raw_ops.BlockLSTM + GradientTape (float32)", "--", 1.5),
              "reference": ("NumPy float64 reference", ":", 1.5)}
    for name, losses in curves.items():
        label, ls, lw = styles[name]
        top.plot(steps, losses, ls, lw=lw, label=label)
    top.set_yscale("log")
    top.set_ylabel("MSE loss")
    top.set_title(f"BlockLSTM T={cfg.T} B={cfg.B} I={cfg.I} H={cfg.H} + linear head, "
                  f"delayed copy (delay {cfg.delay}), Adam lr={cfg.lr}", fontsize=10)
    top.legend(fontsize=8)
    top.grid(alpha=0.3)

    def floor(a):
        return np.maximum(a, 1e-10)

    rel = np.abs(curves["lstm_tvm"] - curves["tf"]) / curves["tf"]
    bottom.semilogy(steps, floor(rel), lw=1.2, label="|lstm_tvm - TF| / TF")
    if "reference" in curves:
        ref = curves["reference"]
        bottom.semilogy(steps, floor(np.abs(curves["tf"] - ref) / ref), lw=0.8, alpha=0.7,
                        label="|TF - float64| / float64")
    bottom.fill_between(steps, 1e-10, floor(drift), color="0.6", alpha=0.4,
                        label=f"float64 with {PROBE_NOISE:g} gradient noise (max of {PROBES})")
    bottom.axhline(bound, color="r", lw=1, ls="--", label="bound")
    bottom.set_ylim(1e-9, max(1e-2, 3 * bound))
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative difference")
    bottom.legend(fontsize=8, loc="lower right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """Command line: train with each backend, write the plot, CSV and summary, print it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--lr", type=float, default=Config.lr)
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--out", type=Path,
                        help="folder for loss.png, losses.csv, summary.json (default: a new "
                             "temporary folder; `--out examples/train` regenerates the README's)")
    args = parser.parse_args(argv)
    cfg = Config(steps=args.steps, lr=args.lr, seed=args.seed)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="train_lstm-"))
    out.mkdir(parents=True, exist_ok=True)

    curves = {}
    for backend in BACKENDS:
        start = time.perf_counter()
        curves[backend] = train(backend, cfg)
        print(f"{backend:>9}: {cfg.steps} steps in {time.perf_counter() - start:.1f} s, "
              f"loss {curves[backend][0]:.4f} -> {curves[backend][-1]:.4f}")
    drift = probe_drift(cfg, curves["reference"])
    summary = {"config": dataclasses.asdict(cfg), **compare(curves, drift)}

    written = write_outputs(out, cfg, curves, drift, summary)
    print(json.dumps(summary, indent=2))
    print("wrote " + ", ".join(map(str, written)))
    print(format_checks(summary))
    return 0 if summary["ok"] else 1


def write_outputs(out: Path, cfg: Config, curves: dict[str, np.ndarray], drift: np.ndarray,
                  summary: dict) -> list[Path]:
    """Write ``losses.csv``, ``summary.json`` and (with matplotlib) ``loss.png`` into ``out``;
    returns the paths written."""
    with open(out / "losses.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *curves, "probe_drift"])
        for step in range(cfg.steps):
            writer.writerow([step, *(repr(float(c[step])) for c in curves.values()),
                             repr(float(drift[step]))])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    written = [out / "losses.csv", out / "summary.json"]
    try:
        plot(curves, drift, summary["rel_diff_bound"], out / "loss.png", cfg)
    except ImportError as exc:  # matplotlib, from the examples extra
        print(f"loss.png not written: {exc} (pip install -e '.[examples]')")
        return written
    return [out / "loss.png", *written]


if __name__ == "__main__":
    sys.exit(main())
