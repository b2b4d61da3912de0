"""What Hugging Face decoder layers save for backward, tensor by tensor, per family and precision regime.

Derived from the modeling code of transformers 5.23 (models/<family>/modeling_<family>.py,
integrations/sdpa_attention.py, loss/loss_utils.py ``ForCausalLMLoss``) and torch 2.13's derivative
formulas (tools/autograd/derivatives.yaml), and checked byte for byte against a census of the real
modules (``memcalc.validation.saved``, tests/test_saved.py) on CPU. Every storage counts once; views share.

Conventions: T = s·b tokens; d = bytes of the compute dtype (4 fp32, 2 bf16 and under autocast);
r = bytes of the residual stream (4 fp32 and amp, 2 bf16); S² = heads·s²·b score elements.
What the census found, in words:
- RMSNorm (llama, mistral, qwen2) saves an fp32 copy of its input (4T·h), rstd (4T) and the normalized
  tensor (fp32 under fp32 and amp, bf16 under pure bf16). LayerNorm saves its input and mean, rstd.
- The projections save their input once when it is the norm output (fp32, pure bf16); under autocast
  every projection casts the fp32 norm output to bf16 on its own, and each cast is saved (q, k, v, gate,
  up: 5 × 2T·h in llama; a fused qkv casts once).
- Eager attention saves Q, Kᵀ, V as contiguous copies at full head width (GQA repeat_kv), the softmax
  output (fp32 where the code asks ``dtype=torch.float32``) and its copy in the compute dtype.
- SDPA with no mask (CPU flash, like CUDA flash) saves Q, K, V, the output and an fp32 log-sum-exp
  (4·heads·T); K, V are the copies ``DynamicCache.update`` makes (``use_cache`` is on by default in
  training without checkpointing), at KV width under GQA. Falcon passes a mask: on CPU the math
  kernel runs and saves fp32 copies of Q, Kᵀ, V and the fp32 softmax.
- Full recompute (non-reentrant checkpoint) keeps only the layer input, r·T·h.
Device: these are CPU figures; on CUDA, LayerNorm's mean/rstd are fp32 for bf16 input (+4T per norm under
pure bf16) and CUDA autocast runs ``pow`` in fp32, so GPT-2's ``gelu_new`` saves x in fp32, tanh and
1+tanh in fp32 (14 instead of 8 bytes per ffn element); ``device="cuda"`` applies both. Falcon's masked
SDPA on CUDA runs the memory-efficient kernel instead of math: not modelled (use eager figures).
"""

from __future__ import annotations

from typing import Any

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.memory.families.saved_gemma import GEMMAS
from memcalc.memory.families.saved_moe import MOE_FAMILIES, moe_saved
from memcalc.memory.families.saved_parts import (LLAMA_LIKE, LLAMA_STYLE, Kind, Regime, SavedTensor, Shape, _attention,  # noqa: F401
                                                 _dtypes, _inputs, _weight_casts, loss_saved, shape, total)

OTHER_NORMS = ("gemma", "gemma2", "gemma3_text", "olmo2")
"""Llama's projections with Gemma's or OLMo 2's norms (``memcalc.memory.families.saved_gemma``)."""
FAMILIES = (*LLAMA_STYLE, *OTHER_NORMS, "gpt2", "gpt_neox", "opt", "bloom", "falcon")
LAYER_NORM_FAMILIES = ("gpt2", "gpt_neox", "opt", "bloom", "falcon")
"""nn.LayerNorm before attention and MLP: it saves its input as it is (with mean and rstd), in every regime."""
EAGER_ONLY = ("bloom", "gemma2")
"""No SDPA path in transformers: BLOOM's ALiBi, Gemma 2's score softcap (``_supports_sdpa = False``)."""
REGIMES = ("fp32", "bf16", "amp-bf16")


def _check(family: str, regime: str, attention: str) -> None:
    if family not in FAMILIES:
        raise InputError(f"family {family!r} has no saved-tensor profile; known: {', '.join(FAMILIES)}")
    if regime not in REGIMES:
        raise InputError(f"precision regime {regime!r} is not one of {', '.join(REGIMES)}")
    if attention not in ("eager", "sdpa") or (family in EAGER_ONLY and attention == "sdpa"):
        accepted = "eager" if family in EAGER_ONLY else "eager or sdpa"
        raise InputError(f"attention {attention!r} is not available for {family}; use {accepted}")


