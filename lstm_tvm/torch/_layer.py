"""The eager route of :class:`lstm_tvm.torch.LSTM`'s layers: one ``torch.autograd.Function``
per sequence op that returns only what the module uses, ``cs`` and ``h``.

The op's own eager function (:mod:`lstm_tvm.torch._eager`) returns all seven outputs as
autograd outputs. A layer of the module needs two: here the gate outputs are only saved for
the backward (which keeps their buffer from being written again until PyTorch frees them after
the backward), and the generic formula's bookkeeping is worked out once per op. Less Python a
step is what this saves (see the training entries of ``docs/performance.md``). The gradient is
the op's (:func:`lstm_tvm.autodiff.grad_route`).
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..autodiff import grad_route
from ._eager import cached_zeros, kernel

__all__ = ["layer_function"]


@functools.lru_cache(maxsize=None)
def layer_function(op_name: str):
    """The ``torch.autograd.Function`` of a layer running sequence op ``op_name``:
    ``apply(attrs, *inputs)`` with every attribute in ``attrs`` and the op's inputs in TF's
    order; returns ``(cs, h)``."""
    route = grad_route(op_name)
    fwd, grad = route.forward, route.grad
    assert route.matmul is None and {"cs", "h"} == {n for k, n in route.sources
                                                    if k == "output_grad"}
    run, run_grad = kernel(op_name), kernel(grad.name)
    n_inputs = len(fwd.input_names)
    cs_at, h_at = fwd.output_names.index("cs"), fwd.output_names.index("h")
    # each input of the grad op as ("input", position), ("output", position) or ("grad", name)
    grad_args = [(kind, fwd.input_names.index(n) if kind == "input" else
                  fwd.output_names.index(n) if kind == "output" else n)
                 for kind, n in route.sources]
    grad_attr_names = grad.attr_names
    from_grad = [grad.output_names.index(route.from_grad[n]) if n in route.from_grad else None
                 for n in fwd.input_names]

    def forward(ctx, attrs, *inputs):
        ctx.set_materialize_grads(False)  # a gradient autograd did not give is cached zeros
        outputs = [torch.from_numpy(a) for a in run.arrays(inputs, attrs)]
        # saved tensors: PyTorch frees them after the backward unless told to retain the graph
        ctx.save_for_backward(*(t if isinstance(t, torch.Tensor) else None for t in inputs),
                              *outputs)
        ctx.others = [None if isinstance(t, torch.Tensor) else t for t in inputs]
        ctx.grad_attrs = {k: attrs[k] for k in grad_attr_names}
        return outputs[cs_at], outputs[h_at]

    @once_differentiable
    def backward(ctx, cs_grad, h_grad):
        if cs_grad is None and h_grad is None:
            return (None,) * (1 + n_inputs)
        saved = ctx.saved_tensors
        inputs = [o if t is None else t for t, o in zip(saved, ctx.others)]
        outputs = saved[n_inputs:]
        zeros = cached_zeros(h_grad if cs_grad is None else cs_grad)  # cs and h: one shape
        given = {"cs": zeros if cs_grad is None else cs_grad,
                 "h": zeros if h_grad is None else h_grad}
        args = [inputs[where] if kind == "input" else outputs[where] if kind == "output"
                else given[where] for kind, where in grad_args]
        result = run_grad.arrays(args, ctx.grad_attrs)
        return (None, *(None if k is None or not ctx.needs_input_grad[1 + i]
                        else torch.from_numpy(result[k]) for i, k in enumerate(from_grad)))

    name = f"{op_name}LayerFunction"
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__qualname__": name, "__module__": __name__})

