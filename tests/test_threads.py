"""lstm_tvm called from threads it did not make: ONNX Runtime's parallel executor, TensorFlow's
executor and tf.data threads (threads Python did not create), thread pools whose workers end,
and a soak of them together.

A DLPack view of a NumPy array left in a thread's state is freed while that thread is torn
down, and on CPython 3.11 NumPy's deleter crashes there when Python did not create the thread.
Each case that could crash the process runs in a child process (a crash fails that test, not
the run) and checks every result against the float64 reference, each call on inputs of its
own, so that a buffer lent to two calls at once would show."""

import json
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _ort_harness import run_child

import lstm_tvm
from lstm_tvm import _host_arrays, _launch, reference, testing
from lstm_tvm.env import usable_cores

#: Sizes at which ``x`` and ``w`` pass the in-place threshold (16 KiB) and the small inputs
#: are staged: both paths of the CPU dispatch run.
SIZES = {"T": 16, "B": 4, "I": 64, "H": 32}

#: In every child: a check of outputs against the reference with the float32 tolerance.
_CHECK = """
import json
import sys

import numpy as np
from lstm_tvm import testing

def check(outputs, expected, where):
    for name, ref in expected.items():
        testing.assert_close(outputs[name], ref, "float32", f"{where}: {name}")
"""

_ORT_PARALLEL = _CHECK + """
import onnxruntime
from _ort_harness import branch_feeds, branches_model
from lstm_tvm import onnx as lo, reference, testing
from lstm_tvm.onnx import ort as lort

route, threads = sys.argv[1], int(sys.argv[2])
sizes = json.loads(sys.argv[3])
I, H = sizes["I"], sizes["H"]


def session(model):
    options = onnxruntime.SessionOptions()
    options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = threads
    if route == "pyop":
        return lort.InferenceSession(model, sess_options=options)
    return onnxruntime.InferenceSession(model.SerializeToString(), lort.session_options(options),
                                        providers=["CPUExecutionProvider"])


def run(s, feeds):
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})))


# three independent nodes at once, each on inputs of its own; forward and gradient ops
attrs = {"use_peephole": True}
for op in ("BlockLSTM", "BlockLSTMGradV2", "LSTMBlockCellGrad"):
    s = session(branches_model(op, 3, input_size=I, cell_size=H, attrs=attrs))
    for call in range(4):
        feeds, expected = branch_feeds(op, 3, seed=10 * call, attrs=attrs, **sizes)
        check(run(s, feeds), expected, f"{op} x3, call {call}")
    print("ok", op, flush=True)

# a forward op feeding its gradient
fwd = testing.make_inputs("BlockLSTMV2", seed=3, attrs=attrs, **sizes)
grads = testing.make_inputs("BlockLSTMGradV2", seed=4, attrs=attrs, **sizes)
feeds = {**fwd, "cs_grad": grads["cs_grad"], "h_grad": grads["h_grad"]}
ref_fwd = reference.run("BlockLSTMV2", fwd, attrs)
stored = {k: v.astype(np.float32) for k, v in ref_fwd.items()}
ref_bwd = reference.run("BlockLSTMGradV2", {**feeds, **stored}, attrs)
s = session(lo.make_forward_backward_model("BlockLSTMV2", input_size=I, cell_size=H,
                                           attrs=attrs, with_functions=False))
for call in range(4):
    check(run(s, feeds), {**ref_fwd, **ref_bwd}, f"BlockLSTMV2 -> BlockLSTMGradV2, call {call}")
print("ok forward-backward", flush=True)

# the thread counts of the kernels the executor's pool threads launched, and their pools' sizes
from lstm_tvm import _launch
from lstm_tvm._tvm import tvm

counts = sorted(k for k in _launch._state._threads if k is not None)
pool_size = tvm.get_global_func("runtime.NumThreads")
pools = [_launch._state.thread(k).run(pool_size, ()) for k in counts]
print("kernel threads", json.dumps({"asked": counts, "pools": pools}))
"""


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("route", ["pyop", "pyop_plain"])
def test_onnxruntime_parallel_executor_runs_the_pyops(route, threads):
    """Every result matches the reference; the PyOps on the executor's pool threads launch
    their kernels with one core fewer than the process has (the thread that called ``run``
    spins on one until they are done), on a pool of that size."""
    pytest.importorskip("onnxruntime_extensions")
    out = run_child(_ORT_PARALLEL, route, threads, json.dumps(SIZES))
    assert out.split().count("ok") == 4, out
    used = json.loads(out.split("kernel threads", 1)[1].strip().splitlines()[0])
    fewer = usable_cores() - 1
    expected = [fewer] if 1 <= fewer < _launch.pool_threads() else []
    assert used == {"asked": expected, "pools": expected}, used


