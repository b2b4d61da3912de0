"""The realistic accounting: the peak of a real training step on one GPU, over its timeline, and what the GPU must have.

``--accounting realistic`` (the default where it applies). The live bytes of one optimizer step moment by moment are
``memcalc.memory.timeline`` (what each Hugging Face family's code saves, ``memcalc.memory.saved``, exact against a
census of the real modules on CPU; the loss, autocast's cast cache, recomputation, the optimizer's temporaries);
the answer is the largest moment, shown as its parts. On top: the caching allocator, the CUDA context and NCCL's
buffers (``memcalc.memory.allocator``), giving ``peak_allocated`` (what ``torch.cuda.max_memory_allocated``
reports), ``peak_reserved`` (``max_memory_reserved``: with the cached blocks the peak cannot use,
``memcalc.memory.reserved``) and the total a GPU must have, and a verdict: fits, at-risk or oom.

Where it applies: a Hugging Face family with a saved-tensor profile, a sequence length, the regimes Hugging Face
runs (fp32, pure bf16, autocast), AdamW (torch or bitsandbytes 8-bit) and replicated model states (one GPU, or DDP),
FSDP1 and FSDP2 (FULL_SHARD with parameter offload too, SHARD_GRAD_OP, HSDP) and DTensor tensor parallelism of Llama-style layers
(``memcalc.memory.timeline_tp``), DeepSpeed ZeRO-0 to 3 (``timeline_zero``, ``timeline_zero3``, with CPU/NVMe
offload); elsewhere
the paper's accounting answers and a note says why (``memcalc.memory.scope.why_not``).
"""

from __future__ import annotations

from typing import Any

from memcalc.layout.plan import Plan
from memcalc.memory.realistic_rows import part_row
from memcalc.memory.rows import Realistic, Row
from memcalc.model.memo import per_architecture

from memcalc.memory.scope import ATTENTION, FSDP_SHARDED, OPTIMIZER_STATES, POST_NORM_FSDP, REGIME, ZERO_STAGES


def _code(plan: Plan) -> str:
    """The saved-tensor profile the layers follow: torchtitan's own code (without tensor parallelism), else Hugging
    Face's (torchtitan under its sequence-parallel plan with full recompute: ``memcalc.memory.scope._why_not_tp``)."""
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
    what = "compiled too (inductor's fused cross-entropy: memory/saved.py loss_transient)" if on else "left eager"
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
    """The realistic peak of one GPU for ``plan`` (which ``memcalc.memory.scope.why_not`` accepts); under pipeline
    parallelism, of pipeline rank ``stage``. ``every_layer``: replay every decoder layer's moments (the reference);
    else only those of the layers that bound the rest (``memcalc.memory.stack``), the same answer. Megatron-Core
    ranks: ``memcalc.memory.megatron``."""
    if plan.framework == "megatron":
        from memcalc.memory import megatron

        return megatron.evaluate(plan, stage)
    tl, ddp_buckets, comm_groups = replay(plan, stage, every_layer)
    return _finish(plan, tl, tl.peak.live_bytes, ddp_buckets, comm_groups)


