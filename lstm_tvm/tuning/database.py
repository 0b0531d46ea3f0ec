"""Tuning databases: MetaSchedule's JSON files under ``<root>/<records key>/``.

The records key names the machine the records were measured on (``llvm-<mcpu>`` for CPUs,
``cuda-<arch>`` for GPUs). Two roots hold databases (:func:`lstm_tvm.env.schedule_roots`): the
user's, where tuning sessions write, and the records shipped with lstm_tvm. A target's lookups
(:func:`sources`) read its own key's databases, the user's first, then, for a CPU, those of
one compatible CPU key (same architecture and vector extension, see :func:`compatible`). A
kernel takes its records block by block (:func:`block_uses`): each GEMM block its own key's
record when there is one, else the borrowed key's, else the rule-based schedule. A record whose
own target differs from its database's key is ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import textwrap
from pathlib import Path

from .. import env
from ..schedule.traits import cpu_traits
from ..targets import from_key, records_key, resolve
from .space import describe
from .tasks import Task, task_of

__all__ = ["Best", "FAILED_SECONDS", "Source", "Use", "block_uses", "compatible", "database_dir",
           "databases", "describe_use", "failed", "isa_class", "open_database", "sources",
           "records_key", "tasks_in", "tuned_blocks"]

log = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def same_machine(a, b) -> bool:
    """Whether two targets name the same kind of machine (kind and CPU model / arch)."""
    return records_key(a) == records_key(b)


def database_dir(target, root: Path | None = None) -> Path:
    """Where tuning sessions write ``target``'s database: under ``root``, by default the user's
    records (:func:`lstm_tvm.env.schedules_dir`)."""
    return Path(root or env.schedules_dir()) / records_key(target)


def isa_class(target) -> str:
    """The architecture and widest vector extension of a CPU target, and on x86 its vendor:
    ``x86_64 avx512f intel``, ``x86_64 avx2 amd``, ``x86_64 avx512f generic``, ``aarch64
    neon`` (:class:`~lstm_tvm.schedule.traits.CpuTraits`, from LLVM's feature tables: no
    hardware needed)."""
    target = resolve(target)
    traits = target.traits or cpu_traits(target.target)
    return " ".join(filter(None, (traits.arch, traits.extension, traits.vendor)))


def compatible(target, other) -> bool:
    """Whether records measured on CPU target ``other`` may stand in for ``target``'s: both
    ``llvm`` CPUs of one :func:`isa_class` (the traces only split and order loops, so any
    record is correct anywhere; this decides where it pays). x86 CPUs of another vendor are
    not compatible: on an AMD Zen 4 the records of an Intel Rocket Lake were 0.83-1.0x as fast
    as the rule-based schedules in most benchmark cases (docs/guide/tuning.md, Tuning records)."""
    target, other = resolve(target), resolve(other)
    if not (target.cpu and other.cpu):
        return False
    return isa_class(target) == isa_class(other)


@dataclasses.dataclass(frozen=True)
class Source:
    """One database a target's lookups read: ``origin`` ``"user"`` or ``"shipped"``; ``key``
    the records key its records were measured for (another machine's when ``borrowed``)."""

    origin: str
    folder: Path
    key: str
    borrowed: bool = False

    def describe(self) -> str:
        how = f"borrowed from {self.key} (same ISA)" if self.borrowed else self.key
        return f"{how}, {self.origin} records in {self.folder}"

    @property
    def label(self) -> str:
        """Short: ``own`` or ``borrowed from llvm-znver5``."""
        return f"borrowed from {self.key}" if self.borrowed else "own"


def sources(target) -> tuple[Source, ...]:
    """The databases ``target``'s kernels take their records from, in order of preference:
    its own key's (user's, then shipped); then, for a CPU, those of the first other key (by
    root, user's first, then key name) whose records are :func:`compatible` with it, user's
    then shipped. Lookups go through them block by block (:func:`block_uses`), so borrowed
    records stand in for the blocks that own records lack."""
    target = resolve(target)
    key, roots = target.records_key, env.schedule_roots()
    own = _folders(key, roots, borrowed=False)
    if not target.cpu:
        return own
    donor = _donor(target.key, tuple((o, root, _mtime(root)) for o, root in roots))
    return own + (() if donor is None else _folders(donor, roots, borrowed=True))


def _folders(key: str, roots, borrowed: bool) -> tuple[Source, ...]:
    """The databases of ``key`` on ``roots`` (those holding a record file), in root order."""
    return tuple(Source(origin, root / key, key, borrowed) for origin, root in roots
                 if (root / key / RECORD_FILE).is_file())


def _mtime(path: Path):
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _donor(target_json: str, roots: tuple) -> str | None:
    """The key a CPU target borrows records from (see :func:`sources`), if any; cached by the
    roots' mtimes (a new key folder changes its root's)."""
    target = from_key(target_json)
    own = target.records_key
    for _, root, _ in roots:
        for folder in _database_folders(root):
            other = _recorded_target(_stamp(folder))
            if folder.name != own and other is not None and compatible(target, other):
                return folder.name
    return None


def _database_folders(root: Path) -> list[Path]:
    """The key folders under ``root`` holding a record file, by name."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / RECORD_FILE).is_file())


def describe_use(target) -> str:
    """One line saying which databases ``target``'s kernels read and where they come from."""
    found = sources(target)
    if not found:
        return f"none for {records_key(target)}: rule-based default schedules"
    return "; ".join(s.describe() for s in found)


def databases() -> list[tuple[str, Path, str]]:
    """Every database on the lookup roots: ``(origin, folder, ISA class or "?")``."""
    rows = []
    for origin, root in env.schedule_roots():
        for folder in _database_folders(root):
            other = _recorded_target(_stamp(folder))
            rows.append((origin, folder, "?" if other is None else isa_class(other)))
    return rows


@functools.lru_cache(maxsize=64)
def _recorded_target(file_stamp):
    """The target of the first record in a record file (its :func:`_stamp`), if it is one of
    its folder's key (None when there is none, or it is unreadable or of another machine)."""
    from .._tvm import tvm

    if file_stamp is None:
        return None
    path = Path(file_stamp[0])
    try:
        with open(path, encoding="utf-8") as f:
            target = tvm.target.Target(json.loads(f.readline())[1][2])
    except Exception:  # noqa: BLE001 (not a readable lstm_tvm database: skipped)
        return None
    return target if records_key(target) == path.parent.name else None


def open_database(folder: Path, create: bool = False):
    """MetaSchedule's ``JSONDatabase`` in ``folder`` (None if it has none and ``create`` is off)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    folder = Path(folder)
    if not create and not (folder / RECORD_FILE).exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return JSONDatabase(str(folder / WORKLOAD_FILE), str(folder / RECORD_FILE),
                        allow_missing=create)


#: MetaSchedule stores a candidate that did not build or run with this time or more (1e10):
#: such a record is a failure, never a measurement.
FAILED_SECONDS = 1e9


def failed(record) -> bool:
    """Whether a tuning record is a failed measurement (no run time, or MetaSchedule's
    failure time)."""
    secs = [float(s) for s in (record.run_secs or [])]
    return not secs or min(secs) >= FAILED_SECONDS


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


def stamp(target) -> tuple:
    """The identity of the databases :func:`sources` gives ``target`` as they are now (each
    :class:`Source` and its record file's path, mtime and size): what cached lookups are keyed
    by, so new records are seen at once."""
    return tuple((s, _stamp(s.folder)) for s in sources(target))


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
    return {} if stamp is None else _load(stamp, records_key(target))[0]


def trial_counts(target, root: Path | None = None) -> dict[Task, int]:
    """How many records (successful or not) each task has for ``target`` (to resume sessions)."""
    stamp = _stamp(database_dir(target, root))
    return {} if stamp is None else _load(stamp, records_key(target))[1]


def tasks_in(folder: Path) -> dict[Task, Best]:
    """Every task's best record in the database in ``folder`` (records of its key only)."""
    file_stamp = _stamp(Path(folder))
    return {} if file_stamp is None else _load(file_stamp, Path(folder).name)[0]


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
        if task is None or record.target is None or records_key(record.target) != key:
            continue
        counts[task] = counts.get(task, 0) + 1
        if failed(record):
            continue
        secs = [float(s) for s in record.run_secs]
        seconds = sorted(secs)[len(secs) // 2]  # median: robust on a busy machine
        if task not in best or seconds < best[task].seconds:
            best[task] = Best(task, record.trace, seconds)
    for task, b in best.items():
        b.trials = counts[task]
    return best, counts


@dataclasses.dataclass(frozen=True)
class Use:
    """The record one GEMM block of a kernel takes: ``best`` from the database ``source``
    (both None: no database holds one, the block keeps its rule-based schedule)."""

    block: str
    best: Best | None = None
    source: Source | None = None

    @property
    def label(self) -> str:
        """``own``, ``borrowed from llvm-znver5`` or ``none: rule schedule``."""
        return "none: rule schedule" if self.source is None else self.source.label


def block_uses(target, blocks, state: tuple | None = None) -> tuple[Use, ...]:
    """For each kernel GEMM block (a ``GemmBlock`` with symbolic sizes, in the order given)
    the record it takes: the best of the matching tasks in the first of :func:`sources` that
    has one (so a block lacking a record of the target's own key takes the borrowed key's),
    preferring the task tuned at the largest size (``M*K``). ``state``: the :func:`stamp` to
    read (default: as it is now)."""
    chosen: dict[str, Use] = {}
    for source, file_stamp in stamp(target) if state is None else state:
        found = {} if file_stamp is None else _load(file_stamp, source.key)[0]
        for block in blocks:
            matches = [b for t, b in found.items() if t.matches(block)]
            if matches and block.name not in chosen:
                best = max(matches, key=lambda b: (b.task.M * b.task.K, -b.seconds))
                chosen[block.name] = Use(block.name, best, source)
    return tuple(chosen.get(block.name, Use(block.name)) for block in blocks)


def tuned_blocks(target, blocks, state: tuple | None = None) -> dict[str, Best]:
    """The record of each kernel GEMM block that has one (see :func:`block_uses`)."""
    return {u.block: u.best for u in block_uses(target, blocks, state) if u.best is not None}


def uses_table(rows, headers=("op", "dtype"), width: int = 100) -> str:
    """Plain text: for each row ``(cells, uses)`` (``cells`` under ``headers``; ``uses`` pairs
    ``(block, label)``, the label a :attr:`Use.label`) a line per label, own records first,
    then borrowed ones, then the rule-based schedule, with the cells and the blocks that take
    it (wrapped to ``width`` columns). Lines start with the label, never with a cell."""
    groups = [(tuple(map(str, cells)), _by_label(uses)) for cells, uses in rows]
    widths = [max([len("records")] + [len(label) for _, g in groups for label in g])]
    widths += [max([len(h)] + [len(c[k]) for c, _ in groups]) for k, h in enumerate(headers)]
    wrap = max(width - sum(widths) - 2 * len(widths), 24)
    lines = []
    for cells, by_label in groups:
        for label, names in by_label.items():
            text = textwrap.wrap(", ".join(names), wrap, break_on_hyphens=False) or ["-"]
            lines += [[label, *cells, text[0]]] + [["", *("",) * len(cells), t] for t in text[1:]]
    widths.append(max([len("blocks")] + [len(line[-1]) for line in lines]))
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
                     for line in [["records", *headers, "blocks"], ["-" * w for w in widths],
                                  *lines])


def _by_label(uses) -> dict[str, list[str]]:
    """The blocks of ``uses`` (pairs ``(block, label)``) by label, own records first."""
    rank = {"own": 0, "borrowed": 1}
    found: dict[str, list[str]] = {}
    for block, label in sorted(uses, key=lambda u: rank.get(u[1].split()[0], 2)):
        found.setdefault(label, []).append(block)
    return found or {"no GEMM block": []}


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
