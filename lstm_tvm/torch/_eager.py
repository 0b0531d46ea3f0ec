"""The eager CPU route of :mod:`lstm_tvm.torch`: the forward ops as ``torch.autograd.Function``
classes that call the CPU kernels (:mod:`lstm_tvm.raw_ops`) directly.

``torch.ops.lstm_tvm.<Op>`` goes through PyTorch's dispatcher and ``torch.library``'s autograd
wrapper on every call, which is what ``torch.compile``, ``torch.export`` and other tracers need
and what an eager training step pays for nothing (see the training entries of
``docs/performance.md``). A call in plain eager mode on plain CPU tensors takes this route
instead: the same kernels and the same gradient formula (:mod:`lstm_tvm.torch._autograd`), the
backward's missing gradient of ``cs`` or ``h`` a cached zero tensor (the grad ops only read
it). Everything else (tracing, compiling, fake or subclassed tensors, ``torch.func``
transforms, dispatch or function modes, other devices) takes ``torch.ops``.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..autodiff import forward_ops, grad_route
from ..registry import get_op
from ._autograd import _formula, _op
from ._constants import cached_zeros
from ._cpu import kernel
from ._ops import overloads

__all__ = ["call", "eager_ok", "eager_function"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager_ok(tensors) -> bool:
    """Whether a call with these tensor inputs can take the eager route: PyTorch is neither
    tracing nor compiling, no mode or ``torch.func`` transform is active, and every input is
    a plain tensor (or parameter) on the CPU."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
            or torch._C._functorch.peek_interpreter_stack() is not None):
        return False
    return all(type(t) in _PLAIN and t.is_cpu for t in tensors)


@functools.lru_cache(maxsize=None)
def eager_function(op_name: str, overload: str = "default"):
    """The ``torch.autograd.Function`` of forward op ``op_name`` (``overload`` as
    :func:`lstm_tvm.torch._ops.overloads`): ``apply(*inputs, *attrs)``, the op's inputs in
    TF's order, then every attribute in the registry's order (all given)."""
    if op_name not in forward_ops():
        raise ValueError(f"{op_name} has no gradient route; expected one of {forward_ops()}")
    route = grad_route(op_name)
    assert overload in overloads(route.forward)
    fwd = route.forward
    n_inputs, attr_names = len(fwd.input_names), fwd.attr_names
    run = kernel(op_name)
    matmul = kernel(route.matmul.name) if route.matmul is not None else None
    setup, backward = _formula(route, overload, kernel(route.grad.name), matmul, cached_zeros,
                               leaves_out=True)

    def forward(ctx, *args):
        inputs, attrs = args[:n_inputs], dict(zip(attr_names, args[n_inputs:]))
        outputs = run(*inputs, **attrs)
        setup(ctx, inputs, attrs, outputs)
        return outputs

    @once_differentiable
    def backward_(ctx, *grads):
        return backward(ctx, *grads) + (None,) * len(attr_names)

    # made by type() so that autograd's node is named after the op (BlockLSTMFunctionBackward)
    name = f"{op_name}Function"
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_),
                 "__qualname__": name, "__module__": __name__})


def call(op_name: str, overload: str, args: tuple, attrs: dict):
    """Op ``op_name`` on ``args`` (its inputs in TF's order) and ``attrs`` (every attribute,
    checked): through the eager route where :func:`eager_ok`, else
    ``torch.ops.lstm_tvm.<op_name>.<overload>``. Returns the tuple of outputs."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if eager_ok(tensors):
        op = get_op(op_name)
        if op.direction == "forward":
            return eager_function(op_name, overload).apply(*args,
                                                           *(attrs[n] for n in op.attr_names))
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return kernel(op_name)(*args, **attrs)
    return _op(op_name, overload)(*args, **attrs)

