"""``from_onnx``: TVM's Relax ONNX importer, extended with lstm_tvm's converters.

TVM's ``from_onnx`` takes no custom converters: its importer looks ops up in a module-level
map by op type alone (``_get_convert_map``). :class:`LSTMGraphImporter` subclasses TVM's
``ONNXGraphImporter`` and consults lstm_tvm's converters first, keyed by domain and op type
(standard ``LSTM``; the six ops of ``org.lstm_tvm``), so that nothing global changes and every
other node still goes through TVM's own converters.
"""

from __future__ import annotations

import types
import warnings

import onnx
import tvm
from tvm import relax
from tvm.error import OpError, OpNotImplemented
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map, onnx_input

from ..onnx.domain import DOMAIN, DOMAIN_VERSION
from ..onnx import contract
from .context import NodeContext, node_label
from .custom_ops import CUSTOM_CONVERTERS
from .kernel_calls import KernelTable
from .onnx_lstm import LSTM
from .shape_values import ShapeValues
from .shapes import static_dim

__all__ = ["LSTMGraphImporter", "from_onnx"]

_STANDARD_DOMAINS = ("", "ai.onnx")
#: Handled by TVM's importer outside its converter map.
_TVM_DIRECT_OPS = ("If", "Constant")
#: The ops TVM's importer lets take a ``ShapeExpr`` input (the list in its node loop); others
#: get the shape as an ``int64`` tensor.
_TVM_TAKES_SHAPES = ("Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape",
                     "Expand", "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze")


