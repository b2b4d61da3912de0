"""What a framework config file says, as memcalc's estimate arguments: the shared parts of every reader.

A reader loads one file (JSON, YAML or TOML) with hard limits, walks its keys with dotted paths, and
collects what it used (``read``), what it skipped because it does not change memory (``ignored``), what
changes memory but memcalc does not model yet (``unmodelled``), and ``notes`` on how values were resolved.
Every user mistake is one ``InputError`` line: ``<file>: <dotted.key> ...; accepted: ...``.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from memcalc.errors import InputError
from memcalc.frozen import frozen

MAX_BYTES = 1 << 20
"""Files larger than 1 MiB are refused before they are read (real configs are a few KiB)."""
MAX_DEPTH = 64
"""Nesting deeper than this is refused (real configs nest 3-4 levels)."""


@frozen
class ConfigReading:
    """One framework config file read into ``memcalc.estimate(**arguments)``."""

    source: str
    """The file (or ``<dict>``) that was read."""
    framework: str
    """``deepspeed``, ``accelerate`` or ``torchtitan``."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``memcalc.estimate`` / ``build_input``."""
    read: list[str] = field(default_factory=list)
    """Dotted key paths whose values went into ``arguments`` (or were checked against them)."""
    ignored: list[str] = field(default_factory=list)
    """``key: reason`` for keys present that do not change memory."""
    unmodelled: list[str] = field(default_factory=list)
    """``key: what`` for memory-relevant settings memcalc does not model yet."""
    notes: list[str] = field(default_factory=list)
    """How defaults, ``"auto"`` values and derived numbers were resolved."""
    assumed: list[str] = field(default_factory=list)
    """Values the file leaves to the training script, taken as its default, that change the answer: each says the
    value, why it was taken and the argument that gives yours (``micro-batch 8, from 'auto': ...; pass
    micro_batch=``)."""


class Collector:
    """Mutable scratchpad of a reader; ``freeze()`` gives the ``ConfigReading``."""

    def __init__(self, source: str, framework: str) -> None:
        self.source, self.framework = source, framework
        self.arguments: dict[str, Any] = {}
        self._read: list[str] = []
        self._ignored: list[str] = []
        self._unmodelled: list[str] = []
        self.notes: list[str] = []
        self.assumed: list[str] = []

    def fail(self, path: str, message: str) -> InputError:
        where = f"{self.source}: {path}" if path else self.source
        return InputError(f"{where}: {message}")

    def used(self, path: str) -> None:
        if path not in self._read:
            self._read.append(path)

    def ignore(self, path: str, reason: str) -> None:
        self._ignored.append(f"{path}: {reason}")

    def unmodelled(self, path: str, what: str) -> None:
        self._unmodelled.append(f"{path}: {what}")

    @property
    def any_unmodelled(self) -> bool:
        """Whether some option read changes memory in a way memcalc does not model."""
        return bool(self._unmodelled)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def assume(self, text: str) -> None:
        """A value taken for one the file leaves to the script, that changes the answer (``ConfigReading.assumed``)."""
        self.assumed.append(text)

    def mentioned(self) -> set[str]:
        """Every key path already read, ignored or listed as unmodelled."""
        return set(self._read) | {e.split(": ", 1)[0] for e in self._ignored + self._unmodelled}

    def merge(self, other: ConfigReading, prefix: str) -> None:
        """Take in a nested reading (accelerate's DeepSpeed JSON), its paths prefixed by the file they came from."""
        self._read += [f"{prefix}{p}" for p in other.read]
        self._ignored += [f"{prefix}{p}" for p in other.ignored]
        self._unmodelled += [f"{prefix}{p}" for p in other.unmodelled]
        self.notes += [f"{prefix}{n}" for n in other.notes]
        self.assumed += other.assumed
        self.arguments.update(other.arguments)

    def freeze(self) -> ConfigReading:
        return ConfigReading(source=self.source, framework=self.framework, arguments=dict(self.arguments),
                             read=list(self._read), ignored=list(self._ignored),
                             unmodelled=list(self._unmodelled), notes=list(self.notes),
                             assumed=list(self.assumed))  # fmt: skip


# --------------------------------------------------------------------------------------------
# Files: size, encoding, nesting, syntax.
# --------------------------------------------------------------------------------------------


