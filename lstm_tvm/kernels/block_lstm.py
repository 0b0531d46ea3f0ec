"""Kernel of the sequence forward ops ``BlockLSTM`` and ``BlockLSTMV2``.

The input projection ``x @ w[:I] + b`` for all steps is one GEMM over the ``T*B`` rows (block
``xw``, reading a float32 ``x`` in place, a float16 one widened once by block ``x_f32``; ``w``
is copied once into float32 column panels, block ``w_panels``, see ``kb.panels``, except in
the version for fewer than :data:`PACK_FROM_ROWS` rows, blocks ``<name>_short``). The time
loop (block ``step``) then runs, per step, the recurrent product ``h @ w[I:]`` (block
``gates``) and the fused gate math (blocks ``gate_act`` and ``cell``, which also writes the
next float32 state; block ``state_update`` moves the new cell state in place). Batches below
:data:`GATE_ROWS_BELOW` run the product and the gate math a chunk of units at a time, in a
version per batch (blocks ``<name>_few<B>``, see ``kb.gate_rows`` and ``kb.few_rows``: the
product over exactly ``B`` rows, reading ``h`` through a copy per chunk of units, block
``h_rows``, see ``kb.row_copies``); a prepacked kernel's product then reads ``w_units`` (see
:func:`weight_packs`). The state stays in float32 between steps, unrounded even for
float16 outputs (TF feeds back rounded values; lstm_tvm is more accurate); ``h`` in two slots
on CPUs, one read and one written each step. Steps ``t >= seq_len_max`` are zero in every
output (block ``pad``). A float16 kernel of the tensor-core variant
(:attr:`KernelVariant.tensor_cores`) reads float16 operands in its input projection instead,
for the GPU's tensor cores (:func:`_tensor_core_projection`).
"""

from __future__ import annotations

from .._tvm import tirx
from ..registry import OpSpec, forget_bias_of
from ._builder import T, flat, kernel, padded, zero
from .contract import GATE_ROWS_BELOW, GATES, PANEL, ROW_TILE
from .tir_analysis import is_static
from ._gates import ACC, CellConfig, f32, gate_offsets
from ._weights import WeightPack, weight_panels
from .block_cell import activation_scratch, cell_blocks, weight_packs as cell_packs
from .variant import KernelVariant

#: The forward outputs, all (T, B, H).
OUTPUTS = ("i", "cs", "f", "o", "ci", "co", "h")
#: Sequences of fewer rows (``seq_len_max * B``) read ``w`` in place: packing it into panels
#: (2 MiB at I=H=256) costs more than the panels save over so few rows (I=H=256 on a Zen 5:
#: T=1 B=1 2.0x, T=8 B=1 1.25x, T=1 B=8 1.6x; T=16 B=1 0.96, T=8 B=8 0.86; docs/performance.md).
PACK_FROM_ROWS = 16


def weight_packs(input_size: int, cell_size: int) -> tuple[WeightPack, ...]:
    """The panels of :func:`~.block_cell.weight_packs` and, where ``PANEL`` divides ``H``,
    the recurrent rows again in panels of unit chunks (``w_units``): panel ``u`` holds the four
    gates of units ``u * PANEL ..`` side by side, so that a one-row step streams each chunk's
    weights as one contiguous run (see ``kb.gate_rows``)."""
    I, H = input_size, cell_size
    packs = cell_packs(I, H)
    if H % PANEL:
        return packs
    return (*packs, WeightPack("w_units", H, GATES * H,
                               lambda w, k, c: w[I + k, _unit_column(c, H)],
                               panel=GATES * PANEL))


def _unit_column(c, H):
    """The column of ``w`` that column ``c`` of ``w_units`` holds."""
    chunk, rest = c // (GATES * PANEL), c % (GATES * PANEL)
    return rest // PANEL * H + chunk * PANEL + rest % PANEL


def _units_column(j, H):
    """The column of ``w_units`` that holds column ``j`` of ``w`` (the inverse of
    :func:`_unit_column`)."""
    return (j % H) // PANEL * (GATES * PANEL) + j // H * PANEL + j % PANEL


#: Rows of a tensor-core variant's input projection are padded to a multiple of this: a thread
#: block's tile of 16x16 fragments (``lstm_tvm.schedule.gpu.WMMA_WARPS`` x ``WMMA_FRAGMENTS``).
TC_ROWS = 64