def test_a_kernel_asked_for_fewer_threads_runs_on_a_pool_of_that_size():
    """``raw_ops.run(..., threads=k)`` below the pool's size runs on a kernel thread of
    lstm_tvm's whose TVM pool has ``k`` threads; the results are the reference's."""
    import tvm

    op_name = "BlockLSTMGrad"
    attrs = {"use_peephole": True}
    inputs = testing.make_inputs(op_name, seed=7, attrs=attrs, **SIZES)
    outputs = lstm_tvm.raw_ops.run(op_name, inputs, attrs, threads=1)._asdict()
    for name, ref in reference.run(op_name, inputs, attrs).items():
        testing.assert_close(outputs[name], ref, "float32", f"{op_name} on 1 thread: {name}")
    if _launch.pool_threads() > 1:
        size = _launch._state.thread(1).run(tvm.get_global_func("runtime.NumThreads"), ())
        assert size == 1
    else:
        assert 1 not in _launch._state._threads  # the pool's own size: the usual path


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_int(threads):
    inputs = testing.make_inputs("BlockLSTM", **SIZES)
    with pytest.raises(ValueError, match=r"BlockLSTM: threads expected an int >= 1 or None, "
                                         rf"got {re.escape(repr(threads))}"):
        lstm_tvm.raw_ops.run("BlockLSTM", inputs, threads=threads)


_TF_GRAPH = _CHECK + """
import tensorflow as tf
from lstm_tvm import raw_ops, reference

sizes = json.loads(sys.argv[1])
OPS = ("BlockLSTM", "BlockLSTMGrad", "LSTMBlockCell", "LSTMBlockCellGrad")


ATTRS = {"use_peephole": True, "cell_clip": 0.8}


def case(op, seed):
    inputs = testing.make_inputs(op, seed=seed, attrs=ATTRS, **sizes)
    return inputs, reference.run(op, inputs, testing.op_attrs(op, ATTRS))


def call(op, seed):
    # TF's executor runs this on a thread of its own pool; the ops take the inputs of seed
    inputs, _ = case(op, int(seed))
    return list(getattr(raw_ops, op)(**inputs, **testing.op_attrs(op, ATTRS)))


def graph_fn(op):
    count = len(lstm_tvm.registry.get_op(op).outputs)

    @tf.function
    def fn(seed):
        return tf.numpy_function(lambda s: call(op, s), [seed], [tf.float32] * count)
    return fn


for op in OPS:
    fn = graph_fn(op)
    names = lstm_tvm.registry.get_op(op).output_names
    for seed in range(3):
        outputs = fn(tf.constant(seed, tf.int64))
        check(dict(zip(names, [o.numpy() for o in outputs])), case(op, seed)[1],
              f"{op} in tf.function, seed {seed}")
    print("ok tf.function", op, flush=True)

# tf.data map functions, several at once
op = "BlockLSTMGradV2"
names = lstm_tvm.registry.get_op(op).output_names
data = tf.data.Dataset.range(12).map(
    lambda s: (s, tuple(tf.numpy_function(lambda v: call(op, v), [s],
                                          [tf.float32] * len(names)))),
    num_parallel_calls=4, deterministic=True)
for seed, outputs in data:
    check(dict(zip(names, [o.numpy() for o in outputs])), case(op, int(seed))[1],
          f"{op} in tf.data, seed {int(seed)}")
print("ok tf.data", op, flush=True)
"""


def test_raw_ops_inside_tensorflow_graphs_and_tf_data(tf):
    out = run_child("import lstm_tvm\n" + _TF_GRAPH, json.dumps(SIZES))
    assert out.split().count("ok") == 5, out


def _call_and_check(op_name, seed, sizes=SIZES):
    attrs = testing.op_attrs(op_name, {"use_peephole": True})
    inputs = testing.make_inputs(op_name, seed=seed, attrs=attrs, **sizes)
    outputs = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)._asdict()
    for name, ref in reference.run(op_name, inputs, attrs).items():
        testing.assert_close(outputs[name], ref, "float32", f"{op_name} seed {seed}: {name}")


def test_concurrent_calls_of_one_configuration_each_get_their_own_buffers():
    """Many threads call one op on inputs of their own at once: every result is its own."""
    _call_and_check("BlockLSTMGrad", 0)  # compiled before the threads start
    barrier = threading.Barrier(6)

    def work(k):
        barrier.wait()
        for call in range(5):
            _call_and_check("BlockLSTMGrad", 100 * k + call)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(work, range(6)))


def test_threads_that_end_leave_no_buffers_behind():
    """Pool workers that come and go do not add to what the process keeps: the lent buffers
    are bounded by the calls that overlapped, whatever the number of threads."""
    small = {"T": 3, "B": 2, "I": 8, "H": 8}
    _call_and_check("BlockLSTM", 0, small)
    before = len(_host_arrays._STAGING), len(_host_arrays._OUTPUTS)
    kept = []
    for round_ in range(4):
        for _ in range(5):  # each executor's workers end at its shutdown
            with ThreadPoolExecutor(3) as pool:
                list(pool.map(lambda s: _call_and_check("BlockLSTM", s, small), range(6)))
        kept.append((len(_host_arrays._STAGING) - before[0],
                     len(_host_arrays._OUTPUTS) - before[1]))
    # a set per call at once of this configuration: at most the threads of one executor
    assert all(0 <= n <= 3 for pair in kept for n in pair), kept


