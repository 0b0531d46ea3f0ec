"""Tuning databases: MetaSchedule's JSON files under ``schedules/<target key>/``.

The target key names the machine the records were measured on (``llvm-<mcpu>`` for CPUs,
``cuda-<arch>`` for GPUs), so records of one machine are never looked up for another; a
record whose own target differs (kind, CPU model or architecture) is ignored as well.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path

from .. import env
from .space import describe
from .tasks import Task, task_of

__all__ = ["Best", "database_dir", "open_database", "target_key", "tuned_blocks"]

log = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def _machine(target) -> str:
    attrs = target.attrs
    for name in ("mcpu", "arch"):
        if name in attrs and str(attrs[name]):
            return str(attrs[name])
    return "generic"


def target_key(target) -> str:
    """The folder name of ``target``'s records: its kind and CPU model or GPU architecture."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{target.kind.name}-{_machine(target)}")


def same_machine(a, b) -> bool:
    """Whether two targets name the same kind of machine (kind and CPU model / arch)."""
    return target_key(a) == target_key(b)


def database_dir(target, root: Path | None = None) -> Path:
    """Where ``target``'s database lives (under ``LSTM_TVM_SCHEDULES_DIR`` by default)."""
    return Path(root or env.schedules_dir()) / target_key(target)


def open_database(folder: Path, create: bool = False):
    """MetaSchedule's ``JSONDatabase`` in ``folder`` (None if it has none and ``create`` is off)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    folder = Path(folder)
    if not create and not (folder / RECORD_FILE).exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return JSONDatabase(str(folder / WORKLOAD_FILE), str(folder / RECORD_FILE),
                        allow_missing=create)


class Best:
    """The best measured record of one task: its trace (the schedule), median time, trials."""

    def __init__(self, task: Task, trace, seconds: float, trials: int = 0):
        self.task, self.trace, self.seconds, self.trials = task, trace, seconds, trials

    @property
    def gflops(self) -> float:
        return self.task.flops / self.seconds / 1e9

    @property
    def tile(self) -> str:
        return describe(self.trace)

    def to_json(self) -> dict:
        return {"task": self.task.key, "tile": self.tile, "seconds": self.seconds,
                "trials": self.trials}


def stamp(target, root: Path | None = None):
    """The identity of ``target``'s record file as it is now (path, mtime, size), or None:
    what cached lookups are keyed by, so new records are seen at once."""
    return _stamp(database_dir(target, root))


def _stamp(folder: Path):
    path = folder / RECORD_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (str(path), st.st_mtime_ns, st.st_size)


def best_by_task(target, root: Path | None = None) -> dict[Task, Best]:
    """Every task's best record in ``target``'s database that was measured on ``target``'s
    machine (records of other targets, or not made by lstm_tvm, are skipped)."""
    stamp = _stamp(database_dir(target, root))
    return {} if stamp is None else _load(stamp, target_key(target))[0]


def trial_counts(target, root: Path | None = None) -> dict[Task, int]:
    """How many records (successful or not) each task has for ``target`` (to resume sessions)."""
    stamp = _stamp(database_dir(target, root))
    return {} if stamp is None else _load(stamp, target_key(target))[1]


@functools.lru_cache(maxsize=16)
def _load(stamp, key: str) -> tuple[dict[Task, Best], dict[Task, int]]:
    from .._tvm import tvm  # noqa: F401  (registers the IR types the JSON names)

    best: dict[Task, Best] = {}
    counts: dict[Task, int] = {}
    try:
        records = open_database(Path(stamp[0]).parent).get_all_tuning_records()
    except Exception as err:  # noqa: BLE001 (an unreadable database must not stop a compile)
        log.warning("lstm_tvm: ignoring the tuning database in %s: %s", Path(stamp[0]).parent,
                    str(err).splitlines()[-1][:200] if str(err) else type(err).__name__)
        return best, counts
    for record in records:
        task = task_of(record.workload.mod)
        if task is None or record.target is None or target_key(record.target) != key:
            continue
        counts[task] = counts.get(task, 0) + 1
        secs = [float(s) for s in (record.run_secs or [])]
        if not secs or min(secs) >= 1e9:  # failed runs are stored with a huge time
            continue
        seconds = sorted(secs)[len(secs) // 2]  # median: robust on a busy machine
        if task not in best or seconds < best[task].seconds:
            best[task] = Best(task, record.trace, seconds)
    for task, b in best.items():
        b.trials = counts[task]
    return best, counts


def tuned_blocks(target, blocks, root: Path | None = None) -> dict[str, Best]:
    """For each kernel GEMM block (a ``GemmBlock`` with symbolic sizes), the best record of a
    matching task, preferring the task tuned at the largest size (``M*K``)."""
    found = best_by_task(target, root)
    chosen: dict[str, Best] = {}
    for block in blocks:
        matches = [b for t, b in found.items() if t.matches(block)]
        if matches:
            chosen[block.name] = max(matches, key=lambda b: (b.task.M * b.task.K, -b.seconds))
    return chosen


def trace_to_json(trace) -> str:
    """A record's trace (postprocessing removed) as JSON text, for build specs and manifests."""
    return json.dumps(_plain(trace.as_json(remove_postproc=True)), separators=(",", ":"))


def _plain(obj):
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "value") and type(obj).__name__ in ("FloatImm", "IntImm"):
        return obj.value
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__"):
        return [_plain(x) for x in obj]
    return str(obj)
