"""The ONNX domain of lstm_tvm's custom ops, the versions it writes, and attribute conversion.

Every node, schema, function and PyOp of :mod:`lstm_tvm.onnx` lives in :data:`DOMAIN`
(version :data:`DOMAIN_VERSION`); the op types are TensorFlow's op names from
:data:`lstm_tvm.registry.OPS`. Function bodies use the standard ``ai.onnx`` opset
:data:`ONNX_OPSET`, and models are written with IR version :data:`IR_VERSION`: onnx 1.23 would
write IR 14 / opset 28, which onnxruntime 1.31 refuses (it reads at most IR 13, opset 26).

Attributes follow TF's: float attributes are ONNX ``FLOAT``, bool attributes are ONNX ``INT``
(0 or 1), with TF's defaults; a TF attribute without default is a required ONNX attribute.
``cell_clip`` takes what TF takes and is written as :func:`lstm_tvm.validation.check_cell_clip`
gives it (0 where TF does not clip: NaN, ``+-inf``, ...).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
from onnx import AttributeProto, TensorProto

from ..registry import AttrSpec, OpSpec, get_op
from ..validation import check_cell_clip

__all__ = [
    "DOMAIN",
    "DOMAIN_VERSION",
    "ELEM_TYPES",
    "FLOAT_TYPE_STRS",
    "INDEX_TYPE_STR",
    "IR_VERSION",
    "ONNX_OPSET",
    "ORT_MAX_IR_VERSION",
    "ORT_MAX_OPSET",
    "elem_type",
    "onnx_attr_default",
    "onnx_attr_type",
    "onnx_attrs",
]

#: The custom op domain (op types are the TF names, e.g. ``org.lstm_tvm.BlockLSTM``).
DOMAIN = "org.lstm_tvm"
#: The version of :data:`DOMAIN` every op is defined at.
DOMAIN_VERSION = 1
#: The highest ``ai.onnx`` opset onnxruntime 1.31 reads.
ORT_MAX_OPSET = 26
#: The highest IR version onnxruntime 1.31 reads.
ORT_MAX_IR_VERSION = 13
#: The ``ai.onnx`` opset of function bodies and of models built here (<= ORT_MAX_OPSET).
ONNX_OPSET = 21
#: The IR version of models built here (onnxruntime 1.31 reads <= 13; functions with
#: attribute defaults need >= 9).
IR_VERSION = 10

#: ONNX element types of the float dtypes the ops accept (registry ``DTYPES``) and of int64.
ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "int64": TensorProto.INT64}
#: The type-constraint strings of the op's float type ``T`` (registry order).
FLOAT_TYPE_STRS = ("tensor(float)", "tensor(float16)")
#: The type string of ``seq_len_max``.
INDEX_TYPE_STR = "tensor(int64)"


def elem_type(dtype) -> int:
    """The ONNX ``TensorProto`` element type of ``dtype`` (``"float32"``, ``"float16"``, ``"int64"``)."""
    name = np.dtype(dtype).name
    if name not in ELEM_TYPES:
        raise TypeError(f"dtype: expected one of {list(ELEM_TYPES)}, got {name!r}")
    return ELEM_TYPES[name]


def onnx_attr_type(spec: AttrSpec) -> int:
    """The ``AttributeProto`` type of a registry attribute (bool -> INT, float -> FLOAT)."""
    if spec.type is bool:
        return AttributeProto.INT
    if spec.type is float:
        return AttributeProto.FLOAT
    raise TypeError(f"attribute {spec.name!r}: unsupported registry type {spec.type!r}")


def _convert(op: OpSpec, spec: AttrSpec, value):
    if spec.type is bool:
        if isinstance(value, (bool, np.bool_)):
            return int(bool(value))
        if isinstance(value, numbers.Integral) and int(value) in (0, 1):
            return int(value)
        raise TypeError(f"{op.name}: attribute {spec.name!r} expected a bool (or 0/1), "
                        f"got {value!r}")
    if spec.name == "cell_clip":  # what TF takes, NaN and +-inf included
        return check_cell_clip(op, value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op.name}: attribute {spec.name!r} expected a float, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{op.name}: attribute {spec.name!r} expected a finite float, "
                         f"got {value!r}")
    return value


def onnx_attr_default(spec: AttrSpec):
    """TF's default of ``spec`` as an ONNX attribute value (``int`` for bools), or None."""
    if spec.required:
        return None
    return int(spec.default) if spec.type is bool else float(spec.default)


def onnx_attrs(op_name: str, attrs: Mapping[str, object] | None, *,
               fill_defaults: bool = False) -> dict[str, int | float]:
    """Validate ``attrs`` against the registry and convert them to ONNX attribute values.

    Unknown names raise ``TypeError`` listing the valid ones; a missing required attribute
    raises ``TypeError``; bools become ``int`` 0/1, floats ``float``. With ``fill_defaults``,
    omitted optional attributes are filled with TF's defaults (needed by the PyOp route, where
    every declared attribute must be on the node).
    """
    op = get_op(op_name)
    attrs = dict(attrs or {})
    unknown = sorted(set(attrs) - set(op.attr_names))
    if unknown:
        raise TypeError(f"{op.name}: unknown attribute(s) {unknown}; expected one of "
                        f"{list(op.attr_names)}")
    out: dict[str, int | float] = {}
    for spec in op.attrs:
        if spec.name in attrs:
            out[spec.name] = _convert(op, spec, attrs[spec.name])
        elif spec.required:
            raise TypeError(f"{op.name}: attribute {spec.name!r} is required, got none")
        elif fill_defaults:
            out[spec.name] = onnx_attr_default(spec)
    return out
