"""The one error type for a user's mistake.

``InputError`` subclasses ``ValueError`` so that pydantic validators can raise it and the message
survives; the CLI turns it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(ValueError):
    """Bad input from the user: the message names the bad value and what is accepted."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'a100-80g'?)`` when something close exists, else an empty string."""
    close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = {c.lower(): c for c in choices}[close[0]]
    return f" (did you mean {original!r}?)"
