"""The public Python API. The CLI is one more client of these two functions.

    >>> import memcalc
    >>> r = memcalc.estimate(params=175e9, stage=3, gpus=128)
    >>> r.memory.per_gpu.total            # bytes
    >>> memcalc.compare(params=7e9, gpus=64)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memcalc.errors import InputError
from memcalc.compose import estimate_from_input
from memcalc.inputs import (
    GPU,
    Cluster,
    EstimateInput,
    Model,
    Optimizer,
    Overheads,
    Precision,
    Strategy,
    resolve_optimizer,
    resolve_precision,
)
from memcalc.results import Comparison, Estimate
from memcalc.strategies import STRATEGIES, resolve_fsdp, resolve_stage, resolve_strategy
from memcalc.units import gib, parse_count

DEFAULT_GPU = "a100-sxm-80gb"

# `memcalc compare` rows by default: every strategy, and the offload variants people step through
# when memory runs out (DeepSpeed's advice: ZeRO-2 -> +offload_optimizer -> ZeRO-3 -> +offload_param).
DEFAULT_COMPARE = (
    "ddp",
    "zero-1",
    "zero-2",
    "zero-2+opt-cpu",
    "zero-3",
    "zero-3+opt-cpu",
    "zero-3+opt-cpu+param-cpu",
    "zero-3+opt-nvme+param-nvme",
    "FULL_SHARD",
    "FULL_SHARD+param-cpu",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "_HYBRID_SHARD_ZERO2",
)


def parse_strategy(text: str, shard_group: int | None = None) -> Strategy:
    """``zero-3+opt-cpu+param-nvme``, ``FULL_SHARD+param-cpu``, ``hybrid_shard`` -> ``Strategy``.

    ``+offload`` alone means the framework's usual CPU offload (DeepSpeed: optimizer; FSDP: params).
    """
    head, *mods = [part.strip() for part in str(text).split("+")]
    name = resolve_strategy(head)
    fields: dict[str, str] = {}
    for mod in mods:
        key, _, device = mod.lower().partition("-")
        if key == "offload" and not device:
            key, device = ("param" if STRATEGIES[name].offload_together else "opt"), "cpu"
        if key not in ("opt", "param") or device not in ("cpu", "nvme", "none"):
            raise InputError(
                f"unknown strategy modifier {mod!r} in {text!r}; accepted: +opt-cpu, +opt-nvme, +param-cpu, "
                "+param-nvme, +offload"
            )
        fields["offload_optimizer" if key == "opt" else "offload_params"] = device
    group = shard_group if STRATEGIES[name].hybrid else None
    return Strategy(name=name, shard_group=group, **fields)  # type: ignore[arg-type]


def _strategy(
    stage: int | str | None, fsdp: str | None, ddp: bool, strategy: str | Strategy | None,
    offload_optimizer: str, offload_params: str, shard_group: int | None,
) -> Strategy:  # fmt: skip
    given = [flag for flag, on in (("--stage", stage is not None), ("--fsdp", fsdp is not None),
                                   ("--ddp", ddp), ("--strategy", strategy is not None)) if on]  # fmt: skip
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} cannot be combined; choose one strategy")
    if isinstance(strategy, Strategy):
        return strategy
    if stage is not None:
        name = resolve_stage(stage)
    elif fsdp is not None:
        name = resolve_fsdp(fsdp)
    elif strategy is not None:
        base = parse_strategy(strategy, shard_group)
        if "+" in str(strategy):
            return base
        name = base.name
    else:
        name = "ddp"
    for flag, value in (("--offload-optimizer", offload_optimizer), ("--offload-params", offload_params)):
        if value not in ("none", "cpu", "nvme"):
            raise InputError(f"{flag} {value!r} is not an offload device; accepted: none, cpu, nvme")
    return Strategy(
        name=name,  # type: ignore[arg-type]
        offload_optimizer=offload_optimizer,  # type: ignore[arg-type]
        offload_params=offload_params,  # type: ignore[arg-type]
        shard_group=shard_group,
    )


def _gpu(gpu: str | GPU) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    from memcalc.presets import load_gpu

    return load_gpu(gpu)


def build_input(
    params: int | float | str | Model | None = None,
    *,
    gpus: int | Cluster = 1,
    gpus_per_node: int = 8,
    stage: int | str | None = None,
    fsdp: str | None = None,
    ddp: bool = False,
    strategy: str | Strategy | None = None,
    offload_optimizer: str = "none",
    offload_params: str = "none",
    shard_group: int | None = None,
    gpu: str | GPU = DEFAULT_GPU,
    precision: str | Precision = "bf16-mixed",
    optimizer: str | Optimizer = "adamw",
    grad_accum: int = 1,
    cuda_context_gib: float | None = None,
    reserve_gib: float | None = None,
    overheads: Overheads | None = None,
) -> EstimateInput:
    """Turn loose arguments (strings, numbers, or the pydantic input objects) into an ``EstimateInput``."""
    if params is None:
        raise InputError("give the model size, e.g. params=7e9 (or --params 7B)")
    model = params if isinstance(params, Model) else Model(parameters=parse_count(params, "--params"))  # type: ignore[arg-type]
    cluster = gpus if isinstance(gpus, Cluster) else Cluster(gpus=gpus, gpus_per_node=gpus_per_node)
    if overheads is None:
        o = Overheads()
        overheads = Overheads(
            cuda_context_bytes=o.cuda_context_bytes if cuda_context_gib is None else _gib_arg("--cuda-context-gib", cuda_context_gib),
            allocator_reserve_bytes=0 if reserve_gib is None else _gib_arg("--reserve-gib", reserve_gib),
        )  # fmt: skip
    return EstimateInput(
        model=model,
        precision=precision if isinstance(precision, Precision) else resolve_precision(precision),
        optimizer=optimizer if isinstance(optimizer, Optimizer) else resolve_optimizer(optimizer),
        gpu=_gpu(gpu),
        cluster=cluster,
        strategy=_strategy(stage, fsdp, ddp, strategy, offload_optimizer, offload_params, shard_group),
        overheads=overheads,
        grad_accum=grad_accum,
    )


def _gib_arg(flag: str, value: float) -> int:
    if not value >= 0 or value == float("inf"):  # also rejects NaN
        raise InputError(f"{flag} {value!r} must be a finite size in GiB, 0 or more")
    return gib(value)


def estimate(params: int | float | str | Model | EstimateInput | None = None, **kwargs: object) -> Estimate:
    """Per-GPU memory and per-step communication of one strategy.

    ``memcalc.estimate(params=175e9, stage=3, gpus=128)``; ``fsdp="FULL_SHARD"``, ``ddp=True`` or
    ``strategy="zero-3+opt-cpu"`` pick other strategies. An ``EstimateInput`` is taken as it is.
    """
    if isinstance(params, EstimateInput):
        if kwargs:
            raise InputError("pass either an EstimateInput or keyword arguments, not both")
        return estimate_from_input(params)
    return estimate_from_input(build_input(params, **kwargs))  # type: ignore[arg-type]


def compare(
    params: int | float | str | Model | None = None,
    *,
    strategies: Iterable[str | Strategy] | None = None,
    shard_group: int | None = None,
    **kwargs: object,
) -> Comparison:
    """Several strategies side by side for one model and cluster (default: ``DEFAULT_COMPARE``)."""
    for key in ("stage", "fsdp", "ddp", "strategy", "offload_optimizer", "offload_params"):
        if kwargs.get(key) not in (None, False, "none"):
            raise InputError(f"compare takes strategies=[...], not {key}")
    chosen: Sequence[str | Strategy] = list(strategies) if strategies is not None else list(DEFAULT_COMPARE)
    if not chosen:
        raise InputError("--strategies is empty; name at least one, e.g. zero-2,zero-3,FULL_SHARD")
    rows = []
    for s in chosen:
        strategy = s if isinstance(s, Strategy) else parse_strategy(s, shard_group)
        rows.append(estimate_from_input(build_input(params, strategy=strategy, **kwargs)))  # type: ignore[arg-type]
    return Comparison(estimates=rows)
