"""Hugging Face's mixture-of-experts MLP (Mixtral's ``MixtralSparseMoeBlock``, Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``)
as transformers 5 runs it in training: what it saves for backward, what its forward holds for a moment, and what its
backward adds above the layer's entry.

The block (transformers 5.24 ``models/mixtral/modeling_mixtral.py``, ``models/qwen3_moe/modeling_qwen3_moe.py``): the
router ``F.linear(x, W_r)`` over the second norm's output, an fp32 softmax, ``topk``, the top-k weights divided in
place by their sum (Mixtral always, Qwen3-MoE under ``norm_topk_prob``), and Qwen3-MoE casts them back to the
logits' dtype (Mixtral keeps them fp32); then the experts as one 3-D ``gate_up_proj`` (E × 2f × h) and ``down_proj``
(E × h × f) run by the default experts implementation, ``grouped_mm`` (``integrations/moe.py``
``grouped_mm_experts_forward``; ``get_correct_experts_implementation`` picks it whenever
``torch.nn.functional.grouped_mm`` exists): the S = T·k (token, expert) pairs sorted by expert (``torch.sort``), the
hidden states gathered in that order (``hidden_states[perm // k]``), one grouped matmul through every expert's
gate_up, SiLU(gate)·up, one through down, the product with the routing weights (fp32 under Mixtral: the bf16 output
times the fp32 weights promotes), the pairs put back in token order and summed over k. Every shape is T·k rows
whatever the routing, so the bytes do not depend on which experts the tokens pick (the eager per-expert loop's
would). ``grouped_mm`` takes bf16 only (torch's CUDA kernel and its meta function), so these are the bf16 figures:
pure bf16, FSDP's bf16 ``MixedPrecisionPolicy``.

Census (``memcalc.validation.saved``, tests/test_moe.py): the router keeps its input (the norm's output, d·T·h), the
fp32 softmax output (4·T·E), the top-k indices (int64, 8·T·k) and, where it divides, the sum (4·T) and the weights
before the in-place division (autograd clones ``self`` for ``div_``'s other-gradient: 4·T·k); the experts keep the two
index tensors of the gathers (int64, 8·S each: ``perm // k`` and ``perm``), the offsets (int32, 4·E), the gathered
states (d·S·h), the gate_up output (d·S·2f: SiLU's input and the product's ``up`` are views of it), SiLU's output
(d·S·f), the product (down's input, d·S·f), the sorted routing weights (w_r·S, w_r their bytes), down's output
(d·S·h) and the inverse permutation (int64, 8·S).
"""

from __future__ import annotations

from memcalc.memory.families.saved_parts import SavedTensor, Shape
from memcalc.model.architecture import Architecture
from memcalc.model.params import layer_params

MOE_FAMILIES = ("mixtral", "qwen3_moe")
"""Families whose MoE block is profiled and traced: a router and grouped_mm experts, no shared expert."""
FP32_ROUTING = ("mixtral",)
"""Families whose routing weights stay fp32 (the others cast them to the logits' dtype before the experts)."""


def _dims(arch: Architecture, x: Shape) -> tuple[int, int, int, int, int, int]:
    """(T tokens, S = T·k pairs, h, one expert's width f, experts E, top-k k)."""
    return x.t, x.t * arch.top_k, x.h, arch.expert_ffn_size, arch.experts, arch.top_k


def _widths(arch: Architecture, d: int) -> tuple[int, int]:
    """(bytes of a routing weight, bytes of a weighted pair): fp32 under Mixtral, whose fp32 weights promote the
    product; the compute dtype where the weights were cast back."""
    wr = 4 if arch.family in FP32_ROUTING else d
    return wr, max(wr, d)


def moe_saved(arch: Architecture, x: Shape, d: int) -> list[SavedTensor]:
    """Every storage the MoE block saves for backward, per micro-batch (module docstring); names start with ``MoE``
    (the second norm's backward finds them gone: ``memcalc.memory.overlays.timeline_tp.NORM2_FREED``)."""
    t, s, h, f, e, k = _dims(arch, x)
    wr, _ = _widths(arch, d)
    norm = 4 * t + 4 * t * k if arch.router_norm else 0
    return [SavedTensor("MoE router input (the norm's output)", d * t * h),
            SavedTensor("MoE router softmax (fp32), top-k indices (int64)"
                        + (", sum and weights (fp32)" if norm else ""), 4 * t * e + 8 * t * k + norm),
            SavedTensor("MoE gather indices and inverse permutation (int64, x3), offsets (int32), sorted weights",
                        3 * 8 * s + 4 * e + wr * s),
            SavedTensor("MoE gathered states (grouped gate_up input)", d * s * h),
            SavedTensor("MoE gate_up output, SiLU output, down input", 4 * d * s * f),
            SavedTensor("MoE down output", d * s * h)]  # fmt: skip


