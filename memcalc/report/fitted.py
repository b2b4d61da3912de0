"""``Fitted``: a table laid out for the console's width, without ever cutting a figure (memcalc.report.render wraps
every table the command line prints in one)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text

from memcalc.report.plain import draw, plain_console, table_lines

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions


class Fitted:
    """A table laid out for the console's width; a figure (a right-aligned cell) is never wrapped, cut or folded.

    In order: the table as built when it fits whole; else its prose (left-aligned) columns wrapped at spaces, figure
    columns as wide as their widest figure, headers wrapped at spaces; else stacked tables that each repeat the first
    ``keys`` columns, cut where a header in ``breaks`` starts a group, groups that fit together kept together, and a
    group still too wide cut into the fewest even runs of columns that fit.
    """

    def __init__(self, table: Table, keys: int = 1, breaks: Sequence[str] = ()) -> None:
        self.table, self.keys, self.breaks = table, keys, tuple(breaks)
        self.need = [_column_need(c) for c in table.columns]
        # The width the table takes unwrapped, as rich lays it out with its default box and padding: every column's
        # widest line (header included) + two padding cells and a rule per column + the closing rule. Computed from
        # the cells' text, without rich's measuring pass.
        self.widest = [max(cell_len(line) for text in [_plain(c.header), *map(_plain, c._cells)]
                           for line in (text.splitlines() or [""])) for c in table.columns]
        self.natural = sum(self.widest) + 3 * len(table.columns) + 1

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)

    def tables(self, width: int) -> list[Table] | None:
        """The tables drawn ``width`` wide (the whole, or stacked parts); None when rich must squeeze the table."""
        if self.natural <= width:
            # Whole: every column at its widest line, given to rich, which then skips measuring every cell.
            return [self._whole() or self._build(list(range(len(self.need))), self.widest, self.table.title, wrap=False)]
        parts = self.parts(width)
        if parts is None:  # narrower than the keys and one figure column
            return None
        return [self._build(part, self.widths(part, width) or [], self.table.title if n == 0 else None)
                for n, part in enumerate(parts)]  # fmt: skip

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Table | Segment]:
        tables = self.tables(options.max_width)
        if tables is None:
            yield self.table
            return
        plain = plain_console(console)  # no styles shown: the same characters, drawn without rich's per-cell pass
        for table in tables:
            segments = draw(table, console, options) if plain else None
            if segments is None:
                yield table
            else:
                yield from segments

    def lines(self, width: int) -> list[str] | None:
        """The plain lines a console ``width`` wide prints (``memcalc.report.plain.table_lines``), or None."""
        tables = self.tables(width)
        out: list[str] = []
        for table in tables or ():
            lines = table_lines(table, width)
            if lines is None:
                return None
            out += lines
        return out if tables is not None else None

    def widths(self, cols: list[int], width: int) -> list[int] | None:
        """Content widths of ``cols`` in a table ``width`` wide, or None when even wrapped prose is too wide."""
        lo, w = [self.need[i][0] for i in cols], [self.need[i][1] for i in cols]
        # rich's default box and padding: each column has two padding cells and a rule on its left; one rule closes
        room = width - (3 * len(cols) + 1)
        if sum(lo) > room:
            return None
        while sum(w) > room:  # narrow the widest prose column that can still wrap, as rich does
            j = max((k for k in range(len(w)) if w[k] > lo[k]), key=lambda k: w[k])
            w[j] -= 1
        return w

    def parts(self, width: int) -> list[list[int]] | None:
        keys, rest = list(range(self.keys)), range(self.keys, len(self.need))
        if self.widths(keys + list(rest), width) is not None:
            return [keys + list(rest)]
        groups: list[list[int]] = []
        for i in rest:
            if not groups or _plain(self.table.columns[i].header) in self.breaks:
                groups.append([])
            groups[-1].append(i)
        packed: list[list[int]] = []
        for g in groups:
            if packed and self.widths(keys + packed[-1] + g, width) is not None:
                packed[-1] += g
            else:
                packed.append(g)
        out: list[list[int]] = []
        for g in packed:
            runs = [_even(g, k) for k in range(1, len(g) + 1)]
            fit = next((r for r in runs if all(self.widths(keys + c, width) is not None for c in r)), None)
            if fit is None:
                return None
            out += [keys + c for c in fit]
        return out

    def _whole(self) -> Table | None:
        """The whole table with every cell already padded and justified to its column's width: what rich would draw
        (same characters, same styles), without its per-cell padding and wrapping passes. None when a cell has
        more than one line or a column is centred (rich lays those out itself)."""
        cols = self.table.columns
        if any(c.justify not in ("left", "right") for c in cols):
            return None
        cells = [[c.header, *c._cells] for c in cols]
        if any("\n" in _plain(x) for col in cells for x in col):
            return None
        t = copy.copy(self.table)
        t.padding = (0, 0, 0, 0)
        t.columns = [replace(c, header=_fill(c.header, w, c.justify), _cells=[_fill(x, w, c.justify) for x in c._cells],
                             width=w + 2, min_width=None, max_width=None, justify="left", no_wrap=True, _index=n)
                     for n, (c, w) in enumerate(zip(cols, self.widest))]
        return t

    def _build(self, cols: list[int], widths: list[int], title: object, wrap: bool = True) -> Table:
        t = copy.copy(self.table)
        t.title = title  # type: ignore[assignment]
        # No figure is wider than its column, so none wraps; headers and prose wrap at spaces (when they must).
        picked = zip((self.table.columns[i] for i in cols), widths)
        t.columns = [replace(c, width=w, min_width=None, max_width=None, overflow="fold", no_wrap=not wrap, _index=n)
                     for n, (c, w) in enumerate(picked)]
        return t


def _fill(cell: object, width: int, justify: str) -> object:
    """A one-line cell as rich draws it in a column ``width`` wide with one space of padding each side."""
    if isinstance(cell, Text):
        out = cell.copy()
        gap = width - cell_len(out.plain)
        out.pad_left(1 + (gap if justify == "right" else 0))
        out.pad_right(1 + (gap if justify == "left" else 0))
        return out
    text = str(cell)
    gap = " " * (width - cell_len(text))
    return f" {gap}{text} " if justify == "right" else f" {text}{gap} "


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _column_need(col: Column) -> tuple[int, int]:
    """(narrowest, widest) content width: a figure column's widest cell, or its header's longest word if wider;
    prose down to its longest word."""
    cells = [_plain(c) for c in col._cells]
    lines = [line for text in [*cells, _plain(col.header)] for line in text.splitlines()]
    word = max((cell_len(w) for line in lines for w in line.split()), default=1)
    if col.justify == "right":
        return (w := max([word] + [cell_len(line) for c in cells for line in c.splitlines()])), w
    return word, max([word] + [cell_len(line) for line in lines])


def _even(cols: list[int], k: int) -> list[list[int]]:
    return [cols[i * len(cols) // k:(i + 1) * len(cols) // k] for i in range(k)]
