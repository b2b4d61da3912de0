"""The model being trained: a parameter count or an architecture."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from memcalc.errors import InputError
from memcalc.inputs.base import Frozen
from memcalc.model.architecture import Architecture
from memcalc.units import parse_count


class Model(Frozen):
    """The model being trained: a parameter count, or an architecture the count is derived from."""

    parameters: int | None = Field(default=None, gt=0)
    """Ψ, the number of trainable parameters (derived exactly from ``architecture`` when that is given)."""
    architecture: Architecture | None = None
    """The transformer's shape: needed for activations, tensor/pipeline splits and the largest module."""
    name: str | None = None
    """Where the count came from (a preset name), for display only."""

    @field_validator("parameters", mode="before")
    @classmethod
    def _parse(cls, v: object) -> int | None:
        if v is None:
            return None
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return parse_count(v, "parameters")
        raise InputError(f"parameters {v!r} is not a number; give a positive count such as 7e9 or 7B")

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if self.parameters is None and self.architecture is None:
            raise InputError("give the model size (--params 7B) or its shape (--model, --hf-config, --layers ...)")
        if self.parameters is not None and self.architecture is not None:
            raise InputError("give --params or a model shape (--model, --hf-config, --layers ...), not both")
        return self
