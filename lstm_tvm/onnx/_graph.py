"""A small builder for ONNX node lists (function bodies and their Loop/If subgraphs).

Internal to :mod:`lstm_tvm.onnx.functions`. Value names are unique within one function (a
counter shared by the body and all its subgraphs), so subgraphs never shadow outer names.
"""

from __future__ import annotations

import itertools

import numpy as np
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
BOOL = TensorProto.BOOL
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


class Graph:
    """Collects nodes; :meth:`op` appends one and returns its output name(s)."""

    def __init__(self, prefix: str, counter=None):
        self.prefix = prefix
        self.nodes: list[NodeProto] = []
        self._counter = counter if counter is not None else itertools.count()

    def sub(self) -> Graph:
        """A builder for a subgraph sharing this one's name counter."""
        return Graph(self.prefix, self._counter)

    def name(self, hint: str) -> str:
        return f"{self.prefix}_{hint}_{next(self._counter)}"

    def op(self, op_type: str, *inputs: str, n_out: int = 1, hint: str | None = None,
           outputs: list[str] | None = None, node_name: str | None = None, **attrs):
        """Append ``op_type(inputs, **attrs)``; return its output name (a list if n_out > 1)."""
        outs = outputs or [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs if len(outs) > 1 or outputs else outs[0]

    def ref_constant(self, attr_name: str, attr_type: int, hint: str,
                     node_name: str | None = None) -> str:
        """A Constant whose value is the enclosing function's attribute ``attr_name``."""
        field = {AttributeProto.FLOAT: "value_float", AttributeProto.INT: "value_int"}[attr_type]
        out = self.name(hint)
        node = helper.make_node("Constant", [], [out], name=node_name)
        node.attribute.append(helper.make_attribute_ref(field, attr_type, ref_attr_name=attr_name))
        self.nodes.append(node)
        return out

    def const(self, value, dtype=np.int64, hint: str = "c") -> str:
        """A Constant tensor (``value`` as a NumPy array of ``dtype``)."""
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), self.name(hint + "_t"))
        return self.op("Constant", hint=hint, value=tensor)

    def graph(self, name: str, inputs, outputs) -> GraphProto:
        """A subgraph from the collected nodes; ``inputs``/``outputs``: ``(name, elem, shape)``."""
        return helper.make_graph(
            self.nodes, self.name(name),
            [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
            [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs])

    # --- shorthands ------------------------------------------------------------------------

    def add(self, a, b):
        return self.op("Add", a, b)

    def minus(self, a, b):
        return self.op("Sub", a, b)

    def mul(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = self.op("Mul", out, x)
        return out

    def slice(self, data, start, end, axis: int, step=None):
        """``data[start:end]`` along ``axis``; ``start``/``end`` are 1-element int64 names."""
        args = [data, start, end, self.const([axis])]
        if step is not None:
            args.append(self.const([step]))
        return self.op("Slice", *args)

    def dim(self, data, axis: int) -> str:
        """``shape(data)[axis]`` as a 1-element int64 tensor."""
        if axis == -1:
            return self.op("Shape", data, start=-1)
        return self.op("Shape", data, start=axis, end=axis + 1)