def _norm(
    x: Shape, family: str, r: int, amp: bool, label: str, with_input: bool = True, cuda: bool = False
) -> list[SavedTensor]:
    t, h = x.t, x.h
    if family in LLAMA_STYLE:  # LlamaRMSNorm: x.float(); x * rsqrt(mean(x²) + eps); weight * x.to(dtype)
        return [SavedTensor(f"{label} input (fp32)", 4 * t * h), SavedTensor(f"{label} rstd (fp32)", 4 * t),
                SavedTensor(f"{label} normalized", (4 if amp or r == 4 else 2) * t * h)]  # fmt: skip
    stat = 4 if cuda else r  # aten native_layer_norm: mean, rstd fp32 on CUDA, input dtype on CPU
    out = [SavedTensor(f"{label} input", r * t * h)] if with_input else []
    return out + [SavedTensor(f"{label} mean, rstd", 2 * stat * t)]


def embedding_norm(x: Shape, r: int, amp: bool, cuda: bool) -> list[SavedTensor]:
    """BLOOM's ``word_embeddings_layernorm`` (a LayerNorm on the embedding output): its input and statistics."""
    return _norm(x, "bloom", r, amp, "embedding norm", cuda=cuda)


def _mlp(x: Shape, family: str, d: int, amp: bool, cuda: bool) -> list[SavedTensor]:
    tf = x.t * x.ffn
    if family in LLAMA_STYLE:  # silu(gate) * up: gate out, silu out, up out, product (down input); Phi-3's fused
        # gate_up output holds gate and up in one storage of the same 2·T·ffn
        return [SavedTensor("gate output, SiLU output, up output, down input", 4 * d * tf)]
    if family == "gpt2":  # NewGELUActivation: 0.5·x·(1 + tanh(c·(x + 0.044715·x³))) saves x, tanh, 0.5x, 1 + tanh
        gelu = (4 + 4 + 2 + 4) * tf if (cuda and amp) else 4 * d * tf  # CUDA autocast: pow in fp32, promotes
        return [SavedTensor("gelu_new intermediates", gelu), SavedTensor("fc2 input", d * tf)]
    if family == "opt":  # ReLU keeps its output, which is fc2's input
        return [SavedTensor("ReLU output (fc2 input)", d * tf)]
    return [SavedTensor("GELU input", d * tf), SavedTensor("fc2 input", d * tf)]


CODES = ("hf", "torchtitan")
"""Whose model code runs the layers: Hugging Face transformers' modeling files, or torchtitan's Llama 3."""


def check_code(code: str, family: str, regime: str, attention: str) -> None:
    """torchtitan's model code is Llama 3's, trained in fp32 or bf16 (FSDP2 param_dtype), with flex or SDPA."""
    if code not in CODES:
        raise InputError(f"model code {code!r} has no saved-tensor profile; known: {', '.join(CODES)}")
    if code == "torchtitan" and (family not in LLAMA_LIKE or regime == "amp-bf16" or attention != "sdpa"):
        raise InputError(f"torchtitan's model code is Llama's in fp32 or bf16 with flex/SDPA attention; got {family}, "
                         f"{regime}, {attention}")


