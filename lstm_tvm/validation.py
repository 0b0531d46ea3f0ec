"""Input and attribute checking for the six ops, derived from :mod:`lstm_tvm.registry`.

TensorFlow aborts or segfaults on some malformed inputs to these ops; lstm_tvm answers every
one with a Python exception whose message starts with the op name and names the argument:
``"<Op>: input '<name>' expected <x>, got <y>"``. ``TypeError`` is for names, types and dtypes,
``ValueError`` for shapes and values. The checks, in the order they run:

Attributes (:func:`validate_attrs`)
    1. Unknown attribute names: ``TypeError`` listing the valid ones.
    2. A required attribute (``use_peephole`` on the grad ops) missing: ``TypeError``.
    3. Float attributes take an ``int`` or ``float`` (not ``bool`` or ``str``): ``TypeError``.
       ``forget_bias`` must be finite and within float32's range, as TF's float attributes
       are 32-bit (NaN or ``1e39`` is a ``ValueError``); a value that rounds to 0 in float32
       counts as 0. ``cell_clip`` takes every real number TF takes, NaN, ``+-inf`` and values
       past float32's range included; one whose float32 value is not a finite normal number
       turns clipping off in TF and is returned as 0 (see :func:`cell_clip_bound`). Only an
       ``int`` beyond float64's range is a ``ValueError`` (TF cannot convert it either).
    4. Bool attributes take ``bool`` or ``numpy.bool_`` only: ``TypeError``.

Inputs (:func:`validate_inputs`)
    1. Missing or unexpected input names: ``TypeError`` listing them.
    2. Every float input has dtype float16 or float32 (``TypeError``), and all float inputs share
       the dtype of the first one (``TypeError`` naming both inputs).
    3. ``seq_len_max`` is an integer scalar: a Python ``int``, a NumPy integer or a 0-d integer
       array (``bool`` and floats: ``TypeError``; arrays that are not 0-d: ``ValueError``).
    4. Every float input has its registry rank (``ValueError``).
    5. Sizes come from two inputs: ``T, B, I`` from ``x`` and ``H`` from ``cs_prev``'s second
       dim. ``I >= 1`` and ``H >= 1`` (``ValueError``); ``B = 0`` and ``T = 0`` are allowed
       (empty batch or sequence: the outputs are correctly shaped, empty or zero).
    6. Every input has exactly the registry shape for those sizes (``ValueError`` showing the
       symbolic and the concrete expected shape); this catches a ``w`` whose 4H is not a
       multiple of 4, a ``w`` with the wrong row count, activations shorter than ``T``, ...
    7. ``0 <= seq_len_max <= T`` (``ValueError``), compared as Python ints (no overflow).
    8. No input, output or internal stacked tensor (``(T*B, I+H)``, ``(T*B, 4H)``) may have
       ``2**31`` or more elements (``ValueError`` naming the tensor and the sizes): the kernels'
       index arithmetic is 64-bit, but no run that large has been verified (:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Mapping

import numpy as np

from .registry import DTYPES, OpSpec, eval_dim

__all__ = ["Signature", "validate_attrs", "plain_attrs", "validate_inputs",
           "expected_output_shapes", "cell_clip_bound", "check_cell_clip"]

#: Tensors with this many elements or more are refused (rule 8).
#:
#: Checked, and why the refusal stays: the kernels' ``T`` and ``B`` are ``int64`` variables,
#: and in the lowered TIR (TVM's pipeline as ``tvm.compile`` runs it, after ``NarrowDataType``
#: and ``MakePackedAPI``) every integer expression computed from ``T``, ``B`` or
#: ``seq_len_max`` is 64-bit: buffer indices, loop extents (TVM's CPU codegen splits a parallel
#: loop in its extent's type) and workspace sizes (``uint64``). Nothing can narrow them, since
#: the sizes are unbounded; ``tests/test_kernels_indexing.py`` checks this for every op and
#: dtype, with a positive control. DLPack shapes are ``int64`` too. What is not verified is a
#: run past ``2**31`` elements end to end (TVM's allocator and workspace pool, DLPack import,
#: the thread pool, the generated vector code, the float64 reference to compare with): the
#: smallest such call needs ~12 GiB (a float16 ``x`` of ``2**31`` elements plus its float32
#: ``(T*B, I+H)`` scratch) and no test machine runs it. Lifting the limit means raising this
#: constant together with a test that makes such a call and checks it against the reference.
MAX_ELEMENTS = 2**31

#: The smallest normal float32. TF runs its kernels with denormals flushed to zero, so a
#: ``cell_clip`` below it compares as 0 there: no clipping.
F32_TINY = float(np.finfo(np.float32).tiny)


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a valid set of inputs fixes: element dtype, sizes and ``seq_len_max``.

    ``dtype`` is ``"float32"`` or ``"float16"``; ``sizes`` maps ``"T"`` (sequence ops only),
    ``"B"``, ``"I"``, ``"H"`` to ints; ``seq_len_max`` is an int for sequence ops, else None.
    """

    dtype: str
    sizes: dict
    seq_len_max: int | None = None

    def __hash__(self) -> int:
        return hash((self.dtype, tuple(sorted(self.sizes.items())), self.seq_len_max))


