"""The six ops as ONNX functions (``FunctionProto``) in :data:`~.domain.DOMAIN`.

``make_function(op_name)`` returns a function named like the op whose body uses only standard
``ai.onnx`` ops (opset :data:`~.domain.ONNX_OPSET`), so onnxruntime runs a model holding lstm_tvm
nodes without any custom kernel: it inlines a model-local function for a custom-domain node
that has no kernel. Semantics are TensorFlow's (:mod:`lstm_tvm.reference`):

- **Cell ops**: ``MatMul``/``Add`` for the gates, ``Split``, ``Sigmoid``/``Tanh``/``Mul``,
  the cell clip (``Where``); the grad returns ``dicfo`` in the op's gate layout and the batch-summed peephole
  grads (``ReduceSum``).
- **Input checks** first: ranks and dims agree with the registry (``T, B, I`` of ``x``, ``H`` of
  ``cs_prev``), ``0 <= seq_len_max <= T`` and ``use_peephole`` is 0 or 1, else onnxruntime
  fails at the node ``<Op>_input_check_...`` (see :mod:`._checks`) instead of computing
  garbage; a float type other than float32/float16 is a type error at session creation.
- **Sequence forward** (``BlockLSTM``, ``BlockLSTMV2``): ``x @ w[:I] + b`` for all steps in one
  ``MatMul``, then a ``Loop`` of ``seq_len_max`` steps carrying ``cs, h`` (``h @ w[I:]`` per
  step); the stacked outputs are ``Pad``-ded with zeros to ``T``: padded steps are zero in every
  output.
- **Sequence backward** (``BlockLSTMGrad``, ``BlockLSTMGradV2``): a ``Loop`` for
  ``t = seq_len_max-1 .. 0`` carrying ``dcs`` and ``dh`` and emitting ``dicfo[t]``; after it,
  ``x_grad`` (one batched ``MatMul``, padded with zeros), ``w_grad`` (one ``Gemm`` over all
  ``seq_len_max * B`` rows), ``b_grad`` and peephole grads (``ReduceSum``).

Attributes are function attributes with TF's defaults (``forget_bias``, ``cell_clip``,
``use_peephole``; ``use_peephole`` is required by the grad ops), read in the body through
``Constant`` nodes with ``ref_attr_name``. ``cell_clip`` clips ``cs`` to ``[-c, c]`` with
``c = cell_clip if cell_clip >= F32_TINY else inf`` (TF's rule,
:func:`lstm_tvm.validation.cell_clip_bound`: NaN, ``+-inf``, zero, negative values and float32
denormals do not clip) by compare-and-select (``Greater``/``Less``/``Where``,
not ``Clip``, whose NaN behaviour ONNX leaves open): NaN in ``cs`` stays NaN, as in TF and
lstm_tvm's kernels. ``use_peephole`` selects between two bodies with one
``If``: the branch without peephole never reads ``wci, wcf, wco`` (no multiply by zero, so NaN
in unused peephole weights does not leak) and returns zero peephole grads.

**Dtypes.** Every float input is cast to float32 and all arithmetic is float32; outputs are cast
back to the input type (``CastLike(out, x)``). The forward carries ``cs``/``h`` and the backward
``dcs``/``dh`` in float32 between steps, unrounded (as lstm_tvm's kernels). So a float16 model
computes what lstm_tvm's TVM kernels compute, more accurately than TF's half math (TF rounds the
state it feeds back).

onnxruntime logs a warning ("Loop had zero iterations ...") when ``seq_len_max`` is 0; the
results are still correct (the loop outputs are reshaped to ``(0, B, ...)``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from onnx import AttributeProto, FunctionProto, helper

from ..registry import OPS, OpSpec, get_op
from ..validation import F32_TINY
from . import _lstm_math as lm
from ._checks import after_checks, checked_inputs, scalar
from ._graph import BOOL, F32, I64, INT64_MAX, INT64_MIN, Graph
from .domain import DOMAIN, ONNX_OPSET, onnx_attr_default, onnx_attr_type

__all__ = ["make_function", "make_functions"]

_PEEPHOLES = ("wci", "wcf", "wco")


class _Ctx:
    """The function's top-level graph, its float32 casts and attribute constants."""

    def __init__(self, op: OpSpec):
        self.op = op
        self.g = Graph("v")
        self._f32: dict[str, str] = {}
        g = self.g
        self.one = g.const(1.0, np.float32, "one")
        self.forget_bias = None
        if "forget_bias" in op.attr_names:
            self.forget_bias = g.ref_constant("forget_bias", AttributeProto.FLOAT, "forget_bias")
        self.clip = None
        if "cell_clip" in op.attr_names:
            clip = g.ref_constant("cell_clip", AttributeProto.FLOAT, "cell_clip")
            tiny = g.const(F32_TINY, np.float32, "f32_tiny")
            active = g.op("GreaterOrEqual", clip, tiny)  # False for NaN
            hi = g.op("Where", active, clip, g.const(np.inf, np.float32, "inf"), hint="clip_hi")
            self.clip = (g.op("Neg", hi, hint="clip_lo"), hi)
        # Named for onnxruntime's error when a node lacks the attribute (the grad ops)
        flag = g.ref_constant("use_peephole", AttributeProto.INT, "use_peephole",
                              node_name=f"{op.name}_attribute_use_peephole_is_given")
        self._checked = {}
        self._checked["cs_prev"], self.n1, self._checked_zero = checked_inputs(
            g, op, flag, self.forget_bias)
        self.use_peephole = g.op("Cast", flag, to=BOOL, hint="peephole")

    def f32(self, name: str) -> str:
        """Input ``name`` cast to float32 (one Cast node in the top-level graph)."""
        if name not in self._f32:
            source = self._checked.get(name) or after_checks(self.g, name, self._checked_zero)
            self._f32[name] = self.g.op("Cast", source, to=F32, hint=name)
        return self._f32[name]

    def peephole_if(self, build, n_out: int) -> list[str]:
        """``If(use_peephole)``: ``build(graph, peep)`` with ``peep`` a dict of float32
        peephole weights (cast inside the branch) or None; returns the If's outputs."""
        branches = []
        for with_peep in (True, False):
            sub = self.g.sub()
            peep = ({p: sub.op("Cast", p, to=F32, hint=p) for p in _PEEPHOLES}
                    if with_peep else None)
            produced = set()
            outs = build(sub, peep)
            for node in sub.nodes:
                produced.update(node.output)
            # a branch output must be computed in the branch: copy outer-scope values
            outs = [o if o in produced else sub.op("Identity", o, hint="out") for o in outs]
            assert len(outs) == n_out
            branches.append(sub.graph("peephole" if with_peep else "no_peephole", [],
                                      [(o, F32, None) for o in outs]))
        return self.g.op("If", self.use_peephole, n_out=n_out, hint="branch",
                         then_branch=branches[0], else_branch=branches[1])


