"""Model states before a step and the optimizer's own moments: parameters, gradients, AdamW states, step temporaries.

Sources: torch ``torch/optim/adamw.py`` / ``torch/optim/adam.py`` (``_multi_tensor_adam``: ``exp_avg_sq_sqrt =
torch._foreach_sqrt(device_exp_avg_sqs)`` is one temporary per parameter of a group, alive while the step divides;
``_single_tensor_adam``: the same three element-wise temporaries one parameter at a time; ``_fused_adam``: none),
a 4-byte fp32 ``step`` scalar per parameter tensor, and bitsandbytes ``bitsandbytes/optim/optimizer.py``
(``Optimizer8bit.init_state``: uint8 ``state1``/``state2`` plus fp32 ``absmax1``/``absmax2`` per block of 256
values; tensors under ``min_8bit_size`` = 4096 values keep fp32 states; ``is_paged`` allocates them with
``cudaMallocManaged`` outside PyTorch's caching allocator, where the driver may evict them to host memory).
The tensor lists are those of the Hugging Face modules and sum to ``memcalc.model.params.model_params``.
"""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.errors import InputError
from memcalc.model.architecture import Architecture

OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop", "in-backward")
OPTIMIZER_STATES = ("adamw", "adamw-8bit", "paged-adamw-8bit")
BNB_BLOCK = 256  # bitsandbytes blockwise quantisation of optimizer states: one fp32 absmax per 256 values
BNB_MIN_8BIT = 4096  # bitsandbytes Optimizer8bit min_8bit_size: smaller tensors keep 32-bit states


def param_tensors(arch: Architecture) -> tuple[tuple[str, int], ...]:
    """(name, elements) of every parameter tensor a Hugging Face model of ``arch`` holds (tied matrices once)."""
    h, q, kv, f, v = arch.hidden, arch.q_width, arch.kv_width, arch.ffn_size, arch.padded_vocab
    norm = (("weight", h), ("bias", h)) if arch.norm_bias else (("weight", h),)
    out: list[tuple[str, int]] = [("embedding", v * (arch.embedding_dim or h))]
    if arch.position == "learned":
        out.append(("position embedding", (arch.max_positions + arch.position_offset) * h))
    if arch.embedding_norm:
        out += [(f"embedding norm {n}", x) for n, x in norm]
    layer: list[tuple[str, int]] = []
    for i in range(arch.norms_per_layer):
        layer += [(f"norm {i + 1} {n}", x) for n, x in norm]
    if arch.fused_qkv:
        layer.append(("qkv", h * (q + 2 * kv)))
        layer += [("qkv bias", q + 2 * kv)] if arch.qkv_bias else []
    else:
        layer += [("q", h * q), ("k", h * kv), ("v", h * kv)]
        layer += [("q bias", q), ("k bias", kv), ("v bias", kv)] if arch.qkv_bias else []
    layer += [("o", q * h)] + ([("o bias", h)] if arch.out_bias else [])
    names = ("gate", "up", "down") if arch.gated_mlp else ("fc1", "fc2")
    for n in names:
        layer.append((n, h * f))
        if arch.mlp_bias:
            layer.append((f"{n} bias", h if n in ("down", "fc2") else f))
    for i in range(arch.layers):
        out += [(f"layer {i} {n}", x) for n, x in layer]
    if arch.final_norm:
        out += [(f"final norm {n}", x) for n, x in norm]
    if not arch.tied_embeddings:
        out.append(("head", v * h))
    return tuple(out)


def buffer_bytes(arch: Architecture, family: str) -> int:
    """Non-parameter buffers: rotary ``inv_freq`` and ``original_inv_freq`` (fp32, head_dim/2 each;
    transformers ``modeling_rope_utils``); the other families keep none that persist."""
    if arch.position == "rotary" and family in ("llama", "mistral", "qwen2"):
        return 2 * 4 * (arch.d_head // 2)
    return 0


@dataclass(frozen=True)
class States:
    """Bytes of the model states and the optimizer's step, per GPU."""

    params: int
    grads: int
    """All gradients at once (after backward); gradient width = parameter width."""
    optimizer: int
    """Moments and step scalars, counted in allocated memory."""
    paged: int
    """Paged optimizer states (cudaMallocManaged, outside the caching allocator, evictable to host)."""
    buffers: int
    step_temporary: int
    """Extra bytes while ``optimizer.step()`` runs (foreach: sqrt(v) per parameter of the group; for-loop:
    three temporaries of the largest tensor; fused: none)."""
    largest_grad: int
    """The largest single gradient (what ``in-backward`` holds at most at once, beside the step temporary)."""


def states(arch: Architecture, family: str, width: int, impl: str = "foreach", kind: str = "adamw") -> States:
    """Model states for parameters of ``width`` bytes (4 fp32 or autocast, 2 pure bf16); AdamW moments in the
    parameter dtype (torch.optim keeps ``exp_avg`` like the parameter: 2 + 2 under pure bf16)."""
    if impl not in OPTIMIZER_IMPLS:
        raise InputError(f"optimizer implementation {impl!r} is not one of {', '.join(OPTIMIZER_IMPLS)}")
    if kind not in OPTIMIZER_STATES:
        raise InputError(f"optimizer states {kind!r} are not one of {', '.join(OPTIMIZER_STATES)}")
    tensors = param_tensors(arch)
    p = sum(n for _, n in tensors)
    big = max(n for _, n in tensors)
    scalars = 4 * len(tensors)  # AdamW state["step"]: a 0-dim fp32 tensor per parameter (torch/optim/adam.py)
    if kind == "adamw":
        moments, paged = 2 * width * p, 0
    else:  # 8-bit: uint8 m and v + fp32 absmax per block of 256 for each; small tensors stay 32-bit
        moments = sum(2 * n + 2 * 4 * -(-n // BNB_BLOCK) if n >= BNB_MIN_8BIT else 2 * 4 * n for _, n in tensors)
        moments, paged = (0, moments) if kind.startswith("paged") else (moments, 0)
    temp = {"foreach": width * p, "fused": 0, "for-loop": 3 * width * big, "in-backward": 3 * width * big}[impl]
    if kind != "adamw":
        temp = 0  # bitsandbytes runs one fused kernel per parameter (optimizer_update_8bit_blockwise)
    return States(width * p, width * p, moments + scalars, paged, buffer_bytes(arch, family), temp, width * big)
