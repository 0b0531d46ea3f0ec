"""How a benchmark report (``lstm-tvm bench --json``, made by :mod:`lstm_tvm.bench.harness`)
is shown.

- :func:`render`: the text ``lstm-tvm bench`` prints, a table of at most :data:`WIDTH` columns
  (median, GFLOP/s, how far from this machine's limits, speed ratios), or every column with
  ``wide`` (``--wide``).
- :func:`load_reports`, :func:`speedups`, :func:`page_markdown`, :func:`plot_machine`: the
  documentation's performance page, made when the site builds from the reports committed as
  ``docs/performance/<records key>.json`` (one per machine): per machine its line (CPU,
  records key, cores, versions, date, command), a table of lstm_tvm's median and its speed
  ratios against each peer, and a plot of those ratios per case, shape and batch.

A speed ratio ``vs X`` is X's median time divided by lstm_tvm's: above 1, lstm_tvm is faster.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import textwrap
from pathlib import Path

from . import limits as bench_limits
from . import worker as peers
from .cli_common import format_table
from .harness import OURS, PEER_NAMES, case_flops, describe_machine

__all__ = ["WIDTH", "render", "load_reports", "speedups", "page_markdown", "plot_machine"]

#: Columns of the default ``lstm-tvm bench`` output.
WIDTH = 100
#: Case names of the compact table (``peers.CASES`` holds the full ones).
SHORT_CASES = {"seq_fwd": "seq fwd", "seq_bwd": "seq bwd", "cell_fwd": "cell fwd",
               "cell_bwd": "cell bwd gates", "cell_bwd_full": "cell bwd+mm"}
#: Statuses shortened in the compact table; the notes below it give the full status.
SHORT_STATUS = {"not installed": "missing"}
#: The peers lstm_tvm is compared with, in the order of the columns and the bars.
PEERS = ("tf", "torch", "ort", "numpy")


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _shape(row) -> str:
    return "x".join(map(str, row["shape"]))


def _wrap_items(items, width: int = WIDTH) -> list[str]:
    """``items`` joined by ", " in lines of at most ``width`` columns, broken between items."""
    lines, line = [], ""
    for item in items:
        if line and len(line) + 2 + len(item) + 1 > width:
            lines.append(line + ",")
            line = "  " + item
        else:
            line = f"{line}, {item}" if line else item
    return lines + [line]


def _wrap(text: str, width: int = WIDTH) -> list[str]:
    return [part for line in text.splitlines() or [""]
            for part in textwrap.wrap(line, width, subsequent_indent="  ",
                                      break_on_hyphens=False) or [""]]


# --- lstm-tvm bench's output --------------------------------------------------------------------

def render(report: dict, wide: bool = False) -> str:
    """The header lines, the table and the notes, as ``lstm-tvm bench`` prints them.

    Parameters
    ----------
    report : dict
        What :func:`lstm_tvm.bench.run` returns (or ``--json`` wrote).
    wide : bool
        Every column (min ms, GB/s, peak MiB, compile s, what was timed) in long lines;
        otherwise lines of at most :data:`WIDTH` columns, without the ``n/a`` rows.
    """
    meta, rows = report["meta"], report["results"]
    versions = [f"{k} {val}" for k, val in meta["versions"].items() if val]
    run = [f"threads {meta['threads']}", f"repeat {meta['repeat']} (medians)",
           f"warmup {meta['warmup']}", f"dtype {meta['dtype']}", f"isolate {meta['isolate']}",
           f"isa {meta.get('isa', 'native')}"]
    load = (f"load avg {meta['load_avg'][0]:.2f} -> {meta['load_avg'][1]:.2f} "
            f"(1 min, whole machine)")
    machine = f"machine: {describe_machine(meta['machine'])}"
    limits = meta.get("limits")  # reports made before the bench measured them have none
    limit_items = bench_limits.describe(limits, meta["machine"].get("cpu"))
    measured = bool(limits) and limits.get("status") == "ok"
    if wide:
        head = [", ".join(run + [machine, load])] + [", ".join(limit_items)] * bool(limits)
        head += [", ".join(versions)]
        body, notes = _wide_table(rows, measured), _wide_notes(rows)
    else:
        head = (_wrap_items(run) + _wrap_items(machine.split(", ") + [load])
                + (_wrap_items(limit_items) if limits else []) + _wrap_items(versions))
        body, notes = _compact_table(rows, measured), _compact_notes(rows)
    notes += _spread_notes(rows, meta.get("rounds", 1))
    return "\n".join(head + ["", body, ""] + notes + [f"wall time: {meta['wall_s']:.1f} s"])


def _status(row, short: bool = False) -> str | None:
    if row["status"] == "ok":
        return None
    return SHORT_STATUS.get(row["status"], row["status"]) if short else row["status"]


def _times(ratio: float) -> str:
    """A time over its floor in at most 4 characters: ``3.2x``, ``41x``, ``12kx``."""
    if ratio >= 999.5:
        return f"{ratio / 1e3:.0f}kx"
    return f"{ratio:.1f}x" if ratio < 9.95 else f"{ratio:.0f}x"


def _ratio(value) -> str:
    """A speed ratio in at most 4 characters but for ratios of 10000 and up: ``0.87``,
    ``14.8``, ``119`` (``-`` for None)."""
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 9.995 else f"{value:.1f}" if value < 99.95 else f"{value:.0f}"


def _limit(row, measured: bool, kind: str | None = None, short: bool = False) -> str:
    """The limit cell of a row: ``kind`` "peak" (share of the FMA peak), "floor" (median over
    the floor) or None (the one its batch calls for: the floor up to
    :data:`~lstm_tvm.bench.limits.FLOOR_MAX_BATCH`); ``n/a`` where the limits were not
    measured, ``-`` where it does not apply."""
    if kind is None:
        kind = "floor" if row["shape"][1] <= bench_limits.FLOOR_MAX_BATCH else "peak"
    if row["status"] != "ok" or not row.get("flops"):
        return "-"
    if not measured:
        return "n/a"
    value = row.get("peak_fraction" if kind == "peak" else "over_floor")
    if value is None:
        return "-"
    if kind == "floor":
        return _times(value)
    # 4 characters: a share above 999% means a disturbed peak measurement (--wide: the figure)
    return f"{min(value, 9.99) * 100:.0f}%" if short else f"{value * 100:.0f}%"


def _compact_table(rows, measured: bool = False) -> str:
    shown = [r for r in rows if (r["impl"], r["case"]) not in peers.NOT_APPLICABLE]
    return format_table(
        ("shape TxBxIxH", "case", "impl", "median ms", "GFLOP/s", "lim", "vs TF", "vs torch",
         "vs ORT", "vs roof"),
        [(_shape(r), SHORT_CASES[r["case"]], r["impl"],
          _status(r, short=True) or _num(r.get("median_ms"), ".3f"), _num(r["gflops"], ".1f"),
          _limit(r, measured, short=True), _ratio(r["vs_TF"]), _ratio(r["vs_torch"]),
          _ratio(r["vs_ORT"]), _ratio(r["vs_roofline"])) for r in shown],
        right=range(3, 10))


def _wide_table(rows, measured: bool = False) -> str:
    return format_table(
        ("shape TxBxIxH", "case", "impl", "median ms", "min ms", "GFLOP/s", "% peak", "x floor",
         "floor ms", "GB/s", "peak MiB", "vs TF", "vs torch", "vs ORT", "vs roofline",
         "compile s", "timed"),
        [(_shape(r), r["label"], r["impl"],
          _status(r) or _num(r.get("median_ms"), ".3f"),
          _num(min(r["times_ms"]) if r["status"] == "ok" else None, ".3f"),
          _num(r["gflops"], ".1f"), _limit(r, measured, "peak"),
          _limit(r, measured, "floor") if r["shape"][1] <= bench_limits.FLOOR_MAX_BATCH else "-",
          _num(r.get("floor_ms"), ".4f"),
          _num(r["gbs"], ".2f"), _num(r.get("peak_mib"), ".1f"),
          _num(r["vs_TF"], ".2f"), _num(r["vs_torch"], ".2f"), _num(r["vs_ORT"], ".2f"),
          _num(r["vs_roofline"], ".2f"),
          _num(r.get("compile_s"), ".2f") + ("*" if r.get("cached") else ""),
          r.get("what", "-")) for r in rows], right=range(3, 16))


def _spread_notes(rows, rounds: int) -> list[str]:
    """With ``--rounds``: each lstm_tvm row's slowest process median over its fastest."""
    spread = [f"{r['impl']} {SHORT_CASES[r['case']]} {_shape(r)} {r['process_spread']:.2f}"
              for r in rows if r["impl"] in OURS and r.get("process_spread")]
    if rounds < 2 or not spread:
        return []
    return textwrap.wrap(f"spread over {rounds} processes a case (slowest median / fastest): "
                         + ", ".join(spread), WIDTH, subsequent_indent="  ")


