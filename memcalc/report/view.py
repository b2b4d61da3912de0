"""What the command line and a notebook show of a result: the concise view or every table (``renderables``,
``render``), and the plain text and HTML fragment a notebook displays (``to_text_and_html``). It sits above the
pieces it composes (``memcalc.report.render``'s tables and lines, ``memcalc.report.concise``'s short view), which
import nothing from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from memcalc.report.fitted import Fitted
from memcalc.report.render import assumed_precision_line, comparison_table, estimate_parts, ranking_line, step_header
from memcalc.units import MemoryUnit, text_in_unit

if TYPE_CHECKING:
    from rich.console import RenderableType

    from memcalc.report.results import Comparison, Estimate


def renderables(obj: Estimate | Comparison, unit: MemoryUnit = "gib", verbose: bool = True) -> list[Text | Fitted]:
    """What ``render`` groups: the lines and tables, in order; ``verbose=False``: the concise view
    (``memcalc.report.concise``), what the command line prints unless --verbose."""
    kind = type(obj).__name__
    if not verbose and kind in ("Comparison", "Estimate"):
        from memcalc.report import concise

        return (concise.comparison_parts(obj, unit) if kind == "Comparison"  # type: ignore[arg-type]
                else concise.estimate_parts(obj, unit))  # type: ignore[arg-type]
    if kind == "Comparison":
        from memcalc.report.formats import accounting_line, auto_line

        lines = [x for x in (auto_line(obj), accounting_line(obj)) if x]  # type: ignore[arg-type]
        told = assumed_precision_line(obj)  # type: ignore[arg-type]
        return ([Fitted(comparison_table(obj, unit), breaks=("host RAM/node", step_header(obj))), ranking_line(obj)]  # type: ignore[arg-type]
                + ([Text(told, style="bold yellow")] if told else [])
                + [Text("note: " + text_in_unit(line, unit), style="dim") for line in lines])
    if kind == "Estimate":
        return estimate_parts(obj, unit)  # type: ignore[arg-type]
    raise TypeError(f"cannot render {type(obj).__name__}")


def render(obj: Estimate | Comparison, unit: MemoryUnit = "gib", verbose: bool = True) -> RenderableType:
    from rich.console import Group

    return Group(*renderables(obj, unit, verbose))


def to_text_and_html(obj: Estimate | Comparison, width: int = 120) -> tuple[str, str]:
    """Plain text and HTML of the rendering, for Jupyter/IPython display: at least ``width`` columns, wider when a
    table needs it, so that no number is ever cut."""
    from rich.console import Console

    renderable = render(obj)
    probe = Console(width=10_000, file=_Null(), markup=False, emoji=False, highlight=False)
    tables = [r.table for r in getattr(renderable, "renderables", [renderable]) if isinstance(r, Fitted)]
    width = max([width] + [probe.measure(t).maximum for t in tables])
    console = Console(record=True, width=width, file=_Null(), force_jupyter=False, markup=False, emoji=False,
                      highlight=False)
    console.print(renderable)
    return console.export_text(clear=False), console.export_html(inline_styles=True, code_format=HTML_FRAGMENT)


HTML_FRAGMENT = ('<div class="memcalc" style="max-width:100%;overflow:auto">'
                 '<pre style="margin:0;line-height:1.25;font-family:Menlo,\'DejaVu Sans Mono\',Consolas,monospace">'
                 '<code style="font-family:inherit">{code}</code></pre></div>')
"""What a notebook shows: a fragment inside the cell's output (no page, no <style> that restyles the page or sets its
background: unstyled text keeps the notebook's own colours, light or dark), no wider than the output area (wider
tables scroll inside it). rich's ``export_html`` fills ``{code}``; its ``{stylesheet}``, ``{foreground}`` and
``{background}`` are left out on purpose."""


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
