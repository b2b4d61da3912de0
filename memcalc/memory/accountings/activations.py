"""Activation memory: the tensors a transformer layer saves for backward, one by one.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, §4.1 (what a GPT block saves: attention 11sbh + 5as²b, MLP 19sbh, LayerNorms 4sbh with
16-bit activations and 1-byte dropout masks), §4.2 (tensor and sequence parallelism, Table 2), §5
(selective recompute drops the 5as²b core-attention terms; full recompute keeps the layer input 2sbh).

Each tensor is derived from the op that saves it, so gated MLPs, GQA, flash attention, no dropout and
fp32 come out right instead of reusing 34. With ``paper=True`` (the default accounting) the per-token
norm statistics are left out and RMSNorm is counted like LayerNorm, as the paper does; with
``paper=False`` the tensors are what PyTorch really keeps (measured with saved_tensors_hooks on CPU,
torch 2.13): LayerNorm mean/rstd (fp32 on CUDA, activation dtype on CPU), RMSNorm's fp32 copies on CPU,
and SDPA's math fallback in fp32 on CPU when dropout is on.
"""

from __future__ import annotations

from typing import Literal

from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.model.params import kv_heads_per_rank
from memcalc.units import ceil_div

Device = Literal["cuda", "cpu"]
Attention = Literal["eager", "flash", "sdpa"]
Recompute = Literal["none", "selective", "full", "op-sac"]
Split = Literal["tp", "seq", "none"]
"""tp: split over tensor-parallel ranks; seq: replicated under TP, split by sequence parallelism."""


@frozen
class Saved:
    """One tensor kept for backward, per micro-batch, before TP/SP splitting."""

    name: str
    bytes: int
    split: Split
    core: bool = False
    """Part of core attention (QKᵀ, softmax, dropout, ·V): dropped by selective recompute."""


@frozen
class Setting:
    """How the block runs: everything but the shape."""

    s: int
    """Sequence length on this rank (after context parallelism)."""
    b: int
    """Micro-batch size."""
    dtype_bytes: int
    """Activation dtype: 2 for fp16/bf16, 4 for fp32."""
    dropout: bool
    device: Device = "cuda"
    attention: Attention = "eager"
    paper: bool = True

    @property
    def mask_bytes(self) -> int:
        """CUDA's fused dropout keeps a 1-byte bool mask; CPU dropout multiplies by a noise tensor in the activation dtype."""
        return 1 if self.device == "cuda" else self.dtype_bytes

    @property
    def core_attention_bytes(self) -> int:
        """dtype of the eager/math attention core: on CPU, SDPA's math kernel upcasts 16-bit inputs to fp32."""
        if self.attention == "sdpa" and self.device == "cpu":
            return 4
        return self.dtype_bytes

    @property
    def kernel(self) -> Literal["eager", "flash"]:
        """What actually runs. SDPA picks a fused kernel, except on CPU with dropout, where it falls back to math."""
        if self.attention == "sdpa":
            return "eager" if (self.device == "cpu" and self.dropout) else "flash"
        return self.attention


def norm_saved(arch: Architecture, st: Setting, label: str) -> list[Saved]:
    """A norm's saved tensors: its input, and (implementation accounting) its per-token statistics.

    LayerNorm (aten native_layer_norm) saves input, mean and rstd: fp32 on CUDA, the activation dtype on
    CPU. RMSNorm: CUDA's fused kernel saves input and an fp32 rstd; the CPU composite keeps an fp32 copy of
    the input, the fp32 normalized tensor and an fp32 rstd.
    """
    t, d, h = st.s * st.b, st.dtype_bytes, arch.hidden
    if st.paper:
        return [Saved(f"{label} input", t * h * d, "seq")]
    if arch.norm == "rmsnorm":
        if st.device == "cpu":
            return [Saved(f"{label} input (fp32)", t * h * 4, "seq"), Saved(f"{label} normalized (fp32)", t * h * 4, "seq"),
                    Saved(f"{label} rstd (fp32)", t * 4, "seq")]  # fmt: skip
        return [Saved(f"{label} input", t * h * d, "seq"), Saved(f"{label} rstd (fp32)", t * 4, "seq")]
    stat = 4 if st.device == "cuda" else d
    return [Saved(f"{label} input", t * h * d, "seq"), Saved(f"{label} mean, rstd", 2 * t * stat, "seq")]


