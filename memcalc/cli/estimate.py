"""``memcalc estimate`` and ``memcalc compare``: one strategy, or several side by side.

No ``from __future__ import annotations`` here: typer reads every option's annotation on each run, and evaluated
annotations spare it evaluating seventy strings twice.
"""

import sys
from typing import Annotated, Any

import typer

from memcalc.cli.app import Command, app, micro_batch_arg, output_format, positive, run_or_fail, show, units_arg
from memcalc.cli.configs import as_flags, blame, with_config, write_files
from memcalc.cli.options import (
    ClusterOpt,
    HostGbps,
    IntraEff,
    IntraGbps,
    NetEff,
    NetGbits,
    PcieGbps,
    Price,
    Tokens,
    AccelerateConfig,
    DeepSpeedConfig,
    TorchtitanConfig,
    MegatronArgs,
    WriteConfig,
    Force,
    Params,
    ModelOpt,
    HfConfig,
    Layers,
    Hidden,
    Heads,
    KvHeads,
    Ffn,
    Vocab,
    SeqLen,
    MicroBatch,
    Loss,
    OptimizerImpl,
    Recompute,
    Compile,
    CompileLoss,
    AttentionOpt,
    Dropout,
    Device,
    Tp,
    Pp,
    Cp,
    Ep,
    Sp,
    Vp,
    FrameworkOpt,
    ShardOver,
    StageLayers,
    AccountingOpt,
    FsdpVersion,
    FsdpAutoWrap,
    FsdpWrap,
    BackwardPrefetch,
    MinNumParams,
    ReuseDistance,
    MaxLive,
    PrefetchBucket,
    ReduceBucket,
    OverlapComm,
    GradReduceDtype,
    DeferWgrad,
    Persistence,
    SubGroup,
    Zero3Step,
    BucketView,
    ZeroInit,
    BufferFactor,
    LargestLayer,
    MicroBatches,
    Gpus,
    GpusPerNode,
    Gpu,
    PrecisionOpt,
    OptimizerOpt,
    ShardGroup,
    GradAccum,
    CudaContext,
    Reserve,
    Units,
    Format,
    EstimateFormat,
    Timeline,
    MemorySnapshot,
    Check,
    Json,
    Verbose,
    LoraRank,
    LoraTargets,
    Quantize,
    Float8,
    Float8AllGather,
)
from memcalc.errors import InputError

EXIT_DOES_NOT_FIT = 1
"""``--check``: the exit status of an estimate that is at risk or out of memory (2 stays a usage error)."""