def replay(plan: Plan, stage: int = 0, every_layer: bool = False) -> tuple[Any, int, int]:
    """The step's timeline on one GPU (pipeline rank ``stage``), the bytes of DDP's gradient buckets alive all step
    beside it (0 where there are none) and the number of NCCL communicators the rank joins."""
    from memcalc.memory.timeline import timeline

    arch, w, p = plan.arch, plan.work, plan.precision
    assert arch is not None and w is not None
    if plan.framework == "megatron":
        from memcalc.errors import InputError

        raise InputError("--framework megatron: the realistic accounting counts a Megatron-Core rank at its first "
                         "backward (memory/megatron.py), without a moment-by-moment timeline")
    if plan.pp > 1:
        return _pipeline_rank(plan, stage, every_layer)
    if w.dropout != arch.dropout:  # --dropout in force over the model's: what the layers' dropout masks follow
        arch = _with_dropout(arch, w.dropout)
    if plan.spec.name in ZERO_STAGES:
        from memcalc.memory.timeline_zero import zero_timeline, worst_rank

        tl = zero_timeline(arch, family=arch.family or "", stage=int(plan.spec.name[-1]), dp=plan.dp,
                           attention=ATTENTION[w.attention], s=w.seq_len, b=w.micro_batch, recompute=w.recompute,
                           optimizer_impl=w.optimizer_impl, loss=w.loss, device=w.device,
                           bucket=plan.reduce_bucket_size, rank=worst_rank(arch, plan.dp, plan.lora), use_cache=False,
                           overlap_comm=plan.overlap_comm, offload=plan.offload_optimizer != "none", lora=plan.lora,
                           precision="fp32" if p.name == "fp32" else "bf16")
        return tl, 0, int(plan.dp > 1)
    if plan.spec.name == "zero-3":
        from memcalc.memory.timeline_zero3 import zero3_timeline

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
        from memcalc.memory.timeline import _moment, with_loss
        from memcalc.memory.timeline_offload import offload_fsdp, offload_fsdp1

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
    """Pipeline rank ``stage`` with FSDP2 inside its stages (``memcalc.memory.timeline_pp``): its chunks' layers
    (``--stage-layers``, else the framework's split), its schedule (1F1B, or interleaved with --virtual-stages)."""
    from memcalc.memory.timeline_pp import stage_timeline

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
    ``stage + c·pp``); ``memcalc.memory.paper.stage_chunks`` gives them for an explicit or a framework's split."""
    from memcalc.layout.compose import rank_layers
    from memcalc.memory.paper import stage_chunks

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
    from memcalc.memory.allocator import GAP_FRACTION, GAP_HIGH, fit, nccl_buffers
    from memcalc.memory.reserved import POOLS, reserved_peak
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
    # Cached blocks the step's peak cannot use (memcalc.memory.reserved): the loss's freed logits, FSDP2's
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
            + (", less the pools' blocks alive at the peak" if any(pools) else "") + "; memory/reserved.py), released "
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


WHOLE_NOTE = {
    1: ("{name}: FSDP1 FullyShardedDataParallel without an auto-wrap policy (accelerate's NO_WRAP): the whole model "
        "one FlatParameter over {n} ranks, gathered at the forward's start and kept gathered to its post-backward "
        "(the root is never resharded after forward), every gradient unsharded until then and copied into one "
        "padded flat gradient for the reduce-scatter: about three copies of the model at the end of the backward "
        "(SHARD_GRAD_OP and the hybrid strategies hold the same step over the shard group); {policy} (traced: "
        "tests/test_fsdp_layouts.py)"),
    2: ("{name}: FSDP2 as accelerate 1.15 wraps a model under NO_WRAP: the decoder layers in the root over {n} ranks, "
        "gathered at the forward's start and kept gathered to its post-backward in the backward's final callback, "
        "every layer's gradient unsharded until then and its reduce-scatter input beside them; the embedding and "
        "[final norm, head] units of their own{tied}; {policy} (traced: tests/test_fsdp_layouts.py)"),
}
"""The realistic note under ``--fsdp-auto-wrap none`` (``memcalc.memory.fsdp_overlay.FsdpOverlay.whole``)."""


