"""The performance page's results, made from the committed benchmark reports
(``docs/performance/<records key>.json``) by lstm_tvm.bench.report: every machine is shown,
every ratio is the one its report's medians give, every plot is written."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import tvm.testing

from lstm_tvm.bench import report as bench_report
from lstm_tvm.bench import worker as bench_worker
from lstm_tvm.bench.harness import PEER_NAMES

DOCS = Path(__file__).resolve().parents[1] / "docs"
REPORTS = sorted((DOCS / "performance").glob("*.json"))


def _medians(report) -> dict:
    return {(tuple(r["shape"]), r["case"], r["impl"]): r["median_ms"]
            for r in report["results"] if r["status"] == "ok"}


def _sections(markdown: str) -> dict[str, str]:
    """Records key -> that machine's part of the generated page."""
    parts = re.split(r"^### ", markdown, flags=re.M)[1:]
    return {part.split(":", 1)[0]: part for part in parts}


def _table(section: str) -> dict[tuple[str, str], dict[str, str]]:
    """(shape, case label) -> column -> cell, from a machine's Markdown table."""
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["shape TxBxIxH"], cells["case"]] = cells
    return rows


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    pytest.importorskip("matplotlib", reason="the docs extra")
    images = tmp_path_factory.mktemp("perf_plots")
    reports = bench_report.load_reports(DOCS / "performance")
    return reports, bench_report.page_markdown(reports, images, "plots/"), images


def test_one_report_per_machine_named_by_its_records_key():
    assert REPORTS, "no benchmark report in docs/performance/"
    for path in REPORTS:
        meta = json.loads(path.read_text())["meta"]
        assert meta["machine"]["records_key"] == path.stem
        assert meta["command"].startswith("lstm-tvm bench --shapes ")
        assert meta["date"] and meta["python"] and meta["machine"]["cores"] >= 1
        assert meta["versions"]["apache-tvm"] and meta["versions"]["lstm-tvm"]


def test_page_shows_every_machine_and_the_ratios_of_its_medians(page):
    reports, markdown, _ = page
    sections = _sections(markdown)
    assert set(sections) == {p.stem for p in REPORTS}
    for key, report in reports.items():
        section, meta = sections[key], report["meta"]
        assert section.startswith(f"{key}: {meta['machine']['cpu']}\n")
        assert f"records key {key}, {meta['machine']['cores']} cores" in section
        assert f"{meta['command']} --json docs/performance/{key}.json" in section
        assert meta["date"] in section
        table, ms = _table(section), _medians(report)
        checked = 0
        for shape in map(tuple, meta["shapes"]):
            for case in meta["cases"]:
                row = table["x".join(map(str, shape)), bench_worker.CASES[case]]
                ours = ms.get((shape, case, "lstm_tvm"))
                assert row["lstm_tvm ms"] == ("-" if ours is None else f"{ours:.3f}")
                for peer in bench_report.PEERS:
                    cell = row[f"vs {PEER_NAMES[peer]}"]
                    theirs = ms.get((shape, case, peer))
                    if ours is None or theirs is None:
                        assert cell == "-", (key, shape, case, peer)
                        continue
                    # the cell is rounded to 2 decimals
                    assert abs(float(cell) - theirs / ours) <= 0.005 + 1e-9, (shape, case, peer)
                    checked += 1
        assert checked >= len(meta["shapes"]), f"{key}: too few ratios to check"


def test_page_ratios_agree_with_the_reports_own(page):
    """bench.harness.aggregate wrote lstm_tvm's ``vs_*`` fields when the report was made: the page
    says the same."""
    reports, markdown, _ = page
    for key, report in reports.items():
        table = _table(_sections(markdown)[key])
        for r in report["results"]:
            if r["impl"] != "lstm_tvm" or r["status"] != "ok":
                continue
            row = table["x".join(map(str, r["shape"])), bench_worker.CASES[r["case"]]]
            for peer in bench_report.PEERS:
                stored = r[f"vs_{PEER_NAMES[peer]}"]
                cell = row[f"vs {PEER_NAMES[peer]}"]
                assert (cell == "-") if stored is None else cell == f"{stored:.2f}"


def test_a_plot_per_machine(page):
    import matplotlib.image

    reports, markdown, images = page
    for key in reports:
        assert f"(plots/{key}.png)" in markdown
        pixels = matplotlib.image.imread(images / f"{key}.png")
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 400
        assert pixels[..., :3].std() > 0.05  # drawn, not a blank canvas
    assert sorted(p.name for p in images.iterdir()) == sorted(f"{k}.png" for k in reports)


def test_committed_reports_print_within_100_columns():
    for path in REPORTS:
        report = json.loads(path.read_text())
        lines = bench_report.render(report).splitlines()
        assert max(map(len, lines)) <= bench_report.WIDTH, path.name
        wide = bench_report.render(report, wide=True)
        assert "peak MiB" in wide and "compile s" in wide


def test_a_report_under_another_name_is_refused(tmp_path):
    report = json.loads(REPORTS[0].read_text())
    (tmp_path / "llvm-other.json").write_text(json.dumps(report))
    key = report["meta"]["machine"]["records_key"]
    with pytest.raises(ValueError, match=f"llvm-other.json.*'llvm-other'.*'{key}'"):
        bench_report.load_reports(tmp_path)


def test_the_page_keeps_its_history_below_the_results():
    pytest.importorskip("sphinx", reason="the docs extra")
    spec = importlib.util.spec_from_file_location("perf_page", DOCS / "_ext" / "perf_page.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = (DOCS / "performance.md").read_text()
    assert text.count(ext.MARKER) == 1
    assert text.index(ext.MARKER) < text.index("\n## History\n") < text.index("\n### 2026-")


if __name__ == "__main__":
    tvm.testing.main()
