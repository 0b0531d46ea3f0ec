"""From a :class:`BuildSpec` to a loaded TVM module: build, schedule, cache.

A spec names everything a compiled kernel depends on: the op, dtype, input and cell sizes,
the compile-time attributes, the target (``T`` and ``B`` stay symbolic) and the tuning
records applied to its GEMM blocks (found in ``schedules/<records key>/``). ``get_module``
returns the module from memory, else from the disk cache, else builds it under a file lock
and publishes it with an atomic rename, so concurrent processes never see half a file and the
next process does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import threading
from pathlib import Path

from filelock import FileLock

from . import env
from ._files import atomic_path
from ._tvm import build_scope, tvm
from .kernels import WEIGHT_PACKS, KernelVariant, kernel_func, pack_func, pack_func_name
from .kernels.variant import SKIPPABLE_OUTPUTS
from .registry import get_op
from ._host_arrays import ALIGNMENT
from .schedule import schedule_for
from .schedule.traits import tensor_cores
from .targets import ResolvedTarget, from_key, resolve

log = logging.getLogger(__name__)

def _source_digest() -> str:
    """A hash of the sources that decide generated code (kernels, schedules, this module), so a
    cache entry built by other code is never loaded."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted([*root.glob("kernels/*.py"), *root.glob("schedule/**/*.py"),
                        root / "build.py", root / "_tvm.py", root / "targets.py"]):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: Identifies the code generator; part of every cache key.
KERNEL_VERSION = _source_digest()

