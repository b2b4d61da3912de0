"""Commands beside the estimate: ``validate`` (real runs on this machine), ``collectives`` (one message on every
primitive), ``trace`` (one real step on fake tensors) and ``plot`` (pictures of per-GPU memory)."""

from __future__ import annotations

import gc
import sys
from typing import Annotated

import typer

from memcalc.cli.app import Command, app, console, fail, output_format, run_or_fail, show_rows
from memcalc.cli.options import (AttentionOpt, Cp, Format, FrameworkOpt, FsdpVersion, Gpu, Gpus, GradAccum, HfConfig, Json,
                                 ModelOpt, Params, Pp, PrecisionOpt, SeqLen, ShardGroup, Sp, Tp, Units, Vp)
from memcalc.errors import InputError


@app.command(cls=Command, epilog="Example: memcalc validate --suite quick")
def validate(
    suite: Annotated[str, typer.Option("--suite", help="quick (3 configurations) or full (every framework and strategy; DeepSpeed when installed).")] = "quick",
) -> None:
    """Measure real DDP/FSDP training steps on this machine and print them beside memcalc's estimate."""
    gc.enable()  # real training steps: PyTorch's objects are freed as in any training script (memcalc.cli.main)
    try:
        import torch
    except ImportError:
        raise fail("memcalc validate needs torch: pip install torch==2.13.0 '.[validate]' (from this checkout)") from None
    if suite not in ("quick", "full"):
        raise fail(f"--suite {suite!r} is not accepted; accepted: quick, full")
    from rich.progress import Progress
    from rich.table import Table
    from rich.text import Text

    from memcalc.validation.suite import QUICK, compare, full

    configs = QUICK if suite == "quick" else full()
    rows = []
    out = console()
    with Progress(console=out, transient=True) as progress:
        task = progress.add_task("measuring", total=len(configs))
        for c in configs:
            progress.update(task, description=f"measuring {c.name} ({c.world} processes, gloo)")
            rows += compare(c)
            progress.advance(task)
    t = Table(title="Predicted (--accounting implementation) vs measured after one step (-stepN: the Nth), rank 0, bytes",
              title_justify="left")  # fmt: skip
    for col in ("configuration", "quantity", "predicted", "measured", ""):
        t.add_column(col, justify="right" if col in ("predicted", "measured") else "left")
    for r in rows:
        t.add_row(r.config, r.quantity, f"{r.predicted:,}", f"{r.measured:,}",
                  Text("=", style="green") if r.match else Text("≠", style="red"))  # fmt: skip
    out.print(t)
    if torch.cuda.is_available():  # the realistic accounting's peak (what estimate answers with) on this GPU
        from memcalc.validation.suite import transformers_available

        if transformers_available():
            from memcalc.validation.cuda import peak_vs_estimate

            out.print(peak_vs_estimate().line())
        else:
            out.print("CUDA peak not measured: the check trains a Hugging Face Llama; pip install '.[hf]'")
    bad = sum(not r.match for r in rows)
    out.print(f"{len(rows) - bad} of {len(rows)} figures match exactly")
    if bad:
        raise typer.Exit(1)


@app.command(cls=Command, epilog="Example: memcalc collectives --size 1GiB --group 8 --gpu h100")
def collectives(
    size: Annotated[str, typer.Option("--size", help="Message size S (nccl-tests' S): 1GiB, 512MiB, 64KB, 1e9 bytes.")] = "1GiB",
    group: Annotated[int, typer.Option("--group", help="Ranks in the collective.")] = 8,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset: times it on the first cluster built from it (h100 -> dgx-h100). Default: a100-sxm-80gb, as estimate's.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster preset: dgx-a100, dgx-h100, hgx-h200, p4d-a100, p5-h100, or a .toml path.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", help="GPUs per node (default: the cluster's).")] = None,
    across_nodes: Annotated[bool, typer.Option("--across-nodes", help="One rank per node (a data-parallel group under tensor parallelism).")] = False,
    json: Json = False,
    fmt: Format = "table",
) -> None:
    """Every collective primitive on one message: bytes per rank, algorithm, time and nccl-tests bus bandwidth."""

    def go() -> None:
        from memcalc.report.collectives import collectives as run
        from memcalc.report.collectives import collectives_table

        out = output_format(fmt, json)
        result = run(size, group, gpu=gpu, cluster=cluster, gpus_per_node=gpus_per_node, across_nodes=across_nodes)
        if out == "json":
            sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        elif out in ("csv", "markdown"):
            rows = [p.model_dump() for p in result.primitives]
            show_rows("", rows, out)
        else:
            console().print(collectives_table(result))

    run_or_fail(go)


