"""docs/notebook.ipynb in a real Jupyter kernel: results display as HTML tables that show every figure whole."""

from __future__ import annotations

import ast
import html
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"
GIB = 2**30


def _gib(n_bytes: int) -> str:
    """A size as the tables print it: GiB, thousands separated, two decimals."""
    return f"{n_bytes / GIB:,.2f}"


def _figures(result) -> list[str]:
    """Every figure the display must show whole: each memory row and the total of an estimate, and for a
    comparison each strategy's label and per-GPU total."""
    if type(result).__name__ == "Comparison":
        return [s for r in result.estimates for s in (r.strategy.label, _gib(r.memory.per_gpu.total))]
    g = result.memory.per_gpu
    return [_gib(row.bytes) for row in g.rows] + [_gib(g.total)]


def _shown(text: str, figure: str) -> bool:
    """``figure`` appears as a whole token: not cut (``104.…``) and not part of a longer number."""
    return re.search(rf"(?<![\w.,]){re.escape(figure)}(?![\w.,]*\d)", text) is not None


def _last_value(source: str, ns: dict):
    """Runs a cell in-process as the kernel does and returns its last expression's value."""
    tree = ast.parse(source)
    *body, last = tree.body
    exec(compile(ast.Module(body, []), "<cell>", "exec"), ns)
    assert isinstance(last, ast.Expr)
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env if env else "")
    try:
        client = nbclient.NotebookClient(nb, timeout=60, kernel_name="python3",
                                         resources={"metadata": {"path": str(ROOT)}})  # fmt: skip
        client.execute()
    finally:
        if env is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env
    return nb


def _displaying_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and re.search(r"memcalc\.(estimate|compare)\(", c.source)]


def test_notebook_runs_in_a_kernel_and_every_result_displays_as_html(executed):
    cells = _displaying_cells(executed)
    assert len(cells) == 4
    for cell in cells:
        shown = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert len(shown) == 1, cell.source
        assert not [o for o in cell.outputs if o.output_type == "error"]
        assert set(shown[0].data) >= {"text/html", "text/plain"}
        page = shown[0].data["text/html"]
        assert page.startswith('<div class="memcalc" style="max-width:100%;overflow:auto">'), page[:80]
        assert not re.search(r"<(html|body|head|style)\b", page)  # a fragment: nothing that restyles the page


def test_every_figure_appears_whole_in_the_html(executed):
    ns: dict = {}
    exec("import memcalc", ns)
    missing = []
    for cell in _displaying_cells(executed):
        result = _last_value(cell.source, ns)
        (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        page = html.unescape(re.sub(r"<[^>]+>", "", out.data["text/html"]))
        plain = out.data["text/plain"]
        figures = _figures(result)
        assert len(figures) >= 7  # not vacuous: the smallest estimate here has 6 rows and a total
        missing += [f"{cell.source}: {f!r}" for f in figures if not (_shown(page, f) and _shown(plain, f))]
    assert not missing, "cut or missing in the display:\n" + "\n".join(missing)


def test_shown_detects_a_cut_number():
    assert _shown("│ 104.35 │", "104.35")
    assert not _shown("│ 104.… │", "104.35")
    assert not _shown("│ 1,104.35 │", "104.35")
    assert not _shown("│ 104.355 │", "104.35")
