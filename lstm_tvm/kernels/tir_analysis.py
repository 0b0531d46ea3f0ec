"""Questions asked of TIR expressions and extents, by the kernels as they are built and by the
schedules that read them: whether an extent is constant or divisible, which tensors an
expression loads, how a GEMM operand is laid out."""

from __future__ import annotations

from .._tvm import tirx

__all__ = ["at_most", "divides", "gemm_operand", "is_static", "tensor_loads", "uses_var"]


def is_static(extent) -> bool:
    """Whether ``extent`` is known when the kernel is built (an ``int`` or ``IntImm``)."""
    return isinstance(extent, (int, tirx.IntImm))


def divides(factor: int, extent) -> bool:
    """Whether ``factor`` provably divides ``extent`` (symbolic extents included)."""
    from tvm.sym import Analyzer

    rem = Analyzer().simplify(tirx.floormod(extent, factor))
    return isinstance(rem, tirx.IntImm) and rem.value == 0


def at_most(extent, bound: int) -> bool:
    """Whether ``extent`` is provably at most ``bound`` (symbolic extents included)."""
    if is_static(extent):
        return int(extent) <= bound
    from tvm.sym import Analyzer

    analyzer = Analyzer()
    return bool(analyzer.can_prove(analyzer.simplify(extent) <= bound))


def tensor_loads(expr):
    """The tensor loads in the expression ``expr``, depth first (not those inside a load's
    own indices)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if hasattr(node, "indices"):
            yield node
            continue
        for field in ("value", "a", "b", "true_value", "false_value"):
            if hasattr(node, field):
                stack.append(getattr(node, field))
        stack.extend(reversed(list(getattr(node, "args", ()))))


def uses_var(expr, var) -> bool:
    """Whether ``expr`` reads the variable ``var`` (the same object, not just its name)."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def gemm_operand(expr, row, col) -> tuple[bool, str, bool]:
    """Whether the first tensor load in ``expr`` indexing ``row``/``col`` is contiguous along
    ``col`` (row-major), the loaded tensor's dtype, and whether it is stored as panels."""
    for load in tensor_loads(expr):
        if any(uses_var(i, row) or uses_var(i, col) for i in load.indices):
            return (uses_var(load.indices[-1], col), str(load.source.dtype),
                    len(load.indices) == 3)
    raise ValueError(f"no tensor operand in {expr}")
