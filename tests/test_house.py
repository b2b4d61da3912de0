"""The shape of the house, read with ``ast``: no file in memcalc/ over 450 lines, no function of the step engine
(memcalc/memory/) over 120, and the engine in folders that name its parts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "memcalc"


def test_no_file_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := p.read_text().count("\n")) > 450}
    assert long == {}


def test_no_function_of_the_step_engine_over_120_lines():
    long = {}
    for p in (ROOT / "memory").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 120:
                long[f"{p.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}


def test_the_memory_package_is_folders_that_name_its_parts():
    memory = ROOT / "memory"
    assert sorted(p.name for p in memory.iterdir() if p.is_dir() and p.name != "__pycache__") == [
        "accountings", "allocator", "engine", "families", "overlays"]
    assert [p.name for p in memory.glob("*.py")] == ["__init__.py"]
    for folder in ("accountings", "allocator", "engine", "families", "overlays"):
        assert ast.get_docstring(ast.parse((memory / folder / "__init__.py").read_text()))