def layer_saved(arch: Architecture, *, family: str, regime: Regime, attention: str, s: int, b: int,
                recompute: bool = False, device: str = "cpu",
                rotary_dims: int | None = None, lora: Any = None, code: str = "hf",
                index: int | None = None, use_cache: bool = True) -> list[SavedTensor]:  # fmt: skip
    """Every storage one decoder layer of ``family`` saves for backward, per micro-batch (``lora``: a
    ``memcalc.model.lora.LoraPlan``, peft adapters on a frozen base: ``_lora_layer``; ``code``: whose modeling
    code, ``hf`` or ``torchtitan``: ``_torchtitan_layer``; ``index``: which layer, where layers differ: Gemma 3's
    sliding layers under SDPA, ``memcalc.memory.families.saved_gemma``; None: a full-attention layer; ``use_cache``: the
    config's, which changes what SDPA saves where q, k, v are views of a fused projection: ``_attention``)."""
    _check(family, regime, attention)
    check_code(code, family, regime, attention)
    d, r, amp = _dtypes(regime)
    x, cuda = shape(arch, s, b, rotary_dims), device == "cuda"
    if recompute:
        return [SavedTensor("layer input (checkpoint)", r * x.t * x.h)]
    if code == "torchtitan":
        return _torchtitan_layer(x, d, cuda)
    if lora is not None:
        return _lora_layer(arch, x, family, attention, d, r, amp, cuda, lora, index)
    if family in OTHER_NORMS:
        from memcalc.memory.families.saved_gemma import layer_saved_gemma

        return layer_saved_gemma(arch, x, family, attention, d, r, amp, index)
    out = _norm(x, family, r, amp, "norm 1", cuda=cuda)
    if (family in LLAMA_STYLE or family == "opt") and not arch.fused_qkv:
        out += _inputs(x, d, amp, ("q", "k", "v"))
    else:
        out += _inputs(x, d, amp, ("qkv",))
    if arch.qk_norm:
        out += _qk_norm(x, d)
    if family == "falcon" and (arch.kv_expanded or x.kv < x.heads):  # _split_heads indexes K, V with [-2], [-1]
        out.append(SavedTensor("K, V split indices (2 int64)", 16))
    out += _attention(x, family, attention, d, r, use_cache, arch.kv_expanded)
    if family == "falcon" and arch.parallel_block and arch.norms_per_layer == 1:  # one norm feeds attention and MLP
        out += _inputs(x, d, amp, ("fc1",)) if amp else []
    elif family == "falcon":
        # the new decoder's ln_mlp (its input is ln_attn's, saved once) or a sequential block's post_attention_layernorm
        out += _norm(x, family, r, amp, "norm 2", with_input=not arch.parallel_block, cuda=cuda)
        out += _inputs(x, d, amp, ("fc1",))
    elif arch.moe:  # a sparse MoE block (Mixtral's, Qwen3-MoE's): the router and the grouped experts' own set
        check_moe(arch, regime)
        return out + _norm(x, family, r, amp, "norm 2", cuda=cuda) + moe_saved(arch, x, d)
    else:
        out += _norm(x, family, r, amp, "norm 2", with_input=family != "gpt_neox", cuda=cuda)
        mlp_in = ("gate_up",) if arch.fused_gate_up else ("gate", "up") if family in LLAMA_STYLE else ("fc1",)
        out += _inputs(x, d, amp, mlp_in)
    out += _mlp(x, family, d, amp, cuda)
    if family == "gpt2" and arch.dropout > 0:
        out.append(dropout_mask(x, d, cuda, "resid_dropout and mlp.dropout masks (2)", 2))
    if amp:
        out += _weight_casts(x, family)
    return out


def check_moe(arch: Architecture, regime: str) -> None:
    """The MoE block is profiled as Mixtral's and Qwen3-MoE's in bf16 (``memcalc.memory.families.saved_moe``): every layer
    sparse, no shared expert, no router bias, gated experts."""
    if (arch.family not in MOE_FAMILIES or arch.moe_every != 1 or arch.shared_experts or arch.router_bias
            or not arch.gated_mlp):
        raise InputError(f"the MoE block is profiled for {', '.join(MOE_FAMILIES)} (every layer sparse, no shared "
                         f"expert); got {arch.family}")
    if regime != "bf16":
        raise InputError(f"the MoE block is profiled in bf16 (grouped_mm takes bf16 only); got {regime}")


def dropout_mask(x: Shape, width: int, cuda: bool, name: str, count: int = 1) -> SavedTensor:
    """What ``count`` ``nn.Dropout`` calls in training keep over T × hidden: on CUDA ``native_dropout``'s bool mask (1
    byte an element); on CPU ``at::dropout``'s composite, ``input * noise``, whose ``mul`` keeps the noise in the
    input's dtype (``width`` bytes; ATen Dropout.cpp: the fused kernel serves CUDA only), as the tracer sees.
    GPT-2's attention dropout is SDPA's ``dropout_p``: fused in the CUDA flash and memory-efficient kernels (their
    RNG state only); on CPU it sends SDPA to the math kernel, which is not modelled."""
    return SavedTensor(name, count * (1 if cuda else width) * x.t * x.h)


