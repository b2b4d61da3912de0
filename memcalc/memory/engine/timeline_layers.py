"""Per-layer and loss sizes for the step timeline: what a layer keeps under each recompute policy, and the
transients the forward and backward of one layer add on top.

Saved tensors come from ``memcalc.memory.families.saved`` (exact against a census of Hugging Face modules). The transient
figures follow the op order of the modules (transformers ``modeling_llama.py``: ``LlamaMLP.forward`` is
``down_proj(act_fn(gate_proj(x)) * up_proj(x))``) and torch's derivative formulas (tools/autograd/derivatives.yaml):
the backward of ``down_proj`` frees its saved input once it ran, and the ``mul`` backward then makes the two
gradients of its inputs while the output gradient is still alive.
"""

from __future__ import annotations


from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.memory.families.saved import (LLAMA_LIKE, LLAMA_STYLE, OTHER_NORMS, SavedTensor, dropout_mask, layer_saved,
                                           shape, total)
from memcalc.memory.families.saved_gemma import sliding_sdpa_masked
from memcalc.memory.families.saved_moe import moe_backward_extra, moe_forward_extra, moe_params

RECOMPUTE_HELP = "none, full, every:K, selective, op-sac"


@frozen
class Policy:
    kind: str
    every: int = 1


def parse_recompute(text: str) -> Policy:
    if text in ("none", "full", "selective", "op-sac"):
        return Policy(text)
    if text.startswith("every:"):
        try:
            k = int(text.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return Policy("every", k)
    raise InputError(f"recompute policy {text!r} is not one of {RECOMPUTE_HELP} (K >= 1)")


def checkpointed(policy: Policy, index: int) -> bool:
    """Layer ``index`` is wrapped in a full checkpoint: every layer under ``full``; under ``every:K`` the layers
    whose index is a multiple of K (torchtitan ``apply_ac``: ``if layer_id % ac_freq == 0`` wraps the block)."""
    return policy.kind == "full" or (policy.kind == "every" and index % policy.every == 0)


@frozen
class LayerSizes:
    """Bytes for one decoder layer, per micro-batch."""

    full: int
    """Activations saved without recompute (``layer_saved``)."""
    casts: int
    """Autocast's bf16 weight copies the layer's matmuls save (0 outside autocast)."""
    kept: int
    """Activations kept between forward and backward under the policy."""
    kept_casts: int
    """Weight copies kept between forward and backward (recomputed layers drop theirs)."""
    recomputed: int
    """Activations rebuilt at the start of this layer's backward (0 without recompute)."""
    residual: int
    """One residual-stream tensor r·T·h (layer input, output, or their gradient)."""
    backward_extra: int
    """Above the live bytes at the layer's backward entry: the peak of its backward (MLP gradients)."""
    attention_extra: int
    """Above the entry at eager attention's softmax backward (0 under sdpa): MLP-side saved tensors freed,
    MLP weight gradients made, the score-sized gradients alive (see ``_attention_backward``)."""
    parts: tuple[tuple[str, int], ...]
    float8_extra: int = 0
    """Above the entry at the down projection's eager ``Float8Linear`` backward casts (0 without float8)."""
    attention_forward: int = 0
    """Above the kept activations of the layers before it and the cast cache they left: the layer at eager attention's
    softmax, where it keeps its transients (BLOOM; 0 elsewhere)."""
    recompute_attention: int = 0
    """Above the entry of a recomputed layer's backward: its forward rerun at eager attention's softmax, saving as it
    goes (BLOOM; 0 elsewhere)."""
    forward_extra: int = 0
    """Above the layer's kept activations, before its output exists: the activation function's forward temporaries
    less the down projection's input not yet made (BLOOM's GELU; 0 where the down projection's output moment tops
    it)."""
    down_grad_extra: int = 0
    """Above the entry when the down projection's backward has made its input and weight gradients, under sequence
    parallelism: its output gradient all-gathered over the whole sequence (``RowwiseParallel(output_layouts=Shard(1))``
    backward), d·T·h, beside them (d·T·f + w·h·f; f the rank's width). It tops ``backward_extra`` where f < h, and
    where the weight gradient is added in place (0 without sequence parallelism: the output gradient is the residual
    stream's)."""


def _op_sac(x, d: int, r: int, code: str = "hf", compiled: bool = False) -> list[SavedTensor]:
    """torchtitan per-op SAC (torchtitan/distributed/activation_checkpoint.py ``_get_custom_policy``): of the
    block's matmuls q, k, v, o, w1, w3, w2 every second output is saved (q, v, w1, w2), plus the attention
    kernel's outputs (output and fp32 log-sum-exp); everything else is recomputed from the block input. torchtitan
    0.3's own Llama fuses q, k, v into ``wqkv``: its five matmuls wqkv, wo, w1, w3, w2 keep wqkv, w1 and w2 (census:
    ``memcalc.validation.saved_torchtitan``, selective). Eager SAC caches every MUST_SAVE output in the forward
    (torch ``utils/checkpoint.py`` ``_CachingTorchDispatchMode``), w2's included, which no backward reads; under
    torch.compile the policy only tags the graph and the partitioner saves what the backward needs, so a compiled
    block keeps all but w2's output (tests/test_compile.py, the block under ``aot_eager``)."""
    t = x.t
    qkv = (SavedTensor("wqkv output", d * t * (x.qw + 2 * x.kvw)) if code == "torchtitan"
           else SavedTensor("q, v outputs", d * t * (x.qw + x.kvw)))
    w2 = [] if compiled else [SavedTensor("w2 (down) output", d * t * x.h)]
    return [SavedTensor("block input (checkpoint)", r * t * x.h), qkv, SavedTensor("w1 (gate) output", d * t * x.ffn),
            *w2, SavedTensor("attention output", d * t * x.qw), SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t)]


