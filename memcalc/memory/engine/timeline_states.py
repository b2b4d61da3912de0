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

import itertools

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.memory.families.saved import LLAMA_STYLE, OTHER_NORMS
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture

OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop", "in-backward")
OPTIMIZER_STATES = ("adamw", "adamw-8bit", "paged-adamw-8bit")
BNB_BLOCK = 256  # bitsandbytes blockwise quantisation of optimizer states: one fp32 absmax per 256 values
BNB_MIN_8BIT = 4096  # bitsandbytes Optimizer8bit min_8bit_size: smaller tensors keep 32-bit states


@per_architecture
def param_tensors(arch: Architecture) -> tuple[tuple[str, int], ...]:
    """(name, elements) of every parameter tensor a Hugging Face model of ``arch`` holds (tied matrices once)."""
    h, q, kv, f, v = arch.hidden, arch.q_width, arch.kv_width, arch.ffn_size, arch.padded_vocab
    norm = (("weight", h), ("bias", h)) if arch.norm_bias else (("weight", h),)
    out: list[tuple[str, int]] = [("embedding", v * (arch.embedding_dim or h))]
    if arch.position == "learned":
        out.append(("position embedding", (arch.max_positions + arch.position_offset) * h))
    if arch.embedding_norm:
        out += [(f"embedding norm {n}", x) for n, x in norm]
    norms: list[tuple[str, int]] = []
    for i in range(arch.norms_per_layer):
        norms += [(f"norm {i + 1} {n}", x) for n, x in norm]
    # in the order the modules register them (what torch.optim walks): weight, then bias
    if arch.fused_qkv:
        attn = [("qkv", h * (q + 2 * kv))] + ([("qkv bias", q + 2 * kv)] if arch.qkv_bias else [])
    else:
        attn = []
        for n, width in (("q", q), ("k", kv), ("v", kv)):
            attn += [(n, h * width)] + ([(f"{n} bias", width)] if arch.qkv_bias else [])
    out_proj = [("o", q * h)] + ([("o bias", h)] if arch.out_bias else [])
    attn = out_proj + attn if arch.family == "phi3" else attn + out_proj  # Phi3Attention registers o_proj first
    if arch.qk_norm:
        attn += list(zip(("q norm", "k norm"), arch.qk_norm_widths))
    mlp: list[tuple[str, int]] = []
    if arch.fused_gate_up:
        mlp += [("gate_up", 2 * h * f)] + ([("gate_up bias", 2 * f)] if arch.mlp_bias else [])
    names = (("down",) if arch.fused_gate_up else ("gate", "up", "down")) if arch.gated_mlp else ("fc1", "fc2")
    for n in names:
        mlp.append((n, h * f))
        if arch.mlp_bias:
            mlp.append((f"{n} bias", h if n in ("down", "fc2") else f))
    # MixtralSparseMoeBlock registers the router (its gate), then the experts' 3-D gate_up_proj and down_proj;
    # Qwen3MoeSparseMoeBlock the experts first
    fe, e = arch.expert_ffn_size, arch.experts
    experts = [("experts_gate_up", e * 2 * fe * h), ("experts_down", e * h * fe)]
    moe = [("router", e * h), *experts] if arch.family != "qwen3_moe" else [*experts, ("router", e * h)]
    for i in range(arch.layers):
        block = moe if arch.is_moe_layer(i) else mlp
        # Llama-style decoder layers register self_attn, mlp, then their two norms; the others list norms first
        layer = attn + block + norms if arch.norm == "rmsnorm" and arch.gated_mlp else norms + attn + block
        out += [(f"layer {i} {n}", x) for n, x in layer]
    if arch.final_norm:
        out += [(f"final norm {n}", x) for n, x in norm]
    if not arch.tied_embeddings:
        out.append(("head", v * h))
    return tuple(out)


