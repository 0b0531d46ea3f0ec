"""Tuning: MetaSchedule sessions, the JSON databases, and tuned kernels against the reference.

The session test runs a real (small) MetaSchedule search; the other tests write records from
the tuning space directly (sampled schedules, timed here), which checks the database round
trip and that every schedule the space can produce computes the right thing in the kernels.
"""


import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm_ffi
from click.testing import CliRunner
from tvm.sym import Analyzer

import lstm_tvm
from lstm_tvm import build, cli, env, reference, registry, testing, validation
from lstm_tvm._tvm import SBlock, Schedule, tirx
from lstm_tvm.targets import resolve_target
from lstm_tvm.kernels import KernelVariant
from lstm_tvm.kernels.contract import SHORT_ROWS
from lstm_tvm.kernels.block_lstm import PACK_FROM_ROWS
from lstm_tvm.schedule.traits import cpu_traits
from lstm_tvm.tuning import collect_tasks, database, space
from lstm_tvm.testing import commit_sampled_records as _commit_sampled_records
from lstm_tvm.tuning import tasks as task_mod

SEQ_OPS = ("BlockLSTM", "BlockLSTMV2", "BlockLSTMGrad", "BlockLSTMGradV2")
ALL_OPS = ("LSTMBlockCell", "LSTMBlockCellGrad") + SEQ_OPS


@pytest.fixture
def schedules(tmp_path, monkeypatch):
    """An empty user schedules root and no shipped records, used by compile() and raw_ops for
    the test's duration."""
    root = tmp_path / "schedules"
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(root))
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "0")
    return root


def _record_count(folder) -> int:
    return sum(1 for _ in open(folder / database.RECORD_FILE))


def _check_against_reference(op_name, I, H, shapes, attrs):
    for T, B in shapes:
        inputs = testing.make_inputs(op_name, B=B, I=I, H=H, T=T, seed=(T or 1) * 7 + B)
        got = lstm_tvm.raw_ops.run(op_name, inputs, attrs)
        ref = reference.run(op_name, inputs, attrs)
        for name in got._fields:
            testing.assert_close(getattr(got, name), ref[name], "float32", f"{op_name}.{name}")


def _tune_cli(args):
    """``lstm-tvm tune ARGS`` in a child process (MetaSchedule configures process-wide logging
    and worker pools; a child keeps them out of the test run)."""
    return subprocess.run([sys.executable, "-m", "lstm_tvm", "tune", *args], check=False,
                          capture_output=True,
                          text=True, timeout=900, env=dict(os.environ))


def _only_task(ops, shape):
    (task,) = collect_tasks(ops, ["float32"], [shape])
    return task


def _host_space_size(task) -> int:
    """The size of ``task``'s space as a session tuning for this machine searches it (its tiles
    follow the host's vector registers: AVX2 and AVX-512 spaces differ)."""
    return space.space_size(task, cpu_traits(resolve_target()))


def test_tune_command_writes_database_resumes_and_is_applied(schedules):
    # one task, gates 8x16x8: a small space (8 to 12 schedules) to search to its end
    size = _host_space_size(_only_task(["LSTMBlockCell"], (1, 5, 4, 4)))
    args = ["--ops", "LSTMBlockCell", "--shapes", "1x5x4x4", "--trials", "2", "--seed", "1"]
    result = _tune_cli(args)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = database.database_dir(resolve_target())
    assert folder.parent == schedules
    assert (folder / database.WORKLOAD_FILE).exists()
    assert _record_count(folder) == 2
    assert "gates 8x16x8" in result.stdout
    result = _tune_cli(args)  # resumes: the task already has its trials
    assert result.returncode == 0, result.stdout + result.stderr
    assert _record_count(folder) == 2
    # more trials than the space holds, from scratch (a resumed search may measure a schedule
    # on record again): every schedule once, and said so
    more = [*args[:-4], "--trials", str(size + 1), "--seed", "1", "--schedules-dir",
            str(schedules.parent / "all")]
    result = _tune_cli(more)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _record_count(schedules.parent / "all" / folder.name) == size
    assert (f"space exhausted after {size} distinct schedules ({size + 1} trials asked)"
            in result.stdout)
    spec = build.make_spec("LSTMBlockCell", "float32", 4, 4,
                           {"forget_bias": 1.0, "cell_clip": 3.0, "use_peephole": False})
    assert [name for name, _, _ in spec.tuned] == ["gates"]
    _check_against_reference("LSTMBlockCell", 4, 4, [(None, 5), (None, 13)],
                             {"use_peephole": False})


