"""Megatron-LM options the argument reader does not read itself: which change nothing a GPU holds (read past and
listed as ignored) and which do (listed as not modelled, so that the paper accounting answers and says why), from
Megatron-LM's own vocabulary (``memcalc.configs.megatron_vocabulary``). An option Megatron-LM does not have is a
mistake: one line, exit 2."""

from __future__ import annotations

from typing import Any

from memcalc.configs.megatron_vocabulary import FLAGS, GROUPS, LISTS

GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}
"""option -> its argparse group's title."""
NO_EFFECT_GROUPS = frozenset({
    "checkpointing", "data and dataloader", "logging", "learning rate and weight decay", "tokenizer", "validation",
    "one logger", "straggler", "rerun engine", "ft_package", "autoresume", "In-process restart", "profiling",
    "workload inspector", "msc", "RNG and initialization",
})  # fmt: skip
"""Groups whose options change when, where and what is logged, saved, loaded or fed, never a tensor a training step
holds on the GPU (megatron/training/arguments.py ``_add_checkpointing_args``, ``_add_data_args``, ...)."""
READ_PAST = {
    "--distributed-timeout-minutes": "a timeout",
    "--exit-duration-in-mins": "when the job stops",
    "--manual-gc": "when Python's collector runs (megatron/training/training.py), not what CUDA holds",
    "--manual-gc-interval": "when Python's collector runs",
    "--calculate-per-token-loss": "how the loss is normalised, not its tensors",
    "--cross-entropy-loss-fusion": "the same tensors: core/fusions/fused_cross_entropy.py runs cross_entropy.py's steps "
                                   "(the fp32 copy of the logits, the fp32 softmax saved), fused",
    "--apply-layernorm-1p": "the norm's weight offset by one, the same tensors",
    "--rotary-percent": "the share of each head rotated, the same tensors",
    "--fp8-amax-history-len": "delayed scaling's amax history, a few floats per GEMM",
    "--fp8-amax-compute-algo": "how delayed scaling reduces its history",
    "--empty-unused-memory-level": "the caching allocator emptied between iterations (the peak inside a step stays)",
    "--use-flash-attn": "the attention kernel; Transformer Engine saves the same output and log-sum-exp",
    "--attention-softmax-in-fp32": "the unfused softmax's precision; fused attention saves no scores",
    "--no-masked-softmax-fusion": "the unfused softmax; fused attention saves no scores",
    "--no-bias-dropout-fusion": "the bias-dropout-add's kernel",
    "--no-bias-swiglu-fusion": "the activation's kernel",
    "--no-rope-fusion": "the rotary kernel",
    "--no-gradient-accumulation-fusion": "the weight-gradient GEMM's accumulation kernel",
    "--no-overlap-p2p-communication": "when the pipeline's sends run",
    "--no-align-grad-reduce": "when gradient buckets are reduced",
    "--no-align-param-gather": "when parameters are gathered",
    "--ddp-bucket-size": "the gradient buckets' size inside the contiguous buffer (the buffer is the same bytes)",
    "--vocab-size": "the tokenizer's vocabulary; the model's comes from --model",
}  # fmt: skip
"""Options of the other groups that change no tensor a step holds, each with why (Megatron-LM's code)."""
ZERO_ONLY = ("--attention-dropout", "--hidden-dropout")
"""Dropout probabilities: 0 saves no mask (read past); above 0 the masks are not modelled."""


def arity(opt: str) -> int:
    """Words ``opt`` takes: 0 (a flag), 1, or -1 (a list, up to the next option)."""
    return 0 if opt in FLAGS else -1 if opt in LISTS else 1


def classify(opt: str, value: Any) -> tuple[str, str] | None:
    """("ignored" | "unmodelled", why) for a Megatron-LM option the reader does not read; None: not Megatron's."""
    group = GROUP_OF.get(opt)
    if group is None:
        return None
    if group in NO_EFFECT_GROUPS:
        return "ignored", f"no effect on what a GPU holds (Megatron-LM's {group} options)"
    if opt in READ_PAST:
        return "ignored", READ_PAST[opt]
    if opt in ZERO_ONLY:
        try:
            zero = float(value) == 0
        except (TypeError, ValueError):
            zero = False
        if zero:
            return "ignored", "no dropout, no mask saved"
        return "unmodelled", f"dropout {value}: its masks are not counted"
    return "unmodelled", f"a Megatron-LM {group} option the realistic accounting does not model"
