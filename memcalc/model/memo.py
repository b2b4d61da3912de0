"""Memoisation on an architecture's identity: what a planner needs to evaluate many plans of one model.

Counting a model's parameters or one layer's saved tensors is pure, but walks every layer; a planner evaluates
thousands of plans that share one ``Architecture`` object. Keyed on the object itself (held, so its id cannot be
reused) plus the other, hashable arguments; bounded, so a long-running process does not grow without end.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_LIMIT = 4096


def per_architecture(fn: F) -> F:
    """Cache ``fn(arch, *args, **kwargs)`` for the same ``arch`` object and equal other arguments (keywords in the
    order given); values are never mutated."""
    cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    @wraps(fn)
    def wrapper(arch: Any, *args: Any, **kwargs: Any) -> Any:
        key = (id(arch), args, tuple(kwargs.items())) if kwargs else (id(arch), args)
        hit = cache.get(key)
        if hit is not None and hit[0] is arch:
            return hit[1]
        if len(cache) >= _LIMIT:
            cache.clear()
        value = fn(arch, *args, **kwargs)
        cache[key] = (arch, value)
        return value

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
