"""The rows of the realistic accounting's peak: each part of the peak moment as a ``Row`` of the breakdown, its key,
category and the detail that says what it is and where it comes from (``memcalc.memory.accountings.realistic``)."""

from __future__ import annotations

from functools import lru_cache

from memcalc.memory.accountings.rows import Row

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


_SAVED = ("layer activations", "what the decoder layers save for backward (memory/families/saved.py: exact on CPU)")

_DETAIL = (
    ("the whole vocabulary (Replicate", "sequence parallelism: the row-parallel embedding's backward makes the whole "
                                        "vocabulary's gradient on every tensor-parallel rank (DTensor's "
                                        "embedding_dense_backward strategies), until FSDP2 redistributes it"),
    ("copy of this rank's rows", "sequence parallelism: FSDP2's post-backward redistributes the embedding's whole "
                                 "gradient to the parameter's Shard(0), a copy of this rank's rows "
                                 "(FSDPParam._get_grad_inner_tensor); before it, the output gradient all-gathered"),
    ("down projection's gradients", "sequence parallelism: the down projection's backward, its output gradient "
                                    "all-gathered over the whole sequence (RowwiseParallel's Shard(1) output), its "
                                    "input and weight gradients beside it (memory/engine/timeline_layers.py)"),
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
                     "every rank (memory/overlays/timeline_tp.py)"),
    ("gathered", "ZeRO-3: what the coordinator holds gathered at this moment, replayed hook by hook (memory/overlays/zero3.py)"),
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
                           "not yet freed (memory/families/saved.py backward_extra)"),
    ("RMSNorm backward", "the second RMSNorm's backward: its fp32 upcast and input gradient, net of what the MLP's "
                         "backward has freed (memory/families/saved.py)"),
    ("recomputed activations", "full recompute: the layer's forward run again at its backward, its saved tensors "
                               "alive until used (Korthikanti et al. 2022 §5)"),
    ("gradient of the residual stream", "the gradient flowing down the residual stream, s·b·h in the compute dtype"),
    ("(residual stream)", "a layer's output on the residual stream (the next layer's input), s·b·h in the compute "
                          "dtype"),
    ("step temporaries", "optimizer.step()'s own temporaries (foreach AdamW: sqrt(v) for the group; for-loop: one "
                         "tensor's; fused: none; memory/engine/timeline_states.py)"),
    ("flattened partition", "DeepSpeed ZeRO-1/2 step: the rank's flattened gradient partition before its fp32 upcast "
                            "(stage_1_and_2.py)"),
    ("input ids", "the batch's token ids, 8 bytes per token"),
    ("position ids", "the batch's position ids, 8 bytes per position"),
    ("labels", "the batch's labels (and their shifted copy), 8 bytes per token"),
    ("rotary cos, sin", "the rotary embedding's cos and sin for the batch, made once per forward and read by every "
                        "layer"),
    ("final norm saved", "what the final norm saves for backward (its rstd, and its fp32 normalized input where the "
                         "norm keeps one: memory/engine/timeline.py)"),
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


def part_row(name: str, n_bytes: int, fsdp1: bool) -> Row:
    """The row of a part of ``n_bytes`` named ``name`` (``fsdp1``: FSDP1's wording where it has its own)."""
    key, category, detail = _row_words(name, fsdp1)
    return Row(key, name, n_bytes, "gpu", category, detail)


@lru_cache(maxsize=1024)
def _row_words(name: str, fsdp1: bool) -> tuple[str, str, str]:
    """A part's row key, category and detail (FSDP1's wording first where it has its own): the same for every plan."""
    key, category = _KEYS.get(name, ("activations_" + "_".join(name.split()[:3]).lower(), "activation"))
    details = (_FSDP1_DETAIL + _DETAIL) if fsdp1 else _DETAIL
    return key, category, next((d for k, d in details if k in name), "alive at the step's peak (memory/engine/timeline.py)")


__all__ = ["part_row"]
