"""Kernel of the registry helper ``CellGradMatmul``, the matmul part of a cell's gradient
(what TF's Python gradient of ``LSTMBlockCell`` computes around ``LSTMBlockCellGrad``).

From ``dicfo`` (B, 4H): ``xh_grad = dicfo @ w^T`` split into ``x_grad`` (B, I) and
``h_prev_grad`` (B, H); ``w_grad = [x, h_prev]^T @ dicfo``; ``b_grad = sum_b dicfo``.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec
from ._builder import T, flat, kernel, padded, zero
from .contract import PANEL
from .tir_analysis import is_static
from ._gates import ACC, f32, store
from ._weights import weight_panels
from .block_lstm_grad import weight_packs
from .variant import KernelVariant

#: Rows of float16 ``w_grad`` computed per chunk (see :func:`_w_grad_by_chunks`).
W_GRAD_CHUNK = 64
#: Columns of the transposed products are the batch rows, padded to this multiple so that
#: the GEMM's vectorised column tiles need no bounds checks; its operand and result are stored
#: as panels of that many columns (static row strides).
BATCH_COLUMNS = PANEL
#: Batches below this many rows get ``x_grad`` and ``h_prev_grad`` as dot products along
#: ``w``'s rows (:func:`_xh_grad_dots`) when ``w`` is not packed (B=6 1.15-1.4x the padded
#: GEMM, B=8 slower: docs/performance.md).
DOTS_BELOW = 7
#: Partial sums per dot product (a 512-bit vector of float32; LLVM splits it for narrower).
DOT_LANES = 16


def cell_grad_matmul(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict,
        variant: KernelVariant, gemms: list | None = None):
    """The helper's kernel (``op`` is its registry entry; it has no attributes).

    Below :data:`DOTS_BELOW` batch rows on a CPU, ``xh_grad`` is dot products along ``w``'s
    rows (:func:`_xh_grad_dots`). From there (and on GPUs) it is computed transposed,
    ``xh_grad^T = w @ dicfo^T`` (block ``xh_grad_t``), so
    the large operand ``w`` is read as stored, along its rows, and only the small ``dicfo``
    is transposed (block ``dicfo_t``, batch columns padded to :data:`BATCH_COLUMNS`, both
    stored as panels of them).
    ``w_grad``: float32 accumulates in the output (:func:`_w_grad_in_place`), float16 goes
    through a float32 scratch a chunk of rows at a time (:func:`_w_grad_by_chunks`).
    Built prepacked, it takes ``w`` transposed in panels (the sequence backward's,
    :func:`~.block_lstm_grad.weight_packs`) and computes ``x_grad`` and ``h_prev_grad`` as a
    step's GEMMs over the batch rows (:func:`_xh_grad_rows`): no batch padded to
    :data:`BATCH_COLUMNS`.
    """
    I, H = input_size, cell_size
    G = 4 * H
    del attrs
    packs = weight_packs(I, H)
    with kernel(op, dtype, I, H, variant, packs=packs, gemms=gemms) as (buf, size, kb):
        B = size["B"]
        if kb.prepacked:
            _xh_grad_rows(kb, buf, dtype, B, I, H, [weight_panels(kb, buf, p) for p in packs])
        elif not kb.cpu:
            _xh_grad_transposed(kb, buf, dtype, B, I, H)
        elif is_static(B):  # tuning tasks: the version B takes
            (_xh_grad_dots if int(B) < DOTS_BELOW else _xh_grad_transposed)(kb, buf, dtype, B, I, H)
        else:
            with T.If(B < DOTS_BELOW):
                with T.Then():
                    _xh_grad_dots(kb, buf, dtype, B, I, H)
                with T.Else():
                    _xh_grad_transposed(kb, buf, dtype, B, I, H)
        bg = kb.temp("bg", (G,))
        if dtype == ACC:
            _w_grad_in_place(kb, buf, B, I, H)
        else:
            _w_grad_by_chunks(kb, buf, dtype, B, I, H)
        kb.reduction("b_grad", bg, (G,), (B,), lambda j: (j,),
                  lambda s, r: f32(buf["dicfo"][r[0], s[0]]))
        # A reduction over an empty batch never ran its init.
        with T.If(B == 0), T.Then():  # through a view: each w_grad writer keeps its buffer
            zeroed = flat(buf["w_grad"], I + H, name="w_grad_zeroed")
            kb.spatial("w_grad_zero", (I + H, G), lambda k, j: T.buffer_store(
                zeroed, zero(dtype), [k, j]))
        kb.spatial("b_grad_out", (G,), lambda j: T.buffer_store(
            buf["b_grad"], tirx.if_then_else(B > 0, store(bg[j], dtype), zero(dtype)), [j]))
    return kb.get()


def _xh_grad_transposed(kb, buf, dtype, B, I, H):
    """``xh_grad^T = w @ dicfo^T`` reading ``w`` as stored (see :func:`cell_grad_matmul`)."""
    G = 4 * H
    dicfo, w = buf["dicfo"], buf["w"]
    cols = padded(B, BATCH_COLUMNS)
    d_t = kb.temp("dicfo_t", (cols // PANEL, G, PANEL))
    xhg_t = kb.temp("xhg_t", (cols // PANEL, I + H, PANEL))
    kb.spatial("dicfo_t", (G, cols), lambda j, n: T.buffer_store(
        d_t, tirx.if_then_else(n < B, f32(dicfo[n, j]), zero()), [n // PANEL, j, n % PANEL]))
    kb.gemm("xh_grad_t", xhg_t, I + H, cols, G, lambda k, j: f32(w[k, j]),
         lambda j, n: d_t[n // PANEL, j, n % PANEL], pad=False, out_panels=True)
    _store_xh_grad(kb, buf, dtype, B, I, H, lambda n, k: xhg_t[n // PANEL, k, n % PANEL])


def _xh_grad_dots(kb, buf, dtype, B, I, H):
    """``xh_grad[n, k] = dicfo[n] . w[k]`` as dot products along ``w``'s rows, read in place:
    :data:`DOT_LANES` partial sums per product (block ``xh_grad_lanes``, vectorised along
    them, the reduction outside), then their sum (``xh_grad_sum``). Each product reads a row of
    ``w`` once per batch row: below :data:`DOTS_BELOW` rows that costs less than the
    transposed GEMM's columns padded to :data:`BATCH_COLUMNS`."""
    G = 4 * H
    lanes = next(n for n in (DOT_LANES, 8, 4) if G % n == 0)  # 4H: 4 always divides it
    dicfo, w = buf["dicfo"], buf["w"]
    part = kb.temp("xh_grad_lanes", (B, I + H, lanes))  # constant row strides (test_schedule)
    kb.reduction("xh_grad_lanes", part, (I + H, B, lanes), (G // lanes,),
              lambda k, n, e: (n, k, e),
              lambda s, r: f32(dicfo[s[1], r[0] * lanes + s[2]])
              * f32(w[s[0], r[0] * lanes + s[2]]))
    xhg = kb.temp("xh_grad_sum", (B, I + H))
    kb.reduction("xh_grad_sum", xhg, (B, I + H), (lanes,), lambda n, k: (n, k),
              lambda s, r: part[s[0], s[1], r[0]])
    _store_xh_grad(kb, buf, dtype, B, I, H, lambda n, k: xhg[n, k], suffix="_dots")


def _store_xh_grad(kb, buf, dtype, B, I, H, read, suffix=""):
    """``x_grad`` and ``h_prev_grad`` (blocks ``<output>_out<suffix>``) from ``read(n, k)``,
    ``xh_grad``'s element of batch row ``n`` and column ``k < I + H``."""
    for out, first, cols in (("x_grad", 0, I), ("h_prev_grad", I, H)):
        kb.spatial(f"{out}_out{suffix}", (B, cols), lambda n, k, out=out, first=first: (
            T.buffer_store(buf[out], store(read(n, first + k), dtype), [n, k])))


def _xh_grad_rows(kb, buf, dtype, B, I, H, w_t):
    """``x_grad = dicfo @ w[:I]^T`` and ``h_prev_grad = dicfo @ w[I:]^T`` as a step's GEMMs
    (blocks ``x_grad_rows``, ``h_grad_rows`` and their small-batch versions, see
    ``kb.step_gemm``) on the transposed panels ``w_t``, from ``dicfo`` widened into
    zero-padded rows (block ``dicfo_rows``)."""
    G = 4 * H
    d = kb.temp("dicfo_rows", (padded(B), G))
    kb.by_work(padded(B) * G, lambda: kb.spatial("dicfo_rows", (padded(B), G), lambda n, j: (
        T.buffer_store(d, tirx.if_then_else(n < B, f32(buf["dicfo"][n, j]), zero()), [n, j]))))
    parts = (("x_grad", "x_grad", I, w_t[0]), ("h_grad", "h_prev_grad", H, w_t[1]))
    rows = {name: kb.temp(f"{name}_rows", (padded(B), cols)) for name, _, cols, _ in parts}
    for name, _, cols, panels in parts:
        kb.step_gemm(f"{name}_rows", rows[name], kb.step_views(rows[name], B), B, cols, G,
                  lambda n, j: d[n, j], panels)

    def outputs():
        for name, out, cols, _ in parts:
            kb.spatial(f"{name}_out", (B, cols), lambda n, k, out=out, r=rows[name]: (
                T.buffer_store(buf[out], store(r[n, k], dtype), [n, k])))

    kb.by_work(B * (I + H), outputs)


def _w_grad_parts(buf, I, H):
    """``w_grad``'s two row ranges, each a GEMM of its own: ``(block, rows, first row,
    source)``, rows ``:I`` from ``x`` and ``I:`` from ``h_prev``. One GEMM selecting between
    ``x`` and ``h_prev`` made LLVM store the accumulators at every reduction step (5 times
    slower)."""
    return (("w_grad_x", I, 0, buf["x"]), ("w_grad_h", H, I, buf["h_prev"]))


def _w_grad_in_place(kb, buf, B, I, H):
    """Float32 ``w_grad`` accumulated in the output by the GEMMs of :func:`_w_grad_parts`,
    each writing a view of its own (a scratch and a copy of it cost more than the GEMM at
    64x512x512)."""
    G, dicfo = 4 * H, buf["dicfo"]
    for name, rows, first, src in _w_grad_parts(buf, I, H):
        view = flat(buf["w_grad"], first + rows, name=f"{name}_rows")
        kb.gemm(name, view, rows, G, B, lambda k, n, src=src: f32(src[n, k]),
             lambda n, j: f32(dicfo[n, j]), pad=False, row0=first)


def _w_grad_by_chunks(kb, buf, dtype, B, I, H):
    """Float16 ``w_grad``: each GEMM of :func:`_w_grad_parts` (in blocks ``w_grad_x_chunk``,
    ``w_grad_h_chunk``) :data:`W_GRAD_CHUNK` rows at a time into a float32 scratch that stays
    in cache, each chunk then rounded into the output (a scratch of all ``I+H`` rows copied
    out at the end cost more than the GEMM itself: docs/performance.md). A last
    partial chunk reads clamped rows and drops their results."""
    G = 4 * H
    for name, rows, first_row, src in _w_grad_parts(buf, I, H):
        wg = kb.temp(f"{name}_scratch", (W_GRAD_CHUNK, G))
        wg_rest = kb.rest_view(wg)
        with kb.row_chunks(f"{name}_chunk", rows, W_GRAD_CHUNK) as (first, count):
            kb.gemm(name, wg, W_GRAD_CHUNK, G, B,
                 lambda r, n, src=src, rows=rows, first=first: f32(
                     src[n, tirx.min(first + r, rows - 1)]),
                 lambda n, j: f32(buf["dicfo"][n, j]), pad=False, rest_out=wg_rest)
            kb.spatial(f"{name}_out", (count, G),
                    lambda r, j, wg=wg, first=first, first_row=first_row: T.buffer_store(
                        buf["w_grad"], store(wg[r, j], dtype), [first_row + first + r, j]))
