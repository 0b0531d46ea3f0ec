"""What the CPU and GPU schedules both read off a kernel's blocks."""

from __future__ import annotations

from .._tvm import Schedule


def leaf_blocks(sch: Schedule) -> list:
    """Every block of ``sch`` without child blocks (inside ``step`` blocks too), in order."""
    out = []

    def visit(parent):
        for child in sch.get_child_blocks(parent):
            if sch.get_child_blocks(child):
                visit(child)
            else:
                out.append(child)

    visit(sch.get_sblock("root"))
    return out
