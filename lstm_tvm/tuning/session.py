"""Tuning sessions: MetaSchedule searches the GEMM tiles of the requested kernels.

Each distinct GEMM task (see :mod:`lstm_tvm.tuning.tasks`) is searched with MetaSchedule's
evolutionary strategy and XGBoost cost model over the tile space of
:mod:`lstm_tvm.tuning.space`; every measured candidate is committed to the target's JSON
database at once, so an interrupted session loses nothing and the next run tops each task
up to ``trials`` distinct schedules instead of starting over. A task's space may hold fewer
schedules than that (:func:`lstm_tvm.tuning.space.space_size`): the session then searches
all of them, and its result says the space was exhausted.

Candidates run on this machine, or on the devices of a TVM RPC tracker
(:mod:`lstm_tvm.tuning.remote`); a failed measurement is recorded as failed and tried again
by the next session. MetaSchedule's logs go to a folder of the session under
``<cache dir>/tuning-logs/``, never to the console (where the progress bar reports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from pathlib import Path

from .. import env
from ..cross_compile import export_options
from .._tvm import configure_threads, meta_schedule
from ..registry import HELPERS, OPS, get_op
from ..targets import ResolvedTarget, resolve
from ..validation import plain_attrs
from . import database, remote
from .space import fingerprint, fingerprints, space, space_size
from .tasks import Task, task_of, tasks_for, workload

__all__ = ["TaskResult", "collect_tasks", "exhaustion_report", "tune"]

log = logging.getLogger(__name__)

#: The logger MetaSchedule's modules log under (its children) and configures.
MS_LOGGER = "tvm.s_tir.meta_schedule"


@dataclasses.dataclass
class TaskResult:
    """A task after a session: trials on record, best time and tile (None if none ran), the
    trials asked for, how many distinct schedules its space holds, how many are on record
    with a measured time, and how many of its records are failed measurements."""

    task: Task
    trials: int
    best: database.Best | None
    requested: int = 0
    space_size: int = 0
    distinct: int = 0
    failed: int = 0

    @property
    def exhausted(self) -> bool:
        """Whether more trials were asked for than the space holds and every schedule of the
        space is on record: the search had no new candidate left."""
        return self.requested > self.space_size and self.distinct >= self.space_size


def collect_tasks(ops, dtypes, shapes, target="llvm") -> list[Task]:
    """The distinct GEMM tasks of ``ops`` x ``dtypes`` x ``shapes`` (``(T, B, I, H)`` tuples)
    of the kernels built for ``target`` (whose register tile decides how GEMMs are cut, see
    :func:`lstm_tvm.schedule.traits.kernel_variant`).

    An op brings the helpers computed beside it (same forward op, same direction):
    ``LSTMBlockCellGrad`` brings ``CellGradMatmul``, where a cell gradient's GEMMs live. GEMMs
    do not depend on peepholes, clipping or the gate layout, so default attributes are used.
    """
    names = list(ops)
    for helper in HELPERS.values():
        if any(get_op(n).pair == helper.pair and get_op(n).direction == helper.direction
               for n in ops):
            names.append(helper.name)
    seen: dict[str, Task] = {}
    variant = resolve(target).variant()
    for name in names:
        op = get_op(name)
        attrs = plain_attrs(op)
        for dtype in dtypes:
            for steps, batch, isize, hsize in shapes:
                for task in tasks_for(name, dtype, isize, hsize, attrs, steps, batch, variant):
                    seen.setdefault(task.to_json(), task)
    return list(seen.values())


def tune(ops=tuple(OPS), dtypes=("float32",), shapes=((64, 32, 256, 256),), target="llvm",
         trials: int = 32, root: Path | None = None, progress: bool = True,
         seed: int | None = None, tracker: remote.Tracker | None = None) -> list[TaskResult]:
    """Tune the GEMM tiles of ``ops`` for ``target``; returns one :class:`TaskResult` per task.

    ``trials`` is the number of distinct measured schedules each task should have on record in
    the database (``schedules/<records key>/`` unless ``root`` is given), or all of its space's
    if that holds fewer (:attr:`TaskResult.exhausted`); tasks already there are topped up, not
    restarted.

    ``tracker``: measure on the servers of a TVM RPC tracker instead of this machine; the
    session checks that one is there (:class:`lstm_tvm.tuning.remote.RemoteError` otherwise)
    before it writes anything. ``target`` then names the devices' CPU.
    """
    target = resolve(target)
    if not target.cpu:
        raise ValueError(f"tuning {target.kind} targets is not supported yet: the tile "
                         f"space schedules CPU loops (llvm targets only)")
    configure_threads()
    tasks = collect_tasks(ops, dtypes, shapes, target)
    traits = target.traits
    host = resolve("llvm").traits
    if tracker is None and traits.arch != host.arch:
        raise ValueError(f"{database.records_key(target)}: an {traits.arch} target cannot be "
                         f"measured on this {host.arch} machine; measure it on its devices "
                         f"(tracker and key: --rpc-tracker, --rpc-key)")
    if tracker is not None:
        export_options(target.target)  # a missing cross compiler: before anything else
        runner = remote.runner(tracker, _evaluator(), remote.wait_for_servers(tracker))
        builder = _in_process_builder(shared_library=True)
    else:
        runner, builder = _local_runner(), _in_process_builder()
    folder = database.database_dir(target, root)
    db = database.open_database(folder, create=True)
    done = _on_record(db, target, tasks, traits)
    todo = [(t, n) for t in tasks if (n := _goal(t, trials, traits) - done[t][0]) > 0]
    if todo:
        _search(todo, len(tasks), target, db, progress, seed, builder, runner)
    best = database.best_by_task(target, root)
    counts = database.trial_counts(target, root)
    done = _on_record(db, target, tasks, traits)
    results = [TaskResult(t, counts.get(t, 0), best.get(t), trials, space_size(t, traits),
                          *done[t])
               for t in tasks]
    for line in exhaustion_report(results):
        log.info("%s", line)
    return results


def _goal(task: Task, trials: int, traits) -> int:
    """The distinct schedules ``task`` should have on record: ``trials``, at most its space."""
    size = space_size(task, traits)
    if trials > size:
        log.info("%s: its space holds %d distinct schedules, fewer than the %d trials asked; "
                 "searching all of them", task.key, size, trials)
    return min(trials, size)


def _on_record(db, target, tasks, traits) -> dict[Task, tuple[int, int]]:
    """For each task, how many distinct schedules of its space (see
    :func:`lstm_tvm.tuning.space.fingerprint`) ``db`` holds measured times of, and how many
    failed measurements, all on ``target``'s machine."""
    key = database.records_key(target)
    seen: dict[Task, set[int]] = {t: set() for t in tasks}
    failures = dict.fromkeys(tasks, 0)
    for record in db.get_all_tuning_records():
        task = task_of(record.workload.mod)
        same_machine = record.target is not None and database.records_key(record.target) == key
        if task not in seen or not same_machine:
            continue
        if database.failed(record):
            failures[task] += 1
        else:
            seen[task].add(_fingerprint(task, record.trace))
    return {t: (len(found & fingerprints(t, traits)), failures[t]) for t, found in seen.items()}


