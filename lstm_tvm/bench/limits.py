"""This machine's limits, as ``lstm-tvm bench`` compares lstm_tvm with them.

- The float32 FMA peak: every thread (one per core the bench uses, all at once) runs
  independent chains of FMAs at the widest vector width the C compiler targets.
- The streaming rate of a weight slice: every core sums its own slice of the recurrent weights
  ``W_h`` (``H x 4H``) over and over, as the recurrent product at a small batch reads its
  columns of ``W_h`` every step; at ``I = H = 256`` float32 (1 MiB, 512 KiB a core on 2 cores)
  a slice stays in the core's L2. Reported as GB/s per core and the time one pass over the
  whole ``W_h`` takes (every core streaming its slice once).

Both come from ``limits.c`` (beside this module; GCC/Clang vector extensions, so it
builds for x86-64 and AArch64 alike), compiled once with the system C compiler (``$CC``, else
``cc``, ``gcc`` or ``clang``; ``-O3 -march=native`` on x86-64, ``-mcpu=native`` on AArch64)
into lstm_tvm's cache folder and run in a subprocess that prints JSON. Each figure is the best
of :data:`REPEATS` runs of about :data:`SECONDS` each (``$LSTM_TVM_BENCH_LIMITS_S`` sets the
seconds). Without a C compiler :func:`measure` says why, and the bench's limit columns read
``n/a``.

How far a case is from its limit (:func:`case_limits`): cases at a batch above
:data:`FLOOR_MAX_BATCH` are compute-bound, measured as the fraction of the FMA peak they reach
(their GFLOP/s over the peak); at smaller batches the recurrent product streams ``W_h`` every
step, and the case's time is set against :func:`floor_s`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

from .. import env
from .._files import atomic_path

__all__ = ["SOURCE", "SECONDS", "REPEATS", "SECONDS_ENV", "FLOOR_MAX_BATCH", "REFERENCE_H",
           "compiler", "build", "measure", "wh_bytes", "slice_bytes", "needed_wh_bytes",
           "stream_of", "floor_s", "case_limits", "describe", "case_flops"]

SOURCE = Path(__file__).resolve().with_name("limits.c")
#: Seconds each measurement lasts (the best of :data:`REPEATS` is kept).
SECONDS = 0.3
REPEATS = 3
#: The environment variable that overrides :data:`SECONDS` (a short run for tests).
SECONDS_ENV = "LSTM_TVM_BENCH_LIMITS_S"
#: Cases up to this batch are set against :func:`floor_s`; larger ones against the FMA peak.
FLOOR_MAX_BATCH = 2
#: The streaming rate always measured and shown: ``W_h`` of ``I = H = 256``, float32.
REFERENCE_H = 256


def compiler() -> str | None:
    """The C compiler: ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on the ``PATH``;
    None when there is none."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def _target_flags(march: str | None) -> list[list[str]]:
    """The target flags to try, best first: ``march`` (e.g. ``x86-64-v3``, as ``lstm-tvm bench
    --isa`` builds lstm_tvm) or this CPU; then none (the compiler's baseline)."""
    if march is not None:
        return [[f"-march={march}"], []]
    machine = platform.machine().lower()
    native = "-mcpu=native" if machine.startswith(("aarch64", "arm64", "ppc", "powerpc")) \
        else "-march=native"
    return [[native], []]


def _cpu_identity() -> str:
    """What sets the instructions a ``-march=native`` binary may use: the architecture and
    the CPU's model and features (so a cache shared between machines keeps one per CPU)."""
    text = ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text = "\n".join(line for line in lines
                         if line.split(":")[0].strip() in ("model name", "flags", "Features",
                                                           "CPU part", "CPU implementer"))
    except OSError:
        pass
    return f"{platform.machine()}\n{platform.processor()}\n{text}"


def build(march: str | None = None) -> tuple[Path, list[str]]:
    """The limits program, compiled (once: the cache keeps it, keyed by the compiler, its
    version, the flags, the source and the CPU); returns its path and the command that built
    it. ``march``: see :func:`_target_flags`.

    Raises ``FileNotFoundError`` without a C compiler, ``RuntimeError`` when no flags build it.
    """
    cc = compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler ($CC, cc, gcc, clang) on PATH")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60,
                                 check=False).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{cc} --version: {exc}") from None
    source = SOURCE.read_bytes()
    errors = []
    for target in _target_flags(march):
        flags = ["-O3", *target, "-ffp-contract=fast", "-pthread"]
        cmd = [cc, *flags, str(SOURCE), "-o"]
        key = hashlib.sha256("\0".join([cc, *flags, version, _cpu_identity()]).encode()
                             + source).hexdigest()[:16]
        output = env.cache_dir() / "bench_limits" / key / "bench_limits"
        if output.is_file():
            return output, cmd + [str(output)]
        output.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(output) as tmp:
                try:
                    proc = subprocess.run(cmd + [str(tmp)], capture_output=True, text=True,
                                          timeout=300, check=False)
                except (OSError, subprocess.SubprocessError) as exc:
                    errors.append(f"{' '.join(cmd)}: {exc}")
                    raise _Failed from None
                if proc.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-1000:]}")
                    raise _Failed
                tmp.chmod(0o755)
        except _Failed:
            continue
        return output, cmd + [str(output)]
    raise RuntimeError("building the limits program failed:\n" + "\n".join(errors))


