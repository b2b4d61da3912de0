"""What each model-state tensor is stored in: training precisions and optimizers, as tables.

Bytes per element of parameters, gradients and master copy (ZeRO §3.1) and the optimizer's state per parameter.
Plain frozen dataclasses: the inputs floor validates names against these tables, the core reads their numbers.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from memcalc.errors import InputError, did_you_mean
from memcalc.frozen import frozen

T = TypeVar("T")

PrecisionName = Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16", "amp-bf16", "amp-fp16"]


class PrecisionBytes:
    """What follows from a precision's bytes: shared by the core's table and the inputs' pydantic model."""

    name: str
    param_bytes: int
    master_bytes: int

    @property
    def state_bytes(self) -> int:
        """Bytes of an optimizer moment kept in the optimizer's working dtype.

        With a master copy (or fp32 params) moments are fp32 (ZeRO §3.1: "fp32 ... momentum and
        variance"); pure bf16 training keeps them in bf16 (torch.optim.AdamW: zeros_like(param)).
        """
        return 4 if self.master_bytes or self.param_bytes == 4 else self.param_bytes

    @property
    def low_dtype(self) -> str:
        """dtype of working parameters and gradients, as collectives carry them."""
        if self.param_bytes == 4:
            return "fp32"
        return "fp16" if self.name.startswith("fp16") else "bf16"

    @property
    def autocast(self) -> bool:
        """fp32 weights, gradients and optimizer states; matmuls and most activations in 16 bits (torch.autocast)."""
        return self.name.startswith("amp-")

    @property
    def compute_dtype(self) -> str:
        """dtype the matmuls and saved activations run in: autocast's for amp-*, else the working parameters'."""
        return self.name.removeprefix("amp-") if self.autocast else self.low_dtype

    @property
    def activation_bytes(self) -> int:
        """Bytes per element of a saved activation in the compute dtype."""
        return 4 if self.compute_dtype == "fp32" else 2


@frozen
class Precision(PrecisionBytes):
    """Bytes per element of each model-state tensor under one training precision."""

    name: PrecisionName
    param_bytes: int
    """Working parameters, the copy forward and backward read (2 for fp16/bf16, 4 for fp32)."""
    grad_bytes: int
    """Gradients as backward produces and reduces them."""
    master_bytes: int
    """fp32 master copy of the parameters the optimizer updates; 0 where there is none."""
    description: str
    """What the precision keeps in which dtype."""


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        # Pure fp32 training: params 4 + grads 4, no master copy (the fp32 weights are what the optimizer updates).
        Precision(name="fp32", param_bytes=4, grad_bytes=4, master_bytes=0, description="fp32 params and grads"),
        # ZeRO §3.1 (Micikevicius et al. 2018 mixed precision): fp16 params and grads + fp32 master.
        Precision(
            name="fp16-mixed", param_bytes=2, grad_bytes=2, master_bytes=4, description="fp16 params/grads + fp32 master"
        ),
        Precision(
            name="bf16-mixed", param_bytes=2, grad_bytes=2, master_bytes=4, description="bf16 params/grads + fp32 master"
        ),
        Precision(name="bf16", param_bytes=2, grad_bytes=2, master_bytes=0, description="pure bf16, no master copy"),
        # torch.autocast (Trainer(bf16=True), Lightning's "bf16-mixed" plugin): fp32 weights and gradients, AdamW
        # moments fp32 (4 + 4 + 8 B/param); matmuls in bf16/fp16 on bf16/fp16 casts made on the fly (DOMAIN §10).
        Precision(name="amp-bf16", param_bytes=4, grad_bytes=4, master_bytes=0,
                  description="fp32 weights under torch.autocast(bfloat16)"),
        Precision(name="amp-fp16", param_bytes=4, grad_bytes=4, master_bytes=0,
                  description="fp32 weights under torch.autocast(float16) with a GradScaler"),
    )
}
_PRECISION_ALIASES = {
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "float32": "fp32",
    "fp16-mixed": "fp16-mixed", "16-mixed": "fp16-mixed", "mixed-fp16": "fp16-mixed", "amp": "fp16-mixed",
    "bf16-mixed": "bf16-mixed", "mixed-bf16": "bf16-mixed",
    "bf16": "bf16", "bf16-true": "bf16", "bfloat16": "bf16", "pure-bf16": "bf16",
    "amp-bf16": "amp-bf16", "autocast-bf16": "amp-bf16", "amp-fp16": "amp-fp16", "autocast-fp16": "amp-fp16",
}  # fmt: skip