def _overhead_notes(rows) -> list[str]:
    return [f"raw_ops / CompiledOp {r['label']} {_shape(r)}: {r['over_kernel']:.3f} "
            f"({r['median_ms'] * 1e3:.1f} us per call)" for r in rows if r.get("over_kernel")]


_FLOOR_NOTE = ("floor = S passes over W_h (S = T, 1 for cells) at the measured streaming rate "
               "+ the other GEMM FLOPs (input projection; backward also the x and w gradients) "
               "at the FMA peak (docs/guide/benchmark.md).")


def _wide_notes(rows) -> list[str]:
    notes = ["vs X = X's median time / this row's median (> 1: this row is faster); vs TF, "
             "torch and ORT on lstm_tvm, bound and raw_ops rows; roofline = NumPy float32 GEMM "
             "of the same FLOPs. lstm_tvm = CompiledOp on TVM tensors with out=; bound = the "
             "same with w bound (CompiledOp.bind: packed once, as ORT's initializers); raw_ops = "
             "lstm_tvm.raw_ops on NumPy arrays, TF and PyTorch imported in its process; ORT = "
             "ONNX Runtime's built-in LSTM op.",
             "min ms far below median ms: the calls were disturbed (other load on the cores).",
             "% peak = GFLOP/s / this machine's float32 FMA peak (the limits: line); x floor "
             "(B <= 2) = median / floor ms; " + _FLOOR_NOTE,
             "GB/s (cell cases) = bytes of all op inputs+outputs / time; peak MiB = RSS "
             "high-water growth during the calls; compile s * = loaded from the disk cache."]
    return notes + _overhead_notes(rows) + [
        f"{r['impl']} {r['label']} {_shape(r)}: {r['status']}: {r.get('error', '')}"
        for r in rows if r["status"] != "ok"]


