"""Kernels of the one-step ops: ``LSTMBlockCell`` and ``LSTMBlockCellGrad``."""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec, forget_bias_of
from ._builder import T, kernel, padded, zero
from ._gates import (ICF, CellConfig, cell_backward, cell_forward, f32, gate_activations,
                     gate_offsets, store)
from ._weights import WeightPack, weight_panels
from .variant import KernelVariant


def weight_packs(input_size: int, cell_size: int) -> tuple[WeightPack, ...]:
    """The panels of ``w`` a forward step's product reads, all ``I + H`` rows (block
    ``w_panels``)."""
    return (WeightPack("w_panels", input_size + cell_size, 4 * cell_size,
                       lambda w, k, j: w[k, j]),)


def lstm_block_cell(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict,
        variant: KernelVariant, gemms: list | None = None):
    """``LSTMBlockCell``: ``g = [x, h_prev] @ w + b`` (block ``gates``, or ``gates_rows`` /
    ``gates_rows4`` at small batches as a sequence step's, see ``kb.step_gemm``; its operand
    gathered, widened and row-padded by block ``xh``), then the gate math of one step (blocks
    ``gate_act`` and ``cell``, see :func:`cell_blocks`); at small batches ``xh`` and the gate
    math run on one thread (blocks ``<name>_1t``, see ``kb.by_work``). It reads ``w`` in
    place, or built prepacked, its panels (:func:`weight_packs`)."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    cfg = CellConfig(forget_bias_of(op, attrs), attrs["cell_clip"], attrs["use_peephole"])
    packs = weight_packs(I, H)
    with kernel(op, dtype, I, H, variant, packs=packs, gemms=gemms) as (buf, size, kb):
        B = size["B"]
        x, h_prev = buf["x"], buf["h_prev"]
        w = (weight_panels(kb, buf, packs[0]) if kb.prepacked
             else lambda k, j: f32(buf["w"][k, j]))
        xh, gates = kb.temp("xh", (padded(B), I + H)), kb.temp("gates", (padded(B), G))
        kb.by_work(padded(B) * (I + H), lambda: kb.spatial(
            "xh", (padded(B), I + H), lambda n, k: T.buffer_store(xh, tirx.if_then_else(
                n < B, tirx.if_then_else(k < I, f32(x[n, k]), f32(h_prev[n, k - I])), zero()),
                [n, k])))
        kb.step_gemm("gates", gates, kb.step_views(gates, B), B, G, I + H, lambda n, k: xh[n, k],
                  w, init=lambda n, j: f32(buf["b"][j]))
        acts = activation_scratch(kb, B, H)
        kb.by_work(B * G, lambda: cell_blocks(
        kb,             cfg, buf, dtype, acts, lambda n, k, g: gates[n, off[g] + k],
            lambda n, k: f32(buf["cs_prev"][n, k]), lambda n, k: (n, k)))
    return kb.get()


def activation_scratch(kb, B, H):
    """The float32 scratch of :func:`cell_blocks` (allocate it outside any time loop)."""
    return kb.temp("acts", (B, len(ICF) * H))


def cell_blocks(kb, cfg: CellConfig, buf: dict, dtype: str, acts, pre, cs_prev, out_index,
                state: dict | None = None) -> None:
    """The gate math of one step as two blocks: ``gate_act`` (the input, cell-input and forget
    activations into ``acts``, see :func:`activation_scratch`) and ``cell`` (the cell state, the
    output gate, and every output ``i, cs, f, o, ci, co, h`` stored at ``out_index(n, k)``).

    ``pre(n, k, gate)`` is a gate's float32 pre-activation, ``cs_prev(n, k)`` the previous
    cell state (float32); ``state`` maps ``"cs"``/``"h"`` to a float32 buffer and its index
    ``(n, k) -> indices`` that also receive the unrounded values (the sequence kernels carry
    their state in them).
    Both blocks are in fusion group ``"cell"`` (see ``kb.spatial``).
    """
    B, H = acts.shape[0], acts.shape[1] // len(ICF)
    slot = {g: j * H for j, g in enumerate(ICF)}

    def peepholes(k):
        return tuple(f32(buf[name][k]) for name in ("wci", "wcf", "wco"))

    def activations(n, k):
        wci, wcf, _ = peepholes(k)
        values = gate_activations(cfg, lambda g: pre(n, k, g), cs_prev(n, k), wci, wcf,
                                  bind=T.bind)
        for g in ICF:
            T.buffer_store(acts, values[g], [n, slot[g] + k])

    def outputs(n, k):
        values = cell_forward(cfg, lambda g: acts[n, slot[g] + k], pre(n, k, "o"),
                              cs_prev(n, k), peepholes(k)[2], bind=T.bind)
        for name, value in zip(("i", "cs", "f", "o", "ci", "co", "h"), values):
            T.buffer_store(buf[name], store(value, dtype), list(out_index(n, k)))
            if state and name in state:
                buffer, index = state[name]
                T.buffer_store(buffer, value, list(index(n, k)))

    kb.spatial("gate_act", (B, H), activations, group="cell")
    kb.spatial("cell", (B, H), outputs, group="cell")


def lstm_block_cell_grad(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict,
        variant: KernelVariant, gemms: list | None = None):
    """``LSTMBlockCellGrad``: ``dicfo`` and ``cs_prev_grad`` (block ``cell_grad``) and the
    peephole gradients (sums over the batch); small batches on one thread (blocks
    ``<name>_1t``, see ``kb.by_work``)."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    peep = bool(attrs["use_peephole"])
    with kernel(op, dtype, I, H, variant, gemms=gemms) as (buf, size, kb):
        B = size["B"]
        kb.by_work(B * G, lambda: _cell_grad_blocks(kb, buf, dtype, peep, B, H, off))
    return kb.get()