def _selective_drop(saved: list[SavedTensor]) -> int:
    """Megatron selective recompute (Korthikanti et al. 2022 §4.2): core attention (scores, softmax, its
    compute-dtype copy) is recomputed; with a flash kernel there is no score matrix to drop."""
    return sum(x.bytes for x in saved if x.name.startswith(("softmax", "probabilities")))


def _mlp_backward_extra(arch, family: str, d: int, w: int, t: int) -> int:
    """The MLP backward peak above its entry: the weight gradient of the down/fc2 projection (parameter dtype w)
    and two ffn-wide gradients (``mul`` backward for a gated MLP: d(act), d(up); GELU: d(fc1 out), d(gelu in)),
    with down's saved input already freed and its input gradient alive: + w·h·f + 2·d·T·f."""
    f = arch.ffn_size
    if family in ("gpt_neox", "falcon"):
        # an exact GELU (F.gelu) saves its input, and fc2 its output, which fc2's backward frees before the GELU's
        # backward makes the input gradient: one ffn-wide gradient at a time, beside fc2's weight and bias gradients
        return w * arch.hidden * f + d * t * f + (w * arch.hidden if arch.mlp_bias else 0)
    return w * arch.hidden * f + 2 * d * t * f


DOWN_GRADS = "down projection's gradients, its output gradient all-gathered (sequence parallel)"
MLP_SIDE = ("norm 2", "gate", "up", "fc1", "GELU", "gelu", "fc2", "ReLU", "MLP weights")


def _attention_backward(saved: list[SavedTensor], x, d: int, w: int, mlp_params: int) -> int:
    """Eager attention at ``_softmax_backward_data`` (derivatives.yaml): the saved fp32 softmax, the fp32
    gradient of its output (``to`` backward of the compute-dtype copy, or the matmul's gradient in fp32) and the
    input gradient in the compute dtype are alive together; the compute-dtype copy the matmul saved is freed.
    Relative to the layer's entry the MLP side's saved tensors are gone and its weight gradients exist."""
    soft = sum(k.bytes for k in saved if k.name.startswith("softmax"))
    probs = sum(k.bytes for k in saved if k.name.startswith("probabilities"))
    if not soft:
        return 0
    width = 4 if "fp32" in next(k.name for k in saved if k.name.startswith("softmax")) else d
    s2 = soft // width
    # saved softmax + its output gradient + its input gradient, both in the softmax's dtype: ``softmax(x,
    # dtype=float32)`` runs ``_softmax`` on ``x.to(float32)``, whose backward returns that dtype
    peak = soft + 2 * width * s2
    mlp_side = sum(k.bytes for k in saved if k.name.startswith(MLP_SIDE))
    return peak - soft - probs - mlp_side + w * mlp_params + d * x.t * x.qw