def _fingerprint(task: Task, trace) -> int | None:
    try:
        return fingerprint(task, trace)
    except Exception:  # noqa: BLE001 (a record of an older space, which no longer replays)
        return None


def exhaustion_report(results: list[TaskResult]) -> list[str]:
    """Lines saying which tasks exhausted their space before the trials asked, and how many
    did (nothing if none did)."""
    ran_out = [r for r in results if r.exhausted]
    if not ran_out:
        return []
    lines = [f"{r.task.key}: space exhausted after {r.distinct} distinct "
             f"schedule{'' if r.distinct == 1 else 's'} ({r.requested} trials asked)"
             for r in ran_out]
    return lines + [f"{len(ran_out)} of {len(results)} tasks exhausted their space: "
                    f"they hold fewer distinct schedules than the {ran_out[0].requested} "
                    f"trials asked"]


def _search(todo, n_tasks, target, db, progress, seed, builder, runner) -> None:
    logs = Path(tempfile.mkdtemp(prefix="tune-", dir=_log_root()))
    log.info("MetaSchedule's logs: %s", logs)
    bar = _progress(sum(n for _, n in todo), n_tasks, progress)
    with _logs_to(logs / "meta_schedule.log"), contextlib.closing(bar):
        tools = dict(builder=builder, runner=runner, database=db, work_dir=str(logs))
        for i, (task, count) in enumerate(todo):
            bar.set_description(f"[{i + 1}/{len(todo)}] {task.key}")
            name = f"task_{i:03d}"
            with _logs_to(logs / f"{name}.log", f"{MS_LOGGER}.lstm_tvm.{name}") as task_log:
                _search_task(task, count, target, None if seed is None else seed + i,
                             task_log, bar, tools)


