"""Registration of lstm_tvm's ops with PyTorch (explicit, once per process)."""

from __future__ import annotations

import threading

import torch

from ._autograd import register_autograd
from ._ops import NAMESPACE, define

__all__ = ["register"]

_LIBRARIES: list[torch.library.Library] = []  # kept alive: a library deregisters when freed
_LOCK = threading.Lock()


def register() -> None:
    """Define ``torch.ops.lstm_tvm.<Op>`` for the six ops and ``CellGradMatmul``: schemas,
    CPU, CUDA and fake kernels, and the gradients of the forward ops. Idempotent; importing
    :mod:`lstm_tvm.torch` calls it."""
    with _LOCK:
        if _LIBRARIES:
            return
        lib = torch.library.Library(NAMESPACE, "DEF")
        define(lib)
        register_autograd(lib)
        _LIBRARIES.append(lib)
