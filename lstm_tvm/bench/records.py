"""A kernel built with its tuning records against the same kernel built with fewer of them,
both timed in one process: whether a database's records beat what the kernel uses without it.

A tuning run on a shared machine measures each candidate once, in whatever state the machine
is in, and two benchmark processes of the same kernel can differ by more than records change
(docs/performance.md: the entries on records of a Zen 4's and of an Emerald Rapids Xeon's
own). So :func:`compare` builds both kernels in this process, binds the same weights to both
and calls them in turns: each turn times a few calls of one, then of the other, and the median
of the turns' ratios (with its quartiles) is what it reports, robust to the machine's drift.

What the other kernel leaves out (``against``):

- ``"shipped"``: the user's records (what ``lstm-tvm tune`` wrote), keeping the shipped ones;
- ``"borrowed"``: the target's own key's records, keeping those it borrows from another CPU;
- ``"rules"``: every record (the rule-based schedules).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import build as _build
from .. import testing
from .._tvm import tvm
from ..api import CompiledOp
from ..registry import get_op
from ..validation import plain_attrs
from ..tuning import database

__all__ = ["AGAINST", "CALLS", "Comparison", "compare", "records_without"]

#: What :func:`compare` can leave out, and how to say so.
AGAINST = {"shipped": "without the user's records",
           "borrowed": "without the target's own records",
           "rules": "without any record"}
#: Calls of each kernel a turn of :func:`compare` times (their median is the turn's time).
CALLS = 5


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One kernel timed with its records (``records``: where they come from, as
    ``lstm-tvm schedules`` labels them) and with fewer (``against``). ``ratio`` is the median
    over the turns of ``against ms / records ms`` (above 1: the records are faster) and
    ``quartiles`` its quartiles; None, as the times, where both kernels take the same records
    (nothing to time)."""

    op: str
    dtype: str
    shape: tuple
    records: str
    against: str
    ms: float | None = None
    against_ms: float | None = None
    ratio: float | None = None
    quartiles: tuple | None = None


def records_without(spec: _build.BuildSpec, against: str) -> tuple:
    """``(tuned, uses)``: the records ``spec``'s kernel takes when the databases ``against``
    names (see the module doc) are left out, as :attr:`~lstm_tvm.build.BuildSpec.tuned` and as
    the record uses (:func:`lstm_tvm.build.record_uses`' form) they come from."""
    if against not in AGAINST:
        raise ValueError(f"against expected one of {list(AGAINST)}, got {against!r}")
    if against == "rules":
        return (), ()
    target = spec.resolved
    state = tuple((source, file_stamp) for source, file_stamp in database.stamp(target)
                  if (source.origin != "user" if against == "shipped" else source.borrowed))
    uses = database.block_uses(target, _build.gemm_blocks(spec), state)
    return _build.records_of(uses), uses


def compare(op_name: str, shape: tuple, against: str = "shipped", *, dtype: str = "float32",
            target="llvm", turns: int = 11, calls: int = CALLS, seed: int = 0) -> Comparison:
    """Time ``op_name`` at ``shape`` (``(T, B, I, H)``; ``T`` unused by the cell ops) with its
    records and ``against`` fewer (see the module doc), ``w`` bound, in ``turns`` turns of
    ``calls`` calls of each; their outputs are checked to agree within ``dtype``'s tolerance
    first."""
    T, B, I, H = shape
    spec = _build.make_spec(op_name, dtype, I, H, plain_attrs(get_op(op_name)), target)
    fewer, fewer_uses = records_without(spec, against)
    label = _labels(_build.record_uses(spec))
    other_label = _labels(fewer_uses)
    result = Comparison(op_name, dtype, tuple(shape), label, other_label)
    if fewer == spec.tuned:
        return result
    kernels = [CompiledOp(spec), CompiledOp(dataclasses.replace(spec, tuned=fewer))]
    inputs = testing.make_inputs(op_name, dtype=dtype, T=T, B=B, I=I, H=H, seed=seed)
    if "w" in inputs:
        w = inputs.pop("w")
        kernels = [k.bind(w=w) for k in kernels]
    args = {n: tvm.runtime.tensor(v) if v.ndim else v for n, v in inputs.items()}
    outs = [k(**args) for k in kernels]
    for name, a, b in zip(outs[0]._fields, *outs):
        testing.assert_close(b.numpy(), a.numpy(), dtype, f"{op_name} {name} ({against})")

    def median_ms(i: int) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            kernels[i](**args, out=outs[i])
            times.append(time.perf_counter() - start)
        return float(np.median(times)) * 1e3

    for i in (0, 1, 0, 1):  # warm both
        median_ms(i)
    ms, other_ms = [], []
    for _ in range(turns):
        ms.append(median_ms(0))
        other_ms.append(median_ms(1))
    ratios = np.array(other_ms) / np.array(ms)
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return dataclasses.replace(result, ms=float(np.median(ms)),
                               against_ms=float(np.median(other_ms)), ratio=float(med),
                               quartiles=(float(q1), float(q3)))


def _labels(uses) -> str:
    """Where the records of ``uses`` come from (own first), comma-separated; the rule
    schedule where no block has one."""
    labels = sorted({u.label for u in uses if u.best is not None},
                    key=lambda s: (s != "own", s))
    return ", ".join(labels) if labels else "none: rule schedule"
