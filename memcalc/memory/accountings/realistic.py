"""The realistic accounting: the peak of a real training step on one GPU, over its timeline, and what the GPU must have.

``--accounting realistic`` (the default where it applies). The live bytes of one optimizer step moment by moment are
``memcalc.memory.engine.timeline`` (what each Hugging Face family's code saves, ``memcalc.memory.families.saved``, exact against a
census of the real modules on CPU; the loss, autocast's cast cache, recomputation, the optimizer's temporaries);
the answer is the largest moment, shown as its parts. On top: the caching allocator, the CUDA context and NCCL's
buffers (``memcalc.memory.allocator.allocator``), giving ``peak_allocated`` (what ``torch.cuda.max_memory_allocated``
reports), ``peak_reserved`` (``max_memory_reserved``: with the cached blocks the peak cannot use,
``memcalc.memory.allocator.reserved``) and the total a GPU must have, and a verdict: fits, at-risk or oom.

Where it applies: a Hugging Face family with a saved-tensor profile, a sequence length, the regimes Hugging Face
runs (fp32, pure bf16, autocast), AdamW (torch or bitsandbytes 8-bit) and replicated model states (one GPU, or DDP),
FSDP1 and FSDP2 (FULL_SHARD with parameter offload too, SHARD_GRAD_OP, HSDP) and DTensor tensor parallelism of Llama-style layers
(``memcalc.memory.overlays.timeline_tp``), DeepSpeed ZeRO-0 to 3 (``timeline_zero``, ``timeline_zero3``, with CPU/NVMe
offload); elsewhere
the paper's accounting answers and a note says why (``memcalc.memory.accountings.scope.why_not``).
"""

from __future__ import annotations

from typing import Any

from memcalc.layout.plan import Plan
from memcalc.memory.accountings.realistic_rows import part_row
from memcalc.memory.accountings.rows import Realistic, Row
from memcalc.memory.accountings.scope import ATTENTION, FSDP_SHARDED, OPTIMIZER_STATES, REGIME, ZERO_STAGES
from memcalc.model.memo import per_architecture


def _code(plan: Plan) -> str:
    """The saved-tensor profile the layers follow: torchtitan's own code (without tensor parallelism), else Hugging
    Face's (torchtitan under its sequence-parallel plan with full recompute: ``memcalc.memory.accountings.scope._why_not_tp``)."""
    from memcalc.layout.compose import composition

    return "torchtitan" if composition(plan.framework).model_code == "torchtitan" and plan.tp == 1 else "hf"


def _loss_compiled(plan: Plan) -> bool:
    """Whether torch.compile covers the loss: --compile-loss / --no-compile-loss, else the framework's habit."""
    from memcalc.layout.compose import composition

    w = plan.work
    assert w is not None
    if not w.compile:
        return False
    if w.compile_loss is not None:
        return w.compile_loss
    fw = composition(plan.framework)
    return fw.compiles_plain_loss if w.loss == "standard" else fw.compiles_chunked_loss


_LOSS_HABIT = {"torchtitan": ("as torchtitan's releases do (v0.1.0 on); its commits before April 2025 left it eager: "
                               "--no-compile-loss"),
               "torchtune": ("as torchtune's recipes do: they drop what compile_loss returns, so a chunked loss is "
                             "compiled in place and a plain one stays eager"),
               "hf": "as a compiled Hugging Face model does: its loss is in the graph"}


def _loss_note(plan: Plan) -> str:
    """Whether --compile covers the loss, and who said so."""
    from memcalc.layout.compose import composition

    w = plan.work
    assert w is not None
    on = _loss_compiled(plan)
    what = "compiled too (inductor's fused cross-entropy: memory/families/saved.py loss_transient)" if on else "left eager"
    if w.compile_loss is not None:
        who = "--compile-loss" if w.compile_loss else "--no-compile-loss"
    else:
        name = composition(plan.framework).name
        who = _LOSS_HABIT.get(name, "the default: a compiled model with its loss in the graph")
    return f"--compile: the loss {what} ({who})"


HSDP = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
"""FSDP2 on a (replicate, shard) mesh: sharded over the shard group, the reduced shards all-reduced across replicas."""


def _reduce_fp32(plan: Plan) -> bool:
    """Gradients reduced in fp32 under the bf16 policy: torchtitan's ``mixed_precision_reduce = "float32"``."""
    from memcalc.layout.compose import composition

    return plan.precision.name == "bf16-mixed" and composition(plan.framework).fsdp_reduce_fp32


