"""Presets: flat TOML files, one item each, loaded lazily by name, alias or path.

In a wheel the folder ships as ``memcalc/presets``; in a source checkout it is the top-level
``presets/`` beside the package. A user's own preset is any ``.toml`` path.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from functools import cache
from pathlib import Path
from stat import S_ISREG
from typing import Any, TypeVar


from memcalc.model.architecture import Architecture
from memcalc.errors import InputError, did_you_mean, shown
from memcalc.files import MAX_FILE_BYTES, read_bounded
from memcalc.inputs import GPU

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
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"preset file {path!r} is not UTF-8 text (byte {e.start}); accepted: a UTF-8 .toml file") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"preset file {path!r} is not valid TOML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise InputError(f"preset file {path!r} nests too deeply; accepted: a flat .toml file of keys and values") from None


@cache
def _alias_index(kind: str) -> dict[str, Path]:
    """Every name and alias of one kind of preset -> its file. Reads each file once."""
    index: dict[str, Path] = {}
    for path in sorted((presets_dir() / kind).glob("*.toml")):
        index[_norm(path.stem)] = path
        for alias in _read(path).get("aliases", []):
            index.setdefault(_norm(alias), path)
    return index


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
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise InputError(f"{KINDS[kind]} preset {str(path)!r}: unknown key {unknown[0]!r}; accepted: "
                         f"{', '.join(f.name for f in dataclasses.fields(cls))}")  # type: ignore[arg-type]
    try:
        return cls(**data)
    except InputError as e:
        raise InputError(f"{KINDS[kind]} preset {str(path)!r}: {e}") from None


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
            raise InputError(f"{KINDS[kind]} preset file {text!r} does not exist")
        return _from_file(path, cls, kind, key_field)
    direct = presets_dir() / kind / f"{_norm(text)}.toml"
    if direct.is_file():
        return _from_file(direct, cls, kind, key_field)
    index = _alias_index(kind)
    path = index.get(_norm(text))
    if path is None:
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