def _compact_notes(rows) -> list[str]:
    notes = ["vs X = X's median / this row's median (above 1: this row is faster), on the "
             "lstm_tvm, bound and raw_ops rows; roof = NumPy float32 GEMM of the same FLOPs "
             "(cell bwd gates: a copy of its bytes). lstm_tvm = CompiledOp with out=; bound = "
             "w bound (packed once); raw_ops = lstm_tvm.raw_ops on NumPy arrays; ORT = ONNX "
             "Runtime's LSTM op. cell bwd gates = LSTMBlockCellGrad alone; cell bwd+mm = with "
             "cell_grad_matmul. --wide: min ms, GB/s, peak MiB, compile s and what was timed; "
             "--json: every figure.",
             "lim = how far from this machine's limits (the limits: line): at B <= 2 the "
             "median over the floor (e.g. 3.2x), at larger batches the share of the FMA peak "
             "reached (e.g. 41%); " + _FLOOR_NOTE]
    skipped: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if (r["impl"], r["case"]) in peers.NOT_APPLICABLE:
            cases = skipped.setdefault((r["impl"], peers.NOT_APPLICABLE[r["impl"], r["case"]]), [])
            if SHORT_CASES[r["case"]] not in cases:
                cases.append(SHORT_CASES[r["case"]])
    if skipped:
        notes.append("Not shown (n/a): " + "; ".join(
            f"{impl} {', '.join(cases)} ({why})" for (impl, why), cases in skipped.items()) + ".")
    notes += _overhead_notes(rows)
    notes += [f"{r['impl']} {r['label']} {_shape(r)}: {r['status']}: {r.get('error', '')}"
              for r in rows if r["status"] != "ok"
              and (r["impl"], r["case"]) not in peers.NOT_APPLICABLE]
    return [line for note in notes for line in _wrap(note)]


