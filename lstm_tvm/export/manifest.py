"""The manifest of an export folder (``manifest.json``), derived from the registry.

Layout (format :data:`FORMAT_VERSION`)::

    {"format": "lstm_tvm.export", "format_version": 1,
     "library": "lstm_tvm_ops.so", "library_sha256": "...",
     "calling_convention": "...", "alignment": 64, "input_alignment": 4,
     "dtype": "float32", "sizes": {"I": 32, "H": 32}, "dynamic_dims": ["T", "B"],
     "target": {...target JSON...}, "tvm_version": "...", "lstm_tvm_version": "...",
     "kernel_version": "1",
     "ops": {"<Op>": {"function": "lstm_tvm_<Op>_<dtype>", "kind": "sequence",
                      "direction": "backward", "gate_layout": "IFCO",
                      "attrs": {"use_peephole": false},
                      "params": [{"name": "x", "role": "input", "kind": "tensor",
                                  "dtype": "float32", "shape": ["T", "B", 32],
                                  "dims": ["T", "B", "I"], "dynamic": [0, 1]}, ...],
                      "onnx_model": "onnx/<Op>.onnx", "schedule_records": [],
                      "prepacked": {"function": "lstm_tvm_<Op>_<dtype>_prepacked",
                                    "pack_function": "lstm_tvm_<Op>_<dtype>_pack",
                                    "panels": [{"name": "w_t_x", "role": "panel",
                                                "kind": "tensor", "dtype": "float32",
                                                "shape": [4, 128, 32]}, ...]}}}}

``params`` lists the function's parameters in call order: the op's inputs, then its outputs
(TF's names and order). ``shape`` holds ints for static dims and the names ``"T"``/``"B"`` for
dynamic ones (one value per name across a call); ``dims`` is the registry's symbolic shape;
``dynamic`` the indices of the dynamic dims. ``seq_len_max`` (sequence ops) has ``kind``
``"scalar"``, is passed by value as an int64 and carries ``"range": [0, "T"]``, which callers
must check (the kernels do not). ``schedule_records`` lists the tuning records replayed on
the op's GEMM blocks: ``{"block", "task", "trace"}`` with the task it was tuned as and
MetaSchedule's JSON trace (empty: the rule-based schedules throughout).

``alignment`` is the byte alignment of every tensor a caller allocates (outputs, panels);
``input_alignment`` (optional, else ``alignment``) what the kernels need of the inputs' data:
the element's size in a CPU library, which reads inputs wherever they lie.

``prepacked`` (optional: the sequence ops and ``LSTMBlockCell`` of an export with prepacked
kernels) names a second kernel that takes, between the inputs and the outputs, the float32
``panels`` of ``w`` (which the first one copies at every call or reads in place), and the
function ``pack_function(w, *panels)`` that fills them: call it once per set of weights, then
the prepacked kernel as often as those weights stay the same (its ``w`` parameter is not
read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from .. import _host_arrays
from .. import build as _build
from .._tvm import tvm
from ..kernels import WEIGHT_PACKS
from ..registry import OpSpec, TensorSpec, eval_dim, get_op

__all__ = ["ALIGNMENT", "DYNAMIC_DIMS", "FORMAT", "FORMAT_VERSION", "LIBRARY", "MANIFEST",
           "dumps_manifest", "make_manifest", "prepacked_entry", "signature"]

FORMAT = "lstm_tvm.export"
#: Version of the manifest layout; bumped on incompatible changes.
FORMAT_VERSION = 1
LIBRARY = "lstm_tvm_ops.so"
MANIFEST = "manifest.json"
#: Byte alignment the kernels assume for tensor data they write (TVM's ``kAllocAlignment``);
#: unchecked: the LLVM code uses aligned vector stores, so a misaligned buffer crashes.
ALIGNMENT = _host_arrays.ALIGNMENT
#: Size symbols that stay symbolic in the compiled functions.
DYNAMIC_DIMS = ("T", "B")

CALLING_CONVENTION = (
    "destination passing: inputs then outputs in params order; scalar params by value (int64), "
    f"tensors as compact CPU DLTensors with data aligned to {ALIGNMENT} bytes (inputs: to "
    "input_alignment); no result")


def schedule_records(spec: _build.BuildSpec) -> list:
    """The tuning records replayed on ``spec``'s GEMM blocks (empty: rule-based schedules)."""
    return [{"block": block, "task": task, "trace": json.loads(trace)}
            for block, task, trace in spec.tuned]


