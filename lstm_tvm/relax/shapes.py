"""Reading dtypes and dims of Relax expressions, with errors that name the node and input.

Dims are ``PrimExpr``s: ``IntImm`` when static, a ``tirx.Var`` (or expression) when symbolic.
A tensor whose dims Relax does not know is given fresh symbolic dims with ``match_cast``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tvm import relax, tirx
from tvm.ir.expr import Constant

__all__ = ["constant_value", "dtype_of", "known_dims", "static_dim", "tensor_dims"]


def static_dim(dim) -> int | None:
    """``dim`` as a Python int when it is static, else ``None``."""
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    if isinstance(dim, tirx.IntImm):
        return int(dim.value)
    return None


def constant_value(expr) -> np.ndarray | None:
    """The value of a Relax constant (an ONNX initializer or ``Constant`` node), else ``None``."""
    if isinstance(expr, Constant):
        return expr.value.numpy()
    return None


def _tensor_type(expr, label: str, what: str) -> relax.TensorType:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"{label}: {what} expected a tensor, got {ty}")
    return ty


def dtype_of(expr, label: str, what: str) -> str:
    """The element dtype of tensor ``expr`` (``"float32"``, ...)."""
    return str(_tensor_type(expr, label, what).dtype)


def known_dims(expr, label: str, what: str, rank: int) -> list | None:
    """The dims of tensor ``expr`` as ``PrimExpr``s, or ``None`` when Relax does not know them;
    raises ``ValueError`` when its rank is known and is not ``rank``."""
    ty = _tensor_type(expr, label, what)
    if ty.ndim != -1 and ty.ndim != rank:
        raise ValueError(f"{label}: {what} expected rank {rank}, got rank {ty.ndim} "
                         f"(type {ty})")
    if not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def tensor_dims(bb: relax.BlockBuilder, expr, label: str, what: str,
                names: Sequence[str], static: Sequence[int | None] = ()):
    """``(expr, dims)`` with ``len(names)`` dims known: ``expr`` as it is when Relax knows its
    dims, else ``expr`` cast (``match_cast``) to fresh dims named ``names``, or to ``static[k]``
    where given. A static ``static[k]`` that a known static dim contradicts raises ``ValueError``;
    a known symbolic dim is cast to ``static[k]``."""
    static = list(static) + [None] * (len(names) - len(static))
    dims = known_dims(expr, label, what, len(names))
    if dims is not None:
        for k, (dim, want) in enumerate(zip(dims, static)):
            got = static_dim(dim)
            if want is not None and got is not None and got != want:
                raise ValueError(f"{label}: {what} dim {k} ({names[k]}) expected {want}, "
                                 f"got {got} (shape {[str(d) for d in dims]})")
        if all(want is None or static_dim(dim) is not None for dim, want in zip(dims, static)):
            return expr, dims
    new = [tirx.IntImm("int64", want) if want is not None
           else (dims[k] if dims is not None else tirx.Var(names[k], "int64"))
           for k, want in enumerate(static)]
    dtype = dtype_of(expr, label, what)
    cast = bb.match_cast(expr, relax.TensorType(new, dtype))
    return cast, new
