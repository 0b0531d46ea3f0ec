"""Non-finite, huge and denormal values: propagated as TF 2.21 propagates them, in bounded time.

- NaN and +-Inf in any one input of any op (float32) give NaN and Inf at the same positions as
  TF (``np.isnan``/``np.isinf`` masks, on the parts TF defines), in the forward ops with the clip
  off and in every grad op (they do not clip). An element of ``x`` in a padded step
  (``t >= seq_len_max``) is ignored, as in TF.
- With an active ``cell_clip`` TF's clip (Eigen ``scalar_clip_op`` with NaN-propagating
  ``max``/``min``) keeps a NaN cell state NaN; lstm_tvm's clip is a compare-and-select that does
  the same (a plain TIR ``max(min(cs, clip), -clip)`` would turn NaN into ``+cell_clip``):
  :func:`test_nan_cell_state_through_an_active_clip_stays_nan`.
- ``1e30``/``-1e30`` in ``x`` and ``w`` (and both) and denormals (``1e-40``) neither raise nor
  hang and agree with TF wherever TF's output is finite.
- A positive ``cell_clip`` that rounds to 0 in float32 (``1e-50``) turns clipping off, as in TF.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import registry, testing

I, H, B, T = 3, 5, 3, 4  # noqa: E741 - I, H as in test_ops (cached); B, T > 1: mixed rows
OPS = registry.OPS
FORWARD = [n for n, op in OPS.items() if op.direction == "forward"]
BACKWARD = [n for n, op in OPS.items() if op.direction == "backward"]
#: Seconds one small call may take: a hang or a pathological slow path fails, noise does not.
TIME_LIMIT = 20.0


def _inputs(op_name, *, peephole, seed=0, seq_len_max=None, attrs=None):
    op = OPS[op_name]
    attrs = {"use_peephole": peephole, **(attrs or {})}
    return testing.make_inputs(op_name, B=B, I=I, H=H, T=T if op.kind == "sequence" else None,
                               seq_len_max=seq_len_max, attrs=attrs, seed=seed)


def _run_both(op_name, inputs, attrs):
    start = time.perf_counter()
    ours = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_LIMIT, f"{op_name} took {elapsed:.1f} s"
    return ours._asdict(), testing.tf_run(op_name, inputs, attrs)


def _defined(op_name, name, inputs, shape):
    op = OPS[op_name]
    mask = testing.tf_defined_mask(op_name, name, inputs.get("seq_len_max"),
                                   T if op.kind == "sequence" else None)
    return np.broadcast_to(mask, shape)


def _assert_same_nonfinite(op_name, inputs, ours, theirs, where=""):
    for name, value in ours.items():
        defined = _defined(op_name, name, inputs, value.shape)
        for what, test in (("NaN", np.isnan), ("Inf", np.isinf)):
            a, b = test(value) & defined, test(theirs[name]) & defined
            if not np.array_equal(a, b):
                diff = np.argwhere(a != b)[:5].tolist()
                raise AssertionError(
                    f"{op_name}.{name}{where}: {what} at {int(a.sum())} positions, TF at "
                    f"{int(b.sum())}; first differing indices {diff}")


def _inject(inputs, name, value, positions):
    arr = inputs[name].copy()
    for p in positions:
        arr.flat[p % arr.size] = value
    return {**inputs, name: arr}


def _positions(op_name, name, inputs):
    """One element near the start; in ``x`` of a sequence op also one in a padded step."""
    arr = inputs[name]
    if OPS[op_name].kind == "sequence" and name == "x":
        n = int(inputs["seq_len_max"])
        return [1, n * B * I + 2] if n < T else [1]
    return [1, arr.size // 2 + 1]


_NONFINITE = [np.nan, np.inf, -np.inf]


def _float_names(op_name):
    return [t.name for t in OPS[op_name].inputs if t.dtype == "T"]


def _nonfinite_like_tf(op_name, value, case):
    """Put ``value`` into each float input of ``op_name`` in turn, with and without peepholes
    (``case(peephole)`` gives the inputs and attributes), and compare the non-finite outputs
    with TF's; the injections must make some output non-finite."""
    checked = 0
    for name in _float_names(op_name):
        for peephole in (False, True):
            inputs, attrs = case(peephole)
            inputs = _inject(inputs, name, value, _positions(op_name, name, inputs))
            ours, theirs = _run_both(op_name, inputs, attrs)
            _assert_same_nonfinite(op_name, inputs, ours, theirs, f" ({name}={value}, "
                                   f"peephole={peephole})")
            checked += sum(int((~np.isfinite(v)).sum()) for v in theirs.values())
    assert checked > 0, "no non-finite output at all: the injection did nothing"


