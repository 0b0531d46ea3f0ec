"""Float64 NumPy references for the sequence ops and the registry-driven :func:`run`.

``BlockLSTM``/``BlockLSTMV2`` run :func:`~.block_cell.lstm_block_cell` for
``t = 0 .. seq_len_max-1``; ``BlockLSTMGrad``/``BlockLSTMGradV2`` walk back from
``t = seq_len_max-1``, carrying the gradients of the recurrent state. TensorFlow 2.21 semantics,
with one documented difference: padded steps (``t >= seq_len_max``) are zero in **every**
output, where TF zeroes only ``cs``, ``h`` (forward) and ``x_grad`` (backward) and leaves
``i, f, o, ci, co`` uninitialised.
"""

from __future__ import annotations

import operator
from typing import Mapping, Sequence

import numpy as np

from .. import registry
from .block_cell import _f64, cell_grad_matmul, lstm_block_cell, lstm_block_cell_grad

_V1, _V1_GRAD = registry.get_op("BlockLSTM"), registry.get_op("BlockLSTMGrad")
_V2, _V2_GRAD = registry.get_op("BlockLSTMV2"), registry.get_op("BlockLSTMGradV2")


def seq_len_of(seq_len_max, time_len: int) -> int:
    """``seq_len_max`` (an int or a 0-d integer array) as an int checked to lie in ``0..time_len``.

    Raises
    ------
    TypeError
        If it is not an integer scalar.
    ValueError
        If it is outside ``[0, time_len]``.
    """
    arr = np.asarray(seq_len_max)
    if arr.ndim != 0 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"seq_len_max: expected an integer scalar, got {seq_len_max!r}")
    n = operator.index(arr.item())
    if not 0 <= n <= time_len:
        raise ValueError(f"seq_len_max: expected 0 <= seq_len_max <= T = {time_len}, got {n}")
    return n


def block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
               forget_bias: float = _V1.attr("forget_bias").default,
               cell_clip: float = _V1.attr("cell_clip").default,
               use_peephole: bool = _V1.attr("use_peephole").default,
               gate_layout: str | Sequence[str] = _V1.gate_layout,
               ) -> dict[str, np.ndarray]:
    """LSTM over a sequence (``BlockLSTM``; ``BlockLSTMV2`` with ``forget_bias=0``, ``"IFCO"``).

    Parameters
    ----------
    seq_len_max : int or 0-d integer array
        Number of steps to run, ``0 <= seq_len_max <= T``.
    x : array, `(T, B, I)`
    cs_prev, h_prev : array, `(B, H)`
        State before step 0.
    w, wci, wcf, wco, b
        As :func:`~.block_cell.lstm_block_cell`.
    forget_bias, cell_clip, use_peephole, gate_layout
        As :func:`~.block_cell.lstm_block_cell`; defaults are BlockLSTM's.

    Returns
    -------
    dict
        Float64 ``i, cs, f, o, ci, co, h``, each `(T, B, H)`, zero for ``t >= seq_len_max``.
    """
    x = _f64(x)
    time_len, batch = x.shape[:2]
    n = seq_len_of(seq_len_max, time_len)
    out = {k: np.zeros((time_len, batch, np.shape(cs_prev)[-1]))
           for k in ("i", "cs", "f", "o", "ci", "co", "h")}
    cs_t, h_t = cs_prev, h_prev
    for t in range(n):
        step = lstm_block_cell(x[t], cs_t, h_t, w, wci, wcf, wco, b, forget_bias=forget_bias,
                               cell_clip=cell_clip, use_peephole=use_peephole,
                               gate_layout=gate_layout)
        for k, v in step.items():
            out[k][t] = v
        cs_t, h_t = step["cs"], step["h"]
    return out