def moe_forward_extra(arch: Architecture, x: Shape, d: int, checkpointed: bool = False) -> int:
    """The block's highest moment in the forward (traced), in bytes above what the layer holds when the block starts.

    Saving (no recompute), above the layer's saved tensors: the pairs put back in token order (``weighted_out[
    inv_perm]``): the router's logits (the block keeps them in ``_`` until it returns, d·T·E), the top-k weights
    (w_r·T·k), the sorted expert ids (int64, 8·S), the histogram's input and output (4·S, 4·E:
    ``expert_ids_g.float()`` on CPU, ``.int()`` on CUDA, the same bytes) and the weighted pairs twice, before and after
    the reordering (w_p·S·h each, w_p their bytes), or with one expert per token the reordered pairs beside their sum
    over k (w_p·T·h) and, under fp32 routing, its bf16 cast.

    Checkpointed (the layer saves nothing), above its input and the residual stream: the norm's output and the
    block's locals, at the higher of SiLU·up's product (the gathered states, gate_up's output, SiLU's output and the
    product, beside the routing tensors) and the reordering (the gathered states, down's output and the weighted
    pairs twice): the logits d·T·E, the top-k weights and indices ((w_r + 8)·S), the sorted ids and the permutation
    (16·S), the sorted weights and the histogram's input ((w_r + 4)·S), the histogram and the offsets (8·E)."""
    t, s, h, f, e, k = _dims(arch, x)
    wr, wp = _widths(arch, d)
    # the reordered pairs beside the pairs before the reordering, or, once those are freed, beside the sum over k
    # and its cast (fp32 routing): the second is higher with one expert per token
    pairs = max(2 * wp * s * h, wp * s * h + wp * t * h + (d * t * h if wp != d else 0))
    if not checkpointed:
        return d * t * e + wr * t * k + 8 * s + 4 * s + 4 * e + pairs
    routing = d * t * e + (wr + 8) * s + 16 * s + (wr + 4) * s + 8 * e
    gated = routing + d * s * h + 4 * d * s * f
    reorder = routing + 8 * s + 2 * d * s * h + pairs
    return d * t * h + max(gated, reorder)


def moe_params(arch: Architecture) -> int:
    """Parameters of one MoE block: the router (E × h) and every expert's gate_up and down
    (``memcalc.model.params.layer_params``)."""
    lp = layer_params(arch, moe=True)
    return lp.router + lp.mlp


def moe_backward_extra(arch: Architecture, x: Shape, d: int, w: int, recomputed: bool = False) -> int:
    """The highest of ``moe_backward_moments``."""
    return max(moe_backward_moments(arch, x, d, w, recomputed).values())


def moe_backward_moments(arch: Architecture, x: Shape, d: int, w: int, recomputed: bool = False) -> dict[str, int]:
    """The block's backward moments above the layer's entry (its saved tensors alive, the output's gradient given),
    five traced op by op, in the order they come (w: the weight gradients' bytes per element, 0 where the caller
    counts them at their hooks; w_p a weighted pair's):

    - the gradient put back in pair order: the sum's expanded gradient copied to pair layout (``view`` of an expanded
      tensor, w_p·S·h), then ``index``'s backward, zeros and ``index_put``: 3·w_p·S·h;
    - the routing weights' product: that gradient and the two products of ``mul``'s backward (3·w_p·S·h), the copy,
      the zeros and the inverse permutation freed (8·S), then, under fp32 routing, the pairs' gradient cast to bf16
      (d·S·h) while down's output is still saved. A recomputed layer's checkpoint hands its tensors over as they are
      unpacked, so there down's output and the sorted weights are gone before the cast and the moment before tops
      nothing;
    - down's grouped backward: every expert's down gradient (w·E·h·f) and the input gradient (d·S·f), down's output,
      the sorted weights and the permutation freed, the weights' gradient made;
    - SiLU·up's backward: its two gradients (2·d·S·f), down's input and the pairs' gradient freed;
    - gate_up's grouped backward: every expert's gate_up gradient beside down's (w·E·3·h·f), the gathered states'
      gradient (d·S·h) and the concatenated gate_up gradient (d·S·2f), the intermediates all freed."""
    _, s, h, f, e, _ = _dims(arch, x)
    _, wp = _widths(arch, d)
    reorder = 3 * wp * s * h
    weights = reorder - 8 * s + (d * s * h if wp != d and not recomputed else 0)
    down = w * e * h * f + d * s * f - 8 * s
    gated = w * e * h * f + 2 * d * s * f - d * s * h - 8 * s
    gate_up = w * e * 3 * h * f - 2 * d * s * f - 8 * s
    return {"reorder": reorder, "weights": weights, "down": down, "gated": gated, "gate_up": gate_up}
