"""Measured figures live in docs/performance.md, not in the code: comments and docstrings keep
the reason and point to the page (a figure in a comment goes stale with the next change)."""

import io
import re
import tokenize
from pathlib import Path

import pytest
import tvm.testing

PACKAGE = Path(__file__).resolve().parents[1] / "lstm_tvm"
#: A number with a unit of time or throughput, as a measurement is quoted.
FIGURE = re.compile(r"\d(?:\.\d+)?\s?(?:ms|us|µs|ns|GFLOP/s|TFLOP/s|GB/s|MB/s)\b")


def _prose(path: Path):
    """(line, text) of the comments and plain (non-f) string literals of a module."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING
                                            and not re.match(r"[rbuRBU]*[fF]", tok.string)):
            yield tok.start[0], tok.string


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_measured_figures_in_comments(path):
    quoted = [f"{path.name}:{line}: {FIGURE.search(text).group(0)!r}"
              for line, text in _prose(path) if FIGURE.search(text)]
    assert not quoted, "measured figures belong in docs/performance.md:\n" + "\n".join(quoted)


def test_the_check_finds_a_figure(tmp_path):
    """The pattern catches the forms figures were quoted in."""
    module = tmp_path / "m.py"
    module.write_text('"""Ran in 0.89 ms."""\nX = 1  # 244-255 GFLOP/s\nY = f"{1} ms"\n')
    assert [line for line, text in _prose(module) if FIGURE.search(text)] == [1, 2]


if __name__ == "__main__":
    tvm.testing.main()