def read_text(path: str | os.PathLike[str], kind: str) -> tuple[str, str]:
    """The file's text and display name; refuses a missing, over-large or non-UTF-8 file."""
    p = Path(path)
    name = str(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise InputError(f"{name}: cannot read the {kind} file ({e.strerror or e})") from None
    if not p.is_file():
        raise InputError(f"{name}: not a file; give the path of a {kind} file")
    if size > MAX_BYTES:
        raise InputError(f"{name}: {size:,} bytes is larger than the {MAX_BYTES:,} bytes (1 MiB) accepted for a {kind} file")
    with p.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise InputError(f"{name}: larger than the {MAX_BYTES:,} bytes (1 MiB) accepted for a {kind} file")
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: byte {e.start} is not UTF-8; save the {kind} file as UTF-8") from None


def _bracket_depth(text: str) -> int:
    """Deepest ``{``/``[`` nesting of JSON or TOML text outside strings and ``#`` comments, checked before
    parsing (a string or comment ends at the end of its line: neither format lets a one-line string go on)."""
    depth = deepest = 0
    quote = ""
    escaped = comment = False
    for ch in text:
        if ch == "\n":
            quote, escaped, comment = "", False, False
        elif comment:
            continue
        elif quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_depth(value: object, name: str) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` (memoised on identity: YAML aliases share nodes)."""
    seen: dict[int, int] = {}

    def depth(v: object, level: int) -> int:
        if level > MAX_DEPTH:
            raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels")
        if not isinstance(v, (dict, list)):
            return level
        key = id(v)
        if key in seen and seen[key] >= level:
            return seen[key]
        children = v.values() if isinstance(v, dict) else v
        d = max((depth(c, level + 1) for c in children), default=level)
        seen[key] = d
        return d

    depth(value, 0)


def _no_duplicates(name: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                # DeepSpeed loads with dict_raise_error_on_duplicate_keys (runtime/config_utils.py).
                raise InputError(f"{name}: key {k!r} appears twice; give each key once")
            out[k] = v
        return out

    return hook


def _no_constant(name: str) -> Callable[[str], Any]:
    def hook(text: str) -> Any:
        raise InputError(f"{name}: {text} is not a JSON number; give a finite number such as 1e9")

    return hook


def load_json(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    text, name = read_text(path, "JSON")
    if _bracket_depth(text) > MAX_DEPTH:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates(name), parse_constant=_no_constant(name))
    except json.JSONDecodeError as e:
        raise InputError(f"{name}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels") from None
    if not isinstance(data, dict):
        raise InputError(f"{name}: the top level is {_kind(data)}; a config file is a JSON object {{...}}")
    return data, name


def load_yaml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    text, name = read_text(path, "YAML")
    try:
        import yaml
    except ImportError:
        raise InputError(f"{name}: reading YAML needs PyYAML; install it with: pip install pyyaml") from None
    if _bracket_depth(text) > MAX_DEPTH or _indent_levels(text) > MAX_DEPTH:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{name}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{name}: the top level is {_kind(data)}; a config file is a mapping of keys to values")
    check_depth(data, name)
    for k in data:
        if not isinstance(k, str):
            raise InputError(f"{name}: top-level key {k!r} is not a name; keys are names such as distributed_type")
    return data, name


def _indent_levels(text: str) -> int:
    """Distinct indentation widths on the way down (a bound on YAML block nesting, checked before parsing)."""
    stack: list[int] = [0]
    deepest = 0
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        while stack and indent < stack[-1]:
            stack.pop()
        if not stack or indent > stack[-1]:
            stack.append(indent)
        deepest = max(deepest, len(stack) - 1)
    return deepest


def load_toml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    import tomllib

    text, name = read_text(path, "TOML")
    if _bracket_depth(text) > MAX_DEPTH:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{name}: invalid TOML: {e}") from None
    except RecursionError:
        raise InputError(f"{name}: nested deeper than {MAX_DEPTH} levels; a config file nests a few levels") from None
    check_depth(data, name)
    return data, name


# --------------------------------------------------------------------------------------------
# Values: one type per key, booleans only as booleans.
# --------------------------------------------------------------------------------------------


def _kind(v: object) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return "null" if v is None else type(v).__name__


def as_bool(c: Collector, path: str, v: object) -> bool:
    if isinstance(v, bool):
        return v
    raise c.fail(path, f"{v!r} is {_kind(v)}; accepted: true or false (a boolean, not a string or number)")


def as_int(c: Collector, path: str, v: object, *, minimum: int = 0, digit_strings: bool = False) -> int:
    """A whole number; ``5e8`` written as a float is whole. ``digit_strings``: the framework parses ``"3"`` too
    (DeepSpeed's pydantic models in lax mode)."""
    if isinstance(v, bool):
        raise c.fail(path, f"{v!r} is a boolean; accepted: a whole number of {minimum} or more")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and digit_strings and v.strip().lstrip("+").isdigit():
        v = int(v)
    if not isinstance(v, int):
        raise c.fail(path, f"{v!r} is {_kind(v)}; accepted: a whole number of {minimum} or more "
                           "(1e9 written as a number is fine)")
    if v < minimum:
        raise c.fail(path, f"{v} is below {minimum}; accepted: a whole number of {minimum} or more")
    return v


def as_str(c: Collector, path: str, v: object, accepted: Iterable[str] | None = None) -> str:
    if not isinstance(v, str):
        what = ", ".join(accepted) if accepted is not None else "a string"
        raise c.fail(path, f"{v!r} is {_kind(v)}; accepted: {what}")
    if accepted is not None:
        choices = list(accepted)
        if v not in choices:
            raise c.fail(path, f"{v!r} is not accepted{near(v, choices)}; accepted: {', '.join(choices)}")
    return v


def as_mapping(c: Collector, path: str, v: object) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise c.fail(path, f"{v!r} is {_kind(v)}; accepted: a mapping of keys to values")
    return v


def near(key: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` when a known name is close."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def near_miss(key: str, known: Iterable[str]) -> str | None:
    """A known key this unknown one is most likely a misspelling of (``zero_optimisation``), else None."""
    close = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.85)
    if not close:
        return None
    return {k.lower(): k for k in known}[close[0]]


