"""Kernels as each framework's code runs them, and what the host spends launching them: one row per model code.

A GPU runs what the CPU has queued. In eager PyTorch every aten op that does work is a kernel launch, and the
Python, autograd and dispatcher code around it costs the host microseconds each time; the GPU only waits when the
host falls behind, so the host is a floor under the GPU's time, not a term added to it (``memcalc.time.step``:
exposed host time = max(0, host - GPU) over the forward and backward, the same for the optimizer step, plus the
first layer's launches after the step's synchronisation, when the queue is empty).

Every figure here is a count read from the code or a measurement of the host, each with its source:

- Kernels per decoder layer, eager (Hugging Face's modeling code, and torchtitan's Llama, whose ops follow the same
  pattern at the published benchmark's commit: measurements/published-kernels.md §0): counted op by op with a
  ``TorchDispatchMode`` over an 8-layer minus a 4-layer Llama (``benchmarks/bench_host.py``, torch 2.13, transformers
  in the project's environment): SDPA, pure bf16 40 forward and 82 backward; fp32 weights under autocast 50 and 98
  (the casts); eager attention 8-10 more each way.
- Fused code (Megatron-LM with Transformer Engine; any model under torch.compile): the layer's seven weight GEMMs
  (q, k, v fused into one by Megatron) and one attention kernel, with one fused kernel between them (norm, rotary,
  the bias-dropout-add and the norm after it, the activation): TE's ``LayerNormLinear`` / ``LayerNormMLP`` and
  Megatron's ``transformer_layer.py``; inductor makes the same groups (one Triton kernel per run of element-wise ops
  between two extern kernels). 13 forward, 24 backward (each GEMM twice, the attention backward, the fused
  element-wise backwards).
- Host seconds per launch: 13.3 µs, the fp32 SDPA row of ``benchmarks/bench_host.py`` (the CPU dispatcher, Python
  module code and autograd per op, on this project's shared 2-core machine: an upper bound for a dedicated host; a
  CUDA step adds ``cudaLaunchKernel``, which published estimates put at a few µs, and drops the CPU kernels' work).
- FSDP2's hooks per unit: the same script, ``fully_shard`` on each layer (gloo, one rank): 5.7 ms of host per unit
  per forward + backward (pre/post-forward and backward hooks, the all-gather copy-in and copy-out, the
  reduce-scatter's ``chunk_cat``: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
- Eager DTensor tensor parallelism: measurements/h100-kernels.md "Host overhead": 15 ms of host per transformer
  block for forward plus backward (Llama-3-8B, 8-way TP, torch 2.11; the GPU was busy 147 ms of a 477 ms step).
  torch.compile traces DTensor away (torchtitan compiles each block): then the fused count applies.
- Optimizer launches per parameter group: fused AdamW one ``_fused_adamw_`` per group (torch/optim/adamw.py ->
  adam.py ``_fused_adam``); foreach 13 ``_foreach_*`` calls per group (``_multi_tensor_adam``: step increments,
  lerp, mul, addcmul, bias corrections, sqrt, div, add, addcdiv); each call launches one kernel per chunk of up to
  a few dozen tensors (multi_tensor_apply), so the count per group is a floor.
"""

from __future__ import annotations

from functools import cache

from memcalc.frozen import frozen

HOST_PER_LAUNCH_S = 13.3e-6
"""Host seconds per eager aten op (benchmarks/bench_host.py, fp32 SDPA row)."""
FSDP2_UNIT_HOST_S = 5.7e-3
"""Host seconds of FSDP2's hooks and copies per unit per forward + backward (benchmarks/bench_host.py)."""
DTENSOR_TP_LAYER_HOST_S = 15e-3
"""Host seconds per transformer block, forward + backward, under eager DTensor TP (h100-kernels.md, Host overhead)."""
OPTIMIZER_LAUNCHES = {"fused": 1, "foreach": 13, "cpu": 0}
"""Launches per parameter group of one AdamW step (torch/optim/adam.py ``_fused_adam``, ``_multi_tensor_adam``)."""


@frozen
class Kernels:
    """How one model code runs a decoder layer's kernels."""

    code: str
    elementwise: str
    """Norms and rotary embedding as ``memcalc.time.moved.elementwise_bytes`` counts them: hf (eager ops), torchtitan
    (torch's fused rms_norm, eager complex rotary), fused (one kernel each)."""
    attention: str
    """The kernel behind flash/SDPA attention in this code. flash: torch's SDPA, whose dispatch picked
    FlashAttention-2 in the torch of late 2024 (order flash, efficient, math, cuDNN: pytorch#138907; cuDNN made
    opt-in after the 2.5 bugs, pytorch#138522), where the published runs memcalc replays ran (published-kernels.md
    §0). te: Transformer Engine's ``DotProductAttention`` (Megatron-LM's default ``--transformer-impl
    transformer_engine``), which on Hopper and later prefers cuDNN's fused attention over FlashAttention
    (transformer_engine/pytorch/attention/dot_product_attention/utils.py ``get_attention_backend``: "Disabling
    FlashAttention to give FusedAttention preference on Hopper+ for performance reasons"): timed on the GPU's cuDNN
    curve where it has one (measured on the H100: 1.7-1.9x the flash kernel, h100-kernels.md), else flash."""
    launches_forward: int
    """Kernels one decoder layer's forward launches for one micro-batch (pure bf16 or under a master copy)."""
    launches_backward: int
    launches_forward_autocast: int
    """The same under torch.autocast over fp32 weights (the casts of weights and inputs)."""
    launches_backward_autocast: int
    launches_eager_attention: tuple[int, int]
    """Extra launches (forward, backward) of eager attention over SDPA (scale, mask, softmax, casts)."""
    tp_overlap: str = "none"
    """How the code runs tensor-parallel collectives under sequence parallelism: none (each on the critical path:
    eager DTensor, torchtitan without async TP) or userbuffers (Transformer Engine's GEMM-communication overlap,
    ``memcalc.time.step._tp_exposed``). Megatron-LM turns it on with ``--tp-comm-overlap`` (which needs
    ``--sequence-parallel``); NVIDIA's Megatron-Bridge performance recipes set ``tp_comm_overlap`` for their
    tensor-parallel layouts, so the Megatron row takes it as the way Megatron-Core jobs are run."""
    expands_kv: bool = False
    """K and V expanded to the query heads before the attention call, so a context-parallel ring passes heads /
    kv_heads times the bytes: torchtitan's Llama (torchtitan/models/llama3/model.py: ``repeat_kv(xk, self.n_rep)``
    before ``sdpa``); transformers' SDPA path hands the KV heads to the kernel (``enable_gqa``) when no mask is
    given; Megatron-LM / Transformer Engine pass the KV heads (``num_query_groups``)."""