@pytest.mark.parametrize("seed", [0, 5])
def test_every_sampled_schedule_matches_the_reference(schedules, seed):
    target = resolve_target()
    I, H = 16, 8
    db = database.open_database(database.database_dir(target), create=True)
    _commit_sampled_records(db, target, collect_tasks(ALL_OPS, ["float32"], [(9, 4, I, H)]), seed)
    for op_name in ALL_OPS:
        attrs = {"use_peephole": True}
        if op_name in ("LSTMBlockCell", "BlockLSTM", "BlockLSTMV2"):
            attrs["cell_clip"] = 0.0
        spec = build.make_spec(op_name, "float32", I, H, testing.op_attrs(op_name, attrs))
        assert bool(spec.tuned) == (op_name != "LSTMBlockCellGrad"), op_name  # it has no GEMM
        failures = []
        build.primfunc(spec, failures)
        assert failures == [], (op_name, failures)  # every trace replayed on the kernel
        shapes = [(9, 4), (3, 11), (20, 1)] if op_name in SEQ_OPS else [(None, 4), (None, 11)]
        _check_against_reference(op_name, I, H, shapes, attrs)
    rng = np.random.default_rng(seed)
    B = 13
    args = [rng.uniform(-1, 1, s).astype("float32")
            for s in ((B, I), (B, H), (I + H, 4 * H), (B, 4 * H))]
    got, ref = lstm_tvm.cell_grad_matmul(*args), reference.cell_grad_matmul(*args)
    for name in got._fields:
        testing.assert_close(getattr(got, name), ref[name], "float32", name)


def test_records_of_another_machine_are_not_applied(schedules):
    host = resolve_target()
    # a CPU the host does not borrow from: another vendor's (an x86 CPU borrows only from its
    # own vendor's CPUs of the same vector extension; any x86 CPU is foreign to an Arm host)
    other = resolve_target({"kind": "llvm", "mcpu": "znver4" if "intel" in
                            database.isa_class(host) else "skylake-avx512"})
    assert not database.compatible(host, other)
    task_list = collect_tasks(["BlockLSTMGradV2"], ["float32"], [(4, 2, 8, 8)])
    # in the other machine's folder, and misfiled into the host's folder
    for folder in (database.database_dir(other), database.database_dir(host)):
        db = database.open_database(folder, create=True)
        _commit_sampled_records(db, other, task_list, 0)
    spec = build.make_spec("BlockLSTMGradV2", "float32", 8, 8, {"use_peephole": False})
    assert spec.tuned == ()
    assert database.best_by_task(other)  # the other machine does see its own records
    spec_other = build.make_spec("BlockLSTMGradV2", "float32", 8, 8, {"use_peephole": False},
                                 target=other)
    assert {name for name, _, _ in spec_other.tuned} == {t.name for t in task_list}


def _x86(mcpu):
    return resolve_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})


def _traces(spec) -> dict:
    return {name: trace for name, _, trace in spec.tuned}


