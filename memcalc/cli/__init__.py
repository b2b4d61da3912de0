"""The ``memcalc`` command: one more client of ``memcalc.api``.

Commands declare their options and call one function. A user's mistake ends in one line on stderr
and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.29 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer depends on click
    from click.exceptions import ClickException  # type: ignore[no-redef]

from memcalc.errors import InputError

EXIT_USAGE = 2


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; the caller raises the returned Exit(2)."""
    sys.stderr.write(f"memcalc: error: {message}\n")
    return typer.Exit(EXIT_USAGE)


def _one_line(exc: BaseException) -> str:
    """The user-facing message of an input error, on one line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic.ValidationError
        first = errors()[0]
        msg = str(first.get("msg", exc)).removeprefix("Value error, ")
        loc = ".".join(str(x) for x in first.get("loc", ()))
        if not isinstance(first.get("ctx", {}).get("error"), InputError) and loc:
            msg = f"{loc}: {msg} (got {first.get('input')!r})"
        return " ".join(msg.split())
    return " ".join(str(exc).split())


class Command(TyperCommand):
    """A command whose --help option is coerced plainly too (it is made on demand, after ``install``)."""

    def get_help_option(self, ctx: Any) -> Any:
        from memcalc.cli.coerce import plain

        return plain(super().get_help_option(ctx))


class OneLineErrors(TyperGroup):
    """Usage errors (unknown option, missing value) as one line and exit code 2."""

    def get_help_option(self, ctx: Any) -> Any:
        from memcalc.cli.coerce import plain

        return plain(super().get_help_option(ctx))

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        from memcalc.cli.coerce import install

        install(self)  # plain coercion for plain options: parsing flags builds no pydantic schema
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except ClickException as e:
            sys.stderr.write(f"memcalc: error: {' '.join(e.format_message().split())}\n")
            if standalone_mode:
                sys.exit(EXIT_USAGE)
            raise
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


app = typer.Typer(
    cls=OneLineErrors,
    name="memcalc",
    help="Per-GPU memory and per-step communication of DeepSpeed ZeRO, PyTorch FSDP and DDP training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# --- options shared by estimate and compare -------------------------------------------------------
Params = Annotated[str | None, typer.Option("--params", "-p", help="Parameter count: 175e9, 175B, 7b, 1.3e9, 350M (or give --model).")]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model preset (llama-2-7b, gpt3-175b; see `memcalc models`) or a .toml path.")]
HfConfig = Annotated[str | None, typer.Option("--hf-config", help="A Hugging Face config.json (llama, mistral, mixtral, qwen2, gpt2, gpt_neox, bloom, opt, falcon).")]
Layers = Annotated[int | None, typer.Option("--layers", help="Decoder layers (overrides the preset).")]
Hidden = Annotated[int | None, typer.Option("--hidden", help="Hidden size.")]
Heads = Annotated[int | None, typer.Option("--heads", help="Attention heads.")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", help="Key/value heads (GQA).")]
Ffn = Annotated[int | None, typer.Option("--ffn", help="MLP inner size.")]
Vocab = Annotated[int | None, typer.Option("--vocab", help="Vocabulary size.")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", help="Sequence length: counts activations (needs the model's shape).")]
MicroBatch = Annotated[str | None, typer.Option("--micro-batch", help="Sequences per micro-batch, or auto: the largest that fits.")]
Recompute = Annotated[str, typer.Option("--recompute", help="Activation recomputation: none, selective, full.")]
AttentionOpt = Annotated[str, typer.Option("--attention", help="eager (keeps a·s² scores, as the paper), flash, or sdpa.")]
Dropout = Annotated[float | None, typer.Option("--dropout", help="Dropout probability (default: the preset's or config's, else 0).")]
Device = Annotated[str, typer.Option("--device", help="cuda (1-byte dropout masks) or cpu (masks in the activation dtype).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline stages.")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")]
Sp = Annotated[bool, typer.Option("--sequence-parallel", help="Megatron sequence parallelism (with --tp).")]
Vp = Annotated[int, typer.Option("--virtual-stages", help="Model chunks per pipeline rank (interleaved 1F1B).")]
AccountingOpt = Annotated[str, typer.Option("--accounting", help="paper (ZeRO §5, Korthikanti), implementation (what DDP/FSDP really allocate and send) or deepspeed-estimator (DeepSpeed's own functions).")]
FsdpVersion = Annotated[int, typer.Option("--fsdp-version", help="implementation accounting: 1 (FullyShardedDataParallel) or 2 (fully_shard).")]
MinNumParams = Annotated[str | None, typer.Option("--min-num-params", help="implementation accounting, FSDP: size_based_auto_wrap_policy threshold (default: one unit per decoder layer).")]
ReuseDistance = Annotated[str | None, typer.Option("--max-reuse-distance", help="implementation accounting, ZeRO-3: stage3_max_reuse_distance in elements (default 1e9).")]
MaxLive = Annotated[str | None, typer.Option("--max-live-parameters", help="implementation accounting, ZeRO-3: stage3_max_live_parameters in elements (default 1e9).")]
PrefetchBucket = Annotated[str | None, typer.Option("--prefetch-bucket-size", help="implementation accounting, ZeRO-3: stage3_prefetch_bucket_size in elements (default 5e7).")]
Persistence = Annotated[str | None, typer.Option("--persistence-threshold", help="implementation accounting, ZeRO-3: stage3_param_persistence_threshold in elements (default 1e5).")]
Zero3Step = Annotated[str, typer.Option("--zero3-step", help="implementation accounting, ZeRO-3: steady (every step after the first; default) or first (DeepSpeed records its trace and gathers every parameter on each use).")]
BucketView = Annotated[bool, typer.Option("--bucket-view", help="implementation accounting, DDP: gradient_as_bucket_view=True.")]
ZeroInit = Annotated[bool, typer.Option("--zero-init/--no-zero-init", help="deepspeed-estimator, ZeRO-3: built under deepspeed.zero.Init.")]
BufferFactor = Annotated[float, typer.Option("--buffer-factor", help="deepspeed-estimator: additional_buffer_factor on host RAM.")]
LargestLayer = Annotated[str | None, typer.Option("--largest-layer-params", help="deepspeed-estimator, ZeRO-3 with --params: the largest module's parameters.")]
MicroBatches = Annotated[int | None, typer.Option("--micro-batches", help="Micro-batches per optimizer step (same as --grad-accum).")]
Gpus = Annotated[int, typer.Option("--gpus", "-n", help="World size: GPUs in the job.")]
GpusPerNode = Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")]
Gpu = Annotated[str, typer.Option("--gpu", help="GPU preset name or alias (a100-80g, h100), or a path to a .toml file.")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="fp32, fp16-mixed, bf16-mixed, bf16 (pure).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw (adam), sgd, sgd-momentum, adam-8bit, adafactor, lion.")]
ShardGroup = Annotated[int | None, typer.Option("--shard-group", help="Hybrid strategies: GPUs per shard group (default: one node).")]
GradAccum = Annotated[int | None, typer.Option("--grad-accum", help="Micro-batches per optimizer step (gradient accumulation).")]
CudaContext = Annotated[float | None, typer.Option("--cuda-context-gib", help="CUDA context per GPU, GiB (default 0.5).")]
Reserve = Annotated[float | None, typer.Option("--reserve-gib", help="Allocator headroom per GPU, GiB (default 0).")]
Units = Annotated[str, typer.Option("--units", help="Memory units: gib (2^30, as CUDA reports) or gb (10^9, as papers print).")]
Json = Annotated[bool, typer.Option("--json", help="Print the whole result as JSON (integer bytes).")]


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError(f"{flag} {value} must be a whole number of 1 or more")


def _micro_batch(value: str | None) -> int | str | None:
    if value is None or value.strip().lower() == "auto":
        return None if value is None else "auto"
    try:
        b = int(value)
    except ValueError:
        raise InputError(f"--micro-batch {value!r} is not a whole number; give 1, 2, ... or auto") from None
    _positive("--micro-batch", b)
    return b


def _units(units: str) -> str:
    u = units.strip().lower()
    if u not in ("gib", "gb"):
        raise InputError(f"--units {units!r} is not a memory unit; accepted: gib, gb")
    return u


def _show(result: Any, as_json: bool, units: str) -> None:
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    from memcalc.report.render import render

    _console().print(render(result, units))  # type: ignore[arg-type]


def _console() -> Any:
    """A terminal gets its own width; piped output (files, CI logs) is not squeezed to 80 columns."""
    import os

    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    # memcalc's cells are plain text: no markup, emoji codes or number highlighting to parse in them.
    return Console(width=160 if wide else None, markup=False, emoji=False, highlight=False)


def _run(fn: Any) -> None:
    try:
        fn()
    except (InputError, ValueError) as e:  # pydantic.ValidationError is a ValueError
        raise fail(_one_line(e)) from None


@app.command(
    cls=Command,
    epilog="Example: memcalc estimate --params 175e9 --stage 3 --gpus 128",
)
def estimate(
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
    precision: PrecisionOpt = "bf16-mixed",
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
    attention: AttentionOpt = "eager",
    dropout: Dropout = None,
    device: Device = "cuda",
    tp: Tp = 1,
    pp: Pp = 1,
    cp: Cp = 1,
    ep: Ep = 1,
    sequence_parallel: Sp = False,
    virtual_stages: Vp = 1,
    accounting: AccountingOpt = "paper",
    zero_init: ZeroInit = True,
    buffer_factor: BufferFactor = 1.5,
    largest_layer_params: LargestLayer = None,
    fsdp_version: FsdpVersion = 1,
    bucket_view: BucketView = False,
    min_num_params: MinNumParams = None,
    max_reuse_distance: ReuseDistance = None,
    max_live_parameters: MaxLive = None,
    prefetch_bucket_size: PrefetchBucket = None,
    persistence_threshold: Persistence = None,
    zero3_step: Zero3Step = "steady",
    units: Units = "gib",
    json: Json = False,
) -> None:
    """Memory per GPU and communication per step for one strategy."""

    def go() -> None:
        from memcalc.api import estimate as run

        for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--shard-group", shard_group),
                            ("--grad-accum", grad_accum), ("--micro-batches", micro_batches), ("--seq-len", seq_len),
                            ("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep),
                            ("--virtual-stages", virtual_stages)):  # fmt: skip
            _positive(flag, value)
        u = _units(units)
        result = run(
            params=params, gpus=gpus, gpus_per_node=gpus_per_node, stage=stage, fsdp=fsdp, ddp=ddp,
            strategy=strategy, offload_optimizer=offload_optimizer.strip().lower(),
            offload_params=offload_params.strip().lower(), shard_group=shard_group, gpu=gpu, precision=precision,
            optimizer=optimizer, grad_accum=grad_accum, micro_batches=micro_batches, cuda_context_gib=cuda_context_gib,
            reserve_gib=reserve_gib, model=model, hf_config=hf_config, layers=layers, hidden=hidden, heads=heads,
            kv_heads=kv_heads, ffn=ffn, vocab=vocab, seq_len=seq_len, micro_batch=_micro_batch(micro_batch),
            recompute=recompute.strip().lower(), attention=attention.strip().lower(), dropout=dropout,
            device=device.strip().lower(), tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=sequence_parallel,
            virtual_stages=virtual_stages, accounting=accounting.strip().lower(), zero_init=zero_init,
            buffer_factor=buffer_factor, largest_layer_params=largest_layer_params, fsdp_version=fsdp_version,
            bucket_view=bucket_view, min_num_params=min_num_params, max_reuse_distance=max_reuse_distance,
            max_live_parameters=max_live_parameters, prefetch_bucket_size=prefetch_bucket_size,
            persistence_threshold=persistence_threshold, zero3_step=zero3_step.strip().lower(),
        )  # fmt: skip
        _show(result, json, u)

    _run(go)


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
    precision: PrecisionOpt = "bf16-mixed",
    optimizer: OptimizerOpt = "adamw",
    grad_accum: GradAccum = None,
    cuda_context_gib: CudaContext = None,
    reserve_gib: Reserve = None,
    model: ModelOpt = None,
    hf_config: HfConfig = None,
    seq_len: SeqLen = None,
    micro_batch: MicroBatch = None,
    recompute: Recompute = "none",
    attention: AttentionOpt = "eager",
    tp: Tp = 1,
    pp: Pp = 1,
    sequence_parallel: Sp = False,
    units: Units = "gib",
    json: Json = False,
) -> None:
    """Every strategy side by side: memory parts, total, fit, host RAM and communication."""

    def go() -> None:
        from memcalc.api import compare as run

        for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--shard-group", shard_group),
                            ("--grad-accum", grad_accum), ("--seq-len", seq_len), ("--tp", tp), ("--pp", pp)):  # fmt: skip
            _positive(flag, value)
        u = _units(units)
        mb = _micro_batch(micro_batch)
        if mb == "auto":
            raise InputError("compare takes a fixed --micro-batch; use estimate --micro-batch auto per strategy")
        chosen = None if strategies is None else [s for s in strategies.split(",") if s.strip()]
        result = run(
            params=params, gpus=gpus, gpus_per_node=gpus_per_node, strategies=chosen, shard_group=shard_group,
            gpu=gpu, precision=precision, optimizer=optimizer, grad_accum=grad_accum,
            cuda_context_gib=cuda_context_gib, reserve_gib=reserve_gib, model=model, hf_config=hf_config,
            seq_len=seq_len, micro_batch=mb, recompute=recompute.strip().lower(), attention=attention.strip().lower(),
            tp=tp, pp=pp, sequence_parallel=sequence_parallel,
        )  # fmt: skip
        _show(result, json, u)

    _run(go)


@app.command(cls=Command, epilog="Example: memcalc gpus")
def gpus() -> None:
    """List the GPU presets."""
    from rich.table import Table

    from memcalc.inputs.presets import gpu_names, load_gpu

    t = Table(title="GPU presets (--gpu NAME or alias)", title_justify="left")
    for col in ("name", "GPU", "memory GB", "usable GiB", "HBM GB/s", "BF16 TFLOPS", "link GB/s", "aliases"):
        t.add_column(col)
    for key in gpu_names():
        g = load_gpu(key)
        t.add_row(key, g.name, f"{g.memory_gb:g}", f"{g.usable_memory_gib:g}", f"{g.hbm_gbps:g}",
                  f"{g.bf16_tflops:g}", f"{g.intra_node_link} {g.intra_node_gbps:g}", ", ".join(g.aliases))  # fmt: skip
    _console().print(t)


@app.command(cls=Command, epilog="Example: memcalc validate --suite quick")
def validate(
    suite: Annotated[str, typer.Option("--suite", help="quick (3 configurations) or full (every framework and strategy; DeepSpeed when installed).")] = "quick",
) -> None:
    """Measure real DDP/FSDP training steps on this machine and print them beside memcalc's estimate."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise fail("memcalc validate needs torch: pip install torch==2.13.0 'memcalc[validate]'") from None
    if suite not in ("quick", "full"):
        raise fail(f"--suite {suite!r} is not accepted; accepted: quick, full")
    from rich.progress import Progress
    from rich.table import Table
    from rich.text import Text

    from memcalc.validation.suite import QUICK, compare, full

    configs = QUICK if suite == "quick" else full()
    rows = []
    console = _console()
    with Progress(console=console, transient=True) as progress:
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
    console.print(t)
    import torch

    if torch.cuda.is_available():
        from memcalc.validation.cuda import peak_vs_estimate

        measured, est = peak_vs_estimate()
        console.print(f"CUDA peak (torch.cuda.max_memory_allocated, one GPU): measured {measured:,} bytes, "
                      f"estimated {est:,} bytes ({(est - measured) / measured:+.1%})")  # fmt: skip
    bad = sum(not r.match for r in rows)
    console.print(f"{len(rows) - bad} of {len(rows)} figures match exactly")
    if bad:
        raise typer.Exit(1)


