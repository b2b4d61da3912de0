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

from typing import Any, NamedTuple

from memcalc.layout.plan import Plan
from memcalc.memory.rows import Row

from memcalc.memory.scope import ATTENTION, FSDP_SHARDED, OPTIMIZER_STATES, POST_NORM_FSDP, REGIME, ZERO_STAGES


class Realistic(NamedTuple):
    rows: list[Row]
    """The parts alive at the peak moment, then the allocator's, the context's and NCCL's."""
    peak_allocated: int
    peak_reserved: int
    total: int
    verdict: str
    margin: int
    peak_phase: str
    peak_moment: str
    phases: dict[str, int]
    """Each phase's own peak of allocated bytes (layers folded into forward and backward)."""


_KEYS = {"parameters": ("parameters", "model_state"),
         "parameters (frozen base)": ("parameters_frozen", "model_state"),
         "parameters (frozen base, nf4)": ("parameters_frozen", "model_state"),
         "parameters (LoRA adapters)": ("parameters_adapters", "model_state"), "optimizer states": ("optimizer_moments", "model_state"),
         "gradients": ("gradients", "model_state"),
         "parameters (bf16 flat buffer)": ("parameters", "model_state"), "parameters (bf16)": ("parameters", "model_state"),
         "fp32 master partition": ("master_weights", "model_state"),
         "fp32 copies of the parameters": ("master_weights", "model_state"),
         "optimizer states (fp32 moments)": ("optimizer_moments", "model_state"),
         "gradient bucket (reduce_bucket_size)": ("gradient_buckets", "model_state"),
         "gradient staging buffer (temp_grad_buffer_for_gpu_offload)": ("gradient_staging", "model_state"),
         "fp32 shard copied in for the all-gather": ("parameters_staging", "model_state"),
         "gradients not yet reduced": ("gradients", "model_state"),
         "gradients on their way to the host": ("gradients_to_host", "model_state"),
         "gradients not yet reduced or on their way to the host": ("gradients", "model_state"),
         "gradient partition (grads_in_partition)": ("gradients", "model_state"),
         "gradient partition (averaged_gradients)": ("gradients", "model_state"),
         "gradients (bf16)": ("gradients", "model_state"), "parameters (bf16 partitions)": ("parameters", "model_state"),
         "fp32 master partitions": ("master_weights", "model_state"),
         "gradient partitions (bf16)": ("gradients", "model_state"),
         "persistent parameters (whole)": ("parameters_persistent", "model_state"),
         "gathered parameters": ("gathered_parameters", "model_state"),
         "parameters (fp32 shards)": ("parameters", "model_state"), "parameters (shards)": ("parameters", "model_state"),
         "parameters (gathered)": ("gathered_parameters", "model_state"),
         "gradient accumulators (unsharded)": ("gradients", "model_state"),
         "layer's new gradients (before its post-backward)": ("gradients_new", "model_state"),
         "reduce-scatter input (one unit)": ("gradient_buckets", "model_state"),
         "cuBLAS workspaces (forward, backward threads)":
         ("cublas_workspace", "overhead")}


_SAVED = ("layer activations", "what the decoder layers save for backward (memory/saved.py: exact on CPU)")

