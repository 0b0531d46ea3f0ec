"""IR helpers of the GPU schedules (:mod:`lstm_tvm.schedule.gpu`): root allocations, a loop
nest scheduled alone in its scope, guards for empty launches, and the thread-binding check."""

from __future__ import annotations

import tvm_ffi

from .._tvm import SBlock, SBlockRealize, Schedule, tirx


def hoist_allocations(func):
    """``func`` with the root's ``AllocBuffer`` statements moved into the root block's
    allocation list (the same scope).

    TVM 0.27's ``cache_read``/``cache_write`` substitute the cached buffer in every node of the
    scope, ``AllocBuffer`` statements included: the original buffer loses its allocation and
    the cache buffer is defined twice (the build fails with "has duplicate definitions").
    Buffers in the block's list are left alone.
    """
    realize = func.body
    root = getattr(realize, "block", None)
    if root is None or not isinstance(root.body, tirx.SeqStmt):
        return func
    allocs = [st for st in root.body.seq if type(st).__name__ == "AllocBuffer"]
    if not allocs:
        return func
    rest = [st for st in root.body.seq if type(st).__name__ != "AllocBuffer"]
    block = _with_body(root, _seq(rest))
    block = SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body,
                   block.init, [*root.alloc_buffers, *(st.buffer for st in allocs)],
                   block.match_buffers, block.annotations)
    return func.with_body(SBlockRealize(realize.iter_values, realize.predicate, block))


def declared_views(func) -> dict:
    """The declarations (``DeclBuffer`` statements) of buffers over another buffer's memory
    at ``func``'s root (e.g. the kernels' row views), by buffer name."""
    root = func.body.block
    items = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    return {st.buffer.name: st for st in items if isinstance(st, tirx.DeclBuffer)}


def restore_views(func, views: dict):
    """``func`` with the root's declarations of ``views`` (see :func:`declared_views`) put back.

    TVM 0.27's ``cache_write`` of a view substitutes the cache buffer in the view's own
    declaration too: the cache buffer is then defined twice and the view not at all. Each
    declaration of ``<view>_local`` is turned back into the view's (views are never read
    through a cache: see ``_schedule_gemm``).
    """
    realize = func.body
    root = realize.block
    if not views or not isinstance(root.body, tirx.SeqStmt):
        return func
    caches = {f"{name}_local": view for name, view in views.items()}
    stmts = [caches[st.buffer.name]
             if isinstance(st, tirx.DeclBuffer) and st.buffer.name in caches else st
             for st in root.body.seq]
    return func.with_body(SBlockRealize(realize.iter_values, realize.predicate,
                                        _with_body(root, tirx.SeqStmt(stmts))))


def _seq(stmts):
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def _with_body(block, body):
    return SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                  block.alloc_buffers, block.match_buffers, block.annotations)


def _is_nest(stmt) -> bool:
    return isinstance(stmt, (tirx.For, SBlockRealize))


def _contains_block(stmt, name: str) -> bool:
    hit = []
    tvm_ffi.structural_walk(stmt, [(SBlockRealize, lambda node: hit.append(
        node.block.name_hint == name))])
    return any(hit)


def _scope_of(func, name: str):
    """``(scope block name, index in its body)`` of the loop nest holding block ``name``."""
    realize = func.body
    while True:
        body = realize.block.body
        items = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
        hits = [i for i, st in enumerate(items) if _is_nest(st) and _contains_block(st, name)]
        if not hits:
            raise ValueError(f"no block named {name}")
        nest = items[hits[0]]
        inner: list = []
        tvm_ffi.structural_walk(nest, [(SBlockRealize, inner.append)])
        holders = [r for r in inner if r.block.name_hint != name
                   and _contains_block(r.block.body, name)]
        if not holders:
            return realize.block.name_hint, hits[0]
        # Descend into the outermost block on the path (e.g. ``step``).
        realize = next(r for r in holders if not any(
            o is not r and _contains_block(o.block.body, r.block.name_hint) for o in holders))


