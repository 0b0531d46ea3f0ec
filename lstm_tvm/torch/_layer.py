"""The eager route of :class:`lstm_tvm.torch.LSTM`'s layers: one ``torch.autograd.Function``
per sequence op and overload that returns only what the module uses: ``cs``, ``h`` and the
final state.

The op's own eager function (:mod:`lstm_tvm.torch._eager`) returns all seven outputs as
autograd outputs and goes through the generic kernel call twice a step. A layer runs once a
step for every step of a training loop, and its Python runs in caches the kernels just went
through, so it does as little as it can (see the training entries of ``docs/performance.md``):

- the gate outputs stay in the kernel's output buffer, handed to the grad kernel as the TVM
  tensors the forward kernel wrote (the buffer is held, unwritten, until the backward);
- the grad kernel's plan is found from the forward's, not from its 17 inputs;
- the backward converts only the gradients autograd asks for, and its kernel computes no
  ``x_grad`` or ``w_grad`` autograd does not ask for (a first layer fed data, frozen weights:
  each is a GEMM over the whole sequence);
- the final state (``h`` and ``cs`` at the last step, the initial state for ``T = 0``) is
  copied out here, not by indexing and stacking through autograd.

The inputs and ``cs``, ``h`` are saved for the backward as PyTorch saves them (so an in-place
change of any raises there). The gradient is the grad op's, routed as
:func:`lstm_tvm.autodiff.grad_route` says; the first call of a configuration goes through the
checked kernel call (:class:`lstm_tvm.torch._cpu.CpuKernel`) in both directions.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..autodiff import grad_route
from ._constants import cached_zeros
from ._cpu import contiguous, kernel

__all__ = ["layer_function"]

#: Forward plans whose grad plan a layer function keeps (all are dropped past it).
_GRAD_PLANS_KEPT = 64


@functools.lru_cache(maxsize=None)
def layer_function(op_name: str, overload: str):
    """The ``torch.autograd.Function`` of a layer running sequence op ``op_name`` (``overload``
    as :func:`lstm_tvm.torch._ops.overloads`): ``apply(attrs, *inputs)`` with every attribute
    in ``attrs`` and the op's inputs in TF's order; returns ``(cs, h, h_last, cs_last)``, the
    last two `(1, B, H)`: ``h`` and ``cs`` at step ``T - 1`` (``h_prev`` and ``cs_prev`` for
    ``T = 0``; the module asks for them only where ``seq_len_max`` is ``T``)."""
    route = grad_route(op_name)
    assert route.matmul is None
    fwd, grad = route.forward, route.grad
    run, run_grad = kernel(op_name), kernel(grad.name)
    names = fwd.output_names
    cs_at, h_at = names.index("cs"), names.index("h")
    seq_at = fwd.input_names.index("seq_len_max")
    cs_prev_at, h_prev_at = fwd.input_names.index("cs_prev"), fwd.input_names.index("h_prev")
    floats = [i for i, t in enumerate(fwd.inputs) if t.dtype == "T"]
    n_floats = len(floats)
    # the grad op's inputs, each as (where, index): a saved float input, an output of the
    # forward kernel, or the gradient of cs or h; seq_len_max apart
    saved_at = {fwd.input_names[i]: k for k, i in enumerate(floats)}
    grad_args = []
    for kind, name in route.sources:
        if kind == "input" and name != "seq_len_max":
            grad_args.append(("input", saved_at[name]))
        elif kind == "output":
            grad_args.append(("output", names.index(name)))
        elif kind == "output_grad":
            grad_args.append(("output_grad", ("cs", "h").index(name)))
    assert len(grad_args) == len(grad.input_names) - 1
    # the gradient of each input of apply (attrs first) as an output of the grad op, or None
    from_grad = [None] + [grad.output_names.index(route.from_grad[n])
                          if n in route.from_grad else None for n in fwd.input_names]
    # the outputs the grad kernel can leave out, each with where apply's inputs hold the
    # input it is the gradient of
    skippable = [(out, 1 + fwd.input_names.index(n)) for out, n in route.skippable]
    grad_seq_at = grad.input_names.index("seq_len_max")
    grad_attr_names = [n for n in grad.attr_names if n in fwd.attr_names]
    grad_plans: dict = {}

    def forward(ctx, attrs, *inputs):
        plan = run.plan(inputs, attrs)
        if plan is None:  # the configuration's first call: checked and planned
            outputs = run(*inputs, **attrs)
            kernel_outputs, seq = None, None  # the outputs are saved with the rest
            tensors = [inputs[i] for i in floats]
            plan = run.plan(inputs, attrs)
            if plan is not None:
                seq = run.seq_arg(plan, inputs)
            cs, h = outputs[cs_at], outputs[h_at]
            last = (h[-1:].clone(), cs[-1:].clone()) if h.shape[0] else None
        else:
            seq = run.seq_arg(plan, inputs)
            tensors = [contiguous(inputs[i]) for i in floats]  # saved as the kernel read them
            arrays, kernel_outputs = run.run(plan, seq, tensors)
            cs, h = torch.from_numpy(arrays[cs_at]), torch.from_numpy(arrays[h_at])
            last = (torch.from_numpy(arrays[h_at][-1:].copy()),
                    torch.from_numpy(arrays[cs_at][-1:].copy())) if h.shape[0] else None
        if last is None:  # T = 0: the initial state
            last = tuple(inputs[i].reshape((1, *inputs[i].shape)).clone()
                         for i in (h_prev_at, cs_prev_at))
        ctx.set_materialize_grads(False)
        # saving cs and h keeps their buffer, and the gates the TVM tensors read in it,
        # unwritten until the backward has run (the tensors alone do not hold it: a final
        # state kept after the backward keeps this node, not the buffer)
        ctx.save_for_backward(*tensors, cs, h, *(outputs if kernel_outputs is None else ()))
        ctx.outputs = kernel_outputs
        ctx.plan, ctx.seq, ctx.seq_input = plan, seq, inputs[seq_at]
        ctx.attrs = attrs
        return cs, h, *last

    @once_differentiable
    def backward(ctx, cs_grad, h_grad, h_last_grad, cs_last_grad):
        saved = ctx.saved_tensors  # raises where an input, cs or h was changed in place
        cs, h = saved[n_floats], saved[n_floats + 1]
        if h_last_grad is not None or cs_last_grad is not None:
            if h.shape[0] == 0:
                return _initial_state_grads(h_last_grad, cs_last_grad)
            cs_grad = _with_last(cs_grad, cs_last_grad, cs)
            h_grad = _with_last(h_grad, h_last_grad, h)
        outputs = ctx.outputs if ctx.outputs is not None else saved[n_floats + 2:]
        if cs_grad is None:
            cs_grad = cached_zeros(cs)
        given = (cs_grad, contiguous(h_grad) if h_grad is not None else cached_zeros(h))
        found = {"input": saved, "output": outputs, "output_grad": given}
        plan = ctx.plan
        entry = grad_plans.get(plan) if plan is not None else None
        if entry is not None and entry.generation == plan.generation:
            needs = ctx.needs_input_grad
            unused = tuple(out for out, at in skippable if not needs[at])
            if unused:
                entry = entry.without(unused)
            tensors = [found[kind][k] if kind != "input" else contiguous(found[kind][k])
                       for kind, k in grad_args]
            result = run_grad.run(entry, ctx.seq, tensors)[0]
            return tuple(None if k is None or not need else torch.from_numpy(result[k])
                         for k, need in zip(from_grad, ctx.needs_input_grad))
        # the first backward of this configuration: checked and planned
        found["output"] = [t if isinstance(t, torch.Tensor) else torch.from_dlpack(t)
                           for t in outputs]
        args = [found[kind][k] for kind, k in grad_args]
        args.insert(grad_seq_at, ctx.seq_input)
        attrs = {n: ctx.attrs[n] for n in grad_attr_names if n in ctx.attrs}
        result = run_grad(*args, **attrs)
        if plan is not None:
            if len(grad_plans) >= _GRAD_PLANS_KEPT:
                grad_plans.clear()
            made = run_grad.plan(args, attrs)
            if made is not None:
                grad_plans[plan] = made
        return tuple(None if k is None else result[k] for k in from_grad)

    def _initial_state_grads(h_last_grad, cs_last_grad):
        """The gradients of a call with ``T = 0``: its final state is its initial state."""
        grads = [None] * len(from_grad)
        grads[1 + h_prev_at] = None if h_last_grad is None else h_last_grad[0]
        grads[1 + cs_prev_at] = None if cs_last_grad is None else cs_last_grad[0]
        return tuple(grads)

    name = f"{op_name}LayerFunction"
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__qualname__": name, "__module__": __name__})


def _with_last(grad, last_grad, like: torch.Tensor) -> torch.Tensor:
    """The gradient of a sequence output (``grad``, None for none) with the gradient of its
    last step's copy (``last_grad`` `(1, B, H)`, or None) added."""
    if last_grad is None:
        return grad
    total = torch.zeros_like(like) if grad is None else grad.clone(
        memory_format=torch.contiguous_format)
    total[-1:] += last_grad
    return total
