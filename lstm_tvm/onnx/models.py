"""Build ONNX nodes and models holding lstm_tvm ops (:data:`~.domain.DOMAIN`).

- :func:`make_node`: one custom-domain node, attributes validated against the registry.
- :func:`make_model`: a single-op model, inputs and outputs named as TF's, ``T`` and ``B``
  symbolic, ``I``/``H`` concrete; optionally with the op's ONNX function attached (then
  onnxruntime runs it with no custom kernel: :mod:`.functions`).
- :func:`make_forward_backward_model`: a forward op feeding its grad op (``cs_grad``,
  ``h_grad`` are graph inputs; the forward's and the grad's outputs are graph outputs).
- :func:`write_models`: the single-op models of build specs written to files (an export
  folder's ``onnx/<Op>.onnx``).

Both take ``initializers``: weights stored in the model instead of fed at every run (the
native ONNX Runtime route packs a ``w`` initializer once per session, as ONNX Runtime's own
``LSTM`` does).

Models import ``ai.onnx`` opset :data:`~.domain.ONNX_OPSET` and :data:`~.domain.DOMAIN` version
:data:`~.domain.DOMAIN_VERSION`, with IR version :data:`~.domain.IR_VERSION` (onnxruntime 1.31
refuses onnx 1.23's defaults). Call :func:`~.schema.register_schemas` before
``onnx.checker.check_model(model, full_check=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..registry import OpSpec, TensorSpec, get_op
from .domain import DOMAIN, DOMAIN_VERSION, IR_VERSION, ONNX_OPSET, elem_type, onnx_attrs
from .functions import make_function

__all__ = [
    "make_forward_backward_model",
    "make_model",
    "make_node",
    "opset_imports",
    "value_info",
    "write_models",
]


def opset_imports() -> list[onnx.OperatorSetIdProto]:
    """The opset imports of every model built here: ``ai.onnx`` and :data:`DOMAIN`."""
    return [helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]


def make_node(op_name: str, inputs: Sequence[str] | None = None,
              outputs: Sequence[str] | None = None, *, name: str | None = None,
              **attrs) -> onnx.NodeProto:
    """A :data:`DOMAIN` node of registry op ``op_name``.

    ``inputs``/``outputs`` default to the registry names (TF's, in TF's order); their counts
    must match the op's (``""`` marks nothing: every input is required). ``attrs`` are TF's
    attributes (bools as ``bool`` or 0/1); unknown ones, a missing required one and wrong
    types raise ``TypeError``. Omitted optional attributes are written with TF's defaults,
    because onnxruntime-extensions PyOps need every declared attribute on the node.
    """
    op = get_op(op_name)
    inputs = list(op.input_names if inputs is None else inputs)
    outputs = list(op.output_names if outputs is None else outputs)
    for what, got, want in (("inputs", inputs, op.input_names),
                            ("outputs", outputs, op.output_names)):
        if len(got) != len(want):
            raise ValueError(f"{op.name}: expected {len(want)} {what} ({', '.join(want)}), "
                             f"got {len(got)}")
    return helper.make_node(op.name, inputs, outputs, name=name, domain=DOMAIN,
                            **onnx_attrs(op.name, attrs, fill_defaults=True))


def _dims(input_size: int, cell_size: int, seq_len, batch) -> dict:
    for what, v in (("input_size", input_size), ("cell_size", cell_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what}: expected an int >= 1, got {v!r}")
    return {"T": seq_len, "B": batch, "I": input_size, "H": cell_size,
            "4H": 4 * cell_size, "I+H": input_size + cell_size}


def value_info(spec: TensorSpec, dtype, dims: Mapping[str, int | str]) -> onnx.ValueInfoProto:
    """A ``ValueInfoProto`` for registry tensor ``spec``: ``dtype`` for float tensors (``T``),
    the symbols' ``dims`` (ints or dim names) as its shape."""
    elem = elem_type(dtype if spec.dtype == "T" else spec.dtype)
    return helper.make_tensor_value_info(spec.name, elem, [dims[s] for s in spec.shape])


def _initializers(graph_inputs: Sequence[TensorSpec], values: Mapping[str, object], dtype,
                  dims: Mapping) -> list[onnx.TensorProto]:
    """``values`` as initializers of the graph inputs they name, checked: an input whose shape
    has no ``T`` or ``B``, of its shape and of ``dtype``."""
    specs = {t.name: t for t in graph_inputs}
    allowed = [n for n, t in specs.items() if t.shape and not {"T", "B"} & set(t.shape)]
    out = []
    for name, value in values.items():
        if name not in allowed:
            raise ValueError(f"initializers: expected inputs among {allowed} (whose shape has "
                             f"no T or B), got {name!r}")
        value = np.asarray(value)
        spec = specs[name]
        shape = tuple(dims[d] for d in spec.shape)
        want = dtype if spec.dtype == "T" else spec.dtype
        if value.shape != shape or value.dtype != np.dtype(want):
            raise ValueError(f"initializers: {name!r} expected {want}{list(shape)}, got "
                             f"{value.dtype}{list(value.shape)}")
        out.append(numpy_helper.from_array(value, name))
    return out


