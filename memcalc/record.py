"""Records: frozen dataclasses checked when they are made, with pydantic at the JSON edge only.

memcalc's inputs and results are plain frozen dataclasses. Making one checks every field against its annotation
and its bounds (``check_fields``) and refuses a wrong type, a bool where a count belongs, NaN, or a value out of
bounds with one ``InputError`` line. Nothing here imports pydantic: a command line answer never pays for building
pydantic schemas. Parsing JSON or a dict back into a record (``model_validate_json``, ``model_validate``) goes
through ``pydantic.TypeAdapter``, imported on first use, which validates the nested dataclasses and then runs their
checks too.

The methods keep the names of pydantic's models (``model_dump``, ``model_dump_json``, ``model_validate``,
``model_validate_json``, ``model_copy``), so code written against them keeps working.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from memcalc.errors import InputError, shown

R = TypeVar("R", bound="Record")
C = TypeVar("C", bound=type)

_dataclass = dataclasses.dataclass(kw_only=True, init=False, eq=False, repr=False, match_args=False)
_MISSING = dataclasses.MISSING


def record(cls: C) -> C:
    """The decorator of every record: keyword-only fields. Immutability, equality, hash, repr and ``__init__`` come
    from ``Record`` once, instead of code generated per class (``frozen=True`` alone costs half a millisecond a class
    at import and the generated ``__init__`` another tenth: more, over memcalc's forty records, than a whole estimate
    takes). A positional argument, an unknown field or a missing one is one ``InputError`` line, not Python's
    ``TypeError``."""
    if not cls.__doc__:  # else dataclasses reads inspect.signature(cls) for one: object.__init__'s, tokenized
        cls.__doc__ = cls.__name__
    cls = _dataclass(cls)
    # (name, default, default factory) per field, in order, for Record.__init__.
    cls.__record_fields__ = tuple((f.name, f.default, f.default_factory)  # type: ignore[attr-defined]
                                  for f in cls.__dataclass_fields__.values())  # type: ignore[attr-defined]
    return cls


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, why: str = "") -> Any:
    """A dataclass field with bounds, checked when the record is made (``why``: what the bound stands for)."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if why:
        meta["why"] = why
    return dataclasses.field(default=default, metadata=meta)


