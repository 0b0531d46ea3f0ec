"""``lstm_tvm.torch.LSTM``: a module used like ``torch.nn.LSTM`` that runs TF's ``BlockLSTM``
(or ``BlockLSTMV2``) with TF's semantics."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..registry import OPS
from ..validation import validate_attrs
from ._constants import constant
from ._eager import call, eager_ok
from ._layer import layer_function
from ._ops import INT_OVERLOAD

__all__ = ["LSTM", "SEQUENCE_OPS"]

#: The ops :class:`LSTM` runs: the registry's forward sequence ops.
SEQUENCE_OPS = tuple(name for name, op in OPS.items()
                     if op.kind == "sequence" and op.direction == "forward")

#: Each layer's parameters, by the op's input names, and their TF names in
#: ``LSTMBlockFusedCell`` (``tf.compat.v1`` / ``tf.contrib.rnn``).
TF_NAMES = {"w": "kernel", "b": "bias", "wci": "w_i_diag", "wcf": "w_f_diag", "wco": "w_o_diag"}
_PEEPHOLES = ("wci", "wcf", "wco")
#: The op's weight inputs, in :meth:`LSTM.layer_inputs`' order.
_WEIGHTS = ("w", "wci", "wcf", "wco", "b")


class LSTM(torch.nn.Module):
    """A multi-layer LSTM on TF's ``BlockLSTM`` kernel (``torch.ops.lstm_tvm.BlockLSTM``),
    used like ``torch.nn.LSTM``, with TF's semantics.

    Each layer ``k`` holds the op's inputs as parameters: ``w_l{k}`` `(I_k+H, 4H)` (the rows
    of ``x``, then of ``h``; the four H-wide column blocks in the op's gate layout: ICFO for
    ``BlockLSTM``, IFCO for ``BlockLSTMV2``), ``b_l{k}`` `(4H)` (with ``bias``), and with
    ``use_peephole`` ``wci_l{k}``, ``wcf_l{k}``, ``wco_l{k}`` `(H)`. They start uniform in
    ``[-1/sqrt(H), 1/sqrt(H)]``, as ``torch.nn.LSTM``'s; :meth:`load_tf_weights` copies TF's.

    Parameters
    ----------
    input_size, hidden_size : int
        ``I`` and ``H``.
    num_layers : int
        Stacked layers (layer ``k > 0`` reads the outputs of layer ``k - 1``).
    bias : bool
        Whether the layers have a bias (without, the op gets zeros).
    batch_first : bool
        Inputs and outputs `(B, T, .)` rather than `(T, B, .)`.
    dropout : float
        Dropout on the outputs of every layer but the last, in training, as ``torch.nn.LSTM``.
    use_peephole : bool
        Peephole connections (TF's ``use_peephole``).
    forget_bias : float, optional
        Added to the forget gate (TF's ``forget_bias``); default the op's (1.0 for
        ``BlockLSTM``). ``BlockLSTMV2`` has none: only None or 0 there.
    cell_clip : float, optional
        Clip the cell state to ``[-cell_clip, cell_clip]``; None (default) does not clip, as
        TF's ``LSTMBlockFusedCell``. As in TF, the clip is not differentiated.
    op : str
        ``"BlockLSTM"`` (gate layout ICFO, as ``LSTMBlockFusedCell``) or ``"BlockLSTMV2"``
        (IFCO).
    device, dtype
        Of the parameters (float32 or float16).

    Notes
    -----
    ``forward(x, state=None, sequence_length=None)`` takes ``x`` `(T, B, I)` (`(B, T, I)` with
    ``batch_first``, or `(T, I)` unbatched) and ``state = (h_0, c_0)``, each
    `(num_layers, B, H)` (zeros when None), and returns ``(output, (h_n, c_n))`` as
    ``torch.nn.LSTM``: ``output`` the last layer's ``h`` at every step, ``h_n`` and ``c_n``
    every layer's final state. ``sequence_length`` `(B,)` (TF's argument of
    ``LSTMBlockFusedCell``): the op runs ``max(sequence_length)`` steps, ``output`` is zero
    past each row's length and ``h_n``, ``c_n`` hold each row's state at its last step (the
    initial state for a length of 0).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, *,
                 use_peephole: bool = False, forget_bias: float | None = None,
                 cell_clip: float | None = None, op: str = "BlockLSTM", device=None,
                 dtype=None):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LSTM: {name} expected an int >= 1, got {value!r}")
        if op not in SEQUENCE_OPS:
            raise ValueError(f"LSTM: op expected one of {list(SEQUENCE_OPS)}, got {op!r}")
        if not 0 <= dropout <= 1:
            raise ValueError(f"LSTM: dropout expected a probability in [0, 1], got {dropout!r}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.use_peephole, self.op = bool(use_peephole), op
        self.attrs = _op_attrs(op, use_peephole, forget_bias, cell_clip)
        self._names = []
        kw = {"device": device, "dtype": dtype}
        H = hidden_size
        for k in range(num_layers):
            rows = (input_size if k == 0 else H) + H
            shapes = {"w": (rows, 4 * H), "b": (4 * H,) if bias else None}
            shapes.update({p: (H,) if use_peephole else None for p in _PEEPHOLES})
            for name, shape in shapes.items():
                if shape is not None:
                    self.register_parameter(f"{name}_l{k}",
                                            torch.nn.Parameter(torch.empty(shape, **kw)))
            self._names.append({n: f"{n}_l{k}" for n, s in shapes.items() if s is not None})
        self._args = [tuple(_arg_source(n, names) for n in OPS[op].input_names)
                      for names in self._names]
        self.register_buffer("_zeros", torch.zeros(4 * H, **kw), persistent=False)
        self.register_buffer("_zeros_h", torch.zeros(H, **kw), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every parameter uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` (``torch.nn.LSTM``'s)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            torch.nn.init.uniform_(param, -bound, bound)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text + f", op={self.op!r}, " + ", ".join(f"{k}={v}" for k, v in self.attrs.items())

    def layer_inputs(self, layer: int) -> dict[str, torch.Tensor]:
        """The op's weight inputs of ``layer`` (``w, wci, wcf, wco, b``; zeros for the ones
        the module does not have)."""
        given = (None,) * 4 + (self._buffers["_zeros"], self._buffers["_zeros_h"])
        return {n: given[at] if name is None else self._parameters[name]
                for n, (at, name) in zip(OPS[self.op].input_names, self._args[layer])
                if n in _WEIGHTS}

    def forward(self, x: torch.Tensor, state=None, sequence_length=None):
        """Run the layers over ``x``; returns ``(output, (h_n, c_n))`` (see the class doc)."""
        if x.dim() not in (2, 3):
            raise ValueError(f"LSTM: input 'x' expected 3 dims ((T, B, I) or (B, T, I) with "
                             f"batch_first) or 2 (T, I), got shape {tuple(x.shape)}")
        unbatched = x.dim() == 2
        x = x.unsqueeze(1) if unbatched else x.transpose(0, 1) if self.batch_first else x
        T, B = x.shape[0], x.shape[1]
        # A step's Python runs in caches the kernels just went through: the route and the
        # zeros are decided once a call, not per layer (docs/performance.md)
        zeros = self._buffers["_zeros"]
        eager = eager_ok([x, zeros, *self._parameters.values(),
                          *(state if isinstance(state, (tuple, list)) else ())])
        h0, c0 = self._initial_state(state, B, unbatched, x, shared=eager)
        lengths = mask = None
        if sequence_length is None:
            steps, overload = T, INT_OVERLOAD
        else:
            lengths = _lengths(sequence_length, B)
            steps, overload = lengths.max(), "default"
            mask = (torch.arange(T, device=lengths.device)[:, None] < lengths[None, :])
            mask = mask.unsqueeze(-1).to(x.dtype)
        layer = layer_function(self.op, overload) if eager else None
        params, zeros_h = self._parameters, self._buffers["_zeros_h"]
        h_n, c_n = [], []
        for k in range(self.num_layers):
            given = (steps, x, c0[k], h0[k], zeros, zeros_h)
            args = tuple(given[at] if name is None else params[name] for at, name in self._args[k])
            if layer is not None:  # the last step's state comes copied, (1, B, H)
                cs, h, last_h, last_c = layer.apply(self.attrs, *args)
            else:
                out = call(self.op, overload, args, self.attrs)
                cs, h = out[1], out[6]
                last_h, last_c = (h[-1:], cs[-1:]) if T > 0 else (h0[k][None], c0[k][None])
            if lengths is not None:
                h = h * mask.to(h.device)
                last_h = _at_lengths(h, h0[k], lengths)[None]
                last_c = _at_lengths(cs, c0[k], lengths)[None]
            h_n.append(last_h)
            c_n.append(last_c)
            x = h
            if self.dropout and self.training and k < self.num_layers - 1:
                x = torch.nn.functional.dropout(x, self.dropout, training=True)
        output = x.squeeze(1) if unbatched else x.transpose(0, 1) if self.batch_first else x
        if len(h_n) == 1 and layer is not None and lengths is None:
            h_n, c_n = h_n[0], c_n[0]  # copies already
        else:
            h_n, c_n = torch.cat(h_n), torch.cat(c_n)
        if unbatched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)

    def _initial_state(self, state, B, unbatched: bool, x: torch.Tensor, shared: bool):
        """``(h_0, c_0)``, each a sequence of ``num_layers`` tensors `(B, H)`; for
        ``state=None`` zeros, with ``shared`` (the eager CPU route) a read-only tensor kept for
        the next call (the kernels only read it, and ``forward`` returns copies)."""
        shape = (self.num_layers, B, self.hidden_size)
        if state is None:
            if shared:
                zeros = (constant(shape[1:], x.dtype, 0.0),) * self.num_layers
            else:
                zeros = x.new_zeros(shape).unbind(0)
            return zeros, zeros
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"LSTM: state expected a pair (h_0, c_0), got "
                            f"{type(state).__name__}")
        pair = []
        for name, value in zip(("h_0", "c_0"), state):
            value = value.unsqueeze(1) if unbatched else value
            if tuple(value.shape) != shape:
                want = shape[:1] + shape[2:] if unbatched else shape
                got = tuple(value.shape)[:1] + tuple(value.shape)[2:] if unbatched \
                    else tuple(value.shape)
                raise ValueError(f"LSTM: state {name!r} expected shape (num_layers, B, H) = "
                                 f"{want}, got {got}")
            pair.append(value.unbind(0))
        return pair[0], pair[1]

    @torch.no_grad()
    def load_tf_weights(self, w, b, wci=None, wcf=None, wco=None, *, layer: int = 0) -> None:
        """Copy TF's weights of one layer into ``layer``.

        ``w`` `(I+H, 4H)` and ``b`` `(4H)` are ``BlockLSTM``'s inputs (``LSTMBlockFusedCell``'s
        ``kernel`` and ``bias``) in the gate layout of :attr:`op`; ``wci``, ``wcf``, ``wco``
        `(H)` its peepholes (``w_i_diag``, ``w_f_diag``, ``w_o_diag``), required with
        ``use_peephole`` and refused without. Arrays, tensors or TF variables.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"LSTM: layer expected 0 <= layer < {self.num_layers}, got {layer}")
        given = {"w": w, "b": b, "wci": wci, "wcf": wcf, "wco": wco}
        names = self._names[layer]
        for name, value in given.items():
            if name not in names:
                if name == "b" and not self.bias:
                    if value is not None and bool(_as_tensor(value).any()):
                        raise ValueError("LSTM: b is nonzero but the module has no bias "
                                         "(bias=False)")
                    continue
                if value is not None:
                    raise ValueError(f"LSTM: {name} ({TF_NAMES[name]}) given, but the module "
                                     f"has no peepholes (use_peephole=False)")
                continue
            if value is None:
                raise ValueError(f"LSTM: {name} ({TF_NAMES[name]}) is required: the module "
                                 f"has peepholes (use_peephole=True)")
            param = getattr(self, names[name])
            array = _as_tensor(value)
            if tuple(array.shape) != tuple(param.shape):
                raise ValueError(f"LSTM: {name} ({TF_NAMES[name]}) expected shape "
                                 f"{tuple(param.shape)}, got {tuple(array.shape)}")
            param.copy_(array)

    def tf_weights(self, layer: int = 0) -> dict[str, np.ndarray]:
        """The weights of ``layer`` as TF's op takes them: ``{"w", "b", "wci", "wcf", "wco"}``
        (NumPy copies; zeros for those the module lacks)."""
        return {n: t.detach().cpu().numpy().copy() for n, t in self.layer_inputs(layer).items()}

    @classmethod
    def from_tf(cls, w, b, wci=None, wcf=None, wco=None, **kwargs) -> "LSTM":
        """A one-layer :class:`LSTM` holding TF's weights (see :meth:`load_tf_weights`): sizes
        from ``w`` and ``b``, ``use_peephole`` from whether ``wci`` is given, the dtype of
        ``w``; ``kwargs`` as the constructor's (``forget_bias``, ``cell_clip``, ``op``, ...)."""
        w, b = _as_tensor(w), _as_tensor(b)
        if w.dim() != 2 or b.dim() != 1 or b.shape[0] % 4 or b.shape[0] != w.shape[1]:
            raise ValueError(f"LSTM.from_tf: expected w (I+H, 4H) and b (4H), got "
                             f"{tuple(w.shape)} and {tuple(b.shape)}")
        H = b.shape[0] // 4
        kwargs.setdefault("use_peephole", wci is not None)
        kwargs.setdefault("dtype", w.dtype)
        module = cls(w.shape[0] - H, H, **kwargs)
        module.load_tf_weights(w, b, wci, wcf, wco)
        return module


def _op_attrs(op_name: str, use_peephole, forget_bias, cell_clip) -> dict:
    """The op's attributes for the constructor's arguments (checked as the op checks them)."""
    op = OPS[op_name]
    attrs = {"use_peephole": use_peephole, "cell_clip": 0.0 if cell_clip is None else cell_clip}
    if "forget_bias" in op.attr_names:
        if forget_bias is not None:
            attrs["forget_bias"] = forget_bias
    elif forget_bias not in (None, 0, 0.0):
        raise ValueError(f"LSTM: {op_name} has no forget_bias (its forget bias is 0); got "
                         f"forget_bias={forget_bias!r}")
    return validate_attrs(op, attrs)


#: Where :meth:`LSTM.forward` finds each of the op's inputs other than the parameters: at
#: this index of the values it gives a layer (steps, x, c_0, h_0, the zeros standing for the
#: bias and for a peephole the layer lacks).
_GIVEN = {"seq_len_max": 0, "x": 1, "cs_prev": 2, "h_prev": 3, "b": 4, "wci": 5, "wcf": 5,
          "wco": 5}


def _arg_source(name: str, params: dict) -> tuple:
    """``(index, None)`` of op input ``name`` in :data:`_GIVEN`, or ``(None, parameter
    name)`` where the layer has it as a parameter."""
    return (None, params[name]) if name in params else (_GIVEN[name], None)


def _lengths(sequence_length, B) -> torch.Tensor:
    if not isinstance(sequence_length, torch.Tensor):
        sequence_length = torch.as_tensor(sequence_length)
    if sequence_length.dim() != 1 or sequence_length.shape[0] != B \
            or sequence_length.is_floating_point() or sequence_length.dtype == torch.bool:
        raise ValueError(f"LSTM: sequence_length expected integers of shape (B,) = ({B},), got "
                         f"{sequence_length.dtype} of shape {tuple(sequence_length.shape)}")
    return sequence_length.to(torch.int64)


def _at_lengths(values: torch.Tensor, initial: torch.Tensor, lengths: torch.Tensor):
    """Each row ``b``'s ``values[lengths[b] - 1, b]`` `(B, H)`, ``initial[b]`` where
    ``lengths[b]`` is 0."""
    if values.shape[0] == 0:
        return initial
    rows = torch.arange(values.shape[1], device=values.device)
    index = (lengths.to(values.device) - 1).clamp(min=0)
    return torch.where((lengths > 0).to(values.device)[:, None], values[index, rows], initial)


def _as_tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.from_numpy(np.array(value))
