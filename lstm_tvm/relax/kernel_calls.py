"""``call_tir`` of lstm_tvm's scheduled kernels from a Relax ``BlockBuilder``.

A kernel's PrimFunc (:func:`lstm_tvm.build.primfunc`) takes, in order: ``seq_len_max`` as an
``int64`` scalar (sequence ops only), the op's tensor inputs, then its outputs (TF's orders);
``T`` and ``B`` are symbolic, ``I`` and ``H`` static. ``call_tir`` passes a ``PrimExpr``
argument to a scalar parameter, so ONNX's ``seq_len_max`` becomes one (:func:`seq_len_value`):
a run-time tensor is read into a symbolic ``int64`` with ``tensor_to_shape`` + ``match_cast``, a
constant becomes an ``IntImm``, and a value TVM's frontend computed from shapes already is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tvm import relax, tirx
from tvm.ir import is_prim_expr

from ..targets import resolve_target
from ..build import BuildSpec, make_spec, primfunc
from ..registry import get_op
from .shapes import constant_value, dtype_of, known_dims

__all__ = ["KernelTable", "seq_len_value"]


class KernelTable:
    """The kernels added to one IRModule under construction: one PrimFunc per
    :class:`~lstm_tvm.build.BuildSpec`, shared by every node that needs it.

    Parameters
    ----------
    target : str, dict or tvm.target.Target
        What the kernels are scheduled for (see :func:`lstm_tvm.targets.resolve_target`); the
        module must be compiled for the same target.
    tuned : bool
        Apply this target's tuning records to the kernels' GEMM blocks.
    """

    def __init__(self, target=None, tuned: bool = True):
        self.target = resolve_target(target)
        self.tuned = tuned
        self._gvars: dict[BuildSpec, relax.GlobalVar] = {}

    def global_var(self, bb: relax.BlockBuilder, op_name: str, dtype: str, input_size: int,
                   cell_size: int, attrs: Mapping[str, object]) -> relax.GlobalVar:
        """The ``GlobalVar`` of the kernel for these arguments (added to ``bb``'s module once).

        ``attrs`` are every attribute of the op (see :func:`lstm_tvm.validation.validate_attrs`).
        """
        spec = make_spec(op_name, dtype, input_size, cell_size, dict(attrs), self.target,
                         tuned=self.tuned)
        if spec not in self._gvars:
            # Relax names the function after its GlobalVar; the scheduled kernel must not be
            # rescheduled by the GPU pipelines' default schedules.
            func = (primfunc(spec).without_attr("global_symbol")
                    .with_attr("tirx.is_scheduled", True))
            name = f"{spec.func_name}_i{input_size}_h{cell_size}"
            self._gvars[spec] = bb.add_func(func, name)
        return self._gvars[spec]

    def call(self, bb: relax.BlockBuilder, op_name: str, dtype: str, sizes: Mapping[str, object],
             attrs: Mapping[str, object], tensors: Sequence[relax.Expr],
             seq_len_max=None) -> relax.Var:
        """Emit ``call_tir`` of ``op_name``'s kernel; returns the bound tuple of its outputs.

        Parameters
        ----------
        sizes : mapping
            ``T`` (sequence ops), ``B`` as ``PrimExpr``s (symbolic or static), ``I`` and ``H``
            as ints: the outputs' shapes.
        tensors : sequence of Relax expressions
            The op's tensor inputs in TF's order (without ``seq_len_max``).
        seq_len_max : PrimExpr, optional
            The steps to run (sequence ops only, ``int64``).
        """
        op = get_op(op_name)
        gvar = self.global_var(bb, op_name, dtype, sizes["I"], sizes["H"], attrs)
        args = list(tensors)
        if op.kind == "sequence":
            args.insert(0, relax.prim_value(seq_len_max))
        out_types = [relax.TensorType(spec.concrete_shape(sizes), dtype) for spec in op.outputs]
        return bb.emit(relax.call_tir(gvar, args, out_types), name_hint=op_name)


def seq_len_value(bb: relax.BlockBuilder, expr, label: str):
    """ONNX's ``seq_len_max`` (an ``int64`` or ``int32`` scalar) as an ``int64`` ``PrimExpr``
    for the kernel.

    It arrives in one of three forms. A tensor (a graph input or a computed one) is read at run
    time into a fresh symbolic ``int64`` (the kernel checks ``0 <= n <= T``). A constant (an
    initializer or ``Constant`` node) becomes an ``IntImm``. A value computed from shapes
    (``Shape`` -> ``Gather``, ``Squeeze``, ``Cast``, arithmetic) is a ``PrimExpr`` in TVM's ONNX
    frontend, symbolic in ``T``, ``B``, or an ``IntImm`` when they are static, and is used as it
    is. A negative ``IntImm`` raises ``ValueError``; anything else, ``TypeError``.
    """
    what = "input 'seq_len_max'"
    if is_prim_expr(expr):
        _index_dtype(str(expr.ty.dtype), label, what)
        steps = expr.astype("int64")
    elif isinstance(expr.ty, relax.TensorType):
        steps = _tensor_steps(bb, expr, label, what)
    else:
        raise TypeError(f"{label}: {what} expected an int64 scalar (a tensor, or a value "
                        f"computed from shapes), got {expr.ty}")
    if isinstance(steps, tirx.IntImm) and int(steps) < 0:
        raise ValueError(f"{label}: {what} expected >= 0, got {int(steps)}")
    return steps


def _index_dtype(dtype: str, label: str, what: str) -> str:
    if dtype not in ("int64", "int32"):
        raise TypeError(f"{label}: {what} expected int64 (or int32), got {dtype}")
    return dtype


def _tensor_steps(bb: relax.BlockBuilder, expr, label: str, what: str):
    """A scalar integer tensor as an ``IntImm`` (a constant) or a symbolic ``int64``."""
    dtype = _index_dtype(dtype_of(expr, label, what), label, what)
    known_dims(expr, label, what, 0)
    value = constant_value(expr)
    if value is not None:
        return tirx.IntImm("int64", int(value))
    if dtype != "int64":
        expr = relax.op.astype(expr, "int64")
    shape = bb.emit(relax.op.tensor_to_shape(relax.op.reshape(expr, (1,))))
    steps = tirx.Var("seq_len_max", "int64")
    bb.match_cast(shape, relax.ShapeType([steps]))
    return steps