_SOAK = _CHECK + """
import gc
import threading
import time

import onnxruntime
import psutil
from _ort_harness import branch_feeds, branches_model
from lstm_tvm import raw_ops, reference
from lstm_tvm.onnx import ort as lort

runs, short_threads = int(sys.argv[1]), int(sys.argv[2])
sizes = {"T": 5, "B": 2, "I": 8, "H": 8}
options = onnxruntime.SessionOptions()
options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
options.inter_op_num_threads = 4
session = lort.InferenceSession(branches_model("BlockLSTM", 2, input_size=8, cell_size=8),
                                sess_options=options)
cases = [branch_feeds("BlockLSTM", 2, seed=10 * k, **sizes) for k in range(4)]
peephole = {"use_peephole": True}
direct = [testing.make_inputs("BlockLSTMGrad", seed=100 + k, attrs=peephole, **sizes)
          for k in range(4)]
direct_ref = [reference.run("BlockLSTMGrad", inputs, peephole) for inputs in direct]
bounds = [{n: 1e-5 * max(1.0, np.abs(r).max()) + 1e-5 * np.abs(r) for n, r in ref.items()}
          for _, ref in cases]
mismatches, errors = [0], []
names = [o.name for o in session.get_outputs()]


def ort_worker(k, count):
    feeds, expected = cases[k]
    try:
        for _ in range(count):
            out = dict(zip(names, session.run(None, feeds)))
            if any(not np.all(np.abs(out[n] - r) <= bounds[k][n]) for n, r in expected.items()):
                mismatches[0] += 1
    except BaseException as err:
        errors.append(repr(err))


def short_lived(k):
    try:
        out = raw_ops.BlockLSTMGrad(**direct[k % 4], **peephole)._asdict()
        check(out, direct_ref[k % 4], f"raw_ops in short-lived thread {k}")
    except BaseException as err:
        errors.append(repr(err))


def phase(count, threads):
    workers = [threading.Thread(target=ort_worker, args=(k, count)) for k in range(4)]
    for w in workers:
        w.start()
    for k in range(threads):
        t = threading.Thread(target=short_lived, args=(k,))
        t.start()
        t.join()
    for w in workers:
        w.join()


def rss():
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


start = time.perf_counter()
phase(50, 20)  # warm-up: compiled kernels, buffers, pools of threads
warm = rss()
phase(runs // 2, short_threads // 2)
half = rss()
phase(runs - runs // 2, short_threads - short_threads // 2)
end = rss()
print(json.dumps({"runs": 4 * (runs + 50), "short_lived_threads": short_threads + 20,
                  "mismatches": mismatches[0], "errors": errors[:3],
                  "rss_after_warm_up_mib": round(warm, 1), "rss_half_mib": round(half, 1),
                  "rss_end_mib": round(end, 1), "seconds": round(time.perf_counter() - start, 1),
                  "python": sys.version.split()[0]}))
"""


def _soak(runs, threads):
    """4 ONNX Runtime threads x ``runs`` runs of one session on the parallel executor, beside
    ``raw_ops`` calls from ``threads`` threads that each end: no mismatch, and the process's
    memory settles. The RSS allowance: after the warm-up every buffer and thread pool exists;
    what may still move is the allocator's arenas and pages (a few MiB), not anything per
    thread that ended (the second half adds as many threads as the first, and may not add
    memory again)."""
    pytest.importorskip("onnxruntime_extensions")
    out = run_child(_SOAK, runs, threads)
    report = json.loads(out.strip().splitlines()[-1])
    print("soak:", report)
    assert report["errors"] == [] and report["mismatches"] == 0, report
    assert report["rss_end_mib"] - report["rss_after_warm_up_mib"] < 8, report
    assert report["rss_end_mib"] - report["rss_half_mib"] < 3, report


def test_soak_parallel_executor_and_short_lived_threads():
    _soak(60, 100)  # the long soak is test_soak_4_threads_x_1000_runs (-m slow)


@pytest.mark.slow
def test_soak_4_threads_x_1000_runs():
    _soak(1000, 400)


_THREAD_COUNT = """
import os
import threading
import time

import lstm_tvm
from lstm_tvm import testing

inputs = testing.make_inputs("BlockLSTM", T=3, B=2, I=8, H=8)


def call():
    lstm_tvm.raw_ops.BlockLSTM(**inputs)


def threads_after(count):
    for _ in range(count):
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    time.sleep(0.5)  # an ended thread leaves the task list shortly after join
    return len(os.listdir("/proc/self/task"))


print(threads_after(2), threads_after(30))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_threads_that_call_leave_no_threads_behind():
    """TVM gives each thread that launches a CPU kernel a thread pool of its own; lstm_tvm runs
    the kernels of every thread but the main one on one thread of its own, so threads that
    call and end leave no pools (and no spinning workers) behind. In a fresh process: after
    the first calls (the kernel thread and its pool exist), 30 more threads add none."""
    warm, after = map(int, run_child(_THREAD_COUNT).split()[-2:])
    assert after <= warm, (warm, after)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
