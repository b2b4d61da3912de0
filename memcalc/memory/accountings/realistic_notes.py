"""The realistic accounting's notes: what it assumed and how it read the layout (the loss's compile habit, FSDP's
wrap, MoE routing, the attention kernel), beside its answer (``memcalc.memory.accountings.realistic``)."""

from __future__ import annotations

from memcalc.layout.plan import Plan
from memcalc.memory.accountings.realistic import HSDP, _code, _loss_note, _reduce_fp32
from memcalc.memory.accountings.scope import ATTENTION, FSDP_SHARDED, POST_NORM_FSDP, ZERO_STAGES

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
"""The realistic note under ``--fsdp-auto-wrap none`` (``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay.whole``)."""


def _moe_note(plan: Plan) -> str:
    """How the realistic accounting counts a mixture of experts (``memcalc.memory.families.saved_moe``), and where FSDP2's
    dim-0 sharding of the expert tensors leaves rank 0 more than its share."""
    arch = plan.arch
    assert arch is not None
    out = (f"MoE: each layer's {arch.experts} experts run as Hugging Face's grouped_mm experts (transformers 5's "
           f"default): every shape is T·k = {arch.top_k} x the tokens whatever the routing, so the saved pairs, "
           "their weighted copies and every expert's weight gradients are counted as they are made "
           "(memory/families/saved_moe.py, traced)")
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
    """What the realistic accounting shows and assumes: each note of ``_NOTES`` whose condition holds, in order."""
    if plan.framework == "megatron":
        from memcalc.memory.accountings import megatron

        return megatron.notes(plan)
    assert plan.arch is not None and plan.work is not None
    return [text for applies, made in _NOTES if applies(plan) for text in made(plan)]


def _accounting(plan: Plan) -> list[str]:
    """The code the step is read from, its settings, and what peak_allocated, peak_reserved and the verdict mean."""
    from memcalc.memory.allocator.allocator import GAP_FRACTION, GAP_HIGH
    from memcalc.units import GiB

    arch, w = plan.arch, plan.work
    code = "torchtitan's Llama 3" if _code(plan) == "torchtitan" else f"Hugging Face's {arch.family}"
    return [f"accounting: realistic: the peak of one training step over its timeline as {code} "
            f"code runs it ({plan.precision.name}, {_attention_shown(w.attention)} attention, {w.recompute} "
            f"recompute, {w.loss} loss, "
            f"{'DeepSpeedCPUAdam on the host' if plan.offload_optimizer != 'none' else 'AdamW ' + w.optimizer_impl}); the rows are what is alive at that moment",
            "peak_allocated is what torch.cuda.max_memory_allocated reports; peak_reserved adds the caching allocator's "
            "least measured gap (0.3 GiB) and the cached blocks the peak cannot use (the loss's freed bf16 logits, "
            "FSDP2's stream pools: memory/allocator/reserved.py), which the allocator releases before it fails; the verdict is "
            "at-risk when the margin left is under the widest gap measured "
            f"for a step of this size ({GAP_FRACTION * 100:.1f} % of the allocated peak, at most {GAP_HIGH / GiB:.1f} "
            "GiB) or the largest single request at the peak, oom when it is under 0.3 GiB"]


def _compiled_recompute(plan: Plan) -> list[str]:
    """--compile under a recompute policy: the policy's kept tensors, the eager layer's recomputed ones."""
    w = plan.work
    return [f"--compile with {w.recompute} recompute: what the policy keeps is kept, compiled or not"
            + (" (but the down projection's output, which eager SAC caches and the compiled block's backward "
               "does not read)" if w.recompute == "op-sac" else "")
            + "; the layers it recomputes and their backward are counted as the eager layer's (an upper bound: "
            "the compiled forward saves less)"]


