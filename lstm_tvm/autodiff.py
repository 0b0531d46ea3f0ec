"""Reverse-mode gradients of the three forward ops through their grad ops.

:func:`gradients` takes one call of a forward op (``LSTMBlockCell``, ``BlockLSTM`` or
``BlockLSTMV2``: its inputs, attributes and outputs) and the gradients of a scalar loss with
respect to its outputs, runs the grad op the registry pairs with it (:attr:`OpSpec.pair
<lstm_tvm.registry.OpSpec.pair>`: ``LSTMBlockCellGrad``, ``BlockLSTMGrad``, ``BlockLSTMGradV2``)
and returns the loss's gradients with respect to every float input of the forward op.
:func:`vjp` runs the forward op and returns its outputs with a function that does the rest.

- Only ``cs`` and ``h`` carry gradients (the grad ops take ``cs_grad`` and ``h_grad``);
  a nonzero gradient for a gate output (``i, f, o, ci, co``) is refused. A missing ``cs`` or
  ``h`` gradient is zero.
- ``BlockLSTMV2`` is paired with ``BlockLSTMGradV2`` (gate layout IFCO). TensorFlow 2.21's
  ``tf.GradientTape`` pairs it with ``BlockLSTMGrad`` (ICFO) and so returns wrong gradients.
- ``LSTMBlockCellGrad`` returns only the gate gradients ``dicfo``: the rest (``x``, ``h_prev``,
  ``w``, ``b``) comes from :func:`lstm_tvm.cell_grad_matmul`, as in TF 1's Python gradient.
- As in TF, the gradient is that of the unclipped cell: where ``cell_clip`` clipped ``cs`` in
  the forward pass, the clip is not differentiated.
- At padded steps (``t >= seq_len_max``) the outputs do not depend on the inputs: the output
  gradients there are ignored and ``x``'s gradient is zero.
- Without peepholes the gradients of ``wci``, ``wcf``, ``wco`` are zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from .kernels.variant import SKIPPABLE_OUTPUTS
from .raw_ops import _to_numpy, run
from .registry import HELPERS, OPS, OpSpec
from .validation import expected_output_shapes, validate_attrs, validate_inputs

__all__ = ["GradRoute", "differentiable_outputs", "forward_ops", "grad_route", "gradients",
           "vjp"]

_GRAD = "_grad"


@dataclasses.dataclass(frozen=True)
class GradRoute:
    """How the gradient of one forward op is computed from kernels, for every caller that runs
    them (:func:`gradients` here, the framework integrations).

    ``sources``: for each input of ``grad`` in order, where it comes from: ``("input", n)`` the
    forward op's input ``n``, ``("output", n)`` its output ``n``, ``("output_grad", n)`` the
    loss's gradient with respect to output ``n`` (zeros where there is none).
    ``from_grad``: ``{input: output of grad}`` for the float inputs whose gradient ``grad``
    returns; ``from_matmul``: ``{input: output of matmul}`` for those the matmul part of the
    cell's gradient returns (``matmul`` is ``CellGradMatmul``, its inputs ``matmul_sources``:
    ``("input", n)`` or ``("grad", n)`` an output of ``grad``); both empty for the sequences.
    """

    forward: OpSpec
    grad: OpSpec
    sources: tuple[tuple[str, str], ...]
    from_grad: dict
    matmul: OpSpec | None
    matmul_sources: tuple[tuple[str, str], ...]
    from_matmul: dict

    @property
    def skippable(self) -> tuple[tuple[str, str], ...]:
        """``(output, input)`` for each output of ``grad`` its kernel can leave out
        (:data:`~lstm_tvm.kernels.variant.SKIPPABLE_OUTPUTS`), with the forward input it is the
        gradient of; sorted by output (empty for the cell)."""
        return tuple(sorted((out, n) for n, out in self.from_grad.items()
                            if out in SKIPPABLE_OUTPUTS))

    @property
    def float_inputs(self) -> tuple[str, ...]:
        """The forward op's float inputs: those that get a gradient, in input order."""
        return tuple(t.name for t in self.forward.inputs if t.dtype == "T")


