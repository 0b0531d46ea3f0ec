"""Kernel of the sequence backward ops ``BlockLSTMGrad`` and ``BlockLSTMGradV2``.

Only the carry ``dh`` is truly serial. The time loop (block ``step``, t = seq_len_max-1..0)
runs the cell gradient (block ``cell_grad``, writing the stacked gate gradients ``dicfo`` and
the next carry ``dcs``) and the recurrent product ``dh = dicfo_t @ w[I:]^T`` (block ``dh``).
``w`` is transposed once (block ``w_t``) so both products with it run along contiguous rows.
After the loop, ``x_grad`` and ``w_grad`` are each one GEMM over all steps (``x_grad_gemm``,
``w_grad_x``, ``w_grad_h``), and ``b_grad`` and the peephole gradients are reductions of
``dicfo``. Everything accumulates in float32.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec
from ._builder import T, kernel, reduction, spatial, temp, zero
from ._gates import cell_backward, f32, gate_offsets, store
from .block_cell import peephole_grads


def block_lstm_grad(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict):
    """``BlockLSTMGrad`` / ``BlockLSTMGradV2``; symbolic ``T`` and ``B``."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    peep = bool(attrs["use_peephole"])
    with kernel(op, dtype, I, H) as (buf, size, builder):
        L, Tn, B = buf["seq_len_max"], size["T"], size["B"]
        dicfo = temp("dicfo", (Tn, B, G))
        dh, dcs, dcs_next = temp("dh", (B, H)), temp("dcs", (B, H)), temp("dcs_next", (B, H))
        w_t = temp("w_t", (G, I + H))

        def prev(name, first, t, n, k):
            """``name[t-1]``, or the initial state ``first`` at t = 0."""
            return tirx.if_then_else(t > 0, f32(buf[name][t - 1, n, k]), f32(buf[first][n, k]))

        spatial("w_t", (G, I + H), lambda j, k: T.buffer_store(w_t, f32(buf["w"][k, j]), [j, k]))

        def init_state(n, k):
            T.buffer_store(dh, zero(), [n, k])
            T.buffer_store(dcs, zero(), [n, k])

        spatial("state_init", (B, H), init_state)
        with T.serial(0, L) as s:
            with T.sblock("step"):
                vt = T.axis.opaque(Tn, L - 1 - s, dtype="int64")

                def cell_grad(n, k):
                    acts = (f32(buf[a][vt, n, k]) for a in ("i", "cs", "f", "o", "ci", "co"))
                    grads = cell_backward(
                        peep, *acts, prev("cs", "cs_prev", vt, n, k),
                        f32(buf["cs_grad"][vt, n, k]) + dcs[n, k],
                        f32(buf["h_grad"][vt, n, k]) + dh[n, k],
                        f32(buf["wci"][k]), f32(buf["wcf"][k]), f32(buf["wco"][k]))
                    for gate, value in zip("icfo", grads[:4]):
                        T.buffer_store(dicfo, value, [vt, n, off[gate] + k])
                    T.buffer_store(dcs_next, grads[4], [n, k])

                spatial("cell_grad", (B, H), cell_grad)
                spatial("dcs_update", (B, H),
                        lambda n, k: T.buffer_store(dcs, dcs_next[n, k], [n, k]))
                reduction("dh", dh, (B, H), (G,), lambda n, k: (n, k),
                          lambda s_, r: dicfo[vt, s_[0], r[0]] * w_t[r[0], I + s_[1]])
        _weight_grads(buf, dtype, peep, (L, Tn, B, I, H), off, dicfo, w_t, prev)

        def state_out(n, k):
            T.buffer_store(buf["cs_prev_grad"], store(dcs[n, k], dtype), [n, k])
            T.buffer_store(buf["h_prev_grad"], store(dh[n, k], dtype), [n, k])

        spatial("state_grad_out", (B, H), state_out)
    return builder.get()


def _weight_grads(buf, dtype, peep, sizes, off, dicfo, w_t, prev):
    """The products over all steps at once: ``x_grad``, ``w_grad``, ``b_grad``, peepholes."""
    L, Tn, B, I, H = sizes
    G = 4 * H
    xg, wgx, wgh, bg = (temp("xg", (Tn, B, I)), temp("wgx", (I, G)), temp("wgh", (H, G)),
                        temp("bg", (G,)))
    ran = L * B > 0  # reductions over (t, b) never ran their init when this is false
    reduction("x_grad_gemm", xg, (L, B, I), (G,), lambda t, n, k: (t, n, k),
              lambda s, r: dicfo[s[0], s[1], r[0]] * w_t[r[0], s[2]])
    reduction("w_grad_x", wgx, (I, G), (L, B), lambda k, j: (k, j),
              lambda s, r: f32(buf["x"][r[0], r[1], s[0]]) * dicfo[r[0], r[1], s[1]])
    reduction("w_grad_h", wgh, (H, G), (L, B), lambda k, j: (k, j),
              lambda s, r: prev("h", "h_prev", r[0], r[1], s[0]) * dicfo[r[0], r[1], s[1]])
    reduction("b_grad", bg, (G,), (L, B), lambda j: (j,), lambda s, r: dicfo[r[0], r[1], s[0]])
    peephole_grads(buf, dtype, peep, H, ran, off, (L, B),
                   lambda gate, k, r: dicfo[r[0], r[1], off[gate] + k],
                   lambda k, r: prev("cs", "cs_prev", r[0], r[1], k),
                   lambda k, r: f32(buf["cs"][r[0], r[1], k]))
    spatial("x_grad_out", (Tn, B, I), lambda t, n, k: T.buffer_store(
        buf["x_grad"], tirx.if_then_else(t < L, store(xg[t, n, k], dtype), zero(dtype)), [t, n, k]))
    spatial("w_grad_out", (I + H, G), lambda k, j: T.buffer_store(
        buf["w_grad"], tirx.if_then_else(ran, store(tirx.if_then_else(
            k < I, wgx[k, j], wgh[k - I, j]), dtype), zero(dtype)), [k, j]))
    spatial("b_grad_out", (G,), lambda j: T.buffer_store(
        buf["b_grad"], tirx.if_then_else(ran, store(bg[j], dtype), zero(dtype)), [j]))
