"""Read-only CPU tensors holding one value everywhere, shared by every caller: the zero
gradient the grad ops get for an output autograd gave none for, and a broadcast gradient's
contiguous form.

A tensor is filled once, when made, and never written again (the kernels only read it), so
any thread may use one while another is made. A few shapes, dtypes and values are kept.
"""

from __future__ import annotations

import math

import torch

__all__ = ["cached_zeros", "constant", "single_value"]

_KEPT = 8
_CONSTANTS: dict = {}


def constant(shape: tuple, dtype: torch.dtype, value: float) -> torch.Tensor:
    """A contiguous CPU tensor of ``shape`` and ``dtype`` holding ``value`` (a Python float,
    not NaN) everywhere; only to be read."""
    key = (shape, dtype, value, math.copysign(1.0, value))  # -0.0 apart from 0.0
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = torch.full(shape, value, dtype=dtype)
        if len(_CONSTANTS) >= _KEPT:
            _CONSTANTS.clear()
        _CONSTANTS[key] = tensor
    return tensor


def cached_zeros(like: torch.Tensor) -> torch.Tensor:
    """A zero tensor of ``like``'s shape and dtype (:func:`constant`)."""
    return constant(tuple(like.shape), like.dtype, 0.0)


def single_value(tensor: torch.Tensor) -> float | None:
    """The value of a CPU float tensor whose every stride is 0 (one element broadcast: the
    gradient ``sum`` or ``mean`` gives), or None for any other tensor and for NaN."""
    if tensor.dim() == 0 or any(tensor.stride()) or tensor.numel() == 0:
        return None
    value = tensor.as_strided((), ()).item()
    return None if math.isnan(value) else value
