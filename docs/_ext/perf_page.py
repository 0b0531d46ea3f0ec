"""Sphinx extension: the results part of the performance page, made when the site builds.

The benchmark reports committed as ``docs/performance/<records key>.json``
(``lstm-tvm bench --json``, one per machine) become, through :mod:`lstm_tvm.bench.report`,
one section per machine (its line, a table, a plot) that replaces :data:`MARKER` in
``performance.md``. The plots are written to ``docs/_generated/performance/`` (ignored by git)
on every build; a changed report or generator makes the page be read again.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.errors import ExtensionError

from lstm_tvm.bench import report as bench_report

PAGE = "performance"
#: The reports, under the source folder.
DATA = "performance"
#: The plots, under the source folder (``exclude_patterns`` and ``.gitignore`` name it).
PLOTS = "_generated/performance"
MARKER = "<!-- machine results: generated from docs/performance/*.json -->"


def _generate(app, state: dict) -> None:
    src = Path(app.srcdir)
    state["sources"] = sorted((src / DATA).glob("*.json")) + [Path(bench_report.__file__)]
    state["markdown"] = bench_report.page_markdown(
        bench_report.load_reports(src / DATA), src / PLOTS, image_uri=PLOTS + "/")


def _inject(app, docname: str, source: list, state: dict) -> None:
    if docname != PAGE:
        return
    if source[0].count(MARKER) != 1:
        raise ExtensionError(f"{PAGE}.md: expected the line {MARKER!r} once, found it "
                             f"{source[0].count(MARKER)} times")
    for path in state["sources"]:
        app.env.note_dependency(str(path))
    source[0] = source[0].replace(MARKER, state["markdown"])


def setup(app):
    state: dict = {}
    app.connect("builder-inited", lambda app: _generate(app, state))
    app.connect("source-read", lambda app, docname, source: _inject(app, docname, source, state))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
