"""The pydantic base of memcalc's inputs and results: frozen, strict, no unknown field, one ``InputError`` line.

Every public input (``Model``, ``GPU``, ``Cluster``, ``Strategy``, ``EstimateInput`` ...) and every result
(``Estimate``, ``Comparison``, ``CollectiveTimes``) is a ``Validated``: a ``pydantic.BaseModel`` with

- ``frozen=True`` (an input is never mutated; assigning a field raises ``dataclasses.FrozenInstanceError``),
- ``extra="forbid"`` (an unknown field is refused, with the close name it probably meant),
- ``strict=True`` when made from Python (``True`` is not one GPU, ``"8"`` is not a count), no NaN or infinity,
- bounds as ``Field`` constraints (``bounded``), closed sets as ``Literal``,
- ``defer_build=True``: a class's schema is built when it first validates, not when memcalc is imported, so that
  ``memcalc --help`` never builds one.

A mistake reaches the user as one ``InputError`` line naming the class and the field (the CLI renames the field to
its flag), never pydantic's multi-line report: ``refusal`` turns a ``ValidationError`` into that line, in one place.

The descriptions of the fields are the docstrings under them (as in the source, one under each field). They are
read when a JSON schema is asked for (``model_json_schema``, ``memcalc schema``), not at import: pydantic's own
``use_attribute_docstrings`` parses each class's source when the class is made, which would cost every command.

The modules that define models with fields do without ``from __future__ import annotations``: pydantic would compile
and evaluate every field's annotation from its string when the class is made, which makes the classes a third slower
to create (3 ms of the 40 model classes an estimate makes).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from memcalc.errors import InputError, did_you_mean, shown

V = TypeVar("V", bound="Validated")

MAX_JSON_CHARS = 1 << 24
"""16 Mi characters: an estimate's JSON, every row and stage included, is a few tens of KB."""


def bounded(default: Any = ..., *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, why: str = "") -> Any:
    """A field with bounds (``pydantic.Field`` constraints); ``why`` says what the bound stands for, shown in the
    error line and kept in the JSON schema as ``bound``."""
    return Field(default, ge=ge, gt=gt, le=le, lt=lt, json_schema_extra={"bound": why} if why else None)


def empty_list() -> list[Any]:
    """A result's list field left out: ``Field(default_factory=empty_list)``. pydantic reads a factory's signature
    each time it makes a default; a Python function's is read directly, where the builtin ``list``'s is parsed from
    its text by the tokenizer (2 ms the first time, then 0.07 ms a default)."""
    return []


def empty_dict() -> dict[Any, Any]:
    """A result's dict field left out: ``Field(default_factory=empty_dict)`` (see ``empty_list``)."""
    return {}


@contextmanager
def _refused(cls: type) -> Iterator[None]:
    """Parsing plain data or JSON into ``cls``: pydantic's errors as one ``InputError`` line (``refusal``)."""
    try:
        yield
    except ValidationError as e:
        raise refusal(cls, e) from None
    except RecursionError:
        raise InputError(f"{cls.__name__}: the data nests too deeply; accepted: what model_dump gives") from None


class Validated(BaseModel):
    """The base of every memcalc input and result (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False, defer_build=True,
                              protected_namespaces=())

    def __init__(self, *args: Any, **data: Any) -> None:
        if args:
            raise InputError(f"{type(self).__name__} takes its fields by name ({', '.join(type(self).model_fields)}), "
                             f"not {len(args)} positional value{'s' if len(args) > 1 else ''}")
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise refusal(type(self), e) from None

    # pydantic calls a model's own __init__ for each nested object it parses, which would validate them strictly;
    # this one only converts the error, so it counts as pydantic's own (nested objects are parsed by pydantic-core).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    @model_validator(mode="after")
    def _checked(self) -> Any:
        """The cross-field checks of the class (its ``_check``), run once the fields are validated."""
        self._check()
        return self

    def _check(self) -> None:
        """Cross-field checks: none unless a class has them (an ``InputError`` names what is wrong)."""

    def replace(self: V, **changes: Any) -> V:
        """A copy with some fields changed, validated again (``model_copy`` does not validate)."""
        return type(self)(**{**self.__dict__, **changes})

    def _set(self, name: str, value: Any) -> None:
        """Set a derived field once, while the object is being validated (an ``after`` validator)."""
        self.__dict__[name] = value

    @classmethod
    def model_validate(cls: type[V], obj: Any, **kwargs: Any) -> V:  # type: ignore[override]
        """An object from plain Python (a dict as ``model_dump`` gives); a mistake is one ``InputError`` line."""
        with _refused(cls):
            return super().model_validate(obj, strict=kwargs.pop("strict", False), **kwargs)

    @classmethod
    def model_validate_json(cls: type[V], json_data: str | bytes | bytearray, **kwargs: Any) -> V:  # type: ignore[override]
        """An object from JSON (as ``model_dump_json`` gives); a mistake is one ``InputError`` line."""
        if not isinstance(json_data, (str, bytes, bytearray)):
            raise InputError(f"{cls.__name__} JSON {shown(json_data)} is {type(json_data).__name__}; accepted: a JSON "
                             "string or bytes")
        if len(json_data) > MAX_JSON_CHARS:
            raise InputError(f"{cls.__name__} JSON of {len(json_data):,} characters is too long; accepted: at most "
                             f"{MAX_JSON_CHARS:,} (an estimate's JSON is a few tens of KB)")
        with _refused(cls):
            return super().model_validate_json(json_data, strict=kwargs.pop("strict", False), **kwargs)

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The JSON schema, every field described by the docstring under it."""
        describe(cls)
        return super().model_json_schema(*args, **kwargs)

    @classmethod
    def field_names(cls) -> list[str]:
        """The fields' names, in order (a preset file's keys are these)."""
        return list(cls.model_fields)


