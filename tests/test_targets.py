"""``lstm_tvm.targets``: a target resolved once, and what build specs keep of it."""

import json

import pytest

from lstm_tvm import build, registry, targets, validation
from lstm_tvm._tvm import tvm
from lstm_tvm.targets import resolve_target
from lstm_tvm.schedule.traits import cpu_traits, kernel_variant
from lstm_tvm.tuning import database

#: A CPU by model, one by triple alone, and a GPU: the three ways records keys are named.
CASES = [({"kind": "llvm", "mcpu": "haswell"}, "llvm-haswell", True),
         ("aarch64", "llvm-aarch64", True),
         ({"kind": "cuda", "arch": "sm_90"}, "cuda-sm_90", False)]


@pytest.mark.parametrize("given, key, cpu", CASES, ids=["haswell", "aarch64", "cuda"])
def test_a_resolved_target_holds_what_each_layer_asked_of_the_target(given, key, cpu):
    resolved = targets.resolve(given)
    target = resolve_target(given)
    assert resolved.key == str(target) and str(resolved.target) == str(target)
    assert resolved.records_key == key == database.records_key(target)
    assert resolved.cpu is cpu and resolved.kind == str(target.kind.name)
    assert resolved.traits == (cpu_traits(target) if cpu else None)
    assert resolved.variant(prepacked=True) == kernel_variant(target, prepacked=True)


def test_resolving_again_gives_the_same_value_and_a_spec_keeps_its_key():
    resolved = targets.resolve({"kind": "llvm", "mcpu": "haswell"})
    assert targets.resolve(resolved) is resolved
    assert targets.resolve(resolved.key) == resolved  # its JSON text resolves to it
    assert targets.resolve(tvm.target.Target(json.loads(resolved.key))) == resolved
    attrs = validation.validate_attrs(registry.get_op("BlockLSTM"), {})
    spec = build.make_spec("BlockLSTM", "float32", 8, 8, attrs, resolved, tuned=False)
    assert spec.target == resolved.key and spec.resolved == resolved
    assert spec == build.make_spec("BlockLSTM", "float32", 8, 8, attrs,
                                   {"kind": "llvm", "mcpu": "haswell"}, tuned=False)


def test_targets_differ_by_every_attribute():
    plain = targets.resolve({"kind": "llvm", "mcpu": "haswell"})
    other = targets.resolve({"kind": "llvm", "mcpu": "haswell", "mattr": ["-avx2"]})
    assert plain != other and plain.records_key == other.records_key
