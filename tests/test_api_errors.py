"""Reliability: sizes past 2**31 elements are refused before any allocation, conversion failures
in ``raw_ops`` are named errors, known ``CompiledOp`` gaps are pinned, and the kernels run clean
under valgrind (slow).

The other reliability tests: ``test_api_fuzz.py`` (property-based fuzz of malformed
inputs, in a child process), ``test_ops_values.py`` (NaN, Inf, huge and denormal values
against TF), ``test_build_concurrency.py`` (threads, processes, damaged cache entries).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest
import tvm

import lstm_tvm
from lstm_tvm import build, reference, registry, testing
from lstm_tvm.validation import validate_attrs

OPS = registry.OPS
I, H = 3, 5  # noqa: E741 - as in test_ops, so the kernels are cached
#: Python-side allocation allowed while refusing a too-large call (no copy of any input).
ALLOC_LIMIT = 16 * 2**20


class ShapeOnly:
    """A tensor-like object with ``.shape`` and ``.dtype`` only (no data)."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype


def _names(op_name, *args):
    return f"^{re.escape(op_name)}: " + "".join(f"(?=.*'{re.escape(a)}')" for a in args)


def _sizes(sizes):
    """A regex for the sizes as the refusal prints them (``T=.., B=.., I=.., H=..``)."""
    order = [k for k in ("T", "B", "I", "H") if k in sizes]
    return re.escape(", ".join(f"{k}={sizes[k]}" for k in order))


def _lazy_inputs(op_name, sizes, make):
    op = OPS[op_name]
    inputs = {t.name: make(t.concrete_shape(sizes)) for t in op.inputs if t.dtype == "T"}
    if op.kind == "sequence":
        inputs["seq_len_max"] = 0
    return inputs


def _attrs(op_name):
    return {"use_peephole": False} if any(a.required for a in OPS[op_name].attrs) else {}


def _oversize_cases():
    cases = []
    for name, op in OPS.items():
        seq = op.kind == "sequence"
        # 'x' itself past 2**31 elements; then only the stacked (rows, 4H) gates are.
        cases.append((name, "x", dict(T=2**16, B=2**15, I=I, H=H) if seq else
                      dict(B=2**31 // I + 1, I=I, H=H)))
        cases.append((name, "dicfo" if "dicfo" in op.output_names else "gates",
                      dict(T=2**13, B=2**14, I=1, H=4) if seq else dict(B=2**27, I=1, H=4)))
    return cases


@pytest.mark.parametrize(("op_name", "tensor", "sizes"), _oversize_cases(), ids=str)
def test_raw_ops_refuse_sizes_past_2_31_elements_before_allocating(op_name, tensor, sizes):
    inputs = _lazy_inputs(op_name, sizes,
                          lambda s: np.broadcast_to(np.zeros((), np.float32), s))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=_names(op_name, tensor) + r".*fewer than 2\*\*31"
                           + ".*got sizes " + _sizes(sizes)):
            getattr(lstm_tvm.raw_ops, op_name)(**inputs, **_attrs(op_name))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT, f"{peak / 2**20:.0f} MiB allocated while refusing the call"


@pytest.mark.parametrize("op_name", list(OPS))
def test_compiled_op_refuses_sizes_past_2_31_elements(op_name):
    op = OPS[op_name]
    fn = lstm_tvm.compile(op_name, input_size=I, cell_size=H, **_attrs(op_name))
    sizes = dict(T=2**16, B=2**15, I=I, H=H) if op.kind == "sequence" else dict(B=2**29, I=I,
                                                                                 H=H)
    inputs = _lazy_inputs(op_name, sizes, ShapeOnly)
    first = "x" if "T" in sizes else "cs_prev"  # (B, I) stays under the limit, (B, H) does not
    with pytest.raises(ValueError, match=_names(op_name, first) + r".*fewer than 2\*\*31.*got "
                       r"sizes " + _sizes(sizes)):
        fn(**inputs)


@pytest.mark.parametrize(("B", "H_", "tensor"), [(2**29, 1, "dicfo"), (1, 2**15, "w")])
def test_cell_grad_matmul_refuses_sizes_past_2_31_elements(B, H_, tensor):
    lazy = lambda *s: np.broadcast_to(np.zeros((), np.float32), s)  # noqa: E731
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=f"^CellGradMatmul: .*'{tensor}'.*2\\*\\*31"):
            lstm_tvm.cell_grad_matmul(lazy(B, 1), lazy(B, H_), lazy(1 + H_, 4 * H_),
                                      lazy(B, 4 * H_))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT


@pytest.mark.parametrize("op_name", [n for n, op in OPS.items() if op.kind == "sequence"])
def test_empty_batch_with_a_huge_time_dimension_returns_at_once_from_raw_ops(op_name):
    sizes = dict(T=2**40, B=0, I=I, H=H)
    inputs = _lazy_inputs(op_name, sizes, lambda s: np.zeros(s, np.float32))
    inputs["seq_len_max"] = 2**40
    start = time.perf_counter()
    out = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **_attrs(op_name))
    assert time.perf_counter() - start < 5
    assert all(not np.asarray(v).any() for v in out)


