"""Tuning sessions: MetaSchedule searches the GEMM tiles of the requested kernels.

Each distinct GEMM task (see :mod:`lstm_tvm.tuning.tasks`) is searched with MetaSchedule's
evolutionary strategy and XGBoost cost model over the tile space of
:mod:`lstm_tvm.tuning.space`; every measured candidate is committed to the target's JSON
database at once, so an interrupted session loses nothing and the next run tops each task
up to ``trials`` records instead of starting over.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

from .. import env
from .._tvm import configure_threads, resolve_target
from ..build import CELL_GRAD_MATMUL
from ..registry import OPS, get_op
from ..validation import validate_attrs
from . import database
from .space import space
from .tasks import Task, tasks_for, workload

__all__ = ["TaskResult", "collect_tasks", "tune"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TaskResult:
    """A task after a session: trials on record, best time and tile (None if none ran)."""

    task: Task
    trials: int
    best: database.Best | None


def collect_tasks(ops, dtypes, shapes) -> list[Task]:
    """The distinct GEMM tasks of ``ops`` x ``dtypes`` x ``shapes`` (``(T, B, I, H)`` tuples).

    ``LSTMBlockCellGrad`` brings the cell-gradient matmul (its GEMMs live there). GEMMs do not
    depend on peepholes, clipping or the gate layout, so default attributes are used.
    """
    names = list(ops)
    if "LSTMBlockCellGrad" in names:
        names.append(CELL_GRAD_MATMUL)
    seen: dict[str, Task] = {}
    for name in names:
        attrs = {} if name == CELL_GRAD_MATMUL else validate_attrs(
            get_op(name), {"use_peephole": False})
        for dtype in dtypes:
            for steps, batch, isize, hsize in shapes:
                for task in tasks_for(name, dtype, isize, hsize, attrs, steps, batch):
                    seen.setdefault(task.to_json(), task)
    return list(seen.values())


def tune(ops=tuple(OPS), dtypes=("float32",), shapes=((64, 32, 256, 256),), target="llvm",
         trials: int = 32, root: Path | None = None, progress: bool = True,
         seed: int | None = None) -> list[TaskResult]:
    """Tune the GEMM tiles of ``ops`` for ``target``; returns one :class:`TaskResult` per task.

    ``trials`` is the number of measured candidates each task should have on record in
    the database (``schedules/<target key>/`` unless ``root`` is given); tasks already there
    are topped up, not restarted.
    """
    target = resolve_target(target)
    if str(target.kind.name) != "llvm":
        raise ValueError(f"tuning {target.kind.name} targets is not supported yet: the tile "
                         f"space schedules CPU loops (llvm targets only)")
    configure_threads()
    folder = database.database_dir(target, root)
    db = database.open_database(folder, create=True)
    tasks = collect_tasks(ops, dtypes, shapes)
    done = database.trial_counts(target, root)
    todo = [(t, trials - done.get(t, 0)) for t in tasks if trials - done.get(t, 0) > 0]
    if todo:
        _search(todo, len(tasks), target, db, progress, seed)
    best = database.best_by_task(target, root)
    counts = database.trial_counts(target, root)
    return [TaskResult(t, counts.get(t, 0), best.get(t)) for t in tasks]


def _search(todo, n_tasks, target, db, progress, seed) -> None:
    from tvm.s_tir import meta_schedule as ms

    # MetaSchedule's console handler takes this logger's level (DEBUG if unset); its files
    # keep everything. The progress bar is the console's report.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    bar = _progress(sum(n for _, n in todo), n_tasks, progress)
    logs = Path(tempfile.mkdtemp(prefix="tune-", dir=_log_root()))
    builder = _in_process_builder()
    runner = ms.runner.LocalRunner(timeout_sec=120.0, evaluator_config=ms.runner.EvaluatorConfig(
        number=3, repeat=5, min_repeat_ms=20, enable_cpu_cache_flush=False))
    try:
        for i, (task, count) in enumerate(todo):
            bar.set_description(f"[{i + 1}/{len(todo)}] {task.key}")
            ctx = ms.TuneContext(mod=workload(task), target=target, space_generator=space(task),
                                 search_strategy="evolutionary", task_name=task.key,
                                 rand_state=-1 if seed is None else seed + i,
                                 num_threads="physical", logger=_task_logger(logs, i))
            ms.tune.tune_tasks(
                tasks=[ctx], task_weights=[1.0], work_dir=str(logs),
                max_trials_global=count, num_trials_per_iter=min(count, 16),
                database=db, task_scheduler="round-robin", builder=builder, runner=runner,
                measure_callbacks=[*ms.MeasureCallback.create("default"),
                                   _progress_callback()(bar)])
    finally:
        bar.close()


def _task_logger(logs: Path, index: int):
    from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir

    return get_loggers_from_work_dir(str(logs), [f"task_{index:03d}"])[0]


def _log_root() -> Path:
    path = env.cache_dir() / "tuning-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _progress(total: int, n_tasks: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="trial", disable=not enabled, dynamic_ncols=True,
                desc=f"{n_tasks} tasks")


def _in_process_builder():
    """A MetaSchedule builder that compiles in this process.

    MetaSchedule's ``LocalBuilder`` starts fresh worker processes for every batch (each
    importing TVM, seconds apiece); the tasks here are single GEMMs that compile in well
    under a second, so building in-process is several times faster. Measurements still run in
    the ``LocalRunner``'s worker processes.
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
                    path = Path(tempfile.mkdtemp(prefix="lstm-tvm-tune-")) / "mod.tar"
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
