"""The gradients of the forward ops of :mod:`lstm_tvm.torch`, through their grad ops as
:func:`lstm_tvm.autodiff.grad_route` routes them (``BlockLSTM`` -> ``BlockLSTMGrad``,
``BlockLSTMV2`` -> ``BlockLSTMGradV2``, ``LSTMBlockCell`` -> ``LSTMBlockCellGrad`` and
``CellGradMatmul``).

Only ``cs`` and ``h`` are differentiable outputs (what the grad ops take); the gate outputs
``i, f, o, ci, co`` are marked non-differentiable, as TF's gradients ignore them. The backward
calls the grad ops as ``torch.ops`` (so ``torch.compile`` traces them too); they have no
gradient of their own (no double backward).
"""

from __future__ import annotations

import torch

from ..autodiff import forward_ops, grad_route
from ._ops import INT_OVERLOAD, NAMESPACE, overloads, qualname

__all__ = ["register_autograd"]


def register_autograd(lib: torch.library.Library) -> None:
    """Register the gradient of every forward op (each overload) with ``lib``."""
    for op_name in forward_ops():
        route = grad_route(op_name)
        for overload in overloads(route.forward):
            setup, backward = _formula(route, overload, _op(route.grad.name, overload),
                                       _op(route.matmul.name) if route.matmul else None,
                                       torch.zeros_like)
            torch.library.register_autograd(qualname(op_name, overload), backward,
                                            setup_context=setup, lib=lib)


def _op(op_name: str, overload: str = "default"):
    """``torch.ops.lstm_tvm.<op_name>.<overload>``."""
    return getattr(getattr(getattr(torch.ops, NAMESPACE), op_name), overload)


def _formula(route, overload: str, grad_op, matmul_op, zeros_like, leaves_out: bool = False):
    """``(setup_context, backward)`` of ``route.forward`` for ``overload`` (the
    ``torch.library`` forms): the backward calls ``grad_op`` (and ``matmul_op`` for the cell),
    positional inputs and keyword attributes, and ``zeros_like(cs)`` for a gradient of ``cs``
    or ``h`` autograd did not give. With ``leaves_out`` (``grad_op`` a
    :class:`~lstm_tvm.torch._cpu.CpuKernel`), through
    :meth:`~lstm_tvm.torch._cpu.CpuKernel.call_without`: its kernel computes no ``x_grad`` or
    ``w_grad`` autograd does not ask for.

    Where every value comes from is worked out here, once: the backward only indexes (it runs
    at every training step, and its Python is part of what a step costs)."""
    fwd, grad = route.forward, route.grad
    kept_outputs = [n for kind, n in route.sources if kind == "output"]
    differentiable = [n for kind, n in route.sources if kind == "output_grad"]
    gates = [fwd.output_names.index(n) for n in fwd.output_names if n not in differentiable]
    assert "cs" in kept_outputs and set(differentiable) == {"cs", "h"}
    # the int overload's seq_len_max is a Python int, kept aside; every other input is saved
    ints = [i for i, t in enumerate(fwd.inputs) if t.dtype != "T"] \
        if overload == INT_OVERLOAD else []
    tensor_inputs = [i for i in range(len(fwd.input_names)) if i not in ints]
    kept = [fwd.output_names.index(n) for n in kept_outputs]
    # ``slots``, as the backward lays them out: the forward's inputs, its kept outputs, the
    # gradients of cs and h
    slot = {("input", n): i for i, n in enumerate(fwd.input_names)}
    slot.update({("output", n): len(fwd.input_names) + k for k, n in enumerate(kept_outputs)})
    slot.update({("output_grad", n): len(slot) + k for k, n in enumerate(differentiable)})
    grad_args = [slot[source] for source in route.sources]
    given = [fwd.output_names.index(n) for n in differentiable]
    zeros_from = slot[("output", "cs")]  # cs and h have one shape
    slot.update({("grad", n): len(slot) + k for k, n in enumerate(grad.output_names)})
    matmul_args = [slot[source] for source in route.matmul_sources]
    from_grad = [grad.output_names.index(route.from_grad[n]) if n in route.from_grad else None
                 for n in fwd.input_names]
    from_matmul = [route.matmul.output_names.index(route.from_matmul[n])
                   if route.matmul is not None and n in route.from_matmul else None
                   for n in fwd.input_names]
    grad_attrs = grad.attr_names
    # the outputs the grad kernel can leave out, with the index of the input each is the
    # gradient of
    skippable = [(out, fwd.input_names.index(n)) for out, n in route.skippable] \
        if leaves_out else []
    peephole_default = fwd.attr("use_peephole").default if "use_peephole" in grad_attrs \
        else None

    def setup_context(ctx, inputs, keyword_only_inputs, output):
        ctx.mark_non_differentiable(*(output[i] for i in gates))
        ctx.set_materialize_grads(False)  # no zeros made for the gates' (unused) gradients
        ctx.ints = [inputs[i] for i in ints]
        ctx.save_for_backward(*(inputs[i] for i in tensor_inputs), *(output[i] for i in kept))
        ctx.attrs = {k: keyword_only_inputs[k] for k in grad_attrs
                     if k in keyword_only_inputs}
        if peephole_default is not None and "use_peephole" not in ctx.attrs:
            ctx.attrs["use_peephole"] = peephole_default

    def backward(ctx, *grads):
        slots = list(ctx.saved_tensors)
        for i, value in zip(ints, ctx.ints):
            slots.insert(i, value)
        for i in given:
            slots.append(grads[i] if grads[i] is not None else zeros_like(slots[zeros_from]))
        args = [slots[i] for i in grad_args]
        left_out = [(out, at) for out, at in skippable if not ctx.needs_input_grad[at]]
        result = grad_op.call_without(tuple(out for out, _ in left_out), args, ctx.attrs) \
            if left_out else grad_op(*args, **ctx.attrs)
        found = [None if k is None else result[k] for k in from_grad]
        for _, at in left_out:  # an unwritten buffer is nobody's gradient
            found[at] = None
        if matmul_args:  # the cell: the matmul part of its gradient
            slots += result
            product = matmul_op(*(slots[i] for i in matmul_args))
            found = [f if k is None else product[k] for f, k in zip(found, from_matmul)]
        return tuple(found)

    return setup_context, backward