def _bloom_attention_forward(x, d: int, r: int, amp: bool, cuda: bool, ckpt: bool) -> int:
    """BLOOM's eager attention at its softmax or at its end, whichever holds more (modeling_bloom.py
    ``BloomAttention.forward``), in bytes above the layers before: the layer input, the first norm's output (a local;
    fp32 under autocast), the fused qkv output (alive until the attention returns), the q, k, v copies baddbmm and
    bmm save, and 12 bytes per score element: the scores and the masked scores (locals), the softmax's fp32 output,
    and either its fp32 input copy (pure bf16), or the bf16 probabilities beside the fp32 masked scores (autocast,
    whose mask is fp32), or nothing more (fp32). Without recompute the first norm's statistics are saved too, and
    under autocast its output's bf16 cast and the qkv weight's and bias's copies (traced op by op)."""
    t, h = x.t, x.h
    out = r * t * h + r * t * h + 3 * d * t * h + 3 * d * t * h
    if amp:
        out += 2 * (3 * h * h + 3 * h) + (0 if ckpt else 2 * t * h)
    if not ckpt:
        out += 2 * (4 if cuda else r) * t
    # at the residual add ending the attention the scores, the masked scores and the probabilities are alive (and the
    # softmax's fp32 output where it is saved or is the probabilities), beside the merged heads (dense's input),
    # dense's output and the sum (and under autocast dense's weight and bias copies)
    soft = 4 if not ckpt or d == 4 else 0
    end = (d + (4 if amp else d) + soft + (d if d != 4 else 0)) * x.scores + 2 * d * t * h + r * t * h
    return out + max(12 * x.scores, end + (2 * (h * h + h) if amp else 0))


def layer_kind(arch, policy: Policy, attention: str, s: int, index: int) -> tuple[bool, bool, bool, bool]:
    """All that ``layer_sizes`` reads of a layer's index: whether it is checkpointed, whether the layer before it is
    (BLOOM's loop holds that layer's output), whether it is the first (MoE and BLOOM count the embedding output past
    layer 0), whether it runs Gemma 3's masked sliding SDPA. Two layers of one kind have the same sizes."""
    return (checkpointed(policy, index), index > 0 and checkpointed(policy, index - 1), index == 0,
            sliding_sdpa_masked(arch, attention, s, index))