def buffer_bytes(arch: Architecture, family: str, width: int = 4) -> int:
    """Non-parameter buffers: rotary ``inv_freq`` and ``original_inv_freq`` (fp32, head_dim/2 each;
    transformers ``modeling_rope_utils``), one pair per rotary table (Gemma 3: one per layer type in use,
    ``Gemma3RotaryEmbedding``); Gemma's ``embed_scale`` (a 0-dim buffer in the parameters' dtype, ``width`` bytes:
    ``GemmaTextScaledWordEmbedding``); GPT-NeoX's and Falcon's pair over the dims they rotate; the other families
    keep none that persist."""
    from memcalc.memory.families.saved_gemma import GEMMAS, rope_types

    if arch.position == "rotary" and family in (*LLAMA_STYLE, *OTHER_NORMS):
        return rope_types(arch) * 2 * 4 * (arch.d_head // 2) + (width if family in GEMMAS else 0)
    if arch.position == "rotary" and family in ("gpt_neox", "falcon"):  # over the rotated dims (NeoX: a quarter)
        return 2 * 4 * ((arch.rotary_dims or arch.d_head) // 2)
    return 0


@frozen
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
    """Extra bytes while ``optimizer.step()`` runs (foreach: sqrt(v) per parameter of the group; for-loop: two
    temporaries of one tensor beside the previous tensor's ``denom``, ``for_loop_peak``; fused: none)."""
    largest_grad: int
    """The largest single gradient (what ``in-backward`` holds at most at once, beside the step temporary)."""


def for_loop_peak(tensors: tuple[tuple[str, int], ...]) -> int:
    """Elements of the for-loop AdamW's temporaries at their peak (torch ``optim/adam.py`` ``_single_tensor_adam``):
    ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` holds sqrt(v) and the quotient of parameter i
    while the loop variable ``denom`` still holds parameter i-1's, so max over i of 2·n_i + n_(i-1) in the order
    the parameters are registered (traced: tests/test_timeline.py)."""
    prev, peak = 0, 0
    for _, n in tensors:
        peak, prev = max(peak, 2 * n + prev), n
    return peak


def step_temporaries(impl: str, tensors: tuple[tuple[str, int], ...], width: int) -> int:
    """Bytes torch's AdamW allocates beyond its states while it steps ``tensors`` of ``width`` bytes per element:
    foreach, one temporary per parameter (``_multi_tensor_adam``'s ``torch._foreach_sqrt``); fused, none; for-loop,
    ``for_loop_peak``; in the backward (torchtune's optimizer-in-backward, a step per parameter in its gradient hook),
    3 x the largest parameter (the bound of ``for_loop_peak``: 2·n_i + n_(i-1)). DeepSpeed hands it one flat tensor
    per partition or sub-group: foreach 1, for-loop 2 elements per element."""
    return {"foreach": width * sum(n for _, n in tensors), "fused": 0, "for-loop": width * for_loop_peak(tensors),
            "in-backward": 3 * width * max(n for _, n in tensors)}[impl]  # fmt: skip


@per_architecture
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
    temp = step_temporaries(impl, tensors, width)
    if kind != "adamw":
        temp = 0  # bitsandbytes runs one fused kernel per parameter (optimizer_update_8bit_blockwise)
    return States(width * p, width * p, moments + scalars, paged, buffer_bytes(arch, family, width), temp, width * big)


def adapter_tensors(arch: Architecture, lora) -> tuple[tuple[str, int], ...]:
    """(name, elements) of peft's trainable tensors in ``model.parameters()`` order: in each decoder layer, each
    targeted projection in module order, its ``lora_A`` (r × in) then its ``lora_B`` (out × r) (peft
    ``tuners/lora/layer.py`` ``update_layer``); named ``layer i <module> A|B`` like ``param_tensors``' layer tensors."""
    from memcalc.model.lora import targeted

    r = lora.rank
    return tuple((f"layer {i} {p.module} {ab}", n) for i in range(arch.layers) for p in targeted(arch, lora)
                 for ab, n in (("A", r * p.fan_in), ("B", p.fan_out * r)))


def lora_states(arch: Architecture, family: str, width: int, impl: str, kind: str, lora) -> States:
    """Model states of peft LoRA on a frozen base (``memcalc.model.lora``): the base at ``width`` bytes (QLoRA: its
    linear weights in NF4), the adapters trainable at ``width`` with their gradients, AdamW moments, a step scalar per
    adapter tensor and the optimizer's temporaries (foreach: one per adapter parameter); the base has none."""
    from memcalc.model.lora import layer_lora, split, targeted

    if kind not in OPTIMIZER_STATES:
        raise InputError(f"optimizer states {kind!r} are not one of {', '.join(OPTIMIZER_STATES)}")
    ly = layer_lora(arch, lora)
    sp = split(sum(n for _, n in param_tensors(arch)), arch.layers, ly, lora.quantize, width)
    a, big = sp.adapters, ly.largest_adapter
    temp = {"foreach": width * a, "fused": 0, "for-loop": 3 * width * big, "in-backward": 3 * width * big}[impl]
    scalars = 4 * ly.adapter_tensors * arch.layers
    moments, paged = 2 * width * a, 0
    if kind != "adamw":  # bitsandbytes 8-bit states per adapter tensor (A: r x in, B: out x r), as ``states`` counts
        sizes = [lora.rank * n for p in targeted(arch, lora) for n in (p.fan_in, p.fan_out)] * arch.layers
        moments = sum(2 * n + 2 * 4 * -(-n // BNB_BLOCK) if n >= BNB_MIN_8BIT else 2 * 4 * n for n in sizes)
        moments, paged, temp = (0, moments, 0) if kind.startswith("paged") else (moments, 0, 0)
    return States(sp.frozen_bytes + width * a, width * a, moments + scalars, paged, buffer_bytes(arch, family, width),
                  temp, width * big)


def _dim0(arch: Architecture, name: str, elements: int) -> int:
    """Rows (dim 0) of a parameter tensor as torch stores it: ``nn.Linear.weight`` is (out, in), ``nn.Embedding``
    (vocab, width); norms and biases are 1-D; an MoE block's router (E, h) and experts (E, 2f, h), (E, h, f)."""
    last = name.split()[-1]
    if last in ("weight", "bias", "norm") or name.endswith(" bias"):  # "q norm", "k norm": 1-D (Qwen3)
        return elements
    rows = {"embedding": arch.padded_vocab, "head": arch.padded_vocab, "q": arch.q_width, "k": arch.kv_width,
            "v": arch.kv_width, "qkv": arch.q_width + 2 * arch.kv_width, "o": arch.hidden, "gate": arch.ffn_size,
            "up": arch.ffn_size, "gate_up": 2 * arch.ffn_size, "fc1": arch.ffn_size, "down": arch.hidden, "fc2": arch.hidden,
            "router": arch.experts, "experts_gate_up": arch.experts, "experts_down": arch.experts}  # fmt: skip
    if name == "position embedding":
        return arch.max_positions + arch.position_offset
    return rows[last]


@frozen
class ShardUnits:
    """FSDP2 ``fully_shard`` per decoder layer and on the root, as rank 0 of ``world`` ranks, in elements.

    torch ``distributed/fsdp/_fully_shard/_fsdp_param.py``: each parameter is chunked on dim 0 into ``world``
    pieces, padded to ``ceil(dim0 / world)`` rows on every rank; the all-gather output is one flat buffer of
    ``world`` × the padded shards of the unit (``_fsdp_collectives.py: foreach_all_gather``)."""

    world: int
    root: int
    """Unsharded elements of the root's own parameters (embedding, final norm, head)."""
    layer: int
    """Unsharded elements of one decoder layer."""
    root_shard: int
    layer_shard: int
    tensors: int
    embed_shard: int = 0
    """Rank 0's elements of the embedding (with a learned position table and an embedding norm: the input side)."""
    head_shard: int = 0
    """Rank 0's elements of the (untied) head."""
    norm_shard: int = 0
    """Rank 0's elements of the final norm."""


def shard_elements(arch: Architecture, name: str, n: int, world: int) -> int:
    """Elements of rank 0's shard of one parameter of ``n`` elements: ``ceil(dim0 / world)`` rows of the rest."""
    d0 = _dim0(arch, name, n)
    return -(-d0 // world) * (n // d0)


def fp8_gathered(arch: Architecture, world: int) -> int:
    """Elements of one decoder layer's all-gather output that torchao's ``enable_fsdp_float8_all_gather`` sends as
    1-byte fp8 (``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``): world x rank 0's padded shard of each
    converted projection (``memcalc.model.float8.CONVERTED``)."""
    from memcalc.model.float8 import CONVERTED

    return sum(world * shard_elements(arch, name, n, world) for name, n in param_tensors(arch)
               if name.startswith("layer 0 ") and name[len("layer 0 "):] in CONVERTED)


@per_architecture
def shard_units(arch: Architecture, world: int) -> ShardUnits:
    if world < 1:
        raise InputError(f"world {world} must be at least 1")
    root = root_shard = layer = layer_shard = embed = head = norm = 0
    tensors = param_tensors(arch)
    for name, n in tensors:  # layer 0 stands for every decoder layer (they are alike)
        if name.startswith("layer 0 "):
            layer, layer_shard = layer + n, layer_shard + shard_elements(arch, name, n, world)
        elif not name.startswith("layer "):
            e = shard_elements(arch, name, n, world)
            root, root_shard = root + n, root_shard + e
            if name == "head":
                head += e
            elif name.startswith("final norm"):
                norm += e
            else:
                embed += e
    return ShardUnits(world, root, layer, root_shard, layer_shard, len(tensors), embed, head, norm)


@per_architecture
def flat_units(arch: Architecture, world: int) -> ShardUnits:
    """FSDP1 (``FullyShardedDataParallel``, one ``FlatParameter`` per decoder layer and one for the root) as rank 0 of
    ``world`` ranks, in elements: each unit's parameters flattened into one tensor padded to a multiple of ``world``
    and chunked evenly (torch ``distributed/fsdp/_flat_param.py``: ``_get_shard``); rank 0 holds the first chunk."""
    if world < 1:
        raise InputError(f"world {world} must be at least 1")
    tensors = param_tensors(arch)
    layer = [n for name, n in tensors if name.startswith("layer 0 ")]
    root = [n for name, n in tensors if not name.startswith("layer ")]
    shard = (-(-sum(root) // world), -(-sum(layer) // world))
    return ShardUnits(world, sum(root), sum(layer), shard[0], shard[1],
                      reach(root, shard[0]) + arch.layers * reach(layer, shard[1]))


def reach(sizes: list[int], chunk: int) -> int:
    """Parameters of a FlatParameter (``sizes`` in elements, in the order the modules register them) with state in
    rank 0's optimizer: torch.optim keeps state only for the parameters with a gradient, under use_orig_params those
    whose view reaches into rank 0's ``chunk`` (the flat tensor's first elements)."""
    return sum(1 for start in list(itertools.accumulate(sizes, initial=0))[:-1] if start < chunk)


def sharded_states(arch: Architecture, family: str, width: int, units: ShardUnits, impl: str = "foreach") -> States:
    """Rank 0's model states under FSDP2 over every unit (``shard_states``)."""
    return shard_states(arch, family, width, units.root_shard + units.layer_shard * arch.layers, units.tensors, impl)


def shard_states(arch: Architecture, family: str, width: int, p: int, tensors: int, impl: str = "foreach") -> States:
    """Model states of ``p`` padded shard elements over ``tensors`` parameters under FSDP2, at ``width`` bytes:
    sharded parameters, gradients and AdamW moments (rank 0 holds full chunks, so its moments equal its padded
    shards), a 4-byte step scalar per parameter, replicated buffers; foreach AdamW's temporary is one more shard."""
    if impl not in ("foreach", "fused"):
        raise InputError(f"optimizer implementation {impl!r} under FSDP: accepted foreach, fused")
    temp = {"foreach": width * p, "fused": 0}[impl]
    return States(width * p, width * p, 2 * width * p + 4 * tensors, 0, buffer_bytes(arch, family, width), temp, 0)