@app.command(
    cls=Command,
    epilog="Example: memcalc estimate --params 175e9 --stage 3 --gpus 128",
)
def estimate(
    ctx: typer.Context,
    params: Params = None,
    gpus: Gpus = 1,
    stage: Annotated[str | None, typer.Option("--stage", "-s", help="DeepSpeed ZeRO stage 0-3 (0 is DDP).")] = None,
    fsdp: Annotated[str | None, typer.Option("--fsdp", help="FSDP sharding strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 (any case, or 1-5).")] = None,
    ddp: Annotated[bool, typer.Option("--ddp", help="Plain PyTorch DDP (the default when no strategy is given).")] = False,
    strategy: Annotated[str | None, typer.Option("--strategy", help="A strategy by name with modifiers, e.g. zero-3+opt-cpu+param-nvme.")] = None,
    offload_optimizer: Annotated[str, typer.Option("--offload-optimizer", help="none, cpu or nvme (DeepSpeed; nvme needs stage 3).")] = "none",
    offload_params: Annotated[str, typer.Option("--offload-params", help="none, cpu or nvme (ZeRO-3; FSDP: cpu).")] = "none",
    shard_group: ShardGroup = None,
    gpus_per_node: GpusPerNode = 8,
    gpu: Gpu = "a100-sxm-80gb",
    precision: PrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    grad_accum: GradAccum = None,
    cuda_context_gib: CudaContext = None,
    reserve_gib: Reserve = None,
    model: ModelOpt = None,
    hf_config: HfConfig = None,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    ffn: Ffn = None,
    vocab: Vocab = None,
    seq_len: SeqLen = None,
    micro_batch: MicroBatch = None,
    micro_batches: MicroBatches = None,
    recompute: Recompute = "none",
    compile: Compile = False,  # noqa: A002 (the flag's name)
    compile_loss: CompileLoss = None,
    attention: AttentionOpt = None,
    dropout: Dropout = None,
    device: Device = "cuda",
    loss: Loss = "standard",
    optimizer_impl: OptimizerImpl = None,
    tp: Tp = 1,
    pp: Pp = 1,
    cp: Cp = 1,
    ep: Ep = 1,
    sequence_parallel: Sp = False,
    virtual_stages: Vp = 1,
    framework: FrameworkOpt = None,
    shard_over: ShardOver = None,
    stage_layers: StageLayers = None,
    accounting: AccountingOpt = "auto",
    zero_init: ZeroInit = True,
    buffer_factor: BufferFactor = 1.5,
    largest_layer_params: LargestLayer = None,
    fsdp_version: FsdpVersion = None,
    fsdp_wrap: FsdpWrap = None,
    fsdp_auto_wrap: FsdpAutoWrap = None,
    backward_prefetch: BackwardPrefetch = None,
    bucket_view: BucketView = False,
    min_num_params: MinNumParams = None,
    max_reuse_distance: ReuseDistance = None,
    max_live_parameters: MaxLive = None,
    prefetch_bucket_size: PrefetchBucket = None,
    reduce_bucket_size: ReduceBucket = None,
    overlap_comm: OverlapComm = None,
    grad_reduce_dtype: GradReduceDtype = None,
    defer_embedding_wgrad: DeferWgrad = None,
    persistence_threshold: Persistence = None,
    sub_group_size: SubGroup = None,
    zero3_step: Zero3Step = "steady",
    units: Units = "gib",
    verbose: Verbose = False,
    json: Json = False,
    fmt: EstimateFormat = "table",
    timeline: Timeline = False,
    memory_snapshot: MemorySnapshot = None,
    check: Check = False,
    cluster: ClusterOpt = None,
    tokens: Tokens = None,
    price_per_gpu_hour: Price = None,
    intra_node_gbps: IntraGbps = None,
    network_gbits_per_gpu: NetGbits = None,
    intra_node_efficiency: IntraEff = None,
    network_efficiency: NetEff = None,
    pcie_gbps: PcieGbps = None,
    host_memory_gbps: HostGbps = None,
    deepspeed: DeepSpeedConfig = None,
    accelerate_config: AccelerateConfig = None,
    torchtitan_config: TorchtitanConfig = None,
    megatron_args: MegatronArgs = None,
    write_config: WriteConfig = None,
    force: Force = False,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    quantize: Quantize = "none",
    float8: Float8 = "none",
    float8_all_gather: Float8AllGather = False,
) -> None:
    """Memory per GPU and communication per step for one strategy."""

    def go() -> None:
        from memcalc.api import estimate as run

        for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--shard-group", shard_group),
                            ("--grad-accum", grad_accum), ("--micro-batches", micro_batches), ("--seq-len", seq_len),
                            ("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep),
                            ("--virtual-stages", virtual_stages)):  # fmt: skip
            positive(flag, value)
        u = units_arg(units)
        kwargs = dict(
            params=params, gpus=gpus, gpus_per_node=gpus_per_node, stage=stage, fsdp=fsdp, ddp=ddp,
            strategy=strategy, offload_optimizer=offload_optimizer.strip().lower(),
            offload_params=offload_params.strip().lower(), shard_group=shard_group, gpu=gpu, precision=precision,
            optimizer=optimizer, grad_accum=grad_accum, micro_batches=micro_batches, cuda_context_gib=cuda_context_gib,
            reserve_gib=reserve_gib, model=model, hf_config=hf_config, layers=layers, hidden=hidden, heads=heads,
            kv_heads=kv_heads, ffn=ffn, vocab=vocab, seq_len=seq_len, micro_batch=micro_batch_arg(micro_batch),
            recompute=recompute.strip().lower(), compile=compile, compile_loss=compile_loss,
            attention=attention and attention.strip().lower(), dropout=dropout,
            device=device.strip().lower(), loss=loss.strip().lower(), optimizer_impl=optimizer_impl and optimizer_impl.strip().lower(),
            tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=sequence_parallel,
            virtual_stages=virtual_stages, framework=framework, shard_over=shard_over, stage_layers=stage_layers,
            accounting=accounting.strip().lower(), zero_init=zero_init,
            buffer_factor=buffer_factor, largest_layer_params=largest_layer_params, fsdp_version=fsdp_version,
            fsdp_wrap=fsdp_wrap, fsdp_auto_wrap=fsdp_auto_wrap, backward_prefetch=backward_prefetch, bucket_view=bucket_view,
            min_num_params=min_num_params, max_reuse_distance=max_reuse_distance,
            max_live_parameters=max_live_parameters, prefetch_bucket_size=prefetch_bucket_size,
            reduce_bucket_size=reduce_bucket_size, overlap_comm=overlap_comm, grad_reduce_dtype=grad_reduce_dtype,
            defer_embedding_wgrad=defer_embedding_wgrad,
            persistence_threshold=persistence_threshold, sub_group_size=sub_group_size,
            zero3_step=zero3_step.strip().lower(),
            cluster=cluster, tokens=tokens, price_per_gpu_hour=price_per_gpu_hour, intra_node_gbps=intra_node_gbps,
            network_gbits_per_gpu=network_gbits_per_gpu, intra_node_efficiency=intra_node_efficiency,
            network_efficiency=network_efficiency, pcie_gbps=pcie_gbps, host_memory_gbps=host_memory_gbps,
            lora_rank=lora_rank, lora_targets=lora_targets, quantize=quantize.strip().lower(),
            float8=float8, float8_all_gather=float8_all_gather,
        )  # fmt: skip
        origin: dict[str, tuple[str, Any]] = {}
        said: list[str] = []
        assumed: list[str] = []
        arguments = with_config(ctx, kwargs, deepspeed, accelerate_config, torchtitan_config, megatron=megatron_args,
                                origin=origin, said=said, assumed=assumed)  # fmt: skip
        out = output_format(fmt, json, ("timeline-csv",))
        moments = timeline or out == "timeline-csv" or memory_snapshot is not None
        try:
            result = run(**arguments, timeline=moments)
        except InputError as e:
            raise blame(e, arguments, origin) from None
        if moments:
            _has_moments(result)
        assumed = [as_flags(a) for a in result.assumed] + assumed  # the estimate's own (the precision), the file's
        if assumed:  # shown in the output's header, where the answer is read (CSV has none: said with the notes)
            result = result.model_copy(update={"assumed": assumed})
            said += [f"memcalc: assumed: {a}\n" for a in assumed] if out == "csv" else []
        write_files(result, write_config, force)
        sys.stderr.writelines(said)  # the file's notes, once the estimate stands (an error prints its line alone)
        if memory_snapshot is not None:
            from memcalc.report.snapshot import write_snapshot

            sys.stderr.write(f"wrote {write_snapshot(result, memory_snapshot)}\n")
        if out == "timeline-csv":
            from memcalc.report.timeline import timeline_csv

            sys.stdout.write(timeline_csv(result))
        else:
            show(result, out, u, verbose)
        if check and result.memory.fit.verdict != "fits":
            raise typer.Exit(EXIT_DOES_NOT_FIT)

    run_or_fail(go)