def _model(op_specs: Sequence[OpSpec], nodes, graph_inputs, graph_outputs, dtype, dims,
           with_functions: bool, name: str,
           initializers: Mapping[str, object] | None = None) -> onnx.ModelProto:
    stored = _initializers(graph_inputs, initializers or {}, dtype, dims)
    graph = helper.make_graph(
        nodes, name, [value_info(t, dtype, dims) for t in graph_inputs
                      if t.name not in (initializers or {})],
        [value_info(t, dtype, dims) for t in graph_outputs], stored)
    model = helper.make_model(graph, opset_imports=opset_imports(), ir_version=IR_VERSION,
                              producer_name="lstm_tvm")
    if with_functions:
        model.functions.extend(make_function(op.name) for op in op_specs)
    return model


def make_model(op_name: str, dtype="float32", *, input_size: int, cell_size: int,
               attrs: Mapping[str, object] | None = None, with_functions: bool = True,
               seq_len: int | str = "T", batch: int | str = "B",
               initializers: Mapping[str, object] | None = None) -> onnx.ModelProto:
    """A model with one ``op_name`` node; graph inputs/outputs are the op's (TF names).

    Parameters
    ----------
    op_name : str
        A registry op.
    dtype : ``"float32"`` or ``"float16"``
        The float type ``T`` of every float input and output (``seq_len_max`` is int64).
    input_size, cell_size : int
        ``I`` and ``H`` (concrete dims of the graph's inputs and outputs).
    attrs : mapping, optional
        TF attributes of the node (see :func:`make_node`).
    with_functions : bool
        Attach the op's ONNX function (:mod:`.functions`) to the model.
    seq_len, batch : int or str
        The ``T`` and ``B`` dims: a name (symbolic, default) or an int.
    initializers : mapping, optional
        Input name -> array: those inputs (``w``, ``b``, the peepholes: any whose shape has no
        ``T`` or ``B``) are stored in the model as initializers, not graph inputs.
    """
    op = get_op(op_name)
    dims = _dims(input_size, cell_size, seq_len, batch)
    node = make_node(op.name, name=op.name, **dict(attrs or {}))
    return _model([op], [node], op.inputs, op.outputs, dtype, dims, with_functions,
                  f"lstm_tvm_{op.name}", initializers)


def make_forward_backward_model(fwd_op: str, dtype="float32", *, input_size: int,
                                cell_size: int, attrs: Mapping[str, object] | None = None,
                                with_functions: bool = True, seq_len: int | str = "T",
                                batch: int | str = "B",
                                initializers: Mapping[str, object] | None = None
                                ) -> onnx.ModelProto:
    """A forward op (``LSTMBlockCell``, ``BlockLSTM``, ``BlockLSTMV2``) feeding its grad op.

    Graph inputs: the forward's inputs, then ``cs_grad`` and ``h_grad``; graph outputs: the
    forward's outputs, then the grad's. ``attrs`` are the forward's; the grad op gets the same
    ``use_peephole`` (TF's default if not given). Other parameters as :func:`make_model`
    (``initializers`` feed both ops).
    """
    fwd = get_op(fwd_op)
    if fwd.direction != "forward":
        raise ValueError(f"fwd_op: expected a forward op (one of LSTMBlockCell, BlockLSTM, "
                         f"BlockLSTMV2), got {fwd_op!r}")
    bwd = get_op(fwd.pair)
    attrs = dict(attrs or {})
    fwd_node = make_node(fwd.name, name=fwd.name, **attrs)
    peephole = attrs.get("use_peephole", fwd.attr("use_peephole").default)
    bwd_node = make_node(bwd.name, name=bwd.name, use_peephole=peephole)
    produced = set(fwd.output_names) | set(fwd.input_names)
    extra_inputs = [t for t in bwd.inputs if t.name not in produced]
    dims = _dims(input_size, cell_size, seq_len, batch)
    return _model([fwd, bwd], [fwd_node, bwd_node], fwd.inputs + tuple(extra_inputs),
                  fwd.outputs + bwd.outputs, dtype, dims, with_functions,
                  f"lstm_tvm_{fwd.name}_{bwd.name}", initializers)


def write_models(folder, specs, subdir: str = "onnx") -> dict[str, str]:
    """Write each spec's single-op model (:func:`make_model`, its ONNX function attached) to
    ``folder/<subdir>/<Op>.onnx``; returns each op's file relative to ``folder``. A spec is
    anything with ``op``, ``dtype``, ``input_size``, ``cell_size`` and ``attrs`` (``(name,
    value)`` pairs), e.g. a :class:`lstm_tvm.build.BuildSpec`."""
    (Path(folder) / subdir).mkdir(exist_ok=True)
    paths = {}
    for spec in specs:
        model = make_model(spec.op, spec.dtype, input_size=spec.input_size,
                           cell_size=spec.cell_size, attrs=dict(spec.attrs))
        paths[spec.op] = f"{subdir}/{spec.op}.onnx"
        (Path(folder) / paths[spec.op]).write_bytes(model.SerializeToString())
    return paths
