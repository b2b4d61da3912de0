"""The output head and the loss in the step timelines (``memcalc.memory.engine.timeline``, ``timeline_pp``): what the final
norm and the head save, the loss's parts as the timelines name them, and the forward's largest tensor, against which
the loss's requests find a freed block or not (``memcalc.memory.allocator.reserved``)."""

from __future__ import annotations

from memcalc.memory.families.saved import LLAMA_STYLE, OTHER_NORMS
from memcalc.memory.families.saved_gemma import GEMMAS


def inside_log_softmax(lp, t: int) -> list[tuple[str, int]]:
    """Eager ``loss_parallel``'s forward moment, inside its ``_log_softmax`` at ``shifted - logsumexp``: the
    temporaries it holds there (``lp``: ``memcalc.memory.families.saved.loss_transient``'s parts after the fourth; shifted and
    its result alive together) beside the per-token max, sum and log-sum-exp of the ``t`` tokens (fp32, all-reduced;
    traced: tests/test_timeline_tp.py)."""
    return list(lp.names[4:]) + [("log-softmax's per-token max, sum, log-sum-exp (fp32)", 12 * t)]


def largest_tensor(x, d: int, r: int, sp: int, attention: str) -> int:
    """The forward's largest tensor (``x``: ``memcalc.memory.families.saved.shape``): the projections' inputs and outputs in
    the compute dtype ``d`` (whole-sequence under SP: the gathered inputs, the partial sums), the residual stream in
    the activations' dtype ``r`` (whole under autocast's SP: the fp32 gathered MLP input), the norms' fp32 upcast
    (the rank's 1/sp of the sequence), eager attention's scores (fp32 at most). A request larger than it finds no
    block the forward freed (``memcalc.memory.allocator.reserved``, "the forward's blocks")."""
    t, h = x.t, x.h
    largest = max(d * t * max(h, x.ffn, x.qw), r * t * h, 4 * t * h // sp)
    return max(largest, 4 * x.scores) if attention == "eager" else largest


def loss_rows(lp, compiled_loss: bool) -> tuple[str, str, str]:
    """The timeline's names for the loss's parts 1-3 (``saved.loss_transient``): the eager loss's rows keep their
    names (fp32 copy, saved log-softmax, fp32 gradients), a compiled loss's are its own parts'."""
    if compiled_loss:
        return lp.names[1][0], lp.names[2][0], lp.names[3][0]
    return "fp32 logits copy", "log-softmax output (fp32)", "loss gradients (fp32)"


def _chunk(lp, index: int) -> int:
    """Bytes of the loss's parts (1 fp32 copy, 2 saved log-softmax, 3 the two fp32 gradients)."""
    return lp.names[index][1] if index < len(lp.names) else 0


def _head(x, family: str, regime: str, loss: str, code: str = "hf", device: str = "cpu") -> list[tuple[str, int]]:
    """Saved between the last layer and the logits: the final norm's tensors (its input is the last layer's
    output, already counted), the head's input and, under autocast, the head weight's bf16 copy."""
    t, h = x.t, x.h
    amp = regime == "amp-bf16"
    if code == "torchtitan":  # nn.RMSNorm: CPU composite fp32 copy (bf16), rstd, fp32 normalized; CUDA fused: rstd
        norm = 4 * t if device == "cuda" else (4 * t * h if regime == "bf16" else 0) + 4 * t + 4 * t * h
    elif family in LLAMA_STYLE:  # LlamaRMSNorm: fp32 copy (a new tensor only under bf16), rstd, normalized
        norm = (4 * t * h if regime == "bf16" else 0) + 4 * t + (2 if regime == "bf16" else 4) * t * h
    elif family in OTHER_NORMS:  # GemmaRMSNorm, Olmo2RMSNorm: fp32 normalized in every regime; Gemma's 1 + weight
        norm = (4 * t * h if regime == "bf16" else 0) + 4 * t + (4 * h if family in GEMMAS else 0) + 4 * t * h
    else:
        norm = 2 * (2 if regime == "bf16" else 4) * t
    out = [("final norm saved", norm)]
    if amp:
        out += [("head input (bf16 cast)", 2 * t * h), ("head weight (bf16 cast)", 2 * h * x.vocab)]
    if loss == "fused":
        out.append(("fused loss: input gradient", (2 if regime != "fp32" else 4) * t * h))
    return out


__all__ = ["inside_log_softmax", "largest_tensor", "loss_rows"]
