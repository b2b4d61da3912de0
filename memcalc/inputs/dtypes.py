"""Precisions and optimizers as the inputs name them: pydantic models mirroring the core's tables.

The core (``memcalc.layout.dtypes``) keeps the tables as plain frozen dataclasses and does the arithmetic; here each
row is also a pydantic model, so that ``EstimateInput.precision`` validates and has a JSON schema. Both share the
derived values (``PrecisionBytes``, ``OptimizerBytes``); ``core`` gives the core's row back for the ``Plan``.
"""

from typing import Any

from memcalc.layout import dtypes
from memcalc.layout.dtypes import OptimizerBytes, OptimizerName, PrecisionBytes, PrecisionName
from memcalc.validated import Validated, bounded

MAX_BYTES = 8
"""Bytes per element of a model-state tensor: at most fp64's 8."""


class Precision(Validated, PrecisionBytes):
    """Bytes per element of each model-state tensor under one training precision (ZeRO §3.1)."""

    name: PrecisionName
    """The precision's name (``memcalc.PRECISIONS``): fp32, fp16-mixed, bf16-mixed, bf16, amp-bf16, amp-fp16."""
    param_bytes: int = bounded(ge=1, le=MAX_BYTES)
    """Working parameters, the copy forward and backward read (2 for fp16/bf16, 4 for fp32)."""
    grad_bytes: int = bounded(ge=1, le=MAX_BYTES)
    """Gradients as backward produces and reduces them."""
    master_bytes: int = bounded(ge=0, le=MAX_BYTES)
    """fp32 master copy of the parameters the optimizer updates; 0 where there is none."""
    description: str
    """What the precision keeps in which dtype."""


class Optimizer(Validated, OptimizerBytes):
    """The optimizer's per-parameter state, apart from the master copy (which belongs to the precision)."""

    name: OptimizerName
    """The optimizer's name (``memcalc.OPTIMIZERS``)."""
    moments: int = bounded(ge=0, le=16)
    """Full-size state tensors per parameter (Adam: m and v = 2; momentum SGD and Lion: 1)."""
    moment_bytes: int | None = bounded(None, ge=1, le=MAX_BYTES)
    """Fixed bytes per moment element (8-bit Adam: 1); None = the precision's state dtype."""
    source: str
    """Where the state's size comes from."""
    note: str | None = None
    """What the count leaves out, if anything."""
    step_counter: bool = False
    """torch.optim keeps a 4-byte ``step`` tensor per parameter tensor (Adam, AdamW, Adafactor)."""


def _fields(row: Any) -> dict[str, Any]:
    return {f: getattr(row, f) for f in row.__dataclass_fields__}


PRECISIONS: dict[str, Precision] = {n: Precision(**_fields(p)) for n, p in dtypes.PRECISIONS.items()}
OPTIMIZERS: dict[str, Optimizer] = {n: Optimizer(**_fields(o)) for n, o in dtypes.OPTIMIZERS.items()}


def resolve_precision(text: str) -> Precision:
    """A precision by any of its names (``bf16-true``, ``mixed-bf16`` ...), or one line naming the accepted ones."""
    return PRECISIONS[dtypes.resolve_precision(text).name]


def resolve_optimizer(text: str) -> Optimizer:
    """An optimizer by any of its names (``adam`` = adamw ...), or one line naming the accepted ones."""
    return OPTIMIZERS[dtypes.resolve_optimizer(text).name]


def from_core(row: object) -> object:
    """A row of the core's tables (``memcalc.layout.dtypes``) as the inputs' model; anything else as it is."""
    if isinstance(row, dtypes.Precision):
        return Precision(**_fields(row))
    if isinstance(row, dtypes.Optimizer):
        return Optimizer(**_fields(row))
    return row


def core_precision(p: PrecisionBytes) -> dtypes.Precision:
    """The core's row for a validated precision (the table's own when it is one of the table's)."""
    row = dtypes.PRECISIONS.get(p.name)
    return row if row is not None and _fields(row) == dict(p) else dtypes.Precision(**dict(p))  # type: ignore[call-overload]


def core_optimizer(o: OptimizerBytes) -> dtypes.Optimizer:
    """The core's row for a validated optimizer (the table's own when it is one of the table's)."""
    row = dtypes.OPTIMIZERS.get(o.name)  # type: ignore[attr-defined]
    return row if row is not None and _fields(row) == dict(o) else dtypes.Optimizer(**dict(o))  # type: ignore[call-overload]
