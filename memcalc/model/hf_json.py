"""Reading a config.json's text: size, encoding, nesting depth, strict JSON (no NaN, no duplicate keys), and how a
value is shown in a message (``memcalc.model.hf_config`` maps the parsed object onto an ``Architecture``)."""

from __future__ import annotations

import json
import re
from typing import Any

from memcalc.errors import InputError
from memcalc.files import MAX_FILE_BYTES

Config = dict[str, Any]

MAX_DEPTH = 32
"""Real configs nest 3-4 levels (text_config -> rope_scaling -> ...); this is checked before parsing, far below
the depth at which Python's JSON parser runs out of recursion."""


def _show(value: Any) -> str:
    """A value as the message shows it: its repr, short, on one line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<a {value.bit_length()}-bit integer>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a float", str: "a string",
          list: "an array", dict: "an object"}  # fmt: skip


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), f"a {type(value).__name__}")


_SPECIAL = re.compile(r'[\\"\[\]{}]')


def _depth_exceeds(text: str, limit: int) -> bool:
    """Does the JSON text nest arrays/objects deeper than ``limit``? One linear pass, strings skipped."""
    depth, in_string, escaped = 0, False, -1
    for m in _SPECIAL.finditer(text):
        i, c = m.start(), m.group()
        if i == escaped:
            continue
        if in_string:
            if c == "\\":
                escaped = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


class _BadJSON(ValueError):
    pass


def _no_constant(token: str) -> Any:
    raise _BadJSON(f"holds {token}, which JSON does not allow")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _BadJSON(f"has the key {_show(key)} twice")
        out[key] = value
    return out


def parse_config(data: bytes, where: str = "config.json") -> Config:
    """The JSON object in ``data`` (UTF-8), refusing what is too large, too deep, not JSON or not an object."""
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{where} is larger than {MAX_FILE_BYTES:,} bytes; accepted: a config.json file up to 1 MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{where} is not UTF-8 text (byte {e.start}); accepted: a JSON file in UTF-8") from None
    if _depth_exceeds(text, MAX_DEPTH):
        raise InputError(f"{where} nests deeper than {MAX_DEPTH} levels; accepted: a config.json (3-4 levels deep)")
    try:
        cfg = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except _BadJSON as e:
        raise InputError(f"{where} is not a readable JSON file: it {e}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, integers of more than 4,300 digits
        raise InputError(f"{where} is not a readable JSON file: {' '.join(str(e).split())}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{where} does not hold a JSON object (it holds {_kind(cfg)}); accepted: a config.json")
    return cfg