def _cell_grad_blocks(kb, buf, dtype, peep, B, H, off):
    """The blocks of ``LSTMBlockCellGrad`` (see there)."""
    G = 4 * H
    d4 = kb.temp("d4", (B, G))

    def body(n, k):
        grads = cell_backward(
            peep, *(f32(buf[a][n, k]) for a in ("i", "cs", "f", "o", "ci", "co", "cs_prev",
                                                 "cs_grad", "h_grad")),
            f32(buf["wci"][k]), f32(buf["wcf"][k]), f32(buf["wco"][k]))
        for gate, value in zip("icfo", grads[:4]):
            T.buffer_store(d4, value, [n, off[gate] + k])
        T.buffer_store(buf["cs_prev_grad"], store(grads[4], dtype), [n, k])

    kb.spatial("cell_grad", (B, H), body)
    kb.spatial("dicfo", (B, G), lambda n, j: T.buffer_store(
        buf["dicfo"], store(d4[n, j], dtype), [n, j]))
    peephole_grads(kb, buf, dtype, peep, H, B > 0, off, (B,),
                   lambda gate, k, r: d4[r[0], off[gate] + k],
                   lambda k, r: f32(buf["cs_prev"][r[0], k]),
                   lambda k, r: f32(buf["cs"][r[0], k]))


def peephole_grads(kb, buf, dtype, peep, H, ran, off, reduce_extents, dgate, cs_prev, cs):
    """``wci_grad = sum di * cs_prev``, ``wcf_grad = sum df * cs_prev``, ``wco_grad = sum do * cs``
    over ``reduce_extents`` (zeros without peephole or when nothing was summed)."""
    sums = {}
    if peep:
        for name, gate, state in (("wci", "i", cs_prev), ("wcf", "f", cs_prev), ("wco", "o", cs)):
            acc = sums[name] = kb.temp(f"{name}_acc", (H,))
            kb.reduction(f"{name}_grad", acc, (H,), reduce_extents, lambda k: (k,),
                      lambda s, r, gate=gate, state=state: dgate(gate, s[0], r) * state(s[0], r))

    def out(k):
        for name in ("wci", "wcf", "wco"):
            # A reduction over an empty extent never ran its init: guard with ``ran``.
            value = (tirx.if_then_else(ran, store(sums[name][k], dtype), zero(dtype)) if peep
                     else zero(dtype))
            T.buffer_store(buf[f"{name}_grad"], value, [k])

    kb.spatial("peephole_grad_out", (H,), out)

