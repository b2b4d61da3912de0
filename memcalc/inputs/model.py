"""The model being trained: a parameter count or an architecture."""


import re

from pydantic import field_validator

from memcalc.errors import InputError, shown
from memcalc.validated import Validated, bounded
from memcalc.model.architecture import Architecture
from memcalc.units import MAX_COUNT, parse_count

MIN_PARAMS = 10**6
"""1M: the fewest parameters a bare count may name. Below it the model states are under 16 MB (16 bytes a parameter
under mixed-precision Adam, ZeRO §3.1), a thirtieth of the CUDA context alone: no layout question is left to answer,
and a count that small is nearly always a missing suffix (``--params 7`` for 7B). A shape (--model, --hf-config,
--layers ...) is not bounded by it: its count is derived, and tiny test models are legitimate there."""
_PLAIN = re.compile(r"\s*(?:\d+(?:\.\d*)?|\.\d+)\s*")  # a number typed without a suffix or an exponent: 7, 1.3, 175


def parse_params(value: object, what: str = "--params") -> int:
    """A bare parameter count (``units.parse_count``) of at least ``MIN_PARAMS``; below it one line that names the
    suffix probably left out (``--params 7``: did you mean 7B?)."""
    typed = value.strip() if isinstance(value, str) and _PLAIN.fullmatch(value) else (
        value if type(value) in (int, float) else None)
    if typed is not None and 0 < float(typed) < MIN_PARAMS:
        x, t = float(typed), typed if isinstance(typed, str) else f"{typed:g}"
        # billions up to 2,000 (the largest published dense and MoE models stay below 2T), millions from 100 (125M, 350M)
        guesses = [f"{t}{s}" for s, ok in (("B", x <= 2000), ("M", 100 <= x <= 100_000)) if ok]
        guess = f": did you mean {' or '.join(guesses)}?" if guesses else ";"
        raise InputError(f"{what} {shown(value)} means {x:g} parameters, fewer than {MIN_PARAMS:,}{guess} accepted: "
                         "a count of 1M or more, such as 7B, 7e9 or 350M")
    n = parse_count(value, what)  # type: ignore[arg-type]
    if n < MIN_PARAMS:
        raise InputError(f"{what} {shown(value)} means {n:,} parameters, fewer than {MIN_PARAMS:,}; accepted: a "
                         "count of 1M or more, such as 7B, 7e9 or 350M")
    return n


class Model(Validated):
    """The model being trained: a parameter count, or an architecture the count is derived from."""

    parameters: int | None = bounded(default=None, gt=0, le=MAX_COUNT, why="60x the largest published model")
    """Ψ, the number of trainable parameters (derived exactly from ``architecture`` when that is given)."""
    architecture: Architecture | None = None
    """The transformer's shape: needed for activations, tensor/pipeline splits and the largest module."""
    name: str | None = None
    """Where the count came from (a preset name), for display only."""

    @field_validator("parameters", mode="before")
    @classmethod
    def _count(cls, v: object) -> object:
        """A count as typed (``7e9``, ``"7B"``, ``175_000_000_000``) -> whole parameters, at least ``MIN_PARAMS``."""
        if v is None:
            return v
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise InputError(f"parameters {shown(v)} is not a number; give a positive count such as 7e9 or 7B")
        return parse_params(v, "parameters")

    def _check(self) -> None:
        if self.parameters is None and self.architecture is None:
            raise InputError("give the model size (--params 7B) or its shape (--model, --hf-config, --layers ...)")
        if self.parameters is not None and self.architecture is not None:
            raise InputError("give --params or a model shape (--model, --hf-config, --layers ...), not both")