_DETAIL = (
    ("the whole vocabulary (Replicate", "sequence parallelism: the row-parallel embedding's backward makes the whole "
                                        "vocabulary's gradient on every tensor-parallel rank (DTensor's "
                                        "embedding_dense_backward strategies), until FSDP2 redistributes it"),
    ("copy of this rank's rows", "sequence parallelism: FSDP2's post-backward redistributes the embedding's whole "
                                 "gradient to the parameter's Shard(0), a copy of this rank's rows "
                                 "(FSDPParam._get_grad_inner_tensor); before it, the output gradient all-gathered"),
    ("down projection's gradients", "sequence parallelism: the down projection's backward, its output gradient "
                                    "all-gathered over the whole sequence (RowwiseParallel's Shard(1) output), its "
                                    "input and weight gradients beside it (memory/timeline_layers.py)"),
    ("master", "DeepSpeed's fp32 copy the optimizer updates (this rank's partition)"),
    ("bf16 partitions", "ZeRO-3: this rank's slice of every parameter, ceil(n / dp) elements each (partition_parameters.py)"),
    ("persistent", "ZeRO-3: parameters of at most stage3_param_persistence_threshold elements, whole on every rank"),
    ("root parameters (gathered)", "FSDP2: the root's (embedding, final norm, head) unsharded parameters, gathered at "
                                   "the forward's start until its post-backward (_fsdp_state.py)"),
    ("layer's parameters (gathered)", "FSDP2: the unit's unsharded parameters, from its all-gather's copy-out to its "
                                      "reshard (_fsdp_param_group.py)"),
    ("all-gather output", "FSDP2: a unit's flat all-gather output, alive until the next gather's copy-out "
                          "(_fsdp_collectives.py foreach_all_gather)"),
    ("reduce-scatter input", "FSDP2: a unit's flat reduce-scatter input, alive until the next reduce-scatter "
                             "(_fsdp_collectives.py foreach_reduce)"),
    ("float8 backward casts", "torchao Float8Linear, eager: the down projection's backward casts, 9 bytes per element "
                              "being cast beside the fp8 copies (model/float8.py eager_backward)"),
    ("gradient accumulators", "pipelining with FSDP2: the stage's unsharded gradients in the reduce dtype, from its "
                              "first backward to perform_reduce_grad (FSDPParam.to_accumulated_grad_if_needed; "
                              "stage.py backward_maybe_with_nosync)"),
    ("head parameters (gathered)", ("FSDP2: the final norm's and the head's unit of their own, gathered from its "
                                    "forward to its post-backward (separate-reshard: regathered for its backward)")),
    ("embedding parameters (gathered)", ("FSDP2: the embedding's unit of its own, gathered for its forward and "
                                         "again for its backward")),
    # before "layers 0..": a backward moment's "layer activations (layers 0..i)" are the saved activations
    _SAVED,
    ("layers 0..", ("FSDP2 with reshard_after_forward=False (SHARD_GRAD_OP): each layer kept gathered from its "
                    "forward to its post-backward")),
    ("parameters (gathered)", "pipelining with FSDP2: every unit of the stage kept gathered from its first forward to "
                              "perform_reduce_grad (reshard_after_forward=False, set_reshard_after_backward(False))"),
    ("micro-batches in flight", "pipelining: what the layers of each micro-batch in flight save, and its stage output "
                                "(stage.py fwd_cache), for the schedule's micro-batches before their backward"),
    ("input gradient being sent", "pipelining, 1F1B: the previous backward's input gradient, held by its send ops "
                                  "through the next backward (schedules.py bwd_sends)"),
    ("receive buffers", "pipelining: one input per micro-batch and one output gradient per micro-batch, made by the "
                        "first step and kept (stage.py _setup_forward_recv_info, _create_grad_recv_info)"),
    ("kept by fwd_cache", "pipelining's last stage: the micro-batch's logits, referenced by fwd_cache until its "
                          "backward returns"),
    ("head's new gradients", "pipelining's last stage with fp32 accumulators: the head's and the final norm's "
                             "gradients in the compute dtype, held by the stage's root unit until its post-backward "
                             "after the stage's last layer (FSDPParam.to_accumulated_grad_if_needed)"),
    ("input ids and labels", "pipelining: the step's token ids, every micro-batch's, on the first stage (inputs) and "
                             "the last (labels); the schedule splits them into views"),
    ("new gradients", "the layer's weight gradients in the compute dtype until its post-backward adds them to the "
                      "accumulators"),
    ("all-gathered", "DTensor tensor parallelism: a tensor all-gathered over the tensor-parallel ranks, whole on "
                     "every rank (memory/timeline_tp.py)"),
    ("gathered", "ZeRO-3: what the coordinator holds gathered at this moment, replayed hook by hook (memory/zero3.py)"),
    ("gradient partitions", "ZeRO-3: this rank's reduced gradients, one flat buffer allocated once (stage3.py)"),
    ("flat buffer", "DeepSpeed's flat bf16 buffer of the parameters that train (all, or the LoRA adapters), padded to "
                    "2 x dp (stage_1_and_2.py)"),
    ("fp32 moments", "AdamW's exp_avg and exp_avg_sq in fp32 (this rank's partition)"),
    ("fp32 copies", "DeepSpeed ZeRO-0: an fp32 copy of every parameter for the optimizer"),
    ("gradient bucket", "reduce_bucket_size elements in the training dtype (ZeRO-1/2: from the first gradient hook; "
                        "ZeRO-3: allocated once)"),
    ("copied in for the all-gather", "FSDP2 CPUOffloadPolicy: a parameter's fp32 shard on the GPU before its bf16 "
                                     "cast (_fsdp_param.py all_gather_inputs), the largest layer's, one at a time"),
    ("copied to the GPU", "FSDP1 CPUOffload: a unit's whole sharded flat parameter brought to the GPU before its "
                          "all-gather (_flat_param.py pre_unshard: _use_low_precision_shard, or flat_param_to)"),
    ("staging buffer", "ZeRO-1/2 offload: temp_grad_buffer_for_gpu_offload, bf16, the largest parameter's elements "
                       "(stage_1_and_2.py)"),
    ("not yet reduced", "offload: gradients waiting for their bucket's reduction (one larger than the bucket cloned "
                        "into a tensor of its own), and the rank's slices on their way to the host: an fp64 copy for "
                        "the norm, then an fp32 one, one slice at a time (stage_1_and_2.py)"),
    ("way to the host", "offload: the rank's reduced gradient slices on their way to the host: an fp64 copy for the "
                        "norm, then an fp32 one, one slice at a time (stage_1_and_2.py)"),
    ("bucket's reduction", "ZeRO-3: gradients not yet in the bucket and its padded copy for the reduce-scatter"),
    ("gradient partition", "this rank's reduced gradients: every parameter overlapping its partition (stage_1_and_2.py)"),
    ("gradients (unsharded)", "FSDP: a unit's gradients as autograd made them, unsharded until its post-backward "
                              "reduce-scatters them"),
    ("unsharded gradients", "FSDP: the unit's gradients as autograd made them, until its post-backward has copied "
                            "them into the reduce-scatter input"),
    ("gradient shards", "FSDP: the reduce-scattered gradient shards of the units whose backward is done (the "
                        "sharded parameters' dtype)"),
    ("gradients (shards)", "FSDP: this rank's reduce-scattered gradient shards, freed by zero_grad(set_to_none=True)"),
    ("all-reduce buffers", "HSDP: the reduced shards' all-reduce across replicas, in the reduce dtype until it is done"),
    ("parameters (fp32 shards)", "FSDP2: this rank's shard of every parameter, the optimizer's copy (fp32; "
                                 "MixedPrecisionPolicy casts for the all-gather)"),
    ("backward transient", "the layer's backward at its highest moment: the MLP's input gradients and the tensors "
                           "not yet freed (memory/saved.py backward_extra)"),
    ("RMSNorm backward", "the second RMSNorm's backward: its fp32 upcast and input gradient, net of what the MLP's "
                         "backward has freed (memory/saved.py)"),
    ("recomputed activations", "full recompute: the layer's forward run again at its backward, its saved tensors "
                               "alive until used (Korthikanti et al. 2022 §5)"),
    ("gradient of the residual stream", "the gradient flowing down the residual stream, s·b·h in the compute dtype"),
    ("(residual stream)", "a layer's output on the residual stream (the next layer's input), s·b·h in the compute "
                          "dtype"),
    ("step temporaries", "optimizer.step()'s own temporaries (foreach AdamW: sqrt(v) for the group; for-loop: one "
                         "tensor's; fused: none; memory/timeline_states.py)"),
    ("flattened partition", "DeepSpeed ZeRO-1/2 step: the rank's flattened gradient partition before its fp32 upcast "
                            "(stage_1_and_2.py)"),
    ("input ids", "the batch's token ids, 8 bytes per token"),
    ("position ids", "the batch's position ids, 8 bytes per position"),
    ("labels", "the batch's labels (and their shifted copy), 8 bytes per token"),
    ("rotary cos, sin", "the rotary embedding's cos and sin for the batch, made once per forward and read by every "
                        "layer"),
    ("final norm saved", "what the final norm saves for backward (its rstd, and its fp32 normalized input where the "
                         "norm keeps one: memory/timeline.py)"),
    ("(bf16 cast)", "autocast's bf16 copy, cached until the autocast block exits"),
    ("head input gradient", "the gradient of the head's input, on its way to the final norm's backward"),
    ("head input", "the output head's saved input (the final norm's output)"),
    ("last hidden state", "the model's output hidden state, referenced by the output object until the step ends"),
    ("fp32 logits copy", "the loss's fp32 upcast of the logits (Hugging Face's loss_function: logits.float())"),
    ("logits gradient", "the loss's gradient with respect to the logits, s·b·v"),
    ("logits (fp32)", "the loss's fp32 logits, 4 bytes per logit element"),
    ("logits", "the output head's logits, s·b·v in the compute dtype"),
    ("loss, total weight", "the loss and its reduction's total weight (scalars)"),
    ("log-softmax's per-token", "loss_parallel's _log_softmax: the max, the sum of exponentials and their log per "
                                "token, all-reduced over the tensor-parallel ranks (torch distributed/tensor/parallel/"
                                "loss.py)"),
    ("loss and its gradient", "the scalar loss and its gradient"),
    ("micro-batch's saved tensors", "pipelining: what this micro-batch's layers save for backward, at its forward"),
    ("buffers", "the model's registered buffers (the rotary inv_freq and the like)"),
    ("frozen base, nf4", "bitsandbytes NF4, double quantization (model/lora.py nf4_bytes); the rest in the weight dtype"),
    ("frozen base", "the frozen weights: no gradients, no optimizer states"),
    ("LoRA adapters", "A (r x in) and B (out x r) of each target; their gradients and AdamW states are the only ones"),
    ("parameters", "the weights, alive all step (fp32 under autocast)"),
    ("optimizer states", "AdamW's moments (and 8-bit statistics), alive all step"),
    ("loss gradients", "log-softmax backward: its fp32 output and input gradients, 8 bytes per logit element"),
    ("gradients", "accumulated during backward, freed by zero_grad(set_to_none=True)"),
    ("cuBLAS", "one 32 MiB workspace per thread that runs matmuls (CublasHandlePool.cpp)"),
    ("log-softmax", "cross_entropy's saved fp32 log-softmax: 4 bytes per logit element"),
    ("cast", "autocast's bf16 copy, cached until the autocast block exits"),
)


