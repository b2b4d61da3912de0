"""Tables drawn as plain text (memcalc.report.plain) are the characters rich draws, on every width."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text

import memcalc
from memcalc.cli.app import unstyled_width
from memcalc.report.plain import draw, plain_console
from memcalc.report.render import Fitted, plain_text
from memcalc.report.view import render, renderables

WIDTHS = (40, 60, 80, 100, 120, 160, 250)


def _both(renderable: object, width: int) -> tuple[str, str]:
    """(plain drawing, rich's drawing) of ``renderable`` on a console ``width`` wide that shows no styles."""
    plain = Console(width=width, file=io.StringIO(), markup=False, emoji=False, highlight=False)
    assert plain_console(plain)
    plain.print(renderable)
    # Recording keeps the styles for an export, so rich draws every table itself.
    rich = Console(width=width, file=io.StringIO(), record=True, markup=False, emoji=False, highlight=False)
    assert not plain_console(rich)
    rich.print(renderable)
    return plain.file.getvalue(), rich.export_text()  # type: ignore[attr-defined]


RESULTS = {
    "zero-3 175e9": lambda: memcalc.estimate(params=175e9, stage=3, gpus=128),
    "compare 7e9": lambda: memcalc.compare(params=7e9, gpus=64),
    "fsdp2 llama-3-8b timed": lambda: memcalc.estimate(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8,
                                                       gpu="h100", seq_len=8192, micro_batch=1),
    "zero-3 offload llama-2-7b": lambda: memcalc.estimate(model="llama-2-7b", strategy="zero-3+opt-cpu+param-nvme",
                                                          gpus=16, seq_len=4096),
    "pipeline": lambda: memcalc.estimate(model="llama-2-7b", pp=4, gpus=32, seq_len=4096, micro_batch=1),
    "compare timed": lambda: memcalc.compare(model="llama-3-8b", gpus=16, gpu="h100", seq_len=4096, micro_batch=1),
}  # fmt: skip


@pytest.mark.parametrize("name", RESULTS)
def test_results_draw_the_same_characters_on_every_width(name: str) -> None:
    obj = RESULTS[name]()
    for width in WIDTHS:
        plain, rich = _both(render(obj), width)  # type: ignore[arg-type]
        assert plain == rich, f"{name} at {width} columns"
        # Without a console, as the command line writes to a pipe (160 columns); None: rich must draw it.
        text = plain_text(renderables(obj), width)  # type: ignore[arg-type]
        assert text == rich or (text is None and width != 160), f"{name} at {width} columns, no console"


def test_piped_output_without_colour_is_drawn_without_a_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    for name in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    assert unstyled_width() == 160
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich would colour the output
    assert unstyled_width() is None
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("COLUMNS", "100")  # rich's console takes its width from the environment
    assert unstyled_width() is None
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))  # rich draws ASCII boxes
    assert unstyled_width() is None


def test_a_fitted_table_is_drawn_plain_and_a_squeezed_one_by_rich() -> None:
    t = Table(title="t")
    t.add_column("a")
    t.add_column("b", justify="right")
    t.add_row("x", "1")
    console = Console(width=80, file=io.StringIO())
    fitted = Fitted(t)._whole()
    assert fitted is not None and draw(fitted, console, console.options) is not None
    assert draw(t, console, console.options) is None  # no fixed widths: rich measures it


_WORDS = st.sampled_from(["a", "parameters", "·", "GiB", "x" * 30, "漢字", "e\u0301", "[bold]", ":smile:", "", " ",
                          "1,234.56", "(memory/engine/timeline.py)", "tab\there", "new\nline", "ends "])  # fmt: skip
_CELL = st.lists(_WORDS, max_size=6).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(_CELL, _CELL, _CELL, st.booleans()), min_size=1, max_size=5),
    justify=st.tuples(*[st.sampled_from(["left", "right", "center"])] * 3),
    styled=st.booleans(),
    width=st.integers(min_value=20, max_value=160),
    title=st.sampled_from(["", "A title", "A long title " * 8]),
)
def test_random_tables_draw_the_same_characters(rows, justify, styled, width, title) -> None:  # type: ignore[no-untyped-def]
    t = Table(title=title or None, title_justify="left")
    for n, j in enumerate(justify):
        t.add_column(f"column {n}", justify=j, style="dim" if n == 2 else None)
    for a, b, c, section in rows:
        t.add_row(Text(a, style="bold") if styled else a, b, c)
        if section:
            t.add_section()
    fitted = Fitted(t, breaks=("column 2",))
    plain, rich = _both(fitted, width)
    assert plain == rich
    lines = fitted.lines(width)
    if lines is not None:
        assert "".join(f"{line}\n" for line in lines) == rich