def _has_moments(result: Any) -> None:
    """Nothing where ``result`` has the moments of its step, else one line saying why it has none (exit 2)."""
    from memcalc.report.timeline import why_no_timeline

    why = why_no_timeline(result)
    if why is not None:
        raise InputError(why)


@app.command(
    cls=Command,
    epilog="Example: memcalc compare --params 7e9 --gpus 64 --strategies zero-2,zero-3,FULL_SHARD+param-cpu",
)
def compare(
    params: Params = None,
    gpus: Gpus = 1,
    strategies: Annotated[str | None, typer.Option("--strategies", help="Comma-separated strategies (default: all); modifiers +opt-cpu, +param-nvme, +offload.")] = None,
    shard_group: ShardGroup = None,
    gpus_per_node: GpusPerNode = 8,
    gpu: Gpu = "a100-sxm-80gb",
    precision: PrecisionOpt = None,
    optimizer: OptimizerOpt = "adamw",
    grad_accum: GradAccum = None,
    cuda_context_gib: CudaContext = None,
    reserve_gib: Reserve = None,
    model: ModelOpt = None,
    hf_config: HfConfig = None,
    seq_len: SeqLen = None,
    micro_batch: MicroBatch = None,
    recompute: Recompute = "none",
    compile: Compile = False,  # noqa: A002 (the flag's name)
    attention: AttentionOpt = None,
    tp: Tp = 1,
    pp: Pp = 1,
    cp: Cp = 1,
    sequence_parallel: Sp = False,
    framework: FrameworkOpt = None,
    shard_over: ShardOver = None,
    stage_layers: StageLayers = None,
    cluster: ClusterOpt = None,
    tokens: Tokens = None,
    price_per_gpu_hour: Price = None,
    network_gbits_per_gpu: NetGbits = None,
    units: Units = "gib",
    verbose: Verbose = False,
    json: Json = False,
    fmt: Format = "table",
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    quantize: Quantize = "none",
    float8: Float8 = "none",
    float8_all_gather: Float8AllGather = False,
) -> None:
    """Every strategy side by side: memory parts, total, fit, host RAM, communication and step time (ranked)."""

    def go() -> None:
        from memcalc.api import compare as run

        for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--shard-group", shard_group),
                            ("--grad-accum", grad_accum), ("--seq-len", seq_len), ("--tp", tp), ("--pp", pp), ("--cp", cp)):  # fmt: skip
            positive(flag, value)
        u = units_arg(units)
        mb = micro_batch_arg(micro_batch)
        chosen = None if strategies is None else [s for s in strategies.split(",") if s.strip()]
        result = run(
            params=params, gpus=gpus, gpus_per_node=gpus_per_node, strategies=chosen, shard_group=shard_group,
            gpu=gpu, precision=precision, optimizer=optimizer, grad_accum=grad_accum,
            cuda_context_gib=cuda_context_gib, reserve_gib=reserve_gib, model=model, hf_config=hf_config,
            seq_len=seq_len, micro_batch=mb, recompute=recompute.strip().lower(), compile=compile,
            attention=attention and attention.strip().lower(),
            tp=tp, pp=pp, cp=cp, sequence_parallel=sequence_parallel, framework=framework, shard_over=shard_over,
            stage_layers=stage_layers, cluster=cluster, tokens=tokens,
            price_per_gpu_hour=price_per_gpu_hour, network_gbits_per_gpu=network_gbits_per_gpu,
            lora_rank=lora_rank, lora_targets=lora_targets, quantize=quantize.strip().lower(),
            float8=float8, float8_all_gather=float8_all_gather,
        )  # fmt: skip
        show(result, output_format(fmt, json), u, verbose)

    run_or_fail(go)
