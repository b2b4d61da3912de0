"""Units: the one module that converts between bytes and what people read.

Inside memcalc every size is an ``int`` of bytes and every rate is bytes per second.
Memory is shown in GiB (2**30, what CUDA and PyTorch report) by default, or in GB (10**9,
what papers and datasheets print: the ZeRO paper's "120 GB" is 16 x 7.5e9 bytes).
Bandwidth is always GB/s (10**9 bytes per second), as datasheets quote it.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from memcalc.errors import InputError, shown

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9

MemoryUnit = Literal["gib", "gb"]
MEMORY_UNITS: dict[str, tuple[int, str]] = {"gib": (GiB, "GiB"), "gb": (GB, "GB")}


def gib(x: float) -> int:
    """Bytes in ``x`` GiB, rounded to the nearest byte."""
    return round(x * GiB)


def gbps(x: float) -> float:
    """Bytes per second in ``x`` GB/s."""
    return x * GB


def memory_label(unit: MemoryUnit) -> str:
    return MEMORY_UNITS[unit][1]


def to_memory_unit(n_bytes: int, unit: MemoryUnit) -> float:
    return n_bytes / MEMORY_UNITS[unit][0]


def format_memory(n_bytes: int, unit: MemoryUnit = "gib", digits: int = 2) -> str:
    """``format_memory(120 * 10**9, "gb") == "120.00 GB"``."""
    return f"{to_memory_unit(n_bytes, unit):,.{digits}f} {memory_label(unit)}"


def format_rate(bytes_per_s: float, digits: int = 1) -> str:
    return f"{bytes_per_s / GB:,.{digits}f} GB/s"


# Suffixes people write after a parameter count: 350M, 7b, 1.3B, 1T, 125k.
_GIB_FIGURE = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.(\d+))?) GiB\b")


def text_in_unit(text: str, unit: MemoryUnit) -> str:
    """A note or formula with its GiB figures in ``unit``, to the same decimals (``--units gb`` reaches the words
    too); flags such as ``--reserve-gib`` are names, not figures, and stay."""
    if unit == "gib":
        return text

    def convert(m: re.Match[str]) -> str:
        digits = len(m[2] or "")
        return f"{float(m[1].replace(',', '')) * GiB / GB:,.{digits}f} GB"

    return _GIB_FIGURE.sub(convert, text)


def time_unit(longest_s: float) -> str:
    """One unit for a column of durations: seconds, or milliseconds where the longest is under a second."""
    return "s" if longest_s >= 1 else "ms"


def format_time(seconds: float, unit: str) -> str:
    """A duration in ``unit`` (``time_unit``'s), without the label: the column's header carries it."""
    return f"{seconds:,.3f}" if unit == "s" else f"{seconds * 1e3:,.2f}"


def format_duration(seconds: float) -> str:
    """A long duration in the largest unit it spans: days, hours, minutes or seconds, labelled."""
    for div, name in ((86400, "days"), (3600, "hours"), (60, "minutes")):
        if seconds >= div:
            return f"{seconds / div:,.1f} {name}"
    return f"{seconds:.1f} s"


_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT_RE = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


MAX_COUNT = 10**14
"""100 trillion: 60x the largest published model (Switch-C, 1.6T parameters, arXiv 2101.03961 Table 9). At 16 bytes
of model states per parameter (ZeRO §3.1) that is 1.6e15 bytes, below 2**53: every size stays exact as a float."""


def parse_count(text: str | int | float, what: str = "--params") -> int:
    """Parse a parameter count: ``175e9``, ``175B``, ``7b``, ``1.3e9``, ``350M``, ``1.5T``, ``125k``.

    Returns a whole number from 1 to ``MAX_COUNT``; anything else raises ``InputError`` naming the value.
    """
    accepted = f"a positive count up to {MAX_COUNT:.0e} such as 175e9, 175B, 7b, 1.3e9 or 350M"
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise InputError(f"{what} {shown(text)} is not a number; give {accepted}")
    if isinstance(text, int):
        if 0 < text <= MAX_COUNT:
            return text
        value = float(text) if text.bit_length() < 1000 else (math.inf if text > 0 else -math.inf)
    elif isinstance(text, float):
        value = text
    else:
        m = _COUNT_RE.match(text) if len(text) <= 100 else None
        if not m:
            raise InputError(f"{what} {shown(text)} is not a number; give {accepted}")
        value = float(m.group(1)) * _COUNT_SUFFIX[m.group(2).lower()]
    if math.isnan(value):
        raise InputError(f"{what} {shown(text)} is not finite; give {accepted}")
    if value <= 0:
        raise InputError(f"{what} {shown(text)} must be positive; give {accepted}")
    if value > MAX_COUNT:
        raise InputError(f"{what} {shown(text)} is out of bounds; give {accepted}")
    count = round(value)
    if count < 1 or abs(value - count) > 1e-6 * max(1.0, value):
        raise InputError(f"{what} {shown(text)} is not a whole number of parameters; give {accepted}")
    return count


def format_count(n: int) -> str:
    """``format_count(175_000_000_000) == "175.0B"``."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
