"""memcalc's modules import one way: no cycle among their module-level imports, nor once the imports made inside
functions (deferred for start-up time) are counted too (read with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "memcalc"


def _module(path: Path) -> str:
    parts = ["memcalc", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str], deferred: bool = False) -> set[str]:
    """The memcalc modules ``path`` imports at module level (not under TYPE_CHECKING); ``deferred``: inside functions
    and classes too."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = {f"{base}.{a.name}" for a in node.names} & modules  # ``from memcalc.cli import estimate``
                found.update(subs if len(subs) == len(node.names) else subs | {base})
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With,
                                                ast.For, ast.While)):
                visit(node.body + getattr(node, "orelse", []))

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m in modules and m != name}


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    return {m: _imports(p, set(files), deferred) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_reader_sees_imports_and_finds_a_cycle():
    graph = import_graph()
    assert "memcalc.errors" in graph["memcalc.validated"]  # a module-level import is read
    assert "memcalc.report.view" not in graph["memcalc.report.result_base"]  # one inside a function is not
    assert "memcalc.report.view" in import_graph(deferred=True)["memcalc.report.result_base"]  # unless asked
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_memcalc():
    assert cycles(import_graph()) == []


def test_no_import_cycle_in_memcalc_counting_deferred_imports():
    assert cycles(import_graph(deferred=True)) == []