def block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                    i, cs, f, o, ci, co, h, cs_grad, h_grad, *,
                    use_peephole: bool,
                    gate_layout: str | Sequence[str] = _V1_GRAD.gate_layout,
                    ) -> dict[str, np.ndarray]:
    """Gradient of :func:`block_lstm` (``BlockLSTMGrad``; ``BlockLSTMGradV2`` with ``"IFCO"``).

    Step ``t`` (from ``seq_len_max-1`` down to 0) is :func:`~.block_cell.lstm_block_cell_grad`
    with ``cs_grad[t] + dcs_next`` and ``h_grad[t] + dh_next``, reading its previous state from
    ``cs[t-1]``, ``h[t-1]`` (``cs_prev``, ``h_prev`` at ``t = 0``), then
    :func:`~.block_cell.cell_grad_matmul`. Activations and output gradients at padded steps are
    not read.

    Parameters
    ----------
    seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b
        The forward's inputs.
    i, cs, f, o, ci, co, h : array, `(T, B, H)`
        The forward's outputs.
    cs_grad, h_grad : array, `(T, B, H)`
        Gradients arriving at ``cs`` and ``h`` from outside the recurrence.
    use_peephole : bool
    gate_layout : str or sequence of str

    Returns
    -------
    dict
        Float64 ``x_grad`` `(T, B, I)` (zero for ``t >= seq_len_max``), ``cs_prev_grad``,
        ``h_prev_grad`` `(B, H)`, ``w_grad`` `(I+H, 4H)`, ``wci_grad, wcf_grad, wco_grad`` `(H,)`
        (zeros without peephole, as TF), ``b_grad`` `(4H,)`.
    """
    x, w = _f64(x), _f64(w)
    cs, h = _f64(cs), _f64(h)
    n = seq_len_of(seq_len_max, x.shape[0])
    hidden = np.shape(cs_prev)[-1]
    dcs_next = np.zeros((x.shape[1], hidden))
    dh_next = np.zeros_like(dcs_next)
    grads = {"x_grad": np.zeros(x.shape), "w_grad": np.zeros(w.shape),
             "b_grad": np.zeros(w.shape[1]), "wci_grad": np.zeros(hidden),
             "wcf_grad": np.zeros(hidden), "wco_grad": np.zeros(hidden)}
    for t in reversed(range(n)):
        cp = _f64(cs_prev) if t == 0 else cs[t - 1]
        hp = _f64(h_prev) if t == 0 else h[t - 1]
        cell = lstm_block_cell_grad(
            x[t], cp, hp, w, wci, wcf, wco, b, i[t], cs[t], f[t], o[t], ci[t], co[t],
            _f64(cs_grad[t]) + dcs_next, _f64(h_grad[t]) + dh_next,
            use_peephole=use_peephole, gate_layout=gate_layout)
        mm = cell_grad_matmul(x[t], hp, w, cell["dicfo"])
        grads["x_grad"][t] = mm["x_grad"]
        grads["w_grad"] += mm["w_grad"]
        grads["b_grad"] += mm["b_grad"]
        for p in ("wci_grad", "wcf_grad", "wco_grad"):
            grads[p] += cell[p]
        dcs_next, dh_next = cell["cs_prev_grad"], mm["h_prev_grad"]
    return {"x_grad": grads["x_grad"], "cs_prev_grad": dcs_next, "h_prev_grad": dh_next,
            "w_grad": grads["w_grad"], "wci_grad": grads["wci_grad"],
            "wcf_grad": grads["wcf_grad"], "wco_grad": grads["wco_grad"],
            "b_grad": grads["b_grad"]}


def block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
                  cell_clip: float = _V2.attr("cell_clip").default,
                  use_peephole: bool = _V2.attr("use_peephole").default,
                  ) -> dict[str, np.ndarray]:
    """``BlockLSTMV2``: :func:`block_lstm` with no forget bias and the ``IFCO`` layout."""
    return block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                      forget_bias=registry.forget_bias_of(_V2, {}), cell_clip=cell_clip,
                      use_peephole=use_peephole, gate_layout=_V2.gate_layout)


def block_lstm_grad_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                       i, cs, f, o, ci, co, h, cs_grad, h_grad, *,
                       use_peephole: bool) -> dict[str, np.ndarray]:
    """``BlockLSTMGradV2``: :func:`block_lstm_grad` with the ``IFCO`` layout."""
    return block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                           i, cs, f, o, ci, co, h, cs_grad, h_grad,
                           use_peephole=use_peephole, gate_layout=_V2_GRAD.gate_layout)


