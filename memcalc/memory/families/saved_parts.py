"""The parts every saved-tensor profile is built from (``memcalc.memory.families.saved`` and ``memcalc.memory.families.saved_gemma``):
one saved storage, the shape the formulas read, the compute and residual dtypes, the projections' inputs, the
attention kernels' saved tensors, autocast's weight casts and the loss's saved tensors. Sources and the census that
checks them: ``memcalc.memory.families.saved``."""

from __future__ import annotations

from typing import Literal

from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture


Regime = Literal["fp32", "bf16", "amp-bf16"]
Kind = Literal["activation", "weight_cast"]
LLAMA_LIKE = ("llama", "mistral", "qwen2")
"""Llama's modules as they are (the set the sharded, tensor-parallel, LoRA, compiled and torchtitan paths were
traced with)."""
LLAMA_STYLE = (*LLAMA_LIKE, "qwen3", "phi3", "granite", "smollm3", "mixtral", "qwen3_moe")
"""Hugging Face's Llama-style layers (LlamaRMSNorm, rotary, SwiGLU); Qwen3 adds q_norm/k_norm, Phi-3 fuses qkv and
gate/up, Granite scales by Python floats, SmolLM3 skips the rotary embedding in some layers: same saved set. Mixtral
and Qwen3-MoE are Mistral's and Qwen3's layers with a mixture of experts for the MLP (``memcalc.memory.families.saved_moe``)."""

@frozen
class SavedTensor:
    """One storage kept for backward, per micro-batch."""

    name: str
    bytes: int
    kind: Kind = "activation"
    """``weight_cast``: a bf16 copy of a weight that autocast made and a matmul saved (scales with parameters)."""


@frozen
class Shape:
    """The numbers the formulas read, from an ``Architecture`` and (s, b)."""

    s: int
    b: int
    h: int
    heads: int
    kv: int
    hd: int
    ffn: int
    vocab: int
    rot: int
    """Rotary width per head (GPT-NeoX rotates rotary_pct of it)."""

    @property
    def t(self) -> int:
        return self.s * self.b

    @property
    def qw(self) -> int:
        return self.heads * self.hd

    @property
    def kvw(self) -> int:
        return self.kv * self.hd

    @property
    def scores(self) -> int:
        return self.heads * self.s * self.s * self.b


def shape(arch: Architecture, s: int, b: int, rotary_dims: int | None = None) -> Shape:
    return Shape(s, b, arch.hidden, arch.heads, arch.n_kv, arch.d_head, arch.ffn_size, arch.padded_vocab,
                 rotary_dims if rotary_dims is not None else arch.rotary_dims or arch.d_head)  # fmt: skip

def _dtypes(regime: str) -> tuple[int, int, bool]:
    """(d compute bytes, r residual bytes, autocast?)"""
    return {"fp32": (4, 4, False), "bf16": (2, 2, False), "amp-bf16": (2, 4, True)}[regime]

def _inputs(x: Shape, d: int, amp: bool, names: tuple[str, ...]) -> list[SavedTensor]:
    """The projections' input: the norm output once, or under autocast one bf16 cast per projection."""
    if amp:
        return [SavedTensor(f"{n} input (bf16 cast)", 2 * x.t * x.h) for n in names]
    return [SavedTensor(f"{'/'.join(names)} input", d * x.t * x.h)]


