"""Default (rule-based) schedules, chosen by op and target kind.

``schedule_for(op_name, func, target, failures=None, **kwargs)``: CPU targets (``llvm``) get
:func:`lstm_tvm.schedule.rules.schedule_for` (extra keywords such as ``tuned`` go to it), CUDA
targets :func:`lstm_tvm.schedule.gpu.schedule_gpu`; any other kind gets ``func`` unchanged.
Blocks a rule could not schedule are appended to ``failures`` as ``(block name, error)``.
"""

from . import rules
from .gpu import schedule_gpu


def schedule_for(op_name: str, func, target, failures: list | None = None, **kwargs):
    """``func`` with the default schedule for ``target`` applied (see the module doc)."""
    kind = str(target.kind.name)
    if kind == "cuda":
        return schedule_gpu(op_name, func, target, failures)
    return rules.schedule_for(op_name, func, target, failures, **kwargs)


__all__ = ["schedule_for", "schedule_gpu"]