@app.command(cls=Command, epilog="Examples: memcalc schema estimate; memcalc schema input > input.schema.json")
def schema(
    which: Annotated[str, typer.Argument(help="estimate (estimate --json), compare (compare --json), plan (plan --json) "
                                              "or input (EstimateInput, what an estimate is computed from).")] = "estimate",
) -> None:
    """The JSON schema of a result or of the input: every field, its type, bounds and description."""

    def go() -> None:
        from memcalc.report.schema import schema_text

        sys.stdout.write(schema_text(which) + "\n")

    run_or_fail(go)


def _auto_wrap(given: str) -> bool:
    """--fsdp-auto-wrap transformer (True: a unit per decoder layer) or none (False), or one line."""
    name = given.strip().lower()
    if name not in ("transformer", "none"):
        raise InputError(f"--fsdp-auto-wrap {given!r} is not accepted; accepted: transformer, none")
    return name == "transformer"


@app.command(cls=Command, epilog="Example: memcalc trace --hf-config config.json --seq-len 2048 --precision amp-bf16")
def trace(
    hf_config: Annotated[str, typer.Option("--hf-config", help="A Hugging Face config.json, or a Hub id (org/name[@revision]) (the model is built from it, no weights).")],
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")],
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1,
    precision: Annotated[str, typer.Option("--precision", help="fp32, bf16 (pure) or amp-bf16 (fp32 weights under autocast).")] = "amp-bf16",
    optimizer_impl: Annotated[str, typer.Option("--optimizer-impl", help="foreach, fused or for-loop (torch.optim.AdamW).")] = "foreach",
    recompute: Annotated[str, typer.Option("--recompute", help="none or full (per decoder layer).")] = "none",
    attention: Annotated[str, typer.Option("--attention", help="sdpa or eager.")] = "sdpa",
    world: Annotated[int, typer.Option("--world", help="Ranks; rank 0 is traced with torch's fake process group.")] = 1,
    fsdp: Annotated[bool, typer.Option("--fsdp", help="FSDP2 fully_shard per decoder layer and the root.")] = False,
    tp: Annotated[int, typer.Option("--tp", help="DTensor tensor-parallel degree.")] = 1,
    fsdp_param_dtype: Annotated[str | None, typer.Option("--fsdp-param-dtype", help="bf16: FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16) over fp32 shards (use with --precision fp32).")] = None,
    fsdp_wrap: Annotated[str, typer.Option("--fsdp-wrap", help="With --fsdp: root (embedding, final norm and head in the root), separate (torchtitan's units) or separate-reshard (torchtune's).")] = "root",
    replicate: Annotated[int, typer.Option("--replicate", help="With --fsdp: HSDP, the data-parallel ranks in this many replicas of the shards.")] = 1,
    reshard_after_forward: Annotated[bool, typer.Option("--reshard-after-forward/--no-reshard-after-forward", help="With --fsdp: --no-reshard-after-forward keeps each layer gathered from its forward to its backward (SHARD_GRAD_OP).")] = True,
    fsdp_reduce_fp32: Annotated[bool, typer.Option("--fsdp-reduce-fp32", help="With --fsdp-param-dtype bf16: reduce gradients in fp32 (torchtitan).")] = False,
    fsdp_version: Annotated[int, typer.Option("--fsdp-version", help="With --fsdp: 2 (fully_shard) or 1 (FullyShardedDataParallel, as accelerate wraps a transformer).")] = 2,
    fsdp_auto_wrap: Annotated[str, typer.Option("--fsdp-auto-wrap", help="With --fsdp: transformer (a unit per decoder layer) or none (accelerate's NO_WRAP: FSDP1 one unit over the model; FSDP2 the layers in the root, the embedding and the head carved as accelerate 1.15 does, which needs --fsdp-wrap separate or, tied, root).")] = "transformer",
    gpu: Annotated[str | None, typer.Option("--gpu", help="A GPU preset or .toml: replay the steps' allocations into its memory (less the CUDA context) and say whether a request fails.")] = None,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages: trace one pipeline rank (--pp-rank) under torch's PipelineStage and schedule, FSDP2 inside the stage over --world / (pp x tp) ranks (torchtitan's composition; with --tp, its sequence-parallel plan). --world defaults to pp x tp.")] = 1,
    pp_rank: Annotated[int, typer.Option("--pp-rank", help="With --pp: the pipeline rank traced, 0 to pp - 1.")] = 0,
    grad_accum: Annotated[int | None, typer.Option("--grad-accum", help="With --pp: micro-batches per step (default: pp, torchtitan's default).")] = None,
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="With --pp: model chunks per rank; above 1 runs ScheduleInterleaved1F1B.")] = 1,
) -> None:
    """Run one real training step of the model's code on fake tensors (CPU, no GPU, no weights) and print its
    live bytes: the peak, where it happens, each phase's peak, and the caching allocator's reserved peak when the
    steps' allocations are replayed through it (needs torch and transformers)."""
    gc.enable()  # a real training step: PyTorch's objects are freed as in any training script (memcalc.cli.main)

    def go() -> None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            raise InputError("memcalc trace needs torch and transformers: pip install torch==2.13.0 "
                             "'.[validate,hf]' (from this checkout)") from None
        import json as js

        from memcalc.model.hf_config import read_config
        from memcalc.validation.trace import trace_step, trace_summary

        capacity = None
        if gpu is not None:
            from memcalc.inputs.presets import load_gpu
            from memcalc.memory.allocator.allocator import CONTEXT_HIGH

            capacity = load_gpu(gpu).usable_memory_bytes - CONTEXT_HIGH
        from memcalc.api import resolve_architecture

        resolve_architecture(hf_config=hf_config)  # the checks estimate runs: a bad value is one line, not a traceback
        cfg = js.loads(read_config(hf_config).decode("utf-8-sig"))
        if pp != 1 or pp_rank != 0 or grad_accum is not None or virtual_stages != 1:
            t = _trace_pipeline(cfg, capacity)
            sys.stdout.write(js.dumps(trace_summary(t), indent=2) + "\n")
            return
        t = trace_step(cfg, seq_len=seq_len, micro_batch=micro_batch, precision=precision,
                       optimizer_impl=optimizer_impl, recompute=recompute, attention=attention, world=world,
                       fsdp=fsdp, tp=tp, fsdp_param_dtype=fsdp_param_dtype, capacity=capacity,
                       fsdp_wrap=fsdp_wrap.strip().lower(), replicate=replicate,
                       reshard_after_forward=reshard_after_forward, fsdp_reduce_fp32=fsdp_reduce_fp32,
                       fsdp_version=fsdp_version, layer_units=_auto_wrap(fsdp_auto_wrap))
        summary = trace_summary(t)
        sys.stdout.write(js.dumps(summary, indent=2) + "\n")

    def _trace_pipeline(cfg: dict, capacity: int | None):
        from memcalc.validation.trace_pipeline import trace_pipeline_rank
        from memcalc.validation.trace_step import StepSpec

        if pp < 2:
            raise InputError(f"--pp {pp} traces no pipeline; give --pp 2 or more (--pp-rank, --grad-accum and "
                             "--virtual-stages go with it)")
        if not 0 <= pp_rank < pp:
            raise InputError(f"--pp-rank {pp_rank} is not a rank of --pp {pp}; give 0 to {pp - 1}")
        ranks = pp * tp if world == 1 else world  # one rank per stage and tensor-parallel shard unless told more
        if tp < 1 or ranks % (pp * tp):
            raise InputError(f"--world {ranks} is not a multiple of --pp {pp} x --tp {tp}; give a multiple of "
                             f"{pp * max(tp, 1)}")
        dp = ranks // (pp * tp)
        n = pp if grad_accum is None else grad_accum
        if n < 1:
            raise InputError(f"--grad-accum {n} is below 1; give the micro-batches per step, 1 or more")
        if virtual_stages < 1:
            raise InputError(f"--virtual-stages {virtual_stages} is below 1; give 1 (1F1B) or more (interleaved)")
        if virtual_stages > 1 and n % pp:
            raise InputError(f"the interleaved schedule (--virtual-stages {virtual_stages}) needs --grad-accum "
                             f"divisible by --pp {pp}; give a multiple of {pp}")
        if precision == "amp-bf16":
            raise InputError("--precision amp-bf16 is not traced under --pp (torchtitan's stages run FSDP2's policy): "
                             "give bf16, or fp32 with --fsdp-param-dtype bf16")
        if dp > 1 and not fsdp:
            raise InputError(f"--pp with {dp} data-parallel ranks (--world / (pp x tp)) traces FSDP2 over them: add "
                             "--fsdp, or give --world pp x tp")
        if fsdp and dp == 1:
            raise InputError(f"--fsdp under --pp shards over the data-parallel ranks and --world {ranks} leaves none "
                             f"(pp x tp = {pp * tp}): give --world a multiple of {2 * pp * tp}, or leave --fsdp out")
        unsupported = [(fsdp_version != 2, f"--fsdp-version {fsdp_version}"), (replicate != 1, f"--replicate {replicate}"),
                       (fsdp_wrap.strip().lower() != "root", f"--fsdp-wrap {fsdp_wrap}"),
                       (_auto_wrap(fsdp_auto_wrap) is False, "--fsdp-auto-wrap none"),
                       (capacity is not None, "--gpu")]  # fmt: skip
        for bad, flag in unsupported:
            if bad:
                raise InputError(f"{flag} is not traced under --pp (FSDP2 on each layer and the stage, kept gathered "
                                 "all step, as torchtitan composes them); leave it out")
        layers = int(cfg.get("num_hidden_layers") or 0)
        if layers < pp * virtual_stages:
            raise InputError(f"--pp {pp} x --virtual-stages {virtual_stages} stages need at least as many decoder "
                             f"layers; the model has {layers}")
        spec = StepSpec(seq_len, micro_batch, precision, optimizer_impl, recompute, attention)
        t = trace_pipeline_rank(cfg, spec, pp=pp, dp=dp, rank=pp_rank, micro_batches=n, virtual=virtual_stages,
                                fsdp_param_dtype=fsdp_param_dtype, reduce_fp32=fsdp_reduce_fp32, tp=tp)
        label = f"pipeline rank {pp_rank} of {pp}, {n} micro-batches" + (f", dp {dp}" if dp > 1 else "")
        return t.result(label + (f", tp {tp} sp" if tp > 1 else ""), t.seconds)

    run_or_fail(go)