def installed_release(distribution: str, patch: bool = False) -> tuple[int, ...] | None:
    """The (major, minor) release of an installed distribution (``deepspeed``), (major, minor, patch) with ``patch``
    (the patch's leading digits: 0.16.6rc1 is (0, 16, 6)), or None where it is not installed or its version does not
    start with as many numbers. Read from the package metadata: nothing is imported."""
    import re
    from importlib import metadata

    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None or (patch and match.group(3) is None):
        return None
    return tuple(int(x) for x in match.groups()[: 3 if patch else 2])


def installed_refuses(distribution: str, since: tuple[int, ...]) -> str | None:
    """The installed release of ``distribution`` as text ("0.19.8") where it is ``since`` or later, the first release
    that refuses what a reader is reading; None where it is older or not installed (the file is then read as the
    release of its time read it, and a note says so)."""
    release = installed_release(distribution, patch=len(since) > 2)
    if release is None or release < since:
        return None
    return ".".join(map(str, release))


def refuse_unknown(c: Collector, section: str, data: Mapping[str, Any], known: Iterable[str]) -> None:
    """Refuse keys a framework's own section model would refuse (``extra="forbid"``), naming the nearest."""
    names = list(known)
    for key in data:
        if key not in names:
            path = f"{section}.{key}" if section else key
            hint = near(str(key), names)
            if hint:
                raise c.fail(path, f"unknown key{hint}")
            raise c.fail(path, f"unknown key; accepted in {section or 'the top level'}: {', '.join(sorted(names))}")


# --------------------------------------------------------------------------------------------
# A reading under the user's own flags.
# --------------------------------------------------------------------------------------------

STRATEGY_ARGUMENTS = ("stage", "fsdp", "ddp", "strategy")
MODEL_ARGUMENTS = ("params", "model", "hf_config")


def merge_arguments(config: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The config's arguments, overridden by those the user gave explicitly (command-line flags).

    A strategy given (stage, fsdp, ddp, strategy) replaces the config's strategy with its offload and shard
    settings, and one other than ZeRO-3 drops the config's ZeRO-3 settings (the coordinator's and the optimizer's
    sub-groups); a model given (params, model, hf_config) replaces the config's model preset. The config's other
    settings stay, and one the strategy given cannot use is refused by the estimate naming the file.
    """
    out = dict(config)
    if any(k in given for k in STRATEGY_ARGUMENTS):
        for k in (*STRATEGY_ARGUMENTS, "offload_optimizer", "offload_params", "shard_group"):
            out.pop(k, None)
        for k in _dropped_zero3_settings(given):
            out.pop(k, None)
    if any(k in given for k in MODEL_ARGUMENTS):
        for k in MODEL_ARGUMENTS:
            out.pop(k, None)
    out.update(given)
    return out


def _dropped_zero3_settings(given: Mapping[str, Any]) -> tuple[str, ...]:
    """The ZeRO-3 arguments a config may set, unless the strategy given is ZeRO-3 (``stage`` 3 or a ``zero-3``
    strategy)."""
    from memcalc.configs.deepspeed_keys import ZERO3_ONLY

    strategy = given.get("strategy")
    name = strategy if isinstance(strategy, str) else getattr(getattr(strategy, "spec", None), "name", "") or ""
    if given.get("stage") is not None:
        name = f"zero-{str(given['stage']).strip()}"
    return () if name.strip().lower().partition("+")[0] == "zero-3" else ZERO3_ONLY
