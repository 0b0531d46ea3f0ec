"""The CPU kernels of :mod:`lstm_tvm.torch`: tensors handed to the compiled kernels by DLPack.

The first call of a configuration (the inputs' shapes and dtypes, the attributes) goes through
:mod:`lstm_tvm.raw_ops` on NumPy views of the tensors: every check, the compile, and the plan
it settles. Later calls of that configuration pass the tensors themselves to the plan's kernel
(TVM's FFI reads a tensor's memory through PyTorch's DLPack exchange, with no Python-level
conversion) and take its outputs in ``raw_ops``' reused buffers, with nothing checked again but
``seq_len_max``'s value: what a training loop calls op after op (see the training entries of
``docs/performance.md``). The kernels read C-contiguous inputs: a strided one is made
contiguous by PyTorch first, except one value broadcast (the gradient of a ``sum`` or
``mean``), which reaches the kernel as a shared tensor of that value
(:mod:`lstm_tvm.torch._constants`): no copy a step.

PyTorch's idle OpenMP workers sleep while a kernel runs (:mod:`lstm_tvm.torch._openmp`).
"""

from __future__ import annotations

import functools

import torch

from .. import build as _build
from .. import raw_ops
from .._args import kernel_error
from .._launch import launch
from ..registry import OpSpec, get_op
from ..validation import check_seq_len_max
from ._constants import constant, single_value
from ._openmp import call_with_workers_asleep

__all__ = ["CpuKernel", "dtype_text", "kernel"]

#: Configurations a kernel keeps plans for (all are dropped past it).
_PLANS_KEPT = 64


class CpuKernel:
    """``op`` on CPU tensors: ``kernel(*inputs, **attrs)``, the inputs in TF's order (tensors,
    ``seq_len_max`` an int or an int64 tensor), returns the outputs as tensors over
    ``raw_ops``' buffers (see the module doc)."""

    def __init__(self, op: OpSpec):
        self.op = op
        self.__name__ = f"{op.name}_cpu"
        self._seq = op.input_names.index("seq_len_max") if "seq_len_max" in op.input_names \
            else None
        self._floats = tuple(i for i, t in enumerate(op.inputs) if t.dtype == "T")
        self._plans: dict = {}

    def __call__(self, *args, **attrs):
        return tuple(map(torch.from_numpy, self._arrays(args, attrs)))

    def call_without(self, outputs: tuple, args, attrs: dict) -> tuple:
        """``self(*args, **attrs)`` whose kernel leaves ``outputs`` (sorted names, see
        :meth:`lstm_tvm.build.BuildSpec.without`) unwritten once the configuration is planned
        (its first call computes them all): those outputs' tensors hold whatever their buffers
        held, for a caller that never reads them."""
        return tuple(map(torch.from_numpy, self._arrays(args, attrs, outputs)))

    def _arrays(self, args, attrs, without: tuple = ()) -> list:
        """The outputs of a call as NumPy arrays over ``raw_ops``' buffers (a planned call's
        kernel leaving out ``without``, see :meth:`call_without`)."""
        key = self._key(args, attrs)
        plan = self._current(key)
        if plan is None:
            return self._planned_call(key, args, attrs)
        tensors = [contiguous(args[i]) for i in self._floats]  # TVM's FFI takes tensors
        seq = self.seq_arg(plan, args)
        return self.run(plan.without(without) if without else plan, seq, tensors)[0]

    def _key(self, args, attrs):
        """The configuration of a call: its float inputs' shapes, dtypes, devices and layouts,
        and its attributes (None where an input is not a tensor: ``raw_ops`` says which)."""
        try:
            return (tuple((args[i].shape, args[i].dtype, args[i].is_cpu, args[i].layout)
                          for i in self._floats),
                    tuple(sorted((k, type(v), v) for k, v in attrs.items())))
        except AttributeError:
            return None

    def plan(self, args, attrs):
        """The kept plan of this configuration (current with the compile cache), or None:
        then ``self(*args, **attrs)`` makes it."""
        return self._current(self._key(args, attrs))

    def _current(self, key):
        """The plan kept for ``key`` if the compile cache has not moved on since, else None."""
        plan = self._plans.get(key)
        return plan if plan is not None and plan.generation == _build.generation() else None

    def seq_arg(self, plan, args) -> tuple:
        """``(seq_len_max,)`` of ``args`` checked against ``plan`` (``()`` for a cell op)."""
        if self._seq is None:
            return ()
        value = host_value(self.op, "seq_len_max", args[self._seq])
        return (check_seq_len_max(self.op, value, plan.T),)

    def run(self, plan, seq: tuple, tensors: list) -> tuple[list, list]:
        """Run ``plan``'s kernel on ``seq`` (:meth:`seq_arg`) and ``tensors`` (the float inputs
        in the op's order, C-contiguous: tensors of PyTorch or TVM); returns the outputs as
        NumPy arrays and as TVM tensors over the same buffer. Only the arrays (or tensors made
        from them) keep the buffer from being written again: hold them while using the TVM
        tensors."""
        outputs = plan.layout.borrow(plan)
        try:
            call_with_workers_asleep(launch, plan.compiled.func, *seq, *tensors,
                                     *outputs.tensors)
            return list(outputs.arrays), list(outputs.tensors)  # held before it is given back
        except ValueError as err:  # the kernel's own argument checks
            raise kernel_error(self.op.name, err, plan.compiled._roles) from err
        finally:
            plan.layout.give_back(plan, outputs)

    def _planned_call(self, key, args, attrs) -> list:
        """A call checked and planned by ``raw_ops`` (its plan kept for ``key`` where it runs
        a kernel on the CPU)."""
        inputs = {n: host_value(self.op, n, v) for n, v in zip(self.op.input_names, args)}
        op, plan, tensors, seq_len_max = raw_ops._planned(self.op.name, inputs, attrs, "llvm",
                                                          None)
        if key is not None and plan.compiled is not None and plan.on_cpu:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return list(call_with_workers_asleep(raw_ops._execute, op, plan, tensors, seq_len_max))


