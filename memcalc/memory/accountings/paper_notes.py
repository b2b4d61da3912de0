"""The paper accounting's notes (what its rows leave out, float8, LoRA, a part-filled node); the realistic
accounting's notes take the float8 and LoRA lines from here too."""

from __future__ import annotations

from memcalc.layout.plan import Plan

FLOAT8_NOTE = ("float8 (torchao): the linears save what they save in bf16 (the high-precision input and weight, "
               "float8_linear.py); their fp8 casts are transient: the realistic accounting counts the eager down "
               "projection's backward casts (compiled layers fuse them), the paper accounting none; the step times "
               "the projections' GEMMs at the fp8 rate")
LORA_COMM_NOTE = ("LoRA: only the adapters' gradients are reduced; ZeRO-3/FSDP gather the frozen base with them "
                  "(NF4-packed under QLoRA), and FSDP1 wrapping base and adapters in one flat parameter would "
                  "reduce the whole flat gradient")


def notes(plan: Plan) -> list[str]:
    """What the paper's accounting leaves out, and what the user should know about this plan."""
    spec, out = plan.spec, []
    what = "model states" + (" and activations (Korthikanti et al. 2022)" if plan.work else "")
    out.append(f"accounting: paper ({what}); communication buckets and framework buffers are not included yet")
    if plan.work is None:
        out.append("activations are not counted: give the model's shape (--model ...) and --seq-len")
    if spec.shards_params:
        out.append("parameter sharding gathers one wrapped unit (a layer) at a time; its unsharded copy is transient "
                   "and not counted")
    if plan.offload_params != "none" and spec.shards_params:
        out.append("offloaded parameters are fetched to the GPU layer by layer; that working copy is not counted")
    if plan.optimizer.note:
        out.append(plan.optimizer.note)
    if plan.lora is not None and plan.shard_domain > 1:
        out.append(LORA_COMM_NOTE)
    if plan.float8 != "none":
        out.append(FLOAT8_NOTE)
    if plan.work is not None and plan.work.compile:
        out.append("--compile: the activations are the eager layer's (torch.compile's partitioner saves less: an "
                   "upper bound); the step time fuses the element-wise kernels")
    if plan.work is not None and plan.work.recompute == "op-sac":
        out.append("op-sac: torchtitan's per-op selective checkpointing keeps the layer input, q, v, the gate and "
                   "down outputs, the attention output and its log-sum-exp (activation_checkpoint.py)")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence parallelism has no effect without tensor parallelism (tp = 1)")
    if plan.gpus < plan.gpus_per_node:
        out.append(f"{plan.gpus} GPUs use part of one {plan.gpus_per_node}-GPU node")
    return out

