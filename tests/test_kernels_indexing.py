"""64-bit indexing: in the lowered kernels every integer expression computed from ``T`` or ``B``
is 64-bit, so the ``2**31``-element refusal (``lstm_tvm.validation.MAX_ELEMENTS``) is not there
to hide an ``int32`` index; why it stays is written at ``MAX_ELEMENTS``.

Each kernel is lowered with symbolic ``T`` and ``B`` through the pipeline ``tvm.compile`` runs
for the host target (``BindTarget``, the default TIR pipeline, the host finalisation: after
``NarrowDataType(32)``, ``MakePackedAPI`` and ``LowerTVMBuiltin``). A variable depends on the
sizes if it is ``T``, ``B`` or ``seq_len_max``, or an integer variable bound (``Bind``, loop
variable) to an expression that does; an integer expression depends on them if one of those
variables appears in it through integer arithmetic (not inside a buffer's type or a float load).
Every such expression must be 64 bits wide (``int64``, ``uint64``). A positive control proves
the walk finds a narrowing cast.
"""

from __future__ import annotations

import json
import sys

import pytest
import tvm_ffi

from lstm_tvm import build, registry
from lstm_tvm._tvm import T, tirx, tvm
from lstm_tvm.targets import resolve_target
from lstm_tvm.validation import validate_attrs

ROOTS = ("T", "B", "seq_len_max")


def _lower(mod, target):
    """``mod`` through the TIR pipeline and host passes ``tvm.compile`` applies for ``target``."""
    mod = tirx.transform.BindTarget(target.with_host(target))(mod)
    pipeline, finalize_host, _ = tirx.get_default_tir_pipeline(target)
    return finalize_host()(pipeline(mod))


def _is_integer(expr) -> bool:
    return str(expr.ty).startswith(("int", "uint", "bool"))


def _integer_vars(node) -> set[int]:
    """Handles of the variables ``node`` uses through integer arithmetic only."""
    found = set()

    def visit(x):
        if isinstance(x, tvm.ir.expr.Expr):
            if not _is_integer(x):
                return tvm_ffi.WalkResult.SKIP
            if isinstance(x, tirx.Var):
                found.add(x.__chandle__())
            return tvm_ffi.WalkResult.ADVANCE
        return tvm_ffi.WalkResult.ADVANCE if isinstance(x, tvm_ffi.Array) \
            else tvm_ffi.WalkResult.SKIP

    tvm_ffi.structural_walk(node, visit, order="pre")
    return found


def narrow_size_expressions(mod) -> tuple[int, list[str]]:
    """``(count, narrow)``: how many integer expressions depend on ``T``/``B``/``seq_len_max``,
    and those of them narrower than 64 bits."""
    bindings, exprs = [], []

    def collect(node):
        if isinstance(node, tirx.Bind):
            bindings.append((node.var, [node.value]))
        elif isinstance(node, tirx.For):
            bindings.append((node.loop_var, [node.min, node.extent]))
        if isinstance(node, tvm.ir.expr.Expr):
            exprs.append(node)

    tvm_ffi.structural_walk(mod, collect)
    tainted = {e.__chandle__() for e in exprs if isinstance(e, tirx.Var) and e.name in ROOTS}
    changed = True
    while changed:  # to a fixed point: bindings may refer to later ones
        changed = False
        for var, values in bindings:
            handle = var.__chandle__()
            if handle not in tainted and _is_integer(var) and any(
                    _integer_vars(v) & tainted for v in values):
                tainted.add(handle)
                changed = True
    count, narrow = 0, []
    for e in exprs:
        ty = str(e.ty)
        if ty.startswith(("int", "uint")) and _integer_vars(e) & tainted:
            count += 1
            if int(ty.split("x")[0].lstrip("uint")) < 64:
                narrow.append(f"{ty}: {e}")
    return count, narrow


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_kernel_index_arithmetic_on_time_and_batch_is_64_bit(op_name, dtype):
    op = registry.OPS[op_name]
    spec = build.make_spec(op_name, dtype, 3, 5, validate_attrs(op, {"use_peephole": True}))
    mod = _lower(tvm.IRModule({spec.func_name: build.primfunc(spec)}),
                 resolve_target(json.loads(spec.target)))
    count, narrow = narrow_size_expressions(mod)
    assert count > 100, f"only {count} size-dependent expressions found: the walk is blind"
    assert not narrow, "\n".join(narrow[:20])


@T.prim_func
def _narrowing(a: T.handle):
    B = T.int64()
    A = T.match_buffer(a, (B,), "float32")
    for i in range(B):
        A[T.Cast("int64", T.Cast("int32", i))] = T.float32(0)


@T.prim_func
def _wide(a: T.handle):
    B = T.int64()
    A = T.match_buffer(a, (B,), "float32")
    for i in range(B):
        A[i] = T.float32(0)


def test_the_walk_finds_a_32_bit_cast_of_a_batch_index():
    target = resolve_target("llvm")
    lowered = {name: _lower(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                            target) for name, f in (("narrowing", _narrowing), ("wide", _wide))}
    count, narrow = narrow_size_expressions(lowered["narrowing"])
    assert count and narrow and all(n.startswith("int32: T.Cast(\"int32\", i)") for n in narrow)
    count, narrow = narrow_size_expressions(lowered["wide"])
    assert count and not narrow


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
