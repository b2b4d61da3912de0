"""What Gemma (1, 2, 3) and OLMo 2 decoder layers save for backward: the saved-tensor profiles of
``memcalc.memory.families.saved`` for the families whose norms are not Llama's.

Derived from transformers 5.23 (models/gemma/modeling_gemma.py, models/gemma2/modeling_gemma2.py,
models/gemma3/modeling_gemma3.py ``Gemma3ForCausalLM``, models/olmo2/modeling_olmo2.py, masking_utils.py) and torch
2.13's derivative formulas (tools/autograd/derivatives.yaml); checked byte for byte against the census of the real
modules (``memcalc.validation.saved``, tests/test_saved.py), on CPU. Symbols as in ``memcalc.memory.families.saved``.

- ``GemmaRMSNorm`` (``x.float()``, ``x * rsqrt(mean(x²) + eps)``, ``* (1.0 + weight.float())``, ``.type_as(x)``)
  keeps, in every regime, the fp32 input (4T·w), rstd (4 per row), the fp32 vector ``1 + weight`` (4w: not a
  parameter; ``mul`` saves it for the normalized tensor's gradient) and the fp32 normalized tensor (4T·w).
- ``Olmo2RMSNorm`` (``x.to(float32)``, rstd, ``(weight * x).to(dtype)``) keeps the fp32 input, rstd and the fp32
  normalized tensor in every regime (``weight * x`` promotes a bf16 weight to fp32), no ``1 + weight``.
- Gemma's MLP is ``down(gelu_tanh(gate(x)) * up(x))``; ``F.gelu(approximate="tanh")`` keeps only its input, so the
  MLP saves what Llama's SwiGLU saves: 4·d·T·ffn.
- Gemma 2's eager attention soft-caps the scores (``attn_weights / cap``, ``tanh``, ``* cap``): ``tanh`` keeps its
  output (d·S²), the scalings by a Python float keep nothing. Gemma 2 has no SDPA path (``_supports_sdpa = False``).
- Gemma 3's sliding layers under SDPA once s ≥ sliding_window (masking_utils ``_ignore_causal_mask_sdpa`` no longer
  skips the mask): a bool mask is passed, so ``use_gqa_in_sdpa`` is off and ``repeat_kv`` copies K, V to the full
  width (2d·T·qw instead of the cache copies' 2d·T·kvw), and SDPA converts the bool mask to the compute dtype and
  saves it (d·b·s²). Below the window, and under eager attention, a sliding layer saves what a full one does.
- OLMo 2 has no pre-norms (q, k, v read the residual stream, gate and up the post-attention residual: the same
  bytes as Llama's projection inputs); its q_norm/k_norm span the whole q and kv widths.
"""

from __future__ import annotations

from memcalc.memory.families.saved_parts import SavedTensor, Shape, _attention, _inputs, _weight_casts, loss_saved
from memcalc.model.architecture import Architecture

GEMMAS = ("gemma", "gemma2", "gemma3_text")
"""Gemma's norm (``1 + weight``, fp32 normalized), embedding scaled by sqrt(h), GeGLU-tanh MLP."""
FAMILIES = (*GEMMAS, "olmo2")


def gemma_norm(label: str, total: int, rows: int, width: int) -> list[SavedTensor]:
    """``GemmaRMSNorm`` over ``rows`` rows of ``width`` (``total`` = rows·width elements), every regime."""
    return [SavedTensor(f"{label} input (fp32)", 4 * total), SavedTensor(f"{label} rstd (fp32)", 4 * rows),
            SavedTensor(f"{label} 1 + weight (fp32, not a parameter)", 4 * width),
            SavedTensor(f"{label} normalized (fp32)", 4 * total)]  # fmt: skip


def olmo_norm(label: str, t: int, width: int) -> list[SavedTensor]:
    """``Olmo2RMSNorm`` over T rows of ``width``, every regime."""
    return [SavedTensor(f"{label} input (fp32)", 4 * t * width), SavedTensor(f"{label} rstd (fp32)", 4 * t),
            SavedTensor(f"{label} normalized (fp32)", 4 * t * width)]  # fmt: skip


def sliding_sdpa_masked(arch: Architecture, attention: str, s: int, index: int | None) -> bool:
    """Gemma 3 layer ``index`` runs SDPA with a materialised mask (a sliding layer once s ≥ sliding_window)."""
    return (arch.family == "gemma3_text" and attention == "sdpa" and index is not None
            and index in arch.sliding_layers and arch.sliding_window is not None and s >= arch.sliding_window)


