"""Plain coercion of command-line values, so that parsing flags builds no pydantic schema.

typer (0.29) converts each option's value through a pydantic ``TypeAdapter`` made on first use, one per option:
importing pydantic's schema machinery and building ~50 adapters costs more than the whole estimate. memcalc's
options are all ``str``, ``int``, ``float`` or ``bool`` (or ``None``); for those, this module gives each option a
coercion that does what the adapter does (``int("8")``, ``float("1.5")``) and reports a bad value in the same
one-line form. Any other annotation keeps typer's own coercion.
"""

from __future__ import annotations

import math
import types
from typing import Any, Union, get_args, get_origin

from typer._click.exceptions import BadParameter
from typer._coercion import RuntimeParam

from memcalc.frozen import frozen

_NAMES = {int: "integer", float: "float", str: "string", bool: "boolean"}


def _plain_type(annotation: Any) -> type | None:
    """``int`` for ``int`` and ``int | None``; None for anything that is not a plain scalar."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    return annotation if annotation in _NAMES else None


@frozen
class PlainRuntimeParam(RuntimeParam):
    """Coerce a command-line string to a plain scalar, as typer's pydantic adapter would."""

    target: type = str

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        t = self.target
        if isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
        try:
            if t is bool:
                text = str(value).strip().lower()
                if text in ("1", "true", "yes", "on", "t", "y"):
                    return True
                if text in ("0", "false", "no", "off", "f", "n"):
                    return False
                raise ValueError(value)
            out = t(value)
            if t is float and not math.isfinite(out):
                raise ValueError(value)
            return out
        except (TypeError, ValueError):
            raise BadParameter(f"{value!r} is not a valid {_NAMES[t]}.", ctx=ctx, param=param) from None


def plain(param: Any) -> Any:
    """Give ``param`` the plain coercion when its annotation is a plain scalar; returns it."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(param, "_runtime_param", "missing") is None:
        target = _plain_type(desc.annotation)
        if target is not None:
            param._runtime_param = PlainRuntimeParam(parameter_info=desc.parameter_info,
                                                     annotation=desc.annotation, target=target)
    return param


def install(command: Any) -> None:
    """Give every plain-scalar option of ``command`` (and of its subcommands) the plain coercion."""
    for sub in getattr(command, "commands", {}).values():
        install(sub)
    for p in getattr(command, "params", ()):
        plain(p)
