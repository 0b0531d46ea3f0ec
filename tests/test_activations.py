"""The vectorisable exp, sigmoid and tanh of the gate math against float64 NumPy.

Each is compiled into a one-block kernel, vectorised as the gate blocks are, and run on random
arguments over the ranges that occur (and beyond), then on special values. Bounds: exp within
2 ulp (Cephes' expf), sigmoid and tanh within 6 ulp of the float32-rounded true value
(Eigen's tanh approximation is ~5 ulp); absolute error near zero within float32's spacing there.
"""

import numpy as np
import pytest

from lstm_tvm._tvm import TB as T
import tvm_ffi

from lstm_tvm._tvm import IRBuilder, Schedule, tirx, tvm
from lstm_tvm.kernels import _activations

N = 1 << 16
LANES = 16


def _scheduled(fn):
    with IRBuilder() as ib, T.prim_func(s_tir=True):
        T.func_name("f")
        a = T.arg("a", T.Buffer((N,), "float32"))
        b = T.arg("b", T.Buffer((N,), "float32"))
        with T.grid(N) as i, T.sblock("act"):
            vi = T.axis.remap("S", [i])
            T.buffer_store(b, fn(a[vi]), [vi])
    sch = Schedule(ib.get())
    (loop,) = sch.get_loops(sch.get_sblock("act"))
    sch.vectorize(sch.split(loop, [None, LANES])[1])
    return sch.mod


def _compile(fn):
    return tvm.compile(_scheduled(fn), target={"kind": "llvm"})["f"]


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh"])
def test_a_vectorised_loop_stays_vector_arithmetic(name):
    """TVM's vectoriser runs a loop's lanes one by one where it meets an expression it cannot
    widen (``isnan`` was one: the gate math then relied on LLVM to vectorise it again)."""
    target = tvm.target.Target({"kind": "llvm"})
    mod = tirx.transform.BindTarget(target.with_host(target))(
        _scheduled(getattr(_activations, name)))
    lowered = tirx.get_default_tir_pipeline(target)[0](mod)
    stored = []
    tvm_ffi.structural_walk(lowered, [(tirx.BufferStore,
                                       lambda node: stored.append(str(node.value.ty)))])
    assert stored and set(stored) == {f"float32x{LANES}"}


def _run(fn, x: np.ndarray) -> np.ndarray:
    padded = np.zeros(N, np.float32)
    padded[: x.size] = x
    out = tvm.runtime.tensor(np.zeros(N, np.float32))
    _compile(fn)(tvm.runtime.tensor(padded), out)
    return out.numpy()[: x.size]


def _args(lo, hi):
    rng = np.random.default_rng(7)
    half = N // 2
    mags = np.geomspace(1e-8, max(abs(lo), abs(hi)), N - half)
    signs = np.where(np.arange(mags.size) % 2, 1, -1)
    x = np.concatenate([rng.uniform(lo, hi, half), mags * signs])
    return np.clip(x, lo, hi).astype(np.float32)


CASES = {
    "exp": (_activations.exp, np.exp, (-87.0, 88.0), 2),
    "sigmoid": (_activations.sigmoid, lambda v: 1 / (1 + np.exp(-v)), (-40.0, 40.0), 6),
    "tanh": (_activations.tanh, np.tanh, (-20.0, 20.0), 6),
}


@pytest.mark.parametrize("name", CASES)
def test_accuracy_against_float64(name):
    fn, ref, (lo, hi), ulps = CASES[name]
    x = _args(lo, hi)
    got = _run(fn, x).astype(np.float64)
    want = ref(x.astype(np.float64))
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    # Values below float32's normal range have denormal spacing; bound those absolutely.
    bound = ulps * np.maximum(spacing, np.finfo(np.float32).tiny)
    err = np.abs(got - want)
    worst = int(np.argmax(err / bound))
    assert np.all(err <= bound), (f"{name}({x[worst]!r}) = {got[worst]!r}, float64 "
                                  f"{want[worst]!r}: {err[worst] / spacing[worst]:.2f} ulp")


SPECIALS = np.array([np.inf, -np.inf, np.nan, 0.0, 100.0, -100.0, 89.0, -89.0, 1e-30], np.float32)


@pytest.mark.parametrize("name", CASES)
def test_special_values(name):
    """Infinities saturate (exp overflows to inf, so sigmoid(-inf) is exactly 0 as in TF),
    NaN stays NaN, and arguments beyond the fitted ranges give the limits."""
    fn, ref, _, _ = CASES[name]
    with np.errstate(over="ignore", invalid="ignore"):
        want = ref(SPECIALS.astype(np.float64)).astype(np.float32)
    got = _run(fn, SPECIALS)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)
