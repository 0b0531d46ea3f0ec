"""Finish a tf2onnx model for lstm_tvm: opset, IR version, ONNX functions, checks.

tf2onnx 1.17 writes at most ``ai.onnx`` opset :data:`TF2ONNX_MAX_OPSET` (18) and picks the IR
version of that opset; lstm_tvm's ONNX functions are written at opset
:data:`~lstm_tvm.onnx.domain.ONNX_OPSET` (21) and onnxruntime 1.31 reads at most opset
:data:`ORT_MAX_OPSET` and IR version :data:`ORT_MAX_IR_VERSION`. :func:`finish_model` converts
the standard ops to the requested opset with ``onnx.version_converter``, sets the IR version,
attaches the functions of the lstm_tvm ops the graph uses and checks the result with
``onnx.checker`` (full check, lstm_tvm's schemas registered).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator

import onnx
from onnx import helper

from ..onnx.domain import (
    DOMAIN,
    DOMAIN_VERSION,
    IR_VERSION,
    ONNX_OPSET,
    ORT_MAX_IR_VERSION,
    ORT_MAX_OPSET,
)
from ..onnx.functions import make_function, make_functions
from ..onnx.schema import register_schemas
from .handlers import ConversionError, GradientFix

__all__ = [
    "METADATA_GRADIENT_FIXES",
    "ORT_MAX_IR_VERSION",
    "ORT_MAX_OPSET",
    "TF2ONNX_MAX_OPSET",
    "attach_functions",
    "check_opset",
    "finish_model",
    "functions_max_opset",
    "iter_nodes",
    "lstm_op_types",
]

#: The highest ``ai.onnx`` opset tf2onnx 1.17 converts to.
TF2ONNX_MAX_OPSET = 18
#: Metadata key of the converted model listing the BlockLSTMGrad nodes converted as
#: BlockLSTMGradV2 (JSON: ``[{"node": ..., "forward": ...}]``).
METADATA_GRADIENT_FIXES = "lstm_tvm.gradient_fixes"
_MIN_OPSET = 13


@functools.cache
def functions_max_opset() -> int:
    """The highest opset (<= :data:`ORT_MAX_OPSET`) at which every standard op in lstm_tvm's
    ONNX functions (written at :data:`ONNX_OPSET`) has the same schema version: onnx's checker
    refuses a model whose opset changes an op its functions use."""
    ops = {n.op_type for f in make_functions() for n in _function_nodes(f)}
    best = ONNX_OPSET
    for opset in range(ONNX_OPSET + 1, ORT_MAX_OPSET + 1):
        if any(onnx.defs.get_schema(o, opset).since_version
               != onnx.defs.get_schema(o, ONNX_OPSET).since_version for o in ops):
            break
        best = opset
    return best


def check_opset(opset: int | None, attach_functions: bool) -> int:
    """The ``ai.onnx`` opset to write: ``opset`` or :data:`ONNX_OPSET`, checked.

    Without functions the range is 13..:data:`ORT_MAX_OPSET`; with functions attached it is
    :data:`ONNX_OPSET`..:func:`functions_max_opset` (onnx's checker refuses a model whose
    opset differs from its functions' in an op they use). Raises ``ValueError`` naming it.
    """
    if opset is None:
        return ONNX_OPSET
    low, high = (ONNX_OPSET, functions_max_opset()) if attach_functions \
        else (_MIN_OPSET, ORT_MAX_OPSET)
    if isinstance(opset, bool) or not isinstance(opset, int) or not low <= opset <= high:
        extra = (f" with lstm_tvm's ONNX functions attached (written at opset {ONNX_OPSET}; "
                 f"without them {_MIN_OPSET}..{ORT_MAX_OPSET})" if attach_functions else "")
        raise ValueError(f"opset: expected an int in {low}..{high}{extra}, got {opset!r}")
    return opset


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs (``Loop``/``If``/``Scan`` bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from iter_nodes(g)


def _function_nodes(function: onnx.FunctionProto) -> Iterator[onnx.NodeProto]:
    graph = helper.make_graph(list(function.node), function.name, [], [])
    return iter_nodes(graph)


def lstm_op_types(model: onnx.ModelProto) -> list[str]:
    """The lstm_tvm op types used in ``model`` (sorted)."""
    return sorted({n.op_type for n in iter_nodes(model.graph) if n.domain == DOMAIN})


def _unconverted(model: onnx.ModelProto) -> list[str]:
    """``"name (op)"`` of nodes tf2onnx left as TF ops (no ONNX schema, not lstm_tvm's)."""
    bad = []
    for node in iter_nodes(model.graph):
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            bad.append(f"{node.name!r} ({node.op_type})")
    return bad


def _set_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    current = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if current != opset:
        try:
            model = onnx.version_converter.convert_version(model, opset)
        except Exception as err:  # onnx raises several types
            raise ConversionError(
                f"cannot convert the model's standard ops from opset {current} (tf2onnx's) to "
                f"opset {opset}: {type(err).__name__}: {err}; opset={current} converts without "
                f"it (with attach_functions=False: the functions need opset {ONNX_OPSET})"
            ) from err
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return model


def _ir_version(model: onnx.ModelProto) -> int:
    known = [o for o in model.opset_import if o.domain in ("", "ai.onnx", "ai.onnx.ml")]
    return max(IR_VERSION, helper.find_min_ir_version_for(known, ignore_unknown=True))


def attach_functions(model: onnx.ModelProto, op_types: Iterable[str] | None = None) -> None:
    """Add the ONNX function of each lstm_tvm op type used in ``model`` (or of ``op_types``)
    that ``model`` does not hold yet, in place."""
    have = {(f.domain, f.name) for f in model.functions}
    for op_type in lstm_op_types(model) if op_types is None else op_types:
        if (DOMAIN, op_type) not in have:
            model.functions.append(make_function(op_type))


def finish_model(model: onnx.ModelProto, *, opset: int, functions: bool,
                 gradient_fixes: Iterable[GradientFix] = ()) -> onnx.ModelProto:
    """``model`` (tf2onnx's) at ``opset`` and lstm_tvm's IR version, with the functions of its
    lstm_tvm ops when ``functions``, the gradient fixes in its metadata, checked by onnx.

    Raises :class:`~.handlers.ConversionError` for TF ops tf2onnx left unconverted (naming the
    nodes), for an opset the standard ops cannot be converted to, and for a model onnx's
    checker refuses.
    """
    bad = _unconverted(model)
    if bad:
        raise ConversionError(f"TF ops without an ONNX conversion: {', '.join(bad)} (tf2onnx "
                              f"has no handler for them, lstm_tvm converts only "
                              f"the six LSTM block ops)")
    model = _set_opset(model, opset)
    if functions:
        attach_functions(model)
    fixes = [{"node": f.node, "forward": f.forward} for f in gradient_fixes]
    if fixes:
        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                       METADATA_GRADIENT_FIXES: json.dumps(fixes)})
    model.ir_version = _ir_version(model)
    if model.ir_version > ORT_MAX_IR_VERSION:
        raise ConversionError(f"opset {opset} needs IR version {model.ir_version}, above "
                              f"onnxruntime's {ORT_MAX_IR_VERSION}")
    register_schemas()
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise ConversionError(f"the converted model fails onnx's checker: {err}") from err
    return model
