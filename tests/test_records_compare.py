"""``lstm-tvm schedules --compare``: a kernel with its tuning records against the same kernel
with fewer, both built and timed in one process (:mod:`lstm_tvm.bench.records`).

The kernels run on this machine, whose records (its own key's or borrowed) hold the I = H = 256
tasks of the shipped databases on the AVX-512 CPUs lstm_tvm ships records for; elsewhere (an
AVX2 CPU, shipped records off) both kernels take the rule schedules, and the comparison says so
instead of timing.
"""

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from lstm_tvm import api, build, cli, reference, testing
from lstm_tvm._tvm import tvm
from lstm_tvm.registry import get_op
from lstm_tvm.bench import records as compare
from lstm_tvm.validation import plain_attrs

SIZE = 256
SHAPE = (4, 2, SIZE, SIZE)


@pytest.fixture(autouse=True)
def no_user_records(tmp_path, monkeypatch):
    """An empty user folder: the records are the shipped (own or borrowed) ones."""
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "user"))


def _spec(op: str):
    return build.make_spec(op, "float32", SIZE, SIZE, plain_attrs(get_op(op)), "llvm")


def test_without_user_records_both_kernels_take_the_same_records():
    spec = _spec("BlockLSTM")
    fewer, _ = compare.records_without(spec, "shipped")
    assert fewer == spec.tuned
    result = compare.compare("BlockLSTM", SHAPE, "shipped", turns=1)
    assert result.ratio is None and result.ms is None and result.records == result.against


@pytest.mark.parametrize("op", ["BlockLSTM", "BlockLSTMGrad"])
def test_the_kernel_without_records_is_built_and_matches_the_reference(op):
    spec = _spec(op)
    fewer, uses = compare.records_without(spec, "rules")
    assert fewer == () and uses == ()
    kernel = api.CompiledOp(dataclasses.replace(spec, tuned=fewer))
    T, B, I, H = SHAPE
    inputs = testing.make_inputs(op, T=T, B=B, I=I, H=H, seed=3)
    out = kernel(**{n: tvm.runtime.tensor(v) if v.ndim else v for n, v in inputs.items()})
    want = reference.run(op, inputs, dict(spec.attrs))
    for name, value in zip(out._fields, out):
        testing.assert_close(value.numpy(), want[name], "float32", f"{op}.{name}")


def test_rules_against_records_times_both_or_says_they_are_the_same():
    spec = _spec("BlockLSTM")
    result = compare.compare("BlockLSTM", SHAPE, "rules", turns=3, calls=2)
    assert result.against == "none: rule schedule"
    if not spec.tuned:  # no records here: nothing to time
        assert result.ratio is None and result.records == "none: rule schedule"
        return
    assert result.records != "none: rule schedule"
    assert result.ms > 0 and result.against_ms > 0
    low, high = result.quartiles
    assert low <= result.ratio <= high and np.isfinite([low, high]).all()


def test_unknown_against_is_refused():
    with pytest.raises(ValueError, match="against expected one of"):
        compare.records_without(_spec("BlockLSTM"), "mine")


def test_cli_prints_the_comparison():
    result = CliRunner().invoke(cli.main, [
        "schedules", "--ops", "BlockLSTM", "--sizes", f"{SIZE}x{SIZE}",
        "--compare", "x".join(map(str, SHAPE)), "--against", "rules", "--turns", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.startswith("op ") and "against /" in line)
    row = lines[header + 2]
    assert row.startswith("BlockLSTM") and "4x2x256x256" in row
    assert row.rstrip().endswith(")") or row.rstrip().endswith("same records")
    assert any(line.startswith("machine: ") for line in lines)


def test_cli_refuses_a_bad_shape():
    result = CliRunner().invoke(cli.main, ["schedules", "--ops", "BlockLSTM", "--compare",
                                           "4x2x256"])
    assert result.exit_code == 2 and "TxBxIxH" in result.output