@cache
def _hints(cls: type) -> dict[str, Any]:
    """Each field's annotation, evaluated in its class's module (a third of ``typing.get_type_hints``'s time, paid
    once per record class on the command line); ``get_type_hints`` where that is not enough."""
    space = sys.modules[cls.__module__].__dict__
    try:
        return {f.name: eval(f.type, space) if isinstance(f.type, str) else f.type  # noqa: S307 (annotations)
                for f in dataclasses.fields(cls)}
    except NameError:
        return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return f"a tuple of {_type_name(get_args(tp)[0])}"
    return {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _fits(value: Any, tp: Any) -> bool:
    """Strict type test: no bool for a number, no float for a count, no str for anything else."""
    origin = get_origin(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in get_args(tp))
    if origin is tuple:
        args = get_args(tp)
        return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def check_fields(obj: Any, where: str | None = None) -> None:
    """Every field of dataclass ``obj`` has its annotated type and lies within its bounds, else ``InputError``."""
    for name, fits, tp, m in _checks(type(obj)):
        value = getattr(obj, name)
        if not fits(value):
            raise InputError(f"{where or type(obj).__name__}.{name} {shown(value)} is not accepted; "
                             f"accepted: {_type_name(tp)}")
        if not m or value is None or isinstance(value, bool):
            continue
        bad = (("gt" in m and not value > m["gt"]) or ("ge" in m and not value >= m["ge"])
               or ("lt" in m and not value < m["lt"]) or ("le" in m and not value <= m["le"]))
        if bad:
            lo = (f"more than {m['gt']:,}" if "gt" in m else f"at least {m['ge']:,}" if "ge" in m else "")
            hi = (f"less than {m['lt']:,}" if "lt" in m else f"at most {m['le']:,}" if "le" in m else "")
            accepted = " and ".join(x for x in (lo, hi) if x)
            why = f" ({m['why']})" if "why" in m else ""
            raise InputError(f"{where or type(obj).__name__}.{name} {shown(value)} is out of bounds; "
                             f"accepted: {accepted}{why}")


@cache
def _checks(cls: type) -> tuple[tuple[str, Any, Any, Any], ...]:
    """Per field of ``cls``: (name, type test, annotated type, bounds), built once per class."""
    hints = _hints(cls)
    return tuple((f.name, _test(hints[f.name]), hints[f.name], f.metadata) for f in dataclasses.fields(cls))


def _test(tp: Any) -> Any:
    """``_fits(value, tp)`` as a function of the value alone, with the annotation taken apart once."""
    if tp is Any:
        return lambda v: True
    if tp is type(None):
        return lambda v: v is None
    if tp is bool:
        return lambda v: v is True or v is False
    if tp is int:
        return lambda v: type(v) is int or isinstance(v, int) and not isinstance(v, bool)
    if tp is str:
        return lambda v: isinstance(v, str)
    if tp is float:
        return lambda v: type(v) is float and math.isfinite(v) or _fits(v, float)
    origin = get_origin(tp)
    if origin is Literal:
        allowed = {(type(a), a) for a in get_args(tp)}
        return lambda v: isinstance(v, (str, int)) and (type(v), v) in allowed
    if origin in (Union, types.UnionType):
        tests = tuple(_test(a) for a in get_args(tp))
        return lambda v: any(t(v) for t in tests)
    return lambda v: _fits(v, tp)


def _plain(value: Any, exclude: set[str] | None = None) -> Any:
    """A record as plain Python: dicts, lists, numbers, strings (what ``json`` writes)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (exclude and f.name in exclude)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@cache
def _required(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter  # the JSON edge only: building its schema is not free

    return TypeAdapter(cls)


class Record:
    """Methods every memcalc input and result shares (a mixin for frozen dataclasses)."""

    __slots__ = ()
    __record_fields__: tuple[tuple[str, Any, Any], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if args:
            raise InputError(f"{cls.__name__} takes its fields by name ({', '.join(_names(cls))}), "
                             f"not {len(args)} positional value{'s' if len(args) > 1 else ''}")
        put = object.__setattr__
        given = 0
        for name, default, factory in cls.__record_fields__:
            if name in kwargs:
                put(self, name, kwargs[name])
                given += 1
            elif default is not _MISSING:
                put(self, name, default)
            elif factory is not _MISSING:
                put(self, name, factory())
            else:
                _refuse(cls, kwargs)
        if given < len(kwargs):
            _refuse(cls, kwargs)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    def __setattr__(self, name: str, value: Any) -> None:
        # Frozen once made: each field is set once, by __init__ (or by pydantic when it parses JSON).
        if name in self.__dict__:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _names(type(self)))

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in _names(type(self))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in _names(type(self)))})"

    def model_dump(self, *, exclude: set[str] | None = None) -> dict[str, Any]:
        """Plain Python (dicts and lists), every size an integer of bytes."""
        return _plain(self, exclude)  # type: ignore[no-any-return]

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The JSON the command line prints with ``--json``."""
        import json

        return json.dumps(_plain(self), indent=indent, ensure_ascii=False)

    def model_copy(self: R, *, update: dict[str, Any] | None = None) -> R:
        """A copy with some fields replaced (checked again)."""
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]

    @classmethod
    def model_validate(cls: type[R], data: Any) -> R:
        """A record from plain Python (a dict as ``model_dump`` gives); a mistake is one ``InputError`` line."""
        return _validated(cls, "validate_python", data)

    @classmethod
    def model_validate_json(cls: type[R], text: str | bytes) -> R:
        """A record from JSON (as ``model_dump_json`` gives); a mistake is one ``InputError`` line."""
        return _validated(cls, "validate_json", text)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def _refuse(cls: type, kwargs: dict[str, Any]) -> None:
    """The one-line error for an unknown field (first) or a missing one."""
    unknown = [k for k in kwargs if k not in _names(cls)]
    if unknown:
        from memcalc.errors import did_you_mean

        raise InputError(f"{cls.__name__} has no field {shown(unknown[0])}{did_you_mean(unknown[0], _names(cls))}; "
                         f"accepted: {', '.join(_names(cls))}")
    missing = [k for k in _required(cls) if k not in kwargs]
    raise InputError(f"{cls.__name__} needs {', '.join(missing)}; accepted: {', '.join(_names(cls))}")


def _validated(cls: type[R], how: str, data: Any) -> R:
    from pydantic import ValidationError

    if how == "validate_json" and not isinstance(data, (str, bytes, bytearray)):
        raise InputError(f"{cls.__name__} JSON {shown(data)} is {type(data).__name__}; accepted: a JSON string or bytes")
    if how == "validate_json" and len(data) > MAX_JSON_CHARS:
        raise InputError(f"{cls.__name__} JSON of {len(data):,} characters is too long; accepted: at most "
                         f"{MAX_JSON_CHARS:,} (an estimate's JSON is a few tens of KB)")
    try:
        return getattr(_adapter(cls), how)(data)  # type: ignore[no-any-return]
    except ValidationError as e:
        first = e.errors()[0]
        if isinstance(first.get("ctx", {}).get("error"), InputError):
            raise first["ctx"]["error"] from None
        where = ".".join(shown(x) if not isinstance(x, (int, str)) or isinstance(x, str) and not x.isidentifier()
                         else str(x) for x in first.get("loc", ()))
        raise InputError(f"{cls.__name__}{'.' + where if where else ''}: "
                         f"{' '.join(str(first.get('msg')).split())}") from None
    except RecursionError:
        raise InputError(f"{cls.__name__}: the data nests too deeply; accepted: what model_dump gives") from None


MAX_JSON_CHARS = 1 << 24
"""16 Mi characters: an estimate's JSON, every row and stage included, is a few tens of KB."""