def _resolve(what: str, text: str, aliases: dict[str, str], table: dict[str, T], hint: str = "") -> T:
    """A table entry by any of its names (case-insensitive, ``-`` and ``_`` alike), or a one-line error."""
    key = str(text).strip().lower().replace("_", "-")
    if key in aliases:
        return table[aliases[key]]
    names = list(table)
    raise InputError(f"unknown {what} {text!r}{did_you_mean(key, names)}; accepted: {', '.join(names)}{hint}")


def resolve_precision(text: str) -> Precision:
    return _resolve("precision", text, _PRECISION_ALIASES, PRECISIONS)


# --------------------------------------------------------------------------------------------
# Optimizer: state bytes per parameter.
# --------------------------------------------------------------------------------------------

OptimizerName = Literal["adamw", "sgd", "sgd-momentum", "adam-8bit", "paged-adam-8bit", "adafactor", "lion"]


class OptimizerBytes:
    """What follows from an optimizer's state: shared by the core's table and the inputs' pydantic model."""

    moments: int
    moment_bytes: int | None

    def moment_bytes_for(self, precision: PrecisionBytes) -> int:
        return self.moment_bytes if self.moment_bytes is not None else precision.state_bytes

    def state_bytes_per_param(self, precision: PrecisionBytes) -> int:
        """K in the ZeRO paper (§3.1): master copy + moments, bytes per parameter. AdamW, bf16-mixed: 4 + 4 + 4 = 12."""
        return precision.master_bytes + self.moments * self.moment_bytes_for(precision)


@frozen
class Optimizer(OptimizerBytes):
    """The optimizer's per-parameter state, apart from the master copy (which belongs to the precision)."""

    name: OptimizerName
    moments: int
    """Full-size state tensors per parameter (Adam: m and v = 2; momentum SGD and Lion: 1)."""
    moment_bytes: int | None
    """Fixed bytes per moment element (8-bit Adam: 1); None = the precision's state dtype."""
    source: str
    """Where the state's size comes from."""
    note: str | None = None
    """What the count leaves out, if anything."""
    step_counter: bool = False
    """torch.optim keeps a 4-byte ``step`` tensor per parameter tensor (Adam, AdamW, Adafactor)."""


OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer(name="adamw", moments=2, moment_bytes=None, source="ZeRO §3.1: momentum + variance", step_counter=True),
        Optimizer(name="sgd", moments=0, moment_bytes=None, source="torch.optim.SGD, momentum=0: no state (master only)"),
        Optimizer(name="sgd-momentum", moments=1, moment_bytes=None, source="torch.optim.SGD: momentum_buffer"),
        Optimizer(
            name="adam-8bit",
            moments=2,
            moment_bytes=1,
            source="Dettmers et al. 2022 (arXiv 2110.02861): 8-bit m and v, 1 byte each",
            note="8-bit Adam's block-wise quantization statistics (one fp32 per 2048 values) are not counted",
        ),
        Optimizer(
            name="paged-adam-8bit",
            moments=2,
            moment_bytes=1,
            source="bitsandbytes PagedAdamW8bit: 8-bit m and v in CUDA unified memory (cudaMallocManaged)",
            note="paged 8-bit states live outside PyTorch's allocator and the driver may evict them to host memory "
                 "under pressure: the realistic accounting leaves them out of peak_allocated",
        ),
        Optimizer(
            name="adafactor",
            moments=0,
            moment_bytes=None,
            source="Shazeer & Stern 2018 (arXiv 1804.04235): factored second moment, no first moment by default",
            note="Adafactor's factored second moment (rows + columns of each matrix) is not counted for a bare parameter count",
            step_counter=True,
        ),
        Optimizer(name="lion", moments=1, moment_bytes=None, source="Chen et al. 2023 (arXiv 2302.06675): one momentum"),
    )
}
_OPTIMIZER_ALIASES = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "sgd-momentum": "sgd-momentum",
                      "momentum": "sgd-momentum", "adam-8bit": "adam-8bit", "adamw-8bit": "adam-8bit",
                      "adam8bit": "adam-8bit", "8bit-adam": "adam-8bit",
                      "paged-adam-8bit": "paged-adam-8bit", "paged-adamw-8bit": "paged-adam-8bit", "adafactor": "adafactor", "lion": "lion"}  # fmt: skip


def resolve_optimizer(text: str) -> Optimizer:
    return _resolve("optimizer", text, _OPTIMIZER_ALIASES, OPTIMIZERS, " (adam = adamw)")