class LSTMGraphImporter(ONNXGraphImporter):
    """TVM's ``ONNXGraphImporter`` that converts ``LSTM`` and ``org.lstm_tvm`` nodes with
    lstm_tvm's kernels (see :func:`from_onnx` for the parameters)."""

    def __init__(self, shape_dict, dtype_dict, *, kernels: KernelTable, domain_version: int,
                 keep_params_in_input: bool = False, sanitize: bool = True):
        super().__init__(shape_dict, dtype_dict, keep_params_in_input=keep_params_in_input,
                         sanitize=sanitize)
        self._kernels = kernels
        self._domain_version = domain_version
        self._shape_values = ShapeValues()
        #: ONNX values whose shape Relax does not know -> the node where it was lost.
        self._lost_shapes: dict[str, str] = {}

    def _lstm_tvm_converter(self, domain: str, op_type: str):
        """``(converter class, version)`` when lstm_tvm converts this op, else ``None``."""
        if domain in _STANDARD_DOMAINS and op_type == "LSTM":
            return LSTM, self.opset
        if domain == DOMAIN and op_type in CUSTOM_CONVERTERS:
            return CUSTOM_CONVERTERS[op_type], self._domain_version
        return None

    def _check_for_unsupported_ops(self, graph):
        """Every op neither lstm_tvm nor TVM converts, in one ``OpNotImplemented``; then every
        lstm_tvm node's attributes, every refusal in one error."""
        tvm_ops = _get_convert_map()
        unsupported = set()
        for node in graph.node:
            if self._lstm_tvm_converter(node.domain, node.op_type) is not None:
                continue
            if node.domain == DOMAIN:
                unsupported.add(f"{DOMAIN}.{node.op_type} (lstm_tvm's domain holds "
                                f"{', '.join(CUSTOM_CONVERTERS)})")
            elif node.op_type not in tvm_ops and node.op_type not in _TVM_DIRECT_OPS:
                unsupported.add(f"{node.domain}.{node.op_type}" if node.domain
                                else node.op_type)
        if unsupported:
            raise OpNotImplemented("The following operators are not supported for frontend "
                                   "ONNX: " + ", ".join(sorted(unsupported)))
        errors = []
        for node in graph.node:
            found = self._lstm_tvm_converter(node.domain, node.op_type)
            if found is not None:
                cls, version = found
                try:
                    cls.check_attrs(self._parse_attr(node.attribute), node_label(node), version)
                except OpError as err:
                    errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise type(errors[0])("\n".join(str(e) for e in errors))

    def _construct_nodes(self, graph):
        _check_order(graph, self._nodes)
        for node in graph.node:
            found = self._lstm_tvm_converter(node.domain, node.op_type)
            if found is None:
                self._construct_standard(node)
                continue
            inputs = onnx_input(self._nodes[name] if name else None for name in node.input)
            attrs = self._parse_attr(node.attribute)
            attrs["tvm_custom"] = {"name": node.name, "num_outputs": len(node.output)}
            result = self._convert_with(found, node_label(node), inputs, attrs)
            if isinstance(result, relax.Tuple):
                fields = list(result.fields)
            else:
                fields = [self.bb.emit(relax.TupleGetItem(result, k))
                          for k in range(len(result.ty.fields))]
            if len(node.output) > len(fields):
                raise ValueError(f"{node_label(node)}: expected at most {len(fields)} outputs, "
                                 f"got {len(node.output)}")
            self._nodes.update((name, value) for name, value in zip(node.output, fields) if name)

    def _construct_standard(self, node):
        """``node`` converted by TVM, except where :class:`~.shape_values.ShapeValues` knows
        better: an output whose value it knows and is static becomes a constant, a shape
        operand (``Reshape``, ``Expand``, ``ReduceSum``'s axes, ...) is replaced by the value
        it knows; then the output's value is remembered, if it follows from the inputs'."""
        attrs = self._parse_attr(node.attribute)
        shapes = self._shape_values
        value = shapes.follow(node, self._nodes, attrs)
        converted = shapes.convert(self.bb, node, self._nodes, value)
        if converted is not None:
            self._nodes[node.output[0]] = self.bb.normalize(converted)
        else:
            operand = shapes.shape_operand(self.bb, node, self._nodes, attrs)
            if operand is not None:
                node = self._with_input(node, *operand)
            for k, name in enumerate(node.input):
                expr = self._nodes.get(name) if name else None
                if node.op_type not in _TVM_TAKES_SHAPES and expr is not None \
                        and isinstance(expr.ty, relax.ShapeType):
                    node = self._with_input(node, k, relax.op.shape_to_tensor(expr))
            try:
                super()._construct_nodes(types.SimpleNamespace(node=[node]))  # graph.node
            except Exception as err:  # noqa: BLE001 - re-raised, with the cause when known
                self._explain_lost_shape(node, err)
                raise
        shapes.record(node.output[0], value)
        self._note_lost_shapes(node)

    def _note_lost_shapes(self, node):
        """Remember ``node``'s outputs whose shape Relax does not know, and where it was lost
        (here, or where an input's was)."""
        for name in node.output:
            expr = self._nodes.get(name) if name else None
            if expr is None or _shape_known(expr):
                continue
            inherited = [self._lost_shapes[n] for n in node.input if n in self._lost_shapes]
            if inherited:
                self._lost_shapes[name] = inherited[0]
                continue
            operands = ", ".join(f"{n!r} {_shape_text(self._nodes[n])}" for n in node.input
                                 if n and n in self._nodes)
            self._lost_shapes[name] = f"{node_label(node)} on {operands}"

    def _explain_lost_shape(self, node, err: Exception):
        """Raise ``ValueError`` saying why TVM's converter failed on ``node`` when an input's
        shape was lost upstream (distinct symbolic dims that broadcast against each other)."""
        lost = [n for n in node.input if n in self._lost_shapes]
        if not lost:
            return
        symbolic = ", ".join(f"{name} {_shape_text(self._nodes[name])}"
                             for name in self._inputs if name in self._nodes
                             and not _shape_static(self._nodes[name]))
        raise ValueError(
            f"{node_label(node)}: TVM's converter failed ({type(err).__name__}) because "
            f"Relax does not know the shape of input "
            f"{lost[0]!r}: it was lost at {self._lost_shapes[lost[0]]}, whose symbolic dims "
            f"are distinct symbols that Relax cannot broadcast at import. ONNX exporters name "
            f"each unknown dim apart (tf2onnx: unk__N); where dims are equal at run time, "
            f"import with one tvm.tirx.Var per dim, e.g. from_onnx(model, shape_dict={{...}}) "
            f"for the graph inputs {symbolic}") from err

    def _with_input(self, node: onnx.NodeProto, index: int, expr) -> onnx.NodeProto:
        """A copy of ``node`` reading input ``index`` from ``expr`` (under a new name)."""
        name = f"{node.input[index]}/for_{node.output[0]}"
        self._nodes[name] = expr
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[index] = name
        return copy

    def _convert_operator(self, op_name, inputs, attrs, opset):
        # Reached for TVM's own ops, and for the nodes of If branches (TVM's importer converts
        # those itself and does not pass their domain on).
        found = self._lstm_tvm_converter(DOMAIN if op_name in CUSTOM_CONVERTERS else "",
                                         op_name)
        if found is None:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        return self._convert_with(found, f"{op_name} node {attrs['tvm_custom']['name']!r}",
                                  inputs, attrs)

    def _convert_with(self, found, label: str, inputs, attrs):
        cls, version = found
        ctx = NodeContext(label, self._kernels)
        return self.bb.normalize(cls.get_converter(version)(self.bb, inputs, attrs, ctx))