@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """The cache key of one compiled kernel.

    ``attrs`` is a sorted tuple of ``(name, value)``; ``target`` is the target's JSON (the
    key of its :attr:`resolved` target);
    ``tuned`` a sorted tuple of ``(block name, task, trace JSON)`` of the tuning records
    replayed on GEMM blocks (empty: default schedules). ``prepacked``: the kernel takes its
    weight panels as parameters between its inputs and outputs, and the module has a second
    function, :attr:`pack_func_name`, that fills them from ``w`` (see
    :mod:`lstm_tvm.kernels._weights`; for an op that packs no weights the kernel is the same
    as without). ``tensor_cores``: a float16 kernel built with
    :attr:`~lstm_tvm.kernels.variant.KernelVariant.tensor_cores` (where
    :func:`lstm_tvm.schedule.traits.tensor_cores` said so when the spec was made; float32
    kernels are the same either way). ``skipped``: outputs the kernel leaves unwritten, see
    :meth:`without`.
    """

    op: str
    dtype: str
    input_size: int
    cell_size: int
    attrs: tuple
    target: str
    tuned: tuple = ()
    prepacked: bool = False
    tensor_cores: bool = False
    skipped: tuple = ()

    @property
    def func_name(self) -> str:
        """The exported function's name, ``lstm_tvm_<op>_<dtype>`` (``..._prepacked`` for a
        kernel that takes weight panels, ``..._without_<output>`` for each skipped output, so
        that a library can hold them all)."""
        suffix = "_prepacked" if self.pack_func_name else ""
        suffix += "".join(f"_without_{name}" for name in self.skipped)
        return f"lstm_tvm_{self.op}_{self.dtype}{suffix}"

    @property
    def resolved(self) -> ResolvedTarget:
        """The target this spec builds for (:func:`lstm_tvm.targets.from_key` of
        :attr:`target`)."""
        return from_key(self.target)

    @property
    def variant(self) -> KernelVariant:
        """The form of the kernel this spec builds: its target's
        (:func:`lstm_tvm.schedule.traits.kernel_variant`), prepacked and with tensor cores as
        :attr:`prepacked` and :attr:`tensor_cores` say."""
        return dataclasses.replace(self.resolved.variant(self.prepacked),
                                   tensor_cores=self.tensor_cores, skipped=self.skipped)

    def without(self, outputs) -> BuildSpec:
        """The spec of this kernel leaving ``outputs`` (names among
        :data:`~lstm_tvm.kernels.variant.SKIPPABLE_OUTPUTS`) unwritten, for a caller that has no
        use for them: only a sequence backward op (``BlockLSTMGrad``, ``BlockLSTMGradV2``) has
        such a form; its other outputs are those of this spec's kernel."""
        names = tuple(sorted(set(self.skipped) | set(outputs)))
        op = get_op(self.op)
        if op.kind != "sequence" or op.direction != "backward":
            raise ValueError(f"{self.op}: only a sequence backward op leaves outputs out, "
                             f"got outputs {list(outputs)}")
        wrong = [n for n in names if n not in SKIPPABLE_OUTPUTS]
        if wrong:
            raise ValueError(f"{self.op}: outputs {wrong} cannot be left out; expected names "
                             f"among {list(SKIPPABLE_OUTPUTS)}")
        return dataclasses.replace(self, skipped=names)

    def with_prepacked_weights(self) -> BuildSpec:
        """The spec of this kernel taking its weight panels: prepacked for an op that packs
        weights on a CPU target (GPU kernels are not measured with it), else this spec."""
        packs = self.resolved.cpu and self.op in WEIGHT_PACKS and not self.prepacked
        return dataclasses.replace(self, prepacked=True) if packs else self

    @property
    def pack_func_name(self) -> str | None:
        """The name of the function filling a prepacked kernel's weight panels; None without
        one (not prepacked, or an op that reads ``w`` in place)."""
        packs = self.prepacked and self.op in WEIGHT_PACKS
        return pack_func_name(self.op, self.dtype) if packs else None

    def digest(self) -> str:
        payload = json.dumps(
            [dataclasses.asdict(self), KERNEL_VERSION, tvm.__version__], sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


def make_spec(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict,
              target=None, tuned: bool = True, prepacked: bool = False) -> BuildSpec:
    """A :class:`BuildSpec` with attrs normalised, the target resolved
    (:func:`lstm_tvm.targets.resolve`; a :class:`~lstm_tvm.targets.ResolvedTarget` is taken as
    it is) to its JSON and, with ``tuned``, the best matching tuning record of each GEMM block
    attached; with ``prepacked``, :meth:`BuildSpec.with_prepacked_weights`."""
    norm = tuple(sorted((k, bool(v) if isinstance(v, bool) else float(v)) for k, v in attrs.items()))
    resolved = resolve(target)
    records = _tuned_records(op, dtype, int(input_size), int(cell_size), norm, resolved) if tuned else ()
    spec = BuildSpec(op, dtype, int(input_size), int(cell_size), norm, resolved.key, records,
                     tensor_cores=dtype == "float16" and tensor_cores(resolved.target))
    return spec.with_prepacked_weights() if prepacked else spec


def _tuned_records(op, dtype, input_size, cell_size, attrs, target: ResolvedTarget) -> tuple:
    from .tuning import database

    return _tuned_records_at(op, dtype, input_size, cell_size, attrs, target.key,
                             database.stamp(target))


@functools.lru_cache(maxsize=256)
def _tuned_records_at(op, dtype, input_size, cell_size, attrs, target_json, stamp) -> tuple:
    """The records of :func:`_tuned_records`, cached per database state (``stamp``): building
    them serialises traces, too slow for every ``raw_ops`` call."""
    return records_of(_record_uses_at(op, dtype, input_size, cell_size, attrs, target_json,
                                      stamp))


def records_of(uses) -> tuple:
    """:attr:`BuildSpec.tuned` for the records ``uses`` name (:func:`record_uses`' form)."""
    from .tuning import database

    return tuple(sorted((u.block, u.best.task.key, database.trace_to_json(u.best.trace))
                        for u in uses if u.best is not None))


def record_uses(spec: BuildSpec) -> tuple:
    """Which tuning record each GEMM block of ``spec``'s kernel takes, and from which database
    (:class:`lstm_tvm.tuning.database.Use`, in kernel order), as the databases are now: the
    records :func:`make_spec` attaches to a spec it makes now."""
    from .tuning import database

    return _record_uses_at(spec.op, spec.dtype, spec.input_size, spec.cell_size, spec.attrs,
                           spec.target, database.stamp(spec.resolved))


@functools.lru_cache(maxsize=256)
def _record_uses_at(op, dtype, input_size, cell_size, attrs, target_json, stamp) -> tuple:
    from .tuning import database

    target = from_key(target_json)
    blocks = _gemm_blocks(op, dtype, input_size, cell_size, attrs, target.variant())
    return database.block_uses(target, blocks, stamp)


def gemm_blocks(spec: BuildSpec) -> tuple:
    """The GEMM blocks (:class:`~lstm_tvm.kernels.contract.GemmBlock`, symbolic sizes, in
    kernel order) tuning records are looked up for: those of the form of the kernel that
    ``spec``'s target builds (:func:`lstm_tvm.schedule.traits.kernel_variant`; a CUDA target's
    is the GPU form), with its weights in ``w``, as :func:`make_spec` looks records up."""
    return _gemm_blocks(spec.op, spec.dtype, spec.input_size, spec.cell_size, spec.attrs,
                        spec.resolved.variant())


@functools.lru_cache(maxsize=256)
def _gemm_blocks(op, dtype, input_size, cell_size, attrs, variant: KernelVariant) -> tuple:
    from .tuning.tasks import kernel_gemms

    return tuple(kernel_gemms(op, dtype, input_size, cell_size, dict(attrs), variant))


def input_alignment(spec: BuildSpec) -> int:
    """The byte alignment ``spec``'s kernel needs of its input tensors' data: the element's
    size for a CPU, TVM's :data:`~._host_arrays.ALIGNMENT` otherwise."""
    return spec.variant.input_align(spec.dtype) or ALIGNMENT


def primfunc(spec: BuildSpec, failures: list | None = None):
    """The scheduled PrimFunc of ``spec``, named :attr:`BuildSpec.func_name` (blocks no
    schedule applied to are appended to ``failures``, see :func:`schedule_for`)."""
    func = kernel_func(spec.op, spec.dtype, spec.input_size, spec.cell_size, dict(spec.attrs),
                       spec.variant)
    tuned = {name: json.loads(trace) for name, _, trace in spec.tuned}
    func = schedule_for(spec.op, func, spec.resolved.target, failures, tuned=tuned)
    return func.with_attr("global_symbol", spec.func_name)


def primfuncs(spec: BuildSpec) -> dict:
    """Every scheduled PrimFunc of ``spec``'s module by name: the kernel's (:func:`primfunc`),
    and a prepacked kernel's weight packing."""
    funcs = {spec.func_name: primfunc(spec)}
    if spec.pack_func_name:
        funcs[spec.pack_func_name] = pack_primfunc(spec)
    return funcs


def pack_primfunc(spec: BuildSpec):
    """The scheduled PrimFunc ``(w, *panels)`` named :attr:`BuildSpec.pack_func_name` that
    fills the weight panels of a prepacked ``spec``'s kernel."""
    func = pack_func(spec.op, spec.dtype, spec.input_size, spec.cell_size, spec.variant)
    func = schedule_for(spec.op, func, spec.resolved.target)
    return func.with_attr("global_symbol", spec.pack_func_name)


def build(spec: BuildSpec):
    """Compile ``spec`` with ``tvm.compile``; returns the ``tvm.runtime.Executable``."""
    target = spec.resolved.target
    mod = tvm.IRModule(primfuncs(spec))
    with build_scope(target):  # CUDA: nvcc/NVRTC take the arch from the current target
        return tvm.compile(mod, target=target)


_memory: dict[BuildSpec, object] = {}
_memory_lock = threading.Lock()
_generation = [0]


def clear_memory_cache() -> None:
    """Forget the modules loaded in this process (the disk cache is untouched), and what
    ``raw_ops`` remembers of earlier calls (the next call looks tuning records up again)."""
    with _memory_lock:
        _memory.clear()
        _generation[0] += 1


def generation() -> int:
    """How many times :func:`clear_memory_cache` ran: what ``raw_ops`` keeps is valid for one
    generation."""
    return _generation[0]


def cache_path(spec: BuildSpec) -> Path:
    """Where ``spec``'s shared library lives in the disk cache."""
    return env.cache_dir() / f"tvm-{tvm.__version__}" / f"{spec.op}-{spec.dtype}-{spec.digest()}.so"


def get_module(spec: BuildSpec):
    """The loaded ``tvm.runtime.Module`` for ``spec`` (memory, then disk, then build)."""
    with _memory_lock:
        mod = _memory.get(spec)
    if mod is not None:
        return mod
    mod = _load_or_build(spec)
    with _memory_lock:
        return _memory.setdefault(spec, mod)


def _load_or_build(spec: BuildSpec):
    path = cache_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        mod = _load_verified(spec, path)
        if mod is not None:
            return mod
        log.info("lstm_tvm: compiling %s %s I=%d H=%d", spec.op, spec.dtype,
                 spec.input_size, spec.cell_size)
        executable = build(spec)
        with atomic_path(path) as tmp:
            executable.export_library(str(tmp))
            digest = _file_sha256(tmp)
        with atomic_path(_meta_path(path)) as tmp:
            tmp.write_text(json.dumps(
                {"spec": dataclasses.asdict(spec), "sha256": digest, "tvm": tvm.__version__}))
        return tvm.runtime.load_module(str(path))


def _meta_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _load_verified(spec: BuildSpec, path: Path):
    """Load a cache entry only if its checksum and spec match; otherwise drop it."""
    meta = _meta_path(path)
    if not (path.exists() and meta.exists()):
        return None
    try:
        info = json.loads(meta.read_text())
        if info.get("spec") != json.loads(json.dumps(dataclasses.asdict(spec))):
            raise ValueError("spec mismatch")
        if info.get("sha256") != _file_sha256(path):
            raise ValueError("checksum mismatch")
        return tvm.runtime.load_module(str(path))
    except Exception as err:  # a corrupted entry is rebuilt, never trusted
        log.warning("lstm_tvm: discarding cache entry %s (%s)", path, err)
        for p in (path, meta):
            p.unlink(missing_ok=True)
        return None


def _file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(functools.partial(fh.read, 1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
