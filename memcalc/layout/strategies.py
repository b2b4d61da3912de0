"""Strategies are a table, not a class hierarchy.

Each row says what a data-parallel strategy shards at peak (parameters, gradients, optimizer
states), over which group (every data-parallel rank, or a shard group inside which it shards and
across which it replicates), when it gathers parameters and reduces gradients, and which offload
devices its framework allows. Formulas ask ``spec.shards_grads``, never ``stage >= 2``.

Sources:
- ZeRO: Rajbhandari et al. 2020, arXiv 1910.02054, §5 (stages) and §7 (communication).
- FSDP: Zhao et al. 2023, arXiv 2304.11277, §3; torch.distributed.fsdp.ShardingStrategy docstrings.
- accelerate's numeric codes for fsdp_sharding_strategy: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD,
  4 HYBRID_SHARD, 5 HYBRID_SHARD_ZERO2 (accelerate/utils/constants.py FSDP_SHARDING_STRATEGY).
"""

from __future__ import annotations

from typing import Literal

from memcalc.errors import InputError, did_you_mean
from memcalc.frozen import frozen
from memcalc.units import ceil_div

Framework = Literal["ddp", "deepspeed", "fsdp"]
OffloadDevice = Literal["none", "cpu", "nvme"]
ParamGather = Literal["none", "after_step", "forward", "forward_and_backward"]
StrategyName = Literal[
    "ddp",
    "zero-0",
    "zero-1",
    "zero-2",
    "zero-3",
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "_HYBRID_SHARD_ZERO2",
]


@frozen
class StrategySpec:
    """One row of the strategy table."""

    name: str
    framework: Framework
    shards_params: bool
    """Parameters are sharded at peak (gathered one unit at a time and freed again)."""
    shards_grads: bool
    """Gradients are kept as a shard only."""
    shards_optimizer: bool
    """Optimizer states (master copy and moments) are kept as a shard only."""
    hybrid: bool
    """Shards inside a shard group and replicates across groups (HSDP); else shards over all DP ranks."""
    param_gather: ParamGather
    """When parameters are all-gathered: never, once after the optimizer step (ZeRO-1/2), in forward
    only (kept through backward: SHARD_GRAD_OP), or in forward and again in backward (ZeRO-3)."""
    reduce_each_micro_batch: bool
    """Gradients are reduced after every micro-batch (sharded gradients cannot accumulate unreduced);
    False: accumulated locally and reduced once per optimizer step (DDP no_sync, ZeRO-0/1)."""
    optimizer_offload: tuple[OffloadDevice, ...]
    """Devices the framework accepts for optimizer-state offload."""
    param_offload: tuple[OffloadDevice, ...]
    """Devices the framework accepts for parameter offload."""
    offload_together: bool
    """Parameters, gradients and optimizer states are offloaded as one (FSDP CPUOffload)."""
    same_as: str
    """The equivalent strategy in the other framework's words."""

    @property
    def grad_reduce_op(self) -> str:
        # ZeRO §7: sharded strategies reduce-scatter gradients; replicated ones all-reduce them.
        if self.shards_grads or self.shards_optimizer or self.shards_params:
            return "reduce-scatter"
        return "all-reduce"

    @property
    def label(self) -> str:
        return DISPLAY_NAMES[self.name]


_NO: tuple[OffloadDevice, ...] = ("none",)
_CPU: tuple[OffloadDevice, ...] = ("none", "cpu")
_ALL: tuple[OffloadDevice, ...] = ("none", "cpu", "nvme")