def _qk_norm(x: Shape, d: int) -> list[SavedTensor]:
    """Qwen3's q_norm and k_norm (a LlamaRMSNorm over each head, modeling_qwen3.py ``Qwen3Attention.forward``): each
    keeps an fp32 copy of the projection's output, rstd per head, and the normalized tensor cast back to the
    projection's dtype (d: its input dtype, bf16 under autocast), by the census."""
    t = x.t
    return [SavedTensor("q_norm input (fp32)", 4 * t * x.qw), SavedTensor("q_norm rstd (fp32)", 4 * t * x.heads),
            SavedTensor("q_norm normalized", d * t * x.qw), SavedTensor("k_norm input (fp32)", 4 * t * x.kvw),
            SavedTensor("k_norm rstd (fp32)", 4 * t * x.kv), SavedTensor("k_norm normalized", d * t * x.kvw)]


def _torchtitan_norm(x: Shape, d: int, cuda: bool, label: str) -> list[SavedTensor]:
    """torchtitan's ``nn.RMSNorm`` (``F.rms_norm``). On CPU the composite upcasts, multiplies by rstd and by the
    weight in fp32 and keeps the fp32 input, rstd and the fp32 normalized tensor in both regimes (census:
    ``memcalc.validation.saved_torchtitan``). On CUDA ``rms_norm`` dispatches to ``_fused_rms_norm``, whose
    derivative keeps its input and rstd only (pytorch aten/src/ATen/native/layer_norm.cpp ``rms_norm_symint``;
    tools/autograd/derivatives.yaml ``_fused_rms_norm``): derived from the source, not measured on a GPU."""
    t, h = x.t, x.h
    if cuda:
        return [SavedTensor(f"{label} input", d * t * h), SavedTensor(f"{label} rstd (fp32)", 4 * t)]
    return [SavedTensor(f"{label} input (fp32)", 4 * t * h), SavedTensor(f"{label} rstd (fp32)", 4 * t),
            SavedTensor(f"{label} normalized (fp32)", 4 * t * h)]  # fmt: skip


def _torchtitan_layer(x: Shape, d: int, cuda: bool) -> list[SavedTensor]:
    """One torchtitan Llama 3 block (torchtitan 0.3.0 models/llama3/model.py; census on CPU with its own modules,
    fp32 and bf16: ``memcalc.validation.saved_torchtitan``). Against Hugging Face's llama layer: the norms above;
    q, k, v from one fused ``wqkv`` (one saved input, as HF's three projections share theirs); the rotary table
    gathered per layer by the trainer's positions (complex64, 8 bytes per T·hd/2: 4·T·hd; models/common/rope.py),
    where HF shares cos, sin outside the layers; flex attention (or SDPA) keeps q, k, v at their widths, the output
    (the ``wo`` input) and the fp32 log-sum-exp, as HF's SDPA does; SwiGLU keeps w1's, SiLU's and w3's outputs and
    their product."""
    t = x.t
    return [*_torchtitan_norm(x, d, cuda, "attention norm"), SavedTensor("wqkv input", d * t * x.h),
            SavedTensor("rotary table (complex64, gathered per layer)", 4 * t * x.hd),
            SavedTensor("Q", d * t * x.qw), SavedTensor("K, V", 2 * d * t * x.kvw),
            SavedTensor("attention output (wo input)", d * t * x.qw), SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t),
            *_torchtitan_norm(x, d, cuda, "ffn norm"), SavedTensor("w1/w3 input", d * t * x.h),
            SavedTensor("w1 output, SiLU output, w3 output, w2 input", 4 * d * t * x.ffn)]  # fmt: skip


LORA_FAMILIES = (*LLAMA_LIKE, "qwen3", "smollm3")
"""Llama-style families whose peft step was censused and traced (tests/test_lora.py). Granite's layers save the same,
but its traced peft step holds one more residual-sized tensor than the timeline counts (1.1-1.5 % under): left out.
Gemma's layers (``GEMMAS``) are censused under peft too: their norms keep no normalized tensor with a frozen weight."""
LORA_REALISTIC = (*LORA_FAMILIES, "gemma")
"""The families whose peft step the realistic accounting answers: Gemma 2 and 3 are censused, but their post-norm
layers' recomputed backward under LoRA is not ordered (up to 7 % below a trace, tests/test_lora.py)."""


