"""The ``torch.library`` definitions of :mod:`lstm_tvm.torch`: each op's schema, its CPU, CUDA
and fake (meta) kernels, generated from :mod:`lstm_tvm.registry`."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..api import compile as _compile
from ..registry import KERNEL_OPS, OpSpec, eval_dim, get_op
from ..validation import validate_attrs, validate_inputs
from ._cpu import dtype_text, kernel

__all__ = ["NAMESPACE", "INT_OVERLOAD", "define", "overloads", "qualname", "schema"]

#: The ``torch.ops`` namespace of the ops: ``torch.ops.lstm_tvm.BlockLSTM``.
NAMESPACE = "lstm_tvm"
#: The overload of the sequence ops taking ``seq_len_max`` as a Python (or symbolic) int; the
#: default overload takes an int64 tensor.
INT_OVERLOAD = "int"


def overloads(op: OpSpec) -> tuple[str, ...]:
    """The overload names of ``op``: ``"default"``, and :data:`INT_OVERLOAD` for ops with an
    integer input (``seq_len_max``)."""
    return ("default", INT_OVERLOAD) if _int_inputs(op) else ("default",)


def qualname(op_name: str, overload: str = "default") -> str:
    """``"lstm_tvm::BlockLSTM"`` or ``"lstm_tvm::BlockLSTM.int"``."""
    return f"{NAMESPACE}::{op_name}" + ("" if overload == "default" else f".{overload}")


def _int_inputs(op: OpSpec) -> tuple[str, ...]:
    return tuple(t.name for t in op.inputs if t.dtype != "T")


def _default_text(value) -> str:
    return ("True" if value else "False") if isinstance(value, bool) else repr(float(value))


def schema(op_name: str, overload: str = "default") -> str:
    """The operator schema of ``op_name``: TF's inputs in TF's order (positional or keyword),
    its attributes keyword-only with TF's defaults, TF's outputs in TF's order."""
    op = get_op(op_name)
    int_type = "SymInt" if overload == INT_OVERLOAD else "Tensor"
    params = [f"{int_type if t.dtype != 'T' else 'Tensor'} {t.name}" for t in op.inputs]
    if op.attrs:
        params.append("*")
        for a in op.attrs:
            kind = "bool" if a.type is bool else "float"
            default = "" if a.required else f"={_default_text(a.default)}"
            params.append(f"{kind} {a.name}{default}")
    outputs = ", ".join("Tensor" for _ in op.outputs)
    name = op.name + ("" if overload == "default" else f".{overload}")
    return f"{name}({', '.join(params)}) -> ({outputs})"


def define(lib: torch.library.Library) -> None:
    """Define every op of :data:`lstm_tvm.registry.KERNEL_OPS` (each overload) in ``lib`` (a
    ``DEF`` library of :data:`NAMESPACE`) with its CPU, CUDA and fake kernels."""
    for op in KERNEL_OPS.values():
        for overload in overloads(op):
            lib.define(schema(op.name, overload))
            name = qualname(op.name, overload)
            lib.impl(name, kernel(op.name), "CPU")
            lib.impl(name, _cuda_kernel(op), "CUDA")
            torch.library.register_fake(name, _fake_kernel(op), lib=lib)


# --- the CUDA kernels: lstm_tvm.compile on the tensors' device ------------------------------

def _cuda_kernel(op: OpSpec):
    """``op`` on a CUDA device: the tensors go to the op compiled for ``target="cuda"`` and
    their device through DLPack, on PyTorch's current stream; outputs come back the same way."""

    def kernel(*args, **attrs):
        import tvm
        import tvm_ffi

        inputs = dict(zip(op.input_names, args))
        floats = [t.name for t in op.inputs if t.dtype == "T"]
        device = inputs[floats[0]].device
        for name in floats[1:]:
            if inputs[name].device != device:
                raise ValueError(f"{op.name}: input {name!r} expected a tensor on {device} "
                                 f"like input {floats[0]!r}, got one on {inputs[name].device}")
        metas = {n: _Meta.of(op, n, v) for n, v in inputs.items()}
        for name in _int_inputs(op):  # its value: checked, and passed on as an int
            if isinstance(inputs[name], torch.Tensor):
                metas[name] = inputs[name].detach().cpu().numpy()
        sig = validate_inputs(op, metas)
        full = validate_attrs(op, attrs)
        compiled = _cuda_op(op.name, sig.dtype, sig.sizes["I"], sig.sizes["H"],
                            tuple(full.items()), device.index or 0)
        tensors = {n: tvm.runtime.from_dlpack(inputs[n].detach().contiguous()) for n in floats}
        for name in _int_inputs(op):
            tensors[name] = sig.seq_len_max
        with torch.cuda.device(device), tvm_ffi.use_torch_stream():
            outputs = compiled(**tensors)
        return tuple(torch.from_dlpack(t) for t in outputs)

    kernel.__name__ = f"{op.name}_cuda"
    return kernel