def _map_scope(func, scope: str, fn):
    """``func`` with the body of block ``scope`` replaced by ``fn(list of its statements)``."""
    def visit(realize):
        block = realize.block
        if block.name_hint != scope:
            return realize
        items = list(block.body.seq) if isinstance(block.body, tirx.SeqStmt) else [block.body]
        return SBlockRealize(realize.iter_values, realize.predicate,
                             _with_body(block, _seq(fn(items))))

    return func.with_body(tvm_ffi.structural_map(func.body, (SBlockRealize, visit), order="post"))


def isolated(func, name: str, schedule):
    """Run ``schedule(sch, block)`` for block ``name`` on a copy of ``func`` whose scope holds
    only the loop nest of that block (and the scope's non-loop statements), then put the
    removed sibling loop nests back around the result. The schedule must only transform that
    loop nest (and add buffers to the scope), as the GEMM rule does."""
    scope, index = _scope_of(func, name)
    removed: dict[int, object] = {}
    count = []

    def keep_only(items):
        count.append(len(items))
        removed.update({i: st for i, st in enumerate(items) if i != index and _is_nest(st)})
        return [st for i, st in enumerate(items) if i == index or not _is_nest(st)]

    sch = Schedule(_map_scope(func, scope, keep_only))
    schedule(sch, sch.get_sblock(name))

    def restore(items):
        kept = iter([st for st in items if not _is_nest(st)])
        nests = [st for st in items if _is_nest(st)]
        out = []
        for i in range(count[0]):
            if i in removed:
                out.append(removed[i])
            elif i == index:
                out.extend(nests)
            else:
                out.append(next(kept))
        out.extend(kept)
        return out

    return _map_scope(sch.mod["main"], scope, restore)


def guard_empty_launches(func):
    """Wrap every ``blockIdx``-bound loop with a non-constant extent in ``if extent > 0``.

    TVM's CUDA runtime raises a zero grid dimension to 1; where a split left no bounds
    predicate (its factor divides the dynamic extent) that one block would run out of bounds.
    Kernels staging operands in shared memory are left alone (TVM cannot place their
    ``__syncthreads`` under a condition): those are the GEMMs, whose dynamic row counts are
    padded scratch rows (``padded(...)``, see :mod:`lstm_tvm.kernels._builder`), so a block
    run on an empty grid computes at most ``ROW_TILE`` rows that exist in every buffer it
    touches and that nothing reads.
    """
    def visit(loop):
        binding = loop.thread_binding
        if (loop.kind == tirx.ForKind.THREAD_BINDING and binding is not None
                and str(binding.thread_tag).startswith("blockIdx")
                and not isinstance(loop.extent, tirx.IntImm) and not _stages_shared(loop)):
            return tirx.IfThenElse(loop.extent > 0, loop, None)
        return loop

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, visit), order="post"))


def _stages_shared(stmt) -> bool:
    hit = []
    tvm_ffi.structural_walk(stmt, [(SBlockRealize, lambda node: hit.append(
        node.block.name_hint.endswith(("_shared", "_shared.dyn"))))])
    return any(hit)


def unbound_blocks(func) -> list[str]:
    """Names of the leaf blocks of ``func`` with no loop bound to a GPU thread above them (in
    any enclosing block); the CUDA build rejects such blocks."""
    found: list[str] = []

    def visit(node, bound: bool) -> None:
        if node is None:
            return
        if isinstance(node, tirx.For):
            bound = bound or node.thread_binding is not None
        if isinstance(node, SBlockRealize):
            block = node.block
            leaf = not _contains_any_block(block.body)
            if leaf and not bound and block.name_hint != "root":
                found.append(block.name_hint)
            visit(block.body, bound)
            return
        if isinstance(node, tirx.SeqStmt):
            for item in node.seq:
                visit(item, bound)
            return
        for field in ("body", "then_case", "else_case"):
            visit(getattr(node, field, None), bound)

    visit(func.body, False)
    return found


def _contains_any_block(stmt) -> bool:
    hit: list = []
    tvm_ffi.structural_walk(stmt, [(SBlockRealize, hit.append)])
    return bool(hit)
