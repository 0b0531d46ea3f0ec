"""The documentation: the Sphinx site builds with warnings as errors, and README.md stays a
short guide whose links lead somewhere."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: Optional modules: a page importing a missing one skips.
OPTIONAL = ("tensorflow", "tf2onnx", "onnxruntime", "onnxruntime_extensions", "torch",
            "onnxscript")


def _pages_in_order() -> list[Path]:
    """The pages of the site's toctrees, in order (a page may read a file an earlier page's
    example wrote, e.g. ``step.onnx``)."""
    entries = re.findall(r"```\{toctree\}\n(?::[^\n]*\n)*\n?(.*?)```",
                         (DOCS / "index.md").read_text(), re.S)
    names = [line.strip() for block in entries for line in block.splitlines() if line.strip()]
    return [DOCS / f"{name}.md" for name in names]


PAGES = [p for p in _pages_in_order() if "```python" in p.read_text()]


def test_site_builds_without_warnings(tmp_path):
    """``sphinx-build -W`` (the ``docs`` extra): MyST pages, autodoc of the public API from
    its docstrings, the CLI reference from the click commands."""
    for module in ("sphinx", "myst_parser", "furo", "sphinx_click"):
        pytest.importorskip(module, reason="the docs extra")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", str(ROOT / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "html" / "cli.html").read_text().count("lstm-tvm") > 10
    api = (tmp_path / "html" / "api.html").read_text()
    assert "from_onnx" in api and "check_model" in api and "InferenceSession" in api


def test_readme_is_a_short_guide():
    """At most 400 lines, the quick start by line 150, no dated narrative."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 400, len(lines)
    quick = lines.index("## Quick start")
    first_code = next(k for k in range(quick, len(lines)) if lines[k] == "```python")
    assert first_code < 150, first_code
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, dated


def test_readme_links_resolve():
    """Every relative link of README.md names a file of the repository."""
    prose = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "README links to the documentation"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


@pytest.fixture(scope="module")
def examples_folder(tmp_path_factory):
    """One working folder for every page's examples, in the site's order."""
    return tmp_path_factory.mktemp("docs_examples")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_examples_run(page, examples_folder, monkeypatch):
    """A page's ```python blocks run as written, in order, in one namespace (a block may use
    what an earlier block of its page defined)."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    for module in OPTIONAL:
        if any(re.search(rf"^\s*(import|from) {module}\b", b, re.M) for b in blocks):
            pytest.importorskip(module)
    if any("native." in b for b in blocks):
        from lstm_tvm.onnx import native

        try:
            native.ort_include_dir()
        except FileNotFoundError as err:
            pytest.skip(f"cannot build the native custom-op library: {err}")
    if any('"step.onnx"' in b and "output_path" not in b for b in blocks) \
            and not (examples_folder / "step.onnx").exists():
        pytest.skip("needs step.onnx from the TF-graph page's example (the convert extra)")
    monkeypatch.chdir(examples_folder)
    namespace: dict = {}
    for k, block in enumerate(blocks):
        exec(compile(block, f"{page.relative_to(ROOT)} python block {k + 1}", "exec"), namespace)


def test_every_page_is_in_the_site():
    """No page is left out of the toctrees (Sphinx would only warn about an orphan)."""
    listed = set(_pages_in_order()) | {DOCS / "index.md"}
    pages = set(DOCS.rglob("*.md")) - set((DOCS / "_build").rglob("*.md"))
    assert pages <= listed, sorted(str(p.relative_to(DOCS)) for p in pages - listed)
