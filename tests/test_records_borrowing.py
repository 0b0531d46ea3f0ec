"""Borrowed tuning records stand in block by block: a CPU key with records of its own for some
GEMM blocks (tuning tasks) takes the compatible key's records for the others.

The story: a Zen 4 (``llvm-znver4``) without records of its own uses the shipped ``llvm-znver5``
ones; after a session tunes only ``BlockLSTMGradV2`` there, its ``BlockLSTMV2`` kernels still
take the borrowed records, and ``lstm-tvm schedules`` says per op which records each block
takes. Its targets are named, never this machine's CPU, and its kernels are scheduled, not run,
so any x86-64 runs it. The ``lstm-tvm build`` test runs kernels here: this machine's key owns
records, and a named CPU of its ISA class lends them.
"""

import json
import shutil

import pytest
import tvm_ffi
from click.testing import CliRunner

from lstm_tvm import build, cli, env, testing
from lstm_tvm._tvm import Schedule, tvm
from lstm_tvm.targets import resolve_target
from lstm_tvm.tuning import collect_tasks, database
from lstm_tvm.registry import get_op
from lstm_tvm.tuning import tasks as task_mod
from lstm_tvm.validation import plain_attrs

DONOR = "llvm-znver5"
#: The tasks the shipped records hold for I = H = 256 (the benchmark's 64x32x256x256).
SIZE = 256


def _x86(mcpu: str):
    return resolve_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})


def _spec(op: str, target, tuned: bool = True):
    return build.make_spec(op, "float32", SIZE, SIZE, plain_attrs(get_op(op)), target,
                           tuned=tuned)


def _uses(spec) -> dict[str, tuple]:
    return {u.block: (u.label, u.best and u.best.task.key) for u in build.record_uses(spec)}


def _traces(spec) -> dict[str, str]:
    return {block: trace for block, _, trace in spec.tuned}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """An empty user root, and a shipped root holding a copy of the shipped ``llvm-znver5``
    records (skipped where lstm_tvm ships none)."""
    shipped_now = env.shipped_schedules_dir()
    if shipped_now is None or not (shipped_now / DONOR / database.RECORD_FILE).is_file():
        pytest.skip(f"no shipped {DONOR} records (LSTM_TVM_SHIPPED_SCHEDULES off, or none ship)")
    shipped = tmp_path / "shipped"
    shutil.copytree(shipped_now / DONOR, shipped / DONOR)
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "user"))
    monkeypatch.setattr(env, "shipped_schedules_dir", lambda: shipped)
    return tmp_path / "user", shipped


def _commit_own(db, target, donor_folder, task_keys) -> dict[str, str]:
    """Records for ``target`` of the tasks named: for each, a measured record of the donor's
    database other than its best (a real schedule of that tuning session, which schedules the
    task differently); returns each task's trace JSON."""
    best = {t.key: b for t, b in database.tasks_in(donor_folder).items()}
    chosen = {}
    for record in database.open_database(donor_folder).get_all_tuning_records():
        task = task_mod.task_of(record.workload.mod)
        if task.key not in task_keys or task.key in chosen or database.failed(record):
            continue
        if not tvm_ffi.structural_equal(_scheduled(task, record.trace),
                                       _scheduled(task, best[task.key].trace)):
            chosen[task.key] = record
            db.commit_tuning_record(tvm.s_tir.meta_schedule.database.TuningRecord(
                record.trace, db.commit_workload(task_mod.workload(task)), record.run_secs,
                target, record.args_info))
    assert set(chosen) == set(task_keys)
    return {k: database.trace_to_json(r.trace) for k, r in chosen.items()}


def _scheduled(task, trace):
    sch = Schedule(task_mod.workload(task))
    trace.apply_to_schedule(sch, remove_postproc=True)
    return sch.mod


