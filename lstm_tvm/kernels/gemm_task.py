"""A GEMM block alone in a PrimFunc, as the kernels emit it: what a tuning task measures."""

from __future__ import annotations

from .._tvm import IRBuilder, TB as T
from ._builder import KernelBuilder
from ._gates import f32
from .contract import PANEL

__all__ = ["gemm_func"]


def gemm_func(name: str, M: int, N: int, K: int, a: str, b: str, attrs: dict):
    """The PrimFunc ``main(a, b, c)`` with one GEMM block ``name``:
    ``c[m, n] = sum_k a(m, k) * b(k, n)`` in float32 over constant ``M x N x K``. ``a`` and
    ``b`` are ``"<layout>:<dtype>"`` (layouts as :class:`~.contract.GemmBlock` names them);
    ``attrs`` are added to the function's attributes."""
    a_layout, a_dtype = a.split(":")
    b_layout, b_dtype = b.split(":")
    a_shape = (M, K) if a_layout == "mk" else (K, M)
    b_shape = {"kn": (K, N), "nk": (N, K), "kp": (N // PANEL, K, PANEL)}[b_layout]
    b_load = {"kn": lambda b, k, n: b[k, n], "nk": lambda b, k, n: b[n, k],
              "kp": lambda b, k, n: b[n // PANEL, k, n % PANEL]}[b_layout]
    with IRBuilder() as builder, T.prim_func(s_tir=True):
        kb = KernelBuilder()
        T.func_name("main")
        T.func_attr({"tirx.noalias": True, **attrs})
        a_buf = T.arg("a", T.Buffer(a_shape, a_dtype))
        b_buf = T.arg("b", T.Buffer(b_shape, b_dtype))
        c = T.arg("c", T.Buffer((M, N), "float32"))
        kb.gemm(name, c, M, N, K,
                lambda m, k: f32(a_buf[m, k] if a_layout == "mk" else a_buf[k, m]),
                lambda k, n: f32(b_load(b_buf, k, n)), pad=False)
    return builder.get()
