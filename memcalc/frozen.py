"""``@frozen``: the core's small immutable tables, as frozen dataclasses without per-class generated methods.

``dataclasses.dataclass(frozen=True)`` writes and compiles ``__eq__``, ``__hash__`` and ``__repr__`` for every class
(about 0.15 ms each at import; memcalc's core has some forty such tables, paid on every start of the command line).
Here nothing is generated: ``__init__``, the frozen ``__setattr__``/``__delattr__``, equality, hash and repr are
shared functions reading each class's field table (one ``operator.attrgetter`` for the compared fields), with the
dataclass meaning: defaults and default factories, ``init=False`` fields, ``__post_init__``, fields with
``compare=False`` take no part in equality and hash, fields with ``repr=False`` are not shown. The hash is computed
once per object (the objects are immutable).
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

C = TypeVar("C", bound=type)

_make = dataclasses.dataclass(init=False, frozen=False, eq=False, repr=False, match_args=False)
_MISSING = dataclasses.MISSING


_generated = dataclasses.dataclass(frozen=True, eq=False, repr=False, match_args=False)


def frozen(cls: C) -> C:
    """A frozen dataclass whose equality, hash and repr are those ``dataclass(frozen=True)`` would generate."""
    if any(getattr(getattr(b, "__dataclass_params__", None), "frozen", False) for b in cls.__mro__[1:]):
        cls = _generated(cls)  # a subclass of a dataclass(frozen=True) (typer's params) must be one itself
        _shared(cls, dataclasses.fields(cls))
        return cls
    if not cls.__doc__:  # else dataclasses reads inspect.signature(cls) for one: object.__init__'s, tokenized
        cls.__doc__ = cls.__name__
    cls = _make(cls)
    fields = dataclasses.fields(cls)
    cls.__frozen_init__ = tuple((f.name, f.default, f.default_factory) for f in fields if f.init)  # type: ignore[attr-defined]
    cls.__frozen_names__ = tuple(name for name, _, _ in cls.__frozen_init__)  # type: ignore[attr-defined]
    cls.__frozen_fixed__ = tuple((f.name, f.default) for f in fields  # type: ignore[attr-defined]
                                 if not f.init and f.default is not _MISSING)
    cls.__init__ = _init  # type: ignore[misc]
    cls.__setattr__ = _setattr  # type: ignore[assignment]
    cls.__delattr__ = _delattr  # type: ignore[assignment]
    _shared(cls, fields)
    return cls


def _shared(cls: Any, fields: tuple[dataclasses.Field, ...]) -> None:
    compared = [f.name for f in fields if f.compare]
    shown = [f.name for f in fields if f.repr]
    cls.__frozen_key__ = attrgetter(*compared) if compared else _nothing  # type: ignore[attr-defined]
    cls.__frozen_shown__ = tuple(shown)  # type: ignore[attr-defined]
    cls.__eq__ = _eq  # type: ignore[assignment]
    cls.__hash__ = _hash  # type: ignore[assignment]
    cls.__repr__ = _repr  # type: ignore[assignment]


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """The ``__init__`` dataclasses would generate, shared: positional then keyword arguments over the init fields,
    their defaults (a factory called per object), then ``__post_init__``."""
    spec = self.__frozen_init__
    d = self.__dict__
    if not kwargs and len(args) == len(spec):  # every field given in order (the core's hot constructors): no defaults
        d.update(zip(self.__frozen_names__, args))
        spec = ()
    elif len(args) > len(spec):
        raise TypeError(f"{type(self).__name__}() takes {len(spec)} positional arguments but {len(args)} were given")
    for (name, default, factory), value in zip(spec, args):
        d[name] = value
    for name, default, factory in spec[len(args):]:
        if name in kwargs:
            d[name] = kwargs.pop(name)
        elif default is not _MISSING:
            d[name] = default
        elif factory is not _MISSING:
            d[name] = factory()
        else:
            raise TypeError(f"{type(self).__name__}() missing required argument: {name!r}")
    if kwargs:
        name = next(iter(kwargs))
        if any(n == name for n, _, _ in spec[: len(args)]):
            raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
        raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {name!r}")
    for name, default in self.__frozen_fixed__:
        d[name] = default
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


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
