"""Call arguments shared by the callables (``CompiledOp``, ``ExportedOp``): binding positional
and keyword inputs to names, ``out=`` lists, refusing outputs that share memory, naming the
argument in the kernel's own argument errors, and skipping the checks of a call that repeats
the last one's tensors."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ._tvm import tvm

_Tensor = tvm.runtime.Tensor

#: TVM's packed-API argument checks: "Invalid x.byte_offset on argument #1 when calling: ...".
_KERNEL_ARG = re.compile(r"(?:Invalid|Mismatched) (\w+)\.")
_SIGNATURE = re.compile(r"\s*when calling:\s*`[^`]*`,?\s*")


def bind_inputs(where: str, names: Sequence[str], args: Sequence, kwargs: dict) -> dict:
    """``{name: value}`` from positional ``args`` (in ``names`` order) and keyword ``kwargs``.

    Raises ``TypeError`` starting with ``where`` for too many positionals or a name given twice.
    """
    if len(args) > len(names):
        raise TypeError(f"{where}: expected at most {len(names)} positional inputs "
                        f"{list(names)}, got {len(args)}")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(f"{where}: input {key!r} given twice")
        values[key] = value
    return values


def out_list(where: str, out, count: int) -> list:
    """``out=`` as a list of ``count`` entries; ``TypeError`` starting with ``where`` for
    anything that is not a sequence of that length (a single tensor, a number, ...)."""
    if isinstance(out, (str, bytes)) or not hasattr(out, "__iter__") or hasattr(out, "shape"):
        raise TypeError(f"{where}: out= expected a sequence of {count} tensors in the op's "
                        f"output order, got {type(out).__name__}")
    out = list(out)
    if len(out) != count:
        raise TypeError(f"{where}: out= needs {count} tensors, got {len(out)}")
    return out


def check_no_alias(where: str, inputs: Mapping[str, object], outputs: Mapping[str, object],
                   itemsize: int) -> None:
    """Raise ``ValueError`` naming both tensors if an output's memory overlaps another output's
    or an input's (inputs may share memory with each other: the kernels only read them).

    The kernels are compiled with ``noalias`` pointers and write outputs while still reading
    inputs, so an overlap would give wrong results, not an error. Compact TVM tensors whose
    elements all have ``itemsize`` bytes (the callables have checked both) are compared by
    byte range ``[data_ptr, data_ptr + numel * itemsize)`` on the same device; empty tensors
    overlap nothing.
    """
    spans = []
    for role, tensors in (("output", outputs), ("input", inputs)):
        for name, t in tensors.items():
            size = t.numel() * itemsize
            if size:
                start = t.data_ptr()
                spans.append((t.__dlpack_device__(), start, start + size, role, name))
    spans.sort()
    # A sweep in start order: a range overlaps an earlier one iff it starts before the largest
    # end seen so far on its device (among outputs only, for an input).
    last_all = last_out = (None, 0, "", "")
    for device, start, end, role, name in spans:
        if last_all[0] != device:
            last_all = last_out = (device, 0, "", "")
        other = last_all if role == "output" else last_out
        if start < other[1]:
            pair = [f"{role} {name!r}", f"{other[2]} {other[3]!r}"]
            first, second = pair if role == "output" else pair[::-1]
            raise ValueError(f"{where}: {first} shares memory with {second}; out= tensors "
                             f"must not overlap each other or an input")
        if end > last_all[1]:
            last_all = (device, end, role, name)
        if role == "output" and end > last_out[1]:
            last_out = (device, end, role, name)


def kernel_error(where: str, err: Exception, roles: Mapping[str, str]) -> ValueError:
    """A ``ValueError`` starting with ``where`` for an argument the kernel's own checks (TVM's
    packed API) refused, naming it as ``roles[name]`` (``"input"``/``"output"``) says.

    The callables check shapes, dtypes and sizes first; what reaches the kernel's checks is
    mostly the ``byte_offset`` of a TVM tensor (a view made by ``Tensor._create_view``), which
    Python cannot read: the kernels take tensors whose data starts at their allocation.
    """
    text = " ".join(_SIGNATURE.sub(" ", str(err)).split())
    match = _KERNEL_ARG.search(text)
    name = match.group(1) if match else None
    what = f"{roles[name]} {name!r}" if name in roles else "an argument"
    return ValueError(f"{where}: the kernel refused {what}: {text}")


class AliasGuard:
    """:func:`check_no_alias` for one callable, remembering the last tensor addresses that
    passed: a loop that calls again with the same tensors (``out=`` reused, the common case)
    pays for an identity comparison instead of the sort and sweep (a fifth of its cost at 25
    tensors: docs/performance.md)."""

    def __init__(self, where: str, itemsize: int):
        self.where, self.itemsize = where, itemsize
        self._passed: tuple | None = None

    def __call__(self, inputs: Mapping[str, object], outputs: Mapping[str, object]) -> None:
        """Raise ``ValueError`` as :func:`check_no_alias` does."""
        tensors = [*outputs.values(), *inputs.values()]
        key = (tuple(map(_Tensor.data_ptr, tensors)), tuple(map(_Tensor.numel, tensors)),
               tuple(map(_Tensor.__dlpack_device__, tensors)), len(outputs))
        if key != self._passed:
            check_no_alias(self.where, inputs, outputs, self.itemsize)
            self._passed = key  # one assignment: safe under concurrent calls


class LastCall:
    """A callable's last call with ``out=`` whose inputs were all TVM tensors and passed every
    check, with what the checks found: a call with the very same tensor objects (a serving or
    training loop) needs none of the checks again, since a TVM tensor's shape, dtype and memory
    never change. The last call's tensors stay referenced until a call with others."""

    def __init__(self):
        self._entry: tuple | None = None

    def get(self, inputs: Sequence, out):
        """What :meth:`remember` stored with these very ``inputs`` and ``out``, else None."""
        entry = self._entry
        if entry is not None and out is not None and same_objects(entry[0], inputs) \
                and same_objects(entry[1], out):
            return entry[2]
        return None

    def remember(self, inputs: Sequence, outputs: Sequence, found) -> None:
        """Store a checked call (every entry of ``inputs`` a TVM tensor)."""
        self._entry = (tuple(inputs), tuple(outputs), found)  # one assignment: thread-safe


def same_objects(a, b) -> bool:
    """Whether ``b`` is a list or tuple holding the very same objects as ``a`` (anything else,
    such as a number given as ``out=``, goes to the full checks and their error)."""
    return (isinstance(b, (list, tuple)) and len(a) == len(b)
            and all(x is y for x, y in zip(a, b)))
