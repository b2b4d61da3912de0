"""Presets: flat TOML files, one item each, loaded lazily by name, alias or path.

In a wheel the folder ships as ``memcalc/presets``; in a source checkout it is the top-level
``presets/`` beside the package. A user's own preset is any ``.toml`` path.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from stat import S_ISREG
from typing import Any, TypeVar


from memcalc.model.architecture import Architecture
from memcalc.errors import InputError, did_you_mean, shown
from memcalc.files import MAX_FILE_BYTES, read_bounded
from memcalc.inputs.hardware import GPU

T = TypeVar("T")
KINDS = {"gpus": "GPU", "models": "model"}


@cache
def presets_dir() -> Path:
    """The folder of the shipped presets (found once per process)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "presets", here.parent.parent / "presets"):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"memcalc's presets folder is missing (looked in {here.parent / 'presets'} and {here.parent.parent / 'presets'})")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _read(path: Path) -> dict[str, Any]:
    """The TOML file as a dict (a fresh copy: callers may change it)."""
    try:
        stat = path.stat()
        resolved = str(path.resolve())
    except (OSError, ValueError, RuntimeError) as e:  # permissions, a NUL in the path, a symlink loop
        raise InputError(f"cannot read preset file {str(path)!r} ({' '.join(str(e).split())})") from None
    if not S_ISREG(stat.st_mode):
        raise InputError(f"preset file {str(path)!r} is not a regular file; accepted: the path of a .toml file")
    if stat.st_size > MAX_FILE_BYTES:
        raise InputError(f"preset file {str(path)!r} has {stat.st_size:,} bytes; accepted: a .toml file of at "
                         f"most {MAX_FILE_BYTES:,} bytes (presets are a few hundred)")
    return dict(_parsed(resolved, stat.st_mtime_ns, stat.st_size))


