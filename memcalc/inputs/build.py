"""Loose arguments (strings, numbers, presets, config values, or the input records themselves) turned into one
validated ``EstimateInput``: what ``memcalc.estimate``, ``memcalc.compare`` and the command line take."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from memcalc.errors import InputError, shown
from memcalc.inputs import (
    GPU,
    Cluster,
    EstimateInput,
    EstimatorOptions,
    FrameworkOptions,
    Model,
    Optimizer,
    Overheads,
    Parallelism,
    Precision,
    Strategy,
    Timing,
    Workload,
    resolve_optimizer,
    resolve_precision,
)
from memcalc.inputs.arguments import choice as _choice, elements as _elements, gib_arg as _gib_arg, keywords as _keywords
from memcalc.inputs.hardware import DEFAULT_GPU, MAX_GPUS
from memcalc.inputs.model import parse_params
from memcalc.layout.strategies import STRATEGIES, resolve_fsdp, resolve_stage, resolve_strategy
from memcalc.model.architecture import Architecture
from memcalc.units import parse_count

if TYPE_CHECKING:
    from memcalc.inputs.finetune import Lora

MAX_COMPARE = 100
"""Rows of one comparison: 4x every distinct strategy and offload pairing (25)."""


def _build_input_names() -> list[str]:
    return list(inspect.signature(build_input).parameters)

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
    if type(text) is not str or len(text) > 200:
        raise InputError(f"--strategy {shown(text)} is not accepted; accepted: a strategy name such as 'zero-3', "
                         "'zero-3+opt-cpu+param-nvme' or 'FULL_SHARD+param-cpu'")
    if shard_group is not None and not (type(shard_group) is int and 1 <= shard_group <= MAX_GPUS):
        raise InputError(f"--shard-group {shown(shard_group)} is not accepted; accepted: a whole number from 1 to "
                         f"{MAX_GPUS:,}, or None")
    head, *mods = [part.strip() for part in text.split("+")]
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
        if ("offload_optimizer" if key == "opt" else "offload_params") in fields:
            raise InputError(f"strategy {text!r} places the {'optimizer' if key == 'opt' else 'parameters'} twice; "
                             "accepted: one +opt-... and one +param-... at most")
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
    if isinstance(strategy, Strategy) or (strategy is not None and "+" in strategy):
        for name, value, default in (("--offload-optimizer", offload_optimizer, "none"),
                                     ("--offload-params", offload_params, "none"), ("--shard-group", shard_group, None)):
            if value != default and not (name == "--shard-group" and not isinstance(strategy, Strategy)):
                where = "a Strategy" if isinstance(strategy, Strategy) else f"--strategy {strategy!r}"
                raise InputError(f"{name} {value} cannot be combined with {where}, which places the model states "
                                 f"itself; accepted: write it in the strategy (e.g. 'zero-3+opt-cpu+param-nvme')")
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
    from memcalc.inputs.presets import load_gpu

    return load_gpu(gpu)


SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")


def resolve_architecture(
    model: str | Architecture | None = None, hf_config: str | None = None, **shape: int | None
) -> Architecture | None:
    """A preset (``--model``), a config.json (``--hf-config``) or explicit shape flags, flags overriding the first two."""
    if model is not None and hf_config is not None:
        raise InputError("--model and --hf-config cannot be combined; choose one")
    given = {k: v for k, v in shape.items() if v is not None}
    for k, v in given.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"--{k.replace('_', '-')} {shown(v)} must be a whole number of 1 or more")
    if isinstance(model, Architecture):
        base: Architecture | None = model
    elif model is not None:
        from memcalc.inputs.presets import load_model

        base = load_model(model)
    elif hf_config is not None:
        from memcalc.model.hf_config import load_hf_config

        base = load_hf_config(hf_config)
    else:
        base = None
    if base is None:
        if not given:
            return None
        missing = [f"--{k}" for k in ("layers", "hidden", "heads", "vocab") if k not in given]
        if missing:
            raise InputError(f"a model shape needs {', '.join(missing)} too (or start from --model NAME)")
        return Architecture(name="custom", max_positions=0, position="rotary", **given)  # type: ignore[arg-type]
    if not given:
        return base
    if "hidden" in given or "heads" in given:
        given["head_dim"] = None  # a new width or head count re-derives head_dim = hidden / heads
    return base.replace(**given)


@_keywords()
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
    precision: str | Precision | None = None,
    optimizer: str | Optimizer = "adamw",
    grad_accum: int | None = None,
    micro_batches: int | None = None,
    cuda_context_gib: float | None = None,
    reserve_gib: float | None = None,
    overheads: Overheads | None = None,
    model: str | Architecture | None = None,
    hf_config: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    vocab: int | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    recompute: str = "none",
    attention: str | None = None,
    dropout: float | None = None,
    device: str = "cuda",
    loss: str = "standard",
    optimizer_impl: str | None = None,
    compile: bool = False,  # noqa: A002 (the flag's name)
    compile_loss: bool | None = None,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    sequence_parallel: bool = False,
    virtual_stages: int = 1,
    framework: str | None = None,
    shard_over: str | None = None,
    stage_layers: str | Sequence[int] | None = None,
    parallelism: Parallelism | None = None,
    workload: Workload | None = None,
    accounting: str = "auto",
    zero_init: bool = True,
    buffer_factor: float = 1.5,
    largest_layer_params: int | float | str | None = None,
    fsdp_version: int | None = None,
    fsdp_wrap: str | None = None,
    fsdp_auto_wrap: str | None = None,
    backward_prefetch: str | None = None,
    bucket_view: bool = False,
    min_num_params: int | float | str | None = None,
    max_reuse_distance: int | float | str | None = None,
    max_live_parameters: int | float | str | None = None,
    prefetch_bucket_size: int | float | str | None = None,
    reduce_bucket_size: int | float | str | None = None,
    overlap_comm: bool | None = None,
    grad_reduce_dtype: str | None = None,
    defer_embedding_wgrad: int | None = None,
    persistence_threshold: int | float | str | None = None,
    sub_group_size: float | str | None = None,
    zero3_step: str = "steady",
    cluster: str | None = None,
    tokens: int | float | str | None = None,
    price_per_gpu_hour: float | None = None,
    intra_node_gbps: float | None = None,
    network_gbits_per_gpu: float | None = None,
    intra_node_efficiency: float | None = None,
    network_efficiency: float | None = None,
    pcie_gbps: float | None = None,
    host_memory_gbps: float | None = None,
    float8: str = "none",
    float8_all_gather: bool = False,
    lora_rank: int | None = None,
    lora_targets: str | Sequence[str] | None = None,
    quantize: str = "none",
) -> EstimateInput:
    """Turn loose arguments (strings, numbers, or the pydantic input objects) into an ``EstimateInput``."""
    arch = resolve_architecture(model, hf_config, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                ffn=ffn, vocab=vocab)  # fmt: skip
    if isinstance(params, Model):
        the_model = params
    elif arch is not None:
        if params is not None:
            raise InputError("give --params or a model shape (--model, --hf-config, --layers ...), not both")
        the_model = Model(architecture=arch, name=arch.name)
    elif params is None:
        raise InputError("give the model size (--params 7B) or its shape (--model llama-2-7b, --hf-config config.json)")
    else:
        the_model = Model(parameters=parse_params(params))
    the_cluster = gpus if isinstance(gpus, Cluster) else Cluster(gpus=gpus, gpus_per_node=gpus_per_node)
    if grad_accum is not None and micro_batches is not None and grad_accum != micro_batches:
        raise InputError(f"--grad-accum {grad_accum} and --micro-batches {micro_batches} name the same thing; give one")
    if workload is None and seq_len is not None:
        if optimizer_impl is None:  # the framework's own AdamW: torch's foreach unless it picks another
            from memcalc.layout.compose import composition, framework as _framework

            fw_given = _framework(framework)
            optimizer_impl = composition(None if fw_given is None else fw_given.name).optimizer_impl
        if attention is not None:
            _choice("--attention", attention, ("eager", "flash", "sdpa"))
        _choice("--device", device, ("cuda", "cpu"))
        workload = Workload(seq_len=seq_len, micro_batch=1 if micro_batch is None else micro_batch,  # type: ignore[arg-type]
                            recompute=recompute, attention=attention, dropout=dropout, device=device,  # type: ignore[arg-type]
                            loss=loss, optimizer_impl=optimizer_impl, compile=compile,  # type: ignore[arg-type]
                            compile_loss=compile_loss)  # fmt: skip
    elif workload is None and (micro_batch is not None or dropout is not None or compile):
        raise InputError("--micro-batch, --dropout and --compile need --seq-len (activations are counted per sequence)")
    if workload is not None and workload.attention is None:  # the model code's own attention
        from memcalc.memory.accountings.scope import default_attention

        workload = workload.replace(attention=default_attention(the_model.architecture, accounting))
    if parallelism is None:
        from memcalc.layout.compose import framework as _framework, parse_stage_layers, shard_over as _shard_over

        fw = _framework(framework)
        parallelism = Parallelism(tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=sequence_parallel,
                                  virtual_stages=virtual_stages, framework=None if fw is None else fw.name,  # type: ignore[arg-type]
                                  shard_over=None if shard_over is None else _shard_over(shard_over.strip().lower() if isinstance(shard_over, str) else shard_over, fw),  # type: ignore[arg-type]
                                  stage_layers=parse_stage_layers(stage_layers))  # fmt: skip
    _choice("--accounting", accounting, ("auto", "realistic", "paper", "implementation", "deepspeed-estimator"))
    the_optimizer = optimizer if isinstance(optimizer, Optimizer) else resolve_optimizer(optimizer)
    the_strategy = _strategy(stage, fsdp, ddp, strategy, offload_optimizer, offload_params, shard_group)
    the_lora = _lora(lora_rank, lora_targets, quantize)
    from memcalc.layout.compose import fsdp_version as _fsdp_version, framework as _fw

    fsdp_version = _fsdp_version(fsdp_version, _fw(parallelism.framework), the_strategy.spec.framework == "fsdp")
    assumed: tuple[str, ...] = ()
    if precision is None:  # the framework's own (memcalc.layout.compose.default_precision), said in the header
        from memcalc.layout.compose import default_precision

        if accounting in ("paper", "deepspeed-estimator"):  # asked for the paper's view: the paper's regime
            precision, why = "bf16-mixed", "the ZeRO paper's mixed-precision Adam (2 + 2 + 12 bytes per parameter, §3.1)"
        else:
            precision, why = default_precision(_fw(parallelism.framework), the_strategy.spec.framework,
                                               parallelism.tp > 1 or parallelism.pp > 1)
        assumed = (f"precision {precision}: {why}; pass precision=",)
    the_precision = precision if isinstance(precision, Precision) else resolve_precision(precision)
    knobs = [flag for flag, v in (("--max-reuse-distance", max_reuse_distance),
                                  ("--max-live-parameters", max_live_parameters),
                                  ("--prefetch-bucket-size", prefetch_bucket_size),
                                  ("--persistence-threshold", persistence_threshold),
                                  ("--sub-group-size", sub_group_size)) if v is not None]
    if knobs and accounting == "paper":  # asked for by name; under auto the paper's answer notes them as unused
        raise InputError(f"{', '.join(knobs)}: DeepSpeed ZeRO-3 settings, used only with --stage 3 and "
                         "--accounting realistic or implementation (--sub-group-size: realistic) (got --accounting "
                         "paper)")
    if accounting == "auto":
        # The realistic answer wherever memcalc models the step's timeline; the paper's elsewhere (a note says why).
        from memcalc.memory.accountings.scope import why_not

        realistic = why_not(the_model.architecture, the_precision.name, the_optimizer.name, the_strategy.spec.name, workload,
                            parallelism.tp, parallelism.pp, parallelism.cp, parallelism.ep, fsdp_version,
                            lora=the_lora, framework=parallelism.framework,
                            sequence_parallel=parallelism.sequence_parallel,
                            offload=the_strategy.offload,
                            overlap_comm=bool(overlap_comm),
                            fsdp_wrap=fsdp_wrap.strip().lower() if isinstance(fsdp_wrap, str) else None,
                            fsdp_auto_wrap=(fsdp_auto_wrap.strip().lower() if isinstance(fsdp_auto_wrap, str)
                                            else None), float8=_float8(float8)) is None
        accounting = "realistic" if realistic else "paper"
    if overheads is None:
        # CUDA context: the paper's round 0.5 GiB; the realistic accounting's measured 0.75 GiB (H100, torch 2.11).
        default_context = Overheads().cuda_context_bytes
        if accounting == "realistic":
            from memcalc.memory.allocator.allocator import CONTEXT_HIGH

            default_context = CONTEXT_HIGH
        overheads = Overheads(
            cuda_context_bytes=default_context if cuda_context_gib is None else _gib_arg("--cuda-context-gib", cuda_context_gib),
            allocator_reserve_bytes=0 if reserve_gib is None else _gib_arg("--reserve-gib", reserve_gib),
        )  # fmt: skip
    _choice("--zero3-step", zero3_step, ("steady", "first"))
    if grad_reduce_dtype is not None:
        grad_reduce_dtype = grad_reduce_dtype.strip().lower()
        _choice("--grad-reduce-dtype", grad_reduce_dtype, ("fp32", "bf16"))
    if fsdp_wrap is not None:
        from memcalc.layout.compose import check_wrap

        fsdp_wrap = check_wrap(fsdp_wrap.strip().lower())
    if fsdp_auto_wrap is not None:
        fsdp_auto_wrap = fsdp_auto_wrap.strip().lower()
        _choice("--fsdp-auto-wrap", fsdp_auto_wrap, ("transformer", "none"))
    if backward_prefetch is not None:
        backward_prefetch = backward_prefetch.strip().lower()
        _choice("--backward-prefetch", backward_prefetch, ("pre", "post", "none"))
    if not buffer_factor > 0:
        raise InputError(f"--buffer-factor {buffer_factor!r} must be positive")
    estimator = EstimatorOptions(
        zero_init=zero_init, buffer_factor=buffer_factor,
        largest_layer_params=None if largest_layer_params is None else parse_count(largest_layer_params, "--largest-layer-params"),
    )  # fmt: skip
    try:
        return EstimateInput(
            accounting=accounting,  # type: ignore[arg-type]
            estimator=estimator,
            framework=FrameworkOptions(
                fsdp_version=fsdp_version,  # type: ignore[arg-type]
                fsdp_wrap=fsdp_wrap,  # type: ignore[arg-type]
                fsdp_auto_wrap=fsdp_auto_wrap,  # type: ignore[arg-type]
                backward_prefetch=backward_prefetch,  # type: ignore[arg-type]
                bucket_view=bucket_view,
                min_num_params=None if min_num_params is None else parse_count(min_num_params, "--min-num-params"),
                max_reuse_distance=_elements("--max-reuse-distance", max_reuse_distance),
                max_live_parameters=_elements("--max-live-parameters", max_live_parameters),
                prefetch_bucket_size=_elements("--prefetch-bucket-size", prefetch_bucket_size),
                reduce_bucket_size=_elements("--reduce-bucket-size", reduce_bucket_size),
                persistence_threshold=_elements("--persistence-threshold", persistence_threshold),
                sub_group_size=_elements("--sub-group-size", sub_group_size),
                overlap_comm=overlap_comm,
                grad_reduce_dtype=grad_reduce_dtype,  # type: ignore[arg-type]
                defer_embedding_wgrad=defer_embedding_wgrad,
                zero3_step=zero3_step,  # type: ignore[arg-type]
            ),
            model=the_model,
            precision=the_precision,
            optimizer=the_optimizer,
            gpu=_gpu(gpu),
            cluster=the_cluster,
            strategy=the_strategy,
            parallelism=parallelism,
            workload=workload,
            overheads=overheads,
            grad_accum=grad_accum if grad_accum is not None else micro_batches if micro_batches is not None else 1,
            lora=the_lora,
            assumed=assumed,
            float8=_float8(float8),  # type: ignore[arg-type]
            float8_all_gather=float8_all_gather,
            timing=Timing(cluster=cluster, tokens=None if tokens is None else float(parse_count(tokens, "--tokens")),
                          price_per_gpu_hour=price_per_gpu_hour, intra_node_gbps=intra_node_gbps,
                          network_gbits_per_gpu=network_gbits_per_gpu, intra_node_efficiency=intra_node_efficiency,
                          network_efficiency=network_efficiency, pcie_gbps=pcie_gbps, host_memory_gbps=host_memory_gbps),
        )
    except InputError as e:  # a default precision the GPU cannot run: named as the default, not as typed
        if assumed and str(e).startswith(f"--precision {the_precision.name} computes"):
            why = assumed[0].split(": ", 1)[1].removesuffix("; pass precision=")
            raise InputError(str(e).replace(f"--precision {the_precision.name} ",
                                            f"--precision {the_precision.name} (the default: {why}) ", 1)) from None
        raise


def _float8(recipe: str) -> str:
    key = str(recipe).strip().lower()
    if key not in ("none", "tensorwise", "rowwise"):
        raise InputError(f"--float8 {recipe!r} is not accepted; accepted: none, tensorwise, rowwise")
    return key


def _lora(rank: int | None, targets: str | Sequence[str] | None, quantize: str) -> Lora | None:
    """``--lora-rank``, ``--lora-targets``, ``--quantize`` -> a ``Lora`` record (targets and nf4 need a rank)."""
    from memcalc.inputs.finetune import Lora, parse_quantize, parse_targets

    q = parse_quantize(quantize)
    if rank is None:
        if targets is not None or q != "none":
            given = "--lora-targets" if targets is not None else f"--quantize {q}"
            raise InputError(f"{given} needs --lora-rank R (adapters train on the frozen, quantized base: QLoRA)")
        return None
    return Lora(rank=rank, targets=parse_targets(targets), quantize=q)  # type: ignore[arg-type]