_FSDP1_DETAIL = (
    _SAVED,  # before "layers 0..", as in _DETAIL
    ("root parameters (gathered)", "FSDP1: the root's FlatParameter (embedding, final norm, head) unsharded and "
                                   "padded, from the forward's start to the root's post-backward (the root is not "
                                   "resharded after forward: _runtime_utils.py _post_forward_reshard)"),
    ("layer's parameters (gathered)", "FSDP1: the unit's padded FlatParameter, all-gathered in place "
                                      "(_flat_param.py _full_param_padded) until its reshard"),
    ("prefetched", "FSDP1 BACKWARD_PRE: the next unit's padded FlatParameter, all-gathered ahead at a pre-backward "
                   "(_runtime_utils.py _prefetch_handle) until its own reshard"),
    ("all-gather output", "FSDP1: a unit's padded FlatParameter, all-gathered in place (_flat_param.py "
                          "_full_param_padded; no separate output buffer)"),
    ("layers 0..", "FSDP1 SHARD_GRAD_OP: each unit's FlatParameter kept unsharded from its forward to its "
                   "post-backward (not resharded after forward)"),
    ("flat gradient", "FSDP1: the unit's padded flat gradient, the reduce-scatter's input (_runtime_utils.py "
                      "_reduce_grad), freed once the reduce-scatter is done"),
    ("low-precision shard", "FSDP1 MixedPrecision: the shard cast to param_dtype for the all-gather "
                            "(_flat_param.py _use_low_precision_shard), freed once the all-gather is done"),
    ("input norm's backward", "FSDP1: the post-backward hook fires on the FlatParameter's last gradient (the input "
                              "norm's weight), inside that norm's backward, with its input-side gradient alive"),
)
"""FSDP1's own wording for rows whose names FSDP2's timeline shares (checked before ``_DETAIL``)."""