def _lora_layer(arch: Architecture, x: Shape, family: str, attention: str, d: int, r: int, amp: bool, cuda: bool,
                lora: Any, index: int | None = None) -> list[SavedTensor]:  # fmt: skip
    """A Llama-style layer under peft LoRA (``tuners/lora/layer.py`` ``Linear.forward``: ``base_layer(x) +
    lora_B(lora_A(dropout(x))) * scaling``, ``lora_dropout=0`` is ``nn.Identity``), with the embedding output
    requiring grad (``enable_input_require_grads``, as ``prepare_model_for_kbit_training`` sets up; without it
    layer 0 saves less). Census: ``memcalc.validation.lora``. A frozen weight needs no saved input (derivatives.yaml
    ``mm``: ``self`` is saved for ``mat2``'s gradient only): the norms' ``weight * normalized`` keeps nothing, a
    projection without an adapter keeps nothing (its input under DeepSpeed ZeRO-3's linear: ``lora.inputs_saved``),
    and lora_A keeps the very tensor the full model's projection kept
    (one storage for q, k, v). lora_A's output (r wide) is saved for B's gradient. Under autocast each lora_A casts
    its fp32 input to bf16 itself and the frozen weights' bf16 casts are made per use (autocast caches casts of
    leaves that require grad only) and saved for the input gradient; NF4 weights are dequantized per use and
    bitsandbytes' ``MatMul4Bit`` keeps only the packed weight."""
    if family not in (*LORA_FAMILIES, *GEMMAS):
        raise InputError(f"LoRA's saved tensors are modelled for {', '.join((*LORA_FAMILIES, *GEMMAS))}; got "
                         f"{family}")
    from memcalc.model.lora import layer_lora, projections, targeted

    t = set(lora.targets)
    # the projections that keep their input: the targeted ones (lora_A saves it), or every one under DeepSpeed's linear
    keeps = {n for p in projections(arch) for n in p.names} if lora.inputs_saved else t
    gemma = family in GEMMAS
    if gemma:  # GemmaRMSNorm with a frozen weight: 1 + weight needs no gradient, so the normalized tensor is not kept
        from memcalc.memory.families.saved_gemma import gemma_norm

        def norm(label: str, total: int, rows: int, width: int) -> list[SavedTensor]:
            return [k for k in gemma_norm(label, total, rows, width) if "normalized" not in k.name]
    out = (norm("input_layernorm", x.t * x.h, x.t, x.h) if gemma
           else [k for k in _norm(x, family, r, amp, "norm 1") if "normalized" not in k.name])
    recast = amp or lora.inputs_recast  # each lora_A saves a bf16 cast of its input of its own
    out += _inputs(x, d, recast, tuple(n for n in ("q", "k", "v") if n in keeps)) if keeps & {"q", "k", "v"} else []
    if arch.qk_norm and gemma:  # Gemma 3: GemmaRMSNorm over head_dim
        out += norm("q_norm", x.t * x.qw, x.t * x.heads, x.hd) + norm("k_norm", x.t * x.kvw, x.t * x.kv, x.hd)
    elif arch.qk_norm:  # Qwen3's q_norm/k_norm: frozen weights, so their normalized tensors are not kept
        out += [k for k in _qk_norm(x, d) if "normalized" not in k.name]
    if gemma:
        from memcalc.memory.families.saved_gemma import _gemma_attention, sliding_sdpa_masked

        attn = _gemma_attention(arch, x, family, attention, d, r, sliding_sdpa_masked(arch, attention, x.s, index))
    else:
        attn = _attention(x, family, attention, d, r)
    out += [a for a in attn if "o" in keeps or a.name != "output projection input"]
    if recast and "o" in t and attention == "sdpa":
        # peft casts the bf16 attention output to lora_A's fp32 (``_cast_input_dtype``) and autocast casts it back:
        # A saves that new bf16 copy while SDPA keeps its own output (eager: the frozen o_proj no longer keeps its input)
        out.append(SavedTensor("o input (bf16 re-cast for LoRA A)", 2 * x.t * x.qw))
    if gemma:  # Gemma 2 and 3 norm the attention output, then the MLP's input, then its output
        out += norm("post_attention_layernorm", x.t * x.h, x.t, x.h)
        out += norm("pre_feedforward_layernorm", x.t * x.h, x.t, x.h) if family != "gemma" else []
    else:
        out += [k for k in _norm(x, family, r, amp, "norm 2") if "normalized" not in k.name]
    out += _inputs(x, d, recast, tuple(n for n in ("gate", "up") if n in keeps)) if keeps & {"gate", "up"} else []
    out.append(SavedTensor("gate output, activation output, up output" + (", down input" if "down" in keeps else ""),
                           (4 if "down" in keeps else 3) * d * x.t * x.ffn))
    if gemma and family != "gemma":
        out += norm("post_feedforward_layernorm", x.t * x.h, x.t, x.h)
    out.append(SavedTensor("LoRA A outputs (r wide)", len(targeted(arch, lora)) * d * x.t * lora.rank))
    if amp:
        ll = layer_lora(arch, lora)
        if lora.quantize != "nf4":
            out.append(SavedTensor("frozen weights (bf16 casts, per use)", 2 * ll.linear, "weight_cast"))
        out.append(SavedTensor("LoRA A, B (bf16 casts)", 2 * ll.adapters, "weight_cast"))
    return out


