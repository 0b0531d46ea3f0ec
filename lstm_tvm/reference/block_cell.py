"""Float64 NumPy references for one LSTM step: ``LSTMBlockCell`` and ``LSTMBlockCellGrad``.

TensorFlow 2.21 semantics (``tensorflow/core/kernels/rnn/lstm_ops.{h,cc}``), computed in float64
whatever the input dtype. The gate order of the ``4H`` columns is a ``gate_layout`` argument:
a layout name of :data:`lstm_tvm.registry.GATE_LAYOUTS` (``"ICFO"``, ``"IFCO"``) or a tuple of gate
letters such as ``("i", "c", "f", "o")``.

Like TF, the backward step does not differentiate through ``cell_clip``: it is the gradient of the
unclipped cell evaluated at the (clipped) activations it is given.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import registry
from ..validation import cell_clip_bound

_CELL_FWD = registry.get_op("LSTMBlockCell")
_CELL_BWD = registry.get_op("LSTMBlockCellGrad")


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(z / 2)) == 1 / (1 + exp(-z)), without overflow for large |z|.
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def resolve_layout(gate_layout: str | Sequence[str]) -> tuple[str, ...]:
    """The gate letters of ``gate_layout`` (a registry layout name or a sequence of letters).

    Raises
    ------
    ValueError
        If the layout is unknown or is not a permutation of ``i, c, f, o``.
    """
    if isinstance(gate_layout, str):
        if gate_layout not in registry.GATE_LAYOUTS:
            raise ValueError(
                f"gate_layout: expected one of {list(registry.GATE_LAYOUTS)}, got {gate_layout!r}")
        return registry.GATE_LAYOUTS[gate_layout]
    gates = tuple(gate_layout)
    if sorted(gates) != sorted("icfo"):
        raise ValueError(f"gate_layout: expected a permutation of i, c, f, o, got {gates!r}")
    return gates


def split_gates(a: np.ndarray, gate_layout: str | Sequence[str]) -> dict[str, np.ndarray]:
    """Split the last (``4H``) axis of ``a`` into its four gate blocks, keyed ``i, c, f, o``."""
    gates = resolve_layout(gate_layout)
    return dict(zip(gates, np.split(a, 4, axis=-1)))


def join_gates(blocks: dict[str, np.ndarray], gate_layout: str | Sequence[str]) -> np.ndarray:
    """Inverse of :func:`split_gates`: concatenate the gate blocks in layout order."""
    return np.concatenate([blocks[g] for g in resolve_layout(gate_layout)], axis=-1)


def lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
                    forget_bias: float = _CELL_FWD.attr("forget_bias").default,
                    cell_clip: float = _CELL_FWD.attr("cell_clip").default,
                    use_peephole: bool = _CELL_FWD.attr("use_peephole").default,
                    gate_layout: str | Sequence[str] = _CELL_FWD.gate_layout,
                    ) -> dict[str, np.ndarray]:
    """One forward LSTM step, ``g = [x, h_prev] @ w + b``.

    Parameters
    ----------
    x : array, `(B, I)`
    cs_prev, h_prev : array, `(B, H)`
    w : array, `(I+H, 4H)`
    wci, wcf, wco : array, `(H,)`
        Peephole weights, read only when ``use_peephole``.
    b : array, `(4H,)`
    forget_bias : float
        Added to the forget-gate pre-activation.
    cell_clip : float
        ``cs`` is clipped to ``[-c, c]``, ``c`` the value as a float32, where TF clips
        (:func:`lstm_tvm.validation.cell_clip_bound`: when ``c`` is finite and at least the
        smallest normal float32; NaN, ``+-inf``, zero and negative values do not clip).
    use_peephole : bool
    gate_layout : str or sequence of str
        Order of the gate blocks in the ``4H`` columns (LSTMBlockCell: ``"ICFO"``).

    Returns
    -------
    dict
        Float64 ``i, cs, f, o, ci, co, h``, each `(B, H)`.
    """
    x, cs_prev, h_prev = _f64(x), _f64(cs_prev), _f64(h_prev)
    w, b = _f64(w), _f64(b)
    g = split_gates(np.concatenate([x, h_prev], axis=-1) @ w + b, gate_layout)

    def peephole(weight, state):
        # Without peepholes nothing is multiplied: NaN/Inf in unused weights, or an infinite
        # cell state times a zero weight, must not leak in.
        return _f64(weight) * state if use_peephole else 0.0

    i = _sigmoid(g["i"] + peephole(wci, cs_prev))
    ci = np.tanh(g["c"])
    f = _sigmoid(g["f"] + float(forget_bias) + peephole(wcf, cs_prev))
    cs = i * ci + f * cs_prev
    bound = cell_clip_bound(cell_clip)
    if bound is not None:
        cs = np.clip(cs, -bound, bound)
    co = np.tanh(cs)
    o = _sigmoid(g["o"] + peephole(wco, cs))
    h = o * co
    return {"i": i, "cs": cs, "f": f, "o": o, "ci": ci, "co": co, "h": h}


def lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b,
                         i, cs, f, o, ci, co, cs_grad, h_grad, *,
                         use_peephole: bool,
                         gate_layout: str | Sequence[str] = _CELL_BWD.gate_layout,
                         ) -> dict[str, np.ndarray]:
    """One backward LSTM step (without the matmul part), as TF's ``LSTMBlockCellGrad``.

    ``do = o(1-o) h_grad co``; ``dcs = (1-co^2) h_grad o + cs_grad [+ do wco]``;
    ``dci = (1-ci^2) dcs i``; ``df = f(1-f) dcs cs_prev``; ``di = i(1-i) dcs ci``.

    Parameters
    ----------
    x, cs_prev, h_prev, w, wci, wcf, wco, b
        The forward step's inputs (``x``, ``h_prev``, ``w``, ``b`` are not read: the matmul part
        is :func:`cell_grad_matmul`).
    i, cs, f, o, ci, co : array, `(B, H)`
        The forward step's activations (used as given; ``co`` is not recomputed from ``cs``).
    cs_grad, h_grad : array, `(B, H)`
        Total gradients arriving at ``cs`` and ``h``.
    use_peephole : bool
    gate_layout : str or sequence of str
        Order of the gate blocks in ``dicfo`` (LSTMBlockCellGrad: ``"ICFO"``).

    Returns
    -------
    dict
        Float64 ``cs_prev_grad`` `(B, H)`, ``dicfo`` `(B, 4H)`, ``wci_grad, wcf_grad, wco_grad``
        `(H,)`. Without peephole the three peephole grads are zeros, as TF returns.
    """
    del x, h_prev, w, b  # read only by cell_grad_matmul
    cs_prev, cs = _f64(cs_prev), _f64(cs)
    i, f, o, ci, co = (_f64(a) for a in (i, f, o, ci, co))
    cs_grad, h_grad = _f64(cs_grad), _f64(h_grad)
    do = o * (1.0 - o) * h_grad * co
    dcs = (1.0 - co * co) * h_grad * o + cs_grad
    if use_peephole:
        dcs = dcs + do * _f64(wco)
    dci = (1.0 - ci * ci) * dcs * i
    df = f * (1.0 - f) * dcs * cs_prev
    di = i * (1.0 - i) * dcs * ci
    dicfo = join_gates({"i": di, "c": dci, "f": df, "o": do}, gate_layout)
    cs_prev_grad = dcs * f
    zeros = np.zeros(cs_prev.shape[-1:], dtype=np.float64)
    if use_peephole:
        cs_prev_grad = cs_prev_grad + di * _f64(wci) + df * _f64(wcf)
        wci_grad, wcf_grad, wco_grad = ((di * cs_prev).sum(0), (df * cs_prev).sum(0),
                                        (do * cs).sum(0))
    else:
        wci_grad, wcf_grad, wco_grad = zeros, zeros.copy(), zeros.copy()
    return {"cs_prev_grad": cs_prev_grad, "dicfo": dicfo,
            "wci_grad": wci_grad, "wcf_grad": wcf_grad, "wco_grad": wco_grad}


def cell_grad_matmul(x, h_prev, w, dicfo) -> dict[str, np.ndarray]:
    """The matmul part of a cell's gradient, as TF's Python gradient of ``LSTMBlockCell``.

    ``xh_grad = dicfo @ w.T`` split into ``x_grad`` and ``h_prev_grad``;
    ``w_grad = [x, h_prev].T @ dicfo``; ``b_grad = dicfo.sum(0)``.

    Parameters
    ----------
    x : array, `(B, I)`
    h_prev : array, `(B, H)`
    w : array, `(I+H, 4H)`
    dicfo : array, `(B, 4H)`
        ``LSTMBlockCellGrad``'s gate gradient (any layout: it only has to match ``w``'s).

    Returns
    -------
    dict
        Float64 ``x_grad`` `(B, I)`, ``h_prev_grad`` `(B, H)`, ``w_grad`` `(I+H, 4H)`,
        ``b_grad`` `(4H,)`.
    """
    x, h_prev, w, dicfo = _f64(x), _f64(h_prev), _f64(w), _f64(dicfo)
    n_in = x.shape[-1]
    xh_grad = dicfo @ w.T
    xh = np.concatenate([x, h_prev], axis=-1)
    return {"x_grad": xh_grad[:, :n_in], "h_prev_grad": xh_grad[:, n_in:],
            "w_grad": xh.T @ dicfo, "b_grad": dicfo.sum(0)}