def validate_attrs(op: OpSpec, attrs: Mapping[str, object]) -> dict[str, float | bool]:
    """Check ``attrs`` against ``op``'s registry attributes and fill in TF's defaults.

    Parameters
    ----------
    op : OpSpec
        The op, from :data:`lstm_tvm.registry.OPS`.
    attrs : Mapping[str, object]
        Attribute values by name; optional ones may be left out.

    Returns
    -------
    dict[str, float | bool]
        Every attribute of ``op`` in registry order, as a Python ``float`` or ``bool``.
    """
    if not isinstance(attrs, Mapping):
        raise TypeError(f"{op.name}: expected attrs as a mapping, got {type(attrs).__name__}")
    unknown = [k for k in attrs if k not in op.attr_names]
    if unknown:
        raise TypeError(f"{op.name}: unknown attribute(s) {unknown}; "
                        f"expected among {list(op.attr_names)}")
    out: dict[str, float | bool] = {}
    for spec in op.attrs:
        if spec.name not in attrs:
            if spec.required:
                raise TypeError(f"{op.name}: missing required attribute '{spec.name}' "
                                f"(expected a {spec.type.__name__})")
            out[spec.name] = spec.default
            continue
        value = attrs[spec.name]
        where = f"{op.name}: attribute '{spec.name}'"
        if spec.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{where} expected a bool, got {_describe(value)}")
            out[spec.name] = bool(value)
        else:
            out[spec.name] = _float_attr(op, spec.name, value)
    return out


def plain_attrs(op: OpSpec) -> dict[str, float | bool]:
    """``op``'s attributes at TF's defaults with peepholes off (for ops that have them): the
    configuration that tuning tasks and the benchmark use."""
    return validate_attrs(op, {"use_peephole": False} if "use_peephole" in op.attr_names else {})


def cell_clip_bound(cell_clip: float) -> float | None:
    """The bound TF 2.21 clips ``cs`` to, ``[-bound, bound]``, for a ``cell_clip`` value, or
    None where it does not clip.

    TF clips when ``cell_clip > 0`` with the value as a float32 (its attributes are 32-bit) in
    kernels that run with denormals flushed to zero. So NaN, zero, negative values and float32
    denormals (``1e-40``; ``1e-50`` is 0) give None, and so do ``+inf`` and values past
    float32's range (``1e39`` is ``inf``): a clip to ``+-inf`` changes nothing.
    """
    bound = _as_float32(cell_clip)
    return bound if F32_TINY <= bound < math.inf else None


def check_cell_clip(op: OpSpec, value) -> float:
    """Rule 3 for ``op``'s ``cell_clip`` alone: ``value`` as a Python float, 0.0 where TF
    does not clip (:func:`cell_clip_bound`: NaN, ``+-inf`` and what rounds to them, zero,
    float32 denormals), else unchanged; a ``TypeError`` or ``ValueError`` as
    :func:`validate_attrs` raises it."""
    return _float_attr(op, "cell_clip", value)


def _float_attr(op: OpSpec, name: str, value) -> float:
    """Rule 3 for the float attribute ``name`` of ``op``: its type, then its value."""
    where = f"{op.name}: attribute '{name}'"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} expected a float, got {_describe(value)}")
    if name == "cell_clip":
        return _cell_clip_attr(where, value)
    return _float32_attr(where, value)


