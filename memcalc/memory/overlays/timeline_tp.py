"""Tensor parallelism in the step timeline: what rank 0 of a DTensor TP group holds, as the tracer's plan shards it.

The plan (``memcalc.validation.trace_parallel``, torchtitan ``models/llama3/infra/parallelize.py: apply_tp`` without
its sequence-parallel and ``loss_parallel`` parts): in every decoder layer q, k, v, gate, up are ``ColwiseParallel``
(weight ``Shard(0)``, input ``Replicate``, output ``Shard(-1)`` handed on as the local tensor) and o, down are
``RowwiseParallel`` (weight ``Shard(1)``, input ``Shard(-1)``, output ``Replicate`` after an all-reduce of the
partial sums); norms, the embedding and the head are not parallelised (whole on every rank) and Hugging Face's loss
runs outside ``loss_parallel`` (full tokens × vocabulary logits on every rank). Sources: torch
``distributed/tensor/parallel/style.py`` (``ColwiseParallel``, ``RowwiseParallel``), ``distributed/tensor/_ops``
(sharding propagation of ``mm``, element-wise ops and SDPA over heads), ``distributed/_functional_collectives.py``.

What that makes per rank (t = tp), each rule derived from the plan and checked against the tracer
(tests/test_timeline_tp.py):
- Parameters, gradients, AdamW moments: q, k, v, gate, up rows ÷ t, o, down columns ÷ t (``Shard`` chunks like
  ``torch.chunk``: rank 0 holds ceil(n / t) rows); norms, embedding, head whole. Rank 0's layer is the layer of a
  model with heads / t query heads, kv_heads / t KV heads (same head_dim) and ceil(ffn / t) MLP width, and the same
  hidden size, vocabulary and norms: ``rank_arch``.
- Saved activations: Q, K, V, the attention output and log-sum-exp (heads ÷ t), the MLP intermediates (ffn ÷ t),
  autocast's weight casts (the local shards) are ÷ t; the norms' tensors and the projections' input are whole
  (``ColwiseParallel`` wraps the replicated input with ``DTensor.from_local`` without a copy and ``mm`` saves it:
  DOMAIN §10, the full-sequence input): exactly ``memcalc.memory.families.saved.layer_saved`` on ``rank_arch``.
- Logits and the loss: whole (no ``loss_parallel``); the embedding output and the residual stream: whole.
- Collectives: the row-parallel output all-reduce (``_c10d_functional.all_reduce`` writes a new tensor beside its
  partial-sum input) and, in backward, the all-reduce of each column-parallel input gradient. Under autocast the
  layer's norm output (fp32, not saved: each projection saved its own bf16 cast) is still alive while the MLP's
  all-reduce runs inside ``down_proj``'s output hook (``row_parallel_reduce``). The backward all-reduces sit below
  the layer's backward peak and are not a moment of their own.
- AdamW foreach: without FSDP the tracer gives DTensor and plain parameters their own groups (the multi-tensor
  kernels take one kind per list); the ``sqrt(v)`` temporaries live for one group at a time (``step_temporary``).
- Once the MLP is ÷ t, the RMSNorm backward (fp32 arithmetic) can set the layer's backward peak: ``norm_backward``
  (the final norm's: ``rmsnorm_backward``); eager attention's softmax backward keeps the residual stream's gradient
  whole and o's weight gradient and input per rank (``memcalc.memory.engine.timeline_layers.layer_sizes``).
- FSDP2 over the data-parallel ranks (world = dp × t): ``fully_shard`` chunks each TP-local tensor on dim 0 over dp
  (torch ``distributed/fsdp/_fully_shard/_fsdp_param.py``: the local tensor of a TP ``DTensor`` is what is sharded;
  ``_StridedShard`` names the placement), so ``FsdpOverlay`` on ``rank_arch`` with ``world = dp`` is rank 0's.
"""

from __future__ import annotations

import dataclasses

from memcalc.errors import InputError
from memcalc.memory.families.saved import LLAMA_LIKE, layer_saved
from memcalc.memory.families.saved_moe import moe_params
from memcalc.memory.engine.timeline_states import param_tensors
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture

TP_FAMILIES = (*LLAMA_LIKE, "qwen3", "granite", "smollm3")
"""Families whose layers the tracer's TP plan parallelises (q/k/v/o, gate/up/down projections)."""


