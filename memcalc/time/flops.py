"""Exact FLOPs of one training step, matmul by matmul.

Sources:
- A matmul of an (m x k) by a (k x n) matrix costs 2·m·k·n FLOPs; backward computes dX and dW, each as large as the
  forward: backward = 2 x forward (Kaplan et al. 2020, arXiv 2001.08361 §2.1; Narayanan et al. 2021, arXiv 2104.04473
  §5.1). Element-wise work (norms, softmax, activations) is left out, as both papers do.
- Megatron (Korthikanti et al. 2022, arXiv 2205.05198, §6 / Appendix A): model FLOPs per iteration of a GPT model
  72·B·L·s·h²·(1 + s/(6h) + V/(12·h·L)); with full recompute (Narayanan et al. 2021, eq. 3) 96·B·L·s·h²·(1 + s/(6h) +
  V/(16·h·L)). Both count attention without causal masking: QKᵀ and attention x V cost 2·s²·h each per layer and
  sequence. torchtitan and PaLM (Chowdhery et al. 2022, Appendix B) use the same convention: 6·N + 12·L·h·s per token.
- ``attention="causal"`` counts the work a causal kernel really does: s(s+1)/2 query-key pairs instead of s², and on
  a sliding-window layer (Gemma 2 and 3) the pairs its window allows, w(w+1)/2 + (s - w)·w once s > w.
- MFU counts model FLOPs (no recompute); HFU adds what recompute runs again: a whole forward of every layer (full) or
  the attention core (selective, Korthikanti §5), or every second weight matmul of a layer in call order (op:
  torchtitan's per-op selective AC, torchtitan/parallelisms/parallelize_llama.py ``_custom_policy``, "Saves output of
  all compute ops, except every second mm"; SDPA's output is saved), never the output head.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.model.params import kv_heads_per_rank

AttentionCount = Literal["full", "causal"]
Recompute = Literal["none", "selective", "full", "op"]


@frozen
class Gemm:
    """A weight matmul one token goes through: (1 x k) @ (k x n), ``count`` times (MoE: top_k experts)."""

    name: str
    k: int
    n: int
    count: int = 1

    @property
    def flops_per_token(self) -> int:
        return 2 * self.k * self.n * self.count


@cache
def layer_gemms(arch: Architecture, moe: bool, tp: int = 1) -> tuple[Gemm, ...]:
    """The weight matmuls of one decoder layer on one TP rank (column-parallel q/k/v/gate/up, row-parallel o/down)."""
    h, d = arch.hidden, arch.d_head
    q = arch.q_width // tp
    kv = kv_heads_per_rank(arch, tp) * d
    out = [Gemm("q", h, q), Gemm("k", h, kv), Gemm("v", h, kv), Gemm("o", q, h)]

    def mlp(prefix: str, f: int, count: int) -> list[Gemm]:
        f //= tp
        ups = [Gemm(f"{prefix}gate", h, f, count), Gemm(f"{prefix}up", h, f, count)] if arch.gated_mlp else [
            Gemm(f"{prefix}up", h, f, count)]  # fmt: skip
        return [*ups, Gemm(f"{prefix}down", f, h, count)]

    if not moe:
        return tuple(out + mlp("", arch.ffn_size, 1))
    out.append(Gemm("router", h, arch.experts))
    out += mlp("expert ", arch.expert_ffn_size, arch.top_k)
    if arch.shared_experts:
        out += mlp("shared ", arch.ffn_size, arch.shared_experts)
    return tuple(out)


def op_recomputed(gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """The matmuls torchtitan's per-op selective AC runs again in backward: the 2nd, 4th, ... in forward call order
    (q, k, v, o, gate, up, down: k, o, up), its mm counter restarting in each block."""
    return gemms[1::2]


def head_gemm(arch: Architecture, tp: int = 1) -> Gemm:
    """The output head over the padded vocabulary (Megatron's V), split over TP ranks."""
    return Gemm("lm_head", arch.hidden, -(-arch.padded_vocab // tp))


def attention_pairs(seq: int, attention: AttentionCount = "full", window: int | None = None) -> int:
    """Query-key pairs one head computes over a sequence of ``seq`` tokens: all s² (``full``), the causal ones,
    s(s+1)/2, or with a sliding ``window`` (causal, each query sees itself and the window - 1 tokens before it:
    transformers' masking_utils ``sliding_window_overlay``, ``kv_idx > q_idx - sliding_window``) Σ min(i + 1, w) =
    w(w+1)/2 + (s - w)·w once s > w."""
    if attention == "full":
        return seq * seq
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


def attention_core_flops(arch: Architecture, seq: int, attention: AttentionCount = "full", tp: int = 1,
                         window: int | None = None) -> int:  # fmt: skip
    """Forward FLOPs of QKᵀ and attention x V for one sequence in one layer: 2 matmuls x 2·pairs·(heads·d)/t
    (``window``: a sliding layer's, counted by the causal convention only)."""
    return 2 * 2 * attention_pairs(seq, attention, window) * (arch.q_width // tp)


def layer_window(arch: Architecture, index: int) -> int | None:
    """The sliding window of layer ``index`` (Gemma 2 and 3 ``layer_types``), None for a full-attention layer."""
    return arch.sliding_window if index in arch.sliding_layers else None


@frozen
class StepFlops:
    """FLOPs of one step over ``sequences`` sequences of ``seq`` tokens, whole model (all ranks together)."""

    layer_matmul_forward: int
    """Weight matmuls of all layers (router included)."""
    attention_forward: int
    """QKᵀ and attention x V of all layers, in the step's attention convention."""
    head_forward: int
    recompute: int
    attention: AttentionCount

    @property
    def forward(self) -> int:
        return self.layer_matmul_forward + self.attention_forward + self.head_forward

    @property
    def backward(self) -> int:
        return 2 * self.forward

    @property
    def model(self) -> int:
        """MFU's numerator: forward + backward, no recompute."""
        return self.forward + self.backward

    @property
    def hardware(self) -> int:
        """HFU's numerator: model FLOPs + what recompute runs again."""
        return self.model + self.recompute


@cache
def step_flops(arch: Architecture, seq: int, sequences: int, recompute: Recompute = "none",
               attention: AttentionCount = "full") -> StepFlops:  # fmt: skip
    """FLOPs of a training step of ``sequences`` x ``seq`` tokens (global batch)."""
    if seq < 1 or sequences < 1:
        raise InputError(f"seq {seq} and sequences {sequences} must be positive")
    recompute = policy_name(recompute)  # type: ignore[assignment]
    if attention not in ("full", "causal"):
        raise InputError(f"attention count {attention!r} is not one of full, causal")
    tokens = seq * sequences
    per_token = sum(g.flops_per_token for i in range(arch.layers) for g in layer_gemms(arch, arch.is_moe_layer(i)))
    layers = per_token * tokens
    per_layer = [sequences * attention_core_flops(arch, seq, attention, window=layer_window(arch, i))
                 for i in range(arch.layers)]  # fmt: skip
    attn = sum(per_layer)
    head = head_gemm(arch).flops_per_token * tokens
    extra = 0
    for i, attn_layer in enumerate(per_layer):
        how = layer_policy(recompute, i)
        gemms = layer_gemms(arch, arch.is_moe_layer(i))
        if how == "op":
            extra += tokens * sum(g.flops_per_token for g in op_recomputed(gemms))
        elif how == "selective":
            extra += attn_layer
        elif how == "full":
            extra += tokens * sum(g.flops_per_token for g in gemms) + attn_layer
    return StepFlops(layers, attn, head, extra, attention)


def policy_name(recompute: str) -> str:
    """A recompute policy as the step model names it: none, selective, full, op (torchtitan's per-op selective AC;
    ``op-sac`` as the memory side names it) or every:K (every K-th layer fully, torchtitan's layer AC)."""
    if recompute == "op-sac":
        return "op"
    head, _, k = recompute.partition(":")
    if head in ("selective", "full") and k:
        from memcalc.memory.families.megatron_saved import megatron_recompute

        if not megatron_recompute(recompute):
            raise InputError(f"recompute {recompute!r} is not one of none, selective, full, op (op-sac), every:K, "
                             "selective:MODULES, full:uniform:N, full:block:N")
        # Megatron-Core's: the step model counts full:uniform:N and full:block:N as every layer recomputed (block
        # recomputes the first N layers of each chunk: an upper bound), selective modules with mlp as full (the MLP's
        # GEMMs are most of a layer's; an upper bound by the attention projections) and the others as core attention
        # (the norms' and activations' recompute is element-wise)
        return "full" if head == "full" or "mlp" in k.split("+") else "selective" if "core_attn" in k else "none"
    if recompute in ("none", "selective", "full", "op") or (head == "every" and k.isdigit() and int(k) >= 1):
        return recompute
    raise InputError(f"recompute {recompute!r} is not one of none, selective, full, op (op-sac), every:K")


def layer_policy(recompute: str, index: int) -> str:
    """What layer ``index`` recomputes: every:K checkpoints the layers whose index is a multiple of K (torchtitan
    ``apply_ac``: ``if layer_id % ac_freq == 0``), fully; the other policies apply to every layer."""
    if recompute.startswith("every:"):
        return "full" if index % int(recompute[6:]) == 0 else "none"
    return "op" if recompute == "op-sac" else policy_name(recompute)


def model_flops_per_token(arch: Architecture, seq: int, attention: AttentionCount = "full") -> float:
    """Model FLOPs per trained token (forward + backward): 6·N_matmul + 12·L·(heads·d)·s for ``full``."""
    return step_flops(arch, seq, 1, "none", attention).model / seq


def megatron_model_flops(batch: int, layers: int, seq: int, hidden: int, vocab: int) -> int:
    """Korthikanti et al. 2022 (arXiv 2205.05198) §6: 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)), multiplied out exactly."""
    B, L, s, h, V = batch, layers, seq, hidden, vocab
    return 72 * B * L * s * h * h + 12 * B * L * s * s * h + 6 * B * s * h * V


def narayanan_hardware_flops(batch: int, layers: int, seq: int, hidden: int, vocab: int) -> int:
    """Narayanan et al. 2021 (arXiv 2104.04473) eq. 3, full recompute: 96·B·s·l·h²·(1 + s/(6h) + V/(16lh))."""
    B, L, s, h, V = batch, layers, seq, hidden, vocab
    return 96 * B * L * s * h * h + 16 * B * L * s * s * h + 6 * B * s * h * V