def grad_route(op_name: str) -> GradRoute:
    """The :class:`GradRoute` of forward op ``op_name`` (``ValueError`` for any other name)."""
    fwd, grad = _pair(op_name)
    differentiable = _output_grad_names(fwd, grad)
    sources = tuple(("input", n) if n in fwd.input_names else ("output", n)
                    if n in fwd.output_names else ("output_grad", n[: -len(_GRAD)])
                    for n in grad.input_names)
    assert all(kind != "output_grad" or n in differentiable for kind, n in sources)
    floats = [t.name for t in fwd.inputs if t.dtype == "T"]
    from_grad = {n: n + _GRAD for n in floats if n + _GRAD in grad.output_names}
    rest = [n for n in floats if n not in from_grad]
    matmul = next(op for op in HELPERS.values() if op.pair == fwd.name) if rest else None
    matmul_sources, from_matmul = (), {}
    if matmul is not None:
        matmul_sources = tuple(("input", n) if n in fwd.input_names else ("grad", n)
                               for n in matmul.input_names)
        assert all(kind == "input" or n in grad.output_names for kind, n in matmul_sources)
        from_matmul = {n: n + _GRAD for n in rest}
        assert set(from_matmul.values()) <= set(matmul.output_names)
    return GradRoute(fwd, grad, sources, from_grad, matmul, matmul_sources, from_matmul)


def forward_ops() -> tuple[str, ...]:
    """The ops :func:`gradients` differentiates (the registry's forward ops)."""
    return tuple(name for name, op in OPS.items() if op.direction == "forward")


def differentiable_outputs(op_name: str) -> tuple[str, ...]:
    """The outputs of forward op ``op_name`` whose gradients its grad op takes (``cs``, ``h``)."""
    fwd, grad = _pair(op_name)
    return _output_grad_names(fwd, grad)


def gradients(op_name: str, inputs: Mapping, outputs, output_grads: Mapping,
              attrs: Mapping | None = None, *, target="llvm", device=None
              ) -> dict[str, np.ndarray]:
    """Gradients of a loss with respect to the float inputs of one forward-op call.

    Parameters
    ----------
    op_name : str
        A forward op: ``LSTMBlockCell``, ``BlockLSTM`` or ``BlockLSTMV2``.
    inputs : mapping
        The forward op's inputs by TF name (NumPy arrays or objects with ``__dlpack__``;
        ``seq_len_max`` an integer scalar for the sequence ops).
    outputs : mapping, named tuple or None
        The forward op's outputs on ``inputs`` (what ``lstm_tvm.raw_ops.<op_name>`` returned);
        those the grad op reads (``i, cs, f, o, ci, co`` and, for sequences, ``h``) must be
        there. ``None``: the forward op is run here.
    output_grads : mapping
        ``dloss/d<output>`` by output name, each with that output's shape and dtype; only
        ``cs`` and ``h`` may be nonzero; missing ones (or ``None``) are zeros.
    attrs : mapping, optional
        The attributes the forward op was (or is to be) run with (TF's names and defaults);
        the grad op gets those it has (``use_peephole``).
    target, device
        Where the kernels run, as for :func:`lstm_tvm.raw_ops.run`.

    Returns
    -------
    dict
        ``{name: dloss/d<name>}`` for every float input of the forward op (``x, cs_prev,
        h_prev, w, wci, wcf, wco, b``) as NumPy arrays of the inputs' dtype and shapes.

    Raises
    ------
    ValueError
        For an unknown op or a grad op's name, an array of the wrong shape (the message names
        it and shows the expected and actual shapes) or a nonzero gradient of a gate output.
    TypeError
        For missing or unknown names and wrong dtypes.
    """
    route = grad_route(op_name)
    fwd, grad = route.forward, route.grad
    arrays = _forward_inputs(fwd, inputs)
    sig = validate_inputs(fwd, arrays)
    full = validate_attrs(fwd, attrs if attrs is not None else {})
    if outputs is None:
        outputs = run(fwd.name, arrays, full, target=target, device=device)
    values = {"input": arrays, "output": _forward_outputs(fwd, grad, outputs, sig),
              "output_grad": _output_grads(fwd, grad, output_grads, sig)}
    grad_inputs = {name: values[kind][source]
                   for name, (kind, source) in zip(grad.input_names, route.sources)}
    grad_attrs = {k: full[k] for k in grad.attr_names}
    result = run(grad.name, grad_inputs, grad_attrs, target=target, device=device)._asdict()
    found = {n: result[out] for n, out in route.from_grad.items()}
    if route.matmul is not None:  # the cell: the matmul part of its gradient
        values["grad"] = result
        mm = run(route.matmul.name, {name: values[kind][source] for name, (kind, source)
                                     in zip(route.matmul.input_names, route.matmul_sources)},
                 target=target, device=device)._asdict()
        found.update({n: mm[out] for n, out in route.from_matmul.items()})
    return {n: found[n] for n in route.float_inputs}


