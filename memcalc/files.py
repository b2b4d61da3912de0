"""Reading a user's file with a bound: a few lines every reader of config and preset files shares.

Reading stops one byte past ``MAX_FILE_BYTES``, so a device such as /dev/zero, or a huge file, is refused at once
instead of filling memory; a missing path, a folder or an unreadable file is one ``InputError`` line.
"""

from __future__ import annotations

import os
from pathlib import Path

from memcalc.errors import InputError, shown
from memcalc.units import MiB

MAX_FILE_BYTES = 1 * MiB
"""Published config.json files are 0.5-60 KB (multimodal ones with label maps are the largest); presets are a few
hundred bytes."""

_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a float", str: "a string",
          list: "an array", dict: "an object"}  # fmt: skip


def kind(value: object) -> str:
    """What a value is, as a message says it (JSON's names)."""
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def read_bounded(path: str | os.PathLike[str], flag: str = "--hf-config") -> tuple[Path, bytes]:
    """At most ``MAX_FILE_BYTES + 1`` bytes of the file at ``path``; a missing path or a folder is an InputError."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{flag} {shown(path)} is {kind(path)}, not a path; accepted: the path of a config.json file")
    where = f"{flag} {str(path)!r}"
    if not str(path).strip():
        raise InputError(f"{where} is empty; accepted: the path of a config.json file")
    try:
        p = Path(path).expanduser()
        if p.is_dir():
            raise InputError(f"{where} is a folder; accepted: the path of a config.json file (such as {str(p / 'config.json')!r})")
        with p.open("rb") as f:
            return p, f.read(MAX_FILE_BYTES + 1)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{where} does not exist; accepted: the path of a config.json file") from None
    except (OSError, ValueError, RuntimeError) as e:  # permissions, a NUL in the path, ~user unknown
        raise InputError(f"{where} cannot be read ({' '.join(str(e).split())}); accepted: a readable config.json file") from None