def _gemma_attention(arch: Architecture, x: Shape, family: str, attention: str, d: int, r: int,
                     masked: bool) -> list[SavedTensor]:  # fmt: skip
    t = x.t
    if masked:  # Gemma 3 sliding SDPA with its mask: repeat_kv copies, the mask in the compute dtype
        return [SavedTensor("Q", d * t * x.qw), SavedTensor("K, V (repeat_kv copies, full width)", 2 * d * t * x.qw),
                SavedTensor("attention mask (compute dtype, from bool)", d * x.s * x.s * x.b),
                SavedTensor("attention output", d * t * x.qw), SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t)]
    out = _attention(x, "llama", attention, d, r)
    if family == "gemma2" and arch.attention_softcap and attention == "eager":
        out.insert(1, SavedTensor("score softcap tanh output", d * x.scores))
    return out


def layer_saved_gemma(arch: Architecture, x: Shape, family: str, attention: str, d: int, r: int, amp: bool,
                      index: int | None = None) -> list[SavedTensor]:  # fmt: skip
    """One Gemma, Gemma 2, Gemma 3 or OLMo 2 decoder layer (``index``: which layer, for Gemma 3's sliding ones)."""
    t, h = x.t, x.h
    masked = sliding_sdpa_masked(arch, attention, x.s, index)
    if family == "olmo2":
        return [*_inputs(x, d, amp, ("q", "k", "v")), *olmo_norm("q_norm", t, x.qw), *olmo_norm("k_norm", t, x.kvw),
                *_attention(x, "llama", attention, d, r), *olmo_norm("post_attention_layernorm", t, h),
                *_inputs(x, d, amp, ("gate", "up")),
                SavedTensor("gate output, SiLU output, up output, down input", 4 * d * t * x.ffn),
                *olmo_norm("post_feedforward_layernorm", t, h), *(_weight_casts(x, "llama") if amp else [])]
    sandwich = family != "gemma"
    out = gemma_norm("input_layernorm", t * h, t, h) + _inputs(x, d, amp, ("q", "k", "v"))
    if arch.qk_norm:  # Gemma 3: GemmaRMSNorm over head_dim on (b, heads, s, hd) and (b, kv, s, hd)
        out += gemma_norm("q_norm", t * x.qw, t * x.heads, x.hd) + gemma_norm("k_norm", t * x.kvw, t * x.kv, x.hd)
    out += _gemma_attention(arch, x, family, attention, d, r, masked)
    out += gemma_norm("post_attention_layernorm", t * h, t, h)
    out += gemma_norm("pre_feedforward_layernorm", t * h, t, h) if sandwich else []
    out += _inputs(x, d, amp, ("gate", "up"))
    out.append(SavedTensor("gate output (GELU-tanh input), up output, GELU output, down input", 4 * d * t * x.ffn))
    out += gemma_norm("post_feedforward_layernorm", t * h, t, h) if sandwich else []
    return out + (_weight_casts(x, "llama") if amp else [])


def rope_types(arch: Architecture) -> int:
    """Rotary tables the model computes: Gemma 3 one (cos, sin) pair per layer type in use (global theta for full
    layers, ``rope_local_base_freq`` for sliding ones: ``Gemma3RotaryEmbedding``), the others one."""
    if arch.family != "gemma3_text":
        return 1
    return int(bool(arch.sliding_layers)) + int(len(arch.sliding_layers) < arch.layers)


def outside_saved_gemma(arch: Architecture, x: Shape, family: str, d: int, r: int, amp: bool,
                        recompute: bool) -> list[SavedTensor]:  # fmt: skip
    """Outside the layers: token ids; Gemma's embedding scale (``embed_scale.to(weight.dtype)``, a 0-dim tensor the
    ``mul`` keeps: r bytes); the rotary cos, sin (OLMo 2: fp32 in every regime, ``Olmo2RotaryEmbedding`` returns
    fp32); the final norm; the head's input (and its bf16 weight cast); Gemma 2's logit softcap keeps its ``tanh``
    output (d·T·V, ``Gemma2ForCausalLM.forward``); the loss."""
    s, t, h = x.s, x.t, x.h
    out = [SavedTensor("token ids (int64)", 8 * t)]
    if family in GEMMAS:
        out.append(SavedTensor("embedding scale sqrt(h) (0-dim, weight dtype)", r))
    if not recompute:
        rot = 4 if family == "olmo2" else r
        out.append(SavedTensor("rotary cos, sin (shared by the layers)", rope_types(arch) * 2 * s * x.rot * rot))
    out += olmo_norm("final norm", t, h) if family == "olmo2" else gemma_norm("final norm", t * h, t, h)
    out.append(SavedTensor("LM head input" + (" (bf16 cast)" if amp else ""), d * t * h))
    if amp:
        out.append(SavedTensor("LM head weight (bf16 cast)", 2 * h * x.vocab, "weight_cast"))
    if arch.logit_softcap:
        out.append(SavedTensor("logit softcap tanh output", d * t * x.vocab))
    return out + loss_saved(t, x.vocab)