def outside_saved(arch: Architecture, *, family: str, regime: Regime, s: int, b: int, recompute: bool = False,
                  device: str = "cpu", rotary_dims: int | None = None) -> list[SavedTensor]:  # fmt: skip
    """What the model saves outside its layers: embedding indices, position ids, the embedding norm (BLOOM),
    the rotary tables every layer shares, the final norm, the head's input and the loss's saved tensors.

    Under recompute the checkpoints also keep the arguments the layers share (rotary tables, position ids,
    the eager attention mask b·s² in the compute dtype): not listed here.
    """
    _check(family, regime, "eager")
    d, r, amp = _dtypes(regime)
    x, cuda, t = shape(arch, s, b, rotary_dims), device == "cuda", s * b
    if family in OTHER_NORMS:
        from memcalc.memory.families.saved_gemma import outside_saved_gemma

        return outside_saved_gemma(arch, x, family, d, r, amp, recompute)
    out = [SavedTensor("token ids (int64)", 8 * t)]
    if family == "gpt2":
        out.append(SavedTensor("position ids (int64, 1 x s)", 8 * s))
    if family == "opt":
        out.append(SavedTensor("position ids (int64, b x s)", 8 * t))
    if family == "bloom":
        out += embedding_norm(x, r, amp, cuda)
    if arch.position == "rotary" and not recompute:
        out.append(SavedTensor("rotary cos, sin (shared by the layers)", 2 * s * x.rot * r))
    out += _norm(x, family, r, amp, "final norm", cuda=cuda)
    out.append(SavedTensor("LM head input" + (" (bf16 cast)" if amp else ""), d * t * x.h))
    if amp:
        out.append(SavedTensor("LM head weight (bf16 cast)", 2 * x.h * x.vocab, "weight_cast"))
    out += loss_saved(t, x.vocab)
    return out


@frozen
class LossPeak:
    """Bytes of logit-sized tensors alive at the two loss moments, beyond the saved activations of the layers."""

    forward: int
    """While log_softmax runs: logits (compute dtype) + fp32 copy + fp32 log-softmax output."""
    backward: int
    """At log_softmax's backward: logits + saved output + fp32 gradient in + fp32 gradient out."""
    names: tuple[tuple[str, int], ...]


def parallel_loss(n: int) -> tuple[int, int]:
    """What ``loss_parallel``'s cross-entropy holds inside one DTensor op beyond the op's output, on rank 0's
    n = T·V/t logits (torch ``distributed/tensor/parallel/loss.py``): forward ``_log_softmax`` keeps ``shifted = x -
    max`` and ``exp(shifted)`` alive together (8n where its output is 4n: 4n more); backward
    ``_nll_loss_and_log_softmax_backward`` keeps ``zeros_like(x)``, ``exp(x)`` and their sum (12n where its output
    is 4n: 8n more). They run inside DTensor's dispatch, which the tracer enters for these handlers
    (``memcalc.validation.trace_tracker``: traced equal, tests/test_timeline_tp.py). Returns (forward, backward)."""
    return 4 * n, 8 * n


