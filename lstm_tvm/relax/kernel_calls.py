"""``call_tir`` of lstm_tvm's scheduled kernels from a Relax ``BlockBuilder``.

A kernel's PrimFunc (:func:`lstm_tvm.build.primfunc`) takes, in order: ``seq_len_max`` as an
``int64`` scalar (sequence ops only), the op's tensor inputs, then its outputs (TF's orders);
``T`` and ``B`` are symbolic, ``I`` and ``H`` static. ``call_tir`` passes a ``PrimExpr``
argument to a scalar parameter, so an ONNX ``seq_len_max`` tensor is read into a symbolic
``int64`` with ``tensor_to_shape`` + ``match_cast``; a constant one becomes an ``IntImm``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tvm import relax, tirx

from .._tvm import resolve_target
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
        What the kernels are scheduled for (see :func:`lstm_tvm._tvm.resolve_target`); the
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
    """An ``int64`` scalar tensor (ONNX ``seq_len_max``) as a ``PrimExpr`` for the kernel.

    A constant becomes an ``IntImm`` (negative values raise ``ValueError``); any other tensor
    is read at run time into a fresh symbolic ``int64`` (the kernel checks ``0 <= n <= T``).
    """
    what = "input 'seq_len_max'"
    if dtype_of(expr, label, what) != "int64":
        raise TypeError(f"{label}: {what} expected int64, got {dtype_of(expr, label, what)}")
    known_dims(expr, label, what, 0)
    value = constant_value(expr)
    if value is not None:
        if int(value) < 0:
            raise ValueError(f"{label}: {what} expected >= 0, got {int(value)}")
        return tirx.IntImm("int64", int(value))
    shape = bb.emit(relax.op.tensor_to_shape(relax.op.reshape(expr, (1,))))
    steps = tirx.Var("seq_len_max", "int64")
    bb.match_cast(shape, relax.ShapeType([steps]))
    return steps