RESULT_CONFIG = ConfigDict(strict=False, allow_inf_nan=True)
"""Results parsed back from JSON are validated leniently (a count written as 7.0 is the integer 7); a rate may be
infinite."""


class Result(Validated):
    """The base of memcalc's results: made by memcalc from the core's numbers, so made without validation
    (``model_construct``: building the validators of some thirty result models would cost a command more than its
    arithmetic), with the field names still checked; parsed back from JSON or a dict, they are validated."""

    model_config = RESULT_CONFIG

    def __init__(self, *args: Any, **data: Any) -> None:
        cls = type(self)
        fields = cls.model_fields
        if args or not data.keys() <= fields.keys() or any(f.is_required() and n not in data for n, f in fields.items()):
            super().__init__(*args, **data)  # the same mistake, refused in one line by validation
        made = cls.model_construct(**data)
        for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
            object.__setattr__(self, slot, getattr(made, slot))
        self._check()

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def describe(cls: type[Validated]) -> None:
    """Give every field of ``cls`` and of the models inside it the docstring under it as its description, then
    rebuild their schemas (the descriptions are part of them)."""
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    family = _family(cls)
    if all(c.__dict__.get("_described_done", False) for c in family):
        return
    for c in family:
        docs = extract_docstrings_from_cls(c, use_inspect=True)
        for name, info in c.model_fields.items():
            if info.description is None and name in docs:
                info.description = docs[name]
        c._described_done = True  # type: ignore[attr-defined]
    for c in reversed(family):  # the innermost first: a model's schema holds those of its fields
        c.model_rebuild(force=True)


def _family(cls: type) -> list[type[Validated]]:
    """``cls`` and every ``Validated`` class its fields hold, outermost first."""
    seen: list[type[Validated]] = []

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, Validated):
            if tp in seen:
                return
            seen.append(tp)
            for info in tp.model_fields.values():
                walk(info.annotation)
            return
        for arg in get_args(tp):
            walk(arg)

    walk(cls)
    return seen


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if get_origin(tp) is Literal:
        return ", ".join(str(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return f"a tuple of {_type_name(get_args(tp)[0])}"
    if get_origin(tp) in (list, dict):
        return f"a {get_origin(tp).__name__}"
    return {int: "a whole number", float: "a finite number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _bounds(info: Any) -> str:
    """"more than 0 and at most 10,000" from a field's constraints."""
    lo = hi = ""
    for m in info.metadata:
        for attr, text in (("gt", "more than"), ("ge", "at least")):
            if getattr(m, attr, None) is not None:
                lo = f"{text} {getattr(m, attr):,}"
        for attr, text in (("lt", "less than"), ("le", "at most")):
            if getattr(m, attr, None) is not None:
                hi = f"{text} {getattr(m, attr):,}"
    why = (info.json_schema_extra or {}).get("bound") if isinstance(info.json_schema_extra, dict) else None
    return " and ".join(x for x in (lo, hi) if x) + (f" ({why})" if why else "")


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def refusal(cls: type, error: ValidationError) -> InputError:
    """pydantic's report as one ``InputError`` line: ``Cluster.gpus True is not accepted; accepted: a whole
    number``; the ``InputError`` a validator raised, as it is."""
    errors = error.errors()
    unknown = [e for e in errors if e.get("type") == "extra_forbidden" and len(e.get("loc", ())) == 1]
    first = (unknown or errors)[0]  # an unknown field first: a missing one is often the same, misspelt
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, InputError):
        return inner
    loc = tuple(first.get("loc", ()))
    name = getattr(cls, "__error_name__", cls.__name__)
    fields = getattr(cls, "model_fields", {})
    kind = first.get("type", "")
    if kind == "extra_forbidden" and len(loc) == 1:
        return InputError(f"{name} has no field {shown(loc[0])}{did_you_mean(str(loc[0]), fields)}; "
                          f"accepted: {', '.join(fields)}")
    if kind == "missing" and len(loc) == 1:
        missing = [str(e["loc"][0]) for e in errors if e.get("type") == "missing" and len(e.get("loc", ())) == 1]
        return InputError(f"{name} needs {', '.join(missing)}; accepted: {', '.join(fields)}")
    where = ".".join(str(x) for x in loc if isinstance(x, (str, int)) and (not isinstance(x, str) or x in fields
                                                                          or x.isidentifier()))
    info = fields.get(loc[0]) if loc and len(loc) <= 2 else None
    value = first.get("input")
    if kind in _BOUND_ERRORS and info is not None:
        return InputError(f"{name}.{loc[0]} {shown(value)} is out of bounds; accepted: {_bounds(info)}")
    if info is not None and kind not in ("extra_forbidden", "missing"):
        return InputError(f"{name}.{loc[0]} {shown(value)} is not accepted; accepted: {_type_name(info.annotation)}")
    return InputError(f"{name}{'.' + where if where else ''}: {' '.join(str(first.get('msg')).split())}")