def _check_order(graph, known) -> None:
    """``ValueError`` naming the first node that reads a value no earlier node, graph input or
    initializer defines (a cycle, or nodes out of order)."""
    defined = set(known)
    for node in graph.node:
        missing = [name for name in node.input if name and name not in defined]
        if missing:
            producers = [node_label(n) for n in graph.node if missing[0] in n.output]
            where = (f"written by {producers[0]}, which comes later (the graph has a cycle or is "
                     f"not topologically sorted)" if producers else
                     "which no node, graph input or initializer defines")
            raise ValueError(f"{node_label(node)}: input {missing[0]!r} is read before it is "
                             f"defined: {where}")
        defined.update(name for name in node.output if name)


def _shape_known(expr) -> bool:
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType):
        return isinstance(ty.shape, relax.ShapeExpr)
    if isinstance(ty, relax.ShapeType):
        return ty.values is not None
    return True


def _shape_static(expr) -> bool:
    ty = getattr(expr, "ty", None)
    return not isinstance(ty, relax.TensorType) or isinstance(ty.shape, relax.ShapeExpr) and \
        all(static_dim(d) is not None for d in ty.shape.values)


def _shape_text(expr) -> str:
    """``(unk__1, 6)``, or ``(?, ?)`` where Relax knows only the rank."""
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return "(" + ", ".join(str(d) if static_dim(d) is None else str(static_dim(d))
                               for d in ty.shape.values) + ")"
    if isinstance(ty, relax.TensorType) and ty.ndim >= 0:
        return "(" + ", ".join("?" * ty.ndim) + ")"
    return str(ty)


def _opset_versions(model: onnx.ModelProto) -> tuple[int, int]:
    """``(ai.onnx opset, org.lstm_tvm version)`` the model imports (ONNX's rule: 1 when the
    default domain is not imported; :data:`DOMAIN_VERSION` when lstm_tvm's is not)."""
    versions = {o.domain: o.version for o in model.opset_import}
    standard = versions.get("", versions.get("ai.onnx", 1))
    custom = versions.get(DOMAIN, DOMAIN_VERSION)
    if custom != DOMAIN_VERSION:
        raise ValueError(f"model imports {DOMAIN} version {custom}; lstm_tvm defines version "
                         f"{DOMAIN_VERSION}")
    return standard, custom