def layer_sizes(arch, *, family: str, regime: str, attention: str, s: int, b: int, policy: Policy, index: int,
                device: str = "cpu", rotary_dims: int | None = None, lora=None, code: str = "hf",
                compiled: bool = False, sp: int = 1, float8: str = "none",
                float8_weight_cast: bool = True, use_cache: bool = True,
                hooked_grads: bool = False) -> LayerSizes:  # fmt: skip
    """``sp``: sequence parallelism over ``sp`` ranks (``memcalc.memory.overlays.timeline_tp.sp_split``): the norms' tensors,
    the layer input and output are the rank's ``1/sp`` of the sequence; ``arch`` is rank 0's (``rank_arch``).
    ``float8``: torchao's eager ``Float8Linear`` projections (``memcalc.model.float8.eager_backward``): the down
    projection's backward casts above the layer's entry; compiled layers fuse the casts (not counted).
    ``float8_weight_cast``: False when FSDP gathered the weights in fp8 (the weight is already fp8).
    ``hooked_grads``: the caller counts each weight gradient at its own hook (DeepSpeed's gradient hooks move it to
    the bucket as autograd makes it: ``memcalc.memory.overlays.timeline_zero``, ``timeline_zero3``), so an MoE block's backward
    moments leave the experts' weight gradients out."""
    saved = _layer_saved(arch, family, regime, attention, s, b, policy, index, device, rotary_dims, lora, code,
                         compiled, sp, use_cache)
    full, casts = total(saved), total(saved, "weight_cast")
    x = shape(arch, s, b, rotary_dims)
    d, r = {"fp32": (4, 4), "bf16": (2, 2), "amp-bf16": (2, 4)}[regime]
    w = 2 if regime == "bf16" else 4
    residual = r * x.t * x.h // sp
    ckpt = checkpointed(policy, index)
    extra = _backward_extra(arch, family, regime, x, d, w, ckpt, casts, device, lora, code, hooked_grads)
    forward_extra = attention_forward = recompute_attention = 0
    if family == "bloom" and lora is None:
        more, forward_extra, attention_forward, recompute_attention = _bloom(
            x, d, r, w, regime, device, ckpt, index > 0 and checkpointed(policy, index - 1))
        extra += more
    mlp_params = moe_params(arch) if arch.moe else (3 if arch.gated_mlp else 2) * x.h * x.ffn
    if arch.moe and ckpt:
        # the block's locals above the layer's checkpoint and the residual stream, which the moment's list leaves out
        forward_extra = moe_forward_extra(arch, x, d, checkpointed=True) + residual
    elif arch.moe:
        # the block reordering its weighted pairs, above the layer's saved tensors: the moment's list leaves the
        # residual stream out, so it is added here with the tensors bf16 saves nowhere that are alive all the same
        # (traced): the layer's input (the model's loop variable holds it until the layer returns) and, past layer
        # 0, the embedding output (``inputs_embeds`` in the model's forward)
        forward_extra = moe_forward_extra(arch, x, d) + residual + residual + (residual if index > 0 else 0)
    attn = _softmax_backward(arch, family, regime, attention, saved, x, d, r, w, mlp_params, ckpt, code, lora)
    kept, kept_casts, rec, parts = _kept(saved, full, casts, residual, family, attention, policy, index, x, d, r,
                                         code, compiled)
    f8 = 0
    if float8 != "none" and not compiled:
        from memcalc.model.float8 import eager_backward

        # the down projection's, at the layer's backward entry; gate/up (and o, q, k, v) cast after the MLP's saved
        # tensors began to go and, with ffn above hidden, stay below it (traced: tests/test_float8_timeline.py)
        f8 = eager_backward(x.t, x.ffn, x.h, d, float8_weight_cast)
    # traced op by op (tests/test_timeline_tp.py, tests/test_pipeline_realistic.py: tp 2 and 4, h 1024, f/tp 1664, 832);
    # not under autocast: traced at tp 2 (f/tp above h) the layer's backward peaks where backward_extra says; at tp 4
    # its peak is the recomputed MLP's forward, its fp32 all-gathered input beside the bf16 casts (not modelled: the
    # layer's backward 0.9 % below the trace at h 1024)
    down_grad = (d * x.t * x.h + d * x.t * x.ffn + w * x.h * x.ffn
                 if sp > 1 and regime != "amp-bf16" and not arch.moe and family in LLAMA_STYLE and code == "hf"
                 and lora is None else 0)  # fmt: skip
    return LayerSizes(full, casts, kept, kept_casts, rec, residual, extra, attn, parts, f8, attention_forward,
                      recompute_attention, forward_extra, down_grad)