class _Failed(Exception):
    """A compiler run that failed (the ``with`` block removes its partial output)."""


def wh_bytes(H: int, itemsize: int = 4) -> int:
    """Bytes of the recurrent weights ``W_h``: ``H x 4H`` elements of ``itemsize`` bytes."""
    return 4 * H * H * itemsize


def slice_bytes(wh: int, threads: int) -> int:
    """Bytes of ``W_h`` (``wh`` bytes) each of ``threads`` cores streams: an equal share."""
    return -(-wh // threads)


def case_flops(case: str, T: int, B: int, I: int, H: int) -> int | None:
    """GEMM FLOPs: forward ``8*T*B*H*(I+H)``, backward twice that, cells with ``T = 1``.

    ``cell_bwd`` (LSTMBlockCellGrad alone: gate gradients, elementwise) has none: None.
    """
    per = 8 * (T if case.startswith("seq") else 1) * B * H * (I + H)
    return {"seq_fwd": per, "seq_bwd": 2 * per, "cell_fwd": per, "cell_bwd": None,
            "cell_bwd_full": 2 * per}[case]


def needed_wh_bytes(shapes, cases, itemsize: int) -> list[int]:
    """The sizes of ``W_h`` whose streaming a bench run needs: the reference (``H = 256``,
    float32) and, for every shape whose batch is at most :data:`FLOOR_MAX_BATCH` and that
    runs a case with a GEMM, ``W_h`` of its ``H`` at the run's ``itemsize``."""
    sizes = [wh_bytes(REFERENCE_H)]
    for T, B, I, H in shapes:
        if B <= FLOOR_MAX_BATCH and any(case_flops(c, T, B, I, H) for c in cases):
            sizes.append(wh_bytes(H, itemsize))
    return list(dict.fromkeys(sizes))


def measure(threads: int, wh_sizes=(wh_bytes(REFERENCE_H),), *, seconds: float | None = None,
            repeats: int = REPEATS, march: str | None = None, timeout: float = 600.0) -> dict:
    """Measure the FMA peak on ``threads`` threads and the streaming of each ``W_h`` of
    ``wh_sizes`` bytes split over them.

    Returns ``{"status": "ok", "isa", "vector_bits", "fma", "threads", "cpus" (those the
    process may run on; 0 where the system does not say), "pinned" (each thread to its CPU),
    "fma_peak_gflops", "fma_gflops" (every run), "fma_one_core_gflops" (one thread alone),
    "core_scaling" (the peak over ``threads`` times one core alone: about 1 where the cores
    are whole cores, less where they share execution units), "stream": [...], "seconds",
    "repeats", "build"}``, one ``stream`` entry per size: ``wh_bytes``, ``slice_bytes`` (per
    core, rounded up to whole vector groups), ``pass_s`` (the best time of one pass over the
    whole ``W_h``, every core streaming its slice once), ``pass_runs_s``, ``gbs_per_core`` and
    ``gbs`` (all cores). Without a compiler, or when the program fails: ``{"status": "n/a",
    "error"}``.
    """
    if seconds is None:
        seconds = float(os.environ.get(SECONDS_ENV) or SECONDS)
    try:
        program, command = build(march)
        slices = [slice_bytes(wh, threads) for wh in wh_sizes]
        out = _run(program, threads, seconds, repeats, slices, timeout)
        # one core alone: how much of threads x its rate the cores reach together shows cores
        # that share a physical core (SMT siblings, a VM's vCPUs placed so by its host)
        alone = _run(program, 1, seconds, repeats, [], timeout) if threads > 1 else out
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
        return {"status": "n/a", "error": str(exc).strip() or type(exc).__name__}
    stream = [{"wh_bytes": wh, "slice_bytes": s["slice_bytes"], "pass_s": s["best_pass_s"],
               "pass_runs_s": s["pass_s"], "gbs_per_core": s["gbs_per_core"], "gbs": s["gbs"]}
              for wh, s in zip(wh_sizes, out["stream"])]
    return {"status": "ok", "isa": out["isa"], "vector_bits": out["vector_bits"],
            "fma": out["fma"], "threads": out["threads"], "cpus": out["cpus"],
            "pinned": out["pinned"],
            "fma_peak_gflops": out["fma_peak_gflops"], "fma_gflops": out["fma_gflops"],
            "fma_one_core_gflops": alone["fma_peak_gflops"],
            "core_scaling": out["fma_peak_gflops"] / (threads * alone["fma_peak_gflops"]),
            "stream": stream, "seconds": seconds, "repeats": repeats,
            "build": " ".join(command)}


def _run(program: Path, threads: int, seconds: float, repeats: int, slices: list,
         timeout: float) -> dict:
    """The limits program's JSON for one run of it."""
    args = [str(program), str(threads), repr(seconds), str(repeats), *map(str, slices)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {proc.returncode}: "
                           f"{proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def stream_of(limits: dict | None, wh: int) -> dict | None:
    """The ``stream`` entry of ``limits`` (:func:`measure`) for ``W_h`` of ``wh`` bytes."""
    if not limits or limits.get("status") != "ok":
        return None
    return next((s for s in limits["stream"] if s["wh_bytes"] == wh), None)


def floor_s(case: str, T: int, B: int, I: int, H: int, peak_gflops: float,
            pass_s: float) -> float | None:
    """The least time a case can take at a small batch, in seconds; None for a case without a
    GEMM (``cell_bwd``).

    ``floor = S * max(t_pass, 8*B*H*H / P) + F / P``

    - ``S``: the recurrent steps, ``T`` (sequence cases) or 1 (cell cases); each reads all of
      ``W_h`` (``H x 4H``): ``h @ W_h`` forward, ``dgates @ W_h^T`` backward;
    - ``t_pass``: the measured time of one pass over ``W_h`` at this ``H`` and dtype, every
      core streaming its slice (:func:`measure`); ``8*B*H*H / P``: that step's own FLOPs at
      the peak, which cannot beat it either (at a small batch the pass is the larger);
    - ``F``: the FLOPs that do not wait on the recurrence, at the FMA peak ``P``
      (``peak_gflops`` GFLOP/s): forward the input projection ``x @ W_x`` (``8*S*B*H*I``);
      backward the ``x`` gradient ``dgates @ W_x^T`` (as many) and the ``w`` gradient
      ``[x, h]^T @ dgates`` (``8*S*B*H*(I+H)``), so ``F = 8*S*B*H*(2I+H)``.

    The recurrent and the other FLOPs add up to the case's (:func:`case_flops`).
    """
    steps = T if case.startswith("seq") else 1
    if case in ("seq_fwd", "cell_fwd"):
        other = 8 * steps * B * H * I
    elif case in ("seq_bwd", "cell_bwd_full"):
        other = 8 * steps * B * H * (2 * I + H)
    else:
        return None
    peak = peak_gflops * 1e9
    return steps * max(pass_s, 8 * B * H * H / peak) + other / peak


def case_limits(limits: dict | None, case: str, shape, itemsize: int, median_ms: float | None,
                gflops: float | None) -> dict:
    """How far a timed case is from this machine's limits: ``peak_fraction`` (its GFLOP/s /
    the FMA peak), and at a batch of at most :data:`FLOOR_MAX_BATCH` ``floor_ms``
    (:func:`floor_s`) and ``over_floor`` (its median / the floor); None where they do not
    apply or the limits were not measured."""
    out = {"peak_fraction": None, "floor_ms": None, "over_floor": None}
    if not limits or limits.get("status") != "ok":
        return out
    T, B, I, H = shape
    peak = limits["fma_peak_gflops"]
    if gflops:
        out["peak_fraction"] = gflops / peak
    stream = stream_of(limits, wh_bytes(H, itemsize))
    if B <= FLOOR_MAX_BATCH and stream is not None:
        floor = floor_s(case, T, B, I, H, peak, stream["pass_s"])
        if floor is not None:
            out["floor_ms"] = floor * 1e3
            out["over_floor"] = median_ms / out["floor_ms"] if median_ms else None
    return out


def describe(limits: dict | None, cpu: str | None = None) -> list[str]:
    """``limits`` (:func:`measure`) as the phrases of the bench's ``limits:`` line: the CPU,
    the cores and ISA, the FMA peak, and each ``W_h`` streamed; ``[]`` for a report without
    limits."""
    if not limits:
        return []
    if limits.get("status") != "ok":
        return [f"limits: n/a ({limits.get('error', 'not measured').splitlines()[0]})"]
    pinned = ", pinned" if limits["pinned"] else ""
    fma = "FMA" if limits["fma"] else "no FMA: multiply + add"
    threads, cpus = limits["threads"], limits.get("cpus") or 0
    cores = (f"{threads} core{'s' * (threads > 1)} (a thread each{pinned})"
             if threads <= cpus or not cpus else f"{threads} threads on {cpus} CPUs")
    items = [f"limits: {cpu or 'this CPU'}", cores,
             f"{limits['isa']} ({limits['vector_bits']}-bit vectors, {fma})",
             f"FMA peak {limits['fma_peak_gflops']:.1f} GFLOP/s"]
    slowest = min(limits.get("fma_gflops") or [limits["fma_peak_gflops"]])
    if slowest < 0.9 * limits["fma_peak_gflops"]:  # another load on the cores meanwhile
        items[-1] += f" (slowest run {slowest:.1f}: the cores were shared)"
    if threads > 1 and limits.get("core_scaling"):  # reports made before it have none
        items.append(f"{limits['core_scaling']:.2f} of {threads}x one core alone "
                     f"({limits['fma_one_core_gflops']:.1f})")
    for s in limits["stream"]:
        items.append(f"W_h {_size(s['wh_bytes'])} ({_size(s['slice_bytes'])} a core) at "
                     f"{s['gbs_per_core']:.1f} GB/s a core: {s['pass_s'] * 1e6:.3g} us a pass")
    return items


def _size(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole part: ``512 KiB``, ``1.5 MiB``."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"