def _zeros_h(g: Graph, cs_prev: str) -> str:
    """Float32 zeros of shape `(H,)` (H read from the shape of ``cs_prev``)."""
    return g.op("ConstantOfShape", g.dim(cs_prev, 1), hint="zeros")


# --- cell ops --------------------------------------------------------------------------------

def _cell_forward(c: _Ctx) -> list[str]:
    g, op = c.g, c.op
    xh = g.op("Concat", c.f32("x"), c.f32("h_prev"), axis=-1)
    gates4 = g.add(g.op("MatMul", xh, c.f32("w")), c.f32("b"))
    pre = lm.split_gates(g, gates4, op.gates)
    cs_prev = c.f32("cs_prev")

    def build(sub, peep):
        out = lm.forward_step(sub, pre, cs_prev, peep=peep, forget_bias=c.forget_bias,
                              clip=c.clip)
        return [out[k] for k in op.output_names]

    return c.peephole_if(build, len(op.outputs))


def _peephole_grads(g: Graph, parts: dict, cs_prev: str, cs: str, axes: list[int]):
    axes_c = g.const(axes)
    return [g.op("ReduceSum", g.mul(parts[k], state), axes_c, keepdims=0, hint=f"w{k}_grad")
            for k, state in (("i", cs_prev), ("f", cs_prev), ("o", cs))]