def _deepspeed(plan: Plan) -> list[str]:
    """DeepSpeed ZeRO 0-3: the module's dtype, the states and bucket as DeepSpeed holds them, the rank shown."""
    from memcalc.memory.overlays.timeline_zero import partition, worst_rank

    arch = plan.arch
    rank = worst_rank(arch, plan.dp, plan.lora)
    what = "parameters" if plan.lora is None else "adapter parameters, the only ones DeepSpeed partitions,"
    out = [f"DeepSpeed {plan.spec.label}: the module in {plan.precision.low_dtype} saves what a pure "
           f"{plan.precision.low_dtype} model saves; the states, gradient bucket (reduce_bucket_size "
           f"{plan.reduce_bucket_size:,} elements{', two with overlap_comm' if plan.overlap_comm else ''}) and the step's fp32 gradients as DeepSpeed 0.19 holds them "
           f"(memory/overlays/timeline_zero.py, against a traced DeepSpeed step on CPU ranks); "
           + ("every rank alike under offload but for the gradient slices on their way to the host (the largest "
              "any rank holds)" if plan.offload_optimizer != "none" else
              f"data-parallel rank {rank} of {plan.dp}, whose partition overlaps the most {what} "
              f"({partition(arch, plan.dp, rank, plan.lora)[1]:,} elements)") if plan.spec.name != "zero-0" else
           f"DeepSpeed ZeRO-0: the module in {plan.precision.low_dtype}, fp32 copies of every "
           f"{'adapter parameter' if plan.lora is not None else 'parameter'}, the "
           "gradients flattened for the all-reduce and upcast for the step as DeepSpeed 0.19 holds them "
           "(memory/overlays/timeline_zero.py, against a traced DeepSpeed step on CPU ranks)"]
    if plan.offload_optimizer != "none":
        from memcalc.memory.overlays.timeline_zero import OFFLOAD_NOTE

        out.append(OFFLOAD_NOTE)
    return out


def _zero3(plan: Plan) -> list[str]:
    """DeepSpeed ZeRO-3's coordinator settings, and its offload of the optimizer or of the parameters."""
    from memcalc.memory.overlays.timeline_zero3 import NOTE

    out = [NOTE.format(dtype=plan.precision.low_dtype, bucket=plan.reduce_bucket_size, z=plan.zero3)]
    if plan.offload_optimizer != "none":
        from memcalc.memory.overlays.timeline_zero3 import OFFLOAD_NOTE

        out.append(OFFLOAD_NOTE)
    elif plan.offload_params != "none":
        from memcalc.memory.overlays.timeline_zero3 import PARAM_OFFLOAD_NOTE

        out.append(PARAM_OFFLOAD_NOTE)
    return out


def _fsdp_recompute(plan: Plan) -> list[str]:
    """FSDP under a recompute policy other than none and full, which its timeline was not traced with."""
    return [f"{plan.spec.name} with {plan.work.recompute} recompute: the policy's kept tensors (as on one GPU) under "
            "the FSDP2 timeline, which was traced with recompute none and full"]


def _float8(plan: Plan) -> list[str]:
    from memcalc.memory.accountings.paper_notes import FLOAT8_NOTE

    return [FLOAT8_NOTE]


def _fsdp_policy(plan: Plan) -> str:
    """FSDP's mixed precision policy as the notes name it."""
    return ("MixedPrecisionPolicy(param_dtype=bf16"
            + (", reduce_dtype=fp32" if _reduce_fp32(plan) else "") + ") over fp32 shards"
            if plan.precision.name == "bf16-mixed" else "no MixedPrecisionPolicy")


def _fsdp_units(plan: Plan) -> list[str]:
    """How FSDP wraps the model and keeps its units gathered: NO_WRAP, FSDP1's flat parameters or FSDP2's units."""
    policy = _fsdp_policy(plan)
    if plan.fsdp_auto_wrap == "none":
        return [WHOLE_NOTE[plan.fsdp_version].format(name=plan.spec.name, n=plan.shard_group_size,
                                                     policy=policy, tied=" (tied: one [final norm, embedding, "
                                                     "head] unit)" if plan.fsdp_wrap == "root" else "")]
    if plan.fsdp_version == 1:
        return [f"{plan.spec.name}: FSDP1 FullyShardedDataParallel, one FlatParameter per decoder layer and one "
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
                "NCCL buffers counted per communicator"]
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
    return [f"{plan.spec.name}: FSDP2 fully_shard per decoder layer and on the root over "
            f"{plan.shard_group_size} ranks (rank 0's padded shards; --fsdp-wrap {plan.fsdp_wrap}: {units}; "
            f"{gathered}; {policy}{replicas}); NCCL buffers counted per communicator"]


