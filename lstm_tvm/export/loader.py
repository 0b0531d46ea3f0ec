"""``load``: open an export folder with ``tvm.runtime.load_module`` (no compilation).

Only the manifest is consulted: the loader does not derive anything from the registry, so it
checks a call exactly as a C++ caller must (names, dtypes, ranks, static dims, one value per
dynamic dim, ``range`` of scalar params).
"""

from __future__ import annotations

import collections
import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._args import bind_inputs
from .._tvm import configure_threads, tvm
from .manifest import FORMAT, FORMAT_VERSION, MANIFEST

__all__ = ["ExportedLibrary", "ExportedOp", "load"]


class ExportedOp:
    """One exported function; call it with the op's inputs (TF's names, or positionally).

    Tensor inputs are NumPy arrays (copied to the device) or TVM tensors; ``seq_len_max`` is
    an integer. Returns a named tuple of TVM tensors in TF's output order (``.numpy()`` for
    arrays); ``out=`` (a sequence of TVM tensors) reuses outputs. A bad input raises
    ``TypeError`` (names, dtypes) or ``ValueError`` (shapes, ranges) starting with the op name.

    Attributes
    ----------
    name : str
    entry : dict
        The op's manifest entry (``function``, ``attrs``, ``params``, ...).
    func : tvm_ffi.Function
        The raw function (destination passing: inputs then outputs).
    """

    def __init__(self, name: str, entry: dict, func, device):
        self.name, self.entry, self.func, self.device = name, entry, func, device
        self.inputs = [p for p in entry["params"] if p["role"] == "input"]
        self.outputs = [p for p in entry["params"] if p["role"] == "output"]
        self.result_type = collections.namedtuple(name, [p["name"] for p in self.outputs])

    def __repr__(self) -> str:
        return f"ExportedOp({self.name}, function={self.entry['function']}, " \
               f"attrs={self.entry['attrs']})"

    def __call__(self, *args, out=None, **kwargs):
        values = self._bind(args, kwargs)
        dims: dict[str, int] = {}
        call_args = {p["name"]: self._check(p, values[p["name"]], dims) for p in self.inputs}
        for p in self.inputs:
            if "range" in p:  # seq_len_max: [0, "T"]
                lo, hi = (dims[v] if isinstance(v, str) else v for v in p["range"])
                if not lo <= call_args[p["name"]] <= hi:
                    raise ValueError(f"{self.name}: input {p['name']!r} expected {lo} <= "
                                     f"{p['name']} <= {hi}, got {call_args[p['name']]}")
        outputs = self._outputs(dims, out)
        self.func(*call_args.values(), *outputs)
        return self.result_type(*outputs)

    def _bind(self, args, kwargs) -> dict:
        names = [p["name"] for p in self.inputs]
        values = bind_inputs(self.name, names, args, kwargs)
        missing = [n for n in names if n not in values]
        unknown = [n for n in values if n not in names]
        if missing or unknown:
            raise TypeError(f"{self.name}: missing inputs {missing}, unexpected inputs "
                            f"{unknown}; expected {names}")
        return values

    def _check(self, p: dict, value, dims: dict):
        """Check one input against its manifest entry; returns what the function gets."""
        where = f"{self.name}: input {p['name']!r}"
        if p["kind"] == "scalar":
            arr = np.asarray(value)
            if arr.ndim != 0 or arr.dtype.kind not in "iu":
                raise TypeError(f"{where} expected an integer scalar, got {value!r}")
            return int(arr)
        if not isinstance(value, tvm.runtime.Tensor):
            value = tvm.runtime.tensor(np.asarray(value, order="C"), self.device)
        shape, dtype = tuple(int(d) for d in value.shape), str(value.dtype)
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
        if not value.is_contiguous():
            raise ValueError(f"{where} expected a contiguous tensor")
        return value

    def _outputs(self, dims: dict, out):
        shapes = [tuple(dims[d] if isinstance(d, str) else d for d in p["shape"])
                  for p in self.outputs]
        if out is None:
            return [tvm.runtime.empty(s, p["dtype"], self.device)
                    for s, p in zip(shapes, self.outputs)]
        out = list(out)
        if len(out) != len(shapes):
            raise TypeError(f"{self.name}: out= needs {len(shapes)} tensors, got {len(out)}")
        for p, s, t in zip(self.outputs, shapes, out):
            if tuple(t.shape) != s or str(t.dtype) != p["dtype"]:
                raise ValueError(f"{self.name}: output {p['name']!r} expected "
                                 f"{p['dtype']}{list(s)}, got {t.dtype}{list(t.shape)}")
        return out


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
        self._ops = {name: ExportedOp(name, e, self.module[e["function"]], self.device)
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