def attention_saved(arch: Architecture, st: Setting, tp: int = 1) -> list[Saved]:
    """Attention block without its norm: QKV input, Q/K/V, core attention, output-projection input, dropout mask.

    Korthikanti §4.1 (eager, MHA): 2sbh QKV input + 4sbh Q,K + 2sbh V + 2as²b softmax + as²b mask + 2as²b
    dropout output + 2sbh projection input + sbh mask = 11sbh + 5as²b. Eager GQA repeats K and V to every
    head before the matmuls, so they are saved at full width; flash kernels keep K and V at KV width, the
    output and an fp32 log-sum-exp per head and token, and no score matrix.
    """
    t, d, m = st.s * st.b, st.dtype_bytes, st.mask_bytes
    a, qw = arch.heads, arch.q_width
    kvw = kv_heads_per_rank(arch, tp) * arch.d_head * tp  # KV width before the TP split (replicated heads count)
    out: list[Saved] = [Saved("QKV input", t * arch.hidden * d, "seq")]
    kernel = st.kernel
    if kernel == "eager":
        c = st.core_attention_bytes
        scores = a * st.s * st.s * st.b
        out += [Saved("Q, K", 2 * t * qw * c, "tp"), Saved("V", t * qw * c, "tp"),
                Saved("softmax output", scores * c, "tp", core=True)]  # fmt: skip
        if st.dropout:
            c_mask = m if c == d else c  # the math fallback's noise tensor is fp32 too
            out += [Saved("attention dropout mask", scores * c_mask, "tp", core=True),
                    Saved("attention dropout output", scores * c, "tp", core=True)]  # fmt: skip
        out.append(Saved("output projection input", t * qw * d, "tp"))
    else:
        out += [Saved("Q", t * qw * d, "tp"), Saved("K, V", 2 * t * kvw * d, "tp"),
                Saved("attention output", t * qw * d, "tp"),
                Saved("log-sum-exp (fp32)", 4 * a * t, "tp")]  # fmt: skip
        # The fused kernels lay the output out as [b, s, a, d]: the projection reads it as a view, no copy.
    if st.dropout:
        out.append(Saved("attention residual dropout mask", t * arch.hidden * m, "seq"))
    return out


def mlp_saved(arch: Architecture, st: Setting, width: int, with_input: bool = True, label: str = "MLP") -> list[Saved]:
    """Dense MLP: input + activation input + second-linear input (+ dropout mask).

    Korthikanti §4.1 (ffn = 4h, GELU): 2sbh + 8sbh + 8sbh + sbh = 19sbh. Gated (SwiGLU): the gate output
    (SiLU's input), SiLU's output and the up output (the product's operands), and the product (the down
    projection's input): 4 x sbf.
    """
    t, d = st.s * st.b, st.dtype_bytes
    out = [Saved(f"{label} input", t * arch.hidden * d, "seq")] if with_input else []
    if arch.gated_mlp:
        out += [Saved(f"{label} gate output", t * width * d, "tp"), Saved(f"{label} activation output", t * width * d, "tp"),
                Saved(f"{label} up output", t * width * d, "tp"), Saved(f"{label} down input", t * width * d, "tp")]  # fmt: skip
    else:
        out += [Saved(f"{label} activation input", t * width * d, "tp"), Saved(f"{label} fc2 input", t * width * d, "tp")]
    return out


def moe_saved(arch: Architecture, st: Setting) -> list[Saved]:
    """An MoE MLP: router probabilities (fp32 softmax over experts) and top_k expert MLPs per token.

    With balanced routing every rank processes as many token-expert pairs as its own tokens send
    (expert parallelism moves tokens, not their number): top_k x (dispatched input + expert MLP) + the
    combine's inputs; shared experts run on every token.
    """
    t, d, k = st.s * st.b, st.dtype_bytes, arch.top_k
    out = [Saved("MLP input", t * arch.hidden * d, "seq"), Saved("router probabilities (fp32)", 4 * t * arch.experts, "seq")]
    for x in mlp_saved(arch, st, arch.expert_ffn_size, label="expert"):
        out.append(Saved(f"{x.name} (x{k} experts)", x.bytes * k, "tp"))
    out.append(Saved(f"expert outputs (x{k}, for the combine)", k * t * arch.hidden * d, "seq"))
    for i in range(arch.shared_experts):
        out += mlp_saved(arch, st, arch.ffn_size, with_input=False, label=f"shared expert {i + 1}")
    return out