def vjp(op_name: str, inputs: Mapping, attrs: Mapping | None = None, *, target="llvm",
        device=None) -> tuple[tuple, Callable[[Mapping], dict[str, np.ndarray]]]:
    """Run forward op ``op_name`` and return ``(outputs, backward)``.

    ``outputs`` is the named tuple of ``lstm_tvm.raw_ops.<op_name>``; ``backward(output_grads)``
    returns :func:`gradients` of this call for ``output_grads`` (a mapping such as
    ``{"h": dloss_dh}``). The input arrays must not be modified before ``backward`` is called.
    """
    fwd, _ = _pair(op_name)
    arrays = _forward_inputs(fwd, inputs)
    attrs = dict(attrs or {})
    outputs = run(fwd.name, arrays, attrs, target=target, device=device)

    def backward(output_grads: Mapping) -> dict[str, np.ndarray]:
        return gradients(fwd.name, arrays, outputs, output_grads, attrs, target=target,
                         device=device)

    return outputs, backward


def _pair(op_name) -> tuple[OpSpec, OpSpec]:
    forward = list(forward_ops())
    if not isinstance(op_name, str) or op_name not in OPS:
        raise ValueError(f"unknown op {op_name!r}; expected a forward op, one of {forward}")
    op = OPS[op_name]
    if op.direction != "forward":
        raise ValueError(f"{op_name!r} is a gradient op; expected a forward op, one of "
                         f"{forward} (the forward op of {op_name} is {op.pair!r})")
    return op, OPS[op.pair]


def _output_grad_names(fwd: OpSpec, grad: OpSpec) -> tuple[str, ...]:
    return tuple(n[: -len(_GRAD)] for n in grad.input_names
                 if n.endswith(_GRAD) and n[: -len(_GRAD)] in fwd.output_names)


def _forward_inputs(fwd: OpSpec, inputs) -> dict:
    if not isinstance(inputs, Mapping):
        raise TypeError(f"{fwd.name}: expected inputs as a mapping, got {type(inputs).__name__}")
    return {n: v if n == "seq_len_max" else _to_numpy(v, f"{fwd.name}: input {n!r}")
            for n, v in inputs.items()}


def _as_mapping(value, what: str, fwd: OpSpec) -> Mapping:
    if hasattr(value, "_asdict"):  # the named tuple raw_ops returns
        value = value._asdict()
    if not isinstance(value, Mapping):
        raise TypeError(f"{fwd.name}: expected {what} as a mapping or named tuple, got "
                        f"{type(value).__name__}")
    return value


def _check_array(fwd: OpSpec, where: str, name: str, value, sig) -> np.ndarray:
    """``value`` as a NumPy array with the shape and dtype of output ``name`` of ``fwd``."""
    spec, dtype = fwd.output(name), sig.dtype
    shape = spec.concrete_shape(sig.sizes)
    array = _to_numpy(value, f"{fwd.name}: {where}")
    if array.dtype.name != dtype:
        raise TypeError(f"{fwd.name}: {where} expected dtype {dtype} (the dtype of the "
                        f"inputs), got {array.dtype.name}")
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{fwd.name}: {where} expected shape "
                         f"({', '.join(spec.shape)}) = {shape}, got {tuple(array.shape)}")
    return array


def _by_output_name(fwd: OpSpec, value, what: str) -> Mapping:
    """``value`` as a mapping whose keys are all names of ``fwd``'s outputs."""
    value = _as_mapping(value, what, fwd)
    unknown = [k for k in value if k not in fwd.output_names]
    if unknown:
        raise TypeError(f"{fwd.name}: unknown output(s) {unknown} in {what}; expected "
                        f"names of outputs {list(fwd.output_names)}")
    return value


def _forward_outputs(fwd: OpSpec, grad: OpSpec, outputs, sig) -> dict[str, np.ndarray]:
    outputs = _by_output_name(fwd, outputs, "outputs")
    needed = [n for n in grad.input_names if n in fwd.output_names]
    missing = [n for n in needed if outputs.get(n) is None]
    if missing:
        raise TypeError(f"{fwd.name}: outputs is missing {missing}; {grad.name} needs "
                        f"{needed} from the forward pass")
    return {n: _check_array(fwd, f"outputs[{n!r}]", n, outputs[n], sig) for n in needed}


def _output_grads(fwd: OpSpec, grad: OpSpec, output_grads, sig) -> dict[str, np.ndarray]:
    output_grads = _by_output_name(fwd, output_grads, "output_grads")
    shapes = expected_output_shapes(fwd, sig.sizes)
    differentiable = _output_grad_names(fwd, grad)
    result = {}
    for name in fwd.output_names:
        value = output_grads.get(name)
        if value is None:
            if name in differentiable:
                result[name] = np.zeros(shapes[name], sig.dtype)
            continue
        array = _check_array(fwd, f"output_grads[{name!r}]", name, value, sig)
        if name in differentiable:
            result[name] = array
        elif np.any(array != 0):
            raise ValueError(f"{fwd.name}: output_grads[{name!r}] is nonzero, but {grad.name} "
                             f"propagates only the gradients of {list(differentiable)}")
    return result
