"""``memcalc plan``: the fastest (or cheapest, or smallest) plans that fit one job, searched.

No ``from __future__ import annotations`` here: typer reads every option's annotation on each run.
"""

import sys
from typing import Annotated, Any

import typer

from memcalc.cli.app import Command, app, output_format, run_or_fail, units_arg
from memcalc.cli.options import (
    AttentionOpt,
    Compile,
    Float8,
    Float8AllGather,
    GradReduceDtype,
    Ffn,
    GpusPerNode,
    Heads,
    HfConfig,
    Hidden,
    KvHeads,
    Layers,
    LoraRank,
    LoraTargets,
    ModelOpt,
    OptimizerOpt,
    Quantize,
    SeqLen,
    Units,
    Vocab,
    WriteConfig,
    Force,
)

@app.command(
    cls=Command,
    epilog="Example: memcalc plan --model llama-3-70b --gpus 64 --gpu h100 --seq-len 8192 --global-batch 128",
)
def plan(
    model: ModelOpt = None,
    hf_config: HfConfig = None,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    ffn: Ffn = None,
    vocab: Vocab = None,
    seq_len: SeqLen = None,
    global_batch: Annotated[int | None, typer.Option("--global-batch", help="Sequences per optimizer step (micro-batch x accumulation x data-parallel size).")] = None,
    global_batch_tokens: Annotated[str | None, typer.Option("--global-batch-tokens", help="The global batch in tokens instead (1M: 2^20 where that makes whole sequences).")] = None,
    gpus: Annotated[str, typer.Option("--gpus", "-n", help="GPUs: one count (64), a list (64,128,256) or a range of powers of two (32..512).")] = "8",
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset, alias or .toml path, or a comma-separated list (h100,b200). Default: estimate's.")] = None,
    gpus_per_node: GpusPerNode = 8,
    framework: Annotated[str, typer.Option("--framework", help="torchtitan, megatron, deepspeed, hf, a list of them, or any (all four).")] = "any",
    objective: Annotated[str, typer.Option("--objective", help="time (shortest step), cost (lowest cost to train: needs --tokens and --price) or memory (least per GPU).")] = "time",
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to train on (2e12, 15T): adds days and cost to train.")] = None,
    price: Annotated[str | None, typer.Option("--price", help="Price per GPU-hour: one number, or per GPU (h100=2.5,b200=5.0).")] = None,
    top: Annotated[int, typer.Option("--top", help="Plans to list.")] = 10,
    tp: Annotated[int | None, typer.Option("--tp", help="Hold the tensor-parallel degree fixed.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Hold the pipeline stages fixed.")] = None,
    cp: Annotated[int | None, typer.Option("--cp", help="Hold the context-parallel degree fixed.")] = None,
    ep: Annotated[int | None, typer.Option("--ep", help="Hold the expert-parallel degree fixed.")] = None,
    virtual_stages: Annotated[int | None, typer.Option("--virtual-stages", help="Hold the model chunks per pipeline rank fixed.")] = None,
    sequence_parallel: Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Hold sequence parallelism on or off (default: as the framework runs TP).", show_default=False)] = None,
    recompute: Annotated[str | None, typer.Option("--recompute", help="Hold the recompute policy fixed (none, selective, op-sac, full, every:K).")] = None,
    stage: Annotated[str | None, typer.Option("--stage", "-s", help="Hold a DeepSpeed ZeRO stage (0-3; Megatron: 1 is the distributed optimizer).")] = None,
    fsdp: Annotated[str | None, typer.Option("--fsdp", help="Hold an FSDP sharding strategy (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, ...).")] = None,
    fsdp_version: Annotated[int | None, typer.Option("--fsdp-version", help="With --fsdp: 1 or 2.")] = None,
    ddp: Annotated[bool, typer.Option("--ddp", help="Hold plain DDP.")] = False,
    strategy: Annotated[str | None, typer.Option("--strategy", help="Hold a strategy by name with modifiers (zero-3+opt-cpu).")] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="Hold the micro-batch fixed.")] = None,
    grad_accum: Annotated[int | None, typer.Option("--grad-accum", help="Hold the accumulation steps fixed.")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="Training precision (default: each framework's own: amp-bf16 for hf, bf16-mixed for the others).")] = None,
    optimizer: OptimizerOpt = "adamw",
    attention: AttentionOpt = None,
    compile: Compile = False,  # noqa: A002 (the flag's name)
    float8: Float8 = "none",
    float8_all_gather: Float8AllGather = False,
    grad_reduce_dtype: GradReduceDtype = None,
    lora_rank: LoraRank = None,
    lora_targets: LoraTargets = None,
    quantize: Quantize = "none",
    units: Units = "gib",
    write_config: WriteConfig = None,
    force: Force = False,
    json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (integer bytes).")] = False,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table (default) or json.")] = "table",
) -> None:
    """The fastest (or cheapest, or smallest) plans that fit: layouts, strategies, recompute and batch splits searched."""

    def go() -> None:
        from memcalc.planner import plan as run

        u = units_arg(units)
        f = output_format(fmt, json)
        if f not in ("table", "json"):
            from memcalc.errors import InputError

            raise InputError(f"memcalc plan prints table or json; --format {fmt} is not accepted")
        held: dict[str, Any] = dict(
            tp=tp, pp=pp, cp=cp, ep=ep, virtual_stages=virtual_stages, sequence_parallel=sequence_parallel,
            recompute=recompute and recompute.strip().lower(), stage=stage, fsdp=fsdp, fsdp_version=fsdp_version,
            ddp=ddp or None, strategy=strategy, micro_batch=micro_batch, grad_accum=grad_accum, precision=precision,
            optimizer=None if optimizer == "adamw" else optimizer, attention=attention and attention.strip().lower(),
            compile=compile or None, float8=None if float8 == "none" else float8,
            float8_all_gather=float8_all_gather or None, grad_reduce_dtype=grad_reduce_dtype,
            lora_rank=lora_rank, lora_targets=lora_targets,
            quantize=None if quantize.strip().lower() == "none" else quantize.strip().lower(),
        )  # fmt: skip
        result = run(model=model, hf_config=hf_config, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                     ffn=ffn, vocab=vocab, seq_len=seq_len, global_batch=global_batch,
                     global_batch_tokens=global_batch_tokens, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node,
                     framework=framework, objective=objective.strip().lower(), tokens=tokens, price=price, top=top,
                     **{k: v for k, v in held.items() if v is not None})  # fmt: skip
        from memcalc.cli.configs import write_files

        write_files(result, write_config, force)
        if f == "json":
            sys.stdout.write(result.model_dump_json(indent=2) + "\n")
            return
        from memcalc.cli.app import console
        from memcalc.report.plan_render import render_plan

        console().print(render_plan(result, u))

    run_or_fail(go)
