"""The typer application, its error handling and what every command shares (printing, small checks)."""

from __future__ import annotations

import re
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.29 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer depends on click
    from click.exceptions import ClickException  # type: ignore[no-redef]

from memcalc.errors import InputError

EXIT_USAGE = 2


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; the caller raises the returned Exit(2)."""
    sys.stderr.write(f"memcalc: error: {message}\n")
    return typer.Exit(EXIT_USAGE)


def one_line(exc: BaseException) -> str:
    """The user-facing message of an input error, on one line, an input model's field (``Timing.price_per_gpu_hour``)
    named as the flag that sets it (``--price-per-gpu-hour``)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic.ValidationError
        first = errors()[0]
        msg = str(first.get("msg", exc)).removeprefix("Value error, ")
        loc = ".".join(str(x) for x in first.get("loc", ()))
        if not isinstance(first.get("ctx", {}).get("error"), InputError) and loc:
            msg = f"{loc}: {msg} (got {first.get('input')!r})"
        return _as_flag(" ".join(msg.split()))
    # the API's alternatives that no flag can give (None, a Cluster record) are not offered on the command line
    return re.sub(r",? or (None|a Cluster)$", "", _as_flag(" ".join(str(exc).split())))


SHAPE_WORDS = r"(?<![\w.-])(heads|kv_heads|hidden|layers|ffn|vocab|tp|pp|cp|ep) (?=\d)"
"""The core's messages name a shape or layout field by its argument before its value (``heads 3 does not divide
hidden 100``); on the command line each is a flag, where the message starts with one."""


def _as_flag(text: str) -> str:
    """The shape and layout fields before their values as flags (``SHAPE_WORDS``); ``Model.field`` (or
    ``architecture.field``: the shape flags) at the start of a message, where ``field`` is an
    argument of ``memcalc.build_input``, as ``--field`` (``memcalc.validated.refusal`` names the input model's
    field)."""
    if re.match(SHAPE_WORDS, text):  # the core's own message (a file's starts with the file, and names its keys)
        text = re.sub(SHAPE_WORDS, lambda w: "--" + w[1].replace("_", "-") + " ", text)
    m = re.match(r"([A-Z][A-Za-z]+|architecture)\.([a-z][a-z0-9_]*) ", text)
    if m is None:
        return text
    import inspect

    from memcalc.api import build_input
    from memcalc.inputs.arguments import flag

    if m[2] not in inspect.signature(build_input).parameters:
        return text
    return flag(m[2]) + text[m.end(2):]


class Command(TyperCommand):
    """A command whose --help groups its options by topic, and whose --help option is coerced plainly too (it is
    made on demand, after ``install``)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        from memcalc.cli.options import PANEL_OF, PANELS

        groups: dict[str, list[tuple[str, str]]] = {}
        for p in self.get_params(ctx):
            record = p.get_help_record(ctx)
            if record is not None:
                groups.setdefault(PANEL_OF.get(p.name or "", "Options"), []).append(record)
        order = [*PANELS, "Options"]
        for title, rows in sorted(groups.items(), key=lambda g: order.index(g[0])):
            with formatter.section(title):
                formatter.write_dl(rows)

    def get_help_option(self, ctx: Any) -> Any:
        from memcalc.cli.coerce import plain

        return plain(super().get_help_option(ctx))


class OneLineErrors(TyperGroup):
    """Usage errors (unknown option, missing value) as one line and exit code 2."""

    def get_help_option(self, ctx: Any) -> Any:
        from memcalc.cli.coerce import plain

        return plain(super().get_help_option(ctx))

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        from memcalc.cli.coerce import install

        install(self)  # plain coercion for plain options: parsing flags builds no pydantic schema
        argv = sys.argv[1:] if kwargs.get("args") is None and not args else (args[0] if args else kwargs["args"])
        completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in __import__("os").environ)
        if not argv and not completing:  # `memcalc` alone: the help, as `memcalc --help` prints it
            with self.make_context("memcalc", ["--help"], resilient_parsing=True) as ctx:
                sys.stdout.write(self.get_help(ctx) + "\n")
            if standalone_mode:
                sys.exit(0)
            return 0
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except ClickException as e:
            sys.stderr.write(f"memcalc: error: {' '.join(e.format_message().split())}\n")
            if standalone_mode:
                sys.exit(EXIT_USAGE)
            raise
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


app = typer.Typer(
    cls=OneLineErrors,
    name="memcalc",
    help="Per-GPU memory and per-step communication of DeepSpeed ZeRO, PyTorch FSDP and DDP training.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _group() -> None:
    """Per-GPU memory, per-step communication and step time of DeepSpeed ZeRO, PyTorch FSDP and DDP training."""
    # A callback keeps `memcalc NAME` a group even when main() registers only the command that runs.

# --- options shared by estimate and compare -------------------------------------------------------


def positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError(f"{flag} {value} must be a whole number of 1 or more")


def micro_batch_arg(value: str | None) -> int | str | None:
    if value is None or value.strip().lower() == "auto":
        return None if value is None else "auto"
    try:
        b = int(value)
    except ValueError:
        raise InputError(f"--micro-batch {value!r} is not a whole number; give 1, 2, ... or auto") from None
    positive("--micro-batch", b)
    return b


def units_arg(units: str) -> str:
    u = units.strip().lower()
    if u not in ("gib", "gb"):
        raise InputError(f"--units {units!r} is not a memory unit; accepted: gib, gb")
    return u


FORMATS = ("table", "json", "csv", "markdown")


def output_format(fmt: str, as_json: bool, more: tuple[str, ...] = ()) -> str:
    """--format table|json|csv|markdown and the command's ``more`` (``--json`` is short for ``--format json``)."""
    f = fmt.strip().lower()
    if f not in FORMATS + more:
        raise InputError(f"--format {fmt!r} is not accepted; accepted: {', '.join(FORMATS + more)}")
    if as_json and f not in ("table", "json"):
        raise InputError(f"--json and --format {f} cannot be combined; choose one")
    return "json" if as_json else f