@pytest.mark.parametrize("value", _NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op_name", FORWARD)
def test_forward_nonfinite_like_tf_without_clip(tf, op_name, value):
    def case(peephole):
        attrs = {"use_peephole": peephole, "cell_clip": 0.0}
        return _inputs(op_name, peephole=peephole, seq_len_max=T - 1, attrs=attrs), attrs

    _nonfinite_like_tf(op_name, value, case)


@pytest.mark.parametrize("value", _NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op_name", BACKWARD)
def test_grad_nonfinite_like_tf(tf, op_name, value):
    def case(peephole):
        return _inputs(op_name, peephole=peephole, seed=1,
                       seq_len_max=T - 1 if OPS[op_name].kind == "sequence" else None), \
            {"use_peephole": peephole}

    _nonfinite_like_tf(op_name, value, case)


def _clean_rows(op_name, theirs):
    """Batch rows whose cell state TF keeps free of NaN (the clip cannot differ there)."""
    cs = theirs["cs"]
    axes = (0, 2) if OPS[op_name].kind == "sequence" else (1,)
    return ~np.isnan(cs).any(axis=axes)


@pytest.mark.parametrize("value", _NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op_name", FORWARD)
def test_forward_nonfinite_with_active_clip_agrees_on_rows_tf_keeps_finite(tf, op_name, value):
    """With the clip on, NaN handling differs only in batch rows where TF's ``cs`` is NaN."""
    rows_compared = 0
    for name in _float_names(op_name):
        attrs = {"use_peephole": True, "cell_clip": 0.5}
        inputs = _inputs(op_name, peephole=True, seq_len_max=T - 1, attrs=attrs)
        inputs = _inject(inputs, name, value, [1])
        ours, theirs = _run_both(op_name, inputs, attrs)
        rows = _clean_rows(op_name, theirs)
        rows_compared += int(rows.sum())
        batch_axis = 1 if OPS[op_name].kind == "sequence" else 0
        pick = {k: np.take(v, np.flatnonzero(rows), axis=batch_axis) for k, v in ours.items()}
        tf_pick = {k: np.take(v, np.flatnonzero(rows), axis=batch_axis)
                   for k, v in theirs.items()}
        _assert_same_nonfinite(op_name, inputs, pick, tf_pick, f" ({name}={value}, clip on)")
    assert rows_compared > 0


def _clip_reproducer():
    one = lambda v: np.full((1, 1), v, np.float32)  # noqa: E731
    zeros = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    return dict(x=one(0.0), cs_prev=one(np.nan), h_prev=one(0.0), w=zeros(2, 4), wci=zeros(1),
                wcf=zeros(1), wco=zeros(1), b=zeros(4))


def test_nan_cell_state_without_clip_stays_nan(tf):
    inputs = _clip_reproducer()
    ours, theirs = _run_both("LSTMBlockCell", inputs, {"cell_clip": 0.0})
    assert np.isnan(ours["cs"]).all() and np.isnan(theirs["cs"]).all()


def test_nan_cell_state_through_an_active_clip_stays_nan(tf):
    inputs = _clip_reproducer()
    ours, theirs = _run_both("LSTMBlockCell", inputs, {"cell_clip": 3.0})
    assert np.isnan(theirs["cs"]).all() and np.isnan(theirs["h"]).all()  # TF: NaN stays NaN
    assert np.isnan(ours["cs"]).all(), f"lstm_tvm cs = {ours['cs'].item()} (TF: nan)"


# --- huge and denormal magnitudes ------------------------------------------------------------

_MAGNITUDES = {
    "x=1e30": {"x": 1e30}, "x=-1e30": {"x": -1e30}, "w=1e30": {"w": 1e30},
    "w=-1e30": {"w": -1e30}, "x=w=1e30": {"x": 1e30, "w": 1e30},
    "denormal x,w": {"x": 1e-40, "w": 1e-40},
    "denormal all": {"x": 1e-40, "w": 1e-40, "cs_prev": -1e-40, "h_prev": 1e-40, "b": 1e-40},
}


def _magnify(inputs, changes, rng):
    out = dict(inputs)
    for name, value in changes.items():
        arr = inputs[name].copy()
        if abs(value) < 1e-30:  # denormals everywhere, with random signs
            arr[...] = np.float32(value) * rng.choice([-1, 1], arr.shape)
        else:  # a quarter of the elements huge, the rest as they were
            arr.flat[::4] = np.float32(value)
        out[name] = arr
    return out


@pytest.mark.parametrize("case", list(_MAGNITUDES))
@pytest.mark.parametrize("op_name", list(OPS))
def test_huge_and_denormal_values_agree_with_tf_where_finite(tf, op_name, case):
    attrs = {"use_peephole": True}
    inputs = _inputs(op_name, peephole=True, seed=2,
                     seq_len_max=T - 1 if OPS[op_name].kind == "sequence" else None)
    if "denormal" in case:
        assert np.float32(1e-40) != 0 and np.float32(1e-40) < np.finfo(np.float32).tiny
    inputs = _magnify(inputs, _MAGNITUDES[case], np.random.default_rng(3))
    with np.errstate(all="ignore"):
        ours, theirs = _run_both(op_name, inputs, attrs)
    for name, value in ours.items():
        expected = theirs[name]
        where = _defined(op_name, name, inputs, value.shape) & np.isfinite(expected)
        with np.errstate(all="ignore"):
            err = np.where(where, np.abs(value.astype(np.float64) - expected), 0.0)
            bound = 1e-5 + 1e-5 * np.abs(expected.astype(np.float64))  # per element relative
        bad = where & ~(err <= bound)
        assert not bad.any(), (
            f"{op_name}.{name} ({case}): {int(bad.sum())} of {int(where.sum())} TF-finite "
            f"elements differ; e.g. at {np.argwhere(bad)[0].tolist()}: lstm_tvm "
            f"{value[tuple(np.argwhere(bad)[0])]!r}, TF {expected[tuple(np.argwhere(bad)[0])]!r}")


def test_denormal_heavy_sequence_runs_in_bounded_time():
    """Denormal arithmetic is slow on x86 without flush-to-zero: a longer sequence on all-denormal
    state must still finish quickly (no pathological slow path, no hang)."""
    inputs = testing.make_inputs("BlockLSTMGradV2", B=8, I=I, H=H, T=64, attrs={
        "use_peephole": True}, seed=4)
    for name in ("x", "w", "cs_prev", "h_prev", "cs_grad", "h_grad"):
        inputs[name] = np.full_like(inputs[name], 1e-40)
    start = time.perf_counter()
    out = lstm_tvm.raw_ops.BlockLSTMGradV2(**inputs, use_peephole=True)
    assert time.perf_counter() - start < TIME_LIMIT
    assert all(np.isfinite(v).all() for v in out)


# --- float attributes at float32's edges -----------------------------------------------------

@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM"])
def test_tiny_cell_clip_turns_clipping_off_as_in_tf(tf, op_name):
    """TF's attributes are float32: ``cell_clip=1e-50`` is 0 there (no clipping), not a clip
    to ``[-0, 0]``."""
    inputs = _inputs(op_name, peephole=False)
    ours, theirs = _run_both(op_name, inputs, {"cell_clip": 1e-50})
    off = getattr(lstm_tvm.raw_ops, op_name)(**inputs, cell_clip=0.0)
    assert np.abs(theirs["cs"]).max() > 0.1
    for name, value in ours.items():
        np.testing.assert_array_equal(value, getattr(off, name), err_msg=name)
        mask = _defined(op_name, name, inputs, value.shape)
        testing.assert_close(value, theirs[name], "float32", f"{op_name}.{name} vs TF", mask=mask)


@pytest.mark.parametrize(("attr", "value"), [
    ("forget_bias", 1e39), ("forget_bias", -1e39), ("forget_bias", 1e300),
    ("forget_bias", 10**400), ("cell_clip", 10**400)], ids=repr)
def test_float_attr_beyond_float32_is_a_value_error_naming_it(attr, value):
    """``cell_clip`` past float32's range is ``+-inf`` in TF (no clipping): only an int that
    no float holds is refused, as TF refuses it."""
    inputs = _inputs("LSTMBlockCell", peephole=False)
    with pytest.raises(ValueError, match=f"^LSTMBlockCell: attribute '{attr}' expected a"):
        lstm_tvm.raw_ops.LSTMBlockCell(**inputs, **{attr: value})
    with pytest.raises(ValueError, match=f"^LSTMBlockCell: attribute '{attr}'"):
        lstm_tvm.compile("LSTMBlockCell", input_size=I, cell_size=H, **{attr: value})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
