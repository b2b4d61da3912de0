"""Megatron-Bridge's recipe overrides (``section.field=value`` of its ``ConfigContainer``, megatron/bridge/training/
config.py, and ``mixed_precision=NAME``) as the Megatron-LM options they set, applied in order as Bridge applies them;
``memcalc.configs.megatron`` reads the result as any Megatron-LM argument list."""

from __future__ import annotations

from memcalc.configs.reading import Collector, near

BRIDGE = {
    "model.tensor_model_parallel_size": "--tensor-model-parallel-size",
    "model.pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "model.virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "model.context_parallel_size": "--context-parallel-size",
    "model.expert_model_parallel_size": "--expert-model-parallel-size",
    "model.sequence_parallel": "--sequence-parallel",
    "model.recompute_granularity": "--recompute-granularity", "model.recompute_method": "--recompute-method",
    "model.recompute_num_layers": "--recompute-num-layers", "model.recompute_modules": "--recompute-modules",
    "model.seq_length": "--seq-length", "dataset.sequence_length": "--seq-length",
    "model.num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "model.num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "model.account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "model.account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "train.micro_batch_size": "--micro-batch-size", "train.global_batch_size": "--global-batch-size",
    "ddp.use_distributed_optimizer": "--use-distributed-optimizer",
    "optimizer.use_distributed_optimizer": "--use-distributed-optimizer",
    "model.fp8": "--fp8-format", "model.fp8_recipe": "--fp8-recipe", "model.fp8_param_gather": "--fp8-param-gather",
    "ddp.fp8_param_gather": "--fp8-param-gather", "mixed_precision.fp8_param_gather": "--fp8-param-gather",
    "comm_overlap.defer_embedding_wgrad_compute": "--defer-embedding-wgrad-compute",
    "model.defer_embedding_wgrad_compute": "--defer-embedding-wgrad-compute",
    "comm_overlap.wgrad_deferral_limit": "--wgrad-deferral-limit", "model.wgrad_deferral_limit": "--wgrad-deferral-limit",
}  # fmt: skip
"""Megatron-Bridge's recipe overrides (``section.field=value``, its ``ConfigContainer``: megatron/bridge/training/
config.py) as the Megatron-LM options they set."""
BRIDGE_NEGATED = {"ddp.grad_reduce_in_fp32": "--grad-reduce-in-bf16",
                  "mixed_precision.grad_reduce_in_fp32": "--grad-reduce-in-bf16"}
"""Overrides whose false sets a Megatron-LM flag (``grad_reduce_in_fp32=False``: ``--grad-reduce-in-bf16``)."""
BRIDGE_PRECISION = {
    "bf16_mixed": ["--bf16"], "fp16_mixed": ["--fp16"],
    "bf16_with_fp8_current_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                                            "--fp8-param-gather"],
    "bf16_with_fp8_delayed_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                                            "--fp8-param-gather"],
    "bf16_with_fp8_subchannel_scaling_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "bf16_with_mxfp8_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
}  # fmt: skip
"""``mixed_precision=NAME``: Megatron-Bridge's precision recipes (megatron/bridge/training/mixed_precision.py: the FP8
current and delayed scaling recipes set ``fp8_param_gather=True``; ``grad_reduce_in_fp32`` stays True in every recipe,
the performance scripts turn it off)."""
BRIDGE_PASSED = ("train.", "logger.", "checkpoint.", "scheduler.", "optimizer.", "dataset.", "tokenizer.", "rng.",
                 "profiling.", "comm_overlap.", "ft.", "straggler.", "nvrx_straggler.", "inprocess_restart.")
"""Sections whose other fields do not change what a GPU holds (learning rate, logging, data, checkpoints, the other
communication-overlap switches)."""


def overrides(c: Collector, tokens: list[str], flags: tuple[str, ...]) -> list[str]:
    """The tokens with each Megatron-Bridge override replaced by its Megatron-LM words, applied in order as Bridge
    applies them: a flag set twice (a recipe's and an override's) is one flag, a flag set false later is off.
    ``flags``: the Megatron-LM options that take no value."""
    out: list[str] = []
    for tok in tokens:
        if not _is_override(tok):
            out.append(tok)
            continue
        for word in _bridge(c, tok, flags):
            if word.startswith("!"):
                out = [w for w in out if w != word[1:]]
            elif word not in flags or word not in out:
                out.append(word)
    return out


def _is_override(token: str) -> bool:
    key = token.partition("=")[0]
    return not token.startswith("--") and "=" in token and ("." in key or key == "mixed_precision")


def _bridge(c: Collector, token: str, flags: tuple[str, ...]) -> list[str]:
    """One Megatron-Bridge override as the Megatron-LM words it stands for."""
    key, _, raw = token.partition("=")
    value = raw.strip().strip("'\"")
    if key == "mixed_precision":
        if value not in BRIDGE_PRECISION:
            raise c.fail(key, f"{value!r} is not a precision recipe memcalc reads{near(value, BRIDGE_PRECISION)}; "
                              f"accepted: {', '.join(BRIDGE_PRECISION)}")
        return BRIDGE_PRECISION[value]
    if key in BRIDGE_NEGATED:
        if value.lower() not in ("true", "false"):
            raise c.fail(key, f"{value!r} is not accepted; accepted: true, false")
        return [BRIDGE_NEGATED[key] if value.lower() == "false" else "!" + BRIDGE_NEGATED[key]]
    opt = BRIDGE.get(key)
    if opt is None:
        if key.startswith(BRIDGE_PASSED):
            c.ignore(key, "no effect on the memory held")
            return []
        raise c.fail(key, f"unknown Megatron-Bridge override{near(key, BRIDGE) or ''} (memcalc reads the parallel "
                          "layout, batch, precision and recompute fields)")
    off = value.lower() in ("none", "null", "false", "")
    if opt in flags:
        if not off and value.lower() != "true":
            raise c.fail(key, f"{value!r} is not accepted; accepted: true, false")
        return ["!" + opt if off else opt]
    if off:
        return []
    if opt == "--recompute-modules":
        return [opt, *[m.strip().strip("'\"") for m in value.strip("[]").split(",") if m.strip()]]
    return [opt, value]