def _param(t: TensorSpec, role: str, dtype: str, sizes: Mapping[str, int]) -> dict:
    entry = {"name": t.name, "role": role, "kind": "tensor" if t.shape else "scalar",
             "dtype": dtype if t.dtype == "T" else t.dtype,
             "shape": [d if d in DYNAMIC_DIMS else eval_dim(d, sizes) for d in t.shape],
             "dims": list(t.shape),
             "dynamic": [k for k, d in enumerate(t.shape) if d in DYNAMIC_DIMS]}
    if t.name == "seq_len_max":
        entry["range"] = [0, "T"]
    return entry


def signature(op: OpSpec, dtype: str, input_size: int, cell_size: int) -> list[dict]:
    """The manifest's ``params`` of ``op``: inputs then outputs, in registry (call) order."""
    sizes = {"I": input_size, "H": cell_size}
    return ([_param(t, "input", dtype, sizes) for t in op.inputs]
            + [_param(t, "output", dtype, sizes) for t in op.outputs])


def prepacked_entry(spec: _build.BuildSpec) -> dict:
    """The manifest's ``prepacked`` entry of a prepacked ``spec``."""
    packs = WEIGHT_PACKS[spec.op](spec.input_size, spec.cell_size)
    return {"function": spec.func_name, "pack_function": spec.pack_func_name,
            "panels": [{"name": p.name, "role": "panel", "kind": "tensor", "dtype": "float32",
                        "shape": list(p.shape)} for p in packs]}


def make_manifest(specs: Sequence[_build.BuildSpec], library_sha256: str,
                  onnx_models: Mapping[str, str],
                  prepacked: Mapping[str, _build.BuildSpec] | None = None) -> dict:
    """The manifest of a library holding ``specs`` (one target, dtype, ``I`` and ``H``).

    Parameters
    ----------
    specs : sequence of BuildSpec
        One per op, in the order to list them.
    library_sha256 : str
        The library file's SHA-256 (hex); :func:`~.loader.load` checks it.
    onnx_models : mapping
        Op name -> the path of its ONNX model, relative to the folder.
    prepacked : mapping, optional
        Op name -> the spec of its prepacked kernel, also in the library.
    """
    from .. import __version__

    first = specs[0]
    ops = {}
    for spec in specs:
        op = get_op(spec.op)
        ops[spec.op] = {
            "function": spec.func_name, "kind": op.kind, "direction": op.direction,
            "gate_layout": op.gate_layout, "attrs": dict(spec.attrs),
            "params": signature(op, spec.dtype, spec.input_size, spec.cell_size),
            "onnx_model": onnx_models.get(spec.op), "schedule_records": schedule_records(spec),
        }
        if spec.op in (prepacked or {}):
            ops[spec.op]["prepacked"] = prepacked_entry(prepacked[spec.op])
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "library": LIBRARY, "library_sha256": library_sha256,
        "calling_convention": CALLING_CONVENTION, "alignment": ALIGNMENT,
        "input_alignment": _build.input_alignment(first),
        "dtype": first.dtype, "sizes": {"I": first.input_size, "H": first.cell_size},
        "dynamic_dims": list(DYNAMIC_DIMS), "target": json.loads(first.target),
        "tvm_version": tvm.__version__, "lstm_tvm_version": __version__,
        "kernel_version": _build.KERNEL_VERSION, "ops": ops,
    }


def dumps_manifest(manifest: dict) -> str:
    """``manifest`` as indented JSON text, one line per parameter and per list of scalars."""
    def one_line(match):
        return json.dumps(json.loads(match.group(0)))

    text = re.sub(r'\{\s*"name": [^{}]*\}', one_line, json.dumps(manifest, indent=2))
    return re.sub(r"\[[^\[\]{}]*\]", one_line, text) + "\n"  # and lists of scalars