# --- the performance page -----------------------------------------------------------------------

def load_reports(folder) -> dict[str, dict]:
    """The reports ``folder/*.json``, by records key (the file's name), in name order.

    Raises
    ------
    ValueError
        When a file is not a bench report or its machine's records key is not its name.
    """
    reports = {}
    for path in sorted(Path(folder).glob("*.json")):
        report = json.loads(path.read_text())
        meta = report.get("meta") if isinstance(report, dict) else None
        key = (meta or {}).get("machine", {}).get("records_key")
        if key != path.stem or "results" not in report:
            raise ValueError(f"{path}: expected an `lstm-tvm bench --json` report of the machine "
                             f"whose records key is the file's name {path.stem!r}, got records "
                             f"key {key!r}")
        reports[key] = report
    return reports


def speedups(report: dict) -> list[dict]:
    """One row per (shape, case) of ``report``, in its order: ``shape``, ``case``, the medians
    ``lstm_tvm_ms`` and ``bound_ms``, lstm_tvm's ``gflops`` and ``vs`` (peer -> that peer's
    median / lstm_tvm's, None where either did not run)."""
    ms = {(tuple(r["shape"]), r["case"], r["impl"]): r["median_ms"] for r in report["results"]
          if r["status"] == "ok"}
    out = []
    for shape in map(tuple, report["meta"]["shapes"]):
        for case in report["meta"]["cases"]:
            ours = ms.get((shape, case, "lstm_tvm"))
            flops = case_flops(case, *shape)
            out.append({"shape": shape, "case": case, "lstm_tvm_ms": ours,
                        "bound_ms": ms.get((shape, case, "bound")),
                        "gflops": flops / (ours * 1e6) if ours and flops else None,
                        "vs": {p: ms[shape, case, p] / ours if ours and (shape, case, p) in ms
                               else None for p in PEERS}})
    return out


def _machine_lines(key: str, meta: dict) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    python = f"Python {meta['python']}, " if meta.get("python") else ""
    load = meta.get("load_avg") or [math.nan, math.nan]
    lines = [f"- Machine: {describe_machine(meta['machine'])}.",
             f"- Run: {meta['dtype']}, {meta['threads']} threads, medians of {meta['repeat']} "
             f"calls after {meta['warmup']} untimed, isolate {meta['isolate']}, isa "
             f"{meta.get('isa', 'native')}; load average {load[0]:.2f} -> {load[1]:.2f} "
             "(1 minute, whole machine).",
             f"- Versions: {python}{versions}.",
             *_limits_line(meta),
             f"- Date: {meta.get('date') or 'not recorded'}."]
    if meta.get("command"):
        lines += ["", "Made with:", "", "```bash",
                  f"{meta['command']} --json docs/performance/{key}.json", "```"]
    return lines


def _limits_line(meta: dict) -> list[str]:
    """The page's line of the machine's limits; none for a report made before the bench
    measured them."""
    items = bench_limits.describe(meta.get("limits"), meta["machine"].get("cpu"))
    return [f"- Limits: {', '.join(items).removeprefix('limits: ')}."] if items else []


