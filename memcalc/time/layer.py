"""One decoder layer's and the head's time on one GPU: GEMMs at the calibrated efficiency of their shape, attention
by its kernel, the element-wise ops by the bytes they move (``memcalc.time.step`` adds them into a step)."""

from __future__ import annotations

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.time.flops import attention_core_flops, head_gemm, layer_gemms, op_recomputed
from memcalc.time.hardware import Calibration
from memcalc.time.moved import eager_attention_bytes, elementwise_bytes

_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "tf32": 4}  # fp8 GEMMs keep 16-bit activations between ops


@frozen
class LayerTime:
    """Seconds for one layer and one micro-batch on one rank."""

    matmul_fwd: float
    attention_fwd: float
    attention_bwd: float
    memory_fwd: float
    matmul_op_recompute: float = 0.0
    """Forward seconds of the matmuls per-op selective AC runs again (every second one in call order)."""

    @property
    def forward(self) -> float:
        return self.matmul_fwd + self.attention_fwd + self.memory_fwd

    @property
    def backward(self) -> float:
        return 2 * self.matmul_fwd + self.attention_bwd + 2 * self.memory_fwd

    def recompute(self, how: str) -> float:
        if how == "op":
            return self.matmul_op_recompute + self.memory_fwd
        return {"none": 0.0, "selective": self.attention_fwd, "full": self.forward}[how]


_FLOAT8_GEMMS = ("q", "k", "v", "o", "gate", "up", "down")
"""The decoder layer's projections: the linears torchao converts (``memcalc.model.float8``)."""


def gemm_s(cal: Calibration, peak: float, flops: float) -> float:
    return flops / (peak * cal.gemm(flops)) if flops else 0.0