def _cell_clip_attr(where: str, value) -> float:
    """Rule 3's value check of ``cell_clip`` (see :func:`check_cell_clip`). A value returned
    as 0 keeps attribute sets comparable and JSON-safe (cache keys, export manifests)."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64's range: TF raises OverflowError too
        raise ValueError(f"{where} expected a float, got {_describe(value)} (too large "
                         f"to convert to a float)") from None
    return number if F32_TINY <= abs(_as_float32(number)) < math.inf else 0.0


def _as_float32(number: float) -> float:
    """``number`` rounded to float32 (``+-inf`` past its range, as TF's attributes)."""
    with np.errstate(over="ignore"):
        return float(np.float32(number))


def _float32_attr(where: str, value) -> float:
    """Rule 3's value check of a float attribute other than ``cell_clip``: a finite float in
    float32's range (TF's float attributes are 32-bit, and the kernels bake them in as float32
    constants). A value that rounds to 0 in float32 is 0, as in TF."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64's range
        raise ValueError(f"{where} expected a finite float, got {_describe(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where} expected a finite float, got {number}")
    if abs(number) > float(np.finfo(np.float32).max):
        raise ValueError(f"{where} expected a finite float32 (|value| <= "
                         f"{float(np.finfo(np.float32).max):.8g}), got {number}")
    return 0.0 if np.float32(number) == 0 else number


def validate_inputs(op: OpSpec, inputs: Mapping[str, object]) -> Signature:
    """Check ``inputs`` against ``op``'s registry inputs (rules 1-8 of the module docstring).

    Parameters
    ----------
    op : OpSpec
        The op, from :data:`lstm_tvm.registry.OPS`.
    inputs : Mapping[str, object]
        Tensors (objects with ``.shape`` and ``.dtype``) by input name; ``seq_len_max`` may be
        a Python int, a NumPy integer or a 0-d integer array.

    Returns
    -------
    Signature
        The float dtype, the sizes (``T`` for sequence ops, ``B``, ``I``, ``H``) and
        ``seq_len_max`` (None for cell ops).
    """
    if not isinstance(inputs, Mapping):
        raise TypeError(f"{op.name}: expected inputs as a mapping, got {type(inputs).__name__}")
    missing = [n for n in op.input_names if n not in inputs]
    if missing:
        raise TypeError(f"{op.name}: missing input(s) {missing}; expected {list(op.input_names)}")
    extra = [n for n in inputs if n not in op.input_names]
    if extra:
        raise TypeError(f"{op.name}: unexpected input(s) {extra}; expected {list(op.input_names)}")
    floats = [t for t in op.inputs if t.dtype == "T"]
    dtype = _check_dtypes(op, floats, inputs)
    scalars = {t.name: _int_scalar(op, t.name, inputs[t.name]) for t in op.inputs if t.dtype != "T"}
    shapes = {t.name: _shape(op, t.name, inputs[t.name]) for t in floats}
    for t in floats:
        if len(shapes[t.name]) != len(t.shape):
            raise ValueError(f"{op.name}: input '{t.name}' expected rank {len(t.shape)} "
                             f"({', '.join(t.shape)}), got shape {shapes[t.name]}")
    sizes = _infer_sizes(op, shapes)
    for t in floats:
        want = t.concrete_shape(sizes)
        if shapes[t.name] != want:
            raise ValueError(
                f"{op.name}: input '{t.name}' expected shape ({', '.join(t.shape)}) = {want}, "
                f"got {shapes[t.name]} (sizes {_fmt(sizes)} taken from {_sources(op)})")
    seq_len_max = scalars.get("seq_len_max")
    if seq_len_max is not None:
        check_seq_len_max(op, seq_len_max, sizes["T"])
    _check_element_counts(op, sizes)
    return Signature(dtype=dtype, sizes=sizes, seq_len_max=seq_len_max)


def check_seq_len_max(op: OpSpec, value, T: int) -> int:
    """Rules 3 and 7 alone: ``value`` as a Python int in ``0..T`` (for callers that already
    validated the tensors of a call with the same shapes)."""
    n = _int_scalar(op, "seq_len_max", value)
    if not 0 <= n <= T:
        raise ValueError(f"{op.name}: input 'seq_len_max' expected 0 <= seq_len_max <= "
                         f"T = {T}, got {n}")
    return n


def expected_output_shapes(op: OpSpec, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every output of ``op``, in registry order, for ``sizes``."""
    return {t.name: t.concrete_shape(sizes) for t in op.outputs}


# --- helpers ---------------------------------------------------------------------------------

def _describe(value) -> str:
    """Type name and a short repr of ``value`` for error messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _fmt(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def _sources(op: OpSpec) -> str:
    """The inputs the sizes are read from, e.g. ``'x' and 'cs_prev'``."""
    names = [f"'{n}'" for n in dict.fromkeys(name for name, _ in op.size_sources.values())]
    return " and ".join(names)


def _dtype_name(value) -> str:
    try:
        return np.dtype(value.dtype).name
    except TypeError:
        return str(value.dtype)


def _shape(op: OpSpec, name: str, value) -> tuple[int, ...]:
    shape = tuple(int(d) for d in value.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"{op.name}: input '{name}' expected non-negative dims, got {shape}")
    return shape


def _check_dtypes(op: OpSpec, floats, inputs) -> str:
    """Rule 2: every float input is float16/float32, all the same; returns that dtype."""
    names = {}
    for t in floats:
        value = inputs[t.name]
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise TypeError(f"{op.name}: input '{t.name}' expected an array with .shape and "
                            f".dtype, got {type(value).__name__}")
        names[t.name] = _dtype_name(value)
        if names[t.name] not in DTYPES:
            raise TypeError(f"{op.name}: input '{t.name}' has dtype {names[t.name]}; "
                            f"expected float16 or float32")
    first = floats[0].name
    for name, dtype in names.items():
        if dtype != names[first]:
            raise TypeError(f"{op.name}: input '{name}' has dtype {dtype}; expected "
                            f"{names[first]}, the dtype of input '{first}' (all float inputs "
                            f"must share one dtype)")
    return names[first]


def _int_scalar(op: OpSpec, name: str, value) -> int:
    """Rule 3: a Python int, NumPy integer or 0-d integer array, as a Python int."""
    if type(value) is int or isinstance(value, np.integer):  # the common case, first
        return int(value)
    where = f"{op.name}: input '{name}'"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where} expected an integer scalar, got {_describe(value)}")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TypeError(f"{where} expected an integer scalar, got an array of dtype "
                            f"{value.dtype.name}")
        if value.shape != ():
            raise ValueError(f"{where} expected a scalar, got shape {value.shape}")
        return int(value)
    raise TypeError(f"{where} expected an integer scalar, got {_describe(value)}")


def _infer_sizes(op: OpSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Rule 5: the sizes from :attr:`OpSpec.size_sources` (``T, B, I`` from ``x``, ``H`` from
    ``cs_prev``, or ``h_prev`` for the helper); ``I, H >= 1``."""
    sources = op.size_sources
    sizes = {s: shapes[name][axis] for s, (name, axis) in sources.items()}
    for symbol, what in (("I", "input size"), ("H", "cell size")):
        if sizes[symbol] < 1:
            source = sources[symbol][0]
            raise ValueError(f"{op.name}: {what} {symbol} must be >= 1, got {symbol} = "
                             f"{sizes[symbol]} from input '{source}' of shape {shapes[source]}")
    return sizes


def _check_element_counts(op: OpSpec, sizes: Mapping[str, int]) -> None:
    """Rule 8: every input, output and stacked intermediate has < ``MAX_ELEMENTS`` elements."""
    rows = "T*B" if op.kind == "sequence" else "B"
    tensors = [("input", t.name, t.shape) for t in op.inputs]
    tensors += [("output", t.name, t.shape) for t in op.outputs]
    tensors += [("intermediate", "xh", (rows, "I+H")), ("intermediate", "gates", (rows, "4H"))]
    for kind, name, dims in tensors:
        shape = tuple(sizes["T"] * sizes["B"] if d == "T*B" else eval_dim(d, sizes) for d in dims)
        if math.prod(shape) >= MAX_ELEMENTS:
            raise ValueError(
                f"{op.name}: {kind} '{name}' would have shape ({', '.join(dims)}) = {shape}, "
                f"{math.prod(shape)} elements; expected fewer than 2**31 elements per tensor, "
                f"got sizes {_fmt(sizes)}: sizes that large are not supported (not verified "
                f"end to end)")