def block_lstm(op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict,
        variant: KernelVariant, gemms: list | None = None):
    """``BlockLSTM`` / ``BlockLSTMV2`` over ``seq_len_max`` steps; symbolic ``T`` and ``B``.
    CPU builds run sequences of fewer than :data:`PACK_FROM_ROWS` rows (``seq_len_max * B``)
    in a version reading ``w`` in place (blocks ``<name>_short``): packing it costs more than
    it saves there (unless built prepacked: the panels are then a parameter)."""
    packs = weight_packs(input_size, cell_size)
    with kernel(op, dtype, input_size, cell_size, variant, packs=packs,
                gemms=gemms) as (buf, size, kb):
        rows = kb.bind_steps(buf["seq_len_max"] * size["B"])
        if (not kb.cpu or is_static(rows)
                or kb.prepacked):
            # GPU builds; tuning tasks (constant sizes): records are made for the packed
            # version, the short one runs the default schedules; prepacked: nothing to save
            _forward(kb, op, dtype, input_size, cell_size, attrs, buf, size, packed=True)
        else:
            with T.If(rows >= PACK_FROM_ROWS):
                with T.Then():
                    _forward(kb, op, dtype, input_size, cell_size, attrs, buf, size, packed=True)
                with T.Else(), kb.version("_short"):
                    _forward(kb, op, dtype, input_size, cell_size, attrs, buf, size, packed=False)
        L, Tn, B, H = buf["seq_len_max"], size["T"], size["B"], cell_size

        def pad(t, n, k):
            for name in OUTPUTS:
                T.buffer_store(buf[name], zero(dtype), [L + t, n, k])

        kb.by_work((Tn - L) * B * H, lambda: kb.spatial("pad", (Tn - L, B, H), pad))
    return kb.get()


def _tensor_core_projection(kb, buf: dict, x, xw, valid, rows, I: int, G: int,
                            dtype: str) -> None:
    """The input projection ``xw = x @ w[:I]`` of a tensor-core variant (block ``xw``):
    float16 operands read as such (the ``valid`` rows of ``x`` copied, the rest zero, block
    ``x_f16``; ``w`` in place) and float32 sums from zero (the gate math adds the bias). All
    ``rows`` rows (``T * B``, not ``seq_len_max * B``) padded to :data:`TC_ROWS` are computed:
    the GEMM then covers exactly its buffers' rows but the last ``TC_ROWS``, which only a
    launch on an empty grid writes (a schedule cannot prove ``seq_len_max <= T``, and a row
    count it cannot bound against a buffer's makes it add predicates that tensorization
    refuses)."""
    padded_rows = padded(rows, TC_ROWS)
    x16 = kb.temp("x_f16", (padded_rows + TC_ROWS, I), dtype)
    kb.spatial("x_f16", (padded_rows, I), lambda m, k: T.buffer_store(
        x16, tirx.if_then_else(m < valid, x[m, k], tirx.const(0, dtype)), [m, k]))
    kb.gemm("xw", xw, rows, G, I, lambda m, k: f32(x16[m, k]),
            lambda k, j: f32(buf["w"][k, j]), multiple=TC_ROWS)