def _groups(output: str, header: str) -> dict[tuple, dict[str, list[str]]]:
    """A records table of the output read back: ``(op, dtype[, IxH])`` -> label -> blocks."""
    lines = output.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(header))
    rule = lines[start + 1]
    cuts = [k for k in range(len(rule)) if rule[k] == "-" and (k == 0 or rule[k - 1] == " ")]
    found: dict[tuple, dict[str, list[str]]] = {}
    for line in lines[start + 2:]:
        cells = [line[a:b].strip() for a, b in zip(cuts, [*cuts[1:], None])]
        gaps = all(line[c - 2:c].strip() == "" for c in cuts[1:])
        if not gaps or not line.startswith(" ") and not cells[1]:
            break  # the table's end
        if cells[0]:
            label, key = cells[0], tuple(cells[1:-1])
        found.setdefault(key, {}).setdefault(label, []).extend(
            b.strip() for b in cells[-1].split(",") if b.strip())
    return found


def test_a_block_without_an_own_record_takes_the_borrowed_one(roots):
    user, shipped = roots
    zen4 = _x86("znver4")
    assert database.records_key(zen4) == "llvm-znver4"
    assert [(s.key, s.borrowed) for s in database.sources(zen4)] == [(DONOR, True)]
    before = {op: _spec(op, zen4) for op in ("BlockLSTMV2", "BlockLSTMGradV2")}
    donor_best = {t.key: database.trace_to_json(b.trace)
                  for t, b in database.tasks_in(shipped / DONOR).items()}
    for spec in before.values():  # everything tuned is borrowed, and is the donor's best
        assert spec.tuned and all(donor_best[task] == trace for _, task, trace in spec.tuned)
        assert {label for label, task in _uses(spec).values() if task} == {f"borrowed from {DONOR}"}

    # a session on the Zen 4 tunes BlockLSTMGradV2 only, and not all of its blocks
    grad_tasks = {block: task for block, task, _ in before["BlockLSTMGradV2"].tuned}
    assert {"dh", "w_grad", "x_grad_gemm"} <= set(grad_tasks)
    mine = {grad_tasks["dh"], grad_tasks["x_grad_gemm"]}
    own = _commit_own(database.open_database(database.database_dir(zen4), create=True), zen4,
                      shipped / DONOR, mine)
    assert [(s.origin, s.key, s.borrowed) for s in database.sources(zen4)] == [
        ("user", "llvm-znver4", False), ("shipped", DONOR, True)]

    # BlockLSTMV2 keeps the borrowed records: the same records, the same scheduled kernel
    v2 = _spec("BlockLSTMV2", zen4)
    assert v2.tuned == before["BlockLSTMV2"].tuned
    assert _uses(v2) == _uses(before["BlockLSTMV2"])
    kernel = build.primfunc(v2)
    assert tvm_ffi.structural_equal(kernel, build.primfunc(before["BlockLSTMV2"]))
    assert not tvm_ffi.structural_equal(kernel, build.primfunc(_spec("BlockLSTMV2", zen4, False)))

    # BlockLSTMGradV2 takes its own records where it has them, the borrowed one elsewhere
    grad = _spec("BlockLSTMGradV2", zen4)
    uses = _uses(grad)
    assert uses["dh"] == ("own", grad_tasks["dh"])
    assert uses["x_grad_gemm"] == ("own", grad_tasks["x_grad_gemm"])
    assert uses["w_grad"] == (f"borrowed from {DONOR}", grad_tasks["w_grad"])
    assert {b for b, (label, _) in uses.items() if label == "none: rule schedule"} == \
        set(uses) - set(grad_tasks)
    traces = _traces(grad)
    assert traces["dh"] == own[grad_tasks["dh"]] != donor_best[grad_tasks["dh"]]
    assert traces["w_grad"] == _traces(before["BlockLSTMGradV2"])["w_grad"]
    assert not tvm_ffi.structural_equal(build.primfunc(grad),
                                       build.primfunc(before["BlockLSTMGradV2"]))

    # the command says so, op by op
    shown = CliRunner().invoke(cli.main, ["schedules", "--target", json.dumps(
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"}),
        "--ops", "BlockLSTMV2,BlockLSTMGradV2", "--sizes", f"{SIZE}x{SIZE}"])
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.output.splitlines()
               if not line.startswith(("user records:", "shipped records:", "uses:"))) <= 100
    groups = _groups(shown.output, "records ")
    size = f"{SIZE}x{SIZE}"
    assert groups[("BlockLSTMV2", "float32", size)][f"borrowed from {DONOR}"] == ["xw", "gates"]
    assert "own" not in groups[("BlockLSTMV2", "float32", size)]
    grad_rows = groups[("BlockLSTMGradV2", "float32", size)]
    assert (sorted(grad_rows["own"]), grad_rows[f"borrowed from {DONOR}"]) == (
        ["dh", "x_grad_gemm"], ["w_grad"])
    assert sorted(sum(grad_rows.values(), [])) == sorted(uses)
    assert shown.output.splitlines()[-1] == (
        f"uses: llvm-znver4, user records in {user / 'llvm-znver4'}; borrowed from {DONOR} "
        f"(same ISA), shipped records in {shipped / DONOR}")


