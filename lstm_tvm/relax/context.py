"""What a converter of :mod:`lstm_tvm.relax` gets besides the node's inputs and attributes."""

from __future__ import annotations

import dataclasses

from ..onnx.contract import node_label
from .kernel_calls import KernelTable

__all__ = ["NodeContext", "node_label"]


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """One node being converted.

    ``label`` names the node in error messages (``"LSTM node 'lstm0'"``); ``kernels`` adds
    lstm_tvm's kernels to the module being built.
    """

    label: str
    kernels: KernelTable
