"""TIR kernel of the matmul part of a cell's gradient (what TF's Python gradient of
``LSTMBlockCell`` computes around ``LSTMBlockCellGrad``).

From ``dicfo`` (B, 4H): ``xh_grad = dicfo @ w^T`` split into ``x_grad`` (B, I) and
``h_prev_grad`` (B, H); ``w_grad = [x, h_prev]^T @ dicfo``; ``b_grad = sum_b dicfo``.
"""

from __future__ import annotations

from .._tvm import T
from ._gates import ACC, f32, store

#: Inputs and outputs of the helper, in parameter order.
INPUTS = ("x", "h_prev", "w", "dicfo")
OUTPUTS = ("x_grad", "h_prev_grad", "w_grad", "b_grad")


def cell_grad_matmul(dtype: str, input_size: int, cell_size: int):
    """The helper's PrimFunc: inputs ``x, h_prev, w, dicfo``, outputs as :data:`OUTPUTS`."""
    I, H = input_size, cell_size
    G = 4 * H
    zero = T.float32(0)

    @T.prim_func(s_tir=True)
    def func(x_h: T.handle, h_prev_h: T.handle, w_h: T.handle, dicfo_h: T.handle,
             x_grad_h: T.handle, h_prev_grad_h: T.handle, w_grad_h: T.handle,
             b_grad_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        Bn = T.int64()
        x = T.match_buffer(x_h, (Bn, I), dtype)
        h_prev = T.match_buffer(h_prev_h, (Bn, H), dtype)
        w = T.match_buffer(w_h, (I + H, G), dtype)
        dicfo = T.match_buffer(dicfo_h, (Bn, G), dtype)
        x_grad = T.match_buffer(x_grad_h, (Bn, I), dtype)
        h_prev_grad = T.match_buffer(h_prev_grad_h, (Bn, H), dtype)
        w_grad = T.match_buffer(w_grad_h, (I + H, G), dtype)
        b_grad = T.match_buffer(b_grad_h, (G,), dtype)
        xhg = T.alloc_buffer((Bn, I + H), ACC)
        wg = T.alloc_buffer((I + H, G), ACC)
        bg = T.alloc_buffer((G,), ACC)
        for n, k, j in T.grid(Bn, I + H, G):
            with T.sblock("xh_grad"):
                vb, vk, vj = T.axis.remap("SSR", [n, k, j])
                with T.init():
                    xhg[vb, vk] = zero
                xhg[vb, vk] = xhg[vb, vk] + f32(dicfo[vb, vj]) * f32(w[vk, vj])
        for k, j, n in T.grid(I + H, G, Bn):
            with T.sblock("w_grad"):
                vk, vj, vb = T.axis.remap("SSR", [k, j, n])
                with T.init():
                    wg[vk, vj] = zero
                wg[vk, vj] = wg[vk, vj] + T.if_then_else(
                    vk < I, f32(x[vb, vk]), f32(h_prev[vb, vk - I])) * f32(dicfo[vb, vj])
        for j, n in T.grid(G, Bn):
            with T.sblock("b_grad"):
                vj, vb = T.axis.remap("SR", [j, n])
                with T.init():
                    bg[vj] = zero
                bg[vj] = bg[vj] + f32(dicfo[vb, vj])
        for n, k in T.grid(Bn, I):
            with T.sblock("x_grad_out"):
                vb, vk = T.axis.remap("SS", [n, k])
                x_grad[vb, vk] = store(xhg[vb, vk], dtype)
        for n, k in T.grid(Bn, H):
            with T.sblock("h_prev_grad_out"):
                vb, vk = T.axis.remap("SS", [n, k])
                h_prev_grad[vb, vk] = store(xhg[vb, I + vk], dtype)
        for k, j in T.grid(I + H, G):
            with T.sblock("w_grad_out"):
                vk, vj = T.axis.remap("SS", [k, j])
                w_grad[vk, vj] = T.if_then_else(Bn > 0, store(wg[vk, vj], dtype), T.Cast(dtype, 0))
        for j in range(G):
            with T.sblock("b_grad_out"):
                vj = T.axis.remap("S", [j])
                b_grad[vj] = T.if_then_else(Bn > 0, store(bg[vj], dtype), T.Cast(dtype, 0))

    return func