@cache
def _parsed(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """Parsed once per file version (compare reads the same GPU file for every strategy); at most
    ``MAX_FILE_BYTES`` are read (``memcalc.files.read_bounded``)."""
    _, data = read_bounded(path, "preset file")
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"preset file {path!r} has more than {MAX_FILE_BYTES:,} bytes; accepted: a .toml file of at "
                         f"most {MAX_FILE_BYTES:,} bytes (presets are a few hundred)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"preset file {path!r} is not UTF-8 text (byte {e.start}); accepted: a UTF-8 .toml file") from None
    flat = _flat_toml(text)
    if flat is not None:
        return flat
    import tomllib  # the rest of TOML, and its error messages

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"preset file {path!r} is not valid TOML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise InputError(f"preset file {path!r} nests too deeply; accepted: a flat .toml file of keys and values") from None


# What a preset file is: comments, and ``key = value`` lines whose values are basic strings without escapes, decimal
# numbers, booleans or arrays of those (over several lines, with comments). Any other TOML goes to tomllib (importing
# it, and compiling its patterns, costs more than reading every preset a command needs).
_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_CONTROL = tuple(chr(c) for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n")  # for tomllib (CRLF line ends too)
_NO = object()


def _flat_toml(text: str) -> dict[str, Any] | None:
    """``tomllib.loads(text)`` where the text is a flat preset, else None (for tomllib to read, or to refuse)."""
    if any(c in text for c in _CONTROL):
        return None
    out: dict[str, Any] = {}
    i, n = 0, len(text)
    while True:
        i = _skip(text, i, newlines=True)
        if i >= n:
            return out
        k = i
        while i < n and text[i] in _BARE_KEY:
            i += 1
        key = text[k:i]
        i = _skip(text, i)
        if not key or key in out or text[i:i + 1] != "=":
            return None
        value, i = _flat_value(text, _skip(text, i + 1), 0)
        if value is _NO:
            return None
        i = _skip(text, i)  # then a comment, the line's end or the text's
        if i < n and text[i] != "\n":
            return None
        out[key] = value


def _skip(text: str, i: int, newlines: bool = False) -> int:
    """The index past spaces and tabs (and, with ``newlines``, line ends and whole comments); a comment's text is
    skipped either way, up to its line's end."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t" or (newlines and c == "\n"):
            i += 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else (j + 1 if newlines else j)
        else:
            break
    return i


def _flat_value(text: str, i: int, depth: int) -> tuple[Any, int]:
    """The value at ``text[i]`` and the index past it; ``_NO`` where it is not one a flat preset holds."""
    c = text[i:i + 1]
    if c == '"':
        end = text.find('"', i + 1)
        body = text[i + 1:end]
        if text[i:i + 3] == '"""' or end < 0 or "\\" in body or "\n" in body:
            return _NO, i
        return body, end + 1
    if c == "[":
        if depth > 8:  # tomllib tells how deep is too deep
            return _NO, i
        items: list[Any] = []
        i = _skip(text, i + 1, newlines=True)
        while text[i:i + 1] != "]":
            item, i = _flat_value(text, i, depth + 1)
            if item is _NO:
                return _NO, i
            items.append(item)
            i = _skip(text, i, newlines=True)
            if text[i:i + 1] == ",":
                i = _skip(text, i + 1, newlines=True)
            elif text[i:i + 1] != "]":
                return _NO, i
        return items, i + 1
    for word, value in (("true", True), ("false", False)):
        if text.startswith(word, i):
            return value, i + len(word)
    j = i
    while j < len(text) and text[j] not in " \t\n,]#":
        j += 1
    return _number(text[i:j]), j


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _number(token: str) -> Any:
    """A decimal integer or float (no underscores, no plus sign, no leading zero), as tomllib reads it; else _NO."""
    body = token[1:] if token[:1] == "-" else token
    head, e, exp = body.replace("E", "e").partition("e")
    whole, dot, frac = head.partition(".")
    if not _digits(whole) or (len(whole) > 1 and whole[0] == "0") or (dot and not _digits(frac)):
        return _NO
    if e and not _digits(exp[1:] if exp[:1] in ("+", "-") else exp):
        return _NO
    return float(token) if dot or e else int(token)


@cache
def _alias_index(kind: str) -> dict[str, Path]:
    """Every name and alias of one kind of preset -> its file. Reads each file once."""
    index: dict[str, Path] = {}
    for path in sorted((presets_dir() / kind).glob("*.toml")):
        index[_norm(path.stem)] = path
        for alias in _read(path).get("aliases", []):
            index.setdefault(_norm(alias), path)
    return index


@cache
def find(kind: str, name: str) -> Path | None:
    """The shipped preset of one kind that ``name`` names (file name or alias), as ``_alias_index(kind)`` maps it,
    parsing only the files whose text can hold the alias: a TOML string without escapes is a run of the file's
    characters, so its normalised form is a run of the file's normalised text where that text is ASCII (the did-you-mean
    of an unknown name still reads them all)."""
    key = _norm(name)
    files = sorted((presets_dir() / kind).glob("*.toml"))
    stems = [p for p in files if _norm(p.stem) == key]
    if stems:  # a file's name wins over every alias (the index sets names over aliases, the last file last)
        return stems[-1]
    for path in files:  # else the first file, in sorted order, with the alias (the index keeps the first)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError:
            raw = b"\\"  # read it below, for the error
        if not raw.isascii() or b"\\" in raw or key in _norm(raw.decode("ascii")):
            if any(_norm(str(alias)) == key for alias in _read(path).get("aliases", [])):
                return path
    return None


def names(kind: str) -> list[str]:
    return sorted(p.stem for p in (presets_dir() / kind).glob("*.toml"))


def _from_file(path: Path, cls: type[T], kind: str, key_field: str) -> T:
    data = _read(path)
    data.setdefault(key_field, path.stem)
    if "aliases" in data:
        if not isinstance(data["aliases"], list):
            raise InputError(f"{KINDS[kind]} preset {str(path)!r}: aliases {shown(data['aliases'])} is not accepted; "
                             "accepted: an array of names")
        data["aliases"] = tuple(data["aliases"])
    unknown = sorted(set(data) - set(cls.model_fields))  # type: ignore[attr-defined]
    if unknown:
        raise InputError(f"{KINDS[kind]} preset {str(path)!r}: unknown key {unknown[0]!r}; accepted: "
                         f"{', '.join(cls.model_fields)}")  # type: ignore[attr-defined]
    try:
        return cls(**data)
    except InputError as e:  # the file's keys are the fields' names: name the key, not the record's field
        key = re.sub(r"^(?:architecture|[A-Z][A-Za-z]+)\.(?=[a-z][a-z0-9_]* )", "", str(e))
        raise InputError(f"{KINDS[kind]} preset {str(path)!r}: {key}") from None


def _load(kind: str, name: str, cls: type[T], key_field: str, flag: str) -> T:
    if isinstance(name, os.PathLike):
        name = os.fspath(name)  # type: ignore[assignment]
    if not isinstance(name, str):
        raise InputError(f"{flag} {shown(name)} is not accepted; accepted: a {KINDS[kind]} name "
                         f"({', '.join(names(kind)[:3])}, ...) or the path of a .toml file")
    text = name.strip()
    if not text or len(text) > 4096 or "\0" in text:
        raise InputError(f"{flag} {shown(name)} is not accepted; accepted: a {KINDS[kind]} name "
                         f"({', '.join(names(kind)[:3])}, ...) or the path of a .toml file")
    if text.endswith(".toml") or "/" in text or os.sep in text:
        try:
            path = Path(text).expanduser()
            exists = path.exists()
        except (OSError, ValueError, RuntimeError):
            exists = False
        if not exists:
            hint = ""
            if kind == "models" and not text.endswith(".toml"):
                from memcalc.model.hf_hub import HUB_ID

                if HUB_ID.match(text):  # a Hugging Face Hub id typed where a preset goes
                    hint = f"; for a Hugging Face model give --hf-config {text} (a Hub id or a config.json path)"
            raise InputError(f"{KINDS[kind]} preset file {text!r} does not exist{hint}")
        return _from_file(path, cls, kind, key_field)
    direct = presets_dir() / kind / f"{_norm(text)}.toml"
    if direct.is_file():
        return _from_file(direct, cls, kind, key_field)
    path = find(kind, text)
    if path is None:
        index = _alias_index(kind)
        raise InputError(
            f"unknown {KINDS[kind]} {text!r}{did_you_mean(_norm(text), index)} for {flag}; known: "
            f"{', '.join(names(kind))} (or a path to a .toml file)"
        )
    return _from_file(path, cls, kind, key_field)


def gpu_names() -> list[str]:
    return names("gpus")


def load_gpu(name: str) -> GPU:
    """A GPU by preset name (``a100-sxm-80gb``), alias (``a100-80g``) or path to a TOML file."""
    return _load("gpus", name, GPU, "key", "--gpu")


def model_names() -> list[str]:
    return names("models")


def load_model(name: str) -> Architecture:
    """A model architecture by preset name (``llama-2-7b``), alias (``llama2-7b``) or path to a TOML file."""
    return _load("models", name, Architecture, "name", "--model")
