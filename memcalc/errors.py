"""The one error type for a user's mistake.

``InputError`` subclasses ``ValueError`` so that pydantic validators can raise it and the message
survives; the CLI turns it into one line on stderr and exit code 2. Its message is always one line: any line
break inside (an operating system's or a parser's text) is joined with a space.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class InputError(ValueError):
    """Bad input from the user: the message names the bad value and what is accepted."""

    def __init__(self, message: object = "") -> None:
        text = str(message)
        super().__init__(" ".join(part.strip() for part in text.splitlines()) if len(text.splitlines()) > 1 else text)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'a100-80g'?)`` when something close exists, else an empty string."""
    choices = list(choices)
    close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = {c.lower(): c for c in choices}[close[0]]
    return f" (did you mean {original!r}?)"


def shown(value: Any, width: int = 60) -> str:
    """A value as a message shows it: its repr on one line, at most ``width`` characters; a huge integer by size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<a {value.bit_length()}-bit integer>"
    try:
        text = repr(value)
    except Exception:  # a repr that fails (a huge int inside a list, a broken object) still gets named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."