# --- registry-driven entry point --------------------------------------------------------------

#: The reference of each registry op (TF ops and helpers) by name; the V1 and V2 sequence ops
#: share theirs (the gate layout and attributes tell them apart).
_IMPLS = {name: impl for impl, names in (
    (lstm_block_cell, ("LSTMBlockCell",)),
    (lstm_block_cell_grad, ("LSTMBlockCellGrad",)),
    (block_lstm, ("BlockLSTM", "BlockLSTMV2")),
    (block_lstm_grad, ("BlockLSTMGrad", "BlockLSTMGradV2")),
    (cell_grad_matmul, ("CellGradMatmul",)),
) for name in names}


def _resolve_attrs(op: registry.OpSpec, attrs: Mapping[str, object] | None) -> dict:
    attrs = dict(attrs or {})
    unknown = sorted(set(attrs) - set(op.attr_names))
    if unknown:
        raise ValueError(f"{op.name}: unknown attributes {unknown}; expected {list(op.attr_names)}")
    merged = {**op.defaults(), **attrs}
    missing = [a.name for a in op.attrs if a.name not in merged]
    if missing:
        raise ValueError(f"{op.name}: missing required attributes {missing}")
    return merged


def _check_inputs(op: registry.OpSpec, inputs: Mapping[str, object]) -> dict:
    missing = [n for n in op.input_names if n not in inputs]
    unknown = sorted(set(inputs) - set(op.input_names))
    if missing or unknown:
        raise ValueError(f"{op.name}: expected inputs {list(op.input_names)}, "
                         f"missing {missing}, unknown {unknown}")
    sizes = {}
    for symbol, (name, axis) in op.size_sources.items():
        shape, dims = np.shape(inputs[name]), op.input(name).shape
        if len(shape) != len(dims):
            raise ValueError(f"{op.name}: expected {name} of rank {len(dims)}, got shape {shape}")
        sizes[symbol] = shape[axis]
    args = {}
    for spec in op.inputs:
        if spec.dtype != "T":  # seq_len_max: an integer scalar, checked by seq_len_of
            args[spec.name] = seq_len_of(inputs[spec.name], sizes["T"])
            continue
        expected = spec.concrete_shape(sizes)
        if np.shape(inputs[spec.name]) != expected:
            raise ValueError(f"{op.name}: expected {spec.name} of shape {expected}, "
                             f"got {np.shape(inputs[spec.name])}")
        args[spec.name] = _f64(inputs[spec.name])
    return args


def run(op_name: str, inputs: Mapping[str, object],
        attrs: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
    """Evaluate registry op ``op_name`` in float64 with TF semantics.

    Parameters
    ----------
    op_name : str
        A key of :data:`lstm_tvm.registry.KERNEL_OPS` (a TF op or a helper).
    inputs : mapping
        Arrays keyed by the op's input names (any float dtype; ``seq_len_max`` an int or 0-d
        integer array).
    attrs : mapping, optional
        Attributes keyed by the op's attribute names; missing optional ones take TF's defaults.

    Returns
    -------
    dict
        Float64 outputs keyed by the op's output names, in registry order. Padded steps
        (``t >= seq_len_max``) are zero in every output.

    Raises
    ------
    KeyError
        For an unknown op.
    ValueError, TypeError
        For missing/unknown inputs or attributes, or wrong shapes.
    """
    op = registry.get_op(op_name)
    attrs = _resolve_attrs(op, attrs)
    args = _check_inputs(op, inputs)
    kwargs = {"use_peephole": bool(attrs["use_peephole"]), "gate_layout": op.gates} \
        if op.tf_op else {}
    if op.tf_op and op.direction == "forward":
        kwargs["forget_bias"] = registry.forget_bias_of(op, attrs)
        kwargs["cell_clip"] = float(attrs["cell_clip"])
    result = _IMPLS[op.name](*(args[n] for n in op.input_names), **kwargs)
    return {n: result[n] for n in op.output_names}
