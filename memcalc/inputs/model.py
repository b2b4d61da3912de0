"""The model being trained: a parameter count or an architecture."""

from __future__ import annotations


from memcalc.errors import InputError, shown
from memcalc.record import Record, bounded, check_fields, record
from memcalc.model.architecture import Architecture
from memcalc.units import MAX_COUNT, parse_count


@record
class Model(Record):
    """The model being trained: a parameter count, or an architecture the count is derived from."""

    parameters: int | None = bounded(default=None, gt=0, le=MAX_COUNT, why="60x the largest published model")
    """Ψ, the number of trainable parameters (derived exactly from ``architecture`` when that is given)."""
    architecture: Architecture | None = None
    """The transformer's shape: needed for activations, tensor/pipeline splits and the largest module."""
    name: str | None = None
    """Where the count came from (a preset name), for display only."""

    def __post_init__(self) -> None:
        v = self.parameters
        if v is not None:
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise InputError(f"parameters {shown(v)} is not a number; give a positive count such as 7e9 or 7B")
            object.__setattr__(self, "parameters", parse_count(v, "parameters"))
        check_fields(self)
        if self.parameters is None and self.architecture is None:
            raise InputError("give the model size (--params 7B) or its shape (--model, --hf-config, --layers ...)")
        if self.parameters is not None and self.architecture is not None:
            raise InputError("give --params or a model shape (--model, --hf-config, --layers ...), not both")