def _forward(kb, op: OpSpec, dtype: str, input_size: int, cell_size: int, attrs: dict, buf: dict,
             size: dict, packed: bool) -> None:
    """The blocks of :func:`block_lstm`, with ``w`` packed into panels or read in place."""
    I, H = input_size, cell_size
    G = 4 * H
    off = gate_offsets(op.gates, H)
    cfg = CellConfig(forget_bias_of(op, attrs), attrs["cell_clip"], attrs["use_peephole"])
    L, Tn, B = buf["seq_len_max"], size["T"], size["B"]
    x = flat(buf["x"], Tn * B)
    rows = Tn * B if packed else PACK_FROM_ROWS  # the short version's rows are fewer
    tc = kb.variant.tensor_cores and dtype != ACC  # see _tensor_core_projection
    xw = kb.temp("xw", (padded(Tn * B, TC_ROWS) + TC_ROWS, G) if tc else (rows + ROW_TILE, G))
    gates = kb.temp("gates", (padded(B), G))
    cs_state, cs_next = kb.temp("cs_state", (B, H)), kb.temp("cs_next", (B, H))
    acts = activation_scratch(kb, B, H)
    packs = weight_packs(I, H)
    w = (weight_panels(kb, buf, packs[0]) if packed
         else lambda k, j: f32(buf["w"][k, j]))
    # A prepacked kernel's panels of unit chunks (``w_units``, where H has them), read by
    # ``w``'s column; the others' gate-rows product reads ``w``'s panels.
    units = (weight_panels(kb, buf, next(p for p in packs if p.name == "w_units"))
             if kb.prepacked and "w_units" in buf else None)
    if tc:
        _tensor_core_projection(kb, buf, x, xw, L * B, Tn * B, I, G, dtype)
    elif dtype == ACC:
        # The padded rows read the last row again (a clamped index: a guarded load in
        # a GEMM operand keeps LLVM from holding the accumulators in registers); their
        # results are never used.
        def row(m, k):
            return x[tirx.min(m, L * B - 1), k]
    else:
        # Widened once, padded rows zero: the GEMMs then load float32, as for float32 (a
        # float16 left operand costs a conversion per element: xw at 100x64x512x512 ran
        # 30% slower).
        x16, x = x, kb.temp("x_f32", (rows + ROW_TILE, I))
        kb.spatial("x_f32", (padded(L * B), I), lambda m, k: T.buffer_store(
            x, tirx.if_then_else(m < L * B, f32(x16[m, k]), zero()), [m, k]))

        def row(m, k):
            return x[m, k]
    if not tc:
        kb.gemm("xw", xw, L * B, G, I, row, w, init=lambda m, j: f32(buf["b"][j]))

    # The h state in two slots on CPUs, one read and one written each step (the threads of a
    # gate-rows step run its product and gate math without a barrier between: see
    # ``kb.gate_rows``).
    slots = 2 if kb.cpu else 1
    h_state = kb.temp("h_state", (slots * padded(B), H))

    def init_state(n, k):
        T.buffer_store(h_state, f32(buf["h_prev"][n, k]), [n, k])
        T.buffer_store(cs_state, f32(buf["cs_prev"][n, k]), [n, k])

    def pad_state(n, k):
        for slot in range(slots):
            T.buffer_store(h_state, zero(), [slot * padded(B) + B + n, k])

    def state_blocks():
        kb.spatial("state_init", (B, H), init_state)
        kb.spatial("state_pad", (padded(B) - B, H), pad_state)

    kb.by_work(padded(B) * H, state_blocks)
    gates_views = kb.step_views(gates, B)
    gate_row_views = {m: flat(gates, m, name=f"gates_few{m}") for m in range(1, GATE_ROWS_BELOW)}
    h_rows = kb.row_copy_scratch("h_rows", GATE_ROWS_BELOW - 1, H, H)
    with kb.time_loop(L, Tn) as vt:
        now, nxt = ((vt % 2) * padded(B), (vt + 1) % 2 * padded(B)) if kb.cpu else (0, 0)
        if kb.cpu:
            init, pre = (lambda n, j: xw[vt * B + n, j]), (lambda n, k, g: gates[n, off[g] + k])
        else:
            # The GPU's step GEMM sums from zero (it splits K over threads, see
            # schedule/gpu.py): the input projection is added in the gate math.
            init = None

            def pre(n, k, g):
                value = gates[n, off[g] + k] + xw[vt * B + n, off[g] + k]
                return value + f32(buf["b"][off[g] + k]) if tc else value

        def h(n, k):
            return h_state[now + n, k]

        def w_h(k, j):
            return w(I + k, j)

        def step(product):
            product()
            cell_blocks(kb, cfg, buf, dtype, acts, pre,
                        lambda n, k: cs_state[n, k], lambda n, k: (vt, n, k),
                        state={"h": (h_state, lambda n, k: (nxt + n, k)),
                               "cs": (cs_next, lambda n, k: (n, k))})
            kb.spatial("state_update", (B, H), lambda n, k: T.buffer_store(
                cs_state, cs_next[n, k], [n, k]), group="cell")

        def w_units(k, j):
            return w_h(k, j) if units is None else units(k, _units_column(j, H))

        def gate_rows(m):
            def product():
                rows = kb.row_copies("h_rows", h_rows, h, m, H, group="cell")
                kb.gate_rows("gates", gate_row_views[m], m, G, H,
                             lambda n, j, k: rows(n, k, j) * w_units(k, j), init, group="cell")
            step(product)

        def more_rows():
            step(lambda: kb.step_gemm("gates", gates, gates_views, B, G, H, h, w_h, init=init,
                                      single_rows=False))

        kb.few_rows(B, GATE_ROWS_BELOW, gate_rows, more_rows)
