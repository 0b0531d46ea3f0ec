"""CPU target traits and the schedules made from them, checked without each target's hardware:
LLVM's feature tables describe the target, its assembly shows the vector width used."""

import re

import numpy as np
import pytest

import lstm_tvm
from lstm_tvm import build, reference, testing
from lstm_tvm._tvm import tvm
from lstm_tvm.targets import resolve_target
from lstm_tvm.registry import get_op
from lstm_tvm.schedule.cpu import gemm
from lstm_tvm.schedule.traits import cpu_traits
from lstm_tvm.validation import validate_attrs

AVX2 = {"kind": "llvm", "mcpu": "haswell"}
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512"}
SSE2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
NEOVERSE = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}


@pytest.mark.parametrize("target, bits, registers, f16, tile", [
    (AVX512, 512, 32, False, (8, 32)),
    ({"kind": "llvm", "mcpu": "sapphirerapids"}, 512, 32, True, (8, 32)),
    (AVX2, 256, 16, False, (4, 16)),
    ({"kind": "llvm", "mcpu": "x86-64-v3"}, 256, 16, False, (4, 16)),
    (SSE2, 128, 16, False, (2, 16)),
    (NEON, 128, 32, False, (4, 16)),
    (NEOVERSE, 128, 32, True, (4, 16)),
])
def test_traits_come_from_llvms_tables_and_size_the_register_tile(target, bits, registers, f16,
                                                                   tile):
    traits = cpu_traits(resolve_target(target))
    assert (traits.vector_bits, traits.vector_registers, traits.f16_arithmetic) == (
        bits, registers, f16)
    # float32 accumulators: half the registers' lanes, the rest for operands
    assert traits.accumulators == registers // 2 * bits // 32
    got = gemm.default_tile(64, 1024, 256, traits=traits)
    assert (got.rows, got.cols) == tile
    assert got.rows * got.cols <= traits.accumulators


def test_the_host_target_is_described_by_its_own_cpu():
    host = cpu_traits(resolve_target("llvm"))
    named = cpu_traits(resolve_target({"kind": "llvm", "mcpu": lstm_tvm.targets.host_cpu()}))
    assert host == named


def _assembly(target, op="BlockLSTMV2"):
    spec = build.make_spec(op, "float32", 64, 64, validate_attrs(get_op(op), {}),
                           resolve_target(target))
    executable = build.build(spec)
    mod = getattr(executable, "mod", executable)
    for candidate in [mod, *mod.imports]:
        try:
            return candidate.inspect_source("asm")
        except Exception:  # noqa: BLE001 (a module without assembly: the host wrapper)
            continue
    raise AssertionError("no module with assembly")


@pytest.mark.parametrize("target, present, absent", [
    (AVX512, r"vfmadd\w+\s+.*%zmm", None),
    (AVX2, r"vfmadd\w+\s+.*%ymm", r"%zmm"),
    (NEON, r"fmla\s+v\d+\.4s", None),
])
def test_gemms_vectorise_at_the_targets_width(target, present, absent):
    asm = _assembly(target)
    assert re.search(present, asm), f"no {present} in the assembly for {target}"
    if absent:
        assert not re.search(absent, asm), f"{absent} in the assembly for {target}"


def test_an_avx2_build_matches_the_reference_on_this_cpu():
    if not tvm.target.codegen.llvm_cpu_has_features("avx2", resolve_target("llvm")):
        pytest.skip("this CPU has no AVX2")
    for op_name in ("BlockLSTMV2", "BlockLSTMGradV2"):
        f = lstm_tvm.compile(op_name, target=AVX2, input_size=24, cell_size=40,
                             use_peephole=True)
        for B in (1, 3, 9):
            inputs = testing.make_inputs(op_name, B=B, I=24, H=40, T=5, seed=B,
                                         attrs=f.attrs)
            got = f(**{k: tvm.runtime.tensor(v) if v.ndim else int(v)
                       for k, v in inputs.items()})
            ref = reference.run(op_name, inputs, f.attrs)
            for name in got._fields:
                testing.assert_close(np.asarray(getattr(got, name).numpy()), ref[name],
                                     "float32", f"{op_name}.{name} B={B}")
