"""TIR kernel of the sequence forward ops ``BlockLSTM`` and ``BlockLSTMV2``.

The input projection ``x @ w[:I] + b`` for all steps is one GEMM (block ``xw``); the time
loop (block ``step``) then runs, per step, the recurrent product ``h @ w[I:]`` (block
``gates``) and the fused gate math (block ``cell``); block ``state_update`` reloads the
stored ``h`` and ``cs`` (rounded to the storage dtype, as TF feeds them back) as the next
step's float32 state. Steps ``t >= seq_len_max`` are zero in every output (block ``pad``).
"""

from __future__ import annotations

from .._tvm import T
from ..registry import OpSpec, forget_bias_of
from ._gates import ACC, CellConfig, cell_forward, f32, gate_offsets, store


def block_lstm(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``BlockLSTM`` / ``BlockLSTMV2`` over ``seq_len_max`` steps; symbolic ``T`` and ``B``."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    oi, oc, of, oo = off["i"], off["c"], off["f"], off["o"]
    cfg = CellConfig(forget_bias_of(op, attrs), attrs["cell_clip"], attrs["use_peephole"])

    @T.prim_func(s_tir=True)
    def func(seq_len_max: T.int64, x_h: T.handle, cs_prev_h: T.handle, h_prev_h: T.handle,
             w_h: T.handle, wci_h: T.handle, wcf_h: T.handle, wco_h: T.handle, b_h: T.handle,
             i_h: T.handle, cs_h: T.handle, f_h: T.handle, o_h: T.handle,
             ci_h: T.handle, co_h: T.handle, h_h: T.handle):
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
        xw = T.alloc_buffer((Tn, Bn, G), ACC)
        gates = T.alloc_buffer((Bn, G), ACC)
        h_state = T.alloc_buffer((Bn, H), ACC)
        cs_state = T.alloc_buffer((Bn, H), ACC)
        for t, n, j, k in T.grid(seq_len_max, Bn, G, I):
            with T.sblock("xw"):
                vt, vb, vj, vk = T.axis.remap("SSSR", [t, n, j, k])
                with T.init():
                    xw[vt, vb, vj] = f32(b[vj])
                xw[vt, vb, vj] = xw[vt, vb, vj] + f32(x[vt, vb, vk]) * f32(w[vk, vj])
        for n, k in T.grid(Bn, H):
            with T.sblock("state_init"):
                vb, vk = T.axis.remap("SS", [n, k])
                h_state[vb, vk] = f32(h_prev[vb, vk])
                cs_state[vb, vk] = f32(cs_prev[vb, vk])
        for t in T.serial(seq_len_max):
            with T.sblock("step"):
                vt = T.axis.opaque(Tn, t)
                T.reads(xw[vt, 0:Bn, 0:G], w[I:I + H, 0:G], h_state[0:Bn, 0:H],
                        cs_state[0:Bn, 0:H], wci[0:H], wcf[0:H], wco[0:H], gates[0:Bn, 0:G],
                        cs[vt, 0:Bn, 0:H], h[vt, 0:Bn, 0:H])
                T.writes(gates[0:Bn, 0:G], h_state[0:Bn, 0:H], cs_state[0:Bn, 0:H],
                         i[vt, 0:Bn, 0:H], cs[vt, 0:Bn, 0:H], f[vt, 0:Bn, 0:H],
                         o[vt, 0:Bn, 0:H], ci[vt, 0:Bn, 0:H], co[vt, 0:Bn, 0:H],
                         h[vt, 0:Bn, 0:H])
                for n, j, k in T.grid(Bn, G, H):
                    with T.sblock("gates"):
                        vb, vj, vk = T.axis.remap("SSR", [n, j, k])
                        with T.init():
                            gates[vb, vj] = xw[vt, vb, vj]
                        gates[vb, vj] = gates[vb, vj] + h_state[vb, vk] * f32(w[I + vk, vj])
                for n, k in T.grid(Bn, H):
                    with T.sblock("cell"):
                        vb, vk = T.axis.remap("SS", [n, k])
                        vi, vcs, vf, vo, vci, vco, vh = T.meta_var(cell_forward(
                            cfg, gates[vb, oi + vk], gates[vb, oc + vk], gates[vb, of + vk],
                            gates[vb, oo + vk], cs_state[vb, vk],
                            f32(wci[vk]), f32(wcf[vk]), f32(wco[vk])))
                        i[vt, vb, vk] = store(vi, dtype)
                        cs[vt, vb, vk] = store(vcs, dtype)
                        f[vt, vb, vk] = store(vf, dtype)
                        o[vt, vb, vk] = store(vo, dtype)
                        ci[vt, vb, vk] = store(vci, dtype)
                        co[vt, vb, vk] = store(vco, dtype)
                        h[vt, vb, vk] = store(vh, dtype)
                for n, k in T.grid(Bn, H):
                    with T.sblock("state_update"):
                        vb, vk = T.axis.remap("SS", [n, k])
                        h_state[vb, vk] = f32(h[vt, vb, vk])
                        cs_state[vb, vk] = f32(cs[vt, vb, vk])
        for t, n, k in T.grid(Tn - seq_len_max, Bn, H):
            with T.sblock("pad"):
                vt, vb, vk = T.axis.remap("SSS", [t, n, k])
                i[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                cs[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                f[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                o[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                ci[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                co[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)
                h[seq_len_max + vt, vb, vk] = T.Cast(dtype, 0)

    return func