def show(result: Any, fmt: str, units: str, verbose: bool = True) -> None:
    """Print a result as a rich table (the terminal's width), JSON (integer bytes), CSV or Markdown; a table without
    ``verbose``: the concise view (``memcalc.report.concise``)."""
    if fmt == "json":
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    elif fmt == "csv":
        from memcalc.report.formats import to_csv

        sys.stdout.write(to_csv(result, units))
    elif fmt == "markdown":
        from memcalc.report.formats import to_markdown

        sys.stdout.write(to_markdown(result, units) + "\n")
    else:
        from memcalc.report.render import plain_text
        from memcalc.report.view import render, renderables

        width = unstyled_width()
        text = None if width is None else plain_text(renderables(result, units, verbose), width)  # type: ignore[arg-type]
        if text is None:
            console().print(render(result, units, verbose))  # type: ignore[arg-type]
        else:  # the characters rich's console would write, without importing it
            sys.stdout.write(text)
            sys.stdout.flush()


def show_rows(title: str, rows: list[dict[str, Any]], fmt: str, right: tuple[str, ...] = ()) -> None:
    """A catalogue (one dict per row) as a table, JSON, CSV or Markdown."""
    if fmt == "json":
        import json

        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if fmt in ("csv", "markdown"):
        from memcalc.report.formats import to_csv, to_markdown

        sys.stdout.write(to_csv(rows) if fmt == "csv" else to_markdown(rows) + "\n")
        return
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in rows[0] if rows else ():
        t.add_column(col, justify="right" if col in right else "left")
    for r in rows:
        t.add_row(*(f"{v:,}" if type(v) is int else f"{v:g}" if type(v) is float else str(v) for v in r.values()))
    console().print(t)


def unstyled_width() -> int | None:
    """The width of ``console()`` where rich would write plain text (no colour system, no notebook, UTF-8 box
    characters; rich.console.Console.is_terminal and _detect_color_system): piped output without COLUMNS, no
    FORCE_COLOR or TTY_COMPATIBLE, not in IPython, not on Windows. None elsewhere: rich decides."""
    import builtins
    import os

    env = os.environ
    if sys.stdout.isatty() or "COLUMNS" in env or "FORCE_COLOR" in env or "TTY_COMPATIBLE" in env:
        return None
    if hasattr(builtins, "get_ipython") or sys.platform == "win32":
        return None
    if not (getattr(sys.stdout, "encoding", "utf-8") or "utf-8").lower().startswith("utf"):
        return None
    return PIPED_WIDTH


PIPED_WIDTH = 160
"""Columns of piped output: not squeezed to rich's 80."""


def console() -> Any:
    """A terminal gets its own width; piped output (files, CI logs) is not squeezed to 80 columns."""
    import os

    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    # memcalc's cells are plain text: no markup, emoji codes or number highlighting to parse in them.
    return Console(width=PIPED_WIDTH if wide else None, markup=False, emoji=False, highlight=False)


def run_or_fail(fn: Any) -> None:
    try:
        fn()
    except (InputError, ValueError) as e:  # pydantic.ValidationError is a ValueError
        raise fail(one_line(e)) from None
