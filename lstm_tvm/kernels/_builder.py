"""Building kernels with TVM's IR builder: signatures from the registry, common block shapes.

A kernel is written as Python that emits ``s_tir`` blocks inside :func:`kernel`, whose
parameters are the op's inputs then outputs in the registry's order (destination-passing
style), with symbolic ``T`` and ``B``, through the :class:`KernelBuilder` it yields: the
kernel's :class:`~.variant.KernelVariant` and emission state. Blocks are named and annotated
as :mod:`.contract` says, so that schedules can find them. Used by the kernel files of this
package only.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import numpy as np

from .._tvm import IRBuilder, TB as T, tirx
from ..registry import OpSpec
from ._gates import ACC
from .contract import (FUSE_GROUP, GATE_ROW, GATE_ROW_COPY, GATES, LOOP_BODY, ONE_THREAD,
                       ONE_THREAD_BELOW, PANEL, ROW_TILE, SHORT_ROWS, SINGLE_ROWS_BELOW,
                       STEP_BLOCK, TIME_STEP, TRANSPOSE_LANES, TRANSPOSE_TILE, GemmBlock,
                       unit_chunk)
from .tir_analysis import divides, gemm_operand, is_static
from .variant import KernelVariant

__all__ = ["KernelBuilder", "T", "flat", "kernel", "padded", "panel_layout", "sizes_of", "zero"]


def zero(dtype: str = ACC):
    """The constant 0 of ``dtype``."""
    return tirx.const(0, dtype)


@contextlib.contextmanager
def kernel(op: OpSpec, dtype: str, input_size: int, cell_size: int, variant: KernelVariant,
           params: Sequence = (), packs: Sequence = (), gemms: list | None = None):
    """Open a PrimFunc for ``op`` (an :class:`OpSpec`, or any object with a ``name``) in the
    form ``variant`` says; yields ``(buffers, sizes, builder)``.

    ``buffers`` maps every input and output name of the registry to its ``Buffer`` (or to a
    scalar ``Var`` for int64 scalars such as ``seq_len_max``); ``sizes`` maps ``T, B, I, H`` to
    the (symbolic, or the variant's constant) sizes; ``builder`` is the kernel's
    :class:`KernelBuilder`, which emits its blocks. ``params`` overrides the registry's tensor
    list (for helpers that are not TF ops): a sequence of ``TensorSpec``. ``packs``: the
    kernel's :class:`~._weights.WeightPack`\\ s, float32 parameters between the inputs and the
    outputs when the variant is prepacked. ``gemms``: a list that receives a
    :class:`GemmBlock` per GEMM block emitted. Call ``builder.get()`` after the ``with`` block
    for the PrimFunc.
    """
    fixed = {k: tirx.IntImm("int64", v) for k, v in variant.fixed_sizes}
    sizes = {"T": tirx.Var("T", "int64"), "B": tirx.Var("B", "int64"),
             **fixed, **sizes_of(input_size, cell_size)}
    inputs = [] if params else list(op.inputs)
    # destination passing: whatever is read (the inputs, prepacked panels) before the outputs
    specs = list(params) if params else [*inputs, *(packs if variant.prepacked else ()),
                                         *op.outputs]
    with IRBuilder() as ir:
        builder = KernelBuilder(variant, ir, gemms)
        with T.prim_func(s_tir=True):
            T.func_name(f"lstm_tvm_{op.name}_{dtype}")
            T.func_attr({"tirx.noalias": True})
            buffers = {}
            for spec in specs:
                if spec in packs:
                    buffers[spec.name] = T.arg(spec.name, T.Buffer(spec.shape, ACC,
                                                                   buffer_name=spec.name))
                elif spec.dtype == "int64" and not spec.shape:
                    buffers[spec.name] = T.arg(spec.name, tirx.Var(spec.name, "int64"))
                else:
                    shape = spec.concrete_shape(sizes)
                    spec_dtype = dtype if spec.dtype == "T" else spec.dtype
                    align = variant.input_align(spec_dtype) if spec in inputs else 0
                    buffers[spec.name] = T.arg(spec.name, T.Buffer(
                        shape, spec_dtype, buffer_name=spec.name, align=align))
            if "seq_len_max" in buffers and fixed:
                builder.steps = (buffers["seq_len_max"], sizes["T"])
            if "seq_len_max" in buffers:
                # Callers outside lstm_tvm's Python API (an exported library) get an error, not
                # an out-of-bounds access, for a step count beyond the time extent.
                n = buffers["seq_len_max"]
                with T.Assert(tirx.all(n >= 0, n <= sizes["T"]),
                              f"{op.name}: seq_len_max must be in [0, T]", "ValueError"):
                    yield buffers, sizes, builder
            else:
                yield buffers, sizes, builder


class KernelBuilder:
    """What the blocks of one kernel are emitted with: its :class:`KernelVariant` and the state
    of the emission (the open :meth:`version`, whether inside a loop body whose GEMMs run per
    iteration, the GEMM blocks emitted so far).

    Made by :func:`kernel` (or directly, around a ``T.prim_func`` of one's own: ``ir`` is then
    None); its methods emit blocks into the PrimFunc being built."""

    def __init__(self, variant: KernelVariant = KernelVariant(), ir=None,
                 gemms: list | None = None):
        self.variant = variant
        self._ir = ir
        #: Receives a :class:`GemmBlock` per :meth:`gemm` block (None: not recorded).
        self.gemms = gemms
        #: ``(seq_len_max, T)`` of a kernel with constant sizes (see :meth:`bind_steps`).
        self.steps = None
        self._in_step = False
        #: The open :meth:`version`: the suffix of block and scratch names, and whether its
        #: blocks run on one thread.
        self._version = ("", False)

    def get(self):
        """The PrimFunc built (after :func:`kernel`'s ``with`` block)."""
        return self._ir.get()

    @property
    def cpu(self) -> bool:
        """Whether this is the CPU form of the kernel (see :class:`KernelVariant`)."""
        return self.variant.cpu

    @property
    def prepacked(self) -> bool:
        """Whether the kernel takes its weight panels as parameters."""
        return self.variant.prepacked

    @contextlib.contextmanager
    def _state(self, **values):
        """Set attributes of the emission state inside the ``with``."""
        old = {k: getattr(self, k) for k in values}
        for k, v in values.items():
            setattr(self, k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                setattr(self, k, v)

    @contextlib.contextmanager
    def time_loop(self, steps, extent, reverse: bool = False):
        """The serial loop over ``steps`` time steps of a sequence kernel, one block
        :data:`STEP_BLOCK` per step; yields the step's time index (``0 .. steps-1``, or from
        ``steps-1`` down with ``reverse``), an opaque block iterator over ``extent``. Blocks
        emitted inside run once per step (GEMMs there are marked ``per_step``)."""
        with T.serial(0, steps) as s, T.sblock(self._versioned(STEP_BLOCK)):
            vt = T.axis.opaque(extent, steps - 1 - s if reverse else s, dtype="int64")
            T.sblock_attr({TIME_STEP: True})
            with self._loop_body(True):
                yield vt

    @contextlib.contextmanager
    def row_chunks(self, name: str, rows, size: int, per_step: bool = False):
        """A serial loop over ``rows`` rows in chunks of ``size``, one opaque block ``name`` per
        chunk; yields the chunk's first row and its row count (``size``, fewer in a last
        partial chunk). For work whose scratch should hold a chunk, not all rows. With
        ``per_step`` the GEMMs inside reduce over the chunk's rows (the chunks are their
        reduction's slabs): they are marked ``per_step`` like those of a :meth:`time_loop`, and
        not cut further."""
        chunks = (rows + size - 1) // size
        if isinstance(chunks, int):
            chunks = tirx.IntImm("int64", chunks)
        with T.serial(0, chunks) as c, T.sblock(name):
            first = T.axis.opaque(chunks, c, dtype="int64") * size
            with self._loop_body(per_step):
                yield first, tirx.min(size, rows - first)

    @contextlib.contextmanager
    def _loop_body(self, per_step: bool):
        """Mark the open block as a loop body whose GEMMs run once per iteration
        (``per_step``)."""
        if not per_step:
            yield
            return
        T.sblock_attr({LOOP_BODY: True})
        with self._state(_in_step=True):
            yield

    def temp(self, name: str, shape, dtype: str = ACC):
        """A scratch buffer of the kernel (float32 unless told)."""
        buf = T.alloc_buffer(shape, dtype)
        IRBuilder.name(self._versioned(name), buf)
        return buf

    def panels(self, name: str, rows: int, cols: int, value: Callable, scratch=None,
               transpose: bool = False, panel: int = PANEL):
        """Float32 scratch holding ``value(r, c)`` for ``r < rows, c < cols`` (block ``name``),
        and its accessor ``(r, c) -> load``, for a GEMM's right operand (``r`` the reduction
        index).

        Where :data:`PANEL` divides ``cols`` the matrix is stored as ``cols / PANEL`` panels of
        ``(rows, PANEL)``, each contiguous: a ``PANEL``-wide register tile then streams one
        contiguous panel along the reduction instead of a strided column block (up to 30%
        faster for the recurrent products). Otherwise it is stored ``(rows, cols)``.
        ``scratch`` (from :meth:`panel_scratch`) is filled instead of a new buffer: one
        allocated outside a loop whose every iteration refills it. With a constant row count
        the copy walks panel by panel (block ``(cols / PANEL, rows, PANEL)``), its parallel
        loop over whole panels: each thread writes panels of its own, contiguously, which a
        GEMM whose tiles split the columns the same way then finds in that core's cache (it
        speeds up a sequence forward's recurrent weights at B=1: docs/performance.md,
        "Earlier figures moved here from code comments").

        ``panel``: panels of another width (a multiple of :data:`PANEL`), copied panel by
        panel, whatever the other options.

        ``transpose``: ``value`` reads contiguous memory along ``r``, not ``c`` (the panels of
        a transposed matrix). On a CPU (where :data:`TRANSPOSE_LANES` divides ``rows``) the
        copy moves square tiles through vector registers (:meth:`_transposed_tiles`: ``value``
        is then called with a vector of ``r``). Otherwise the block walks tiles of
        :data:`TRANSPOSE_TILE` rows of one panel, ``r`` innermost: it reads whole cache lines
        of the source and writes each tile (4 KiB) while it is in the L1 cache. Along ``c``
        the source's lines lie a row of the source apart, often a multiple of 4 KiB: those of
        one tile would all fall in one set of the L1 cache and evict each other
        (docs/performance.md, "transposed weights").
        """
        shape, at = panel_layout(rows, cols, panel)
        buf = self.temp(name, shape) if scratch is None else scratch
        if panel != PANEL:
            self.spatial(name, (cols // panel, rows, panel), lambda p, r, c: T.buffer_store(
                buf, value(r, p * panel + c), [p, r, c]))
        elif (transpose and self.cpu and not cols % PANEL and isinstance(rows, int)
                and not rows % TRANSPOSE_LANES):
            self._transposed_tiles(name, buf, at, rows, cols, value)
        elif (transpose and not cols % PANEL and isinstance(rows, int)
                and not rows % TRANSPOSE_TILE):
            tile = TRANSPOSE_TILE

            def store_tile(cp, rt, c, r):
                row, col = rt * tile + r, cp * PANEL + c
                T.buffer_store(buf, value(row, col), list(at(row, col)))

            self.spatial(name, (cols // PANEL, rows // tile, PANEL, tile), store_tile)
        elif not cols % PANEL and isinstance(rows, int):
            self.spatial(name, (cols // PANEL, rows, PANEL), lambda p, r, c: T.buffer_store(
                buf, value(r, p * PANEL + c), [p, r, c]))
        else:
            self.spatial(name, (rows, cols), lambda r, c: T.buffer_store(
                buf, value(r, c), list(at(r, c))))
        return lambda r, c: buf[at(r, c)]

    def _transposed_tiles(self, name: str, buf, at, rows: int, cols: int, value) -> None:
        """:meth:`panels`' copy of a transposed matrix on a CPU: a parallel loop over tiles of
        :data:`TRANSPOSE_LANES` x :data:`TRANSPOSE_LANES`, each loaded as vectors along ``r``
        (rows of the source), transposed in registers (a butterfly of two-vector shuffles:
        at each level, the off-diagonal halves of each block swap) and stored as vectors along
        ``c`` (a panel's rows). Copied one element at a time, every store was a scalar one,
        and the copy took several times as long (docs/performance.md, "transposed weights in
        registers")."""
        v = TRANSPOSE_LANES
        row_tiles = rows // v
        with T.parallel(0, cols // v * row_tiles) as t:
            with T.sblock(self._versioned(name)):
                c0, r0 = t // row_tiles * v, t % row_tiles * v
                vecs = [T.bind(value(tirx.Ramp(r0, 1, v), c0 + c)) for c in range(v)]
                half = v // 2
                while half:
                    low = [i - half + v if i & half else i for i in range(v)]
                    high = [i + v if i & half else i + half for i in range(v)]
                    for c in range(v):
                        if not c & half:
                            pair = [vecs[c], vecs[c + half]]
                            vecs[c] = T.bind(tirx.Shuffle(pair, low))
                            vecs[c + half] = T.bind(tirx.Shuffle(pair, high))
                    half //= 2
                for r in range(v):
                    panel, row, col = at(r0 + r, c0)
                    T.buffer_store(buf, vecs[r], [panel, row, tirx.Ramp(col, 1, v)])

    def panel_scratch(self, name: str, rows: int, cols: int):
        """A float32 scratch for ``panels(..., scratch=)`` of that many rows and columns."""
        return self.temp(name, panel_layout(rows, cols)[0])

    def gemm(self, name: str, out, M, N, K, a: Callable, b: Callable,
             init: Callable | None = None, pad: bool = True, row0=0,
             out_panels: bool = False, multiple: int = ROW_TILE, rest_out=None) -> None:
        """``out[row0 + m, n] = init(m, n) + sum_k a(m, k) * b(k, n)`` for ``m < M, n < N,
        k < K``.

        ``K`` may be symbolic. With ``pad`` (for a symbolic ``M``) the rows
        ``M <= m < padded(M, multiple)`` are computed too: ``a`` must be readable there (a
        scratch operand with spare rows) and ``out`` must have them; callers ignore their
        results. ``out_panels``: ``out`` is stored as panels, ``(N / PANEL, M, PANEL)`` (see
        :meth:`panels`), for a symbolic ``N`` (a multiple of ``PANEL``): an output row stride
        that is not a constant keeps LLVM from holding the accumulators in registers.

        For a CPU whose register tile has rows that do not divide ``ROW_TILE``
        (:attr:`KernelVariant.gemm_tile_rows`) the rows are two blocks: ``name`` over the most
        rows that are a multiple of the tile's, ``<name>_rest`` over the (at most
        ``tile - 1``, an even number of) rows left, through a view of ``out`` of its own:
        ``rest_out`` (:meth:`rest_view`), made here when not given, which a GEMM inside a
        loop's block cannot (the view must be declared outside it). AVX2's 6x16 tile ran GEMMs
        15-20% faster than 4x16 (docs/performance.md).
        """
        rows = padded(M, multiple) if pad else M
        split = self._row_split(rows, multiple if pad else 1)
        if split is None:
            self._gemm_block(name, out, rows, N, K, a, b, init, row0, out_panels)
            return
        head, rest = split
        self._gemm_block(name, out, head, N, K, a, b, init, row0, out_panels)
        self._gemm_block(f"{name}_rest", self.rest_view(out) if rest_out is None else rest_out,
                         rest, N, K, lambda m, k: a(head + m, k), b,
                         None if init is None else (lambda m, n: init(head + m, n)),
                         row0 + head, out_panels)

    def rest_view(self, out):
        """A view of all of ``out`` for the rows a :meth:`gemm` cut for the register tile's
        rows leaves (None where GEMMs are not cut): make it outside the loop whose body holds
        the GEMM."""
        return alias(out, f"{out.name}_rest") if self._cut_rows() else None

    def _row_split(self, rows, multiple: int):
        """``(head, rest)`` row counts of a :meth:`gemm` over ``rows`` rows (a multiple of
        ``multiple``) cut for the register tile's rows, or None where it is not cut: no tile
        rows, a tile that divides ``ROW_TILE``, constant rows the tile divides or exceeds, or a
        symbolic count not known to be a multiple of ``ROW_TILE`` (the rest is then even:
        ``2 * (rest // 2)``, which lets a schedule tile it by two rows)."""
        tile = self._cut_rows()
        if not tile:
            return None
        if is_static(rows):
            rows = int(rows)
            return None if rows % tile == 0 or rows < tile else (rows // tile * tile,
                                                                  rows % tile)
        if multiple % ROW_TILE and not divides(ROW_TILE, rows):
            return None
        head = rows // tile * tile
        return head, (rows - head) // 2 * 2

    def _cut_rows(self) -> int:
        """The register tile's rows GEMMs are cut for, or 0 (none, a tile that divides
        ``ROW_TILE``, or not the CPU form)."""
        tile = self.variant.gemm_tile_rows
        return tile if tile and ROW_TILE % tile and self.cpu else 0

    def _gemm_block(self, name, out, rows, N, K, a, b, init, row0, out_panels) -> None:
        """One GEMM block of :meth:`gemm` over ``rows`` rows (recorded in :attr:`gemms`)."""
        index = ((lambda m, n: (n // PANEL, row0 + m, n % PANEL)) if out_panels
                 else (lambda m, n: (row0 + m, n)))
        self.reduction(name, out, (rows, N), (K,), index,
                       lambda s, r: a(s[0], r[0]) * b(r[0], s[1]), init=init)
        if self.gemms is not None:
            m, n, k = (tirx.Var(f"gemm_{c}", "int64") for c in "mnk")
            a_major, a_dtype, _ = gemm_operand(a(m, k), m, k)
            b_major, b_dtype, b_panel = gemm_operand(b(k, n), k, n)
            self.gemms.append(GemmBlock(
                self._versioned(name), *(self.bind_steps(e) for e in (rows, N, K)),
                "mk" if a_major else "km", a_dtype,
                "kp" if b_panel else "kn" if b_major else "nk", b_dtype, self._in_step))

    def bind_steps(self, extent):
        """``extent`` with ``seq_len_max`` replaced by ``T`` in a kernel of constant sizes
        (tuning tasks, whose sequences run every step), else ``extent`` itself."""
        if self.steps is None or isinstance(extent, int):
            return extent
        from tvm.sym import Analyzer
        analyzer = Analyzer()
        analyzer.bind(*self.steps)
        return analyzer.simplify(extent)

    def step_views(self, out, M) -> tuple:
        """The views of a per-step GEMM's output ``out`` (``(padded(M), N)``) that the
        small-batch versions of :meth:`step_gemm` write: ``M`` rows and
        ``padded(M, SHORT_ROWS)`` rows, and the :meth:`rest_view` of the full version. Make
        them before the time loop."""
        return (flat(out, M, name=f"{out.name}_rows"),
                flat(out, padded(M, SHORT_ROWS), name=f"{out.name}_rows{SHORT_ROWS}"),
                self.rest_view(out))

    def step_gemm(self, name: str, out, views, M, N, K, a: Callable, b: Callable,
                  init: Callable | None = None, single_rows: bool = True) -> None:
        """A :meth:`gemm` into ``out`` (``(padded(M), N)``) inside a time step over ``M`` batch
        rows, in a version chosen by ``M`` (CPU form): below :data:`SINGLE_ROWS_BELOW` rows
        (one stream or two) block ``<name>_rows`` computes exactly ``M`` rows, one per tile;
        up to :data:`SHORT_ROWS` rows block ``<name>_rows4`` computes
        ``padded(M, SHORT_ROWS)``; else block ``name`` computes ``padded(M)`` rows (8x the
        arithmetic of the step at B = 1, 2x at B = 4). ``views`` are :meth:`step_views` of
        ``out``: through them each block is the only writer of its buffer, as reductions must
        be. A constant ``M`` (tuning tasks) emits only the block it takes. Without
        ``single_rows`` (a caller that runs fewer rows by other means) the one-row-tile
        version is left out."""
        versions = [(SINGLE_ROWS_BELOW, f"{name}_rows", views[0], 1),
                    (SHORT_ROWS + 1, f"{name}_rows{SHORT_ROWS}", views[1], SHORT_ROWS)]
        if not single_rows:
            versions = versions[1:]
        if not self.cpu:
            versions = []

        def emit(i):
            if i == len(versions):
                self.gemm(name, out, M, N, K, a, b, init, rest_out=views[2])
                return
            below, block, view, multiple = versions[i]
            if is_static(M):
                if int(M) < below:
                    self.gemm(block, view, M, N, K, a, b, init, multiple=multiple)
                else:
                    emit(i + 1)
                return
            with T.If(M < below):
                with T.Then():
                    self.gemm(block, view, M, N, K, a, b, init, multiple=multiple)
                with T.Else():
                    emit(i + 1)

        emit(0)

    def gate_rows(self, name: str, out, M: int, N, K, term: Callable, init: Callable | None,
                  group: str) -> None:
        """A product of ``M`` (a constant) rows, ``out[m, j] = init(m, j) + sum over k of
        term(m, j, k)`` (``out`` a view of ``M`` rows; ``init`` None: from zero), whose
        ``N = 4H`` columns are four blocks of ``H`` columns, one per gate, read unit by unit by
        the blocks of fusion ``group`` (emitted next, in this version): block ``name`` marked
        :data:`GATE_ROW` so that a schedule may run each chunk of units' columns in the group's
        loop (see ``schedule/cpu/gate_rows.py``). In a time step, the group must not write
        what the product reads (a double-buffered state, another row): threads finish their
        chunks of the step at different times."""
        self.reduction(name, out, (M, N), (K,), lambda m, j: (m, j),
                       lambda s, r: term(s[0], s[1], r[0]), init=init,
                       annotations={GATE_ROW: self._versioned(group)})

    def row_copy_scratch(self, name: str, M: int, K: int, units: int):
        """The scratch of :meth:`row_copies` for up to ``M`` rows of ``K`` (allocate it
        outside the time loop): a copy per chunk of ``units`` units. None (the product then
        reads its rows in place) on a GPU, where ``units`` has no :func:`unit_chunk`, and
        where the product's weights (``GATES * units`` columns of ``units`` rows) outgrow one
        core's L2 (:attr:`KernelVariant.l2_bytes`): they then stream from further out, and
        the copies only add traffic (docs/performance.md)."""
        chunk = unit_chunk(units)
        if (chunk is None or not self.cpu
                or GATES * units * units * 4 > self.variant.l2_bytes):
            return None
        return self.temp(name, (units // chunk, M, K))

    def row_copies(self, name: str, scratch, source: Callable, M: int, units: int,
                   group: str) -> Callable:
        """The accessor ``(m, k, j) -> load`` of ``source(m, k)`` (``m < M``) for column ``j``
        of a :meth:`gate_rows` product over ``units`` units, read through ``scratch``
        (:meth:`row_copy_scratch`), a copy per chunk of units (block ``name``, marked
        :data:`GATE_ROW_COPY` for ``group``; emit it before the product): a schedule makes
        chunk ``u``'s copy in the iteration of the group's loop that computes the chunk, so
        the thread reads what other threads wrote in one burst of loads rather than line by
        line in the product's reduction. ``scratch`` None: ``source`` itself."""
        if scratch is None:
            return lambda m, k, j: source(m, k)
        chunks, K = scratch.shape[0], scratch.shape[2]
        chunk = units // int(chunks)
        with T.grid(chunks, M, K) as (u, m, k):
            with T.sblock(self._versioned(name)):
                vu, vm, vk = T.axis.remap("SSS", [u, m, k])
                self._annotate({GATE_ROW_COPY: self._versioned(group)})
                T.buffer_store(scratch, source(vm, vk), [vu, vm, vk])
        return lambda m, k, j: scratch[j % units // chunk, m, k]

    def few_rows(self, rows, below: int, few: Callable[[int], None],
                 more: Callable[[], None]) -> None:
        """Emit ``few(m)`` where ``rows == m``, for each ``0 < m < below`` (CPU form; in a
        :meth:`version` ``_few<m>`` unless ``rows`` is a constant), else ``more()``. A constant
        ``rows`` (tuning tasks) emits only the branch it takes, the GPU form only
        ``more()``."""
        if not self.cpu:
            more()
        elif not is_static(rows):
            def emit(m):
                if m == below:
                    more()
                    return
                with T.If(rows == m):
                    with T.Then(), self.version(f"_few{m}"):
                        few(m)
                    with T.Else():
                        emit(m + 1)

            emit(1)
        elif 0 < int(rows) < below:
            few(int(rows))
        else:
            more()

    def spatial(self, name: str, extents: Sequence, body: Callable,
                group: str | None = None) -> None:
        """A data-parallel block over ``extents``; ``body(*block_vars)`` emits its stores.

        Consecutive blocks of one ``group`` (same extents) may run in one parallel loop, one
        point after the other: each block may read what an earlier block of the group wrote,
        and write what an earlier one read, only at its own point (the same indices). A CPU
        block of constant extents below :data:`ONE_THREAD_BELOW` points outside a time step
        runs on one thread, as :meth:`by_work`'s small versions (a time step's blocks stay
        parallel: the step runs on every thread of the pool, see ``schedule/cpu/team.py``).
        """
        small = (self.cpu and not self._in_step
                 and all(is_static(e) for e in extents)
                 and int(np.prod([int(e) for e in extents])) < ONE_THREAD_BELOW)
        with T.grid(*extents) as loops:
            loops = _as_list(loops)
            with T.sblock(self._versioned(name)):
                axes = T.axis.remap("S" * len(loops), list(loops))
                axes = _as_list(axes)
                # a version's group of its own: a run never spans the branches of an ``if``
                self._annotate({FUSE_GROUP: self._versioned(group)} if group is not None
                               else {}, small)
                body(*axes)

    def reduction(self, name: str, out, spatial_extents: Sequence, reduce_extents: Sequence,
                  index: Callable, term: Callable, init: Callable | None = None,
                  annotations: dict | None = None) -> None:
        """``out[index(s)] = init(s) + sum over r of term(s, r)``, as one reduction block
        (annotated with ``annotations``).

        ``s`` are the spatial block vars, ``r`` the reduction ones; ``init`` defaults to 0.
        """
        n_s = len(spatial_extents)
        with T.grid(*spatial_extents, *reduce_extents) as loops:
            loops = _as_list(loops)
            with T.sblock(self._versioned(name)):
                axes = T.axis.remap("S" * n_s + "R" * len(reduce_extents), list(loops))
                axes = _as_list(axes)
                self._annotate(annotations or {})
                s, r = list(axes[:n_s]), list(axes[n_s:])
                idx = list(index(*s))
                with T.init():
                    T.buffer_store(out, init(*s) if init is not None else zero(out.dtype), idx)
                T.buffer_store(out, out[tuple(idx)] + term(s, r), idx)

    def by_work(self, points, emit: Callable[[], None]) -> None:
        """Emit ``emit()``'s blocks (elementwise blocks and sums of :meth:`spatial`,
        :meth:`reduction` and :meth:`temp` scratch) in a version chosen by ``points``, their
        work in elements (the cell ops pass ``B * 4H`` for their gate math): below
        :data:`ONE_THREAD_BELOW` a version whose blocks and scratch are named ``<name>_1t``
        and marked :data:`ONE_THREAD` (their loops stay on the calling thread), else the plain
        one. A constant ``points`` (tuning tasks) emits only the version it takes; the GPU
        form only the plain one."""
        if not self.cpu:
            emit()
            return
        if is_static(points):
            if int(points) < ONE_THREAD_BELOW:
                with self.version("_1t", one_thread=True):
                    emit()
            else:
                emit()
            return
        with T.If(points < ONE_THREAD_BELOW):
            with T.Then(), self.version("_1t", one_thread=True):
                emit()
            with T.Else():
                emit()

    def version(self, suffix: str, one_thread: bool = False):
        """Emit a second version of blocks (the other branch of an ``if`` on the sizes): every
        block and scratch emitted inside is named ``<name><suffix>`` (block names must be
        unique), fusion groups and time steps included; with ``one_thread`` its blocks are
        marked :data:`ONE_THREAD`. Versions nest."""
        outer, alone = self._version
        return self._state(_version=(outer + suffix, alone or one_thread))

    def _versioned(self, name: str) -> str:
        """``name`` as the open :meth:`version` names it."""
        return name + self._version[0]

    def _annotate(self, annotations: dict, one_thread: bool = False) -> None:
        """Annotate the open block with ``annotations`` (and :data:`ONE_THREAD` where it
        holds)."""
        if one_thread or self._version[1]:
            annotations = {**annotations, ONE_THREAD: True}
        if annotations:
            T.sblock_attr(annotations)


def sizes_of(input_size: int, cell_size: int) -> dict:
    """The constant sizes of every kernel of ``I = input_size``, ``H = cell_size``."""
    return {"I": input_size, "H": cell_size}


def alias(buffer, name: str):
    """A view of all of ``buffer`` named ``name``: a second writer's own buffer (see
    :func:`flat`)."""
    view = T.decl_buffer(buffer.shape, buffer.dtype, data=buffer.data,
                         elem_offset=buffer.elem_offset)
    IRBuilder.name(name, view)
    return view


def flat(buffer, rows, first=0, name: str | None = None):
    """A 2-D view ``(rows, last dim)`` of a contiguous buffer (e.g. ``(T, B, I)`` as ``(T*B, I)``),
    starting at row ``first``, named ``name`` (default ``<buffer>_rows``; views of one buffer
    need names of their own).

    Every call makes a new view. Blocks that write disjoint rows of one output through
    views of their own each stay the only writer of their buffer, which a reduction block
    must be to be scheduled. A reduction block should write a view that starts at row 0
    (``gemm(..., row0=)`` instead): a schedule's cache of its output inherits the view's
    offset (TVM 0.27).
    """
    cols = buffer.shape[-1]
    view = T.decl_buffer((rows, cols), buffer.dtype, data=buffer.data, elem_offset=first * cols)
    IRBuilder.name(name or f"{buffer.name}_rows", view)  # names what schedules derive from it
    return view


def panel_layout(rows: int, cols: int, panel: int = PANEL):
    """The shape of ``panels``' buffer for a ``(rows, cols)`` matrix in panels ``panel``
    columns wide, and its index map ``(r, c) -> index``."""
    if cols % panel:
        return (rows, cols), lambda r, c: (r, c)
    return (cols // panel, rows, panel), lambda r, c: (c // panel, r, c % panel)


def padded(rows, multiple: int = ROW_TILE):
    """``rows`` rounded up to a multiple of ``multiple`` (symbolic sizes welcome; ``rows``
    itself for a multiple of 1, not an expression that only simplifies to it)."""
    if multiple == 1:
        return rows
    return (rows + multiple - 1) // multiple * multiple


def _as_list(values) -> list:
    return [values] if isinstance(values, tirx.Var) else list(values)