# --- raw_ops conversions (fixed in this change) ----------------------------------------------

class _RaisingDLPack:
    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("device not reachable")

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize(("op_name", "name"), [("LSTMBlockCell", "x"),
                                              ("BlockLSTM", "seq_len_max")])
@pytest.mark.parametrize(("value", "cause"), [
    ([[1.0], [1.0, 2.0]], "inhomogeneous"),
    (_RaisingDLPack(), "device not reachable"),
    (tvm.runtime.empty((2, I), "bfloat16"), "dtype"),
], ids=["ragged list", "failing __dlpack__", "bfloat16 TVM tensor"])
def test_raw_ops_name_the_input_that_cannot_be_converted(op_name, name, value, cause):
    inputs = testing.make_inputs(op_name, B=2, I=I, H=H, T=3)
    with pytest.raises(TypeError, match=_names(op_name, name) + f".*could not be converted.*"
                       f"{cause}") as info:
        getattr(lstm_tvm.raw_ops, op_name)(**{**inputs, name: value})
    assert info.value.__cause__ is not None  # the original error stays attached


@pytest.mark.parametrize("which", ["all", "w only"])
@pytest.mark.parametrize("op_name", ["LSTMBlockCellGrad", "BlockLSTM"])
def test_raw_ops_take_big_endian_arrays(op_name, which):
    attrs = _attrs(op_name)
    inputs = testing.make_inputs(op_name, B=2, I=I, H=H, T=3, attrs=attrs)
    swapped = {n: (v.astype(v.dtype.newbyteorder(">"))
                   if n != "seq_len_max" and (which == "all" or n == "w") else v)
               for n, v in inputs.items()}
    assert swapped["w"].dtype.byteorder == ">"
    got = getattr(lstm_tvm.raw_ops, op_name)(**swapped, **attrs)
    want = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float32 and a.dtype.isnative


def test_cell_grad_matmul_takes_big_endian_and_names_bad_inputs():
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, s).astype(np.float32) for s in ((2, I), (2, H), (I + H, 4 * H),
                                                               (2, 4 * H))]
    want = lstm_tvm.cell_grad_matmul(*args)
    got = lstm_tvm.cell_grad_matmul(*(a.astype(">f4") for a in args))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="^CellGradMatmul: input 'dicfo' could not be"):
        lstm_tvm.cell_grad_matmul(*args[:3], [[1.0], [1.0, 2.0]])


def test_raw_ops_run_checks_its_own_arguments():
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=I, H=H)
    with pytest.raises(ValueError, match="unknown op 'LSTM'; expected one of"):
        lstm_tvm.raw_ops.run("LSTM", inputs)
    with pytest.raises(TypeError, match="^LSTMBlockCell: expected inputs as a mapping, got list"):
        lstm_tvm.raw_ops.run("LSTMBlockCell", list(inputs.values()))


# --- known gaps of CompiledOp and compile() (api.py; reported, pinned here) ------------------

def _tvm_inputs(op_name, **sizes):
    inputs = testing.make_inputs(op_name, I=I, H=H, attrs=_attrs(op_name), **sizes)
    return {n: int(v) if n == "seq_len_max" else tvm.runtime.tensor(v)
            for n, v in inputs.items()}


def test_compiled_op_with_an_empty_batch_does_not_run_empty_steps():
    fn = lstm_tvm.compile("BlockLSTM", input_size=I, cell_size=H)
    T = 2**19
    z = lambda *s: tvm.runtime.empty(s, "float32")  # noqa: E731
    args = dict(x=z(T, 0, I), cs_prev=z(0, H), h_prev=z(0, H), w=z(I + H, 4 * H), wci=z(H),
                wcf=z(H), wco=z(H), b=z(4 * H))
    fn(seq_len_max=0, **args)  # validated once, cached
    start = time.perf_counter()
    fn(seq_len_max=T, **args)
    assert time.perf_counter() - start < 0.25


def _strided(a):
    wide = np.repeat(a, 2, axis=-1)
    return wide[..., ::2]


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("make", [lambda a: ShapeOnly(a.shape), _strided, _readonly],
                         ids=["shape-only object", "strided NumPy", "read-only NumPy"])
