"""The eager route of :class:`lstm_tvm.torch.LSTM`'s layers: one ``torch.autograd.Function``
per sequence op and overload that returns only what the module uses, ``cs`` and ``h``.

The op's own eager function (:mod:`lstm_tvm.torch._eager`) returns all seven outputs as
autograd outputs. A layer of the module needs two: here the gate outputs are only saved for
the backward (which keeps their buffer from being written again until PyTorch frees them after
the backward). Less Python a step is what this saves (see the training entries of
``docs/performance.md``). The gradient is the op's, the same formula
(:func:`lstm_tvm.torch._autograd._formula`).
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..autodiff import grad_route
from ._autograd import _formula
from ._constants import cached_zeros
from ._cpu import kernel

__all__ = ["layer_function"]


@functools.lru_cache(maxsize=None)
def layer_function(op_name: str, overload: str):
    """The ``torch.autograd.Function`` of a layer running sequence op ``op_name`` (``overload``
    as :func:`lstm_tvm.torch._ops.overloads`): ``apply(attrs, *inputs)`` with every attribute
    in ``attrs`` and the op's inputs in TF's order; returns ``(cs, h)``."""
    route = grad_route(op_name)
    assert route.matmul is None
    names = route.forward.output_names
    cs_at, h_at = names.index("cs"), names.index("h")
    run = kernel(op_name)
    setup, gradients = _formula(route, overload, kernel(route.grad.name), None, cached_zeros)

    def forward(ctx, attrs, *inputs):
        outputs = run(*inputs, **attrs)
        setup(ctx, inputs, attrs, outputs)  # saves the inputs and the outputs the grad op reads
        return outputs[cs_at], outputs[h_at]

    @once_differentiable
    def backward(ctx, cs_grad, h_grad):
        grads = [None] * len(names)
        grads[cs_at], grads[h_at] = cs_grad, h_grad
        return (None, *gradients(ctx, *grads))

    name = f"{op_name}LayerFunction"
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__qualname__": name, "__module__": __name__})
