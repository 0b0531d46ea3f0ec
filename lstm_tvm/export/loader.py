"""``load``: open an export folder with ``tvm.runtime.load_module`` (no compilation).

Only the manifest is consulted: the loader does not derive anything from the registry, so it
checks a call exactly as a C++ caller must (names, dtypes, ranks, static dims, one value per
dynamic dim, ``range`` of scalar params, fewer than ``2**31`` elements in every parameter and in
the kernels' ``T*B``-row scratch tensors, ``out=`` tensors that overlap no other output and no
input) before anything is copied or run.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import json
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._args import AliasGuard, LastCall, bind_inputs, kernel_error, out_list, same_objects
from .._host_arrays import staged_inputs
from .._launch import launcher_for
from .._tvm import configure_threads, tvm
from ..validation import MAX_ELEMENTS
from .manifest import ALIGNMENT, FORMAT, FORMAT_VERSION, MANIFEST

__all__ = ["ExportedLibrary", "ExportedOp", "load"]

#: TVM's packed-API refusal of a tensor's static shape (checked as compact strides first).
_SHAPE_REFUSAL = re.compile(r"Mismatched (\w+)\.(?:shape|strides)")


class ExportedOp:
    """One exported function; call it with the op's inputs (TF's names, or positionally).

    Tensor inputs are NumPy arrays or TVM tensors. A NumPy array is read in place where the
    manifest's ``input_alignment`` allows (a CPU library: C-contiguous, native byte order,
    writeable and aligned to its element, 16 KiB or more), else copied once every input has
    been checked; ``seq_len_max`` is an integer. Returns a named tuple of TVM tensors in TF's
    output order (``.numpy()`` for arrays); ``out=`` (a sequence of TVM tensors that share
    memory with no other output and no input) reuses outputs. A bad input raises
    ``TypeError`` (names, types, dtypes) or ``ValueError`` (shapes, ranges, sizes past
    ``2**31`` elements, overlapping ``out=``) starting with the op name and naming the input.

    Attributes
    ----------
    name : str
    entry : dict
        The op's manifest entry (``function``, ``attrs``, ``params``, ...).
    func : tvm_ffi.Function
        The raw function (destination passing: inputs then outputs).
    """

    def __init__(self, name: str, entry: dict, func, device, sizes: Mapping[str, int],
                 module=None, input_alignment: int = ALIGNMENT):
        self.name, self.entry, self.func, self.device = name, entry, func, device
        self._launch = launcher_for(device)
        self._module = module  # the library, for a prepacked op's functions
        self._bound: dict = {}  # see bind
        self._packs: list = []  # the panels of the prepacked kernel
        self.inputs = [p for p in entry["params"] if p["role"] == "input"]
        self._layout()
        self._checked: dict = {}  # NumPy inputs' shapes and dtypes -> dims (checked)
        self._last = LastCall()
        self._last_out: tuple | None = None  # (dims, out=) of the last out= that passed
        # NumPy inputs go to the kernels in place where the library reads them there
        itemsize = np.dtype(self._tensor_params[0]["dtype"]).itemsize
        self._in_place = device.dlpack_device_type() == 1 and input_alignment <= itemsize
        self.outputs = [p for p in entry["params"] if p["role"] == "output"]
        self.result_type = collections.namedtuple(name, [p["name"] for p in self.outputs])
        self._roles = {p["name"]: p["role"] for p in entry["params"]}
        self._no_alias = AliasGuard(name, np.dtype(self.outputs[0]["dtype"]).itemsize)
        #: Widths of the kernels' stacked scratch tensors (``rows x (I+H)``, ``rows x 4H``).
        self._scratch = {"xh": sizes["I"] + sizes["H"], "gates": 4 * sizes["H"]}

    def __repr__(self) -> str:
        bound = f", bound={sorted(self._bound)}" if self._bound else ""
        return f"ExportedOp({self.name}, function={self.entry['function']}, " \
               f"attrs={self.entry['attrs']}{bound})"

    def bind(self, **constants) -> ExportedOp:
        """This op with inputs held constant over its calls, as
        :meth:`lstm_tvm.CompiledOp.bind`: inputs whose manifest shape has no dynamic dim,
        checked and copied now. Where the manifest lists a ``prepacked`` kernel and ``w`` is
        bound, the returned op calls it on panels its ``pack_function`` makes here, once."""
        allowed = {p["name"]: p for p in self._tensor_params if not p["dynamic"]}
        held: dict = {}
        for name, value in constants.items():
            if name not in allowed:
                raise TypeError(f"{self.name}: bind() takes inputs whose shape has no T or B "
                                f"({list(allowed)}), got {name!r}")
            checked = self._check(allowed[name], value, {})
            if isinstance(checked, tvm.runtime.Tensor):
                checked = checked.numpy()
            held[name] = _to_device(checked, self.device)
        bound = copy.copy(self)
        bound._bound = {**self._bound, **held}
        bound._layout()
        bound._checked, bound._last, bound._last_out = {}, LastCall(), None
        packed = self.entry.get("prepacked")
        if packed and "w" in held:
            bound.func = self._module[packed["function"]]
            bound._packs = [tvm.runtime.empty(p["shape"], p["dtype"], self.device)
                            for p in packed["panels"]]
            self._launch(self._module[packed["pack_function"]], held["w"], *bound._packs)
        return bound

    def __call__(self, *args, out=None, **kwargs):
        values = self._bind(args, kwargs)
        given = [values[n] for n in self._tensor_names]
        found = self._last.get(given, out)
        staged = None  # staging buffers borrowed for this call
        if found is not None:  # the very tensors of the last call: checked
            dims, tensors, outputs = found
            scalars = self._scalars(values, dims)
        else:
            key = _arrays_key(given)
            dims = self._checked.get(key) if key is not None else None
            if dims is None:
                dims = {}
                given = [self._check(p, v, dims) for p, v in zip(self._tensor_params, given)]
                scalars = self._scalars(values, dims)
                self._check_element_counts(dims)
                if key is not None and len(self._checked) < 64:
                    self._checked[key] = dims
            else:
                scalars = self._scalars(values, dims)
            outputs = self._outputs(dims, out)
            if key is not None and self._in_place:
                staged = staged_inputs(given, (id(self), key))
                tensors = staged.tensors
            else:
                tensors = [_to_device(v, self.device) if isinstance(v, np.ndarray) else v
                           for v in given]
            if out is not None:
                self._no_alias(dict(zip(self._tensor_names, tensors)),
                               {p["name"]: t for p, t in zip(self.outputs, outputs)})
                if key is None and all(isinstance(v, tvm.runtime.Tensor) for v in given):
                    self._last.remember(given, outputs, (dims, tensors, outputs))
        call_args = [None] * len(self.inputs)
        for position, value in zip(self._positions, [*scalars, *tensors, *self._held]):
            call_args[position] = value
        with staged if staged is not None else contextlib.nullcontext():
            try:
                self._launch(self.func, *call_args, *self._packs, *outputs)
            except ValueError as err:  # the kernel's own argument checks
                raise self._refused(err) from err
        return self.result_type(*outputs)

    def _refused(self, err: ValueError) -> ValueError:
        """The error for an argument the kernel refused. A shape or stride refused after the
        manifest's checks passed (every tensor this loader passes is compact) means the
        library's function takes other static dims than its manifest says."""
        error = kernel_error(self.name, err, self._roles)
        match = _SHAPE_REFUSAL.search(str(err))
        params = {p["name"]: p for p in self.entry["params"]}
        if match is None or match.group(1) not in params:
            return error
        param = params[match.group(1)]
        return ValueError(
            f"{self.name}: the library's function takes another shape for {param['role']} "
            f"{param['name']!r} than the manifest's {param['shape']} (dims {param['dims']}): "
            f"the manifest does not match its library; export the folder again ({error})")

    def _layout(self) -> None:
        """Sort the inputs a call takes (scalars, tensors) from the bound ones, and note where
        each goes in the function's arguments."""
        free = [p for p in self.inputs if p["name"] not in self._bound]
        self._free_names = [p["name"] for p in free]
        self._scalar_params = [p for p in free if p["kind"] == "scalar"]
        self._tensor_params = [p for p in free if p["kind"] == "tensor"]
        self._tensor_names = [p["name"] for p in self._tensor_params]
        self._held = list(self._bound.values())  # checked and copied by bind
        names = [p["name"] for p in self.inputs]
        self._positions = [names.index(n) for n in [
            *(p["name"] for p in self._scalar_params), *self._tensor_names, *self._bound]]

    def _bind(self, args, kwargs) -> dict:
        """The call's inputs by name (the bound ones not among them)."""
        names = self._free_names
        values = bind_inputs(self.name, names, args, kwargs)
        missing = [n for n in names if n not in values]
        unknown = [n for n in values if n not in names]
        if missing or unknown:
            bound = f" ({sorted(self._bound)} bound)" if self._bound else ""
            raise TypeError(f"{self.name}: missing inputs {missing}, unexpected inputs "
                            f"{unknown}; expected {names}{bound}")
        return values

    def _scalars(self, values: dict, dims: Mapping[str, int]) -> list[int]:
        """The scalar inputs (``seq_len_max``) as ints, checked against their ``range``."""
        scalars = []
        for p in self._scalar_params:
            value = values[p["name"]]
            if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
                value = int(value)
            elif isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
                value = int(value)
            else:
                raise TypeError(f"{self.name}: input {p['name']!r} expected an integer scalar, "
                                f"got {_describe(value)}")
            if "range" in p:  # seq_len_max: [0, "T"]
                lo, hi = (dims[v] if isinstance(v, str) else v for v in p["range"])
                if not lo <= value <= hi:
                    raise ValueError(f"{self.name}: input {p['name']!r} expected {lo} <= "
                                     f"{p['name']} <= {hi}, got {value}")
            scalars.append(value)
        return scalars

    def _check(self, p: dict, value, dims: dict):
        """Check one tensor input against its manifest entry; returns the TVM tensor as given,
        or a NumPy array (as given: not yet copied to the device)."""
        where = f"{self.name}: input {p['name']!r}"
        if isinstance(value, tvm.runtime.Tensor):
            tensor, dtype = value, str(value.dtype)
            if value.device != self.device:
                raise ValueError(f"{where} expected a tensor on {self.device}, got one on "
                                 f"{value.device}")
        else:
            tensor = _as_array(where, value)
            dtype = tensor.dtype.name
        shape = tuple(int(d) for d in tensor.shape)
        if dtype != p["dtype"]:
            raise TypeError(f"{where} expected dtype {p['dtype']}, got {dtype}")
        if len(shape) != len(p["shape"]):
            raise ValueError(f"{where} expected rank {len(p['shape'])} {p['shape']}, "
                             f"got shape {list(shape)}")
        for want, got in zip(p["shape"], shape):
            bound = dims.setdefault(want, got) if isinstance(want, str) else want
            if bound != got:
                known = ", ".join(f"{k}={v}" for k, v in dims.items())
                raise ValueError(f"{where} expected shape {p['shape']} ({known}), "
                                 f"got {list(shape)}")
        if isinstance(tensor, tvm.runtime.Tensor) and not tensor.is_contiguous():
            raise ValueError(f"{where} expected a contiguous tensor")
        return tensor

    def _check_element_counts(self, dims: Mapping[str, int]) -> None:
        """Every parameter and scratch tensor has fewer than ``MAX_ELEMENTS`` elements, as
        ``lstm_tvm.validation`` requires of the same kernels."""
        rows = math.prod(dims.values())  # T*B (sequence ops) or B (cell ops)
        tensors = [(f"{p['role']} {p['name']!r}", [dims.get(d, d) for d in p["shape"]])
                   for p in self.inputs + self.outputs if p["kind"] == "tensor"]
        tensors += [(f"scratch tensor {n!r}", [rows, w]) for n, w in self._scratch.items()]
        for what, shape in tensors:
            if math.prod(shape) >= MAX_ELEMENTS:
                known = ", ".join(f"{k}={v}" for k, v in dims.items())
                raise ValueError(f"{self.name}: {what} would have shape {shape}, "
                                 f"{math.prod(shape)} elements ({known}); expected fewer than "
                                 f"2**31 elements per tensor")

    def _outputs(self, dims: dict, out):
        if out is not None:  # the very tensors that passed last time, for these dims
            last = self._last_out
            if last is not None and last[0] == dims and same_objects(last[1], out):
                return last[1]
        shapes = [tuple(dims[d] if isinstance(d, str) else d for d in p["shape"])
                  for p in self.outputs]
        if out is None:
            return [tvm.runtime.empty(s, p["dtype"], self.device)
                    for s, p in zip(shapes, self.outputs)]
        out = out_list(self.name, out, len(shapes))
        for p, s, t in zip(self.outputs, shapes, out):
            if not isinstance(t, tvm.runtime.Tensor):
                raise TypeError(f"{self.name}: out= entry {p['name']!r} expected a "
                                f"tvm.runtime.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != s or str(t.dtype) != p["dtype"]:
                raise ValueError(f"{self.name}: output {p['name']!r} expected "
                                 f"{p['dtype']}{list(s)}, got {t.dtype}{list(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{self.name}: output {p['name']!r} expected a tensor on "
                                 f"{self.device}, got one on {t.device}")
        self._last_out = (dict(dims), out)  # one assignment: thread-safe
        return out


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _as_array(where: str, value) -> np.ndarray:
    """``value`` as a NumPy array, without copying when it already is one (a view stays a
    view: nothing is copied before every input has been checked)."""
    try:
        if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
            arr = np.from_dlpack(value)
        else:
            arr = np.asarray(value)
    except Exception as err:
        raise TypeError(f"{where} could not be converted to an array "
                        f"({type(err).__name__}: {str(err)[:200]})") from err
    return arr


def _arrays_key(values) -> tuple | None:
    """The shapes and dtypes of ``values`` when every one is a NumPy array (all that their
    checks depend on), else None."""
    if all(type(v) is np.ndarray for v in values):
        return tuple((v.shape, v.dtype) for v in values)
    return None


def _to_device(arr: np.ndarray, device):
    """A checked NumPy input as a compact, native-byte-order TVM tensor on ``device``."""
    return tvm.runtime.tensor(np.ascontiguousarray(arr, arr.dtype.newbyteorder("=")), device)


class ExportedLibrary(Mapping):
    """An export folder opened with ``tvm.runtime.load_module``: op name -> :class:`ExportedOp`.

    Attributes
    ----------
    path : Path
    manifest : dict
    module : tvm.runtime.Module
        The loaded library (``module[function_name]`` for the raw functions).
    device : tvm.runtime.Device
    """

    def __init__(self, path, device=None):
        self.path = Path(path)
        self.manifest = m = json.loads((self.path / MANIFEST).read_text())
        if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"load: {self.path / MANIFEST} expected format {FORMAT} version "
                             f"{FORMAT_VERSION}, got {m.get('format')} {m.get('format_version')}")
        lib = self.path / m["library"]
        if hashlib.sha256(lib.read_bytes()).hexdigest() != m["library_sha256"]:
            raise ValueError(f"load: {lib} does not match the manifest's checksum")
        if m["tvm_version"].split(".")[:2] != tvm.__version__.split(".")[:2]:
            warnings.warn(f"load: {lib} was exported with TVM {m['tvm_version']}, this is TVM "
                          f"{tvm.__version__}", stacklevel=3)
        kind = m["target"]["kind"]
        self.device = device or tvm.device("cpu" if kind in ("llvm", "c") else kind, 0)
        if self.device.dlpack_device_type() == 1:  # CPU: size TVM's thread pool first
            configure_threads()
        self.module = tvm.runtime.load_module(str(lib))
        self._ops = {name: ExportedOp(name, e, self.module[e["function"]], self.device,
                                      m["sizes"], self.module,
                                      m.get("input_alignment", ALIGNMENT))
                     for name, e in m["ops"].items()}

    def __getitem__(self, name: str) -> ExportedOp:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"load: op {name!r} was not exported; this library has "
                           f"{list(self._ops)}") from None

    def __iter__(self):
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)


def load(path, device=None) -> ExportedLibrary:
    """Open the export folder ``path``; ``load(path)["BlockLSTM"](...)`` runs an op.

    Parameters
    ----------
    path : str or Path
        A folder written by :func:`~.writer.export` (``lstm-tvm export``).
    device : tvm.runtime.Device, optional
        Default: ``tvm.cpu(0)`` for an ``llvm`` target, device 0 of the target's kind otherwise.

    Raises
    ------
    ValueError
        An unknown manifest format, or a library whose checksum differs from the manifest's.
    """
    return ExportedLibrary(path, device)