def _attention(x: Shape, family: str, attention: str, d: int, r: int, use_cache: bool = True,
               kv_expanded: bool = False) -> list[SavedTensor]:
    """``use_cache`` False (no DynamicCache: checkpointing, or fine-tuning frameworks that turn it off): SDPA saves
    K and V as the layer makes them. Where q, k, v are views of one fused projection that is the fused storage: the
    whole of it for GPT-2 (already kept by its Q view), for Phi-3 and GPT-NeoX (Q and K rotated into fresh tensors)
    the fused storage through V's view beside the rotated K (census with ``use_cache=False``, tests/test_saved.py)."""
    t = x.t
    if attention == "sdpa" and family == "falcon" and x.kv < x.heads and not kv_expanded:
        # Falcon-7B's multi-query K, V (one head) beside the query heads, with the mask Falcon always builds: no fused
        # kernel takes them, the math kernel runs and upcasts to fp32
        return [SavedTensor("Q, Kᵀ, V (fp32, math kernel)", 3 * 4 * t * x.qw),
                SavedTensor("softmax (fp32)", 4 * x.scores), SavedTensor("output projection input", d * t * x.qw)]
    if attention == "sdpa" and family == "falcon":
        # K, V at the query heads (copies: the new decoder broadcasts them, multi-head ones are reshaped), and the
        # mask Falcon always builds (``allow_is_causal_skip=False``): a fused kernel with a mask, which keeps Q, K, V,
        # the mask in the compute dtype (made per call from the boolean one), the output (dense's input) and the
        # log-sum-exp
        # (multi-head Falcon without a cache: V is a view of the fused storage, kept whole beside the rotated Q, K)
        qkv = (SavedTensor("Q, K (rotated), the fused qkv storage (V's view)", 5 * d * t * x.qw)
               if not use_cache and not kv_expanded else SavedTensor("Q, K, V (query heads)", 3 * d * t * x.qw))
        return [qkv, SavedTensor("attention mask", d * x.b * x.s ** 2), SavedTensor("attention output", d * t * x.qw),
                SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t)]
    if attention == "sdpa":
        q = d * t * (x.qw + 2 * x.kvw) if family == "gpt2" else d * t * x.qw  # GPT-2's Q is a view of the fused qkv
        kv = SavedTensor("K, V (cache copies)", 2 * d * t * x.kvw)
        if not use_cache and family == "gpt2":
            kv = SavedTensor("K, V (views of the fused qkv storage)", 0)
        elif not use_cache and family in ("phi3", "gpt_neox"):
            kv = SavedTensor("K (rotated), the fused qkv storage (V's view)", d * t * (x.qw + 3 * x.kvw))
        out = [SavedTensor("Q" + (" (fused qkv storage)" if family == "gpt2" else ""), q), kv,
               SavedTensor("attention output", d * t * x.qw), SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t)]
        if family in ("gpt_neox", "phi3"):
            # the rotary output is a fresh (b, heads, s, hd) tensor there (NeoX and Phi-3 rotate a slice and cat), so
            # the kernel's output follows that layout and attn_output.transpose(1, 2).contiguous() copies it
            out.append(SavedTensor("output projection input", d * t * x.qw))
        return out
    soft = r if family in ("gpt2", "falcon") else 4  # the rest ask softmax(..., dtype=torch.float32)
    out = [SavedTensor("Q, Kᵀ, V (copies, full width)", 3 * d * t * x.qw),
           SavedTensor("softmax (fp32)" if soft == 4 else "softmax (bf16)", soft * x.scores)]
    if soft != d:
        out.append(SavedTensor("probabilities (compute-dtype copy)", d * x.scores))
    return out + [SavedTensor("output projection input", d * t * x.qw)]

def _weight_casts(x: Shape, family: str) -> list[SavedTensor]:
    """Autocast's bf16 copies of the layer's matmul weights, saved by the matmuls (2 bytes per weight)."""
    h, f = x.h, x.ffn
    attn = h * (x.qw + 2 * x.kvw) + x.qw * h
    mlp = (3 if family in LLAMA_STYLE else 2) * h * f
    return [SavedTensor("attention weights (bf16 casts)", 2 * attn, "weight_cast"),
            SavedTensor("MLP weights (bf16 casts)", 2 * mlp, "weight_cast")]  # fmt: skip

def loss_saved(tokens: int, vocab: int, option: str = "standard") -> list[SavedTensor]:
    """ForCausalLMLoss (loss/loss_utils.py): ``logits.float()`` then cross_entropy = log_softmax + nll_loss.

    log_softmax saves its fp32 output (4 per logit element, whatever the chunking: torchtune's
    CEWithChunkedOutputLoss keeps every chunk's output until backward); nll_loss the int64 targets and an
    fp32 scalar total weight. A fused linear-cross-entropy keeps no logits: see ``loss_transient``.
    """
    if option == "fused":
        return [SavedTensor("targets (int64)", 8 * tokens)]
    return [SavedTensor("log-softmax output (fp32)", 4 * tokens * vocab), SavedTensor("targets (int64)", 8 * tokens),
            SavedTensor("total weight (fp32 scalar)", 4)]  # fmt: skip

def total(xs: list[SavedTensor], kind: Kind = "activation") -> int:
    return sum(x.bytes for x in xs if x.kind == kind)