def evaluate(plan: Plan, stage: int = 0, every_layer: bool = False) -> Realistic:
    """The realistic peak of one GPU for ``plan`` (which ``memcalc.memory.accountings.scope.why_not`` accepts); under pipeline
    parallelism, of pipeline rank ``stage``. ``every_layer``: replay every decoder layer's moments (the reference);
    else only those of the layers that bound the rest (``memcalc.memory.engine.stack``), the same answer. Megatron-Core
    ranks: ``memcalc.memory.accountings.megatron``."""
    if plan.framework == "megatron":
        from memcalc.memory.accountings import megatron

        return megatron.evaluate(plan, stage)
    tl, ddp_buckets, comm_groups = replay(plan, stage, every_layer)
    return _finish(plan, tl, tl.peak.live_bytes, ddp_buckets, comm_groups)


def replay(plan: Plan, stage: int = 0, every_layer: bool = False) -> tuple[Any, int, int]:
    """The step's timeline on one GPU (pipeline rank ``stage``), the bytes of DDP's gradient buckets alive all step
    beside it (0 where there are none) and the number of NCCL communicators the rank joins."""
    from memcalc.memory.engine.timeline import timeline

    arch, w, p = plan.arch, plan.work, plan.precision
    assert arch is not None and w is not None
    if plan.framework == "megatron":
        from memcalc.errors import InputError

        raise InputError("--framework megatron: the realistic accounting counts a Megatron-Core rank at its first "
                         "backward (memory/accountings/megatron.py), without a moment-by-moment timeline")
    if plan.pp > 1:
        return _pipeline_rank(plan, stage, every_layer)
    if w.dropout != arch.dropout:  # --dropout in force over the model's: what the layers' dropout masks follow
        arch = _with_dropout(arch, w.dropout)
    if plan.spec.name in ZERO_STAGES:
        from memcalc.memory.overlays.timeline_zero import zero_timeline, worst_rank

        tl = zero_timeline(arch, family=arch.family or "", stage=int(plan.spec.name[-1]), dp=plan.dp,
                           attention=ATTENTION[w.attention], s=w.seq_len, b=w.micro_batch, recompute=w.recompute,
                           optimizer_impl=w.optimizer_impl, loss=w.loss, device=w.device,
                           bucket=plan.reduce_bucket_size, rank=worst_rank(arch, plan.dp, plan.lora), use_cache=False,
                           overlap_comm=plan.overlap_comm, offload=plan.offload_optimizer != "none", lora=plan.lora,
                           precision="fp32" if p.name == "fp32" else "bf16")
        return tl, 0, int(plan.dp > 1)
    if plan.spec.name == "zero-3":
        from memcalc.memory.overlays.timeline_zero3 import zero3_timeline

        tl = zero3_timeline(arch, family=arch.family or "", dp=plan.dp, attention=ATTENTION[w.attention], s=w.seq_len,
                            b=w.micro_batch, recompute=w.recompute, optimizer_impl=w.optimizer_impl, loss=w.loss,
                            device=w.device, bucket=plan.reduce_bucket_size, settings=plan.zero3, use_cache=False,
                            offload_optimizer=plan.offload_optimizer != "none",
                            offload_params=plan.offload_params != "none", lora=plan.lora,
                            sub_group_size=plan.zero3.sub_group_size,
                            precision="fp32" if p.name == "fp32" else "bf16")
        return tl, 0, int(plan.dp > 1)
    sharded = plan.spec.name in FSDP_SHARDED
    whole = sharded and plan.fsdp_auto_wrap == "none"
    # FSDP's mixed precision (bf16-mixed: fp32 sharded parameters, the master copy, gathered and computed in bf16)
    # is MixedPrecisionPolicy(param_dtype=bf16): activations as pure bf16, states fp32 (the traces of fp32 and of
    # autocast under that policy are identical).
    policy = "bf16" if sharded and p.name == "bf16-mixed" else None
    regime = "amp-bf16" if policy else REGIME[p.name]
    tl = timeline(arch, family=arch.family or "", regime=regime, attention=ATTENTION[w.attention],
                  s=w.seq_len // plan.cp, b=w.micro_batch, recompute=w.recompute, optimizer_impl=w.optimizer_impl,
                  optimizer_states=OPTIMIZER_STATES[plan.optimizer.name], loss=w.loss, device=w.device,
                  position_ids=False, use_cache=False,
                  world=plan.shard_group_size if sharded else 1, fsdp=sharded, fsdp_param_dtype=policy, lora=plan.lora,
                  code=_code(plan), tp=plan.tp, compiled=w.compile,
                  loss_compiled=_loss_compiled(plan), sequence_parallel=plan.sequence_parallel,
                  float8=plan.float8, float8_all_gather=sharded and plan.float8_all_gather,
                  fsdp_wrap=plan.fsdp_wrap if sharded else "root",
                  # NO_WRAP under FSDP1: the one unit is the root, never resharded after forward, and HYBRID_SHARD's
                  # all-reduce holds no buffer: every strategy is FULL_SHARD's step over the shard group (traced)
                  fsdp_keep=plan.spec.param_gather == "forward" and not whole,
                  fsdp_hsdp=plan.spec.name in HSDP and not whole, fsdp_reduce_fp32=_reduce_fp32(plan),
                  fsdp_flat=sharded and plan.fsdp_version == 1, fsdp_prefetch=plan.fsdp_prefetch,
                  fsdp_whole=whole, every_layer=every_layer)
    if sharded and plan.offload_params != "none":
        from memcalc.memory.engine.timeline import _moment, with_loss
        from memcalc.memory.overlays.timeline_offload import offload_fsdp, offload_fsdp1

        if plan.fsdp_version == 1:
            width = 2 if regime == "bf16" else 4
            moved = offload_fsdp1(tl.moments, arch, plan.shard_group_size, width, 2 if policy else width)
        else:
            moved = offload_fsdp(tl.moments, arch, plan.shard_group_size)
        tl = with_loss(tl, [_moment(*m) for m in moved])
    extra = 0
    if plan.dp > 1 and not plan.bucket_view and not sharded:
        # torch DDP (torch/nn/parallel/distributed.py): gradient buckets are a second copy of the gradients, made at
        # construction and alive for the whole run (gradient_as_bucket_view=False, the default).
        extra = sum(n for name, n in tl.peak.parts if name in ("parameters", "parameters (LoRA adapters)"))
    # NCCL: one communicator for DDP's ring (FSDP: the data-parallel group's, not measured). Under tensor parallelism
    # the tensor-parallel group is one more communicator (its all-reduces).
    hsdp = plan.spec.name in HSDP and plan.dp > plan.shard_group_size  # a second communicator: the replicas'
    return tl, extra, (plan.dp > 1) + (plan.tp > 1) + hsdp


