"""TIR kernel of the sequence backward ops ``BlockLSTMGrad`` and ``BlockLSTMGradV2``.

Only the carry ``dh`` is truly serial. The time loop (block ``step``, t = seq_len_max-1..0)
runs the cell gradient (block ``cell_grad``, writing the stacked gate gradients ``dicfo`` and
the carried ``dcs``) and the recurrent product ``dh = dicfo_t @ w[I:]^T`` (block ``dh``).
``w`` is transposed once (block ``w_t``) so both products run along contiguous rows.
After the loop, ``x_grad`` and ``w_grad`` are each one GEMM over all steps
(``x_grad_gemm``, ``w_grad_x``, ``w_grad_h``), and ``b_grad`` and the peephole gradients
are reductions of ``dicfo``. Everything accumulates in float32.
"""

from __future__ import annotations

from .._tvm import T
from ..registry import OpSpec
from ._gates import ACC, cell_backward, f32, gate_offsets, store


def block_lstm_grad(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``BlockLSTMGrad`` / ``BlockLSTMGradV2``; symbolic ``T`` and ``B``."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    oi, oc, of, oo = off["i"], off["c"], off["f"], off["o"]
    peep = bool(attrs["use_peephole"])
    zero = T.float32(0)

    @T.prim_func(s_tir=True)
    def func(seq_len_max: T.int64, x_h: T.handle, cs_prev_h: T.handle, h_prev_h: T.handle,
             w_h: T.handle, wci_h: T.handle, wcf_h: T.handle, wco_h: T.handle, b_h: T.handle,
             i_h: T.handle, cs_h: T.handle, f_h: T.handle, o_h: T.handle,
             ci_h: T.handle, co_h: T.handle, h_h: T.handle,
             cs_grad_h: T.handle, h_grad_h: T.handle,
             x_grad_h: T.handle, cs_prev_grad_h: T.handle, h_prev_grad_h: T.handle,
             w_grad_h: T.handle, wci_grad_h: T.handle, wcf_grad_h: T.handle,
             wco_grad_h: T.handle, b_grad_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        Tn = T.int64()
        Bn = T.int64()
        x = T.match_buffer(x_h, (Tn, Bn, I), dtype)
        cs_prev = T.match_buffer(cs_prev_h, (Bn, H), dtype)
        h_prev = T.match_buffer(h_prev_h, (Bn, H), dtype)
        w = T.match_buffer(w_h, (I + H, G), dtype)
        wci = T.match_buffer(wci_h, (H,), dtype)
        wcf = T.match_buffer(wcf_h, (H,), dtype)
        wco = T.match_buffer(wco_h, (H,), dtype)
        b = T.match_buffer(b_h, (G,), dtype)
        i = T.match_buffer(i_h, (Tn, Bn, H), dtype)
        cs = T.match_buffer(cs_h, (Tn, Bn, H), dtype)
        f = T.match_buffer(f_h, (Tn, Bn, H), dtype)
        o = T.match_buffer(o_h, (Tn, Bn, H), dtype)
        ci = T.match_buffer(ci_h, (Tn, Bn, H), dtype)
        co = T.match_buffer(co_h, (Tn, Bn, H), dtype)
        h = T.match_buffer(h_h, (Tn, Bn, H), dtype)
        cs_grad = T.match_buffer(cs_grad_h, (Tn, Bn, H), dtype)
        h_grad = T.match_buffer(h_grad_h, (Tn, Bn, H), dtype)
        x_grad = T.match_buffer(x_grad_h, (Tn, Bn, I), dtype)
        cs_prev_grad = T.match_buffer(cs_prev_grad_h, (Bn, H), dtype)
        h_prev_grad = T.match_buffer(h_prev_grad_h, (Bn, H), dtype)
        w_grad = T.match_buffer(w_grad_h, (I + H, G), dtype)
        wci_grad = T.match_buffer(wci_grad_h, (H,), dtype)
        wcf_grad = T.match_buffer(wcf_grad_h, (H,), dtype)
        wco_grad = T.match_buffer(wco_grad_h, (H,), dtype)
        b_grad = T.match_buffer(b_grad_h, (G,), dtype)
        # Reductions over (t, b) never ran their init when seq_len_max * B == 0.
        ran = T.meta_var(seq_len_max * Bn > 0)
        ran_peep = T.meta_var(seq_len_max * Bn > 0 and peep)
        dicfo = T.alloc_buffer((Tn, Bn, G), ACC)
        dh = T.alloc_buffer((Bn, H), ACC)
        dcs = T.alloc_buffer((Bn, H), ACC)
        dcs_next = T.alloc_buffer((Bn, H), ACC)
        xg = T.alloc_buffer((Tn, Bn, I), ACC)
        wgx = T.alloc_buffer((I, G), ACC)
        wgh = T.alloc_buffer((H, G), ACC)
        bg = T.alloc_buffer((G,), ACC)
        pci = T.alloc_buffer((H,), ACC)
        pcf = T.alloc_buffer((H,), ACC)
        pco = T.alloc_buffer((H,), ACC)
        w_t = T.alloc_buffer((G, I + H), ACC)
        for j, k in T.grid(G, I + H):
            with T.sblock("w_t"):
                vj, vk = T.axis.remap("SS", [j, k])
                w_t[vj, vk] = f32(w[vk, vj])
        for n, k in T.grid(Bn, H):
            with T.sblock("state_init"):
                vb, vk = T.axis.remap("SS", [n, k])
                dh[vb, vk] = zero
                dcs[vb, vk] = zero
        for s in T.serial(seq_len_max):
            with T.sblock("step"):
                vt = T.axis.opaque(Tn, seq_len_max - 1 - s)
                T.reads(i[vt, 0:Bn, 0:H], cs[vt - 1:vt + 1, 0:Bn, 0:H], f[vt, 0:Bn, 0:H],
                        o[vt, 0:Bn, 0:H], ci[vt, 0:Bn, 0:H], co[vt, 0:Bn, 0:H],
                        cs_prev[0:Bn, 0:H], cs_grad[vt, 0:Bn, 0:H], h_grad[vt, 0:Bn, 0:H],
                        wci[0:H], wcf[0:H], wco[0:H], w_t[0:G, I:I + H],
                        dh[0:Bn, 0:H], dcs[0:Bn, 0:H], dcs_next[0:Bn, 0:H],
                        dicfo[vt, 0:Bn, 0:G])
                T.writes(dicfo[vt, 0:Bn, 0:G], dh[0:Bn, 0:H], dcs[0:Bn, 0:H], dcs_next[0:Bn, 0:H])
                for n, k in T.grid(Bn, H):
                    with T.sblock("cell_grad"):
                        vb, vk = T.axis.remap("SS", [n, k])
                        di, dci, df, do, dcp = T.meta_var(cell_backward(
                            peep, f32(i[vt, vb, vk]), f32(cs[vt, vb, vk]), f32(f[vt, vb, vk]),
                            f32(o[vt, vb, vk]), f32(ci[vt, vb, vk]), f32(co[vt, vb, vk]),
                            T.if_then_else(vt > 0, f32(cs[vt - 1, vb, vk]), f32(cs_prev[vb, vk])),
                            f32(cs_grad[vt, vb, vk]) + dcs[vb, vk],
                            f32(h_grad[vt, vb, vk]) + dh[vb, vk],
                            f32(wci[vk]), f32(wcf[vk]), f32(wco[vk])))
                        dicfo[vt, vb, oi + vk] = di
                        dicfo[vt, vb, oc + vk] = dci
                        dicfo[vt, vb, of + vk] = df
                        dicfo[vt, vb, oo + vk] = do
                        dcs_next[vb, vk] = dcp
                for n, k in T.grid(Bn, H):
                    with T.sblock("dcs_update"):
                        vb, vk = T.axis.remap("SS", [n, k])
                        dcs[vb, vk] = dcs_next[vb, vk]
                for n, k, j in T.grid(Bn, H, G):
                    with T.sblock("dh"):
                        vb, vk, vj = T.axis.remap("SSR", [n, k, j])
                        with T.init():
                            dh[vb, vk] = zero
                        dh[vb, vk] = dh[vb, vk] + dicfo[vt, vb, vj] * w_t[vj, I + vk]
        for t, n, k, j in T.grid(seq_len_max, Bn, I, G):
            with T.sblock("x_grad_gemm"):
                vt, vb, vk, vj = T.axis.remap("SSSR", [t, n, k, j])
                with T.init():
                    xg[vt, vb, vk] = zero
                xg[vt, vb, vk] = xg[vt, vb, vk] + dicfo[vt, vb, vj] * w_t[vj, vk]
        for k, j, t, n in T.grid(I, G, seq_len_max, Bn):
            with T.sblock("w_grad_x"):
                vk, vj, vt, vb = T.axis.remap("SSRR", [k, j, t, n])
                with T.init():
                    wgx[vk, vj] = zero
                wgx[vk, vj] = wgx[vk, vj] + f32(x[vt, vb, vk]) * dicfo[vt, vb, vj]
        for k, j, t, n in T.grid(H, G, seq_len_max, Bn):
            with T.sblock("w_grad_h"):
                vk, vj, vt, vb = T.axis.remap("SSRR", [k, j, t, n])
                with T.init():
                    wgh[vk, vj] = zero
                wgh[vk, vj] = wgh[vk, vj] + T.if_then_else(
                    vt > 0, f32(h[vt - 1, vb, vk]), f32(h_prev[vb, vk])) * dicfo[vt, vb, vj]
        for j, t, n in T.grid(G, seq_len_max, Bn):
            with T.sblock("b_grad"):
                vj, vt, vb = T.axis.remap("SRR", [j, t, n])
                with T.init():
                    bg[vj] = zero
                bg[vj] = bg[vj] + dicfo[vt, vb, vj]
        if peep:
            for k, t, n in T.grid(H, seq_len_max, Bn):
                with T.sblock("wci_grad"):
                    vk, vt, vb = T.axis.remap("SRR", [k, t, n])
                    with T.init():
                        pci[vk] = zero
                    pci[vk] = pci[vk] + dicfo[vt, vb, oi + vk] * T.if_then_else(
                        vt > 0, f32(cs[vt - 1, vb, vk]), f32(cs_prev[vb, vk]))
            for k, t, n in T.grid(H, seq_len_max, Bn):
                with T.sblock("wcf_grad"):
                    vk, vt, vb = T.axis.remap("SRR", [k, t, n])
                    with T.init():
                        pcf[vk] = zero
                    pcf[vk] = pcf[vk] + dicfo[vt, vb, of + vk] * T.if_then_else(
                        vt > 0, f32(cs[vt - 1, vb, vk]), f32(cs_prev[vb, vk]))
            for k, t, n in T.grid(H, seq_len_max, Bn):
                with T.sblock("wco_grad"):
                    vk, vt, vb = T.axis.remap("SRR", [k, t, n])
                    with T.init():
                        pco[vk] = zero
                    pco[vk] = pco[vk] + dicfo[vt, vb, oo + vk] * f32(cs[vt, vb, vk])
        for t, n, k in T.grid(Tn, Bn, I):
            with T.sblock("x_grad_out"):
                vt, vb, vk = T.axis.remap("SSS", [t, n, k])
                x_grad[vt, vb, vk] = T.if_then_else(
                    vt < seq_len_max, store(xg[vt, vb, vk], dtype), T.Cast(dtype, 0))
        for n, k in T.grid(Bn, H):
            with T.sblock("state_grad_out"):
                vb, vk = T.axis.remap("SS", [n, k])
                cs_prev_grad[vb, vk] = store(dcs[vb, vk], dtype)
                h_prev_grad[vb, vk] = store(dh[vb, vk], dtype)
        for k, j in T.grid(I + H, G):
            with T.sblock("w_grad_out"):
                vk, vj = T.axis.remap("SS", [k, j])
                w_grad[vk, vj] = T.if_then_else(ran, store(T.if_then_else(
                    vk < I, wgx[vk, vj], wgh[vk - I, vj]), dtype), T.Cast(dtype, 0))
        for j in range(G):
            with T.sblock("b_grad_out"):
                vj = T.axis.remap("S", [j])
                b_grad[vj] = T.if_then_else(ran, store(bg[vj], dtype), T.Cast(dtype, 0))
        for k in range(H):
            with T.sblock("peephole_grad_out"):
                vk = T.axis.remap("S", [k])
                wci_grad[vk] = T.if_then_else(ran_peep, store(pci[vk], dtype), T.Cast(dtype, 0))
                wcf_grad[vk] = T.if_then_else(ran_peep, store(pcf[vk], dtype), T.Cast(dtype, 0))
                wco_grad[vk] = T.if_then_else(ran_peep, store(pco[vk], dtype), T.Cast(dtype, 0))

    return func