@app.command(cls=Command, epilog="Examples: memcalc plot memory --model llama-2-7b --gpus 8 --out memory.png; memcalc plot "
                                  "timeline --model llama-3-8b --fsdp FULL_SHARD --fsdp-version 2 --gpus 8 --seq-len 4096 "
                                  "--out timeline.png")
def plot(
    kind: Annotated[str, typer.Argument(help="memory (per-GPU memory by part, per strategy), scaling (per-GPU memory vs GPU count), time (a step's seconds by part, per strategy) or timeline (one strategy's step moment by moment, stacked by kind: realistic accounting).")],
    out: Annotated[str, typer.Option("--out", "-o", help="The picture to write: .png or .svg.")],
    params: Params = None,
    model: ModelOpt = None,
    hf_config: HfConfig = None,
    gpus: Gpus = 8,
    gpu: Gpu = "a100-sxm-80gb",
    strategies: Annotated[str | None, typer.Option("--strategies", help="Comma-separated strategies (default: memory: all; scaling: ddp, zero-1, zero-2, zero-3).")] = None,
    gpu_counts: Annotated[str, typer.Option("--gpu-counts", help="scaling: comma-separated GPU counts.")] = "8,16,32,64,128,256",
    seq_len: SeqLen = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="Sequences per micro-batch (with --seq-len).")] = None,
    units: Units = "gib",
    stage: Annotated[str | None, typer.Option("--stage", "-s", help="timeline: DeepSpeed ZeRO stage 0-3.")] = None,
    fsdp: Annotated[str | None, typer.Option("--fsdp", help="timeline: FSDP sharding strategy (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, ...).")] = None,
    ddp: Annotated[bool, typer.Option("--ddp", help="timeline: plain PyTorch DDP (the default when no strategy is given).")] = False,
    strategy: Annotated[str | None, typer.Option("--strategy", help="timeline: a strategy by name with modifiers, e.g. zero-3+opt-cpu.")] = None,
    fsdp_version: FsdpVersion = None,
    precision: Annotated[str | None, PrecisionOpt.__metadata__[0]] = None,
    recompute: Annotated[str | None, typer.Option("--recompute", help="Activation recomputation: none, selective, full, every:K, op-sac.")] = None,
    attention: AttentionOpt = None,
    framework: FrameworkOpt = None,
    tp: Annotated[int | None, Tp.__metadata__[0]] = None,
    pp: Annotated[int | None, Pp.__metadata__[0]] = None,
    cp: Annotated[int | None, Cp.__metadata__[0]] = None,
    sequence_parallel: Sp = False,
    virtual_stages: Annotated[int | None, Vp.__metadata__[0]] = None,
    grad_accum: GradAccum = None,
    shard_group: ShardGroup = None,
) -> None:
    """Draw per-GPU memory (stacked by part, per strategy), how it scales with the GPU count, a step's time by
    part, or one strategy's step moment by moment (needs matplotlib)."""

    def go() -> None:
        from memcalc.cli.app import units_arg

        u = units_arg(units)
        chosen = None if strategies is None else [s.strip() for s in strategies.split(",") if s.strip()]
        shape = {k: v for k, v in (("params", params), ("model", model), ("hf_config", hf_config), ("gpu", gpu),
                                   ("seq_len", seq_len), ("micro_batch", micro_batch), ("precision", precision),
                                   ("recompute", recompute), ("attention", attention), ("framework", framework),
                                   ("tp", tp), ("pp", pp), ("cp", cp), ("sequence_parallel", sequence_parallel or None),
                                   ("grad_accum", grad_accum), ("shard_group", shard_group))
                 if v is not None}  # fmt: skip
        one = {k: v for k, v in (("stage", stage), ("fsdp", fsdp), ("ddp", ddp or None), ("strategy", strategy),
                                 ("fsdp_version", fsdp_version), ("virtual_stages", virtual_stages)) if v is not None}
        from memcalc.report import plot as p

        if kind == "timeline":
            fig = _timeline(chosen, shape | one, gpus, u)
        elif one:
            flags = ", ".join("--" + k.replace("_", "-") for k in one)
            raise InputError(f"{flags}: one strategy's flags, for plot timeline; plot {kind} takes --strategies")
        elif kind in ("memory", "time"):
            import memcalc

            cmp = memcalc.compare(gpus=gpus, strategies=chosen, **shape)
            fig = p.plot_memory(cmp, unit=u) if kind == "memory" else p.plot_time(cmp)
        elif kind == "scaling":
            try:
                counts = [int(x) for x in gpu_counts.split(",") if x.strip()]
            except ValueError:
                raise InputError(f"--gpu-counts {gpu_counts!r} is not a list of whole numbers; give e.g. 8,16,32") from None
            extra = {"strategies": chosen} if chosen else {}
            fig = p.plot_scaling(gpus=counts, unit=u, **extra, **shape)
        else:
            raise InputError(f"plot {kind!r} is not a plot; accepted: memory, scaling, time, timeline")
        written = p.save(fig, out)
        sys.stdout.write(f"wrote {written}\n")

    run_or_fail(go)


def _timeline(chosen: list[str] | None, flags: dict, gpus: int, unit: str):
    """The timeline figure of one strategy's estimate, or one line saying why there is none."""
    import memcalc
    from memcalc.report.plot_timeline import plot_timeline

    if chosen:
        raise InputError("plot timeline draws one strategy: give --stage, --fsdp, --ddp or --strategy, not --strategies")
    return plot_timeline(memcalc.estimate(gpus=gpus, timeline=True, **flags), unit=unit)