@per_architecture
def _with_dropout(arch: Any, dropout: float) -> Any:
    """``arch`` with the dropout of ``--dropout``: one object per model and rate, so that what is cached per
    architecture (``memcalc.model.memo``) serves every plan that shares them."""
    return arch.model_copy(update={"dropout": dropout})


def _pipeline_rank(plan: Plan, stage: int, every_layer: bool = False) -> tuple[Any, int, int]:
    """Pipeline rank ``stage`` with FSDP2 inside its stages (``memcalc.memory.overlays.timeline_pp``): its chunks' layers
    (``--stage-layers``, else the framework's split), its schedule (1F1B, or interleaved with --virtual-stages)."""
    from memcalc.memory.overlays.timeline_pp import stage_timeline

    arch, w, p = plan.arch, plan.work, plan.precision
    assert arch is not None and w is not None
    policy = "bf16" if p.name == "bf16-mixed" else None
    tl = stage_timeline(arch, family=arch.family or "", regime="fp32" if policy else REGIME[p.name],
                        attention=ATTENTION[w.attention], s=w.seq_len // plan.cp, b=w.micro_batch, pp=plan.pp,
                        rank=stage, micro_batches=plan.grad_accum, chunks=_rank_chunks(plan, stage),
                        recompute=w.recompute, optimizer_impl=w.optimizer_impl, loss=w.loss, device=w.device,
                        code=_code(plan), tp=plan.tp, sequence_parallel=plan.sequence_parallel, compiled=w.compile,
                        loss_compiled=_loss_compiled(plan), float8=plan.float8,
                        float8_all_gather=plan.float8_all_gather, world=plan.shard_group_size,
                        fsdp_param_dtype=policy, fsdp_reduce_fp32=_reduce_fp32(plan),
                        every_layer=every_layer, every_micro_batch=every_layer)  # fmt: skip
    # communicators: the data-parallel (shard) group's, the tensor-parallel group's, the pipeline's
    return tl, 0, (plan.shard_group_size > 1) + (plan.tp > 1) + 1


