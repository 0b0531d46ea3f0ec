"""Kernel of the matmul part of a cell's gradient (what TF's Python gradient of
``LSTMBlockCell`` computes around ``LSTMBlockCellGrad``).

From ``dicfo`` (B, 4H): ``xh_grad = dicfo @ w^T`` split into ``x_grad`` (B, I) and
``h_prev_grad`` (B, H); ``w_grad = [x, h_prev]^T @ dicfo``; ``b_grad = sum_b dicfo``.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec, TensorSpec
from ._builder import T, gemm, kernel, padded, reduction, spatial, temp, zero
from ._gates import f32, store

#: The helper described like a registry op (it is not a TF op, so it is not in ``OPS``).
SPEC = OpSpec(
    name="CellGradMatmul", kind="cell", direction="backward", gate_layout="ICFO",
    pair="LSTMBlockCellGrad",
    inputs=(TensorSpec("x", ("B", "I")), TensorSpec("h_prev", ("B", "H")),
            TensorSpec("w", ("I+H", "4H")), TensorSpec("dicfo", ("B", "4H"))),
    outputs=(TensorSpec("x_grad", ("B", "I")), TensorSpec("h_prev_grad", ("B", "H")),
             TensorSpec("w_grad", ("I+H", "4H")), TensorSpec("b_grad", ("4H",))),
    attrs=(), doc="The matmul part of LSTMBlockCell's gradient.",
)
INPUTS, OUTPUTS = SPEC.input_names, SPEC.output_names


def cell_grad_matmul(dtype: str, input_size: int, cell_size: int):
    """The helper's kernel: inputs :data:`INPUTS`, outputs :data:`OUTPUTS`."""
    I, H = input_size, cell_size
    G = 4 * H
    with kernel(SPEC, dtype, I, H) as (buf, size, builder):
        B = size["B"]
        dicfo = buf["dicfo"]
        xhg, wg, bg = temp("xhg", (padded(B), I + H)), temp("wg", (I + H, G)), temp("bg", (G,))
        w_t, d_pad = temp("w_t", (G, I + H)), temp("dicfo_pad", (padded(B), G))
        spatial("w_t", (G, I + H), lambda j, k: T.buffer_store(w_t, f32(buf["w"][k, j]), [j, k]))
        spatial("dicfo_pad", (padded(B), G), lambda n, j: T.buffer_store(
            d_pad, tirx.if_then_else(n < B, f32(dicfo[n, j]), zero()), [n, j]))
        gemm("xh_grad", xhg, B, I + H, G, lambda n, j: d_pad[n, j], lambda j, k: w_t[j, k])
        gemm("w_grad", wg, I + H, G, B,
             lambda k, n: tirx.if_then_else(
                 k < I, f32(buf["x"][n, k]), f32(buf["h_prev"][n, k - I])),
             lambda n, j: f32(dicfo[n, j]), pad=False)
        reduction("b_grad", bg, (G,), (B,), lambda j: (j,),
                  lambda s, r: f32(buf["dicfo"][r[0], s[0]]))
        spatial("x_grad_out", (B, I), lambda n, k: T.buffer_store(
            buf["x_grad"], store(xhg[n, k], dtype), [n, k]))
        spatial("h_prev_grad_out", (B, H), lambda n, k: T.buffer_store(
            buf["h_prev_grad"], store(xhg[n, I + k], dtype), [n, k]))
        # A reduction over an empty batch never ran its init.
        spatial("w_grad_out", (I + H, G), lambda k, j: T.buffer_store(
            buf["w_grad"], tirx.if_then_else(B > 0, store(wg[k, j], dtype), zero(dtype)), [k, j]))
        spatial("b_grad_out", (G,), lambda j: T.buffer_store(
            buf["b_grad"], tirx.if_then_else(B > 0, store(bg[j], dtype), zero(dtype)), [j]))
    return builder.get()