def test_user_records_come_before_shipped_ones_block_by_block(schedules, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(env, "shipped_schedules_dir", lambda: shipped)
    host = resolve_target()
    task_list = collect_tasks(["BlockLSTMGradV2"], ["float32"], [(4, 2, 8, 8)])
    mine = next(t for t in task_list
                if len(space.designs(t, Schedule(task_mod.workload(t), seed=1))) > 1)
    _commit_sampled_records(database.open_database(shipped / database.records_key(host), True),
                            host, task_list, 0)
    attrs = {"use_peephole": False}
    from_shipped = _traces(build.make_spec("BlockLSTMGradV2", "float32", 8, 8, attrs))
    assert set(from_shipped) == {t.name for t in task_list}
    db = database.open_database(database.database_dir(host), create=True)
    for seed in range(1, 9):  # until the user's best schedule differs from the shipped one
        _commit_sampled_records(db, host, [mine], seed)
        best = database.best_by_task(host)[mine]
        if database.trace_to_json(best.trace) != from_shipped[mine.name]:
            break
    assert database.trace_to_json(best.trace) != from_shipped[mine.name]
    assert [s.origin for s in database.sources(host)] == ["user", "shipped"]
    both = _traces(build.make_spec("BlockLSTMGradV2", "float32", 8, 8, attrs))
    assert both[mine.name] == database.trace_to_json(best.trace)
    assert {k: v for k, v in both.items() if k != mine.name} == \
        {k: v for k, v in from_shipped.items() if k != mine.name}
    _check_against_reference("BlockLSTMGradV2", 8, 8, [(3, 2)], attrs)


def test_a_cpu_without_records_borrows_those_of_its_isa(schedules, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(env, "shipped_schedules_dir", lambda: shipped)
    donor = _x86("skylake-avx512")
    task_list = collect_tasks(["BlockLSTM"], ["float32"], [(4, 2, 8, 8)])
    _commit_sampled_records(database.open_database(shipped / database.records_key(donor), True),
                            donor, task_list, 0)
    full_attrs = validation.validate_attrs(registry.get_op("BlockLSTM"), {"use_peephole": False})
    for mcpu, borrows in (("icelake-server", True), ("sapphirerapids", True), ("znver4", False),
                          ("haswell", False), ("x86-64-v4", False), ("x86-64", False)):
        target = _x86(mcpu)
        found = database.sources(target)
        assert [(s.key, s.borrowed) for s in found] == ([("llvm-skylake-avx512", True)]
                                                        if borrows else []), mcpu
        spec = build.make_spec("BlockLSTM", "float32", 8, 8, full_attrs,
                               target=target)
        assert bool(spec.tuned) == borrows, mcpu
        assert ("borrowed from llvm-skylake-avx512" in database.describe_use(target)) == borrows
    arm = resolve_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})
    assert database.sources(arm) == ()
    shown = CliRunner().invoke(cli.main, ["schedules", "--target", json.dumps(
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "icelake-server"})])
    assert shown.exit_code == 0, shown.output
    assert "target: llvm-icelake-server (x86_64 avx512f intel)" in shown.output
    row = ["shipped", "llvm-skylake-avx512", "x86_64", "avx512f", "intel", str(len(task_list)),
           "borrowed"]
    assert any(line.split()[:7] == row for line in shown.output.splitlines()), shown.output
    assert shown.output.splitlines()[-1] == (
        f"uses: borrowed from llvm-skylake-avx512 (same ISA), shipped records in "
        f"{shipped / 'llvm-skylake-avx512'}")
    # records of its own come first; the borrowed ones stand in for what they lack
    own = _x86("icelake-server")
    _commit_sampled_records(database.open_database(database.database_dir(own), True), own,
                            task_list[:1], 0)
    assert [(s.origin, s.key, s.borrowed) for s in database.sources(own)] == [
        ("user", "llvm-icelake-server", False), ("shipped", "llvm-skylake-avx512", True)]


def test_shipped_records_can_be_turned_off(schedules, monkeypatch):
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "1")
    origins = [origin for origin, _ in env.schedule_roots()]
    assert origins == (["user", "shipped"] if env.shipped_schedules_dir() else ["user"])
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "off")
    assert [origin for origin, _ in env.schedule_roots()] == ["user"]


def test_space_choices_divide_what_the_kernels_guarantee():
    for task in collect_tasks(ALL_OPS, ["float32", "float16"],
                              [(3, 5, 7, 9), (64, 32, 256, 256), (100, 64, 512, 512)]):
        c = space.choices(task)
        assert all(task.m_multiple % r == 0 for r in c["rows"]), task
        assert all(task.N % v == 0 for v in c["cols"]), task
        assert all(task.n_multiple % v == 0 for v in c["cols"] if task.n_multiple), task
        assert all(task.k_multiple % v == 0 for v in c["k_unroll"] + c["k_block"]), task


