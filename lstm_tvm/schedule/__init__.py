"""Default (rule-based) schedules, by target family.

``schedule_for(op_name, func, target, failures=None, **kwargs)``: CPU targets (``llvm``, any
architecture) get :func:`lstm_tvm.schedule.cpu.schedule_cpu` (extra keywords such as ``tuned``
go to it), CUDA targets :func:`lstm_tvm.schedule.gpu.schedule_gpu`; any other kind gets
``func`` unchanged. Blocks a rule could not schedule are appended to ``failures`` as
``(block name, error)``.
"""

from .cpu import schedule_cpu
from .gpu import schedule_gpu


def schedule_for(op_name: str, func, target, failures: list | None = None, **kwargs):
    """``func`` with the default schedule for ``target`` applied (see the module doc)."""
    kind = str(target.kind.name)
    if kind == "cuda":
        return schedule_gpu(op_name, func, target, failures)
    if kind == "llvm":
        return schedule_cpu(op_name, func, target, failures, **kwargs)
    return func


__all__ = ["schedule_cpu", "schedule_for", "schedule_gpu"]
