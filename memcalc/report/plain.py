"""A laid-out table as the plain text rich would draw, for output that shows no styles (a pipe, a file, CI logs).

rich draws each cell through its general machinery (options, a Text, word wrapping, segments cropped and padded line
by line): most of the time a command spends printing its tables. Where no styles are shown, only the characters
matter, and a cell whose text fits its column on one line is that text padded to the column, as rich pads it (left:
spaces after; right: trailing spaces dropped, spaces before). Everything else is rich's own doing: the box's
characters (``Box.get_top``, ``get_row``, ``get_bottom``), each title and each cell that wraps (``Text.wrap``, as
``Text.__rich_console__`` calls it), and, on a console, every cell holding markup-like text or characters wider or
narrower than one cell (``Console.render_lines`` on that cell alone). A table outside the narrow shape memcalc's tables
have (fixed column widths, left or right justified, a header, no footer, row styles, lines between rows or vertical
padding) is not drawn here: the caller hands it to rich. tests/test_render_plain.py holds both drawings to be the
same characters.

``text_lines`` and ``table_lines`` need no ``Console`` (importing rich.console is a third of what a command spends
printing): the command line uses them where it knows that rich's console would write plain text (``plain_text`` in
memcalc.report.render).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions

CellLines = Callable[[object, Any, int, int], "list[str] | None"]


def plain_console(console: Console) -> bool:
    """True when what ``console`` writes is the segments' text alone: no colour system (not a terminal, nothing forced),
    not recording (an export keeps the styles), not a notebook, not the legacy Windows console."""
    return (console.color_system is None and not console.record and not console.is_jupyter
            and not console.legacy_windows)  # fmt: skip


def _eligible(table: Table) -> bool:
    top, _, bottom, _ = table.padding
    return bool(
        table.columns and table.box is not None and table.show_header and not table.show_footer and table.show_edge
        and not table.show_lines and not table.leading and not table.expand and table.width is None
        and table.min_width is None and table.caption is None and not table.row_styles and not table.collapse_padding
        and table.pad_edge and top == 0 and bottom == 0 and all(row.style is None for row in table.rows)
        and all(c.width is not None and c.justify in ("left", "right") and c.vertical == "top" for c in table.columns)
    )  # fmt: skip


def _widths(table: Table, max_width: int) -> list[int] | None:
    """Each column's width, padding included, as rich's Table gives fixed-width columns; None when rich would squeeze
    them (or the table is not one drawn here)."""
    if not _eligible(table):
        return None
    _, pad_right, _, pad_left = table.padding
    pad = pad_left + pad_right
    inner = max_width - table._extra_width
    if inner < 1:
        return None
    widths = [min(c.width + pad, inner) or 1 for c in table.columns]  # type: ignore[operator]
    if sum(widths) > inner or any(w - pad < 1 for w in widths):
        return None
    return widths


def _simple(cell: object, parses: bool) -> str | None:
    """The cell's text when rich draws it as that text (wrapped where it is wider than its column), else None.
    ``parses``: the console parses markup or emoji codes in a string cell."""
    if isinstance(cell, Text):
        if cell.justify is not None or cell.overflow is not None or cell.no_wrap is not None:
            return None
        text = cell.plain
    elif isinstance(cell, str):
        if parses and ("[" in cell or ":" in cell):  # markup or emoji codes
            return None
        text = cell
    else:
        return None
    # Printable (no tabs, newlines or control codes) and one cell per character (len is the width).
    if not text.isprintable():
        return None
    return text if text.isascii() or all(cell_len(c) == 1 for c in text) else None


def _simple_lines(cell: object, column: Any, inner: int, console: Console | None, parses: bool) -> list[str] | None:
    """The lines of a simple cell ``inner`` cells wide, without its padding; None when rich must draw it."""
    text = _simple(cell, parses)
    if text is None:
        return None
    if len(text) <= inner:
        if column.justify == "left":
            return [f"{text}{' ' * (inner - len(text))}"]
        text = text.rstrip()
        return [f"{' ' * (inner - len(text))}{text}"]
    # Wrapped by rich's own Text.wrap, called as Text.__rich_console__ calls it for the cell (it reads the console
    # only for full justification).
    lines = [line.plain for line in Text(text).wrap(console, inner, justify=column.justify,  # type: ignore[arg-type]
                                                    overflow=column.overflow or "fold", no_wrap=bool(column.no_wrap))]
    if all(cell_len(line) == len(line) <= inner for line in lines):
        return [f"{line}{' ' * (inner - len(line))}" for line in lines]
    return None


def _body(table: Table, widths: list[int], cell_lines: CellLines) -> Iterator[str] | None:
    """The table's lines below its title; None as soon as ``cell_lines`` cannot draw a cell."""
    box = table.box
    assert box is not None
    _, pad_right, _, pad_left = table.padding
    columns = list(zip(table.columns, widths))
    rows = [[c.header for c in table.columns]] + [list(cells) for cells in zip(*(c._cells for c in table.columns))]
    out = [box.get_top(widths)]
    last = len(rows) - 1
    for index, cells in enumerate(rows):
        drawn = []
        for cell, (column, width) in zip(cells, columns):
            lines = cell_lines(cell, column, width, width - pad_left - pad_right)
            if lines is None:
                return None
            drawn.append(lines)
        height = max(len(d) for d in drawn)
        for d, w in zip(drawn, widths):
            blank = [" " * w] * (height - len(d))
            if index == 0:  # the header row aligns to the bottom, the others to the top
                d[:0] = blank
            else:
                d += blank
        if index == 0:
            edge_left, edge_right, divider = box.head_left, box.head_right, box.head_vertical
        elif index == last:
            edge_left, edge_right, divider = box.foot_left, box.foot_right, box.foot_vertical
        else:
            edge_left, edge_right, divider = box.mid_left, box.mid_right, box.mid_vertical
        out += [f"{edge_left}{divider.join(d[n] for d in drawn)}{edge_right}" for n in range(height)]
        if index == 0:
            out.append(box.get_row(widths, "head", edge=True))
        elif index != last and table.rows[index - 1].end_section:
            out.append(box.get_row(widths, "row", edge=True))
    out.append(box.get_bottom(widths))
    return iter(out)


