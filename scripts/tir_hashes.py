"""Hashes of the scheduled TIR lstm_tvm builds, per op, dtype, target, size and weight form.

A refactoring that must not change generated code runs this before and after and compares:

    python scripts/tir_hashes.py --out before.json
    python scripts/tir_hashes.py --out after.json --compare before.json

Each case is what ``lstm_tvm.build.build`` hands to ``tvm.compile``: the PrimFuncs of
``build.primfuncs(spec)`` for the spec ``build.make_spec`` makes (tuning records attached as
``compile`` attaches them), plain and, where it applies, with prepacked weights. Per case it
records ``tvm_ffi.structural_hash`` and a SHA-256 of the TVMScript text of each function, plus
the tuning tasks and GEMM blocks the tuning session cuts from the kernel for that target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import tvm_ffi

from lstm_tvm import build, registry, testing, validation
from lstm_tvm.targets import resolve_target

#: Targets by a short name: the host as ``"llvm"`` resolves, AVX-512, AVX2, NEON, CUDA.
TARGETS = {
    "host": "llvm",
    "skylake-avx512": {"kind": "llvm", "mcpu": "skylake-avx512"},
    "haswell": {"kind": "llvm", "mcpu": "haswell"},
    "aarch64-neon": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
    "cuda-sm_90": {"kind": "cuda", "arch": "sm_90"},
}
DTYPES = ("float32", "float16")
SIZES = ((32, 32), (256, 256))
#: ``(T, B)`` of the tuning tasks recorded per case.
TASK_SHAPE = (16, 8)


def _attrs(op_name: str) -> dict:
    return validation.validate_attrs(registry.get_op(op_name),
                                     testing.op_attrs(op_name, {"use_peephole": True}))


def _func_hashes(funcs: dict) -> dict:
    return {name: {"structural_hash": str(tvm_ffi.structural_hash(func)),
                   "script_sha256": hashlib.sha256(func.script().encode()).hexdigest()}
            for name, func in sorted(funcs.items())}


def _tuning_view(op_name, dtype, size, target) -> dict:
    """The GEMM blocks (symbolic sizes) and the tasks at :data:`TASK_SHAPE` of the kernel
    the tuning session builds for ``target``."""
    from lstm_tvm.tuning.session import collect_tasks

    steps, batch = TASK_SHAPE
    tasks = collect_tasks([op_name], [dtype], [(steps, batch, *size)], target)
    return {"tasks": sorted(t.key for t in tasks)}


def cases(ops, targets, dtypes, sizes):
    for target_name in targets:
        for op_name in ops:
            for dtype in dtypes:
                for size in sizes:
                    yield target_name, op_name, dtype, size


def run(ops, targets, dtypes, sizes, with_tasks: bool) -> dict:
    out = {}
    for target_name, op_name, dtype, size in cases(ops, targets, dtypes, sizes):
        target = resolve_target(TARGETS[target_name])
        spec = build.make_spec(op_name, dtype, *size, _attrs(op_name), target)
        forms = {"plain": spec}
        packed = spec.with_prepacked_weights()
        if packed != spec:
            forms["prepacked"] = packed
        for form, s in forms.items():
            key = f"{target_name}/{op_name}/{dtype}/{size[0]}x{size[1]}/{form}"
            start = time.perf_counter()
            entry = {"tuned_blocks": sorted(name for name, _, _ in s.tuned),
                     "funcs": _func_hashes(build.primfuncs(s))}
            if with_tasks and form == "plain" and str(target.kind.name) == "llvm":
                entry.update(_tuning_view(op_name, dtype, size, target))
            out[key] = entry
            print(f"{key}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out


def compare(new: dict, old: dict) -> int:
    """Print the cases that differ; returns their count (cases missing on either side count)."""
    bad = 0
    for key in sorted(set(new) | set(old)):
        if new.get(key) != old.get(key):
            bad += 1
            print(f"DIFFERS: {key}")
    print(f"{len(set(new) & set(old))} cases compared, {bad} differ")
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the hashes here (JSON)")
    parser.add_argument("--compare", help="compare with this earlier output")
    parser.add_argument("--ops", nargs="*", default=list(registry.KERNEL_OPS))
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    parser.add_argument("--no-tasks", action="store_true", help="skip the tuning tasks")
    args = parser.parse_args(argv)
    result = run(args.ops, args.targets, args.dtypes, SIZES, not args.no_tasks)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as fh:
            old = json.load(fh)
        old = {k: v for k, v in old.items() if k in result}
        return 1 if compare(result, old) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
