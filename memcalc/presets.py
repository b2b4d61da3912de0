"""Presets: flat TOML files, one item each, loaded lazily by name, alias or path.

In a wheel the folder ships as ``memcalc/presets``; in a source checkout it is the top-level
``presets/`` beside the package. A user's own preset is any ``.toml`` path.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from memcalc.errors import InputError, did_you_mean
from memcalc.inputs import GPU


def presets_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "presets", here.parent / "presets"):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"memcalc's presets folder is missing (looked in {here / 'presets'} and {here.parent / 'presets'})")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _read(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"preset file {str(path)!r} is not valid TOML: {e}") from None
    except OSError as e:
        raise InputError(f"cannot read preset file {str(path)!r}: {e.strerror}") from None


@cache
def _alias_index(kind: str) -> dict[str, Path]:
    """Every name and alias of one kind of preset -> its file. Reads each file once."""
    index: dict[str, Path] = {}
    for path in sorted((presets_dir() / kind).glob("*.toml")):
        index[_norm(path.stem)] = path
        for alias in _read(path).get("aliases", []):
            index.setdefault(_norm(alias), path)
    return index


def gpu_names() -> list[str]:
    return sorted(p.stem for p in (presets_dir() / "gpus").glob("*.toml"))


def _gpu_from_file(path: Path) -> GPU:
    data = _read(path)
    data.setdefault("key", path.stem)
    if "aliases" in data:
        data["aliases"] = tuple(data["aliases"])
    try:
        return GPU(**data)
    except ValueError as e:
        first = e.errors()[0] if hasattr(e, "errors") else {"loc": (), "msg": str(e)}
        where = ".".join(str(x) for x in first["loc"])
        raise InputError(f"GPU preset {str(path)!r}: {where} {first['msg']}".replace("  ", " ")) from None


def load_gpu(name: str) -> GPU:
    """A GPU by preset name (``a100-sxm-80gb``), alias (``a100-80g``) or path to a TOML file."""
    text = str(name).strip()
    if text.endswith(".toml") or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise InputError(f"GPU preset file {text!r} does not exist")
        return _gpu_from_file(path)
    direct = presets_dir() / "gpus" / f"{_norm(text)}.toml"
    if direct.is_file():
        return _gpu_from_file(direct)
    index = _alias_index("gpus")
    path = index.get(_norm(text))
    if path is None:
        raise InputError(
            f"unknown GPU {text!r}{did_you_mean(_norm(text), index)}; known: {', '.join(gpu_names())} "
            "(or a path to a .toml file)"
        )
    return _gpu_from_file(path)