def loss_transient(tokens: int, vocab: int, regime: Regime, option: str = "standard", compiled: bool = False,
                   parallel: bool = False) -> LossPeak:  # fmt: skip
    """The loss's logit-sized memory (DOMAIN §10): standard | chunked:N | fused.

    standard (bf16 logits): 2 + 4 + 4 = 10 B per logit element in forward, 2 + 4 + 4 + 4 = 14 in backward
    (fp32: the upcast is a no-op, 8 and 16). chunked:N (torchtune CEWithChunkedOutputLoss): the fp32 copy
    and the two fp32 gradients exist for one chunk of T/N tokens at a time, the saved log-softmax for all.
    fused (Liger-Kernel ops/fused_linear_cross_entropy.py): the logits never exist; it computes the input
    gradient in forward (T·h in the compute dtype, counted by the caller) and holds one chunk of logits.
    compiled (torch.compile over the loss, as torchtune's ``compile_loss``, torchtitan's ``compile.components``
    and a compiled Hugging Face model with its loss in the graph run it): inductor fuses the upcast, log-softmax
    and NLL into one reduction kernel that saves its input (the logits, compute dtype) and two fp32 values per
    token (max, log-sum-exp), and a backward kernel that writes the logits' gradient in the compute dtype; nothing
    fp32 and logit-sized is made (the generated code of ``F.cross_entropy(logits.float(), y)`` under
    ``torch.compile``, torch 2.13: tests/test_compile.py). Chunks change nothing there: every chunk's logits are
    saved and the backward graph writes every chunk's gradient. compiled and parallel (the loss compiled under
    ``loss_parallel``, as torchtitan's releases run a compiled loss with tensor parallelism; the rank's vocabulary
    share): the partitioner moves the fused backward's first half into the forward, which makes the one-hot scatter
    (``zeros_like`` + ``index_put``, fp32) and ``scatter + exp(log-softmax)`` (fp32, saved in place of the logits) and
    frees the scatter at its end; the backward kernel writes the logits' gradient in their dtype (the generated code
    of ``cross_entropy(pred.float(), y)`` on a vocabulary-sharded DTensor under ``loss_parallel`` and
    ``torch.compile``, torch 2.13: tests/test_compile.py). The logits are not saved: the caller's reference holds
    them until it drops it. parallel, eager (standard): the temporaries ``loss_parallel`` holds inside DTensor's ops
    (``parallel_loss``): the forward's beside the log-softmax as a fifth part, the backward's in the gradients part
    (its gradient, one fp32 tensor since log-softmax's backward is a no-op cast, with ``zeros_like(x)``, ``exp(x)``
    and their sum).
    """
    d = _dtypes(regime)[0]
    n = tokens * vocab
    up = 0 if d == 4 else 4 * n  # logits.float() is a no-op on fp32 logits
    if compiled and parallel and option == "standard":
        parts = (("logits", d * n), ("one-hot scatter (fp32, the forward's)", 4 * n),
                 ("softmax minus one-hot (fp32, saved)", 4 * n), ("logits gradient", d * n))
        return LossPeak(d * n + 8 * n, 4 * n + d * n, parts)
    if compiled and option != "fused":
        parts = (("logits", d * n), ("fp32 copy", 0), ("max, log-sum-exp (fp32)", 8 * tokens),
                 ("logits gradient", d * n))
        return LossPeak(d * n + 8 * tokens, d * n + 8 * tokens + d * n, parts)
    if option == "standard" and parallel:
        inside_fwd, inside_bwd = parallel_loss(n)
        parts = (("logits", d * n), ("fp32 copy", up), ("log-softmax output (fp32)", 4 * n),
                 ("gradient (fp32) and DTensor's backward temporaries", 4 * n + inside_bwd),
                 ("loss_parallel log-softmax temporaries (inside DTensor)", inside_fwd))
        return LossPeak(d * n + up + 4 * n + inside_fwd, d * n + 4 * n + 4 * n + inside_bwd, parts)
    if option == "standard":
        parts = (("logits", d * n), ("fp32 copy", up), ("log-softmax output (fp32)", 4 * n),
                 ("gradients (fp32, x2)", 8 * n))
        return LossPeak(d * n + up + 4 * n, d * n + 4 * n + 8 * n, parts)
    if option.startswith("chunked:"):
        k = int(option.split(":", 1)[1])
        if k < 1:
            raise InputError(f"loss option {option!r}: the chunk count must be at least 1")
        c = -(-n // k)
        parts = (("logits", d * n), ("fp32 copy (one chunk)", up and 4 * c), ("log-softmax outputs (fp32)", 4 * n),
                 ("gradients (fp32, x2, one chunk)", 8 * c))  # fmt: skip
        return LossPeak(d * n + (up and 4 * c) + 4 * n, d * n + 4 * n + 8 * c, parts)
    if option == "fused":
        return LossPeak(0, 0, (("logits", 0),))
    raise InputError(f"loss option {option!r} is not one of standard, chunked:N, fused")

