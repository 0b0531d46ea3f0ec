"""Where a CPU kernel's threads run (lstm_tvm._placement): the pool's workers pinned one per
core, the caller on the remaining core while its kernel runs (pinned there for the kernel,
its own affinity restored after, where it started elsewhere); results unchanged. Each case
runs in a fresh process (a pool starts once per process)."""

import json
import os
import sys

import pytest
from _ort_harness import run_child

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="pins threads with Linux affinities; needs two cores")

_CHILD = """
import json
import os
import sys
import threading

import numpy as np
import tvm

import lstm_tvm
from lstm_tvm import reference, testing

def affinities():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as fh:
            line = next(l for l in fh if l.startswith("Cpus_allowed_list"))
        out[int(tid)] = line.split()[1]
    return out

before = affinities()
# a first kernel too small for a parallel loop: the thread's pool is made and placed anyway
small = testing.make_inputs("LSTMBlockCellGrad", B=1, I=4, H=8, seed=1)
lstm_tvm.raw_ops.LSTMBlockCellGrad(**small, use_peephole=False)
first = {tid: cpus for tid, cpus in affinities().items() if tid not in before}
op = lstm_tvm.compile("BlockLSTM", input_size=64, cell_size=64)
inputs = testing.make_inputs("BlockLSTM", B=8, I=64, H=64, T=6, seed=3)
args = {k: int(v) if k == "seq_len_max" else tvm.runtime.tensor(v, op.device)
        for k, v in inputs.items()}
import ctypes
cpu = ctypes.CDLL(None).sched_getcpu
calls = []
def record():  # where the caller runs while its kernel runs, read from a kernel-side hook
    calls[-1].update(during=sorted(os.sched_getaffinity(0)), cpu=cpu())
from lstm_tvm import _launch
real = _launch._state.placement.run
def run(func, args):
    return real(lambda *a: (record(), func(*a))[1], args)
_launch._state.placement.run = run
cores = sorted(os.sched_getaffinity(0))
expected = reference.run("BlockLSTM", inputs, {})
for call in range(5):
    if call == 2:  # start the call on the last core (a worker's), the affinity as before
        os.sched_setaffinity(0, {cores[-1]})
        os.sched_setaffinity(0, cores)
    calls.append({"before": cpu()})
    out = op(**args)
    for name in out._fields:
        testing.assert_close(getattr(out, name).numpy(), expected[name], "float32", name)
after = affinities()
workers = {tid: cpus for tid, cpus in after.items() if tid not in before}
print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "calls": calls,
                  "workers": sorted(workers.values()), "first": sorted(first.values()),
                  "cores": cores}))
"""


def _child(pin: str) -> dict:
    env_before = os.environ.get("LSTM_TVM_PIN_THREADS")
    os.environ["LSTM_TVM_PIN_THREADS"] = pin
    try:
        return json.loads(run_child(_CHILD).strip().splitlines()[-1])
    finally:
        if env_before is None:
            del os.environ["LSTM_TVM_PIN_THREADS"]
        else:
            os.environ["LSTM_TVM_PIN_THREADS"] = env_before


def test_pool_workers_pinned_and_caller_on_the_free_core():
    got = _child("1")
    cores = got["cores"]
    assert got["main"] == cores  # restored after the kernel
    for call in got["calls"]:
        assert call["cpu"] == cores[0], call
        # pinned for the kernel where it started elsewhere, else left as it was
        assert call["during"] == (cores if call["before"] == cores[0] else [cores[0]]), call
    # the test moved the third call's thread away; the calls after a pinned call start where
    # it left the thread, and run there unpinned
    assert got["calls"][2]["during"] == [cores[0]]
    assert any(call["during"] == cores for call in got["calls"][3:]), got["calls"]
    pinned = [w for w in got["workers"] if w.isdigit()]
    assert pinned and len(set(pinned)) == len(pinned)
    assert all(int(w) in cores[1:] for w in pinned)
    assert got["first"] == got["workers"]  # made and pinned at the first kernel


def test_pinning_off_leaves_every_thread_free():
    got = _child("0")
    assert all(call["during"] == got["cores"] for call in got["calls"])
    assert all(not w.isdigit() for w in got["workers"])