def test_compiled_op_answers_non_tensor_inputs_with_a_named_error(make):
    """Either accepted (and then right) or a ValueError/TypeError naming the op and 'x'."""
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=I, cell_size=H)
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=I, H=H)
    args = {n: tvm.runtime.tensor(v) for n, v in inputs.items()}
    try:
        out = fn(**{**args, "x": make(inputs["x"])})
    except (ValueError, TypeError) as err:
        assert re.match(_names("LSTMBlockCell", "x"), str(err)), str(err)
        return
    testing.assert_close(out.h.numpy(), reference.run("LSTMBlockCell", inputs, {})["h"],
                         "float32", "h")


def test_compiled_op_answers_non_tensor_out_with_a_type_error():
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=I, cell_size=H)
    with pytest.raises(TypeError, match="^LSTMBlockCell: .*out"):
        fn(**_tvm_inputs("LSTMBlockCell", B=2), out=[None] * 7)


@pytest.mark.parametrize("target", [123, "nonsense"], ids=repr)
def test_compile_names_the_op_for_a_bad_target(target):
    with pytest.raises((ValueError, TypeError), match="^LSTMBlockCell: .*target"):
        lstm_tvm.compile("LSTMBlockCell", input_size=I, cell_size=H, target=target)


@pytest.mark.parametrize("case", ["dtype", "input size"])
def test_compiled_op_mismatch_messages_name_the_input(case):
    fn = lstm_tvm.compile("LSTMBlockCell", input_size=I, cell_size=H)
    if case == "dtype":
        inputs = testing.make_inputs("LSTMBlockCell", dtype="float16", B=2, I=I, H=H)
    else:
        inputs = testing.make_inputs("LSTMBlockCell", B=2, I=I + 1, H=H)
    with pytest.raises((ValueError, TypeError), match=_names("LSTMBlockCell", "x")):
        fn(**{n: tvm.runtime.tensor(v) for n, v in inputs.items()})


# --- valgrind (slow) -------------------------------------------------------------------------

#: valgrind 3.19 cannot decode AVX-512, which kernels for this host (mcpu of the host, e.g.
#: znver4 or rocketlake) use: the same kernels are built for an AVX2 CPU instead (same TIR, same
#: schedule rules; only the vector width of the generated code differs).
VALGRIND_TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
VALGRIND_ERRORS = 99  # --error-exitcode: tells "valgrind saw something" from a Python failure

_VALGRIND_CHILD = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # tvm_ffi imports torch when present: minutes under valgrind
    import ctypes, json
    import numpy as np
    import tvm_ffi
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)  # libtvm_runtime: TVMBackend* functions

    def aligned(shape, dtype):  # TVM wants 64-byte aligned data
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        buf = np.empty(n + 64, np.uint8)
        off = (-buf.ctypes.data) % 64
        return buf[off:off + n].view(dtype).reshape(shape)

    for job in json.load(open(sys.argv[1])):
        fn = tvm_ffi.load_module(job["so"])[job["func"]]
        data = np.load(job["npz"])
        ins = []
        for name in job["inputs"]:
            a = aligned(data[name].shape, data[name].dtype)
            a[...] = data[name]
            ins.append(a)
        if job.get("overrun"):  # the positive control: 'x' claims its shape over 1 element
            small = aligned((1,), ins[0].dtype)
            ins[0] = np.lib.stride_tricks.as_strided(small, ins[0].shape, ins[0].strides)
        outs = {n: aligned(s, job["dtype"]) for n, s in job["outputs"].items()}
        for a in outs.values():
            a[...] = np.nan  # an output the kernel does not write shows up against the reference
        args = [tvm_ffi.from_dlpack(a) for a in ins + list(outs.values())]
        if job["seq_len_max"] is not None:
            args.insert(0, job["seq_len_max"])
        fn(*args)
        np.savez(job["out"], **outs)
        print("RAN", job["func"], flush=True)
    print("DONE", flush=True)
