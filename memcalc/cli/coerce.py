"""Plain coercion of command-line values, so that parsing flags builds no pydantic schema.

typer (0.29) converts each option's value through a pydantic ``TypeAdapter`` made on first use, one per option:
importing pydantic's schema machinery and building ~50 adapters costs more than the whole estimate. memcalc's
options are all ``str``, ``int``, ``float`` or ``bool`` (or ``None``); for those, this module gives each option a
coercion that does what the adapter does (``int("8")``, ``float("1.5")``) and reports a bad value in the same
one-line form. Any other annotation keeps typer's own coercion.
"""

from __future__ import annotations

import math
import re
import types
from typing import Any, Union, get_args, get_origin

from typer._click.exceptions import BadParameter, UsageError
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
            if param is None or t is str:
                raise BadParameter(f"{value!r} is not a valid {_NAMES[t]}.", ctx=ctx, param=param) from None
            raise refused(value, param, t, ctx) from None


_KINDS = {int: ("a whole number", "a whole number such as 8"), float: ("a finite number", "a finite number such as 1.5"),
          bool: ("a switch", "true or false")}


def refused(value: Any, param: Any, target: type, ctx: Any) -> UsageError:
    """memcalc's one line for a value of the wrong kind (``--gpus 1e12``, ``--seq-len 4096.5``): the flag, the value
    and what is accepted (its bounds where ``memcalc.inputs.arguments.CHECKS`` knows them), as the API would say."""
    from memcalc.inputs.arguments import CHECKS
    from memcalc.model import architecture as a

    flag = max(getattr(param, "opts", None) or [f"--{param.name}"], key=len)  # --gpus, not -n
    kind, example = _KINDS[target]
    shape = {"layers": a.MAX_LAYERS, "hidden": a.MAX_HIDDEN, "heads": a.MAX_HEADS, "kv_heads": a.MAX_HEADS,
             "ffn": a.MAX_FFN, "vocab": a.MAX_VOCAB}.get(param.name or "")  # checked where the shape is read
    known = CHECKS.get(param.name or "", (None, ""))[1] or (shape and f"a whole number from 1 to {shape:,}") or ""
    accepted = re.sub(r",? or (None|a Cluster)\b.*$", "", known) or example  # the API's alternatives are not flags
    return UsageError(f"{flag} {str(value)[:60]!r} is not {kind}; accepted: {accepted}", ctx=ctx)


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
