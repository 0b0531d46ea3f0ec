"""Kernel of the sequence backward ops ``BlockLSTMGrad`` and ``BlockLSTMGradV2``.

Only the carry ``dh`` is truly serial. The time loop (block ``step``, t = seq_len_max-1..0)
runs the cell gradient (block ``cell_grad``, writing the stacked gate gradients ``dicfo`` and
the next carry ``dcs``) and the recurrent product ``dh = dicfo_t @ w[I:]^T`` (block ``dh``).
``w`` is transposed once, into ``w[:I]^T`` and ``w[I:]^T`` (blocks ``w_t_x``, ``w_t_h``, stored
as column panels, see ``kb.panels``), so both products with it stream contiguous memory.
Batches below :data:`GATE_ROWS_BELOW` run each step in a version per batch (``kb.few_rows``)
as one parallel loop over chunks of units: iteration ``u`` computes ``dh`` of units ``u`` from
the rows of ``dicfo`` the step before wrote (block ``dh_few<B>``, ``kb.gate_rows``: the
reduction over each gate block into a column block of its own, ``dh`` their sum; the zero rows
past the last at the first step; read through a copy per chunk, block ``dh_rows_few<B>``, see
``kb.row_copies``), then the cell gradient of those units; ``h_prev_grad``
takes one more such product after the loop (block ``dh_first_few<B>``). After the loop,
``x_grad`` and ``w_grad`` are GEMMs over all steps (``x_grad_gemm`` plus ``x_grad_tail``
for the last ``< ROW_TILE`` rows, or ``x_grad_chunk_gemm`` chunk by chunk for float16, the
rows left after the whole chunks by ``x_grad_tail_gemm`` on CPUs;
``w_grad`` chunk by chunk of packed rows, see :func:`_w_grad`), and ``b_grad`` and the
peephole gradients are reductions of ``dicfo``. A kernel whose variant skips ``x_grad`` or
``w_grad`` (:attr:`KernelVariant.skipped`) has neither their GEMMs nor their writes (nor
``w[:I]^T``'s panels without ``x_grad``). ``dicfo`` is zero for
:func:`dicfo_zero_rows` rows past the last one (``K_SLAB`` on GPUs, ``ROW_TILE`` on CPUs),
so chunks of rows read it with no bounds checks. Everything
accumulates in float32 (``x_grad`` in the output of a float32 op; ``w_grad`` there too on
GPUs, in column panels on CPUs). Beyond ``dicfo``, no scratch grows
with ``T``: the rest has the size of the state, of ``w`` or of a chunk of rows.
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec
from ._builder import T, alias, flat, kernel, padded, panel_layout, zero
from .contract import GATE_ROWS_BELOW, GATES, K_SLAB, ROW_TILE
from ._gates import ACC, cell_backward, f32, gate_offsets, store
from ._weights import WeightPack, weight_panels
from .block_cell import peephole_grads
from .variant import KernelVariant

#: Rows of ``x_grad`` a float16 sequence backward computes at a time (at most ``K_SLAB``:
#: a GPU's last chunk reads that far past the last row of ``dicfo``).
X_GRAD_CHUNK = K_SLAB
#: From this many columns ``I+H`` CPU builds pack the weight gradient's rows transposed (a
#: column per row of the sequence): packed a row per row of the sequence, consecutive steps of
#: the GEMM's reduction read its left operand ``4*(I+H)`` bytes apart, a page or more every few
#: steps (slower than the transposed pack with AVX2 and AVX-512 alike); narrower, the
#: transposing pack costs more than the GEMM gains (docs/performance.md, "Earlier figures
#: moved here from code comments"). GPU builds keep a row per row of the sequence.
W_GRAD_TRANSPOSED_FROM = 512


def w_grad_packed_bytes(l2_bytes: int) -> int:
    """Bytes of the weight gradient's packed operands per chunk of rows (see
    :func:`w_grad_chunk`) on a core with ``l2_bytes`` of L2 cache: three quarters of it, so
    that they stay there beside the rest of a chunk's data."""
    return 3 * l2_bytes // 4