def _layer_saved(arch, family: str, regime: str, attention: str, s: int, b: int, policy: Policy, index: int,
                 device: str, rotary_dims: int | None, lora, code: str, compiled: bool, sp: int,
                 use_cache: bool) -> tuple:  # fmt: skip
    """The tensors one decoder layer saves for backward: compiled, or eager (with LoRA's adapters), the rank's
    ``1/sp`` of the sequence under sequence parallelism (``layer_sizes``'s arguments)."""
    if compiled and policy.kind == "none" and lora is None:
        # torch.compile per layer: AOTAutograd's partitioner's saved set (memcalc.memory.families.compiled, exact on CPU); the
        # backward transients below stay the eager layer's
        from memcalc.memory.families.compiled import compiled_layer_saved

        saved = compiled_layer_saved(arch, family=family, regime=regime, attention=attention, s=s, b=b, device=device,
                                     scope="layer", code=code)
    else:
        # LoRA: the backward transients below stay the full model's (a bound)
        saved = layer_saved(arch, family=family, regime=regime, attention=attention, s=s, b=b, device=device,
                            rotary_dims=rotary_dims, code=code, lora=lora, index=index, use_cache=use_cache)
    if sp > 1:
        from memcalc.memory.overlays.timeline_tp import sp_split

        saved = sp_split(saved, sp)
    return saved


def _backward_extra(arch, family: str, regime: str, x, d: int, w: int, ckpt: bool, casts: int, device: str, lora,
                    code: str, hooked_grads: bool) -> int:  # fmt: skip
    """The MLP's backward transient above the layer's saved tensors (an MoE block's, or the dense MLP's), net of
    what the family's backward freed before it (``layer_sizes``'s ``backward_extra``)."""
    extra = (moe_backward_extra(arch, x, d, 0 if hooked_grads else w, recomputed=ckpt)
             if arch.moe
             else _mlp_backward_extra(arch, family, d, w, x.t))
    if regime == "amp-bf16" and casts and family in (*LLAMA_STYLE, *OTHER_NORMS, "gpt_neox", "falcon", "opt"):
        # down's bf16 weight copy, saved by its matmul, is released once down's backward ran (autograd frees a
        # node's saved tensors after it runs; autocast's cache was cleared when the forward's block exited)
        extra -= 2 * x.h * x.ffn
    if family in OTHER_NORMS and arch.norm_placement != "pre":
        # a norm after the MLP (Gemma 2/3 post_feedforward_layernorm, OLMo 2's): its backward ran before the MLP's and
        # freed its fp32 input and normalized tensor (8·T·h) and Gemma's 1 + weight (4h) (traced: tests/test_timeline.py)
        extra -= 8 * x.t * x.h + (4 * x.h if family != "olmo2" else 0)
    if family == "gpt2" and arch.dropout > 0 and code == "hf" and lora is None:
        # mlp.dropout ends the layer: its backward ran before the MLP's and freed its mask (traced)
        extra -= dropout_mask(x, d, device == "cuda", "mlp.dropout mask").bytes
    if regime == "amp-bf16" and family in ("gpt_neox", "falcon") and arch.parallel_block:
        # the parallel block's sum of the bf16 branch outputs (NeoX's first add, Falcon's in-place one): its gradient's
        # bf16 cast, which both branches take, stays for the attention's backward after the MLP's
        extra += 2 * x.t * x.h
    return extra


def _bloom(x, d: int, r: int, w: int, regime: str, device: str, ckpt: bool,
           previous_ckpt: bool) -> tuple[int, int, int, int]:  # fmt: skip
    """BLOOM's layer beside the generic one: (more backward transient, forward extra, attention forward, recomputed
    attention); ``ckpt``, ``previous_ckpt``: the layer, the layer before it, checkpointed."""
    # BLOOM's GeLUFunction (modeling_bloom.py): ``bloom_gelu_forward`` holds four ffn-wide temporaries beside the
    # fc1 output, and ``bloom_gelu_back`` five beside the output gradient (tanh, 0.5·x, 1 - tanh², 0.107·x, its
    # product with x) where the generic MLP counts two; the fc2 bias gradient is made before (traced op by op)
    extra = 3 * d * x.t * x.ffn + w * x.h
    forward_extra = 3 * d * x.t * x.ffn
    recompute_attention = 0
    if ckpt:
        # nothing of the layer is kept: the fc1 output and the GELU's temporaries, beside what BloomBlock.forward
        # still holds in locals (the second norm's output, the attention output, the attention probabilities
        # BloomAttention returns)
        forward_extra = 5 * d * x.t * x.ffn + 2 * r * x.t * x.h + d * x.scores
    elif regime == "amp-bf16":  # the second norm's fp32 output (a local; fc1 saved its bf16 cast)
        forward_extra += r * x.t * x.h
    if regime == "amp-bf16":
        # fc2's bf16 weight and bias copies, counted with the layer's casts, are made after the GELU; the weight's,
        # saved by its matmul, is freed once fc2's backward ran
        forward_extra -= 2 * x.h * x.ffn + 2 * x.h
        extra -= 2 * x.h * x.ffn
    attention_forward = _bloom_attention_forward(x, d, r, regime == "amp-bf16", device == "cuda", ckpt)
    if ckpt:  # the rerun saves: the layer's own forward, less its input (the checkpoint)
        recompute_attention = _bloom_attention_forward(x, d, r, regime == "amp-bf16", device == "cuda",
                                                       False) - r * x.t * x.h
    if previous_ckpt:
        # BloomModel's loop holds the previous block's returned (output, probabilities) in ``outputs`` until this
        # block returns; probabilities that no checkpointed block saved
        forward_extra += d * x.scores
        attention_forward += d * x.scores
    return extra, forward_extra, attention_forward, recompute_attention


