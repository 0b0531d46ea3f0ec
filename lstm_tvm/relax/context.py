"""What a converter of :mod:`lstm_tvm.relax` gets besides the node's inputs and attributes."""

from __future__ import annotations

import dataclasses

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


def node_label(node) -> str:
    """``"<op type> node '<name>'"``, or the first output's name for an unnamed node."""
    if node.name:
        return f"{node.op_type} node {node.name!r}"
    outputs = [o for o in node.output if o]
    return f"{node.op_type} node (unnamed, output {outputs[0]!r})" if outputs else \
        f"{node.op_type} node (unnamed)"