def _search_task(task, count, target: ResolvedTarget, seed, logger, bar, tools) -> None:
    ms = meta_schedule()
    ctx = ms.TuneContext(mod=workload(task), target=target.target,
                         space_generator=space(task, target.traits),
                         search_strategy="evolutionary", task_name=task.key,
                         rand_state=-1 if seed is None else seed, num_threads="physical",
                         logger=logger)
    ms.tune.tune_tasks(tasks=[ctx], task_weights=[1.0], max_trials_global=count,
                       num_trials_per_iter=min(count, 16), task_scheduler="round-robin",
                       measure_callbacks=[*ms.MeasureCallback.create("default"),
                                          _progress_callback()(bar)], **tools)


def _evaluator():
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    return EvaluatorConfig(number=3, repeat=5, min_repeat_ms=20, enable_cpu_cache_flush=False)


def _local_runner():
    from tvm.s_tir.meta_schedule.runner import LocalRunner

    return LocalRunner(timeout_sec=120.0, evaluator_config=_evaluator())


@contextlib.contextmanager
def _logs_to(path: Path, name: str = MS_LOGGER):
    """Logger ``name`` writing everything to the file ``path`` only, for the block's duration
    (its handlers, level and propagation restored after).

    MetaSchedule's own set-up (``get_loggers_from_work_dir``) is not used: it gives
    MetaSchedule's logger a stdout handler at that logger's level and then sets the level to
    DEBUG, so the next task's set-up printed all of MetaSchedule's logs on the console.
    """
    logger = logging.getLogger(name)
    saved = logger.handlers[:], logger.level, logger.propagate
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    for old in saved[0]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()
        for old in saved[0]:
            logger.addHandler(old)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]


def _log_root() -> Path:
    path = env.cache_dir() / "tuning-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _progress(total: int, n_tasks: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="trial", disable=not enabled, dynamic_ncols=True,
                desc=f"{n_tasks} tasks")


def _in_process_builder(shared_library: bool = False):
    """A MetaSchedule builder that compiles in this process.

    MetaSchedule's ``LocalBuilder`` starts fresh worker processes for every batch (each
    importing TVM, seconds apiece); the tasks here are single GEMMs that compile in well
    under a second, so building in-process is several times faster. Measurements still run in
    the runner's worker processes. ``shared_library``: link each candidate here into a shared
    library (for RPC servers, which then need no compiler) instead of a tar of objects.
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build
    from tvm.support.tar import tar

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs):
            results = []
            for item in build_inputs:
                try:
                    lib = default_build(item.mod, item.target, None)
                    folder = Path(tempfile.mkdtemp(prefix="lstm-tvm-tune-"))
                    if shared_library:
                        path = folder / "mod.so"
                        lib.export_library(str(path), **export_options(item.target))
                    else:
                        path = folder / "mod.tar"
                        lib.export_library(str(path), fcompile=tar)
                    results.append(BuilderResult(str(path), None))
                except Exception as err:  # noqa: BLE001 (reported as a failed candidate)
                    results.append(BuilderResult(None, f"{type(err).__name__}: {err}"))
            return results

    return InProcessBuilder()


def _progress_callback():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class Progress(PyMeasureCallback):
        def __init__(self, bar):
            self.bar = bar

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            self.bar.update(len(measure_candidates))

    return Progress