@functools.lru_cache(maxsize=None)
def kernel(op_name: str) -> CpuKernel:
    """The CPU kernel of ``op_name``: one per process, whichever route calls it."""
    return CpuKernel(get_op(op_name))


def contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as the kernels read it, C-contiguous: itself, a shared tensor of its value
    where it is one value broadcast (:func:`~lstm_tvm.torch._constants.single_value`), else a
    copy."""
    if tensor.is_contiguous():
        return tensor
    value = single_value(tensor)
    if value is None:
        return tensor.contiguous()
    return constant(tuple(tensor.shape), tensor.dtype, value)


def host_value(op: OpSpec, name: str, value):
    """Input ``name`` as :mod:`lstm_tvm.raw_ops` takes it: a NumPy view of a CPU tensor (a
    tensor that is not on the CPU only as ``seq_len_max``, copied)."""
    if not isinstance(value, torch.Tensor):
        return value  # seq_len_max of the int overload
    if value.layout != torch.strided:
        raise TypeError(f"{op.name}: input {name!r} expected a dense tensor (layout "
                        f"torch.strided), got layout {value.layout}")
    if not value.is_cpu:
        if op.input(name).dtype == "T":
            raise ValueError(f"{op.name}: input {name!r} expected a tensor on the CPU like "
                             f"the other inputs, got one on {value.device}")
        value = value.cpu()
    try:
        return value.detach().numpy()
    except TypeError:  # a dtype NumPy lacks (bfloat16, ...)
        raise TypeError(f"{op.name}: input {name!r} has dtype {dtype_text(value.dtype)}; "
                        f"expected float16 or float32") from None


def dtype_text(dtype: torch.dtype) -> str:
    """``torch.float32`` as ``"float32"``."""
    return str(dtype).removeprefix("torch.")