def _moe_note(plan: Plan) -> str:
    """How the realistic accounting counts a mixture of experts (``memcalc.memory.saved_moe``), and where FSDP2's
    dim-0 sharding of the expert tensors leaves rank 0 more than its share."""
    arch = plan.arch
    assert arch is not None
    out = (f"MoE: each layer's {arch.experts} experts run as Hugging Face's grouped_mm experts (transformers 5's "
           f"default): every shape is T·k = {arch.top_k} x the tokens whatever the routing, so the saved pairs, "
           "their weighted copies and every expert's weight gradients are counted as they are made "
           "(memory/saved_moe.py, traced)")
    n = plan.shard_group_size
    if plan.spec.name in FSDP_SHARDED and plan.fsdp_version == 2 and arch.experts % n:
        rows = -(-arch.experts // n)
        out += (f"; FSDP2 shards each expert tensor on dim 0, the experts: {arch.experts} over {n} ranks leaves "
                f"{rows} expert{'s' if rows > 1 else ''} ({rows * n - arch.experts} of them padding across the group) "
                f"on every rank, {rows * n / arch.experts:.2f}x the even share, in the shards, the gathered units "
                "and the reduce-scatter inputs (FSDP1's flat parameters split evenly: --fsdp-version 1)")
    return out


def _attention_shown(asked: str) -> str:
    """The attention as asked: flash runs SDPA's flash kernel, which the accounting follows as SDPA."""
    return "flash (SDPA's flash kernel)" if asked == "flash" else ATTENTION[asked]


def notes(plan: Plan) -> list[str]:
    """What the realistic accounting shows and assumes."""
    from memcalc.memory.allocator import GAP_FRACTION, GAP_HIGH
    from memcalc.units import GiB

    arch, w = plan.arch, plan.work
    assert arch is not None and w is not None
    if plan.framework == "megatron":
        from memcalc.memory import megatron

        return megatron.notes(plan)
    code = "torchtitan's Llama 3" if _code(plan) == "torchtitan" else f"Hugging Face's {arch.family}"
    out = [f"accounting: realistic: the peak of one training step over its timeline as {code} "
           f"code runs it ({plan.precision.name}, {_attention_shown(w.attention)} attention, {w.recompute} "
           f"recompute, {w.loss} loss, "
           f"{'DeepSpeedCPUAdam on the host' if plan.offload_optimizer != 'none' else 'AdamW ' + w.optimizer_impl}); the rows are what is alive at that moment",
           "peak_allocated is what torch.cuda.max_memory_allocated reports; peak_reserved adds the caching allocator's "
           "least measured gap (0.3 GiB) and the cached blocks the peak cannot use (the loss's freed bf16 logits, "
           "FSDP2's stream pools: memory/reserved.py), which the allocator releases before it fails; the verdict is "
           "at-risk when the margin left is under the widest gap measured "
           f"for a step of this size ({GAP_FRACTION * 100:.1f} % of the allocated peak, at most {GAP_HIGH / GiB:.1f} "
           "GiB) or the largest single request at the peak, oom when it is under 0.3 GiB"]
    if w.compile and w.loss != "fused":
        out.append(_loss_note(plan))
    if arch.moe:
        out.append(_moe_note(plan))
    if w.compile and w.recompute != "none":
        out.append(f"--compile with {w.recompute} recompute: what the policy keeps is kept, compiled or not"
                   + (" (but the down projection's output, which eager SAC caches and the compiled block's backward "
                      "does not read)" if w.recompute == "op-sac" else "")
                   + "; the layers it recomputes and their backward are counted as the eager layer's (an upper bound: "
                   "the compiled forward saves less)")
    if plan.spec.name in ZERO_STAGES:
        from memcalc.memory.timeline_zero import partition, worst_rank

        rank = worst_rank(arch, plan.dp, plan.lora)
        what = "parameters" if plan.lora is None else "adapter parameters, the only ones DeepSpeed partitions,"
        out.append(f"DeepSpeed {plan.spec.label}: the module in {plan.precision.low_dtype} saves what a pure "
                   f"{plan.precision.low_dtype} model saves; the states, gradient bucket (reduce_bucket_size "
                   f"{plan.reduce_bucket_size:,} elements{', two with overlap_comm' if plan.overlap_comm else ''}) and the step's fp32 gradients as DeepSpeed 0.19 holds them "
                   f"(memory/timeline_zero.py, against a traced DeepSpeed step on CPU ranks); "
                   + ("every rank alike under offload but for the gradient slices on their way to the host (the largest "
                      "any rank holds)" if plan.offload_optimizer != "none" else
                      f"data-parallel rank {rank} of {plan.dp}, whose partition overlaps the most {what} "
                      f"({partition(arch, plan.dp, rank, plan.lora)[1]:,} elements)") if plan.spec.name != "zero-0" else
                   f"DeepSpeed ZeRO-0: the module in {plan.precision.low_dtype}, fp32 copies of every "
                   f"{'adapter parameter' if plan.lora is not None else 'parameter'}, the "
                   "gradients flattened for the all-reduce and upcast for the step as DeepSpeed 0.19 holds them "
                   "(memory/timeline_zero.py, against a traced DeepSpeed step on CPU ranks)")
        if plan.offload_optimizer != "none":
            from memcalc.memory.timeline_zero import OFFLOAD_NOTE

            out.append(OFFLOAD_NOTE)
    if plan.spec.name == "zero-3":
        from memcalc.memory.timeline_zero3 import NOTE

        out.append(NOTE.format(dtype=plan.precision.low_dtype, bucket=plan.reduce_bucket_size, z=plan.zero3))
        if plan.offload_optimizer != "none":
            from memcalc.memory.timeline_zero3 import OFFLOAD_NOTE

            out.append(OFFLOAD_NOTE)
        elif plan.offload_params != "none":
            from memcalc.memory.timeline_zero3 import PARAM_OFFLOAD_NOTE

            out.append(PARAM_OFFLOAD_NOTE)
    if plan.spec.name in FSDP_SHARDED and w.recompute not in ("none", "full"):
        out.append(f"{plan.spec.name} with {w.recompute} recompute: the policy's kept tensors (as on one GPU) under the FSDP2 "
                   "timeline, which was traced with recompute none and full")
    if plan.float8 != "none":
        from memcalc.memory.paper import FLOAT8_NOTE

        out.append(FLOAT8_NOTE)
    if plan.spec.name in FSDP_SHARDED:
        policy = ("MixedPrecisionPolicy(param_dtype=bf16"
                  + (", reduce_dtype=fp32" if _reduce_fp32(plan) else "") + ") over fp32 shards"
                  if plan.precision.name == "bf16-mixed" else "no MixedPrecisionPolicy")
        gathered = ("every unit of the stage kept gathered from its first forward to perform_reduce_grad, the "
                    "gradients accumulated unsharded until then" if plan.pp > 1 else
                    "each layer kept gathered from its forward to its post-backward (reshard_after_forward=False), "
                    "so the backward gathers nothing" if plan.spec.param_gather == "forward"
                    else "one layer gathered and the next prefetched")
        replicas = (f"; HSDP: {plan.dp // plan.shard_group_size} replicas of the shards, each reduced shard "
                    "all-reduced across them and, in a reduce dtype other than the shards', held by its group until "
                    "the backward ends (FSDPParamGroup._all_reduce_state)") if plan.spec.name in HSDP else ""
        units = {"root": "the root (embedding, final norm, head) stays gathered from forward to backward",
                 "separate": "the embedding a unit resharded after its forward, the final norm and head one unit "
                             "gathered from its forward to its post-backward (torchtitan's apply_fsdp since v0.2, "
                             "accelerate 1.15's fsdp2_prepare_model)",
                 "separate-reshard": "the embedding and the head each a unit resharded after its forward, the final "
                                     "norm in the root (torchtune's custom_sharded_layers)"}[plan.fsdp_wrap]
        if plan.fsdp_auto_wrap == "none":
            out.append(WHOLE_NOTE[plan.fsdp_version].format(name=plan.spec.name, n=plan.shard_group_size,
                                                            policy=policy, tied=" (tied: one [final norm, embedding, "
                                                            "head] unit)" if plan.fsdp_wrap == "root" else ""))
        elif plan.fsdp_version == 1:
            out.append(f"{plan.spec.name}: FSDP1 FullyShardedDataParallel, one FlatParameter per decoder layer and one "
                       f"for the root over {plan.shard_group_size} ranks (use_orig_params=True, "
                       f"backward prefetch {'BACKWARD_PRE' if plan.fsdp_prefetch else 'BACKWARD_POST or none'}: rank "
                       "0's chunk of each padded "
                       "flat parameter; a unit gathered straight into its unsharded flat parameter, the root kept "
                       "gathered from forward to backward, "
                       + ("each unit kept gathered from its forward to its post-backward, nothing gathered in "
                          "backward" if plan.spec.param_gather == "forward" else
                          "the next layer's parameters prefetched whole in backward" if plan.fsdp_prefetch else
                          "each layer gathered at its own pre-backward (BACKWARD_POST's prefetch comes after the "
                          "reshard, the same peaks)")
                       + ", each unit's gradients copied into one flat gradient "
                       f"and reduce-scattered from it; {policy.replace('MixedPrecisionPolicy', 'MixedPrecision')}); "
                       "NCCL buffers counted per communicator")
        else:
            out.append(f"{plan.spec.name}: FSDP2 fully_shard per decoder layer and on the root over "
                       f"{plan.shard_group_size} ranks (rank 0's padded shards; --fsdp-wrap {plan.fsdp_wrap}: {units}; "
                       f"{gathered}; {policy}{replicas}); NCCL buffers counted per communicator")
        if plan.fsdp_version == 1 and plan.lora is not None:
            out.append("LoRA under FSDP1: peft's fsdp_auto_wrap_policy, which the Hugging Face Trainer applies under "
                       "FSDP1 (update_fsdp_plugin_peft): each lora_A and lora_B a unit of its own, the decoder layers' "
                       "and the root's flat parameters frozen (no flat gradient, no reduce-scatter; a layer resharded "
                       "once its input's gradient is made)"
                       + ("; under the bf16 MixedPrecision each lora_A saves a bf16 re-cast of its input of its own "
                          "(peft casts the input to the weight's dtype while it is still the fp32 shard)"
                          if plan.precision.name == "bf16-mixed" else "")
                       + ("; BACKWARD_PRE prefetches the layer below from the layer's first adapter, late in its "
                          "backward: counted from the layer's backward entry, an upper bound by at most one gathered "
                          "layer" if plan.fsdp_prefetch else "")
                       + " (traced against peft under FSDP1, tests/test_fsdp_layouts.py)")
        if plan.offload_params != "none" and plan.fsdp_version == 1:
            out.append("FULL_SHARD with FSDP1's CPUOffload(offload_params=True): the sharded flat parameters, the "
                       "reduced gradient shards (_cpu_grad) and AdamW's moments and step in host memory; the GPU keeps "
                       "the buffers, the gathered units, the flat gradients and each unit's whole shard while "
                       "pre_unshard brings it over for the all-gather (read from torch 2.13's _flat_param.py and "
                       "_runtime_utils.py, not traced: FSDP1 offload needs a CUDA device)")
        elif plan.offload_params != "none":
            out.append("FULL_SHARD with CPUOffloadPolicy: the fp32 sharded parameters, the reduced gradient shards and "
                       "AdamW's moments and step in host memory; the GPU keeps the buffers, the gathered units, the "
                       "all-gather outputs and reduce-scatter inputs, and each parameter's fp32 shard while it is cast "
                       "for the all-gather (read from torch 2.13's _fully_shard, not traced: a CPU run cannot tell the "
                       "devices apart)")
        if plan.arch is not None and plan.arch.family in POST_NORM_FSDP and plan.precision.name != "fp32":
            out.append(f"{plan.spec.name} with {plan.arch.family}'s post-norm layers in a 2-byte regime: traced 1.9-3.2 % above "
                       "this peak (exact in fp32; the difference is not located yet)")
        if plan.shard_group_size == 1:
            out.append(f"{plan.spec.name} on one rank: counted as a world of N holds its gathered layers; a traced world of 1 "
                       "holds up to one layer's parameters less (an upper bound, within 8 %)")
    if plan.pp > 1:
        sched = (f"ScheduleInterleaved1F1B, {plan.virtual_stages} chunks per rank (each reduced after its own last "
                 "backward)" if plan.virtual_stages > 1 else "Schedule1F1B (warm-up min(n, pp - rank) forwards)")
        out.append(f"pp {plan.pp}: each pipeline rank's step replayed action by action as torch.distributed.pipelining "
                   f"runs it ({sched}, {plan.grad_accum} micro-batches; memory/timeline_pp.py, against a traced "
                   "pipeline rank): FSDP2 inside the stage with reshard_after_forward=False and gradient sync off "
                   "until perform_reduce_grad, each micro-batch in flight with its saved tensors and stage output, "
                   "the receive buffers and the received inputs' gradients kept, the last stage's logits kept "
                   "through the loss's backward; the most loaded rank is shown, every rank in the stage table")
    if plan.tp > 1 and plan.framework == "torchtitan":
        out.append("torchtitan's own layers under tensor parallelism are counted as Hugging Face's Llama layers: with "
                   "full recompute each keeps its checkpoint either way; the recomputed layer's transients are HF's")
    if plan.cp > 1:
        out.append(f"cp {plan.cp}: each rank runs the step of its s/cp = {w.seq_len // plan.cp} tokens (ring attention "
                   "keeps its local q, k, v, output and log-sum-exp; the K, V chunks in flight between ranks are not "
                   f"counted), FSDP2 sharded over {plan.shard_group_size} ranks; derived, not traced")
    if plan.tp > 1:
        out.append(f"tp {plan.tp}: DTensor tensor parallelism as torch's ColwiseParallel (q, k, v, gate, up) and "
                   "RowwiseParallel (o, down) run it, without sequence parallelism or loss_parallel: rank 0's "
                   "projections, heads and MLP width / tp, norms, embedding, head, the layers' inputs and the "
                   "logits whole on every rank (memory/timeline_tp.py; exact against a traced step)"
                   if not plan.sequence_parallel else
                   f"tp {plan.tp} with sequence parallelism as torchtitan's plan: SequenceParallel norms, "
                   "reduce-scattered o and down, all-gathered projection inputs saved whole, vocabulary-sharded "
                   "embedding, head and logits under loss_parallel (memory/timeline_tp.py, against a traced step; "
                   "loss_parallel's temporaries inside DTensor traced too)")
    if plan.lora is not None:
        lp = plan.lora
        out.append(f"LoRA r = {lp.rank} on {','.join(lp.targets)}{' over an NF4 base (QLoRA)' if lp.quantize == 'nf4' else ''}: "
                   "peft with lora_dropout=0 and enable_input_require_grads(); layer saved tensors exact against a "
                   "census of a peft model on CPU; the layers' backward transients are the full model's (an upper "
                   "bound)" + ("; a dequantized weight bitsandbytes' kernels may make per use (at most the largest "
                              "linear in the compute dtype) is not counted" if lp.quantize == "nf4" else ""))
        if plan.precision.name == "bf16":
            out.append("LoRA under pure bf16: adapters in bf16 (peft get_peft_model(autocast_adapter_dtype=False)); "
                       "peft's default keeps them in fp32, and each lora_A then saves an fp32 copy of its input "
                       "(a Llama layer saves 1.77x as much, measured on CPU): not modelled")
        if plan.dp > 1:
            from memcalc.memory.paper import LORA_COMM_NOTE

            out.append(LORA_COMM_NOTE)
    if plan.precision.name == "amp-fp16":
        out.append("amp-fp16 saves what amp-bf16 does (2-byte casts); the GradScaler's few bytes are left out")
    return out