def _cell_backward(c: _Ctx) -> list[str]:
    op = c.op
    act = {k: c.f32(k) for k in ("i", "f", "o", "ci", "co")}
    cs_prev, cs = c.f32("cs_prev"), c.f32("cs")

    def build(sub, peep):
        st = lm.backward_step(sub, act, cs_prev, c.f32("cs_grad"), c.f32("h_grad"), c.one,
                              peep=peep)
        dicfo = lm.join_gates(sub, st, op.gates)
        if peep is None:
            peeps = [_zeros_h(sub, cs_prev) for _ in _PEEPHOLES]
        else:
            peeps = _peephole_grads(sub, st, cs_prev, cs, [0])
        return [st["cs_prev_grad"], dicfo, *peeps]

    return c.peephole_if(build, len(op.outputs))


# --- sequence ops ----------------------------------------------------------------------------

class _Seq:
    """Names shared by the sequence ops: sizes, ``seq_len_max``, the split of ``w``."""

    def __init__(self, c: _Ctx):
        g = self.g = c.g
        self.T, self.B, self.I, self.H = (g.dim(*c.op.size_sources[s]) for s in "TBIH")
        self.n1 = c.n1  # seq_len_max, checked to lie in 0..T (see _checks)
        self.n = scalar(g, self.n1)
        w, zero = c.f32("w"), g.const([0])
        self.wx = g.slice(w, zero, self.I, axis=0)
        self.wh = g.slice(w, self.I, g.const([INT64_MAX]), axis=0)
        zeros = g.const([0, 0, 0])
        self.pads = g.op("Concat", zeros, g.minus(self.T, self.n1), g.const([0, 0]), axis=0)

    def first_n(self, data: str) -> str:
        """``data[:seq_len_max]`` along axis 0."""
        return self.g.slice(data, self.g.const([0]), self.n1, axis=0)

    def stacked(self, data: str, last_dim: str) -> str:
        """A Loop scan output as `(seq_len_max, B, last)` (ORT gives shape (0,) for 0 steps)."""
        shape = self.g.op("Concat", self.n1, self.B, last_dim, axis=0)
        return self.g.op("Reshape", data, shape, allowzero=1)

    def pad(self, data: str) -> str:
        """Pad `(seq_len_max, B, k)` with zero steps to `(T, B, k)`."""
        return self.g.op("Pad", data, self.pads)


def _loop_body(g: Graph, state_names: Iterable[str]):
    """Names of a Loop body's inputs: iteration, condition, carried states."""
    return g.name("it"), g.name("cond"), [g.name(s) for s in state_names]


def _loop_graph(body: Graph, it, cond, carried_in, carried_out, scans):
    cond_out = body.op("Identity", cond, hint="cond_out")
    scans = [body.op("Identity", s, hint="scan") for s in scans]
    return body.graph(
        "step", [(it, I64, []), (cond, BOOL, [])] + [(s, F32, None) for s in carried_in],
        [(cond_out, BOOL, [])] + [(s, F32, None) for s in carried_out + scans])


def _seq_forward(c: _Ctx) -> list[str]:
    g, op, s = c.g, c.op, _Seq(c)
    gx = g.add(g.op("MatMul", c.f32("x"), s.wx), c.f32("b"))  # (T, B, 4H), all steps at once
    outs = op.output_names

    def build(sub, peep):
        body = sub.sub()
        it, cond, (cs_c, h_c) = _loop_body(body, ("cs", "h"))
        gates4 = body.add(body.op("Gather", gx, it, axis=0), body.op("MatMul", h_c, s.wh))
        st = lm.forward_step(body, lm.split_gates(body, gates4, op.gates), cs_c, peep=peep,
                             forget_bias=c.forget_bias, clip=c.clip)
        graph = _loop_graph(body, it, cond, [cs_c, h_c], [st["cs"], st["h"]],
                            [st[k] for k in outs])
        loop = sub.op("Loop", s.n, "", c.f32("cs_prev"), c.f32("h_prev"), n_out=2 + len(outs),
                      body=graph, hint="loop")
        return loop[2:]

    return [s.pad(s.stacked(o, s.H)) for o in c.peephole_if(build, len(outs))]