def _fsdp1_lora(plan: Plan) -> list[str]:
    """LoRA under FSDP1: peft's auto-wrap policy, each adapter a unit of its own."""
    return ["LoRA under FSDP1: peft's fsdp_auto_wrap_policy, which the Hugging Face Trainer applies under "
            "FSDP1 (update_fsdp_plugin_peft): each lora_A and lora_B a unit of its own, the decoder layers' "
            "and the root's flat parameters frozen (no flat gradient, no reduce-scatter; a layer resharded "
            "once its input's gradient is made)"
            + ("; under the bf16 MixedPrecision each lora_A saves a bf16 re-cast of its input of its own "
               "(peft casts the input to the weight's dtype while it is still the fp32 shard)"
               if plan.precision.name == "bf16-mixed" else "")
            + ("; BACKWARD_PRE prefetches the layer below from the layer's first adapter, late in its "
               "backward: counted from the layer's backward entry, an upper bound by at most one gathered "
               "layer" if plan.fsdp_prefetch else "")
            + " (traced against peft under FSDP1, tests/test_fsdp_layouts.py)"]


def _fsdp_offload(plan: Plan) -> list[str]:
    """FSDP1's CPUOffload or FSDP2's CPUOffloadPolicy: what lives on the host, what the GPU keeps."""
    if plan.fsdp_version == 1:
        return ["FULL_SHARD with FSDP1's CPUOffload(offload_params=True): the sharded flat parameters, the "
                "reduced gradient shards (_cpu_grad) and AdamW's moments and step in host memory; the GPU keeps "
                "the buffers, the gathered units, the flat gradients and each unit's whole shard while "
                "pre_unshard brings it over for the all-gather (read from torch 2.13's _flat_param.py and "
                "_runtime_utils.py, not traced: FSDP1 offload needs a CUDA device)"]
    return ["FULL_SHARD with CPUOffloadPolicy: the fp32 sharded parameters, the reduced gradient shards and "
            "AdamW's moments and step in host memory; the GPU keeps the buffers, the gathered units, the "
            "all-gather outputs and reduce-scatter inputs, and each parameter's fp32 shard while it is cast "
            "for the all-gather (read from torch 2.13's _fully_shard, not traced: a CPU run cannot tell the "
            "devices apart)"]


def _fsdp_post_norm(plan: Plan) -> list[str]:
    return [f"{plan.spec.name} with {plan.arch.family}'s post-norm layers in a 2-byte regime: traced 1.9-3.2 % above "
            "this peak (exact in fp32; the difference is not located yet)"]


def _fsdp_one_rank(plan: Plan) -> list[str]:
    return [f"{plan.spec.name} on one rank: counted as a world of N holds its gathered layers; a traced world of 1 "
            "holds up to one layer's parameters less (an upper bound, within 8 %)"]


def _pipeline(plan: Plan) -> list[str]:
    """The pipeline rank's schedule replayed action by action (``memcalc.memory.overlays.timeline_pp``)."""
    sched = (f"ScheduleInterleaved1F1B, {plan.virtual_stages} chunks per rank (each reduced after its own last "
             "backward)" if plan.virtual_stages > 1 else "Schedule1F1B (warm-up min(n, pp - rank) forwards)")
    return [f"pp {plan.pp}: each pipeline rank's step replayed action by action as torch.distributed.pipelining "
            f"runs it ({sched}, {plan.grad_accum} micro-batches; memory/overlays/timeline_pp.py, against a traced "
            "pipeline rank): FSDP2 inside the stage with reshard_after_forward=False and gradient sync off "
            "until perform_reduce_grad, each micro-batch in flight with its saved tensors and stage output, "
            "the receive buffers and the received inputs' gradients kept, the last stage's logits kept "
            "through the loss's backward; the most loaded rank is shown, every rank in the stage table"]


def _titan_tp(plan: Plan) -> list[str]:
    return ["torchtitan's own layers under tensor parallelism are counted as Hugging Face's Llama layers: with "
            "full recompute each keeps its checkpoint either way; the recomputed layer's transients are HF's"]


def _context_parallel(plan: Plan) -> list[str]:
    return [f"cp {plan.cp}: each rank runs the step of its s/cp = {plan.work.seq_len // plan.cp} tokens (ring "
            "attention "
            "keeps its local q, k, v, output and log-sum-exp; the K, V chunks in flight between ranks are not "
            f"counted), FSDP2 sharded over {plan.shard_group_size} ranks; derived, not traced"]


