"""Drop-in counterparts of ``tf.raw_ops.<Op>`` for the six LSTM block ops.

``lstm_tvm.raw_ops.BlockLSTMGradV2(seq_len_max=..., x=..., ..., use_peephole=False)`` takes
the same keyword arguments as TensorFlow's, as NumPy arrays or objects with ``__dlpack__``,
and returns a named tuple of NumPy arrays with TF's output names, order, shapes and dtype.
Kernels compile on first use and are cached by (op, dtype, sizes, attributes, target).
Padded steps (``t >= seq_len_max``) are zero in every output. ``target=`` (default ``"llvm"``)
and ``device=`` choose where the op runs, e.g. ``target="cuda"``: inputs are copied to the
device (from NumPy, or through DLPack from any device) and outputs back to NumPy.

On the CPU a call costs little more than the kernel: the op compiled for a configuration (op,
attributes, target, device and the inputs' shapes and dtypes) and the checks of its inputs are
remembered after the first call, so a later call checks only ``seq_len_max``, and a call
like the last one of its op (the same argument names, NumPy arrays of the same shapes and
dtypes, equal attributes, as in a loop over time steps) is recognised without building the
configuration's key; inputs the kernels can read in place (C-contiguous, writeable, aligned,
native byte order) are not copied, and outputs are written where they are returned (see
:mod:`lstm_tvm._host_arrays`).
The tuning records of a configuration are those found at its first call in the process (or
after :func:`lstm_tvm.build.clear_memory_cache`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping

import numpy as np

from . import build as _build
from ._args import kernel_error
from ._host_arrays import OutputLayout, borrow_staging, give_back_staging
from ._launch import launch
from ._tvm import device_exists, tvm
from .targets import missing_device_error
from .api import CompiledOp
from .api import compile as _compile
from .api import output_tuple
from .kernels import unread_inputs
from .registry import CELL_GRAD_MATMUL, KERNEL_OPS, OPS, OpSpec
from .validation import (check_seq_len_max, expected_output_shapes,
                         validate_attrs, validate_inputs)

__all__ = list(OPS) + ["run", "runner", "cell_grad_matmul"]


def _to_numpy(value, where: str = "input"):
    """``value`` as a NumPy array; a conversion that fails is a ``TypeError`` naming ``where``
    (``"<Op>: input 'x'"``), not NumPy's or DLPack's own error (a ragged list, a tensor of a
    dtype NumPy lacks such as bfloat16, a failing ``__dlpack__``)."""
    if isinstance(value, np.ndarray):
        return value
    try:
        if hasattr(value, "__dlpack__") and not isinstance(value, (int, float, bool)):
            if _dlpack_device_type(value) not in (None, 1):  # e.g. a CUDA tensor: via TVM
                return tvm.runtime.from_dlpack(value).numpy()
            return np.from_dlpack(value)
        if hasattr(value, "numpy") and callable(value.numpy):  # e.g. TVM or eager TF tensors
            return np.asarray(value.numpy())
        return np.asarray(value)
    except MemoryError:
        raise
    except Exception as err:
        raise TypeError(f"{where} could not be converted to a NumPy array "
                        f"({type(err).__name__}: {err}); expected a float16 or float32 array"
                        ) from err


def _dlpack_device_type(value):
    try:
        return int(value.__dlpack_device__()[0])
    except Exception:  # noqa: BLE001 - no usable __dlpack_device__: NumPy decides
        return None


def _native(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy (or ``array`` itself) in native byte order: TVM tensors have no
    byte order, so a big-endian ``>f4`` array, valid float32 to the checks, is swapped here."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))


def run(op_name: str, inputs: Mapping, attrs: Mapping | None = None, *, target="llvm",
        device=None, threads: int | None = None):
    """Run ``op_name`` (a TF op or a helper of :data:`lstm_tvm.registry.KERNEL_OPS`) on
    NumPy-convertible ``inputs`` with ``attrs`` on ``target`` (and ``device``, default: device
    0 of the target's kind); see the module doc. ``threads``: at most this many CPU threads
    for the kernel (default: one per usable core, as TVM's pool)."""
    if threads is not None and (type(threads) is not int or threads < 1):
        raise ValueError(f"{op_name}: threads expected an int >= 1 or None, got {threads!r}")
    return _execute(*_planned(op_name, inputs, attrs, target, device), threads=threads)


def _planned(op_name: str, inputs: Mapping, attrs, target, device):
    """``(op, plan, tensors, seq_len_max)`` for a call of :func:`run`: the plan of its
    configuration (made, and checked fully, at its first call) and the arguments of
    :func:`_execute` (the tensor inputs as NumPy arrays in kernel order)."""
    if op_name not in KERNEL_OPS:
        raise ValueError(f"unknown op {op_name!r}; expected one of {list(KERNEL_OPS)}")
    op = KERNEL_OPS[op_name]
    if not isinstance(inputs, Mapping):
        raise TypeError(f"{op.name}: expected inputs as a mapping, got {type(inputs).__name__}")
    arrays = {}
    for name, value in inputs.items():
        arrays[name] = value if type(value) is np.ndarray or (
            name == "seq_len_max" and _is_int_scalar(value)) else \
            _to_numpy(value, f"{op.name}: input {name!r}")
    key = _plan_key(op, arrays, attrs, target, device)
    plan = _plans.get(key) if key is not None else None
    if plan is None or plan.generation != _build.generation():
        plan = _plan(op, arrays, attrs, target, device)
        if key is not None:
            if len(_plans) >= 256:
                _plans.clear()
            _plans[key] = plan
    return op, plan, [arrays[n] for n in plan.tensors], arrays.get("seq_len_max")


def _execute(op: OpSpec, plan: "_Plan", tensors: list, seq_len_max, threads=None):
    """Run ``plan`` on ``tensors`` (its tensor inputs in kernel order, checked by the plan's
    first call or matched to it by :class:`_Repeat`) and ``seq_len_max`` (checked here), on
    at most ``threads`` CPU threads (see :func:`run`)."""
    result = output_tuple(op.name)
    seq_len = (check_seq_len_max(op, seq_len_max, plan.T),) if plan.T is not None else ()
    if plan.compiled is None:  # an empty input: every output is empty or zero
        return result(*(np.zeros(s, plan.layout.dtype) for s in plan.layout.shapes))
    if not plan.on_cpu:
        dev = plan.compiled.device
        outs = plan.compiled(*seq_len, *(tvm.runtime.tensor(_native(a), dev) for a in tensors))
        return result(*(t.numpy() for t in outs))
    staging = borrow_staging(tensors, plan, plan.unread)
    outputs = plan.layout.borrow(plan)
    try:
        launch(plan.compiled.func, *seq_len, *staging.tensors_of(tensors), *outputs.tensors,
               threads=threads)
        return result(*outputs.arrays)  # held before the buffer is given back
    except ValueError as err:  # the kernel's own argument checks
        raise kernel_error(op.name, err, plan.compiled._roles) from err
    finally:
        give_back_staging(plan, staging)
        plan.layout.give_back(plan, outputs)


@dataclasses.dataclass(eq=False)  # hashed by identity: the slot of its buffers
class _Plan:
    """What the first call of a configuration settled: the compiled op (None when an input is
    empty), ``T`` to check ``seq_len_max`` against (None for cell ops), the tensor inputs in
    kernel order, the outputs' layout, whether it runs on the CPU, the compile cache's
    generation it was made in, and the positions in ``tensors`` of inputs the kernel never
    reads (see :func:`lstm_tvm.kernels.unread_inputs`; CPU only)."""

    compiled: CompiledOp | None
    T: int | None
    tensors: tuple
    layout: OutputLayout
    on_cpu: bool
    generation: int
    unread: frozenset = frozenset()
    _without: dict = dataclasses.field(default_factory=dict, repr=False)

    def without(self, outputs: tuple) -> "_Plan":
        """This configuration's plan with a kernel that leaves ``outputs`` (sorted names)
        unwritten (:meth:`lstm_tvm.build.BuildSpec.without`), made at its first use: for a
        caller that never reads them. Its output buffers are its own."""
        plan = self._without.get(outputs)
        if plan is None:
            plan = dataclasses.replace(self, compiled=self.compiled._without(outputs),
                                       _without={})
            self._without[outputs] = plan
        return plan


#: Plans by :func:`_plan_key`.
_plans: dict[tuple, _Plan] = {}


def _plan_key(op: OpSpec, arrays: dict, attrs, target, device):
    """The configuration of a call as a hashable key (None when some part is not hashable:
    such calls are planned every time)."""
    try:
        # a dtype compares its byte order too: ``>f4 != <f4``
        shapes = tuple((n, a.shape, a.dtype) for n, a in arrays.items() if n != "seq_len_max")
        where = (target if isinstance(target, str) or target is None else
                 json.dumps(target, sort_keys=True) if isinstance(target, dict) else str(target),
                 None if device is None else (device.dlpack_device_type(), device.index))
        # with each value's type: 1.0 == True, but only one is a valid use_peephole
        attr_key = tuple(sorted((k, type(v), v) for k, v in (attrs or {}).items()))
        key = (op.name, shapes, attr_key, where, "seq_len_max" in arrays)
        hash(key)
    except (TypeError, ValueError, AttributeError):
        return None
    return key


def _plan(op: OpSpec, arrays: dict, attrs, target, device) -> _Plan:
    """Check a call fully and compile its op (see :class:`_Plan`)."""
    sig = validate_inputs(op, arrays)
    full = validate_attrs(op, attrs or {})
    shapes = expected_output_shapes(op, sig.sizes)
    layout = OutputLayout(shapes.values(), sig.dtype)
    tensors = tuple(n for n in op.input_names if n != "seq_len_max")
    T = sig.sizes["T"] if op.kind == "sequence" else None
    generation = _build.generation()
    if any(0 in s for s in _input_shapes(op, arrays)):
        return _Plan(None, T, tensors, layout, True, generation)
    compiled = _compile(op.name, target=target, dtype=sig.dtype, input_size=sig.sizes["I"],
                        cell_size=sig.sizes["H"], device=device, **full)
    if not device_exists(compiled.device):
        raise missing_device_error(op.name, compiled.device, compiled.target)
    on_cpu = compiled.device.dlpack_device_type() == 1
    unread = frozenset()
    if on_cpu:
        skipped = unread_inputs(op.name, sig.dtype, sig.sizes["I"], sig.sizes["H"],
                                tuple(sorted(full.items())))
        unread = frozenset(i for i, name in enumerate(tensors) if name in skipped)
    return _Plan(compiled, T, tensors, layout, on_cpu, generation, unread)


class _Repeat:
    """The keyword arguments of a call of a ``raw_ops`` function that ran ``plan``, for
    recognising a call of the same configuration without planning it again: the same
    argument names, NumPy arrays of the same shapes and dtypes (the very dtype objects), equal
    attributes, target and device of the same types. Only calls whose arguments are all such
    values are remembered (:meth:`of`)."""

    __slots__ = ("plan", "tensors", "others", "count")

    _VALUES = (bool, int, float, str, type(None))

    def __init__(self, plan: _Plan, tensors: tuple, others: tuple, count: int):
        self.plan, self.tensors, self.others, self.count = plan, tensors, others, count

    @classmethod
    def of(cls, plan: _Plan, kwargs: dict) -> "_Repeat | None":
        """The record of a call that ran ``plan`` with ``kwargs`` (None where a repeat could
        not be recognised by the checks of :meth:`tensors_of`)."""
        if plan.compiled is None or not plan.on_cpu:
            return None
        tensors = []
        for name in plan.tensors:
            value = kwargs[name]
            if type(value) is not np.ndarray:
                return None
            tensors.append((name, value.shape, value.dtype))
        others = []
        for name, value in kwargs.items():
            if name in plan.tensors or name in ("name", "seq_len_max"):
                continue
            if type(value) not in cls._VALUES:
                return None
            others.append((name, type(value), value))
        return cls(plan, tuple(tensors), tuple(others), len(kwargs) - ("name" in kwargs))

    def tensors_of(self, kwargs: dict) -> list | None:
        """The tensor inputs of ``kwargs`` in kernel order where it would be planned as
        :attr:`plan` (still current), else None."""
        if (len(kwargs) - ("name" in kwargs) != self.count
                or self.plan.generation != _build.generation()):
            return None
        tensors = []
        for name, shape, dtype in self.tensors:
            value = kwargs.get(name)
            if type(value) is not np.ndarray or value.shape != shape or value.dtype is not dtype:
                return None
            tensors.append(value)
        for name, kind, expected in self.others:
            value = kwargs.get(name, _Repeat)
            if type(value) is not kind or value != expected:
                return None
        if self.plan.T is not None:
            steps = kwargs.get("seq_len_max", _Repeat)
            if not (type(steps) is np.ndarray or _is_int_scalar(steps)):
                return None
        return tensors


def _is_int_scalar(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _input_shapes(op: OpSpec, arrays):
    return [tuple(arrays[n].shape) for n in op.input_names if n != "seq_len_max"]


def _make(op: OpSpec):
    input_names, attr_names = frozenset(op.input_names), frozenset(op.attr_names)
    known = input_names | attr_names

    last: list[_Repeat | None] = [None]

    def fn(**kwargs):
        repeat = last[0]
        tensors = repeat.tensors_of(kwargs) if repeat is not None else None
        if tensors is not None:
            return _execute(op, repeat.plan, tensors, kwargs.get("seq_len_max"))
        call = dict(kwargs)
        kwargs.pop("name", None)
        where = {k: kwargs.pop(k) for k in ("target", "device") if k in kwargs}
        if not kwargs.keys() <= known:
            raise TypeError(f"{op.name}: unexpected argument(s) {sorted(kwargs.keys() - known)}; "
                            f"expected inputs {list(op.input_names)} and attributes "
                            f"{list(op.attr_names)}")
        inputs = {k: v for k, v in kwargs.items() if k in input_names}
        attrs = {k: v for k, v in kwargs.items() if k in attr_names}
        planned = _planned(op.name, inputs, attrs, where.get("target", "llvm"),
                           where.get("device"))
        last[0] = _Repeat.of(planned[1], call)
        return _execute(*planned)

    # ``target=`` and ``device=`` are accepted too, but kept out of the signature: it mirrors
    # ``tf.raw_ops.<Op>`` exactly.
    fn.__signature__ = op.signature(extra=(
        inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None),))
    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = (f"{op.doc}\n\n{op.summary()}"
                  f"Where it runs: target='llvm' (or 'cuda', a target JSON dict), device=None "
                  f"(device 0 of the target's kind).\n")
    return fn


for _op in OPS.values():
    globals()[_op.name] = _make(_op)


def runner(op_name: str):
    """``op_name`` (a TF op or a helper of :data:`lstm_tvm.registry.KERNEL_OPS`) as a function
    ``(inputs, attrs=None, *, target="llvm")`` that runs it as :func:`run` does: a TF op through
    its ``raw_ops`` function, which recognises a call like its last one without planning it
    again (what callers converting framework tensors call op after op), a helper through
    :func:`run`."""
    if op_name not in OPS:
        return lambda inputs, attrs=None, *, target="llvm": run(op_name, inputs, attrs,
                                                                 target=target)
    fn = globals()[op_name]
    return lambda inputs, attrs=None, *, target="llvm": fn(**inputs, **(attrs or {}),
                                                            target=target)


def cell_grad_matmul(x, h_prev, w, dicfo, *, target="llvm", device=None):
    """The matmul part of a cell's gradient, as TF 1's Python gradient of ``LSTMBlockCell`` (TF 2
    registers none): the registry helper ``CellGradMatmul`` run like the ops.

    ``xh_grad = dicfo @ w^T`` gives ``x_grad`` (`(B, I)`) and ``h_prev_grad`` (`(B, H)`);
    ``w_grad = [x, h_prev]^T @ dicfo`` (`(I+H, 4H)`); ``b_grad = sum_b dicfo`` (`(4H,)`).
    Returns a named tuple ``(x_grad, h_prev_grad, w_grad, b_grad)`` of NumPy arrays.
    ``target`` and ``device`` choose where it runs, as for the ops.
    """
    return run(CELL_GRAD_MATMUL, {"x": x, "h_prev": h_prev, "w": w, "dicfo": dicfo},
               target=target, device=device)
