"""The package's modules import each other in layers: no import cycle inside lstm_tvm, between
modules or between its packages (``lstm_tvm.onnx`` may use ``lstm_tvm.export`` or the other
way round, not both).

Every ``import`` statement counts, at module level or inside a function (a deferred import
still makes the two modules depend on each other), and importing ``a.b.c`` depends on the
package ``a.b`` too (its ``__init__`` runs first).
"""

import ast
from pathlib import Path

import lstm_tvm

PACKAGE = Path(lstm_tvm.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("lstm_tvm", *path.relative_to(PACKAGE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names)
    deps = set()
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # the module and every package above it
            prefix = ".".join(parts[:k])
            if prefix in modules and prefix != module and not module.startswith(prefix + "."):
                deps.add(prefix)
    return deps


def import_graph() -> dict[str, set[str]]:
    """Module name -> the lstm_tvm modules it imports (see the module docstring)."""
    modules = _modules()
    return {m: _imported(m, p, modules) for m, p in modules.items()}


def unit(module: str) -> str:
    """The first-level part of lstm_tvm that ``module`` belongs to: ``lstm_tvm.onnx`` for
    ``lstm_tvm.onnx.native``, a top-level module itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """:func:`import_graph` between first-level parts (:func:`unit`): a part imports another
    when one of its modules imports one of the other's."""
    found: dict[str, set[str]] = {}
    for module, deps in graph.items():
        found.setdefault(unit(module), set()).update(
            unit(d) for d in deps if unit(d) != unit(module))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_the_package():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph(import_graph())) == []


def test_the_package_graph_finds_cycles_between_packages():
    graph = import_graph()
    assert "lstm_tvm.export" in package_graph(graph)["lstm_tvm.bench"]
    # a deferred import of the export from a module of the ONNX package, as there was one
    graph["lstm_tvm.onnx.native"] = graph["lstm_tvm.onnx.native"] | {"lstm_tvm.export.writer"}
    assert cycles(graph) == []  # no cycle of modules ...
    assert cycles(package_graph(graph)) == [["lstm_tvm.export", "lstm_tvm.onnx"]]  # ... of packages


def test_the_cycle_finder_finds_cycles():
    graph = import_graph()
    assert "lstm_tvm.registry" in graph["lstm_tvm.validation"]  # relative imports resolved
    graph["lstm_tvm.registry"] = graph["lstm_tvm.registry"] | {"lstm_tvm.cli"}
    (found,) = cycles(graph)
    assert {"lstm_tvm.registry", "lstm_tvm.cli"} <= set(found)
