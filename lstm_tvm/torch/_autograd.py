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
from ._ops import NAMESPACE, overloads, qualname

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


def _formula(route, overload: str, grad_op, matmul_op, zeros_like):
    """``(setup_context, backward)`` of ``route.forward`` for ``overload`` (the
    ``torch.library`` forms): the backward calls ``grad_op`` (and ``matmul_op`` for the cell),
    positional inputs and keyword attributes, and ``zeros_like(cs)`` for a gradient of ``cs``
    or ``h`` autograd did not give."""
    fwd, grad = route.forward, route.grad
    kept_outputs = [n for kind, n in route.sources if kind == "output"]
    differentiable = [n for kind, n in route.sources if kind == "output_grad"]
    gates = [n for n in fwd.output_names if n not in differentiable]
    grad_attrs = grad.attr_names
    assert "cs" in kept_outputs and set(differentiable) == {"cs", "h"}

    def setup_context(ctx, inputs, keyword_only_inputs, output):
        values = dict(zip(fwd.input_names, inputs))
        outs = dict(zip(fwd.output_names, output))
        ctx.mark_non_differentiable(*(outs[n] for n in gates))
        ctx.set_materialize_grads(False)  # no zeros made for the gates' (unused) gradients
        saved, ctx.ints = [], {}
        for name in fwd.input_names:  # the grad op reads every input of the forward
            if isinstance(values[name], torch.Tensor):
                saved.append(values[name])
            else:  # seq_len_max of the int overload
                ctx.ints[name] = values[name]
        saved += [outs[n] for n in kept_outputs]
        ctx.save_for_backward(*saved)
        ctx.attrs = {k: keyword_only_inputs[k] for k in grad_attrs
                     if k in keyword_only_inputs}
        if "use_peephole" in grad_attrs and "use_peephole" not in ctx.attrs:
            ctx.attrs["use_peephole"] = fwd.attr("use_peephole").default

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        values = {"input": {n: ctx.ints[n] if n in ctx.ints else next(saved)
                            for n in fwd.input_names}}
        values["output"] = {n: next(saved) for n in kept_outputs}
        given = dict(zip(fwd.output_names, grads))
        # cs and h have one shape: a gradient that is None is cs's zeros
        values["output_grad"] = {n: given[n] if given[n] is not None
                                 else zeros_like(values["output"]["cs"])
                                 for n in differentiable}
        args = [values[kind][n] for kind, n in route.sources]
        result = dict(zip(grad.output_names, grad_op(*args, **ctx.attrs)))
        found = {n: result[out] for n, out in route.from_grad.items()}
        if route.matmul is not None:  # the cell: the matmul part of its gradient
            values["grad"] = result
            product = matmul_op(*(values[kind][n] for kind, n in route.matmul_sources))
            product = dict(zip(route.matmul.output_names, product))
            found.update({n: product[out] for n, out in route.from_matmul.items()})
        return tuple(found.get(n) for n in fwd.input_names)

    return setup_context, backward