def test_per_step_gemms_are_tuned_without_reduction_slabs():
    """The GEMMs inside the time loops run every step, and the weight gradient's GEMM runs
    once per chunk of rows it reduces over: their space never cuts the reduction, and records
    of the same GEMM outside such a loop do not apply to them."""
    short = f"_rows{SHORT_ROWS}"
    # the sequence kernels' products below GATE_ROWS_BELOW rows (blocks gates_few<B>,
    # dh_few<B>) run with their gate math, a chunk of units at a time: not tuning tasks
    gates = {"gates", "gates" + short}
    # a forward of fewer than PACK_FROM_ROWS rows runs a version of its own (w read in place),
    # which tuning tasks, cut at fixed sizes, leave out at any size: 4 steps of one row too
    assert 4 * 1 < PACK_FROM_ROWS
    for op_name, in_loops in (("BlockLSTM", gates | {name + "_short" for name in gates}),
                              ("BlockLSTMGrad", {"dh", "dh" + short, "w_grad",
                                                 "w_grad_tail", "w_grad_tail_alone"})):
        attrs = validation.validate_attrs(registry.get_op(op_name), {"use_peephole": False})
        blocks = task_mod.kernel_gemms(op_name, "float32", 512, 512, attrs,
                                       KernelVariant())
        assert {b.name for b in blocks if b.per_step} == in_loops
        for name in (n for n in in_loops if not n.endswith("_short")):
            # SHORT_ROWS rows run *_rows4; w_grad_tail the 120 rows that chunks of 128 leave
            # of 4 x 62 (rounded up to ROW_TILE: 120), w_grad_tail_alone the 120 rows of
            # 4 x 30, fewer than a chunk
            batch = {"w_grad_tail": 62, "w_grad_tail_alone": 30}.get(
                name, SHORT_ROWS if name.endswith(short) else 64)
            tasks = task_mod.tasks_for(op_name, "float32", 512, 512, attrs, 4, batch,
                                       KernelVariant())
            assert not any(t.name.endswith("_short") for t in tasks)
            task = next(t for t in tasks if t.name == name)
            assert task.per_step and task.K >= 120 and space.choices(task)["k_block"] == []
            block = next(b for b in blocks if b.name == name)
            assert task.matches(block)
            assert not dataclasses.replace(task, per_step=False).matches(block)


def _kernel_gemm_extents(func) -> dict:
    """Name -> ``(M, N, K)`` of the GEMM-shaped blocks of a kernel: reductions over one
    iterator with two spatial ones."""
    found = {}

    def visit(block):
        kinds = [iv.iter_type for iv in block.iter_vars]
        if kinds == [tirx.IterVar.DataPar, tirx.IterVar.DataPar, tirx.IterVar.CommReduce]:
            found[block.name_hint] = tuple(iv.dom.extent for iv in block.iter_vars)

    tvm_ffi.structural_walk(func.body, [(SBlock, visit)])
    return found


@pytest.mark.parametrize("op_name", ["LSTMBlockCell", "BlockLSTM", "BlockLSTMGrad",
                                     "CellGradMatmul"])
def test_cuda_records_are_looked_up_for_the_gpu_kernels_gemms(op_name):
    """For a CUDA target the tuning records are looked up for the GEMM blocks of the kernel
    that is built, its GPU form: not those of the CPU form (small-batch versions, cut rows,
    tail chunks), which a GPU kernel does not have."""
    attrs = validation.validate_attrs(registry.get_op(op_name),
                                      testing.op_attrs(op_name, {"use_peephole": True}))
    spec = build.make_spec(op_name, "float32", 40, 48, attrs,
                           {"kind": "cuda", "arch": "sm_90"}, tuned=False)
    assert not spec.variant.cpu
    built = _kernel_gemm_extents(build.kernel_func(
        op_name, "float32", 40, 48, dict(spec.attrs), spec.variant))
    assert [use.block for use in build.record_uses(spec)] == list(built)
    text = Analyzer().simplify  # the two kernels' T and B are variables of their own
    for block in build.gemm_blocks(spec):
        assert ([str(text(e)) for e in (block.M, block.N, block.K)]
                == [str(text(e)) for e in built[block.name]]), block.name


def test_records_keys_name_the_machine():
    assert database.records_key(resolve_target({"kind": "llvm", "mcpu": "znver4"})) == "llvm-znver4"
    assert database.records_key(resolve_target({"kind": "cuda", "arch": "sm_90"})) == "cuda-sm_90"


def test_an_unreadable_database_is_ignored_with_a_warning(schedules, caplog):
    folder = database.database_dir(resolve_target())
    folder.mkdir(parents=True)
    (folder / database.WORKLOAD_FILE).write_text("")
    (folder / database.RECORD_FILE).write_text('[0, [[["SampleCat')  # cut off mid-write
    spec = build.make_spec("BlockLSTMGradV2", "float32", 8, 8, {"use_peephole": False})
    assert spec.tuned == ()
    assert "ignoring the tuning database" in caplog.text
    _check_against_reference("BlockLSTMGradV2", 8, 8, [(3, 2)], {"use_peephole": False})


def test_tuning_a_cuda_target_is_refused_clearly(schedules):
    from lstm_tvm.tuning import tune

    with pytest.raises(ValueError, match="tuning cuda targets is not supported"):
        tune(["LSTMBlockCell"], target={"kind": "cuda", "arch": "sm_90"}, progress=False)
    assert not schedules.exists()


