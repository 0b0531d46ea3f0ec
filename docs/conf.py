"""Sphinx configuration of lstm_tvm's documentation (MyST Markdown pages, NumPy docstrings).

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (the ``docs`` extra); the tests
run the same build with warnings as errors (``tests/test_docs.py``). The performance page's
results are made from ``docs/performance/*.json`` by the local extension ``_ext/perf_page.py``.
"""

import sys
from pathlib import Path

import lstm_tvm

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "lstm_tvm"
author = "the lstm_tvm authors"
release = version = lstm_tvm.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx_click",
    "perf_page",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# Docstrings refer to TVM, ONNX and NumPy objects by name; without their inventories
# (no network at build time) the references stay plain text instead of failing the build.
intersphinx_mapping: dict = {}
nitpicky = False

html_theme = "furo"
html_title = f"lstm_tvm {release}"