@functools.lru_cache(maxsize=64)
def _cuda_op(op_name: str, dtype: str, input_size: int, cell_size: int, attrs: tuple,
             index: int):
    """``op_name`` compiled for ``target="cuda"`` on CUDA device ``index`` (cached)."""
    import tvm

    return _compile(op_name, target="cuda", dtype=dtype, input_size=input_size,
                    cell_size=cell_size, device=tvm.cuda(index), **dict(attrs))


# --- the fake kernels: shapes and checks without data ---------------------------------------

class _Meta:
    """What :func:`lstm_tvm.validation.validate_inputs` reads of a tensor: its shape and
    dtype (a NumPy dtype where NumPy has it, else PyTorch's name)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __repr__(self) -> str:
        return f"tensor(shape={self.shape}, dtype={self.dtype})"

    @classmethod
    def of(cls, op: OpSpec, name: str, value):
        """Input ``name`` for the checks: a tensor's shape and dtype, except an integer input
        (``seq_len_max``) given as a tensor of a NumPy dtype, which becomes a zero NumPy array
        of its shape and dtype (its value is not read), and a symbolic int, which becomes 0."""
        if not isinstance(value, torch.Tensor):
            return 0 if isinstance(value, torch.SymInt) else value
        dtype = _np_dtype(value.dtype)
        if op.input(name).dtype != "T" and isinstance(dtype, np.dtype):
            return np.zeros(tuple(value.shape), dtype)
        return cls(tuple(value.shape), dtype)


def _np_dtype(dtype: torch.dtype):
    try:
        return np.dtype(dtype_text(dtype))
    except TypeError:  # bfloat16, ...: the checks show the name
        return dtype_text(dtype)


def _symbolic(value) -> bool:
    return isinstance(value, torch.Tensor) and not all(type(d) is int for d in value.shape)


def _fake_kernel(op: OpSpec):
    """``op``'s outputs as empty tensors of the right shapes and dtype (for ``torch.compile``,
    ``torch.export`` and meta tensors). The inputs are checked as the kernels check them where
    every shape is static; otherwise ranks and dtypes only (the kernels check the rest)."""
    floats = [t for t in op.inputs if t.dtype == "T"]

    def fake(*args, **attrs):
        inputs = dict(zip(op.input_names, args))
        validate_attrs(op, attrs)
        metas = {n: _Meta.of(op, n, v) for n, v in inputs.items()}
        if any(_symbolic(v) for v in inputs.values()):
            _check_ranks_and_dtypes(op, metas)
        else:
            validate_inputs(op, metas)
        sizes = {s: inputs[n].shape[axis] for s, (n, axis) in op.size_sources.items()}
        like = inputs[floats[0].name]
        return tuple(like.new_empty(tuple(eval_dim(d, sizes) for d in t.shape))
                     for t in op.outputs)

    fake.__name__ = f"{op.name}_fake"
    return fake


def _check_ranks_and_dtypes(op: OpSpec, metas: dict) -> None:
    """Rules 2 and 4 of :mod:`lstm_tvm.validation` (one float dtype, the registry's ranks) on
    inputs with symbolic shapes, with the same messages: a copy of each input whose dims are
    replaced by the registry's shape for sizes 1 passes the rest of the checks."""
    ones = {"T": 1, "B": 1, "I": 1, "H": 1}
    stand_in = {}
    for t in op.inputs:
        meta = metas[t.name]
        if t.dtype == "T" and isinstance(meta, _Meta):
            if len(meta.shape) != len(t.shape):
                raise ValueError(f"{op.name}: input '{t.name}' expected rank {len(t.shape)} "
                                 f"({', '.join(t.shape)}), got shape {meta.shape}")
            meta = _Meta(t.concrete_shape(ones), meta.dtype)
        elif t.dtype != "T" and not isinstance(meta, (np.ndarray, _Meta)):
            meta = 0  # an int checked against T = 1: its range is the kernel's to check
        stand_in[t.name] = meta
    validate_inputs(op, stand_in)
