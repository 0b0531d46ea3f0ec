"""Kernel of the sequence forward ops ``BlockLSTM`` and ``BlockLSTMV2``.

The input projection ``x @ w[:I] + b`` for all steps is one GEMM (block ``xw``). The time
loop (block ``step``) then runs, per step, the recurrent product ``h @ w[I:]`` (block
``gates``) and the fused gate math (block ``cell``); block ``state_update`` reloads the stored
``h`` and ``cs`` (rounded to the storage dtype, as TF feeds them back) as the next step's
float32 state. Steps ``t >= seq_len_max`` are zero in every output (block ``pad``).
"""

from __future__ import annotations

from ..registry import OpSpec, forget_bias_of
from ._builder import T, kernel, reduction, spatial, temp, zero
from ._gates import CellConfig, f32, gate_offsets
from .block_cell import store_cell_outputs

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
        xw = temp("xw", (Tn, B, G))
        gates, h_state, cs_state = temp("gates", (B, G)), temp("h_state", (B, H)), temp("cs_state", (B, H))
        reduction("xw", xw, (L, B, G), (I,), lambda t, n, j: (t, n, j),
                  lambda s, r: f32(buf["x"][s[0], s[1], r[0]]) * f32(buf["w"][r[0], s[2]]),
                  init=lambda t, n, j: f32(buf["b"][j]))

        def init_state(n, k):
            T.buffer_store(h_state, f32(buf["h_prev"][n, k]), [n, k])
            T.buffer_store(cs_state, f32(buf["cs_prev"][n, k]), [n, k])

        spatial("state_init", (B, H), init_state)
        with T.serial(0, L) as t:
            with T.sblock("step"):
                vt = T.axis.opaque(Tn, t, dtype="int64")
                reduction("gates", gates, (B, G), (H,), lambda n, j: (n, j),
                          lambda s, r: h_state[s[0], r[0]] * f32(buf["w"][I + r[0], s[1]]),
                          init=lambda n, j: xw[vt, n, j])
                spatial("cell", (B, H), lambda n, k: store_cell_outputs(
                    cfg, buf, dtype, (vt, n, k), lambda gate: gates[n, off[gate] + k],
                    cs_state[n, k]))

                def update_state(n, k):
                    T.buffer_store(h_state, f32(buf["h"][vt, n, k]), [n, k])
                    T.buffer_store(cs_state, f32(buf["cs"][vt, n, k]), [n, k])

                spatial("state_update", (B, H), update_state)

        def pad(t, n, k):
            for name in OUTPUTS:
                T.buffer_store(buf[name], zero(dtype), [L + t, n, k])

        spatial("pad", (Tn - L, B, H), pad)
    return builder.get()