def draw(table: Table, console: Console, options: ConsoleOptions) -> Iterator[Segment] | None:
    """The segments of ``table`` drawn in ``options`` on ``console`` as plain text lines, or None when rich must draw
    it. A cell this module cannot draw is drawn by rich alone."""
    widths = _widths(table, options.max_width)
    if widths is None:
        return None
    safe = table.safe_box if table.safe_box is not None else console.safe_box
    if table.box.substitute(options, safe=safe) is not table.box:  # type: ignore[union-attr]
        return None  # an ASCII or legacy Windows console: rich draws the table with its own characters
    # A string cell is parsed for markup and emoji codes as Console.render parses it.
    parses = bool(options.markup or (options.markup is None and getattr(console, "_markup", True))
                  or getattr(console, "_emoji", True))  # fmt: skip
    _, pad_right, _, pad_left = table.padding
    render_options = options.update(width=sum(widths) + table._extra_width, highlight=table.highlight, height=None)
    left_pad, right_pad = " " * pad_left, " " * pad_right

    def cell_lines(cell: object, column: Any, width: int, inner: int) -> list[str]:
        lines = _simple_lines(cell, column, inner, console, parses)
        if lines is not None:
            return [f"{left_pad}{line}{right_pad}" for line in lines]
        renderable = Padding(cell, table.padding) if pad_left or pad_right else cell  # as Table._get_cells pads it
        cell_options = render_options.update(width=width, justify=column.justify, no_wrap=column.no_wrap,
                                             overflow=column.overflow, height=None, highlight=column.highlight)
        return ["".join(s.text for s in segments) for segments in console.render_lines(renderable, cell_options)]  # type: ignore[arg-type]

    body = _body(table, widths, cell_lines)
    assert body is not None
    return _segments(table, console, render_options, body)


def _segments(table: Table, console: Console, render_options: ConsoleOptions, body: Iterator[str]) -> Iterator[Segment]:
    if table.title:  # as Table.__rich_console__ renders it
        title = table.title
        text = (console.render_str(title, style=Style.pick_first(table.title_style, "table.title"), highlight=False)
                if isinstance(title, str) else title)  # fmt: skip
        yield from console.render(text, options=render_options.update(justify=table.title_justify))
    line = Segment.line()
    for text in body:
        yield Segment(text)
        yield line


def text_lines(text: Text, width: int) -> list[str] | None:
    """The lines a console ``width`` wide that parses no markup or emoji prints for ``text``, or None where that needs
    the console (full justification, an end other than a newline)."""
    justify, overflow = text.justify or "default", text.overflow or "fold"
    if justify == "full" or overflow == "ignore" or text.end != "\n":
        return None
    wrapped = text.wrap(None, width, justify=justify, overflow=overflow, tab_size=text.tab_size or 8,  # type: ignore[arg-type]
                        no_wrap=bool(text.no_wrap))
    lines = [line.plain for line in wrapped]
    return lines if all(cell_len(line) <= width for line in lines) else None


def table_lines(table: Table, max_width: int) -> list[str] | None:
    """The lines of ``table`` (title included) on a console ``max_width`` wide that shows no styles, parses no
    markup or emoji and writes UTF-8 (rich's box characters as they are), or None where rich must draw it."""
    widths = _widths(table, max_width)
    if widths is None:
        return None
    title: list[str] = []
    if table.title:
        if not isinstance(table.title, str):
            return None
        wrapped = text_lines(Text(table.title, justify=table.title_justify), sum(widths) + table._extra_width)
        if wrapped is None:
            return None
        title = wrapped
    _, pad_right, _, pad_left = table.padding
    left_pad, right_pad = " " * pad_left, " " * pad_right

    def cell_lines(cell: object, column: Any, width: int, inner: int) -> list[str] | None:
        lines = _simple_lines(cell, column, inner, None, False)
        return None if lines is None else [f"{left_pad}{line}{right_pad}" for line in lines]

    body = _body(table, widths, cell_lines)
    return None if body is None else [*title, *body]