@app.command(cls=Command, epilog="Example: memcalc models")
def models() -> None:
    """List the model presets with their exact parameter counts."""
    from rich.table import Table

    from memcalc.model.params import model_params
    from memcalc.inputs.presets import load_model, model_names

    t = Table(title="Model presets (--model NAME or alias)", title_justify="left")
    for col in ("name", "parameters", "layers", "hidden", "heads", "kv", "ffn", "vocab", "aliases"):
        t.add_column(col, justify="left" if col in ("name", "aliases") else "right")
    for key in model_names():
        a = load_model(key)
        t.add_row(key, f"{model_params(a).total:,}", str(a.layers), str(a.hidden), str(a.heads), str(a.n_kv),
                  str(a.ffn_size) + (f" x{a.experts}" if a.moe else ""), str(a.vocab), ", ".join(a.aliases))  # fmt: skip
    _console().print(t)


@app.command(cls=Command, epilog="Example: memcalc strategies")
def strategies() -> None:
    """List the strategies and what each shards."""
    from rich.table import Table

    from memcalc.layout.strategies import STRATEGIES

    t = Table(title="Strategies (--stage N, --fsdp NAME, --ddp, or --strategy NAME)", title_justify="left")
    for col in ("name", "framework", "params", "grads", "optimizer", "group", "same as", "offload"):
        t.add_column(col)
    yes = lambda b: "sharded" if b else "replicated"  # noqa: E731
    for s in STRATEGIES.values():
        offload = "-" if s.optimizer_offload == ("none",) and s.param_offload == ("none",) else (
            f"opt: {'/'.join(s.optimizer_offload[1:]) or '-'}, params: {'/'.join(s.param_offload[1:]) or '-'}")  # fmt: skip
        t.add_row(s.name, s.framework, yes(s.shards_params), yes(s.shards_grads), yes(s.shards_optimizer),
                  "shard group" if s.hybrid else "data-parallel", s.same_as, offload)  # fmt: skip
    _console().print(t)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