def layer_saved(arch: Architecture, st: Setting, moe: bool = False, tp: int = 1) -> list[Saved]:
    """Every tensor one decoder layer saves, per micro-batch, before splitting (recompute not applied)."""
    t, m = st.s * st.b, st.mask_bytes
    out = norm_saved(arch, st, "norm 1")
    attn = attention_saved(arch, st, tp)
    mlp = moe_saved(arch, st) if moe else mlp_saved(arch, st, arch.ffn_size)
    if arch.parallel_block:
        # Attention and MLP read the same input: one norm (Falcon-7B) shares its output with both; two norms
        # (NeoX) share their input.
        if arch.norms_per_layer == 1:
            mlp = [x for x in mlp if x.name != "MLP input"]
        else:
            out += [x for x in norm_saved(arch, st, "norm 2") if "input" not in x.name]
        out += attn + mlp
    else:
        out += attn + norm_saved(arch, st, "norm 2") + mlp
    if st.dropout:
        out.append(Saved("MLP residual dropout mask", t * arch.hidden * m, "seq"))
    return out


def split_bytes(x: Saved, tp: int, sp: bool) -> int:
    """Bytes one rank keeps of a tensor: /t for TP-split tensors, and for the rest too under sequence parallelism."""
    if x.split == "tp" or (x.split == "seq" and sp):
        return ceil_div(x.bytes, tp)
    return x.bytes


@frozen
class LayerActivations:
    """One layer's activations on one rank, per micro-batch."""

    tensors: list[tuple[str, int]]
    """(name, bytes) after splitting and recompute."""

    @property
    def total(self) -> int:
        return sum(b for _, b in self.tensors)


DTENSOR_GATHERED = ("QKV input", "MLP input")
"""Under DTensor tensor parallelism (torchtitan, accelerate) with sequence parallelism, ``PrepareModuleInput``
redistributes the normed input Shard(1) -> Replicate before attention and before the MLP, and autograd saves that
full-sequence tensor for the column-parallel projections' weight gradients (torchtitan parallelize.py
``apply_tp``; DOMAIN §10): s·b·h·d each, not divided by t. Megatron-LM saves its 1/t shard and gathers it again
in backward (Korthikanti §4.2.2)."""


def layer_activations(
    arch: Architecture, st: Setting, tp: int = 1, sp: bool = False, recompute: Recompute = "none", moe: bool = False,
    dtensor: bool = False,
) -> LayerActivations:
    """Korthikanti Table 2, tensor by tensor: none | selective (drops core attention) | full (keeps the input).

    With MHA, ffn = 4h, GELU, dropout and 1-byte masks: sbh(34 + 5as/h) with no parallelism;
    sbh(10 + 24/t + 5as/(ht)) with TP; (sbh/t)(34 + 5as/h) with TP+SP; selective sbh(10 + 24/t) and
    34sbh/t with SP; full recompute 2sbh (the layer input; /t when sequence parallel).
    """
    if recompute == "full":
        x = Saved("layer input (checkpoint)", st.s * st.b * arch.hidden * st.dtype_bytes, "seq")
        return LayerActivations([(x.name, split_bytes(x, tp, sp))])
    if recompute == "op-sac":
        return LayerActivations([(x.name, split_bytes(x, tp, sp)) for x in op_sac_saved(arch, st, moe)])
    saved = layer_saved(arch, st, moe, tp)
    if recompute == "selective":
        saved = [x for x in saved if not x.core]
    if dtensor and sp and tp > 1:  # the gathered inputs are saved whole (DTENSOR_GATHERED)
        return LayerActivations([(x.name, x.bytes if x.name in DTENSOR_GATHERED else split_bytes(x, tp, sp))
                                 for x in saved])
    return LayerActivations([(x.name, split_bytes(x, tp, sp)) for x in saved])