def layer_time(arch: Architecture, moe: bool, cal: Calibration, dtype: str, seq: int, micro_batch: int, tp: int = 1,
               cp: int = 1, ep: int = 1, sp: bool = False, attention: str = "flash", dropout: bool = False,
               float8: str = "none", elementwise: str = "fused", residual_bytes: int = 0, window: int | None = None,
               sliding: str = "window") -> LayerTime:  # fmt: skip
    """One decoder layer for one micro-batch of ``micro_batch`` x ``seq`` tokens on one TP/CP/EP rank (``window``:
    a sliding layer's window, run as ``sliding`` says: ``Plan.sliding``)."""
    peak, e = cal.peak(dtype), _DTYPE_BYTES[dtype]
    # Float8: the projections' GEMMs at the fp8 peak, on the same efficiency curve (torchao's roofline takes one
    # achievable fraction, 0.78, for bf16 and fp8: roofline_utils.py)
    peak8 = cal.peak("fp8") if float8 != "none" else peak
    m = seq // cp * micro_batch  # tokens on this rank
    mm = op = 0.0
    gemms = layer_gemms(arch, moe, tp)
    again = set(op_recomputed(gemms))
    for g in gemms:
        if g.name in _FLOAT8_GEMMS and float8 != "none":
            t = g.count * gemm_s(cal, peak8, 2 * m * g.k * g.n)
        elif g.name.startswith("expert "):
            # Balanced routing: each of the E/ep local experts receives top_k·ep·m/E tokens (arXiv 2006.16668 §2.2).
            rows = g.count * ep * m / arch.experts
            t = arch.experts // ep * gemm_s(cal, peak, 2 * rows * g.k * g.n)
        else:
            t = g.count * gemm_s(cal, peak, 2 * m * g.k * g.n)
        mm += t
        op += t if g in again else 0.0
    if attention == "te":  # Transformer Engine: cuDNN's fused attention where the GPU has that curve (Hopper on)
        attention = "cudnn" if any(k == "cudnn" for k, _ in cal.attention_efficiency) else "flash"
    # Context parallelism: this rank's s/cp queries against the whole sequence = 1/cp of the pairs.
    if attention in ("flash", "cudnn"):
        if window is not None and sliding == "masked" and seq >= window:  # every pair, the mask applied to each
            fwd = micro_batch * attention_core_flops(arch, seq, "full", tp) / cp
        else:  # causal: the blocks above the diagonal (and, with a window, left of it) are skipped
            fwd = micro_batch * attention_core_flops(arch, seq, "causal", tp, window) / cp
        # curve keyed, as measured, by one kernel call's fwd+bwd FLOPs = 3.5 x forward; under context parallelism
        # the ring calls the kernel once per step, each on 1/cp of this rank's pairs (torch's
        # _templated_ring_attention, Transformer Engine's attn_forward_func_with_cp: one call per ring step)
        eff = cal.attention(attention, 3.5 * fwd / cp)
        attn_f, attn_b = fwd / (peak * eff), 2.5 * fwd / (peak * eff)
    elif attention == "eager":
        fwd = micro_batch * attention_core_flops(arch, seq, "full", tp) / cp  # batched GEMMs skip nothing
        scores = micro_batch * (arch.heads // tp) * seq * seq / cp
        # the scores' round trips through HBM between the two batched matmuls, as the model code makes them
        soft_f, soft_b = eager_attention_bytes("hf" if elementwise == "hf" else "fused", e, residual_bytes or e,
                                               dropout)  # fmt: skip
        attn_f = gemm_s(cal, peak, fwd) + scores * soft_f / cal.hbm_bytes_per_s
        attn_b = 2 * gemm_s(cal, peak, fwd) + scores * soft_b / cal.hbm_bytes_per_s
    else:
        raise InputError(f"attention {attention!r} is not one of flash, cudnn, te, eager")
    h = arch.hidden
    f = (arch.expert_ffn_size * arch.top_k + arch.ffn_size * arch.shared_experts) if moe else arch.ffn_size
    norm_b, rot_b = elementwise_bytes(elementwise, e, residual_bytes or e)
    if arch.norm != "rmsnorm":  # nn.LayerNorm is one native kernel in every code base
        norm_b = 2.0 * (residual_bytes or e)
    r = residual_bytes or e
    # two residual adds (read the stream and the branch's output, write the stream); dropout (read, write, 1-byte mask)
    replicated = arch.norms_per_layer * norm_b * h + 2 * (2 * r + e) * h + (2 * (2 * e + 1) * h if dropout else 0)
    weight_casts = 0.0
    if r > e:  # torch.autocast on an fp32 stream (autocast_mode.cpp: linear is in the lower-precision cast list)
        # each projection casts its fp32 input to e bytes (read r, write e); the cast cache keeps only the weights
        # (leaves), so q, k and v cast the same normed input three times, gate and up twice
        replicated += ((1 if arch.fused_qkv else 3) + (2 if arch.gated_mlp else 1)) * (r + e) * h
        # the weights, cast once per forward (and again by a recomputed forward), and their gradients cast back to
        # fp32 in backward: r + e bytes each way per weight; a third counted as forward (the convention below)
        weights = sum((arch.experts // ep if g.name.startswith("expert ") else g.count) * g.k * g.n for g in gemms)
        weight_casts = 2 * (r + e) * weights / 3 / cal.hbm_bytes_per_s
    split = (5 if arch.gated_mlp else 2) * e * f  # silu read/write + mul read 2 write 1; gelu read/write
    if arch.position == "rotary" and elementwise == "fused":
        split += 2 * e * (arch.q_width + 2 * arch.kv_width)  # read and write q and k (kv_width counted twice: k only)
    elif arch.position == "rotary":
        split += rot_b * (arch.q_width + arch.kv_width)  # q and k, each element through the eager ops
    per_token = replicated / (tp if sp else 1) + split / tp
    casts = 0.0
    if float8 != "none":  # forward, input-gradient and weight-gradient casts: a third counted as forward
        from memcalc.model.float8 import cast_bytes

        casts = cast_bytes(arch, float8, m, tp) / 3 / cal.hbm_bytes_per_s
    return LayerTime(mm, attn_f, attn_b, m * per_token / cal.hbm_bytes_per_s + casts + weight_casts, op)


def head_time(arch: Architecture, cal: Calibration, dtype: str, tokens: int, tp: int) -> tuple[float, float]:
    """(matmul seconds fwd+bwd, loss seconds) of the output head and cross-entropy for ``tokens`` on one TP rank."""
    g = head_gemm(arch, tp)
    fwd = gemm_s(cal, cal.peak(dtype), 2 * tokens * g.k * g.n)
    return 3 * fwd, tokens * g.n * cal.cross_entropy_bytes_per_logit / cal.hbm_bytes_per_s

