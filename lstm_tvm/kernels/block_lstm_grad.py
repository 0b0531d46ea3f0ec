"""Kernel of the sequence backward ops ``BlockLSTMGrad`` and ``BlockLSTMGradV2``.

Only the carry ``dh`` is truly serial. The time loop (block ``step``, t = seq_len_max-1..0)
runs the cell gradient (block ``cell_grad``, writing the stacked gate gradients ``dicfo`` and
the next carry ``dcs``) and the recurrent product ``dh = dicfo_t @ w[I:]^T`` (block ``dh``).
``w`` is transposed once, into ``w[:I]^T`` and ``w[I:]^T`` (blocks ``w_t_x``, ``w_t_h``), so
both products with it run along the contiguous rows of a dense matrix.
After the loop, ``x_grad`` and ``w_grad`` are each one GEMM over all steps (``x_grad_gemm``;
``w_grad_gemm`` over the rows ``[x_t, h_{t-1}]`` gathered by blocks ``xh_x`` and ``xh_h``),
and ``b_grad`` and the peephole gradients are reductions of ``dicfo``. ``dicfo`` and the
gathered rows are zero past the last row up to a multiple of ``K_SLAB`` rows, so the
weight-gradient GEMM reduces over that many rows with no bounds checks. Everything
accumulates in float32.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec
from ._builder import K_SLAB, T, flat, gemm, kernel, padded, reduction, spatial, temp, zero
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
        # Row t*B + n holds step t, batch row n; the spare rows feed padded GEMM rows.
        dicfo = temp("dicfo", (Tn * B + K_SLAB, G))
        dh, dcs, dcs_next = temp("dh", (padded(B), H)), temp("dcs", (B, H)), temp("dcs_next", (B, H))
        spatial("dicfo_pad", (padded(L * B, K_SLAB) - L * B, G), lambda m, j: T.buffer_store(
            dicfo, zero(), [L * B + m, j]))
        # Two dense matrices, not one (G, I+H): a GEMM operand whose row stride is wider than
        # its columns ran 2x slower (x_grad_gemm at 64x32x256x256: 7 ms against 3.4 ms).
        w_tx, w_th = temp("w_t_x", (G, I)), temp("w_t_h", (G, H))
        cs_prev = lambda t, n, k: tirx.if_then_else(  # noqa: E731
            t > 0, f32(buf["cs"][t - 1, n, k]), f32(buf["cs_prev"][n, k]))

        spatial("w_t_x", (G, I), lambda j, k: T.buffer_store(w_tx, f32(buf["w"][k, j]), [j, k]))
        spatial("w_t_h", (G, H), lambda j, k: T.buffer_store(
            w_th, f32(buf["w"][I + k, j]), [j, k]))

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
                        peep, *acts, cs_prev(vt, n, k),
                        f32(buf["cs_grad"][vt, n, k]) + dcs[n, k],
                        f32(buf["h_grad"][vt, n, k]) + dh[n, k],
                        f32(buf["wci"][k]), f32(buf["wcf"][k]), f32(buf["wco"][k]))
                    for gate, value in zip("icfo", grads[:4]):
                        T.buffer_store(dicfo, value, [vt * B + n, off[gate] + k])
                    T.buffer_store(dcs_next, grads[4], [n, k])

                spatial("cell_grad", (B, H), cell_grad, group="cell_grad")
                spatial("dcs_update", (B, H),
                        lambda n, k: T.buffer_store(dcs, dcs_next[n, k], [n, k]),
                        group="cell_grad")
                gemm("dh", dh, B, H, G, lambda n, j: dicfo[vt * B + n, j],
                     lambda j, k: w_th[j, k])
        _weight_grads(buf, dtype, peep, (L, Tn, B, I, H), off, dicfo, w_tx)

        def state_out(n, k):
            T.buffer_store(buf["cs_prev_grad"], store(dcs[n, k], dtype), [n, k])
            T.buffer_store(buf["h_prev_grad"], store(dh[n, k], dtype), [n, k])

        spatial("state_grad_out", (B, H), state_out)
    return builder.get()


def _weight_grads(buf, dtype, peep, sizes, off, dicfo, w_tx):
    """The products over all ``L*B`` rows at once: ``x_grad``, ``w_grad``, ``b_grad``, peepholes.

    Row ``r = t*B + n`` of the flat views is step ``t``, batch row ``n``; the previous step's
    ``h`` / ``cs`` of row ``r`` is row ``r - B`` (the initial state for ``r < B``).
    """
    L, Tn, B, I, H = sizes
    G = 4 * H
    M = L * B
    x, h, cs = (flat(buf[n], Tn * B) for n in ("x", "h", "cs"))
    x_grad = flat(buf["x_grad"], Tn * B)

    def prev(seq, first, r, k):
        return tirx.if_then_else(r >= B, f32(seq[r - B, k]), f32(buf[first][r, k]))

    # [x_t, h_{t-1}] of every row, zero past M: the weight gradient's left operand as one
    # plain buffer, so that its GEMM loads it without guards (a guarded or selected load
    # keeps LLVM from holding the GEMM's accumulators in registers).
    xh = temp("xh", (Tn * B + K_SLAB, I + H))
    slab = padded(M, K_SLAB)
    spatial("xh_x", (slab, I), lambda r, k: T.buffer_store(
        xh, tirx.if_then_else(r < M, f32(x[r, k]), zero()), [r, k]))
    spatial("xh_h", (slab, H), lambda r, k: T.buffer_store(
        xh, tirx.if_then_else(r < M, prev(h, "h_prev", r, k), zero()), [r, I + k]))
    xg, wg, bg = (temp("xg", (Tn * B + K_SLAB, I)), temp("wg", (I + H, G)), temp("bg", (G,)))
    ran = M > 0  # reductions over the rows never ran their init when this is false
    gemm("x_grad_gemm", xg, M, I, G, lambda r, j: dicfo[r, j], lambda j, k: w_tx[j, k])
    gemm("w_grad_gemm", wg, I + H, G, slab, lambda k, r: xh[r, k], lambda r, j: dicfo[r, j],
         pad=False)
    reduction("b_grad", bg, (G,), (M,), lambda j: (j,), lambda s, r: dicfo[r[0], s[0]])
    peephole_grads(buf, dtype, peep, H, ran, off, (M,),
                   lambda gate, k, r: dicfo[r[0], off[gate] + k],
                   lambda k, r: prev(cs, "cs_prev", r[0], k),
                   lambda k, r: f32(cs[r[0], k]))
    spatial("x_grad_out", (Tn * B, I), lambda r, k: T.buffer_store(
        x_grad, tirx.if_then_else(r < M, store(xg[r, k], dtype), zero(dtype)), [r, k]))
    spatial("w_grad_out", (I + H, G), lambda k, j: T.buffer_store(
        buf["w_grad"], tirx.if_then_else(ran, store(wg[k, j], dtype), zero(dtype)), [k, j]))
    spatial("b_grad_out", (G,), lambda j: T.buffer_store(
        buf["b_grad"], tirx.if_then_else(ran, store(bg[j], dtype), zero(dtype)), [j]))