def _distinct_schedules_on_record(folder, task) -> int:
    """The distinct scheduled modules among ``task``'s records in the database in ``folder``."""
    import tvm_ffi

    found = set()
    for record in database.open_database(folder).get_all_tuning_records():
        if task_mod.task_of(record.workload.mod) == task:
            sch = Schedule(task_mod.workload(task))
            record.trace.apply_to_schedule(sch, remove_postproc=True)
            found.add(tvm_ffi.structural_hash(sch.mod))
    return len(found)


def test_tune_keeps_metaschedule_logs_off_the_console(schedules, tmp_path, monkeypatch, capfd):
    import logging
    import re

    from lstm_tvm.tuning import tune

    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(tmp_path / "cache"))
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    before = (ms_logger.handlers[:], ms_logger.level, ms_logger.propagate)
    # two tasks: MetaSchedule's logger set-up for the first sent the second's logs to stdout
    results = tune(["LSTMBlockCell"], ["float32"], [(1, 8, 16, 16), (1, 5, 8, 16)], trials=1,
                   seed=0)
    out, err = capfd.readouterr()
    assert [r.trials for r in results] == [1, 1]
    assert out == ""
    bar = [text for text in re.split(r"[\r\n]+", err) if text.strip()]
    assert bar and all(re.search(r"\| \d+/2 \[.*trial", text) for text in bar), err
    logs = "".join(p.read_text() for p in (tmp_path / "cache" / "tuning-logs").glob("*/*.log"))
    for r in results:
        assert f'Initializing Task #0: "{r.task.key}"' in logs
    assert (ms_logger.handlers, ms_logger.level, ms_logger.propagate) == before


def test_tune_says_when_a_task_exhausts_its_space(schedules, tmp_path, monkeypatch):
    from lstm_tvm.tuning import session, tune

    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(tmp_path / "cache"))
    args = (["LSTMBlockCell"], ["float32"], [(1, 5, 4, 4)])
    size = _host_space_size(_only_task(args[0], args[2][0]))  # one task, gates 8x16x8
    asked = size + 4
    (result,) = tune(*args, trials=asked, seed=0, progress=False)
    assert (result.requested, result.space_size, result.distinct, result.trials) == (
        asked, size, size, size)
    assert result.exhausted
    assert _distinct_schedules_on_record(database.database_dir(resolve_target()),
                                         result.task) == size
    key = result.task.key
    assert session.exhaustion_report([result]) == [
        f"{key}: space exhausted after {size} distinct schedules ({asked} trials asked)",
        f"1 of 1 tasks exhausted their space: they hold fewer distinct schedules than the "
        f"{asked} trials asked"]
    (again,) = tune(*args, trials=asked, seed=0, progress=False)  # nothing left to search
    assert (again.trials, again.distinct, again.exhausted) == (size, size, True)
    (fewer,) = tune(*args, trials=2, seed=0, progress=False)
    assert not fewer.exhausted and session.exhaustion_report([fewer]) == []


_REGISTER_INTRINSICS = """
import inspect
import json

from tvm.s_tir import TensorIntrin
from lstm_tvm._tvm import meta_schedule

before = dict(inspect.modulesbyfile)
ms = meta_schedule()
names = ["wmma_sync_16x16x16_f16f16f32", "wmma_load_16x16x16_f16_a_shared", "dot_16x4_vnni"]
print(json.dumps({"found": [TensorIntrin.get(n, allow_missing=True) is not None for n in names],
                  "left": sorted(k for k in inspect.modulesbyfile if k not in before
                                 and k.startswith("<")),
                  "tune_context": hasattr(ms, "TuneContext")}))
"""


def test_meta_schedule_registers_tvms_tensor_intrinsics_and_leaves_inspect_as_it_was():
    """In a fresh process (the intrinsics register once per process): TVM's CUDA and x86
    intrinsics are registered, and the file-to-module entries set to speed their registration
    up for files of no module (``<string>``, ``<ast>``) are gone afterwards."""
    done = subprocess.run([sys.executable, "-c", _REGISTER_INTRINSICS], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["found"] == [True, True, True] and report["tune_context"], report
    # the frozen importlib frames' entries name their real modules and may stay
    assert set(report["left"]) <= {"<frozen importlib._bootstrap>",
                                   "<frozen importlib._bootstrap_external>"}, report