def _machine_table(rows: list[dict]) -> list[str]:
    head = ["shape TxBxIxH", "case", "lstm_tvm ms", "bound ms", "GFLOP/s"]
    head += [f"vs {PEER_NAMES[p]}" for p in PEERS]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "--:|" * (len(head) - 2)]
    for r in rows:
        cells = ["x".join(map(str, r["shape"])), peers.CASES[r["case"]],
                 _num(r["lstm_tvm_ms"], ".3f"), _num(r["bound_ms"], ".3f"),
                 _num(r["gflops"], ".1f")] + [_num(r["vs"][p], ".2f") for p in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def page_markdown(reports: dict, image_dir, image_uri: str = "", level: int = 3) -> str:
    """The performance page's generated part (MyST Markdown) for ``reports``
    (:func:`load_reports`): per machine a heading, its line, the table and the plot, which is
    written to ``image_dir/<records key>.png`` and linked as ``image_uri + "<key>.png"``."""
    out = []
    for key, report in reports.items():
        meta = report["meta"]
        rows = speedups(report)
        plot_machine(report, Path(image_dir) / f"{key}.png")
        out += [f"{'#' * level} {key}: {meta['machine']['cpu']}", ""]
        out += _machine_lines(key, meta) + [""] + _machine_table(rows) + [""]
        out += [f"![lstm_tvm against each peer on {key}]({image_uri}{key}.png)", "",
                "Each bar: the peer's median time / lstm_tvm's (CompiledOp), per case and "
                "shape (T x B x I x H; B, the batch, under it), drawn from 1: up, lstm_tvm is "
                "faster; down, slower (log scale). roofline: a NumPy float32 GEMM of the same "
                "FLOPs.", ""]
    return "\n".join(out) if out else "No benchmark report is committed yet.\n"


def _minor_labels(span: float):
    """Minor tick labels of a log axis spanning a factor ``span``: every one within a decade
    (no major tick may be in view), 2s and 5s within two, none beyond."""
    from matplotlib.ticker import FuncFormatter

    def label(v, _):
        lead = round(v / 10 ** math.floor(math.log10(v)))
        return f"{v:g}" if span < 10 or (span < 100 and lead in (2, 5)) else ""

    return FuncFormatter(label)


def plot_machine(report: dict, path) -> Path:
    """Write ``path`` (PNG): one panel per case, bars of each peer's median / lstm_tvm's per
    shape (:func:`speedups`), log scale, a line at 1. Needs matplotlib (the ``docs`` extra)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    rows = speedups(report)
    cases = [c for c in report["meta"]["cases"] if any(r["case"] == c for r in rows)]
    shown = [p for p in PEERS if any(r["vs"][p] for r in rows)]
    ncols = min(3, max(1, len(cases)))
    nrows = math.ceil(len(cases) / ncols) if cases else 1
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    width = 0.8 / max(1, len(shown))
    for ax, case in zip(axes.flat, cases):
        case_rows = [r for r in rows if r["case"] == case]
        for k, peer in enumerate(shown):
            bars = [(i + (k - (len(shown) - 1) / 2) * width, r["vs"][peer])
                    for i, r in enumerate(case_rows) if r["vs"][peer]]
            # from 1 up (lstm_tvm faster) or down (slower)
            ax.bar([x for x, _ in bars], [y - 1 for _, y in bars], width, bottom=1,
                   color=f"C{k}", label=PEER_NAMES[peer])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ratios = [r["vs"][p] for r in case_rows for p in shown if r["vs"][p]] + [1.0]
        ax.yaxis.set_minor_formatter(_minor_labels(max(ratios) / min(ratios)))
        ax.set_xticks(range(len(case_rows)),
                      ["{}x{}x{}x{}\nB={}".format(*r["shape"], r["shape"][1])
                       for r in case_rows], fontsize=7)
        ax.set_title(peers.CASES[case], fontsize=9)
        ax.set_ylabel("peer time / lstm_tvm time", fontsize=8)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside upper center",
                   ncols=len(legend))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed: a build reading the folder never sees half a file.
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
