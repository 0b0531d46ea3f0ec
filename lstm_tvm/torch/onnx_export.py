"""ONNX export of PyTorch models that use lstm_tvm's ops, as lstm_tvm's ONNX custom-op nodes.

``torch.onnx.export(model, args, custom_translation_table=translation_table())`` (PyTorch's
exporter, ``dynamo=True``, the default; it needs ``onnxscript``) writes each
``torch.ops.lstm_tvm.<Op>`` call as one :data:`lstm_tvm.onnx.DOMAIN` node of op type
``<Op>``: TF's inputs, outputs and attributes, as :func:`lstm_tvm.onnx.make_node` writes them
(every attribute on the node, bools as 0/1). ``seq_len_max`` given as an int becomes an int64
constant (or the graph's computation of it from a dynamic shape). :func:`export` does that and
makes the model what lstm_tvm's routes read (:func:`lstm_tvm.onnx.check_model`): IR version and
opset that ONNX Runtime 1.31 reads, the domain imported, optionally the ops' ONNX functions
attached (plain ONNX Runtime then runs the model with no custom kernel). Such a model runs in
``lstm_tvm.onnx.ort.InferenceSession`` (lstm_tvm's kernels), plain ONNX Runtime (with the
functions), the native library and ``lstm_tvm.relax.from_onnx``, as a model converted from TF.

``CellGradMatmul`` is not an ONNX op: a model calling it (a backward pass) is not exported.
"""

from __future__ import annotations

import inspect
import os

import onnx
import torch

from ..onnx import check_model, make_functions, register_schemas
from ..onnx.domain import DOMAIN, DOMAIN_VERSION, IR_VERSION, ONNX_OPSET, onnx_attrs
from ..registry import OPS, OpSpec
from ._ops import NAMESPACE, overloads

__all__ = ["export", "finish_model", "translation_table"]


def translation_table() -> dict:
    """``{torch.ops.lstm_tvm.<Op>.<overload>: function}`` for ``torch.onnx.export``'s
    ``custom_translation_table``: every overload of the six ops, each written as one
    :data:`~lstm_tvm.onnx.DOMAIN` node. Registers the ops' ONNX schemas (idempotent), which
    the exporter reads."""
    import onnxscript  # the exporter's own dependency

    register_schemas()
    opset = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)
    table = {}
    for op in OPS.values():
        packet = getattr(getattr(torch.ops, NAMESPACE), op.name)
        for overload in overloads(op):
            table[getattr(packet, overload)] = _translation(op, opset)
    return table


def _translation(op: OpSpec, opset):
    """The exporter's function for ``op``: its inputs as ONNX inputs, its attributes as
    attributes (the signature tells the exporter which is which)."""

    def translate(*args, **attrs):
        node = getattr(opset, op.name)
        return node(*args, **onnx_attrs(op.name, attrs, fill_defaults=True))

    translate.__signature__ = op.signature(inputs=inspect.Parameter.POSITIONAL_OR_KEYWORD)
    translate.__annotations__ = {a.name: a.type for a in op.attrs}
    translate.__name__ = translate.__qualname__ = f"{NAMESPACE}_{op.name}"
    return translate


def export(model: torch.nn.Module, args: tuple, f: str | os.PathLike | None = None, *,
           with_functions: bool = False, **kwargs) -> onnx.ModelProto:
    """Export ``model`` called on ``args`` to ONNX with lstm_tvm's custom-op nodes.

    Parameters
    ----------
    model : torch.nn.Module
        A module whose forward calls ``torch.ops.lstm_tvm`` ops (e.g. :class:`LSTM`).
    args : tuple
        Example inputs, as ``torch.onnx.export`` takes them.
    f : path, optional
        Where to save the model (weights inside the file).
    with_functions : bool
        Attach the ONNX function of each lstm_tvm op used (:func:`lstm_tvm.onnx.make_functions`):
        plain ``onnxruntime.InferenceSession`` then runs the model as it is.
    **kwargs
        Passed to ``torch.onnx.export`` (``input_names``, ``output_names``,
        ``dynamic_shapes``, ``opset_version`` up to :data:`lstm_tvm.onnx.ONNX_OPSET` by
        default, ...); ``dynamo=False`` is refused (the TorchScript exporter has no
        translation for these ops).

    Returns
    -------
    onnx.ModelProto
        Checked by :func:`lstm_tvm.onnx.check_model`.
    """
    if kwargs.get("dynamo", True) is not True:
        raise ValueError("export: expected dynamo=True (the TorchScript exporter cannot "
                         "write lstm_tvm's ops), got dynamo=False")
    kwargs["dynamo"] = True
    kwargs.setdefault("opset_version", ONNX_OPSET)
    table = {**translation_table(), **(kwargs.pop("custom_translation_table", None) or {})}
    program = torch.onnx.export(model, args, custom_translation_table=table, **kwargs)
    model_proto = finish_model(program.model_proto, with_functions=with_functions)
    if f is not None:
        onnx.save(model_proto, os.fspath(f))
    return model_proto


def finish_model(model: onnx.ModelProto, *, with_functions: bool = False) -> onnx.ModelProto:
    """``model`` (exported by ``torch.onnx.export`` with :func:`translation_table`) as
    lstm_tvm's routes read it: IR version :data:`lstm_tvm.onnx.IR_VERSION` at most, the
    domain imported at its version, the ONNX functions of its lstm_tvm ops attached if
    ``with_functions``; checked by :func:`lstm_tvm.onnx.check_model`. Changed in place."""
    model.ir_version = min(model.ir_version, IR_VERSION)
    used = sorted({n.op_type for n in _nodes(model.graph) if n.domain == DOMAIN})
    if used and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    if with_functions:
        have = {(fn.domain, fn.name) for fn in model.functions}
        model.functions.extend(fn for fn in make_functions(used)
                               if (fn.domain, fn.name) not in have)
    check_model(model)
    return model


def _nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)