def _rank_chunks(plan: Plan, stage: int) -> tuple[range, ...]:
    """The decoder layers of each local chunk of pipeline rank ``stage`` (torch's looped placement: global stage
    ``stage + c·pp``); ``memcalc.memory.accountings.paper.stage_chunks`` gives them for an explicit or a framework's split."""
    from memcalc.layout.compose import rank_layers
    from memcalc.memory.accountings.paper import stage_chunks

    chunks = stage_chunks(plan, stage)
    if len(chunks) == plan.virtual_stages:
        return chunks
    # one range for the rank's layers under an even split: the rank's chunks of the even split over pp·v stages
    assert plan.arch is not None
    total, stages = plan.arch.layers, plan.pp * plan.virtual_stages
    sizes = [total // stages + (k < total % stages) for k in range(stages)]
    return rank_layers(tuple(sizes), plan.pp, stage)


def _finish(plan: Plan, tl: Any, allocated: int, ddp_buckets: int, comm_groups: int) -> Realistic:
    """Rows of the peak moment, the allocator's, the context's and NCCL's, and the verdict."""
    from memcalc.memory.allocator.allocator import GAP_FRACTION, GAP_HIGH, fit, nccl_buffers
    from memcalc.memory.allocator.reserved import POOLS, reserved_peak
    from memcalc.units import GiB

    peak = tl.peak
    fsdp1 = plan.spec.framework == "fsdp" and plan.fsdp_version == 1
    rows = [part_row(name, n, fsdp1) for name, n in peak.parts]
    if ddp_buckets:
        rows.append(Row("gradient_buckets", "DDP gradient buckets", ddp_buckets, "gpu", "model_state",
                        "a copy of the gradients, as large as the parameters (gradient_as_bucket_view=False)"))
        allocated += ddp_buckets
    # The largest single request at the peak: log-softmax's fp32 output is one tensor of 4 bytes per logit element
    # (its two fp32 gradients are each as large); layer activations are many small tensors.
    largest = dict(peak.parts).get("log-softmax output (fp32)", 0)
    # NCCL_BUFFSIZE per channel and ring peer (2), 16 channels on NVLink, per communicator
    comm = nccl_buffers(comm_groups, 16, 2)
    context = plan.cuda_context
    f = fit(allocated, plan.usable_bytes, largest_request=largest, context=context, communication=comm)
    # Cached blocks the step's peak cannot use (memcalc.memory.allocator.reserved): the loss's freed logits, FSDP2's
    # side-stream pools. Wholly free segments, released before a cudaMalloc fails: max_memory_reserved shows them
    # up to what the GPU leaves the allocator; the verdict and the total do not count them.
    streams = plan.spec.name in FSDP_SHARDED and plan.fsdp_version == 2  # FSDP1's pools are not modelled
    held, pools, forward = reserved_peak(tl.moments, tl.loss_moment, tl.loss_cache, streams, tl.loss_blocks,
                                         tl.fresh_from)
    cached = max(0, held - peak.live_bytes)
    reserved = max(f.peak_reserved, min(f.peak_reserved + cached, plan.usable_bytes - context - comm))
    what = ([f"the loss's freed logits {tl.loss_cache / GiB:.2f} GiB"] * (forward >= 0 and tl.loss_cache > 0)
            + [f"{tl.fresh_detail}, {forward / GiB:.2f} GiB"] * (forward > 0)
            + [f"FSDP2's {name} pool of {b / GiB:.2f} GiB" for (name, _), b in zip(POOLS, pools) if b])
    kept = (f"; max_memory_reserved also holds {(reserved - f.peak_reserved) / GiB:.2f} GiB of cached blocks the "
            "peak cannot use (" + ", ".join(what)
            + (", less the pools' blocks alive at the peak" if any(pools) else "") + "; memory/allocator/reserved.py), released "
            "before an allocation fails") if reserved > f.peak_reserved else ""  # fmt: skip
    rows += [
        Row("allocator_reserve", "allocator: reserved beyond allocated", f.peak_reserved - allocated + plan.reserve,
            "gpu", "overhead", "the least measured gap (0.3 GiB, H100) + --reserve-gib; fragmentation can add up to "
            f"{(f.reserved_high - allocated) / GiB:.2f} GiB (the band the verdict uses: {GAP_FRACTION * 100:.1f} % of "
            f"the allocated peak, at most {GAP_HIGH / GiB:.1f} GiB, or the largest single request){kept}"),
        Row("cuda_context", "CUDA context", context, "gpu", "overhead",
            "context, cuBLAS/cuDNN handles and kernels outside the allocator (0.75 GiB measured: H100, torch 2.11)"),
    ]
    if comm:
        rows.append(Row("nccl_buffers", "NCCL buffers", comm, "gpu", "overhead",
                        "NCCL_BUFFSIZE 4 MiB x 16 channels x 2 ring peers per communicator (data-parallel, "
                        "tensor-parallel, pipeline), outside the allocator"))
    phases: dict[str, int] = {}
    for name, n in tl.phase_peaks.items():
        key = name.split(".")[0]
        phases[key] = max(phases.get(key, 0), n)
    return Realistic(rows, allocated, reserved + plan.reserve, f.total + plan.reserve, f.verdict,
                     f.margin - plan.reserve, peak.phase, peak.label, phases)


