"""Kernel of the sequence forward ops ``BlockLSTM`` and ``BlockLSTMV2``.

The input projection ``x @ w[:I] + b`` for all steps is one GEMM over the ``T*B`` rows (block
``xw``, reading a float32 ``x`` in place, a float16 one widened once by block ``x_f32``; ``w``
is copied once into float32 column panels, block ``w_panels``, see :func:`panels`). The time
loop (block ``step``) then runs, per step, the recurrent product ``h @ w[I:]`` (block
``gates``) and the fused gate math (blocks ``gate_act`` and ``cell``, which also writes the
next float32 state; block ``state_update`` moves the new cell state in place). The state stays
in float32 between steps, unrounded even for float16 outputs (TF feeds back rounded values;
lstm_tvm is more accurate). Steps ``t >= seq_len_max`` are zero in every output (block
``pad``).
"""

from __future__ import annotations

from ..registry import OpSpec, forget_bias_of
from .._tvm import tirx
from ._builder import (ROW_TILE, T, by_work, flat, gemm, kernel, padded, panels, spatial,
                       step_gemm, step_views, temp, time_loop, zero)
from ._gates import ACC, CellConfig, f32, gate_offsets
from .block_cell import activation_scratch, cell_blocks

#: The forward outputs, all (T, B, H).
OUTPUTS = ("i", "cs", "f", "o", "ci", "co", "h")


def block_lstm(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``BlockLSTM`` / ``BlockLSTMV2`` over ``seq_len_max`` steps; symbolic ``T`` and ``B``."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    cfg = CellConfig(forget_bias_of(op, attrs), attrs["cell_clip"], attrs["use_peephole"])
    with kernel(op, dtype, I, H) as (buf, size, builder):
        L, Tn, B = buf["seq_len_max"], size["T"], size["B"]
        x = flat(buf["x"], Tn * B)
        xw = temp("xw", (Tn * B + ROW_TILE, G))
        gates, h_state = temp("gates", (padded(B), G)), temp("h_state", (padded(B), H))
        cs_state, cs_next = temp("cs_state", (B, H)), temp("cs_next", (B, H))
        acts = activation_scratch(B, H)
        w = panels("w_panels", I + H, G, lambda k, j: f32(buf["w"][k, j]))
        if dtype == ACC:
            # The padded rows read the last row again (a clamped index: a guarded load in
            # a GEMM operand keeps LLVM from holding the accumulators in registers); their
            # results are never used.
            def row(m, k):
                return x[tirx.min(m, L * B - 1), k]
        else:
            # Widened once, padded rows zero: the GEMMs then load float32, as for float32 (a
            # float16 left operand costs a conversion per element: xw at 100x64x512x512 ran
            # 30% slower).
            x16, x = x, temp("x_f32", (Tn * B + ROW_TILE, I))
            spatial("x_f32", (padded(L * B), I), lambda m, k: T.buffer_store(
                x, tirx.if_then_else(m < L * B, f32(x16[m, k]), zero()), [m, k]))

            def row(m, k):
                return x[m, k]
        gemm("xw", xw, L * B, G, I, row, w, init=lambda m, j: f32(buf["b"][j]))

        def init_state(n, k):
            T.buffer_store(h_state, f32(buf["h_prev"][n, k]), [n, k])
            T.buffer_store(cs_state, f32(buf["cs_prev"][n, k]), [n, k])

        def state_blocks():
            spatial("state_init", (B, H), init_state)
            spatial("state_pad", (padded(B) - B, H), lambda n, k: T.buffer_store(
                h_state, zero(), [B + n, k]))

        by_work(padded(B) * H, state_blocks)
        gates_views = step_views(gates, B)
        with time_loop(L, Tn) as vt:
            step_gemm("gates", gates, gates_views, B, G, H, lambda n, k: h_state[n, k],
                      lambda k, j: w(I + k, j), init=lambda n, j: xw[vt * B + n, j])
            cell_blocks(cfg, buf, dtype, acts, lambda n, k, g: gates[n, off[g] + k],
                        lambda n, k: cs_state[n, k], lambda n, k: (vt, n, k),
                        state={"h": h_state, "cs": cs_next})
            spatial("state_update", (B, H), lambda n, k: T.buffer_store(
                cs_state, cs_next[n, k], [n, k]), group="cell")

        def pad(t, n, k):
            for name in OUTPUTS:
                T.buffer_store(buf[name], zero(dtype), [L + t, n, k])

        by_work((Tn - L) * B * H, lambda: spatial("pad", (Tn - L, B, H), pad))
    return builder.get()