#: CPUs by LLVM name, to find one that borrows from this host's key (or lends to it).
_CPUS = ("znver1", "znver2", "znver3", "znver4", "znver5", "haswell", "broadwell", "skylake",
         "skylake-avx512", "cascadelake", "icelake-server", "sapphirerapids", "rocketlake",
         "alderlake")


def _compatible_cpu(host):
    """A named x86 CPU whose records this host borrows (same ISA class, another key)."""
    for mcpu in _CPUS:
        other = _x86(mcpu)
        if (database.records_key(other) != database.records_key(host)
                and database.compatible(host, other)):
            return other
    pytest.skip(f"no CPU among {_CPUS} shares this host's ISA class ({database.isa_class(host)})")


def test_build_summary_names_each_blocks_records(tmp_path, monkeypatch):
    """``lstm-tvm build`` on this host, which owns records for one op and borrows a compatible
    CPU's for the other: every case passes against the reference, and the summary and the JSON
    say which key each block's record came from."""
    host = resolve_target()
    if database.isa_class(host).split()[0] != "x86_64":
        pytest.skip("needs an x86-64 host to borrow from a named x86 CPU")
    donor = _compatible_cpu(host)
    monkeypatch.setenv("LSTM_TVM_SCHEDULES_DIR", str(tmp_path / "user"))
    monkeypatch.setenv("LSTM_TVM_SHIPPED_SCHEDULES", "0")
    monkeypatch.setenv("LSTM_TVM_CACHE_DIR", str(tmp_path / "cache"))
    build.clear_memory_cache()
    shape = (4, 8, 8, 8)  # T, B, I, H
    both = collect_tasks(["BlockLSTMV2", "BlockLSTMGradV2"], ["float32"], [shape], host)
    testing.commit_sampled_records(
        database.open_database(database.database_dir(donor), create=True), donor, both, 0)
    grad_only = collect_tasks(["BlockLSTMGradV2"], ["float32"], [shape], host)
    testing.commit_sampled_records(
        database.open_database(database.database_dir(host), create=True), host, grad_only, 3)
    report = tmp_path / "build.json"
    result = CliRunner().invoke(cli.main, [
        "build", "--ops", "BlockLSTMV2,BlockLSTMGradV2", "--dtype", "float32", "--peephole",
        "off", "--seq-len", "4", "--batch", "8", "--input-size", "8", "--cell-size", "8",
        "--repeat", "1", "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "2/2 passed" in result.output
    donor_key, host_key = database.records_key(donor), database.records_key(host)
    rows = {r["op"]: r for r in json.loads(report.read_text())["results"]}
    for op, key, label in (("BlockLSTMV2", donor_key, f"borrowed from {donor_key}"),
                           ("BlockLSTMGradV2", host_key, "own")):
        spec = build.make_spec(op, "float32", 8, 8, plain_attrs(get_op(op)), host)
        tuned = [r for r in rows[op]["records"] if r["task"]]
        assert sorted((r["block"], r["task"]) for r in tuned) == [
            (block, task) for block, task, _ in spec.tuned]
        assert {(r["key"], r["records"], r["origin"]) for r in tuned} == {(key, label, "user")}
        groups = _groups(result.output, "records ")[(op, "float32")]
        assert groups[label] == [r["block"] for r in tuned]
        assert set(groups) <= {label, "none: rule schedule"}
