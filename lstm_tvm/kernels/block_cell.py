"""TIR kernels of the one-step ops: ``LSTMBlockCell`` and ``LSTMBlockCellGrad``.

Each builder returns an unscheduled ``s_tir`` PrimFunc whose parameters are the op's inputs
then its outputs, in the registry's order (destination-passing style), with a symbolic batch.
Blocks are named so that the schedules in :mod:`lstm_tvm.schedule` can find them.
"""

from __future__ import annotations

from .._tvm import T
from ..registry import OpSpec, forget_bias_of
from ._gates import ACC, CellConfig, cell_backward, cell_forward, f32, gate_offsets, store


def lstm_block_cell(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``LSTMBlockCell``: ``g = [x, h_prev] @ w + b``, then the gate math of one step."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    oi, oc, of, oo = off["i"], off["c"], off["f"], off["o"]
    cfg = CellConfig(forget_bias_of(op, attrs), attrs["cell_clip"], attrs["use_peephole"])

    @T.prim_func(s_tir=True)
    def func(x_h: T.handle, cs_prev_h: T.handle, h_prev_h: T.handle, w_h: T.handle,
             wci_h: T.handle, wcf_h: T.handle, wco_h: T.handle, b_h: T.handle,
             i_h: T.handle, cs_h: T.handle, f_h: T.handle, o_h: T.handle,
             ci_h: T.handle, co_h: T.handle, h_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        Bn = T.int64()
        x = T.match_buffer(x_h, (Bn, I), dtype)
        cs_prev = T.match_buffer(cs_prev_h, (Bn, H), dtype)
        h_prev = T.match_buffer(h_prev_h, (Bn, H), dtype)
        w = T.match_buffer(w_h, (I + H, G), dtype)
        wci = T.match_buffer(wci_h, (H,), dtype)
        wcf = T.match_buffer(wcf_h, (H,), dtype)
        wco = T.match_buffer(wco_h, (H,), dtype)
        b = T.match_buffer(b_h, (G,), dtype)
        i = T.match_buffer(i_h, (Bn, H), dtype)
        cs = T.match_buffer(cs_h, (Bn, H), dtype)
        f = T.match_buffer(f_h, (Bn, H), dtype)
        o = T.match_buffer(o_h, (Bn, H), dtype)
        ci = T.match_buffer(ci_h, (Bn, H), dtype)
        co = T.match_buffer(co_h, (Bn, H), dtype)
        h = T.match_buffer(h_h, (Bn, H), dtype)
        xw = T.alloc_buffer((Bn, G), ACC)
        gates = T.alloc_buffer((Bn, G), ACC)
        for n, j, k in T.grid(Bn, G, I):
            with T.sblock("xw"):
                vb, vj, vk = T.axis.remap("SSR", [n, j, k])
                with T.init():
                    xw[vb, vj] = f32(b[vj])
                xw[vb, vj] = xw[vb, vj] + f32(x[vb, vk]) * f32(w[vk, vj])
        for n, j, k in T.grid(Bn, G, H):
            with T.sblock("gates"):
                vb, vj, vk = T.axis.remap("SSR", [n, j, k])
                with T.init():
                    gates[vb, vj] = xw[vb, vj]
                gates[vb, vj] = gates[vb, vj] + f32(h_prev[vb, vk]) * f32(w[I + vk, vj])
        for n, k in T.grid(Bn, H):
            with T.sblock("cell"):
                vb, vk = T.axis.remap("SS", [n, k])
                vi, vcs, vf, vo, vci, vco, vh = T.meta_var(cell_forward(
                    cfg, gates[vb, oi + vk], gates[vb, oc + vk], gates[vb, of + vk],
                    gates[vb, oo + vk], f32(cs_prev[vb, vk]),
                    f32(wci[vk]), f32(wcf[vk]), f32(wco[vk])))
                i[vb, vk] = store(vi, dtype)
                cs[vb, vk] = store(vcs, dtype)
                f[vb, vk] = store(vf, dtype)
                o[vb, vk] = store(vo, dtype)
                ci[vb, vk] = store(vci, dtype)
                co[vb, vk] = store(vco, dtype)
                h[vb, vk] = store(vh, dtype)

    return func


def lstm_block_cell_grad(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``LSTMBlockCellGrad``: ``dicfo``, ``cs_prev_grad`` and the peephole gradients of one step."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    oi, oc, of, oo = off["i"], off["c"], off["f"], off["o"]
    peep = bool(attrs["use_peephole"])

    @T.prim_func(s_tir=True)
    def func(x_h: T.handle, cs_prev_h: T.handle, h_prev_h: T.handle, w_h: T.handle,
             wci_h: T.handle, wcf_h: T.handle, wco_h: T.handle, b_h: T.handle,
             i_h: T.handle, cs_h: T.handle, f_h: T.handle, o_h: T.handle,
             ci_h: T.handle, co_h: T.handle, cs_grad_h: T.handle, h_grad_h: T.handle,
             cs_prev_grad_h: T.handle, dicfo_h: T.handle,
             wci_grad_h: T.handle, wcf_grad_h: T.handle, wco_grad_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        Bn = T.int64()
        x = T.match_buffer(x_h, (Bn, I), dtype)
        cs_prev = T.match_buffer(cs_prev_h, (Bn, H), dtype)
        h_prev = T.match_buffer(h_prev_h, (Bn, H), dtype)
        w = T.match_buffer(w_h, (I + H, G), dtype)
        wci = T.match_buffer(wci_h, (H,), dtype)
        wcf = T.match_buffer(wcf_h, (H,), dtype)
        wco = T.match_buffer(wco_h, (H,), dtype)
        b = T.match_buffer(b_h, (G,), dtype)
        i = T.match_buffer(i_h, (Bn, H), dtype)
        cs = T.match_buffer(cs_h, (Bn, H), dtype)
        f = T.match_buffer(f_h, (Bn, H), dtype)
        o = T.match_buffer(o_h, (Bn, H), dtype)
        ci = T.match_buffer(ci_h, (Bn, H), dtype)
        co = T.match_buffer(co_h, (Bn, H), dtype)
        cs_grad = T.match_buffer(cs_grad_h, (Bn, H), dtype)
        h_grad = T.match_buffer(h_grad_h, (Bn, H), dtype)
        cs_prev_grad = T.match_buffer(cs_prev_grad_h, (Bn, H), dtype)
        dicfo = T.match_buffer(dicfo_h, (Bn, G), dtype)
        wci_grad = T.match_buffer(wci_grad_h, (H,), dtype)
        wcf_grad = T.match_buffer(wcf_grad_h, (H,), dtype)
        wco_grad = T.match_buffer(wco_grad_h, (H,), dtype)
        d4 = T.alloc_buffer((Bn, G), ACC)
        pci = T.alloc_buffer((H,), ACC)
        pcf = T.alloc_buffer((H,), ACC)
        pco = T.alloc_buffer((H,), ACC)
        ran_peep = T.meta_var(Bn > 0 and peep)
        for n, k in T.grid(Bn, H):
            with T.sblock("cell_grad"):
                vb, vk = T.axis.remap("SS", [n, k])
                di, dci, df, do, dcp = T.meta_var(cell_backward(
                    peep, f32(i[vb, vk]), f32(cs[vb, vk]), f32(f[vb, vk]), f32(o[vb, vk]),
                    f32(ci[vb, vk]), f32(co[vb, vk]), f32(cs_prev[vb, vk]),
                    f32(cs_grad[vb, vk]), f32(h_grad[vb, vk]),
                    f32(wci[vk]), f32(wcf[vk]), f32(wco[vk])))
                d4[vb, oi + vk] = di
                d4[vb, oc + vk] = dci
                d4[vb, of + vk] = df
                d4[vb, oo + vk] = do
                cs_prev_grad[vb, vk] = store(dcp, dtype)
        for n, j in T.grid(Bn, G):
            with T.sblock("dicfo"):
                vb, vj = T.axis.remap("SS", [n, j])
                dicfo[vb, vj] = store(d4[vb, vj], dtype)
        if peep:
            for k, n in T.grid(H, Bn):
                with T.sblock("wci_grad"):
                    vk, vb = T.axis.remap("SR", [k, n])
                    with T.init():
                        pci[vk] = T.float32(0)
                    pci[vk] = pci[vk] + d4[vb, oi + vk] * f32(cs_prev[vb, vk])
            for k, n in T.grid(H, Bn):
                with T.sblock("wcf_grad"):
                    vk, vb = T.axis.remap("SR", [k, n])
                    with T.init():
                        pcf[vk] = T.float32(0)
                    pcf[vk] = pcf[vk] + d4[vb, of + vk] * f32(cs_prev[vb, vk])
            for k, n in T.grid(H, Bn):
                with T.sblock("wco_grad"):
                    vk, vb = T.axis.remap("SR", [k, n])
                    with T.init():
                        pco[vk] = T.float32(0)
                    pco[vk] = pco[vk] + d4[vb, oo + vk] * f32(cs[vb, vk])
        for k in range(H):
            with T.sblock("peephole_grad_out"):
                vk = T.axis.remap("S", [k])
                # A reduction over an empty batch never ran its init.
                wci_grad[vk] = T.if_then_else(ran_peep, store(pci[vk], dtype), T.Cast(dtype, 0))
                wcf_grad[vk] = T.if_then_else(ran_peep, store(pcf[vk], dtype), T.Cast(dtype, 0))
                wco_grad[vk] = T.if_then_else(ran_peep, store(pco[vk], dtype), T.Cast(dtype, 0))

    return func