def op_sac_saved(arch: Architecture, st: Setting, moe: bool = False) -> list[Saved]:
    """torchtitan's per-op selective checkpointing (torchtitan/distributed/activation_checkpoint.py
    ``_get_custom_policy``): the block input, every second matmul output (q, v, the gate/w1 and the down/w2 projection
    of a dense MLP; an MoE layer's experts counted as one MLP of ``top_k`` times the tokens) and the attention kernel's
    output and fp32 log-sum-exp; the rest is recomputed (``memcalc.memory.engine.timeline_layers._op_sac``). Split as the
    tensors are: the column-parallel outputs over t, the block input and the row-parallel output by sequence
    parallelism."""
    t, d, h = st.s * st.b, st.dtype_bytes, arch.hidden
    kvw = arch.kv_width
    width = (arch.expert_ffn_size * arch.top_k + arch.ffn_size * arch.shared_experts) if moe else arch.ffn_size
    return [Saved("layer input (checkpoint)", t * h * d, "seq"), Saved("q, v outputs", t * (arch.q_width + kvw) * d, "tp"),
            Saved("gate (w1) output", t * width * d, "tp"), Saved("down (w2) output", t * h * d, "seq"),
            Saved("attention output", t * arch.q_width * d, "tp"), Saved("log-sum-exp (fp32)", 4 * arch.heads * t, "tp")]


# ---- outside the layers ---------------------------------------------------------------------------


def embedding_saved(arch: Architecture, st: Setting) -> list[Saved]:
    """First stage: the token ids (int64, for the embedding's backward) and the embedding dropout mask
    (Korthikanti §4.3); BLOOM's embedding norm."""
    t = st.s * st.b
    out = [Saved("token ids (int64)", 8 * t, "none")]
    if st.dropout:
        out.append(Saved("embedding dropout mask", t * arch.hidden * st.mask_bytes, "seq"))
    if arch.embedding_norm:
        out += norm_saved(arch, st, "embedding norm")
    return out


def output_saved(arch: Architecture, st: Setting) -> list[Saved]:
    """Last stage: final norm, the head's input, the logits s·b·v and the loss's fp32 copy 4·s·b·v.

    The logits (activation dtype) are alive when the loss runs; cross-entropy upcasts them to fp32 and
    log-softmax keeps its fp32 output for backward. Both split over t with a vocab-parallel head.
    """
    t, d, v = st.s * st.b, st.dtype_bytes, arch.padded_vocab
    out = norm_saved(arch, st, "final norm") if arch.final_norm else []
    out += [Saved("output head input", t * arch.hidden * d, "seq"), Saved("logits", t * v * d, "tp"),
            Saved("loss logits (fp32)", 4 * t * v, "tp")]  # fmt: skip
    return out


def rotary_saved(arch: Architecture, st: Setting) -> list[Saved]:
    """Rotary cos/sin tables (s x head_dim each), computed once per forward and shared by every layer."""
    if arch.position != "rotary" or st.paper:
        return []
    return [Saved("rotary cos, sin", 2 * st.s * arch.d_head * st.dtype_bytes, "none")]


def pipeline_in_flight(stage: int, pp: int, micro_batches: int, virtual: int = 1) -> float:
    """Micro-batches of its layers stage ``stage`` holds at once under 1F1B (Korthikanti §4.2.3, Eq. 5).

    Non-interleaved: min(p - i, m) (the first stage holds p, i.e. L layers' worth). Interleaved with v model
    chunks per device (Megatron's warm-up): 2(p - i - 1) + (v - 1)p + 1 chunks of L/(pv) layers, so the first
    stage holds L(1 + (p-1)/(pv)) layers' worth. Returned in units of the stage's L/p layers.
    """
    if virtual == 1:
        return float(min(pp - stage, micro_batches))
    chunks = min(2 * (pp - stage - 1) + (virtual - 1) * pp + 1, micro_batches * virtual)
    return chunks / virtual