def _softmax_backward(arch, family: str, regime: str, attention: str, saved: tuple, x, d: int, r: int, w: int,
                      mlp_params: int, ckpt: bool, code: str, lora) -> int:  # fmt: skip
    """Eager attention's backward transient (score-sized gradients) above the layer's saved tensors; 0 under SDPA
    but Falcon's multi-query math kernel."""
    # (Falcon-7B's multi-query SDPA runs the math kernel, whose backward is eager attention's in fp32)
    math = family == "falcon" and attention == "sdpa" and x.kv < x.heads and not arch.kv_expanded
    attn = _attention_backward(saved, x, d, w, mlp_params) if attention == "eager" or math else 0
    if attn and family in LLAMA_STYLE and code == "hf" and lora is None:
        # Llama-style layers, traced op by op (hidden 128 and 1024, tp 1 and 2: tests/test_timeline_tp.py): at the
        # softmax backward the gradient of the residual stream between attention and MLP is alive beside the layer
        # output's (r·T·h, whole under tensor parallelism), the second norm's weight gradient (w·h) and o's weight
        # gradient (w·h·q, q its local width) exist, and o's saved input (d·T·q) is freed; under autocast o's bf16
        # weight cast (2·h·q) is freed as well and, unless the layer was recomputed, its input stays. Replaces the
        # d·T·q term above.
        amp_kept = regime == "amp-bf16" and not ckpt
        o = w * x.h * x.qw - (2 * x.h * x.qw if regime == "amp-bf16" else 0) - (0 if amp_kept else d * x.t * x.qw)
        attn += r * x.t * x.h + w * x.h + o - d * x.t * x.qw
    return attn


def _kept(saved: tuple, full: int, casts: int, residual: int, family: str, attention: str, policy: Policy,
          index: int, x, d: int, r: int, code: str, compiled: bool) -> tuple[int, int, int, tuple]:  # fmt: skip
    """What the recompute policy keeps of the layer's saved tensors: (kept, its casts, recomputed in backward, the
    kept parts by name)."""
    if checkpointed(policy, index):
        return residual, 0, full, (("layer input (checkpoint)", residual),)
    if policy.kind == "op-sac":
        if family not in LLAMA_LIKE or attention != "sdpa":
            raise InputError(f"recompute 'op-sac' is modelled for {', '.join(LLAMA_LIKE)} with sdpa; got "
                             f"{family} with {attention}")  # fmt: skip
        keep = _op_sac(x, d, r, code, compiled)
        return total(keep), 0, full, tuple((k.name, k.bytes) for k in keep)
    if policy.kind == "selective":
        drop = _selective_drop(saved)
        return (full - drop, casts, drop,
                tuple((k.name, k.bytes) for k in saved if k.bytes and not k.name.startswith(("softmax", "prob"))))
    return full, casts, 0, tuple((k.name, k.bytes) for k in saved)
