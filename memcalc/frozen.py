"""``@frozen``: the core's small immutable tables, as frozen dataclasses without per-class generated methods.

``dataclasses.dataclass(frozen=True)`` writes and compiles ``__eq__``, ``__hash__`` and ``__repr__`` for every class
(about 0.15 ms each at import; memcalc's core has some forty such tables, paid on every start of the command line).
Here only ``__init__`` and the frozen ``__setattr__`` are generated; equality, hash and repr are three shared
functions reading the fields through one ``operator.attrgetter`` per class, with the dataclass meaning: fields with
``compare=False`` take no part in equality and hash, fields with ``repr=False`` are not shown. The hash is computed
once per object (the objects are immutable).
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

C = TypeVar("C", bound=type)

_make = dataclasses.dataclass(frozen=True, eq=False, repr=False, match_args=False)


def frozen(cls: C) -> C:
    """A frozen dataclass whose equality, hash and repr are those ``dataclass(frozen=True)`` would generate."""
    cls = _make(cls)
    fields = dataclasses.fields(cls)
    compared = [f.name for f in fields if f.compare]
    shown = [f.name for f in fields if f.repr]
    cls.__frozen_key__ = attrgetter(*compared) if compared else _nothing  # type: ignore[attr-defined]
    cls.__frozen_shown__ = tuple(shown)  # type: ignore[attr-defined]
    cls.__eq__ = _eq  # type: ignore[assignment]
    cls.__hash__ = _hash  # type: ignore[assignment]
    cls.__repr__ = _repr  # type: ignore[assignment]
    return cls


def _nothing(_: object) -> tuple[()]:
    return ()


def _eq(self: Any, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__frozen_key__
    return bool(key(self) == key(other))


def _hash(self: Any) -> int:
    # Immutable, so hashed once: the core's cached functions take these tables as keys on every evaluation.
    try:
        return self.__dict__["__frozen_hash__"]  # type: ignore[no-any-return]
    except KeyError:
        h = hash(self.__frozen_key__(self))
        object.__setattr__(self, "__frozen_hash__", h)
        return h


def _repr(self: Any) -> str:
    return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__frozen_shown__)})"