@per_architecture
def rank_arch(arch: Architecture, tp: int, family: str) -> Architecture:
    """Rank 0's shapes under the TP plan: heads / t, kv_heads / t, ceil(ffn / t); hidden, vocab, norms whole.

    torch ``distributed/tensor/_utils.py`` (``compute_local_shape_and_global_offset``, chunked like ``torch.chunk``):
    an uneven ffn leaves rank 0 ceil(ffn / t) rows. Heads must divide (DTensor shards whole heads: the attention
    reshapes the local projection to (-1, head_dim))."""
    if tp < 1:
        raise InputError(f"tp {tp} must be at least 1")
    if tp == 1:
        return arch
    if family not in TP_FAMILIES or arch.moe:
        raise InputError(f"tensor parallelism is modelled for {', '.join(TP_FAMILIES)} dense layers; got {family}")
    if arch.heads % tp or arch.n_kv % tp:
        raise InputError(f"tp({tp}) must divide heads({arch.heads}) and kv_heads({arch.n_kv}); DTensor shards "
                         "whole heads")  # fmt: skip
    if arch.fused_qkv or not arch.gated_mlp:
        raise InputError("tensor parallelism is modelled for separate q, k, v and gate, up, down projections")
    return arch.replace(heads=arch.heads // tp, kv_heads=arch.n_kv // tp, head_dim=arch.d_head,
                        ffn=-(-arch.ffn_size // tp))  # fmt: skip


def step_temporary(local: Architecture, width: int, impl: str) -> int | None:
    """AdamW foreach's ``sqrt(v)`` temporaries under TP without FSDP: one list per parameter group, the groups
    stepped one after the other (torch ``optim/adamw.py`` ``_multi_tensor_adam`` runs per group), so the largest
    group's: the layers' sharded projections (DTensor) or the whole embedding, norms and head (plain tensors;
    ``memcalc.validation.trace_step.build_optimizer``). None: not foreach (the single-GPU rule holds)."""
    if impl != "foreach":
        return None
    sharded = plain = 0
    for name, n in param_tensors(local):
        if name.startswith("layer ") and " norm" not in name:  # norms (Qwen3's q_norm, k_norm too) stay plain
            sharded += n
        else:
            plain += n
    return width * max(sharded, plain)


def row_parallel_reduce(d: int, r: int, t: int, h: int, amp: bool) -> list[tuple[str, int]]:
    """The MLP's ``RowwiseParallel`` output: the partial sums (compute dtype) and the all-reduce's new output,
    alive together (``_c10d_functional.all_reduce`` clones its input, torch ``csrc/distributed/c10d/Functional.cpp``);
    under autocast the fp32 norm output that fed the MLP is still referenced by the decoder layer
    (``hidden_states = self.mlp(hidden_states)`` has not returned). Replaces the single-GPU moment's down output
    and layer output (the residual add comes after the partial sums are freed)."""
    out = [("row-parallel partial sums (down)", d * t * h), ("all-reduce output (down)", d * t * h)]
    if amp:
        out.append(("MLP input (norm output, fp32)", r * t * h))
    return out


NORM2_FREED = ("gate", "up", "MLP weights", "norm 2 normalized", "MoE")
"""Saved tensors of a Llama-style layer gone by its second RMSNorm's backward: the MLP's (its inputs or their bf16
casts, the intermediates, autocast's weight casts; an MoE block's, ``memcalc.memory.families.saved_moe``) and the normalized
tensor the norm's weight product kept."""


@per_architecture
def norm_backward(arch: Architecture, *, family: str, regime: str, attention: str, s: int, b: int, device: str,
                  rotary_dims: int | None, grad_width: int, sp: int = 1) -> int:  # fmt: skip
    """Bytes above a Llama-style layer's backward entry at its second RMSNorm's backward peak (transformers
    ``LlamaRMSNorm.forward`` in fp32 arithmetic; torch tools/autograd/derivatives.yaml), traced op by op:

    the weight product's backward frees the normalized tensor and the incoming gradient, then ``mean``'s backward
    (``div``: the expanded gradient) and ``pow``'s (``pow``, ``mul`` by 2, ``mul`` by the gradient) are four fp32
    T·h tensors alive with the gradient through ``rsqrt`` (a fifth): 5 × 4·T·h; rstd (4T) is freed by then and the
    norm weight's gradient (h, ``grad_width`` bytes) made. The MLP's saved tensors (``NORM2_FREED``) are freed and
    its three weight gradients made. ``arch``: the shapes per rank (``rank_arch``); ``sp``: sequence parallelism
    (the norm's tensors and arithmetic over the rank's 1/sp of the sequence, ``sp_split``)."""
    saved = layer_saved(arch, family=family, regime=regime, attention=attention, s=s, b=b, device=device,
                        rotary_dims=rotary_dims)  # fmt: skip
    saved = sp_split(saved, sp) if sp > 1 else saved
    t, h = s * b // sp, arch.hidden
    freed = sum(x.bytes for x in saved if x.name.startswith(NORM2_FREED))
    mlp = moe_params(arch) if arch.moe else 3 * h * arch.ffn_size  # the MLP's (or the MoE block's) weight gradients
    return rmsnorm_backward(t, h) + grad_width * h - freed + grad_width * mlp


def rmsnorm_backward(t: int, h: int) -> int:
    """The fp32 transient of ``LlamaRMSNorm``'s backward beyond its incoming gradient and saved tensors: five fp32
    T·h tensors (``norm_backward``) less rstd (4T), freed by then."""
    return 5 * 4 * t * h - 4 * t


SP_SPLIT = ("norm ",)
"""Saved tensors of a Llama-style layer that sequence parallelism splits along the sequence: the RMSNorms' (their
fp32 input or copy, rstd, normalized tensor). The projections' inputs are the all-gathered (Replicate) tensors,
saved whole (``memcalc.memory.accountings.activations.DTENSOR_GATHERED``); Q, K, V, attention and MLP intermediates stay
÷ t over heads and ffn, full sequence."""


@per_architecture
def sp_rank_arch(arch: Architecture, tp: int, family: str) -> Architecture:
    """Rank 0's shapes under torchtitan's sequence-parallel plan: ``rank_arch`` plus the embedding
    (``RowwiseParallel``: weight ``Shard(0)``) and the head (``ColwiseParallel``: weight ``Shard(0)``) split over the
    vocabulary, ceil(V / t) rows on rank 0 (torch ``distributed/tensor/_utils.py``, chunked like ``torch.chunk``);
    the logits under ``loss_parallel`` are that slice of the vocabulary. Tied embeddings are not modelled."""
    if arch.tied_embeddings:
        raise InputError("sequence parallelism is modelled for untied embeddings (torchtitan's Llama); got tied")
    local = rank_arch(arch, tp, family)
    return local.replace(vocab=-(-arch.padded_vocab // tp), vocab_multiple=1)


def sp_split(saved: list, sp: int) -> list:
    """A layer's saved tensors as rank 0 of ``sp`` sequence-parallel ranks holds them (``SP_SPLIT`` ÷ sp)."""
    return [dataclasses.replace(x, bytes=x.bytes // sp) if x.name.startswith(SP_SPLIT) else x for x in saved]


def reduce_scatter(d: int, r: int, t: int, h: int, sp: int, amp: bool) -> list[tuple[str, int]]:
    """The MLP's ``RowwiseParallel(output_layouts=Shard(1))`` output: the partial sums (compute dtype, whole
    sequence), their copy made contiguous along the scattered dimension (torch ``distributed/_functional_collectives.py``
    ``reduce_scatter_tensor``: ``scatter_dim != 0`` chunks and ``cat``s) and the reduce-scatter's output (1/sp of the
    sequence) alive together; the post-attention norm's local output (not saved: gate and up saved the all-gathered
    tensor) is still referenced by the decoder layer (``self.mlp(hidden_states)`` has not returned), and under
    autocast the fp32 all-gathered MLP input too (``PrepareModuleInput``'s Replicate tensor; each projection saved its
    bf16 cast). Traced: tests/test_timeline_tp.py."""
    out = [("row-parallel partial sums (down)", d * t * h), ("partial sums, contiguous for the scatter", d * t * h),
           ("reduce-scatter output (down)", d * t * h // sp), ("norm 2 output (local)", r * t * h // sp)]
    if amp:
        out.append(("MLP input (all-gathered, fp32)", r * t * h))
    return out


__all__ = ["TP_FAMILIES", "norm_backward", "rank_arch", "rmsnorm_backward", "row_parallel_reduce",
           "step_temporary", "sp_rank_arch", "sp_split", "reduce_scatter"]
