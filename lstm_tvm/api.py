"""``lstm_tvm.compile``: a compiled op as a callable on TVM tensors (no copies)."""

from __future__ import annotations

import collections
import functools
import numbers

import numpy as np
import tvm_ffi

from . import build as _build
from ._args import AliasGuard, LastCall, bind_inputs, kernel_error, out_list
from ._host_arrays import OutputLayout
from ._launch import launcher_for
from ._tvm import configure_threads, device_exists, device_for, tvm
from .targets import missing_device_error
from .cross_compile import is_cross
from .kernels import WEIGHT_PACKS
from .registry import DTYPES, KERNEL_OPS, get_op
from .targets import resolve
from .validation import (check_seq_len_max, expected_output_shapes, validate_attrs,
                         validate_inputs)

__all__ = ["compile", "CompiledOp", "output_tuple"]


@functools.cache
def output_tuple(op_name: str):
    """The named-tuple class of an op's outputs (TF's names and order)."""
    return collections.namedtuple(op_name, get_op(op_name).output_names)


class CompiledOp:
    """One op compiled for one dtype, input size, cell size, attribute set and target.

    Call it with the op's inputs as TVM tensors on :attr:`device` (positionally in TF's order,
    or by TF's keyword names); ``T`` and ``B`` may change from call to call. Outputs are
    allocated unless given as ``out=`` (a sequence in TF's output order whose tensors share
    memory with no other output and no input, else ``ValueError``); on a CPU, in memory that
    earlier outputs of the same shapes left once every one of them was dropped. Inputs are
    checked like ``raw_ops`` before the kernel runs. :meth:`bind` holds weights constant over
    many calls.
    """

    def __init__(self, spec: _build.BuildSpec, device=None):
        self.spec = spec
        self.op = get_op(spec.op)
        self.target = spec.resolved.target
        self.device = device if device is not None else device_for(self.target)
        self._launch = launcher_for(self.device)
        if self.device.dlpack_device_type() == 1:  # CPU
            configure_threads()
        if device_exists(self.device) and not is_cross(self.target):
            self.module = _build.get_module(spec)
            self.func = self.module[spec.func_name]
        else:  # CUDA without a GPU, another CPU architecture: build (errors surface now); a
            # call raises
            _build.build(spec)
            self.module = self.func = None
        self._tensors = tuple(n for n in self.op.input_names if n != "seq_len_max")
        self._names = frozenset(self.op.input_names)
        self._no_alias = AliasGuard(self.op.name, np.dtype(spec.dtype).itemsize)
        self._roles = {**dict.fromkeys(self.op.input_names, "input"),
                       **dict.fromkeys(self.op.output_names, "output")}
        self._checked: dict[tuple, tuple[dict, dict]] = {}  # shapes and dtypes -> sizes, outputs
        self._last = LastCall()
        self._bound: dict = {}  # see bind
        self._free = self.op.input_names  # the inputs a call takes
        self._packs: tuple = ()  # the weight panels of a prepacked kernel
        self._layouts: dict[tuple, OutputLayout] = {}  # output shapes -> their host buffers

    @property
    def attrs(self) -> dict:
        return dict(self.spec.attrs)

    def __repr__(self) -> str:
        s = self.spec
        bound = f", bound={sorted(self._bound)}" if self._bound else ""
        return (f"CompiledOp({s.op}, dtype={s.dtype}, input_size={s.input_size}, "
                f"cell_size={s.cell_size}, attrs={self.attrs}, target={self.target.kind.name}"
                f"{bound})")

    def bind(self, **constants) -> CompiledOp:
        """This op with inputs held constant over its calls (ONNX Runtime's initializers,
        Relax's ``BindParams``): typically ``w``, and ``b`` and the peepholes.

        Each value (a TVM tensor or a NumPy array of the op's dtype and shape for this op's
        sizes; any input whose shape has no ``T`` or ``B``) is copied now: later writes to it
        are not seen. For the ops whose product reads ``w`` as float32 panels (the sequence
        ops, which copy it into them at every call, and ``LSTMBlockCell``, which reads it in
        place otherwise) the returned op's CPU kernel takes panels made here, once. Calls of
        the returned op take the other inputs, positionally in TF's order or by name. Without
        the op's device (as a call) ``RuntimeError``.
        """
        if self.func is None:
            raise missing_device_error(self.op.name, self.device, self.target)
        specs = {spec.name: spec for spec in self.op.inputs}
        sizes = {"I": self.spec.input_size, "H": self.spec.cell_size}
        held = {}
        for name, value in constants.items():
            spec = specs.get(name)
            if name not in self._free or not _bindable(spec):
                raise TypeError(f"{self.op.name}: bind() takes inputs whose shape has no T or B "
                                f"({[n for n in self._free if _bindable(specs[n])]}), got "
                                f"{name!r}")
            held[name] = self._constant(name, value, spec.concrete_shape(sizes))
        spec = self.spec.with_prepacked_weights() if "w" in held else self.spec
        bound = CompiledOp(spec, self.device)
        bound._bound = {**self._bound, **held}
        bound._free = tuple(n for n in self.op.input_names if n not in bound._bound)
        bound._packs = self._packs
        if spec is not self.spec:  # w's panels, made here
            layout = WEIGHT_PACKS[self.op.name](self.spec.input_size, self.spec.cell_size)
            bound._packs = tuple(tvm.runtime.empty(p.shape, "float32", self.device)
                                 for p in layout)
            self._launch(bound.module[spec.pack_func_name], held["w"], *bound._packs)
        return bound

    def _without(self, outputs) -> CompiledOp:
        """This op (unbound) with a kernel that leaves ``outputs`` unwritten
        (:meth:`lstm_tvm.build.BuildSpec.without`): a call's buffers for them keep whatever
        they held. For callers that never read them (the framework layers' backward, when
        autograd asks for no gradient of ``x`` or ``w``)."""
        assert not self._bound, "a bound op keeps its kernel"
        return CompiledOp(self.spec.without(outputs), self.device)

    def _constant(self, name: str, value, shape: tuple):
        """A private copy of ``value`` for :meth:`bind`, checked against ``shape``."""
        dtype = self.spec.dtype
        if not isinstance(value, (tvm.runtime.Tensor, np.ndarray)):
            raise TypeError(f"{self.op.name}: bind() input {name!r} expected a "
                            f"tvm.runtime.Tensor or numpy.ndarray, got {type(value).__name__}")
        if tuple(value.shape) != shape or str(value.dtype) != dtype:
            raise ValueError(f"{self.op.name}: bind() input {name!r} expected "
                             f"{dtype}{list(shape)}, got {value.dtype}{list(value.shape)}")
        if isinstance(value, tvm.runtime.Tensor):
            value = value.numpy()
        return tvm.runtime.tensor(np.ascontiguousarray(value), self.device)

    def __call__(self, *args, out=None, **kwargs):
        """Run the op; returns a named tuple of TVM tensors (``out`` when given)."""
        if self.func is None:
            raise missing_device_error(self.op.name, self.device, self.target)
        inputs = bind_inputs(self.op.name, self._free, args, kwargs)
        if self._bound:
            if not self._bound.keys().isdisjoint(inputs):
                raise TypeError(f"{self.op.name}: input(s) "
                                f"{sorted(self._bound.keys() & inputs.keys())} are bound "
                                f"(CompiledOp.bind); this op takes {list(self._free)}")
            inputs.update(self._bound)
        args = [inputs.get(n) for n in self._tensors]
        last = self._last.get(args, out)
        if last is not None:
            sizes, outputs = last
        else:
            sizes, shapes = self._check(inputs)
            outputs = self._outputs(shapes, out)
            if out is not None:  # outputs allocated here share memory with nothing
                self._no_alias(dict(zip(self._tensors, args)), dict(zip(shapes, outputs)))
                self._last.remember(args, outputs, (sizes, outputs))
        if self.op.kind == "sequence":
            args.insert(0, check_seq_len_max(self.op, inputs["seq_len_max"], sizes["T"]))
        if sizes["B"] == 0 or sizes.get("T", 1) == 0:  # nothing to compute: every output is zero
            for tensor in outputs:
                tensor.copyfrom(np.zeros(tuple(tensor.shape), self.spec.dtype))
        else:
            try:
                self._launch(self.func, *args, *self._packs, *outputs)
            except ValueError as err:  # the kernel's own argument checks
                raise kernel_error(self.op.name, err, self._roles) from err
        return output_tuple(self.op.name)(*outputs)

    def capture(self, *args, out=None, **kwargs):
        """Record a call on a CUDA device into a CUDA graph, for replays with one launch
        (:class:`lstm_tvm.cuda_graph.CudaGraph`); takes what a call takes.

        The call runs once first (checking the inputs and readying the kernels and their
        scratch memory), then once under capture on the same tensors. A replay reads the
        captured inputs (copy new values into them) and writes the captured outputs
        (``graph.outputs``); ``T``, ``B`` and ``seq_len_max`` are those of this call.
        """
        from .cuda_graph import CudaGraph

        if self.device.dlpack_device_type() != 2:  # kDLCUDA
            raise RuntimeError(f"{self.op.name}: capture() needs a CUDA device; this op runs "
                               f"on {self.device}")
        outputs = self(*args, out=out, **kwargs)
        if any(0 in tuple(t.shape) for t in outputs):
            raise ValueError(f"{self.op.name}: capture() needs a call with work to do "
                             f"(B and T > 0); got output shapes "
                             f"{[tuple(t.shape) for t in outputs]}")
        self.device.sync()
        keep = (args, dict(kwargs), tuple(outputs))
        return CudaGraph(self.device, lambda: self(*args, out=list(outputs), **kwargs), keep,
                         outputs)

    def _check(self, inputs: dict) -> tuple[dict, dict]:
        """Validate ``inputs`` (fully the first time a set of shapes and dtypes is seen)."""
        try:  # the type is part of the key: only TVM tensors are ever cached
            key = tuple((type(inputs[n]), tuple(inputs[n].shape), str(inputs[n].dtype))
                        for n in self._tensors)
        except (KeyError, AttributeError, TypeError):
            key = None  # the full check below names what is wrong
        if key is not None and inputs.keys() == self._names and key in self._checked:
            return self._checked[key]
        sig = validate_inputs(self.op, inputs)
        for name in self._tensors:
            if not isinstance(inputs[name], tvm.runtime.Tensor):
                raise TypeError(
                    f"{self.op.name}: input {name!r} expected a tvm.runtime.Tensor on "
                    f"{self.device}, got {type(inputs[name]).__name__} (lstm_tvm.raw_ops takes "
                    f"NumPy arrays)")
        if sig.dtype != self.spec.dtype:
            raise TypeError(f"{self.op.name}: input 'x' has dtype {sig.dtype}; this op was "
                            f"compiled for {self.spec.dtype}")
        for name, source in (("I", "x"), ("H", "cs_prev")):
            want = self.spec.input_size if name == "I" else self.spec.cell_size
            if sig.sizes[name] != want:
                raise ValueError(f"{self.op.name}: input {source!r} gives {name}={sig.sizes[name]}; "
                                 f"this op was compiled for {name}={want}")
        result = (sig.sizes, expected_output_shapes(self.op, sig.sizes))
        if key is not None and len(self._checked) < 64:
            self._checked[key] = result
        return result

    def _host_outputs(self, shapes: tuple) -> list:
        """New CPU output tensors in memory an earlier call's outputs left once they were all
        dropped (:class:`lstm_tvm._host_arrays.OutputLayout`): a loop that lets go of each
        call's outputs writes the same memory every time instead of touching fresh pages. The
        tensors are DLPack views of the buffer's arrays, which keep it from being lent again
        while any of them (or anything made of them) is alive."""
        layout = self._layouts.get(shapes)
        if layout is None:
            if len(self._layouts) >= 64:
                self._layouts.clear()
            layout = self._layouts[shapes] = OutputLayout(shapes, self.spec.dtype)
        buffer = layout.borrow(layout)
        try:
            return [tvm_ffi.from_dlpack(a) for a in buffer.arrays]
        finally:
            layout.give_back(layout, buffer)

    def _outputs(self, shapes: dict, out):
        if out is None:
            if self.device.dlpack_device_type() == 1:  # CPU
                return self._host_outputs(tuple(shapes.values()))
            return [tvm.runtime.empty(s, self.spec.dtype, self.device) for s in shapes.values()]
        out = out_list(self.op.name, out, len(shapes))
        for (name, shape), tensor in zip(shapes.items(), out):
            if not isinstance(tensor, tvm.runtime.Tensor):
                raise TypeError(f"{self.op.name}: out= entry {name!r} expected a "
                                f"tvm.runtime.Tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != shape or str(tensor.dtype) != self.spec.dtype:
                raise ValueError(
                    f"{self.op.name}: output {name!r} expected {self.spec.dtype}{list(shape)}, "
                    f"got {tensor.dtype}{list(tensor.shape)}")
        return out


def compile(op_name: str, *, target="llvm", dtype: str = "float32", input_size: int,
            cell_size: int, device=None, **attrs) -> CompiledOp:
    """Compile ``op_name`` (a registry op, see :data:`lstm_tvm.registry.KERNEL_OPS`) and
    return the callable.

    Parameters
    ----------
    op_name : str
        ``LSTMBlockCell``, ``LSTMBlockCellGrad``, ``BlockLSTM``, ``BlockLSTMGrad``,
        ``BlockLSTMV2``, ``BlockLSTMGradV2`` or the helper ``CellGradMatmul``.
    target : str, dict or tvm.target.Target
        ``"llvm"`` (this host's CPU), ``"cuda"`` (the local GPU's architecture, else
        ``sm_80``), a target JSON dict (``{"kind": "cuda", "arch": "sm_90"}``), or a ``Target``.
    dtype : str
        ``"float32"`` or ``"float16"``.
    input_size, cell_size : int
        ``I`` and ``H`` (a Python or NumPy integer >= 1, not ``bool``); time and batch sizes
        stay dynamic.
    device : tvm.runtime.Device, optional
        Where it runs (default: device 0 of the target's kind, e.g. ``tvm.cuda(0)``). Without
        that device the op is still built, and calling it raises ``RuntimeError``.
    **attrs
        The op's attributes (TF's names and defaults, e.g. ``forget_bias``, ``use_peephole``).
    """
    op = _checked_op(op_name)
    if dtype not in DTYPES:
        raise TypeError(f"{op_name}: dtype expected one of {list(DTYPES)}, got {dtype!r}")
    input_size = _size_arg(op_name, "input_size", input_size)
    cell_size = _size_arg(op_name, "cell_size", cell_size)
    full = validate_attrs(op, attrs)
    try:
        resolved = resolve(target)
    except Exception as err:
        raise (TypeError if isinstance(err, TypeError) else ValueError)(
            f"{op_name}: target {target!r} is not a target kind, JSON dict or tvm.target.Target "
            f"({type(err).__name__}: {str(err).splitlines()[0]})") from err
    spec = _build.make_spec(op.name, dtype, input_size, cell_size, full, resolved)
    return CompiledOp(spec, device)


def _size_arg(op_name: str, name: str, value) -> int:
    """``input_size``/``cell_size`` as a Python int: any integer (``int``, NumPy integers; not
    ``bool``) >= 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,
                                                                     np.integer)):
        raise TypeError(f"{op_name}: {name} expected an int >= 1, got "
                        f"{type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{op_name}: {name} expected an int >= 1, got {int(value)}")
    return int(value)


def _checked_op(op_name):
    if op_name not in KERNEL_OPS:
        raise ValueError(f"unknown op {op_name!r}; expected one of {list(KERNEL_OPS)}")
    return KERNEL_OPS[op_name]


def _bindable(spec) -> bool:
    """Whether an input may be bound: a tensor whose shape depends on ``I`` and ``H`` alone."""
    return bool(spec.shape) and not {"T", "B"} & set(spec.shape)