def from_onnx(model: onnx.ModelProto, shape_dict: dict | None = None,
              dtype_dict: str | dict | None = None, target=None, *, opset: int | None = None,
              keep_params_in_input: bool = False, sanitize_input_names: bool = True,
              tuned: bool = True, check_model: bool = True) -> tvm.IRModule:
    """Import an ONNX model into a Relax ``IRModule``; ``LSTM`` nodes and lstm_tvm's
    custom-domain nodes become ``call_tir`` of lstm_tvm's kernels, every other node goes
    through TVM's ``tvm.relax.frontend.onnx`` converters.

    Compile the result with ``tvm.compile(mod, target)`` for the same ``target`` and run it
    on ``relax.VirtualMachine``: ``vm["main"](*inputs)`` (graph inputs in order, initializers
    folded in unless ``keep_params_in_input``).

    Parameters
    ----------
    model : onnx.ModelProto
        The model (IR version >= 3).
    shape_dict : dict of str to shape, optional
        Overrides graph inputs' shapes (ints, or ``tvm.tirx.Var`` for symbolic dims).
    dtype_dict : str or dict of str to str, optional
        Overrides graph inputs' dtypes (a dict; a str is ignored, as in TVM).
    target : str, dict or tvm.target.Target, optional
        What lstm_tvm's kernels are scheduled for: ``"llvm"`` (default: this CPU), ``"cuda"``,
        a target JSON dict or a ``Target`` (see :func:`lstm_tvm.compile`).
    opset : int, optional
        Overrides the model's ``ai.onnx`` opset.
    keep_params_in_input : bool
        Initializers become trailing function parameters (``mod["main"].attrs["params"]``
        holds their values) instead of constants; LSTM weights are then re-laid out by Relax
        ops at run time rather than folded at import.
    sanitize_input_names : bool
        Make graph input names valid Relax identifiers.
    tuned : bool
        Apply this target's tuning records to the kernels (see ``lstm-tvm tune``).
    check_model : bool
        Refuse a model that breaks lstm_tvm's contract (:func:`lstm_tvm.onnx.check_model`:
        onnx's checker with the ops' schemas, attribute values, input types): outputs written
        twice, repeated or unknown attributes, missing outputs, unsorted nodes, mixed float
        types. TVM's own ``from_onnx`` only warns; ``False`` imports such a model as far as
        the converters can (unsorted nodes are still refused).

    Raises
    ------
    tvm.error.OpNotImplemented
        Ops neither lstm_tvm nor TVM converts (all listed).
    tvm.error.OpAttributeUnImplemented, tvm.error.OpAttributeInvalid
        ``LSTM`` or custom-op attributes the kernels cannot compute (every refusal listed,
        naming the node, attribute and value).
    ValueError, TypeError
        A model onnx's checker rejects (``check_model``) or whose nodes are not in
        topological order; shapes or dtypes the kernels cannot take (non-static ``I``/``H``,
        float64, ...), a constant ``seq_len_max`` outside ``[0, T]``, or a model importing
        ``org.lstm_tvm`` at a version other than :data:`~lstm_tvm.onnx.DOMAIN_VERSION`.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected an onnx.ModelProto, got {type(model).__name__}")
    if model.ir_version < 3:
        raise ValueError(f"model: IR version {model.ir_version} is not supported (>= 3)")
    if check_model:
        try:
            contract.check_model(model)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{err} (from_onnx(..., check_model=False) imports it "
                            f"anyway)") from None
    standard, custom = _opset_versions(model)
    if opset is not None and opset < standard:
        warnings.warn(f"opset {opset} overrides the model's ai.onnx opset {standard}",
                      stacklevel=2)
    importer = LSTMGraphImporter(
        shape_dict, dtype_dict, kernels=KernelTable(target, tuned), domain_version=custom,
        keep_params_in_input=keep_params_in_input, sanitize=sanitize_input_names)
    return importer.from_onnx(model.graph, standard if opset is None else opset)

