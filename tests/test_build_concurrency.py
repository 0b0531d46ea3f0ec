"""Concurrent use: threads sharing a compiled op or a cold cache, processes sharing a disk cache,
and damaged disk-cache entries.

- One ``CompiledOp`` called from 8 threads at once, each with its own inputs (and its own
  ``T``/``B``), returns exactly what serial calls return.
- ``raw_ops`` from 8 threads on a cold in-memory and empty disk cache compiles each spec once
  (the file lock serialises the threads that miss the memory cache; the others load the
  published library) and every result matches the serial one.
- Two processes filling the same empty disk cache at once both succeed, compile each spec once
  between them and produce bit-identical outputs.
- A truncated ``.json`` sidecar and a garbage ``.so`` (whose recorded checksum matches, so the
  load itself fails) are discarded and rebuilt. These run in child processes: a library that is
  already loaded in a process is found again by its path, so only a fresh process really loads
  the damaged file.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tvm

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm.validation import validate_attrs

N_THREADS = 8


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _in_threads(fn, n=N_THREADS):
    """Run ``fn(k)`` for k < n in n threads released together; re-raise the first error."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def work(k):
        try:
            barrier.wait()
            results[k] = fn(k)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 300 s"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize(("op_name", "I", "H"), [("BlockLSTMGradV2", 7, 9),
                                                 ("LSTMBlockCell", 3, 5)])
def test_one_compiled_op_from_8_threads_matches_serial_calls(op_name, I, H):  # noqa: E741
    op = registry.get_op(op_name)
    attrs = {"use_peephole": True}
    fn = lstm_tvm.compile(op_name, input_size=I, cell_size=H, **attrs)
    seq = op.kind == "sequence"
    cases = []
    for k in range(N_THREADS):
        T, B = (3 + k % 4, 1 + k % 3) if seq else (None, 1 + k)
        inputs = testing.make_inputs(op_name, B=B, I=I, H=H, T=T, attrs=attrs, seed=k,
                                     seq_len_max=(T - k % 2) if seq else None)
        cases.append({n: int(v) if n == "seq_len_max" else tvm.runtime.tensor(v)
                      for n, v in inputs.items()})

    def call(k, rounds=20):
        outs = []
        for r in range(rounds):  # every other round into out= tensors of its own
            out = fn(**cases[k], out=outs[-1] if outs and r % 2 else None)
            outs.append(out)
        return [_digest(t.numpy() for t in o) for o in outs]

    concurrent = _in_threads(call)
    serial = [call(k, rounds=1)[0] for k in range(N_THREADS)]
    for k in range(N_THREADS):
        assert set(concurrent[k]) == {serial[k]}, f"thread {k}: results differ from serial"
    assert len(set(serial)) == N_THREADS  # the threads really had different inputs


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty disk cache and an empty in-memory cache (restored afterwards)."""
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(tmp_path))
    with build._memory_lock:
        saved = dict(build._memory)
        build._memory.clear()
    yield tmp_path
    with build._memory_lock:
        build._memory.clear()
        build._memory.update(saved)


def test_raw_ops_from_8_threads_on_a_cold_cache_compile_once_per_spec(empty_cache,
                                                                       monkeypatch):
    specs = [("LSTMBlockCell", "float32"), ("BlockLSTM", "float16")]
    I, H = 4, 6  # noqa: E741 - sizes no other test compiles, so the cache is really cold
    compiled = collections.Counter()
    lock = threading.Lock()
    original = build.build

    def counting_build(spec):
        with lock:
            compiled[(spec.op, spec.dtype)] += 1
        return original(spec)

    monkeypatch.setattr(build, "build", counting_build)

    def call(k):
        op_name, dtype = specs[k % len(specs)]
        inputs = testing.make_inputs(op_name, dtype=dtype, B=1 + k, I=I, H=H, T=2 + k % 3,
                                     seed=k)
        return inputs, getattr(lstm_tvm.raw_ops, op_name)(**inputs)

    results = _in_threads(call)
    assert dict(compiled) == {s: 1 for s in specs}, f"compiles per spec: {dict(compiled)}"
    assert len(list(empty_cache.glob("*/*.so"))) == len(specs)
    for k, (inputs, got) in enumerate(results):
        op_name, dtype = specs[k % len(specs)]
        again = getattr(lstm_tvm.raw_ops, op_name)(**inputs)
        assert _digest(got) == _digest(again), f"thread {k}: differs from a serial call"
        ref = reference.run(op_name, inputs, {})
        for name in got._fields:
            testing.assert_close(getattr(got, name), ref[name], dtype, f"{op_name}.{name}")
    assert dict(compiled) == {s: 1 for s in specs}  # the serial calls compiled nothing


# --- processes -------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import hashlib, logging, os, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    import numpy as np, lstm_tvm
    from lstm_tvm import testing
    ready, go = sys.argv[1], sys.argv[2]
    open(ready, "w").close()
    deadline = time.time() + 120
    while go and not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.01)
    for op_name in sys.argv[3].split(","):
        attrs = {"use_peephole": True}
        inputs = testing.make_inputs(op_name, B=2, I=5, H=3, T=4, attrs=attrs, seed=7)
        out = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        h = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in out))
        print("RESULT", op_name, h.hexdigest(), flush=True)
""")

