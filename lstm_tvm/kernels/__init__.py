"""Unscheduled TIR kernels, one builder per registry op, TF op or helper (see
:data:`BUILDERS`), :func:`kernel_func`, the unscheduled PrimFunc of an op,
:func:`pack_func`, the function that packs an op's weights for its prepacked kernel, and
:func:`unread_inputs`."""

import functools

from tvm.s_tir.analysis import detect_buffer_access_lca

from ..registry import get_op
from ._weights import pack_func_name, pack_kernel
from .block_cell import lstm_block_cell, lstm_block_cell_grad, weight_packs as forward_packs
from .block_lstm import block_lstm, weight_packs as sequence_packs
from .block_lstm_grad import block_lstm_grad, weight_packs as backward_packs
from .cell_grad_matmul import cell_grad_matmul
from .variant import KernelVariant

#: Registry op name -> builder ``(op, dtype, input_size, cell_size, attrs, variant,
#: gemms=None) -> PrimFunc``.
BUILDERS = {
    "LSTMBlockCell": lstm_block_cell,
    "LSTMBlockCellGrad": lstm_block_cell_grad,
    "BlockLSTM": block_lstm,
    "BlockLSTMGrad": block_lstm_grad,
    "BlockLSTMV2": block_lstm,
    "BlockLSTMGradV2": block_lstm_grad,
    "CellGradMatmul": cell_grad_matmul,
}


#: Registry op name -> ``(input_size, cell_size) -> WeightPacks`` of the ops whose kernels pack
#: ``w`` (see :mod:`._weights`); the other ops read it in place.
WEIGHT_PACKS = {
    "LSTMBlockCell": forward_packs,
    "BlockLSTM": sequence_packs,
    "BlockLSTMV2": sequence_packs,
    "BlockLSTMGrad": backward_packs,
    "BlockLSTMGradV2": backward_packs,
    "CellGradMatmul": backward_packs,
}


def kernel_func(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict,
                variant: KernelVariant, gemms: list | None = None):
    """The unscheduled PrimFunc of registry op ``op`` (see :data:`lstm_tvm.registry.KERNEL_OPS`)
    in the form ``variant`` (a :class:`KernelVariant`); ``gemms``, a list, receives a
    :class:`~._builder.GemmBlock` per GEMM block."""
    return BUILDERS[op](get_op(op), dtype, input_size, cell_size, attrs, variant, gemms)


def pack_func(op: str, dtype: str, input_size: int, cell_size: int, variant: KernelVariant):
    """The PrimFunc ``(w, *panels)`` (named :func:`pack_func_name`) that fills the weight
    panels ``op``'s prepacked kernel takes; None for an op that reads ``w`` in place."""
    packs = WEIGHT_PACKS.get(op)
    return packs and pack_kernel(get_op(op), dtype, input_size, cell_size,
                                 packs(input_size, cell_size), variant)


@functools.lru_cache(maxsize=256)
def unread_inputs(op: str, dtype: str, input_size: int, cell_size: int,
                  attrs: tuple) -> frozenset:
    """The inputs that ``op``'s CPU kernel for this configuration (``attrs`` as sorted
    ``(name, value)`` pairs) never reads: TF's op takes them for their shapes alone (the gates
    of ``LSTMBlockCellGrad`` need no ``x`` or ``w``), or an attribute leaves them out (the
    peepholes without ``use_peephole``). A caller may pass any tensor of the right shape and
    dtype for them."""
    func = kernel_func(op, dtype, input_size, cell_size, dict(attrs), KernelVariant(cpu=True))
    # Inputs are only read. TVM 0.27's parameters are the buffers themselves; a view of one
    # (``flat``) declared on its data counts as an access of the parameter too.
    accessed = list(detect_buffer_access_lca(func))
    inputs = {spec.name for spec in get_op(op).inputs if spec.shape}  # not scalar inputs
    return frozenset(param.name for param in func.params if param.name in inputs
                     and not any(buffer.same_as(param) for buffer in accessed))


__all__ = ["BUILDERS", "KernelVariant", "WEIGHT_PACKS", "kernel_func", "pack_func",
           "pack_func_name", "unread_inputs"]