def w_grad_chunk(input_size: int, cell_size: int, l2_bytes: int) -> int:
    """Rows of the sequence the weight gradient reduces per chunk: the most, among 256, 128
    and 64 (at most ``K_SLAB``: a GPU's last chunk reads that far into ``dicfo``'s zero rows),
    whose packed float32 operands (a row of ``I+H`` and one of ``4H`` values each) fit
    :func:`w_grad_packed_bytes` of ``l2_bytes`` (:attr:`KernelVariant.l2_bytes`; larger
    chunks were faster while they fit the L2 cache, slower past it: docs/performance.md,
    "BlockLSTMGrad's weight-gradient chunk")."""
    row_bytes = 4 * (input_size + 5 * cell_size)
    budget = w_grad_packed_bytes(l2_bytes)
    return next((rows for rows in (256, 128) if rows * row_bytes <= budget), 64)


def dicfo_zero_rows(cpu: bool) -> int:
    """Rows of zeros the sequence backward writes past the last row of ``dicfo``: as far as any
    block reads. GPU builds reduce over whole chunks of rows (up to ``K_SLAB``); CPU builds'
    reads end within ``ROW_TILE`` rows past it (the rows left after whole chunks, and a step's
    product rows, padded to ``ROW_TILE``; the first step's rows of a batch below
    ``GATE_ROWS_BELOW``). Zeroing ``K_SLAB`` rows on a CPU wrote as much as ``w`` itself at
    I=H=256 (docs/performance.md, "the weight gradient's last chunk")."""
    return ROW_TILE if cpu else K_SLAB


def weight_packs(input_size: int, cell_size: int) -> tuple[WeightPack, ...]:
    """The backward's panels of ``w`` transposed: two matrices, not one ``(G, I+H)`` (a GEMM
    operand whose row stride is wider than its columns ran half as fast, docs/performance.md,
    "BlockLSTMGrad's transposed weights"); blocks ``w_t_x`` and ``w_t_h``."""
    I, H = input_size, cell_size
    return (WeightPack("w_t_x", 4 * H, I, lambda w, j, k: w[k, j], transpose=True),
            WeightPack("w_t_h", 4 * H, H, lambda w, j, k: w[I + k, j], transpose=True))


