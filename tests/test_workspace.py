"""Scratch memory of the sequence kernels: what grows with the number of steps.

The sequence backward keeps the stacked gate gradients ``dicfo`` (T*B rows) and otherwise
only scratch of the size of the state or of ``w``: nothing per step. The allocations are read
off the kernels built at two fixed sequence lengths.
"""

import numpy as np
import pytest
from tvm.sym import Analyzer

from lstm_tvm import registry, testing, validation
from lstm_tvm.build import kernel_func
from lstm_tvm.kernels import KernelVariant
from lstm_tvm.kernels.block_lstm import PACK_FROM_ROWS

B, I, H = 3, 5, 4


def _scratch_bytes(op_name, dtype, steps):
    """Bytes of every scratch buffer of ``op_name``'s kernel at ``T = steps``, by name."""
    attrs = validation.validate_attrs(registry.get_op(op_name), {"use_peephole": True})
    func = kernel_func(op_name, dtype, I, H, attrs, KernelVariant().with_sizes(T=steps, B=B))
    found = {buf.name: int(np.prod([int(Analyzer().simplify(e)) for e in buf.shape]))
             * np.dtype(buf.dtype).itemsize for buf in testing.allocations(func)}
    assert found, "no scratch buffer found: the walk missed the kernel's blocks"
    return found


#: The two sequence lengths compared: both of ``PACK_FROM_ROWS`` rows or more (shorter
#: forwards run a version of their own that reads ``w`` in place).
SHORT, LONG = 8, 40


def _growth(op_name, dtype, short=SHORT, long=LONG):
    a, b = _scratch_bytes(op_name, dtype, short), _scratch_bytes(op_name, dtype, long)
    assert set(a) == set(b)
    return {name: b[name] - a[name] for name in b if b[name] != a[name]}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name", ["BlockLSTMGrad", "BlockLSTMGradV2"])
def test_sequence_backward_grows_only_by_the_gate_gradients(op_name, dtype):
    growth = _growth(op_name, dtype)
    assert growth == {"dicfo": (LONG - SHORT) * B * 4 * H * 4}, growth


@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMV2"])
def test_sequence_forward_grows_only_by_the_input_projections(op_name):
    assert SHORT * B >= PACK_FROM_ROWS
    growth = _growth(op_name, "float32")
    assert growth == {"xw": (LONG - SHORT) * B * 4 * H * 4}, growth