def _seq_backward(c: _Ctx) -> list[str]:
    g, op, s = c.g, c.op, _Seq(c)
    whT = g.op("Transpose", s.wh, hint="whT")
    first = g.const([0])

    def prevs(state, cur):  # [state, cur[0], ..., cur[n-2]]: the previous step's state
        return s.first_n(g.op("Concat", g.op("Unsqueeze", c.f32(state), first), c.f32(cur),
                              axis=0))

    cs_prevs, h_prevs = prevs("cs_prev", "cs"), prevs("h_prev", "h")
    act = {k: c.f32(k) for k in ("i", "f", "o", "ci", "co")}
    last = g.minus(s.n, g.const(1))
    zeros = g.op("ConstantOfShape", g.op("Shape", c.f32("cs_prev")), hint="zeros")

    def build(sub, peep):
        body = sub.sub()
        it, cond, (dcs_c, dh_c) = _loop_body(body, ("dcs", "dh"))
        t = body.minus(last, it)  # t = seq_len_max - 1 - it

        def at(v):
            return body.op("Gather", v, t, axis=0)

        st = lm.backward_step(
            body, {k: at(v) for k, v in act.items()}, at(cs_prevs),
            body.add(at(c.f32("cs_grad")), dcs_c), body.add(at(c.f32("h_grad")), dh_c),
            c.one, peep=peep)
        dicfo = lm.join_gates(body, st, op.gates)
        dh = body.op("MatMul", dicfo, whT, hint="dh")
        graph = _loop_graph(body, it, cond, [dcs_c, dh_c], [st["cs_prev_grad"], dh], [dicfo])
        return sub.op("Loop", s.n, "", zeros, zeros, n_out=3, body=graph, hint="loop")

    dcs, dh, dicfo_rev = c.peephole_if(build, 3)
    G = g.dim(c.f32("w"), 1)
    dicfo = g.slice(s.stacked(dicfo_rev, G), g.const([-1]), g.const([INT64_MIN]), axis=0,
                    step=-1)  # back to time order, (n, B, 4H)
    x_grad = s.pad(g.op("MatMul", dicfo, g.op("Transpose", s.wx)))
    rows = g.op("Mul", s.n1, s.B)
    xh = g.op("Concat", s.first_n(c.f32("x")), h_prevs, axis=2)
    xh2 = g.op("Reshape", xh, g.op("Concat", rows, g.dim(c.f32("w"), 0), axis=0), allowzero=1)
    d2 = g.op("Reshape", dicfo, g.op("Concat", rows, G, axis=0), allowzero=1)
    w_grad = g.op("Gemm", xh2, d2, transA=1, hint="w_grad")
    b_grad = g.op("ReduceSum", d2, g.const([0]), keepdims=0, hint="b_grad")

    def peep_grads(sub, peep):
        if peep is None:
            return [_zeros_h(sub, c.f32("cs_prev")) for _ in _PEEPHOLES]
        parts = lm.split_gates(sub, dicfo, op.gates)
        return _peephole_grads(sub, parts, cs_prevs, s.first_n(c.f32("cs")), [0, 1])

    wci, wcf, wco = c.peephole_if(peep_grads, 3)
    return [x_grad, dcs, dh, w_grad, wci, wcf, wco, b_grad]


_BUILDERS = {("cell", "forward"): _cell_forward, ("cell", "backward"): _cell_backward,
             ("sequence", "forward"): _seq_forward, ("sequence", "backward"): _seq_backward}


def make_function(op_name: str) -> FunctionProto:
    """The ONNX function implementing registry op ``op_name`` (see the module doc)."""
    op = get_op(op_name)
    c = _Ctx(op)
    outs32 = _BUILDERS[(op.kind, op.direction)](c)
    for name, out in zip(op.output_names, outs32):
        c.g.op("CastLike", out, "x", outputs=[name])
    required = [a.name for a in op.attrs if a.required]
    defaults = [helper.make_attribute(a.name, onnx_attr_default(a), attr_type=onnx_attr_type(a))
                for a in op.attrs if not a.required]
    return helper.make_function(
        DOMAIN, op.name, list(op.input_names), list(op.output_names), c.g.nodes,
        [helper.make_opsetid("", ONNX_OPSET)], attributes=required, attribute_protos=defaults,
        doc_string=f"{op.doc} Standard ONNX ops, float32 arithmetic (lstm_tvm.onnx.functions).")


def make_functions(op_names: Iterable[str] | None = None) -> list[FunctionProto]:
    """:func:`make_function` for each of ``op_names`` (default: all registry ops)."""
    return [make_function(n) for n in (OPS if op_names is None else op_names)]