""")


def _valgrind_jobs(tmp_path, cache):
    """Build each kernel for :data:`VALGRIND_TARGET` into ``cache``; write inputs and jobs."""
    jobs = []
    T, B, L = 4, 3, 3  # B not a multiple of the GEMM row tile; a padded step (L < T)
    for op_name in ("LSTMBlockCell", "LSTMBlockCellGrad", "BlockLSTM", "BlockLSTMGrad"):
        op = OPS[op_name]
        seq = op.kind == "sequence"
        attrs = {"use_peephole": True, **({"cell_clip": 0.5} if op.direction == "forward" else {})}
        for dtype in ("float32", "float16"):
            spec = build.make_spec(op_name, dtype, I, H, validate_attrs(op, attrs),
                                   VALGRIND_TARGET)
            build._load_or_build(spec)
            inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H,
                                         T=T if seq else None, seq_len_max=L if seq else None,
                                         attrs=attrs, seed=1)
            npz = tmp_path / f"{op_name}-{dtype}.npz"
            np.savez(npz, **{n: v for n, v in inputs.items() if n != "seq_len_max"})
            jobs.append({
                "op": op_name, "attrs": attrs, "so": str(build.cache_path(spec)),
                "func": spec.func_name, "dtype": dtype, "npz": str(npz),
                "inputs": [n for n in op.input_names if n != "seq_len_max"],
                "seq_len_max": L if seq else None, "out": str(npz).replace(".npz", "-out.npz"),
                "outputs": {t.name: t.concrete_shape(dict(T=T, B=B, I=I, H=H))
                            for t in op.outputs}})
    return jobs


def _valgrind(tmp_path, name, jobs, cache):
    """Run the jobs under valgrind; returns (stdout, errors whose stack is in a kernel)."""
    import xml.etree.ElementTree as ET

    jobs_file, xml_file = tmp_path / f"{name}.json", tmp_path / f"{name}.xml"
    jobs_file.write_text(json.dumps(jobs))
    runtime = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime.so")
    env = {**os.environ, "PYTHONMALLOC": "malloc", "TVM_NUM_THREADS": "2"}
    cmd = ["valgrind", f"--error-exitcode={VALGRIND_ERRORS}", "--leak-check=no",
           "--num-callers=40", "--xml=yes", f"--xml-file={xml_file}",
           os.path.realpath(sys.executable), "-c", _VALGRIND_CHILD, str(jobs_file), runtime]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, VALGRIND_ERRORS) and "DONE" in done.stdout, (
        f"valgrind child exited with {done.returncode}\n{done.stderr[-4000:]}")
    kernel_errors = []
    for error in ET.parse(xml_file).getroot().iter("error"):
        kind = error.findtext("kind")
        frames = error.find("stack").findall("frame")
        objs = [f.findtext("obj") or "" for f in frames]
        if not kind.startswith("Leak_") and any(o.startswith(os.path.realpath(cache))
                                                for o in objs):
            kernel_errors.append(f"{kind}: " + " <- ".join(
                f"{f.findtext('fn') or '?'} ({os.path.basename(o)})"
                for f, o in zip(frames[:6], objs)))
    return done.stdout, kernel_errors


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_kernels_run_clean_under_valgrind(tmp_path, monkeypatch):
    """Cell and sequence kernels, forward and grad, float32 and float16, under memcheck.

    The child is a bare Python that loads only the compiled libraries (``tvm_ffi`` and TVM's
    runtime library, not the compiler) and calls them on NumPy buffers: no compile runs under
    valgrind. CPython, NumPy and the dynamic loader report errors of their own under memcheck
    (uninitialised-value reports from CPython's small-int and GC paths, ``strncmp`` in ld.so),
    which depend on the Python build and no suppression file covers reliably. So every error is
    recorded as XML and only those with a frame in a kernel library (an object file in the cache
    folder) count: an invalid read or write, or a branch on uninitialised memory, in kernel code
    or anything it calls (TVM's workspace allocator, its thread pool, ``memset``, ``expf``) has
    the kernel on its stack. A positive control (a tensor whose buffer is smaller than its
    shape) proves the filter finds kernel errors. Outputs are also checked against the
    reference, with NaN-filled output buffers so that an unwritten element shows.
    """
    cache = tmp_path / "cache"
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(cache))
    jobs = _valgrind_jobs(tmp_path, cache)
    control = [dict(j, overrun=True, out=j["out"].replace("-out", "-control"))
               for j in jobs if j["op"] == "BlockLSTM" and j["dtype"] == "float32"]
    start = time.perf_counter()
    _, control_errors = _valgrind(tmp_path, "control", control, cache)
    assert any(e.startswith("InvalidRead") for e in control_errors), (
        "the positive control found no invalid read in the kernel: the filter is blind")
    out, errors = _valgrind(tmp_path, "kernels", jobs, cache)
    print(f"\nvalgrind: {len(jobs)} kernels in {time.perf_counter() - start:.0f} s (with the "
          f"control); errors in kernel code: {len(errors)}; control: {len(control_errors)}")
    assert not errors, "\n".join(errors[:20])
    assert out.count("RAN") == len(jobs)
    for job in jobs:
        inputs = dict(np.load(job["npz"]))
        if job["seq_len_max"] is not None:
            inputs["seq_len_max"] = job["seq_len_max"]
        ref = reference.run(job["op"], inputs, job["attrs"])
        got = np.load(job["out"])
        for name in job["outputs"]:
            testing.assert_close(got[name], ref[name], job["dtype"], f"{job['func']}.{name}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