def _row(name: str, n_bytes: int, plan: Plan) -> Row:
    key, category = _KEYS.get(name, ("activations_" + "_".join(name.split()[:3]).lower(), "activation"))
    fsdp1 = plan.spec.framework == "fsdp" and plan.fsdp_version == 1
    details = (_FSDP1_DETAIL + _DETAIL) if fsdp1 else _DETAIL
    detail = next((d for k, d in details if k in name), "alive at the step's peak (memory/timeline.py)")
    return Row(key, name, n_bytes, "gpu", category, detail)


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


def evaluate(plan: Plan, stage: int = 0) -> Realistic:
    """The realistic peak of one GPU for ``plan`` (which ``memcalc.memory.scope.why_not`` accepts); under pipeline
    parallelism, of pipeline rank ``stage``."""
    from memcalc.memory.timeline import timeline

    arch, w, p = plan.arch, plan.work, plan.precision
    assert arch is not None and w is not None
    if plan.pp > 1:
        return _pipeline_rank(plan, stage)
    if w.dropout != arch.dropout:  # --dropout in force over the model's: what the layers' dropout masks follow
        import dataclasses

        arch = dataclasses.replace(arch, dropout=w.dropout)
    if plan.spec.name in ZERO_STAGES:
        from memcalc.memory.timeline_zero import zero_timeline, worst_rank

        tl = zero_timeline(arch, family=arch.family or "", stage=int(plan.spec.name[-1]), dp=plan.dp,
                           attention=ATTENTION[w.attention], s=w.seq_len, b=w.micro_batch, recompute=w.recompute,
                           optimizer_impl=w.optimizer_impl, loss=w.loss, device=w.device,
                           bucket=plan.reduce_bucket_size, rank=worst_rank(arch, plan.dp, plan.lora), use_cache=False,
                           overlap_comm=plan.overlap_comm, offload=plan.offload_optimizer != "none", lora=plan.lora,
                           precision="fp32" if p.name == "fp32" else "bf16")
        return _finish(plan, tl, tl.peak.live_bytes, 0, comm_groups=int(plan.dp > 1))
    if plan.spec.name == "zero-3":
        from memcalc.memory.timeline_zero3 import zero3_timeline

        tl = zero3_timeline(arch, family=arch.family or "", dp=plan.dp, attention=ATTENTION[w.attention], s=w.seq_len,
                            b=w.micro_batch, recompute=w.recompute, optimizer_impl=w.optimizer_impl, loss=w.loss,
                            device=w.device, bucket=plan.reduce_bucket_size, settings=plan.zero3, use_cache=False,
                            offload_optimizer=plan.offload_optimizer != "none",
                            offload_params=plan.offload_params != "none", lora=plan.lora,
                            sub_group_size=plan.zero3.sub_group_size,
                            precision="fp32" if p.name == "fp32" else "bf16")
        return _finish(plan, tl, tl.peak.live_bytes, 0, comm_groups=int(plan.dp > 1))
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
                  fsdp_whole=whole)
    if sharded and plan.offload_params != "none":
        from memcalc.memory.timeline import _moment, with_loss
        from memcalc.memory.timeline_states import offload_fsdp, offload_fsdp1

        if plan.fsdp_version == 1:
            width = 2 if regime == "bf16" else 4
            moved = offload_fsdp1(tl.moments, arch, plan.shard_group_size, width, 2 if policy else width)
        else:
            moved = offload_fsdp(tl.moments, arch, plan.shard_group_size)
        tl = with_loss(tl, [_moment(*m) for m in moved])
    allocated = tl.peak.live_bytes
    extra = 0
    if plan.dp > 1 and not plan.bucket_view and not sharded:
        # torch DDP (torch/nn/parallel/distributed.py): gradient buckets are a second copy of the gradients, made at
        # construction and alive for the whole run (gradient_as_bucket_view=False, the default).
        extra = sum(n for name, n in tl.peak.parts if name in ("parameters", "parameters (LoRA adapters)"))
    # NCCL: one communicator for DDP's ring (FSDP: the data-parallel group's, not measured). Under tensor parallelism
    # the tensor-parallel group is one more communicator (its all-reduces).
    hsdp = plan.spec.name in HSDP and plan.dp > plan.shard_group_size  # a second communicator: the replicas'
    return _finish(plan, tl, allocated, extra, comm_groups=(plan.dp > 1) + (plan.tp > 1) + hsdp)


def _pipeline_rank(plan: Plan, stage: int) -> Realistic:
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
                        fsdp_param_dtype=policy, fsdp_reduce_fp32=_reduce_fp32(plan))  # fmt: skip
    # communicators: the data-parallel (shard) group's, the tensor-parallel group's, the pipeline's
    return _finish(plan, tl, tl.peak.live_bytes, 0, comm_groups=(plan.shard_group_size > 1) + (plan.tp > 1) + 1)


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
    rows = [_row(name, n, plan) for name, n in peak.parts]
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
"""The realistic note under ``--fsdp-auto-wrap none`` (``memcalc.memory.timeline_states.FsdpOverlay.whole``)."""


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