_PROCESS_OPS = ("LSTMBlockCell", "BlockLSTMGrad", "BlockLSTMV2")


def _spawn(cache_dir, tmp_path, name, ops, go):
    env = {**os.environ, "LSTM_TVM_CACHE_DIR": str(cache_dir), "TVM_NUM_THREADS": "1"}
    ready = tmp_path / f"ready-{name}"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ready), str(go), ",".join(ops)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, ready


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child exited with {proc.returncode}\n{err[-4000:]}"
    results = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("RESULT"))
    return out, results


def test_two_processes_fill_one_empty_disk_cache_at_once(tmp_path):
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    children = [_spawn(cache, tmp_path, n, _PROCESS_OPS, go) for n in ("a", "b")]
    deadline = time.time() + 120
    while not all(ready.exists() for _, ready in children) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()  # both have imported lstm_tvm: release them together
    (out_a, res_a), (out_b, res_b) = (_finish(p) for p, _ in children)
    assert set(res_a) == set(res_b) == set(_PROCESS_OPS)
    assert res_a == res_b, "the two processes computed different outputs"
    compiles = [line for line in (out_a + out_b).splitlines() if "compiling" in line]
    assert len(compiles) == len(_PROCESS_OPS), f"each spec compiled once in all: {compiles}"
    entries = sorted(p.name for p in cache.glob("*/*") if not p.name.endswith(".lock"))
    assert len([e for e in entries if e.endswith(".so")]) == len(_PROCESS_OPS), entries
    assert len([e for e in entries if e.endswith(".json")]) == len(_PROCESS_OPS), entries
    assert len(entries) == 2 * len(_PROCESS_OPS), f"temporary files left behind: {entries}"
    for meta in cache.glob("*/*.json"):
        info = json.loads(meta.read_text())
        assert info["sha256"] == build._file_sha256(meta.with_suffix(".so"))


def test_truncated_sidecar_and_garbage_library_are_rebuilt(tmp_path, monkeypatch):
    ops = ("LSTMBlockCell", "BlockLSTMGrad")  # the first gets a truncated .json, the second
    attrs = {"use_peephole": True}            # a garbage .so with a matching recorded checksum
    expected = {}
    for op_name in ops:  # the outputs of an intact kernel, from this process's caches
        inputs = testing.make_inputs(op_name, B=2, I=5, H=3, T=4, attrs=attrs, seed=7)
        out = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
        expected[op_name] = _digest(out)
    cache = tmp_path / "cache"
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(cache))
    paths = {}
    for op_name in ops:  # fill the fresh cache directly (not through the memory cache)
        full = validate_attrs(registry.get_op(op_name), attrs)
        spec = build.make_spec(op_name, "float32", 5, 3, full, "llvm")
        build._load_or_build(spec)
        paths[op_name] = build.cache_path(spec)
    sidecar = paths[ops[0]].with_suffix(".json")
    text = sidecar.read_text()
    sidecar.write_text(text[: len(text) // 2])
    garbage = b"\x7fELF" + np.random.default_rng(0).bytes(4096)
    paths[ops[1]].unlink()  # a new file: this process still maps the old one (in-place
    paths[ops[1]].write_bytes(garbage)  # writes to a mapped library end in SIGBUS)
    meta = json.loads(paths[ops[1]].with_suffix(".json").read_text())
    meta["sha256"] = hashlib.sha256(garbage).hexdigest()
    paths[ops[1]].with_suffix(".json").write_text(json.dumps(meta))

    proc, _ = _spawn(cache, tmp_path, "c", ops, go="")
    out, results = _finish(proc)
    assert results == expected, "the rebuilt kernels compute something else"
    discarded = [line for line in out.splitlines() if "discarding cache entry" in line]
    assert len(discarded) == 2, out
    for op_name, line in zip(ops, discarded):  # damaged as intended: not a checksum mismatch
        assert paths[op_name].name in line and "mismatch" not in line, line
    assert "Failed to load" in discarded[1], discarded[1]
    for op_name in ops:
        assert f"compiling {op_name}" in out
        info = json.loads(paths[op_name].with_suffix(".json").read_text())
        assert info["sha256"] == build._file_sha256(paths[op_name])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
