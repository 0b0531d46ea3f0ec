"""The compiled grad kernels against finite differences of the float64 forward reference.

A scalar loss ``L = sum(cs * C_cs) + sum(h * C_h)`` (random C's) through the forward op;
central differences in float64 give dL/d(x, cs_prev, h_prev, w, b, wci, wcf, wco). The float32
grad kernels (fed the forward's activations) must match them within float32's tolerance.
Peepholes on, clip inactive (cell_clip = 0), both gate layouts, seq_len_max < T included.
"""

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import reference, registry, testing

PARAMS = ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")


def _f32(arrays):
    return {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in arrays.items()}


def test_cell_grad_kernels_match_finite_differences():
    """LSTMBlockCellGrad + cell_grad_matmul give every gradient of one LSTMBlockCell step."""
    B, I, H = 3, 4, 5
    layout_op = "LSTMBlockCell"
    op = registry.get_op(layout_op)
    p = testing.make_inputs(layout_op, dtype="float64", B=B, I=I, H=H, seed=21)
    c_cs, c_h = np.random.default_rng(22).uniform(-1, 1, (2, B, H))
    attrs = {"forget_bias": 0.6, "cell_clip": 0.0, "use_peephole": True}

    def loss(q):
        out = reference.run(layout_op, q, attrs)
        return float((out["cs"] * c_cs).sum() + (out["h"] * c_h).sum())

    fwd = reference.run(layout_op, p, attrs)
    grad_in = _f32({**p, **fwd, "cs_grad": c_cs, "h_grad": c_h})
    grad_in = {n: grad_in[n] for n in registry.get_op(op.pair).input_names}
    cell = lstm_tvm.raw_ops.LSTMBlockCellGrad(**grad_in, use_peephole=True)
    mm = lstm_tvm.cell_grad_matmul(grad_in["x"], grad_in["h_prev"], grad_in["w"], cell.dicfo)
    got = {**mm._asdict(), "cs_prev_grad": cell.cs_prev_grad, "wci_grad": cell.wci_grad,
           "wcf_grad": cell.wcf_grad, "wco_grad": cell.wco_grad}
    for name in PARAMS:
        testing.assert_close(got[f"{name}_grad"], testing.fd_gradient(loss, p, name), "float32", f"d{name}")


@pytest.mark.parametrize("seq_len_max", [4, 2])
@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMV2"])
def test_sequence_grad_kernels_match_finite_differences(op_name, seq_len_max):
    B, I, H, T = 2, 3, 4, 4
    p = testing.make_inputs(op_name, dtype="float64", B=B, I=I, H=H, T=T,
                            seq_len_max=seq_len_max, seed=23)
    c_cs, c_h = np.random.default_rng(24).uniform(-1, 1, (2, T, B, H))
    attrs = {"cell_clip": 0.0, "use_peephole": True}

    def loss(q):
        out = reference.run(op_name, q, attrs)
        return float((out["cs"] * c_cs).sum() + (out["h"] * c_h).sum())

    grad_op = registry.get_op(op_name).pair
    fwd = reference.run(op_name, p, attrs)
    grad_in = _f32({**p, **fwd, "cs_grad": c_cs, "h_grad": c_h})
    grad_in = {n: grad_in[n] for n in registry.get_op(grad_op).input_names}
    got = getattr(lstm_tvm.raw_ops, grad_op)(**grad_in, use_peephole=True)
    for name in PARAMS:
        testing.assert_close(getattr(got, f"{name}_grad"), testing.fd_gradient(loss, p, name), "float32",
                             f"{grad_op}.d{name}")


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__]))
