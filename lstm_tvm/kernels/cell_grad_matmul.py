"""Kernel of the matmul part of a cell's gradient (what TF's Python gradient of
``LSTMBlockCell`` computes around ``LSTMBlockCellGrad``).

From ``dicfo`` (B, 4H): ``xh_grad = dicfo @ w^T`` split into ``x_grad`` (B, I) and
``h_prev_grad`` (B, H); ``w_grad = [x, h_prev]^T @ dicfo``; ``b_grad = sum_b dicfo``.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec, TensorSpec
from ._builder import T, flat, gemm, kernel, padded, reduction, spatial, temp, zero
from ._gates import ACC, f32, store

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


#: Columns of the transposed products are the batch rows, padded to this multiple so that
#: the GEMM's vectorised column tiles need no bounds checks.
BATCH_COLUMNS = 32


def cell_grad_matmul(dtype: str, input_size: int, cell_size: int):
    """The helper's kernel: inputs :data:`INPUTS`, outputs :data:`OUTPUTS`.

    ``xh_grad`` is computed transposed, ``xh_grad^T = w @ dicfo^T`` (block ``xh_grad_t``), so
    the large operand ``w`` is read as stored, along its rows, and only the small ``dicfo``
    is transposed (block ``dicfo_t``, batch columns padded to :data:`BATCH_COLUMNS`).
    ``w_grad`` is one GEMM into a float32 scratch for float16 (block ``w_grad``), rounded
    into the output; float32 accumulates in the output (:func:`_w_grad_in_place`).
    """
    I, H = input_size, cell_size
    G = 4 * H
    with kernel(SPEC, dtype, I, H) as (buf, size, builder):
        B = size["B"]
        dicfo, w = buf["dicfo"], buf["w"]
        cols = padded(B, BATCH_COLUMNS)
        d_t, xhg_t = temp("dicfo_t", (G, cols)), temp("xhg_t", (I + H, cols))
        bg = temp("bg", (G,))
        spatial("dicfo_t", (G, cols), lambda j, n: T.buffer_store(
            d_t, tirx.if_then_else(n < B, f32(dicfo[n, j]), zero()), [j, n]))
        gemm("xh_grad_t", xhg_t, I + H, cols, G, lambda k, j: f32(w[k, j]),
             lambda j, n: d_t[j, n], pad=False)
        if dtype == ACC:
            _w_grad_in_place(buf, B, I, H)
        else:
            # A select of two in-bounds loads, not a guarded load (if_then_else): a guarded
            # operand keeps LLVM from holding the GEMM's accumulators in registers.
            wg = temp("wg", (I + H, G))
            gemm("w_grad", wg, I + H, G, B,
                 lambda k, n: tirx.Select(k < I, f32(buf["x"][n, tirx.min(k, I - 1)]),
                                          f32(buf["h_prev"][n, tirx.max(k - I, 0)])),
                 lambda n, j: f32(dicfo[n, j]), pad=False)
        reduction("b_grad", bg, (G,), (B,), lambda j: (j,),
                  lambda s, r: f32(buf["dicfo"][r[0], s[0]]))
        spatial("x_grad_out", (B, I), lambda n, k: T.buffer_store(
            buf["x_grad"], store(xhg_t[k, n], dtype), [n, k]))
        spatial("h_prev_grad_out", (B, H), lambda n, k: T.buffer_store(
            buf["h_prev_grad"], store(xhg_t[I + k, n], dtype), [n, k]))
        # A reduction over an empty batch never ran its init.
        if dtype == ACC:
            with T.If(B == 0), T.Then():  # through a view: each GEMM stays its only writer
                zeroed = flat(buf["w_grad"], I + H, name="w_grad_zeroed")
                spatial("w_grad_zero", (I + H, G), lambda k, j: T.buffer_store(
                    zeroed, zero(), [k, j]))
        else:
            spatial("w_grad_out", (I + H, G), lambda k, j: T.buffer_store(
                buf["w_grad"], tirx.if_then_else(B > 0, store(wg[k, j], dtype), zero(dtype)),
                [k, j]))
        spatial("b_grad_out", (G,), lambda j: T.buffer_store(
            buf["b_grad"], tirx.if_then_else(B > 0, store(bg[j], dtype), zero(dtype)), [j]))
    return builder.get()


def _w_grad_in_place(buf, B, I, H):
    """Float32 ``w_grad`` accumulated in the output by two GEMMs, rows ``:I`` from ``x``
    (block ``w_grad_x``) and rows ``I:`` from ``h_prev`` (block ``w_grad_h``), each writing a
    view of its own. A scratch and a copy of it cost more than the GEMM at 64x512x512, and
    one GEMM selecting between ``x`` and ``h_prev`` made LLVM store the accumulators to the
    output at every reduction step (5 times slower)."""
    G, dicfo = 4 * H, buf["dicfo"]
    for name, rows, first, src in (("w_grad_x", I, 0, buf["x"]),
                                   ("w_grad_h", H, I, buf["h_prev"])):
        view = flat(buf["w_grad"], first + rows, name=f"{name}_rows")
        gemm(name, view, rows, G, B, lambda k, n, src=src: f32(src[n, k]),
             lambda n, j: f32(dicfo[n, j]), pad=False, row0=first)
