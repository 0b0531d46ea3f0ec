"""Weights packed once for many calls: the panels a kernel copies ``w`` into, made by a
function of their own.

A sequence kernel copies ``w`` into float32 column panels
(:meth:`~._builder.KernelBuilder.panels`) at every call: 2 MiB at I=H=256, about a tenth of a
T=100, B=1 forward. A caller whose weights stay the same over many calls (a deployed model, as
ONNX Runtime packs its initializers once per session) builds the kernel prepacked
(:attr:`~.variant.KernelVariant.prepacked`): it then takes the panels as parameters between its
inputs and its outputs, and :func:`pack_kernel` fills them from ``w``, once."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from .._tvm import IRBuilder, TB as T
from ..registry import OpSpec
from ._builder import KernelBuilder, panel_layout, sizes_of
from .variant import KernelVariant
from ._gates import ACC, f32
from .contract import PANEL

__all__ = ["WeightPack", "pack_func_name", "pack_kernel", "weight_panels"]


@dataclasses.dataclass(frozen=True)
class WeightPack:
    """One float32 matrix of panels made from ``w``: ``value(w, r, c)`` for ``r < rows``,
    ``c < cols`` (``r`` the reduction index of the GEMM that reads it); ``transpose`` and
    ``panel`` (the panels' width) as for :meth:`~._builder.KernelBuilder.panels`."""

    name: str
    rows: int
    cols: int
    value: Callable
    transpose: bool = False
    panel: int = PANEL

    @property
    def shape(self) -> tuple:
        """The parameter's shape: :meth:`~._builder.KernelBuilder.panels`' layout."""
        return panel_layout(self.rows, self.cols, self.panel)[0]


def weight_panels(kb: KernelBuilder, buf: dict, pack: WeightPack):
    """The accessor ``(r, c) -> float32 load`` of ``pack``: the kernel's parameter of that name
    when ``kb`` builds a prepacked kernel, else panels copied from ``buf["w"]`` here (block
    ``pack.name``)."""
    if kb.prepacked:
        param, at = buf[pack.name], panel_layout(pack.rows, pack.cols, pack.panel)[1]
        return lambda r, c: param[at(r, c)]
    return kb.panels(pack.name, pack.rows, pack.cols,
                     lambda r, c: f32(pack.value(buf["w"], r, c)), transpose=pack.transpose,
                     panel=pack.panel)


def pack_func_name(op_name: str, dtype: str) -> str:
    """The name of the function that fills ``op_name``'s weight panels."""
    return f"lstm_tvm_{op_name}_{dtype}_pack"


def pack_kernel(op: OpSpec, dtype: str, input_size: int, cell_size: int,
                packs: Sequence[WeightPack], variant: KernelVariant):
    """The PrimFunc ``(w, *panels)`` that fills each of ``packs`` from ``op``'s ``w``, for the
    kernel form ``variant``."""
    spec = next(s for s in op.inputs if s.name == "w")
    with IRBuilder() as ir:
        kb = KernelBuilder(variant, ir)
        with T.prim_func(s_tir=True):
            T.func_name(pack_func_name(op.name, dtype))
            T.func_attr({"tirx.noalias": True})
            w = T.arg("w", T.Buffer(spec.concrete_shape(sizes_of(input_size, cell_size)),
                                    dtype, buffer_name="w", align=variant.input_align(dtype)))
            params = [T.arg(p.name, T.Buffer(p.shape, ACC, buffer_name=p.name)) for p in packs]
            for pack, param in zip(packs, params):
                kb.panels(pack.name, pack.rows, pack.cols,
                          lambda r, c, pack=pack: f32(pack.value(w, r, c)), scratch=param,
                          transpose=pack.transpose, panel=pack.panel)
    return kb.get()