EAGER = Kernels("hf", "hf", "flash", 40, 82, 50, 98, (8, 10))
FUSED = Kernels("megatron", "fused", "te", 13, 24, 13, 24, (2, 3))
KERNELS: dict[str, Kernels] = {
    "hf": EAGER,
    "torchtitan": Kernels("torchtitan", "torchtitan", "flash", 40, 82, 50, 98, (8, 10), expands_kv=True),
    "megatron": Kernels("megatron", "fused", "te", 13, 24, 13, 24, (2, 3), tp_overlap="userbuffers"),
}
"""Per model code (``memcalc.layout.compose.Framework.model_code``); under torch.compile every code is ``FUSED``."""


def elementwise_code(code: str) -> str:
    """How ``code`` runs its norms and rotary embedding (``Kernels.elementwise``)."""
    return KERNELS.get(code, EAGER).elementwise


def attention_kernel(code: str, asked: str) -> str:
    """The step model's attention kernel for ``asked`` (flash, cudnn or eager) in ``code``: flash becomes the code's
    own (``Kernels.attention``)."""
    return KERNELS.get(code, EAGER).attention if asked == "flash" else asked


def expands_kv(code: str) -> bool:
    """Whether ``code`` expands K and V to the query heads before attention (``Kernels.expands_kv``)."""
    return KERNELS.get(code, EAGER).expands_kv


def overlaps_tp(code: str, tp: int, sequence_parallel: bool) -> bool:
    """Whether ``code`` overlaps its tensor-parallel collectives with GEMMs (``Kernels.tp_overlap``) in this layout."""
    return tp > 1 and sequence_parallel and KERNELS.get(code, EAGER).tp_overlap != "none"


def host_launches(code: str, compiled: bool, autocast: bool, eager_attention: bool) -> tuple[int, int]:
    """(forward, backward) kernels one decoder layer launches per micro-batch."""
    k = FUSED if compiled else KERNELS.get(code, EAGER)
    f, b = (k.launches_forward_autocast, k.launches_backward_autocast) if autocast else (k.launches_forward,
                                                                                         k.launches_backward)
    if eager_attention:
        f, b = f + k.launches_eager_attention[0], b + k.launches_eager_attention[1]
    return f, b


@cache
def host_seconds(code: str, compiled: bool, autocast: bool, eager_attention: bool, dtensor_tp: bool, fsdp2: bool,
                 optimizer: str) -> tuple[float, float, float]:  # fmt: skip
    """Host seconds (forward, backward) per decoder layer and micro-batch, and per optimizer step: the layer's
    launches at ``HOST_PER_LAUNCH_S``; under eager DTensor tensor parallelism the measured cost per block instead;
    FSDP2's hooks per unit on top (a third of each in forward, like the work); ``optimizer``: fused, foreach or cpu."""
    f, b = host_launches(code, compiled, autocast, eager_attention)
    fwd, bwd = f * HOST_PER_LAUNCH_S, b * HOST_PER_LAUNCH_S
    if dtensor_tp and not compiled:
        fwd, bwd = DTENSOR_TP_LAYER_HOST_S / 3, 2 * DTENSOR_TP_LAYER_HOST_S / 3
    if fsdp2:
        fwd, bwd = fwd + FSDP2_UNIT_HOST_S / 3, bwd + 2 * FSDP2_UNIT_HOST_S / 3
    return fwd, bwd, OPTIMIZER_LAUNCHES[optimizer] * HOST_PER_LAUNCH_S


@cache
def framework_kernels(code: str, compiled: bool, autocast: bool, attention: str, dtensor_tp: bool, fsdp2: bool,
                      optimizer: str) -> tuple[str, str, float, float, float, bool]:  # fmt: skip
    """Everything the step model takes from the table for one framework and its choices, computed once: (attention
    kernel, element-wise code, host seconds forward, backward and optimizer, K/V expanded before attention).
    Under torch.compile the norms and rotary are fused (inductor: one read and one write per element)."""
    host = host_seconds(code, compiled, autocast, attention == "eager", dtensor_tp, fsdp2, optimizer)
    return (attention_kernel(code, attention), "fused" if compiled else elementwise_code(code), *host,
            expands_kv(code))