# name, framework, shards (params, grads, optimizer), hybrid, gather, reduce each micro-batch,
# optimizer offload, param offload, offload together, same as
STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec("ddp", "ddp", False, False, False, False, "none", False, _NO, _NO, False, "zero-0, NO_SHARD"),
        StrategySpec("zero-0", "deepspeed", False, False, False, False, "none", False, _NO, _NO, False, "DDP"),
        # DeepSpeed stage_1_and_2.py: stage 1 reduces at the accumulation boundary only.
        StrategySpec("zero-1", "deepspeed", False, False, True, False, "after_step", False, _CPU, _NO, False, "-"),
        StrategySpec(
            "zero-2", "deepspeed", False, True, True, False, "after_step", True, _CPU, _NO, False, "SHARD_GRAD_OP"
        ),
        StrategySpec(
            "zero-3", "deepspeed", True, True, True, False, "forward_and_backward", True, _ALL, _ALL, False, "FULL_SHARD"
        ),
        StrategySpec(
            "FULL_SHARD", "fsdp", True, True, True, False, "forward_and_backward", True, _CPU, _CPU, True, "zero-3"
        ),
        StrategySpec("SHARD_GRAD_OP", "fsdp", False, True, True, False, "forward", True, _CPU, _CPU, True, "zero-2"),
        StrategySpec("NO_SHARD", "fsdp", False, False, False, False, "none", False, _CPU, _CPU, True, "DDP"),
        StrategySpec(
            "HYBRID_SHARD", "fsdp", True, True, True, True, "forward_and_backward", True, _CPU, _CPU, True,
            "zero-3 in the shard group, DDP across",
        ),
        StrategySpec(
            "_HYBRID_SHARD_ZERO2", "fsdp", False, True, True, True, "forward", True, _CPU, _CPU, True,
            "zero-2 in the shard group, DDP across",
        ),
    )
}

DISPLAY_NAMES = {
    "ddp": "DDP",
    "zero-0": "ZeRO-0",
    "zero-1": "ZeRO-1",
    "zero-2": "ZeRO-2",
    "zero-3": "ZeRO-3",
    "FULL_SHARD": "FSDP FULL_SHARD",
    "SHARD_GRAD_OP": "FSDP SHARD_GRAD_OP",
    "NO_SHARD": "FSDP NO_SHARD",
    "HYBRID_SHARD": "FSDP HYBRID_SHARD",
    "_HYBRID_SHARD_ZERO2": "FSDP _HYBRID_SHARD_ZERO2",
}

FSDP_NAMES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
# accelerate's fsdp_sharding_strategy numbers, 1-based in the order above.
FSDP_CODES = {str(i): name for i, name in enumerate(FSDP_NAMES, start=1)}


def _norm(text: str) -> str:
    return text.strip().lower().replace("_", "-").lstrip("-")


_ALIASES: dict[str, str] = {_norm(name): name for name in STRATEGIES}
_ALIASES.update(
    {
        "dp": "ddp",
        "zero0": "zero-0",
        "zero1": "zero-1",
        "zero2": "zero-2",
        "zero3": "zero-3",
        "stage-0": "zero-0",
        "stage-1": "zero-1",
        "stage-2": "zero-2",
        "stage-3": "zero-3",
        "hybrid-shard-zero2": "_HYBRID_SHARD_ZERO2",
        "fsdp": "FULL_SHARD",
    }
)


def resolve_fsdp(text: str) -> str:
    """``--fsdp`` value -> table name: any case, ``-`` or ``_``, or accelerate's codes 1-5."""
    value = str(text).strip()
    if value in FSDP_CODES:
        return FSDP_CODES[value]
    name = _ALIASES.get(_norm(value))
    if name in FSDP_NAMES:
        return name
    accepted = ", ".join(FSDP_NAMES) + " or 1-5"
    raise InputError(f"unknown FSDP sharding strategy {value!r}{did_you_mean(value, FSDP_NAMES)}; accepted: {accepted}")


def resolve_stage(stage: int | str) -> str:
    """``--stage`` value -> ``zero-N``."""
    text = str(stage).strip()
    if text in {"0", "1", "2", "3"}:
        return f"zero-{text}"
    raise InputError(f"--stage {text!r} is not a DeepSpeed ZeRO stage; accepted: 0, 1, 2, 3")


def resolve_strategy(text: str) -> str:
    """Any strategy name users type -> table name (``zero-3``, ``full_shard``, ``DDP``, ``hybrid-shard``)."""
    value = str(text).strip()
    name = _ALIASES.get(_norm(value))
    if name is None:
        choices = list(DISPLAY_NAMES.keys())
        raise InputError(
            f"unknown strategy {value!r}{did_you_mean(value, choices)}; accepted: {', '.join(choices)}"
        )
    return name


def shard_numel(numel: int, n: int) -> int:
    """Elements one of ``n`` ranks holds of a tensor of ``numel``: ⌈Ψ/N⌉.

    ZeRO §5: each rank owns 1/N of the partitioned state. Rounded up: frameworks pad the flat
    buffer to a multiple of N (DeepSpeed stage_1_and_2.py pads to the DP world size).
    """
    return ceil_div(numel, n)