def _tensor_parallel(plan: Plan) -> list[str]:
    """DTensor tensor parallelism, with or without sequence parallelism (``memcalc.memory.overlays.timeline_tp``)."""
    return [f"tp {plan.tp}: DTensor tensor parallelism as torch's ColwiseParallel (q, k, v, gate, up) and "
            "RowwiseParallel (o, down) run it, without sequence parallelism or loss_parallel: rank 0's "
            "projections, heads and MLP width / tp, norms, embedding, head, the layers' inputs and the "
            "logits whole on every rank (memory/overlays/timeline_tp.py; exact against a traced step)"
            if not plan.sequence_parallel else
            f"tp {plan.tp} with sequence parallelism as torchtitan's plan: SequenceParallel norms, "
            "reduce-scattered o and down, all-gathered projection inputs saved whole, vocabulary-sharded "
            "embedding, head and logits under loss_parallel (memory/overlays/timeline_tp.py, against a traced step; "
            "loss_parallel's temporaries inside DTensor traced too)"]


def _lora(plan: Plan) -> list[str]:
    """LoRA as peft runs it: what is exact, what is an upper bound, what is not modelled."""
    lp = plan.lora
    out = [f"LoRA r = {lp.rank} on {','.join(lp.targets)}{' over an NF4 base (QLoRA)' if lp.quantize == 'nf4' else ''}: "
           "peft with lora_dropout=0 and enable_input_require_grads(); layer saved tensors exact against a "
           "census of a peft model on CPU; the layers' backward transients are the full model's (an upper "
           "bound)" + ("; a dequantized weight bitsandbytes' kernels may make per use (at most the largest "
                      "linear in the compute dtype) is not counted" if lp.quantize == "nf4" else "")]
    if plan.precision.name == "bf16":
        out.append("LoRA under pure bf16: adapters in bf16 (peft get_peft_model(autocast_adapter_dtype=False)); "
                   "peft's default keeps them in fp32, and each lora_A then saves an fp32 copy of its input "
                   "(a Llama layer saves 1.77x as much, measured on CPU): not modelled")
    if plan.dp > 1:
        from memcalc.memory.accountings.paper_notes import LORA_COMM_NOTE

        out.append(LORA_COMM_NOTE)
    return out


def _fp16(plan: Plan) -> list[str]:
    return ["amp-fp16 saves what amp-bf16 does (2-byte casts); the GradScaler's few bytes are left out"]


def _sharded(plan: Plan) -> bool:
    return plan.spec.name in FSDP_SHARDED


_NOTES = (  # (applies, made): the notes in the order they are shown
    (lambda plan: True, _accounting),
    (lambda plan: plan.work.compile and plan.work.loss != "fused", lambda plan: [_loss_note(plan)]),
    (lambda plan: plan.arch.moe, lambda plan: [_moe_note(plan)]),
    (lambda plan: plan.work.compile and plan.work.recompute != "none", _compiled_recompute),
    (lambda plan: plan.spec.name in ZERO_STAGES, _deepspeed),
    (lambda plan: plan.spec.name == "zero-3", _zero3),
    (lambda plan: _sharded(plan) and plan.work.recompute not in ("none", "full"), _fsdp_recompute),
    (lambda plan: plan.float8 != "none", _float8),
    (_sharded, _fsdp_units),
    (lambda plan: _sharded(plan) and plan.fsdp_version == 1 and plan.lora is not None, _fsdp1_lora),
    (lambda plan: _sharded(plan) and plan.offload_params != "none", _fsdp_offload),
    (lambda plan: _sharded(plan) and plan.arch.family in POST_NORM_FSDP and plan.precision.name != "fp32",
     _fsdp_post_norm),
    (lambda plan: _sharded(plan) and plan.shard_group_size == 1, _fsdp_one_rank),
    (lambda plan: plan.pp > 1, _pipeline),
    (lambda plan: plan.tp > 1 and plan.framework == "torchtitan", _titan_tp),
    (lambda plan: plan.cp > 1, _context_parallel),
    (lambda plan: plan.tp > 1, _tensor_parallel),
    (lambda plan: plan.lora is not None, _lora),
    (lambda plan: plan.precision.name == "amp-fp16", _fp16),
)
"""The realistic accounting's notes in order: each made when its condition holds."""
