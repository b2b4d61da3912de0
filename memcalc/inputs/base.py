"""The base of every input model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Inputs are data: frozen, unknown fields refused; schemas are built on first use, not at import."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