def block_lstm_grad(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict,
        variant: KernelVariant, gemms: list | None = None):
    """``BlockLSTMGrad`` / ``BlockLSTMGradV2``; symbolic ``T`` and ``B``."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    peep = bool(attrs["use_peephole"])
    packs = weight_packs(I, H)
    with kernel(op, dtype, I, H, variant, packs=packs, gemms=gemms) as (buf, size, kb):
        L, Tn, B = buf["seq_len_max"], size["T"], size["B"]
        # Row t*B + n holds step t, batch row n; the spare rows feed padded GEMM rows.
        dicfo = kb.temp("dicfo", (Tn * B + K_SLAB, G))
        dh, dcs = kb.temp("dh", (padded(B), H)), kb.temp("dcs", (B, H))
        dcs_next = kb.temp("dcs_next", (B, H))
        kb.spatial("dicfo_pad", (dicfo_zero_rows(kb.cpu), G), lambda m, j: T.buffer_store(
            dicfo, zero(), [L * B + m, j]))
        w_tx = None if "x_grad" in variant.skipped else weight_panels(kb, buf, packs[0])
        w_th = weight_panels(kb, buf, packs[1])
        cs_prev = lambda t, n, k: tirx.if_then_else(  # noqa: E731
            t > 0, f32(buf["cs"][t - 1, n, k]), f32(buf["cs_prev"][n, k]))

        def init_state(n, k):
            T.buffer_store(dh, zero(), [n, k])
            T.buffer_store(dcs, zero(), [n, k])

        kb.by_work(B * H, lambda: kb.spatial("state_init", (B, H), init_state))
        dh_views = kb.step_views(dh, B)
        # Below GATE_ROWS_BELOW rows, the product's four gate blocks each reduce over H into
        # a column block of their own, summed where the cell gradient reads them (see
        # ``kb.gate_rows``; through a view of its own for each product, its only writer).
        parts, dicfo_rows = {}, None
        if kb.cpu:
            dh_parts = kb.temp("dh_parts", (GATE_ROWS_BELOW - 1, G))
            parts = {(name, m): flat(dh_parts, m, name=f"{name}_parts{m}")
                     for name in ("dh", "dh_first") for m in range(1, GATE_ROWS_BELOW)}
            dicfo_rows = kb.row_copy_scratch("dicfo_rows", GATE_ROWS_BELOW - 1, G, H)

        def parts_of_row(name, m, group, row):
            """Block ``name``: its ``dh`` parts of ``m`` rows of ``dicfo`` from ``row`` on
            (read through copies, block ``<name>_rows``); returns their sum's accessor
            ``(n, k) -> value``."""
            out = parts[name, m]
            rows = kb.row_copies(f"{name}_rows", dicfo_rows, lambda n, c: dicfo[row + n, c], m,
                                 H, group=group)
            kb.gate_rows(name, out, m, G, H, lambda n, j, k: rows(
                n, j // H * H + k, j) * w_th(j // H * H + k, j % H), None, group=group)
            return lambda n, k: sum((out[n, g * H + k] for g in range(1, GATES)), out[n, k])

        def cell_grad(vt, dh_at):
            def body(n, k):
                acts = (f32(buf[a][vt, n, k]) for a in ("i", "cs", "f", "o", "ci", "co"))
                grads = cell_backward(
                    peep, *acts, cs_prev(vt, n, k),
                    f32(buf["cs_grad"][vt, n, k]) + dcs[n, k],
                    f32(buf["h_grad"][vt, n, k]) + dh_at(n, k),
                    f32(buf["wci"][k]), f32(buf["wcf"][k]), f32(buf["wco"][k]))
                for gate, value in zip("icfo", grads[:4]):
                    T.buffer_store(dicfo, value, [vt * B + n, off[gate] + k])
                T.buffer_store(dcs_next, grads[4], [n, k])

            kb.spatial("cell_grad", (B, H), body, group="cell_grad")
            kb.spatial("dcs_update", (B, H),
                    lambda n, k: T.buffer_store(dcs, dcs_next[n, k], [n, k]),
                    group="cell_grad")

        with kb.time_loop(L, Tn, reverse=True) as vt:

            def few(m):
                # Step vt's dh from the rows of dicfo the step before wrote (the zero rows past
                # the last at the first step), then its cell gradient: one parallel loop.
                cell_grad(vt, parts_of_row("dh", m, "cell_grad", (vt + 1) * B))

            def more():
                cell_grad(vt, lambda n, k: dh[n, k])
                kb.step_gemm("dh", dh, dh_views, B, H, G, lambda n, j: dicfo[vt * B + n, j],
                             w_th, single_rows=False)

            kb.few_rows(B, GATE_ROWS_BELOW, few, more)
        _weight_grads(kb, buf, dtype, peep, (L, Tn, B, I, H), off, dicfo, w_tx)

        def state_out(dh_at, group=None):
            def body(n, k):
                T.buffer_store(buf["cs_prev_grad"], store(dcs[n, k], dtype), [n, k])
                T.buffer_store(buf["h_prev_grad"], store(dh_at(n, k), dtype), [n, k])

            kb.spatial("state_grad_out", (B, H), body, group=group)

        def few_out(m):
            # dh of step 0's rows of dicfo (zero at seq_len_max 0)
            state_out(parts_of_row("dh_first", m, "state_grad_out", 0), group="state_grad_out")

        kb.few_rows(B, GATE_ROWS_BELOW, few_out,
                    lambda: kb.by_work(B * H, lambda: state_out(lambda n, k: dh[n, k])))
    return kb.get()


def _weight_grads(kb, buf, dtype, peep, sizes, off, dicfo, w_tx):
    """The products over all ``M = L*B`` rows at once: ``x_grad``, ``w_grad``, ``b_grad``,
    peepholes.

    Row ``r = t*B + n`` of the flat views is step ``t``, batch row ``n``; the previous step's
    ``h`` / ``cs`` of row ``r`` is row ``r - B`` (the initial state for ``r < B``). A float32
    op's ``x_grad`` accumulates in its output, a float16 op's in float32 scratch of a chunk of
    rows; ``w_grad`` as :func:`_w_grad` says.
    """
    L, Tn, B, I, H = sizes
    G = 4 * H
    M = L * B
    cs = flat(buf["cs"], Tn * B)
    in_place = dtype == ACC
    ran = M > 0  # reductions over the rows never ran their init when this is false

    skipped = kb.variant.skipped
    if "x_grad" not in skipped:
        if in_place:
            _x_grad_in_place(kb, buf, sizes, dicfo, w_tx)
        else:
            _x_grad_by_chunks(kb, buf, dtype, sizes, dicfo, w_tx)
    wg, complete = (None, True) if "w_grad" in skipped else _w_grad(kb, buf, sizes, dicfo,
                                                                     in_place)
    bg = kb.temp("bg", (G,))
    kb.reduction("b_grad", bg, (G,), (M,), lambda j: (j,), lambda s, r: dicfo[r[0], s[0]])
    peephole_grads(kb, buf, dtype, peep, H, ran, off, (M,),
                   lambda gate, k, r: dicfo[r[0], off[gate] + k],
                   lambda k, r: tirx.if_then_else(r[0] >= B, f32(cs[r[0] - B, k]),
                                                  f32(buf["cs_prev"][r[0], k])),
                   lambda k, r: f32(cs[r[0], k]))
    if wg is None and not complete:  # accumulated in the output, unwritten at M = 0
        with T.If(tirx.Not(ran)), T.Then():
            kb.spatial("w_grad_zero", (I + H, G), lambda k, j: T.buffer_store(
                buf["w_grad"], zero(), [k, j]))
    elif wg is not None:
        kb.spatial("w_grad_out", (I + H, G), lambda k, j: T.buffer_store(
            buf["w_grad"], tirx.if_then_else(ran, store(wg(k, j), dtype), zero(dtype)),
            [k, j]))
    kb.spatial("b_grad_out", (G,), lambda j: T.buffer_store(
        buf["b_grad"], tirx.if_then_else(ran, store(bg[j], dtype), zero(dtype)), [j]))


def _w_grad(kb, buf, sizes, dicfo, in_place: bool):
    """``w_grad = [x_t, h_{t-1}]^T @ dicfo``, :func:`w_grad_chunk` rows of the sequence at a
    time (block ``w_grad_chunk``), then the rows left (block ``w_grad_tail_chunk``, when the
    chunk does not divide ``M``, and always for a float32 op on a CPU, see below). Each chunk packs its rows of ``x`` and ``h_{t-1}`` side by
    side into ``w_grad_a`` (blocks ``w_grad_pack_x``, ``w_grad_pack_h``; float32, zero past
    the last row; transposed from ``I+H`` = :data:`W_GRAD_TRANSPOSED_FROM` on CPUs) and its
    rows of ``dicfo`` into column panels (``w_grad_d``), then one GEMM
    ``w_grad`` adds their product to the accumulator. On CPUs that is a float32 scratch of the
    size of ``w`` stored as column panels (:func:`~._builder.panel_layout`), which the rule
    walks column panel first: every chunk, each thread adds to the same columns, along
    contiguous memory (a row-major accumulator walked so has rows 4-8 KB apart; BlockLSTMGradV2
    64x32x256x256 5-6% faster on a Zen 5, docs/performance.md). On GPUs it is the float32
    output (``in_place``) or a row-major scratch. The tail's GEMM
    (``w_grad_tail``; CPU builds, see :class:`.KernelVariant`) reduces over the rows left rounded
    up to :data:`ROW_TILE`, not a whole chunk: at ``T*B = 100`` a chunk of 256 rows did 2.5x
    the arithmetic (rounded up to 32 rows, 1.28x). A float32 CPU op's tail always runs, over
    no rows where the chunk divides ``M``: it starts from the accumulator and writes the
    output, so no copy of the accumulator into the output follows (a copy of ``w``'s size
    through memory, docs/performance.md, "the weight gradient's last chunk"). After no whole
    chunk the tail starts from zero (a version of its own), not from the accumulator.

    The GEMM's operands then stay in the L2 cache, and stream contiguous memory, instead of
    rows 8 KB apart of ``dicfo`` (docs/performance.md, "packed weight-gradient operands").
    One GEMM over all ``I+H`` rows: its operand is a single scratch, not a choice between
    ``x`` and ``h`` per element (a select between two buffers in a GEMM operand makes LLVM
    store the accumulators at every reduction step). The first chunk starts from zero through
    a ``Select``, not an ``if_then_else`` (whose guarded load of the output had the same
    effect).

    Returns the accumulator's accessor ``(k, j) -> value`` (None where the output is the
    accumulator) and whether the output is complete: written even where ``M`` is 0.
    """
    L, Tn, B, I, H = sizes
    M, G = L * B, 4 * H
    x, h = (flat(buf[n], Tn * B) for n in ("x", "h"))
    if kb.cpu:
        acc_shape, acc_at = panel_layout(I + H, G)
    else:
        acc_shape, acc_at = (I + H, G), lambda k, j: (k, j)
    in_output = in_place and not kb.cpu
    tail_to_output = in_place and kb.cpu
    acc = (flat(buf["w_grad"], I + H, name="w_grad_rows") if in_output
           else kb.temp("wg", acc_shape))
    chunk = w_grad_chunk(I, H, kb.variant.l2_bytes)
    transposed = kb.cpu and I + H >= W_GRAD_TRANSPOSED_FROM
    a = kb.temp("w_grad_a", (I + H, chunk) if transposed else (chunk, I + H))
    d_scratch = kb.panel_scratch("w_grad_d", chunk, G)
    acc_rest = kb.rest_view(acc)
    # the two versions of the tail's GEMM (see below) write the output (float32) or the
    # accumulator, each through a view of its own
    outs = {}
    for suffix in ("", "_alone") if kb.cpu else ():
        if tail_to_output:
            view = flat(buf["w_grad"], I + H, name=f"w_grad_rows{suffix}")
        elif suffix:
            view = alias(acc, f"wg{suffix}")
        else:
            view = acc
        outs[suffix] = view, acc_rest if view is acc else kb.rest_view(view)

    def pack(name, rows, cols, first_col, value):
        """``a`` at the chunk's rows ``< rows``, columns ``first_col + k``: ``value(r, k)``
        (walked along the rows when transposed: contiguous stores)."""
        if transposed:
            kb.spatial(name, (cols, rows), lambda k, r: T.buffer_store(
                a, value(r, k), [first_col + k, r]))
        else:
            kb.spatial(name, (rows, cols), lambda r, k: T.buffer_store(
                a, value(r, k), [r, first_col + k]))

    def pack_chunk(prefix: str, first, rows):
        """The chunk's operands: ``a`` filled, and the accessor of ``dicfo``'s panels."""
        def masked(value):
            return lambda r, k: tirx.if_then_else(first + r < M, value(first + r, k), zero())

        x_rows = masked(lambda r, k: f32(x[r, k]))
        h_before = masked(lambda r, k: tirx.if_then_else(
            r < B, f32(buf["h_prev"][r, k]), f32(h[r - B, k])))
        pack(f"{prefix}_pack_x", rows, I, 0, x_rows)
        pack(f"{prefix}_pack_h", rows, H, I, h_before)
        return kb.panels(f"{prefix}_d", rows, G, lambda r, j: dicfo[first + r, j], d_scratch)

    def gemm(prefix: str, rows, d, out, rest, init, panels: bool):
        kb.gemm(prefix, out, I + H, G, rows, lambda k, r: a[k, r] if transposed else a[r, k], d,
                pad=False, init=init, out_panels=panels, rest_out=rest)

    tail = kb.cpu  # GPU tiles need a constant reduction: whole chunks only
    whole = M // chunk * chunk if tail else M
    with kb.row_chunks("w_grad_chunk", whole, chunk, per_step=True) as (first, _):
        gemm("w_grad", chunk, pack_chunk("w_grad", first, chunk), acc, acc_rest,
             lambda k, j: tirx.Select(first > 0, acc[acc_at(k, j)], zero()),
             len(acc_shape) == 3)
    if not tail:
        return (None if in_output else (lambda k, j: acc[acc_at(k, j)])), False
    # At most one chunk, of the rows left rounded up to ROW_TILE (at most ``chunk``):
    # ``dicfo`` is zero that far past its last row, the packs write zeros there. Exactly one
    # where it writes the output. It starts from the accumulator after whole chunks, from zero
    # without any (a GEMM that read the accumulator there streamed a scratch of ``w``'s size
    # for nothing, docs/performance.md, "the weight gradient's last chunk").
    rows = padded(M - whole)
    panels = not tail_to_output and len(acc_shape) == 3
    with kb.row_chunks("w_grad_tail_chunk", chunk if tail_to_output else M - whole, chunk,
                       per_step=True):
        d = pack_chunk("w_grad_tail", whole, rows)
        with T.If(whole > 0):
            with T.Then():
                gemm("w_grad_tail", rows, d, *outs[""], lambda k, j: acc[acc_at(k, j)], panels)
            with T.Else(), kb.version("_alone"):
                gemm("w_grad_tail", rows, d, *outs["_alone"], None, panels)
    if tail_to_output:
        return None, True
    return (lambda k, j: acc[acc_at(k, j)]), False


def _x_grad_in_place(kb, buf, sizes, dicfo, w_tx):
    """float32 ``x_grad = dicfo @ w[:I]^T`` accumulated in the output: one GEMM over the whole
    row tiles, one over the ``< ROW_TILE`` rows left (through a tile of scratch)."""
    L, Tn, B, I, H = sizes
    M, G = L * B, 4 * H
    whole = M // ROW_TILE * ROW_TILE
    tail = kb.temp("x_grad_tail", (ROW_TILE, I))
    head = flat(buf["x_grad"], whole, name="x_grad_head")
    rest = flat(buf["x_grad"], Tn * B - whole, first=whole, name="x_grad_rest")
    kb.gemm("x_grad_gemm", head, whole, I, G, lambda r, j: dicfo[r, j], w_tx, pad=False)
    kb.gemm("x_grad_tail", tail, M - whole, I, G, lambda r, j: dicfo[whole + r, j], w_tx)
    kb.by_work((Tn * B - whole) * I, lambda: kb.spatial(
        "x_grad_out", (Tn * B - whole, I), lambda r, k: T.buffer_store(
            rest, tirx.if_then_else(whole + r < M, tail[r, k], zero()), [r, k])))


def _x_grad_by_chunks(kb, buf, dtype, sizes, dicfo, w_tx):
    """``x_grad = dicfo @ w[:I]^T`` of a float16 op: accumulated in float32 one chunk of
    ``X_GRAD_CHUNK`` rows at a time (block ``x_grad_chunk``), then rounded into the output,
    so the float32 scratch does not grow with the sequence. CPU builds compute the rows left
    after the whole chunks as one more chunk of that many rows rounded up to ``ROW_TILE``
    (block ``x_grad_tail_chunk``; 100 rows computed 256 before); GPU builds, whose tiles need
    a constant row count, run whole chunks. A chunk reads the rows past ``M`` that ``dicfo``
    has (zeros) and drops their results."""
    L, Tn, B, I, H = sizes
    M, G = L * B, 4 * H
    x_grad = flat(buf["x_grad"], Tn * B)
    xg = kb.temp("xg", (X_GRAD_CHUNK, I))
    xg_rest = kb.rest_view(xg)

    def out(prefix, first, count):
        kb.spatial(prefix, (count, I), lambda r, k:
                T.buffer_store(x_grad, store(xg[r, k], dtype), [first + r, k]))

    tail = kb.cpu
    whole = M // X_GRAD_CHUNK * X_GRAD_CHUNK if tail else M
    with kb.row_chunks("x_grad_chunk", whole, X_GRAD_CHUNK) as (first, count):
        kb.gemm("x_grad_chunk_gemm", xg, X_GRAD_CHUNK, I, G,
             lambda r, j: dicfo[first + r, j], w_tx, pad=False, rest_out=xg_rest)
        out("x_grad_out", first, count)
    if tail:
        with kb.row_chunks("x_grad_tail_chunk", M - whole, X_GRAD_CHUNK):
            kb.gemm("x_grad_tail_gemm", xg, M - whole, I, G, lambda r, j: dicfo[whole + r, j],
                 w_tx, rest_out=xg_rest)
            out("x_grad_tail_out", whole, M - whole)
    kb.spatial("x_grad_pad", (Tn * B - M, I), lambda r, k: T.buffer_store(
        x_grad, zero(dtype), [M + r, k]))
