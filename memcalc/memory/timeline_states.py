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
from typing import Any

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.layout.compose import check_wrap
from memcalc.memory.saved import LLAMA_STYLE, OTHER_NORMS
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
    from memcalc.memory.saved_gemma import GEMMAS, rope_types

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
                      _reach(root, shard[0]) + arch.layers * _reach(layer, shard[1]))


def _reach(sizes: list[int], chunk: int) -> int:
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


@frozen
class FsdpOverlay:
    """What FSDP2 (and FSDP1, ``flat``) adds to a moment of the step, and its sharded states (None: no sharding; every method then
    returns the single-GPU parts). Order of events, torch ``distributed/fsdp/_fully_shard`` (``_fsdp_param_group.py``,
    ``_fsdp_state.py``), as the tracer sees them:

    - the root (embedding, final norm, head) is gathered at the forward's start and stays gathered until its
      post-backward (``reshard_after_forward`` is False for the root, ``_fsdp_state._lazy_init``);
    - each layer is gathered before its forward and resharded after it; the flat all-gather output of the last
      gather stays alive until the next gather's copy-out (``FSDPCommContext.all_gather_state``), and the last
      layer's until the root's post-forward: during the head and the loss it is still alive;
    - backward: the root's pre-backward prefetches the last layer's all-gather; each layer's pre-backward copies
      its gather out and prefetches the next layer's (``_backward_prefetch``); its post-backward reduce-scatters
      the unsharded gradients, whose flat input lives until the next reduce-scatter (``reduce_scatter_state``),
      and keeps the gradient shard.

    With the embedding and the head in units of their own (``wrap``, ``memcalc.layout.compose.FSDP_WRAPS``), the
    root keeps what is left (the final norm under separate-reshard, nothing under separate), the embedding's unit
    is gathered for its forward and again for its backward (prefetched by layer 0's pre-backward), and the head's
    unit is gathered at its pre-forward; a unit's pre-backward prefetches the unit before it in the forward's order (the root's, when it has
    parameters: the head's), and the head's post-backward reduce-scatters its gradients before the layers'."""

    states: States
    gathered_width: int
    """Bytes per element of the unsharded parameters and their gradients (``param_dtype`` or the storage's)."""
    root: int
    """Bytes of the root's unsharded parameters: padded like the all-gather output (``_fsdp_param.py``:
    ``padded_unsharded_size``; the unpadded parameter is a view of it)."""
    layer: int
    """Bytes of one layer's unsharded parameters (padded)."""
    layer_flat: int
    """Bytes of one layer's all-gather output (and reduce-scatter input): world × padded shard."""
    layer_grad_shard: int
    width: int
    layer_grads: int
    """Bytes of one layer's gradients at the storage's width without sharding (the single-GPU timeline's)."""
    root_flat: int
    """Bytes of the root's all-gather output."""
    layer_reduce: int = -1
    """Bytes of one layer's reduce-scatter input (world × padded shard at the gradients' width); -1: ``layer_flat``
    (they differ when the weights are gathered in fp8 and their gradients reduced in the compute dtype)."""
    wrap: str = "root"
    embed: int = 0
    """Bytes of the embedding's unit gathered (and of its all-gather output and its unsharded gradients); 0 under
    the root wrap."""
    head: int = 0
    """The same for the head's unit (with the final norm under ``separate``)."""
    head_grad_shard: int = 0
    """Bytes of the head unit's gradient shard (the storage's width)."""
    norm_grads: int = 0
    """Bytes of the final norm's unsharded gradients (``separate-reshard``: the root's, until its post-backward)."""
    keep: bool = False
    """``reshard_after_forward=False`` (SHARD_GRAD_OP, HSDP's ZeRO-2): each unit stays gathered from its forward to
    its post-backward, so the backward gathers nothing."""
    reduce_width: int = 0
    """Bytes per element of the reduce-scatter input (``MixedPrecisionPolicy.reduce_dtype``; 0: the gathered
    width)."""
    held_reduce: int = 0
    """HSDP with a reduce dtype other than the storage's: bytes of one layer's reduce-dtype all-reduce buffer, which
    its group holds from its post-backward to the end of the backward (``FSDPParamGroup._all_reduce_state``)."""
    head_reduce: int = 0
    """Bytes of the head unit's reduce-scatter input."""
    head_held_reduce: int = 0
    """HSDP: the head unit's all-reduce buffer, as ``held_reduce``."""
    embed_reduce_out: int = 0
    """Bytes of the embedding's reduce-scatter output (its shard in the reduce dtype)."""
    frozen_ends: bool = False
    """The embedding's and the head's units hold frozen parameters (LoRA): gathered like the others, no gradient and
    no reduce-scatter (FSDP2's post-backward finds no ``.grad`` and only reshards)."""
    flat: bool = False
    """FSDP1 (``FullyShardedDataParallel``, ``use_orig_params=True``): a unit all-gathers straight into its padded
    unsharded ``FlatParameter`` (no separate all-gather output), the backward prefetch allocates the next unit's
    unsharded parameter, and the post-backward copies the parameters' gradients into one padded flat gradient,
    reduce-scatters it and frees it before the next unit's (``_runtime_utils.py`` ``_post_backward_hook``)."""
    mp_shard: int = 0
    """FSDP1 under a MixedPrecision ``param_dtype``: bytes of a layer's low-precision copy of its local shard, made
    for the all-gather and freed after it (``_flat_param.py`` ``_mp_shard``)."""
    root_grads: int = 0
    """FSDP1: bytes of the root's parameters' unsharded gradients (unpadded), all alive at its post-backward."""
    prefetch: bool = True
    """FSDP1's ``BackwardPrefetch.BACKWARD_PRE`` (torch's default): each pre-backward gathers the next unit too;
    False: ``BACKWARD_POST`` (issued once the unit is resharded: the same peaks, traced) or none (accelerate's
    default)."""
    frozen_layers: bool = False
    """FSDP1 under peft's ``fsdp_auto_wrap_policy`` (LoRA): each adapter's ``lora_A`` and ``lora_B`` a unit of its
    own, so a decoder layer's FlatParameter holds only frozen weights. It gets no gradient: no flat gradient, no
    reduce-scatter; a reshard-only hook on the layer's inputs reshards it once its input's gradient is made
    (``_runtime_utils._register_post_backward_reshard_only_hook``). BACKWARD_PRE prefetches the unit before the
    current one in the post-forward order (``_exec_order_utils.get_handle_to_backward_prefetch``), and within a
    layer that is an adapter: the layer below is prefetched only by the pre-backward of the layer's first adapter
    (the first projection's ``lora_A``), late in the layer's backward, and is gathered beside this one when it is
    resharded; the timeline counts it from the layer's backward entry (``backward``), an upper bound by at most one
    gathered layer. The root's units are frozen too (no gradients)."""
    whole: bool = False
    """No unit per decoder layer (accelerate's ``fsdp_auto_wrap_policy: NO_WRAP``): the layers are the root's, so
    ``root`` holds them and ``layer`` is 0. The root is gathered at the forward's start (FSDP2: its all-gather output
    alive until the embedding's copy-out) and stays gathered to its post-backward, every layer's gradients unsharded
    until then. FSDP1: the whole model one FlatParameter, its post-backward copying every gradient into one padded
    flat gradient while the unit is still gathered (``root_copy_in``). FSDP2 (accelerate 1.15 still carves the
    embedding and [final norm, head] into units of their own: ``wrap`` separate): the root's post-backward runs in
    the backward's final callback, before the embedding's, and reshards the layers before its copy-in
    (``whole_copy_in``)."""
    root_reduce: int = 0
    """FSDP2 ``whole``: bytes of the root's reduce-scatter input (every layer's padded shards × world, the reduce
    dtype)."""
    layer_count: int = 0
    """``whole``: the decoder layers the root holds."""
    tail: int = 0
    """FSDP2 ``whole`` under the root wrap (tied embeddings): bytes of accelerate's [final norm, embedding, head]
    unit, kept gathered from the forward's start (its all-gather output alive until the root's post-forward) and
    reduce-scattered after the root, in the final callback (``tail_copy_in``); ``root`` counts it with the layers."""
    tail_shard: int = 0
    """Rank 0's elements of that unit (its padded shards)."""

    @staticmethod
    @per_architecture
    def make(arch: Architecture, family: str, regime: str, world: int, param_dtype: str | None, impl: str,
             kind: str, fp8_gather: bool = False, wrap: str = "root", keep: bool = False, hsdp: bool = False,
             reduce_fp32: bool = False, flat: bool = False, prefetch: bool = True,
             lora: Any = None, whole: bool = False) -> FsdpOverlay | None:  # fmt: skip
        """``fp8_gather``: torchao's ``enable_fsdp_float8_all_gather`` (``WeightWithDynamicFloat8CastTensor
        .fsdp_pre_all_gather``): the decoder layers' projection weights (``memcalc.model.float8``) are cast to fp8
        before the all-gather, so their all-gather output and the unsharded weight kept until the reshard are 1 byte
        per element (FSDP2 gathers a group of mixed dtypes as bytes: ``_fsdp_collectives.foreach_all_gather``); the
        rest of the layer, the root and every gradient keep their width. ``wrap``: ``memcalc.layout.compose.FSDP_WRAPS``. ``keep``: no
        reshard after forward. ``hsdp``: the shards replicated over groups of ``world`` ranks (the reduced shard is
        all-reduced across them: ``_fsdp_collectives.foreach_reduce``). ``reduce_fp32``: gradients reduced in fp32
        under a bf16 ``param_dtype`` (torchtitan's ``mixed_precision_reduce``). ``flat``: FSDP1 (``flat_units``),
        units per decoder layer and the root only (HYBRID_SHARD: the shard group's step, its all-reduce holding no
        buffer, traced). ``lora``: peft adapters on a frozen base (``lora_overlay``), FSDP2 with the root or the
        separate wrap. ``whole``: no unit per decoder layer (``FsdpOverlay.whole``)."""
        if world < 1:
            raise InputError(f"world {world} must be at least 1 (FSDP2 ranks)")
        if param_dtype not in (None, "bf16"):
            raise InputError(f"fsdp_param_dtype {param_dtype!r} is not one of None, bf16")
        if kind != "adamw":
            raise InputError(f"optimizer states {kind!r} under FSDP: accepted adamw")
        check_wrap(wrap)
        if wrap != "root" and arch.tied_embeddings:
            raise InputError(f"fsdp_wrap {wrap}: the embedding and the head share one tied weight, which FSDP2 cannot "
                             "put in two units; accepted for tied embeddings: root")
        width = 2 if regime == "bf16" else 4
        g = 2 if param_dtype == "bf16" else width
        if whole and (lora is not None or fp8_gather or hsdp or keep or reduce_fp32 or (flat and wrap != "root")):
            raise InputError("FSDP without a unit per decoder layer (NO_WRAP) is modelled for FULL_SHARD without "
                             "HSDP, LoRA, fp8 all-gathers or fp32 reduction; FSDP1 with the root wrap")
        if whole:
            return _whole_overlay(arch, family, width, g, world, impl, wrap, flat)
        if lora is not None:
            if (flat and wrap != "root") or wrap == "separate-reshard" or fp8_gather or hsdp or keep or reduce_fp32:
                raise InputError("LoRA under FSDP is modelled for FULL_SHARD: FSDP2 with the root or the separate "
                                 "wrap, FSDP1 with peft's wrap policy and the root")
            return lora_overlay(arch, family, width, g, world, impl, lora, wrap, flat=flat, prefetch=prefetch)
        if flat:
            if wrap != "root" or reduce_fp32 or fp8_gather:
                raise InputError("FSDP1 is modelled with one unit per decoder layer and the root, without fp8 "
                                 "all-gathers or fp32 reduction")
            u = flat_units(arch, world)
            layer = g * world * u.layer_shard
            return FsdpOverlay(sharded_states(arch, family, width, u, impl), g, g * world * u.root_shard, layer, layer,
                               width * u.layer_shard, width, width * u.layer, 0, flat=True,
                               mp_shard=g * u.layer_shard if g != width else 0, root_grads=g * u.root,
                               prefetch=prefetch, keep=keep)
        rw = 4 if reduce_fp32 and param_dtype == "bf16" else g
        u = shard_units(arch, world)
        st = sharded_states(arch, family, width, u, impl)
        flat = g * world * u.layer_shard
        root = g * world * u.root_shard
        extra: dict = dict(keep=keep, reduce_width=rw, held_reduce=rw * u.layer_shard if hsdp and rw != width else 0)
        if wrap != "root":
            head = u.head_shard + (u.norm_shard if wrap == "separate" else 0)
            extra.update(wrap=wrap, embed=g * world * u.embed_shard, head=g * world * head,
                         head_grad_shard=width * head, norm_grads=g * arch.hidden * (1 + arch.norm_bias),
                         head_reduce=rw * world * head, head_held_reduce=rw * head if hsdp and rw != width else 0,
                         embed_reduce_out=rw * u.embed_shard)
            root -= extra["embed"] + extra["head"]
        reduce = rw * world * u.layer_shard
        if fp8_gather:
            flat -= (g - 1) * fp8_gathered(arch, world)
        return FsdpOverlay(st, g, root, flat, flat, width * u.layer_shard, width, width * u.layer, root,
                           reduce if reduce != flat else -1, **extra)

    @property
    def reduce_input(self) -> int:
        """Bytes of one layer's reduce-scatter input: ``layer_reduce``, else the all-gather output's size."""
        return self.layer_flat if self.layer_reduce < 0 else self.layer_reduce

    @property
    def prefetched(self) -> int:
        """Bytes of the all-gather output the head's pre-backward prefetches: the last layer's, or under ``whole``
        the embedding's unit (the unit before the head's in the forward's order; FSDP2's ``_backward_prefetch``),
        alive until the embedding's pre-backward copies it out."""
        return self.embed if self.whole else self.layer_flat

    @property
    def unsharded_grads(self) -> int:
        """Bytes of one layer's unsharded gradients in the gathered parameters' dtype (unpadded)."""
        return self.layer_grads // self.width * self.gathered_width

    @staticmethod
    def forward(fs: FsdpOverlay | None, i: int = 0) -> list[tuple[str, int]]:
        """During layer ``i``'s forward: the root, this layer gathered (and the layers before it, kept gathered
        under ``keep``), and its flat all-gather output."""
        if fs is None:
            return []
        if fs.whole:  # the embedding's all-gather output, until the head's gather copies out (tied: the root's
            # post-forward frees the [norm, embedding, head] unit's)
            return [("root parameters (gathered)", fs.root), ("all-gather output (embedding's unit)", fs.embed + fs.tail)]
        return [("root parameters (gathered)", fs.root)] + fs._kept(0) + [
                ("this layer's parameters (gathered)" if not fs.keep else f"layers 0..{i} parameters (gathered)",
                 fs.layer * (i + 1 if fs.keep else 1)),
                ("all-gather output (this layer)", 0 if fs.flat else fs.layer_flat)]

    @staticmethod
    def gather(fs: FsdpOverlay, i: int) -> list[tuple[str, int]]:
        """Layer ``i``'s forward all-gather copied out while the previous gather's output (the root's or the
        embedding's before layer 0) is still alive."""
        if fs.flat:  # FSDP1: the low-precision shard the all-gather sends, freed once it is done
            return FsdpOverlay.forward(fs, i) + [("low-precision shard for the all-gather", fs.mp_shard)]
        previous = (fs.root_flat if fs.wrap == "root" else fs.embed) if i == 0 else fs.layer_flat
        return FsdpOverlay.forward(fs, i) + [("all-gather output (previous unit)", previous)]

    def _kept(self, n: int) -> list[tuple[str, int]]:
        """Under ``keep``: the embedding's unit (gathered from its forward to its post-backward) and the ``n``
        decoder layers still gathered."""
        if not self.keep:
            return []
        embed = [("embedding parameters (gathered)", self.embed)] if self.wrap != "root" else []
        return embed + ([(f"layers 0..{n - 1} parameters (gathered)", n * self.layer)] if n else [])

    @staticmethod
    def after_layers(fs: FsdpOverlay | None, at: str = "loss", layers: int = 0) -> list[tuple[str, int]]:
        """From the final norm to the loss's gradients (``at``: gather, the head unit's pre-forward with the last
        layer's all-gather output not yet freed; norm, head, loss or loss-backward). Root wrap: the
        root gathered; the last layer's all-gather output (freed at the root's post-forward, then prefetched again
        by the root's pre-backward, unless the layers are kept gathered). separate: the head's unit, gathered at the
        final norm, and its all-gather output until the root's post-forward (the root has no parameters, so nothing
        is prefetched before the head's pre-backward). separate-reshard: the head's unit gathered for the head's
        forward only; its all-gather output from the head's forward to the root's post-forward, and again from the
        root's pre-backward (its prefetch). ``layers``: the model's, kept gathered under ``keep``."""
        if fs is None:
            return []
        root = [("root parameters (gathered)", fs.root)] + fs._kept(layers)
        if fs.flat:  # FSDP1: nothing of a layer until the root's pre-backward prefetches the last one, unsharded
            return root + [("last layer's parameters (prefetched)",
                            fs.layer if at == "loss-backward" and fs.prefetch and not fs.keep else 0)]
        if fs.wrap == "root" and fs.whole:  # tied: the [norm, embedding, head] unit's, until the root's post-forward
            return root + [("all-gather output (embedding's unit)", 0 if at == "loss-backward" else fs.tail)]
        if fs.wrap == "root":
            flat = 0 if fs.keep and at == "loss-backward" else fs.layer_flat
            return root + [("all-gather output (last layer)", flat)]
        gathered = ("head parameters (gathered)", fs.head)
        flat = ("all-gather output (head)", fs.head)
        if at == "gather":  # the last layer's all-gather output, or (whole) the embedding's
            return root + [gathered, flat, ("all-gather output (previous unit)", fs.embed if fs.whole else fs.layer_flat)]
        if fs.wrap == "separate":
            return root + [gathered] + ([] if at == "loss-backward" else [flat])
        if at == "norm":
            return root + [("all-gather output (last layer)", fs.layer_flat)]
        if fs.keep:  # the head's unit stays gathered from its forward; the root's prefetch finds it so
            return root + [gathered] + ([] if at == "loss-backward" else [flat])
        return root + ([gathered] if at == "head" else []) + [flat]

    @staticmethod
    def norm_backward(fs: FsdpOverlay | None, grads: int, layers: int = 0) -> list[tuple[str, int]]:
        """The final norm's backward; ``grads``: the head's and the final norm's unsharded gradients (the root's, or
        the head unit's until its post-backward). The head's pre-backward has prefetched the last layer's all-gather
        (the root's, under the root wrap; nothing under ``keep``); under separate-reshard the head's post-backward
        has reduce-scattered its gradients and the final norm's are the root's."""
        if fs is None:
            return [("head and final norm gradients", grads)]
        if fs.wrap == "root":
            return FsdpOverlay.after_layers(fs, "loss-backward", layers) + [("head and final norm gradients", grads)]
        prefetched = ("all-gather output (next unit, prefetched)", 0 if fs.keep else fs.prefetched)
        if fs.wrap == "separate":  # (the root: nothing but the layers under ``whole``)
            return [("root parameters (gathered)", fs.root), ("head parameters (gathered)", fs.head),
                    ("head and final norm gradients", grads), prefetched] + fs._kept(layers)
        return [("root parameters (gathered)", fs.root), ("final norm gradients", fs.norm_grads),
                ("gradient shards of the layers above", fs.head_grad_shard),
                ("reduce-scatter input (head)", fs.head_reduce), ("all-reduce buffers (HSDP)", fs.head_held_reduce),
                prefetched] + fs._kept(layers)

    @staticmethod
    def head_backward(fs: FsdpOverlay, layers: int = 0) -> list[tuple[str, int]]:
        """The head's backward under a wrap with the head in a unit of its own: the unit gathered (copied out at its
        pre-backward), the root's parameters, and the last layer's all-gather prefetched by that pre-backward
        (under ``keep`` the ``layers`` still gathered instead)."""
        return [("root parameters (gathered)", fs.root), ("head parameters (gathered)", fs.head),
                ("all-gather output (next unit, prefetched)", 0 if fs.keep else fs.prefetched)] + fs._kept(layers)

    @staticmethod
    def backward(fs: FsdpOverlay | None, i: int, held: int, root_grads: int, gather: bool = False
                 ) -> list[tuple[str, int]]:  # fmt: skip
        """During layer ``i``'s backward; ``held``: the single-GPU gradients so far, ``root_grads`` of them the
        root's (head, final norm: unsharded until the root's post-backward). ``gather``: at its pre-backward, the
        prefetched all-gather copied out and not yet freed (the next layer's prefetch comes after). With the head in
        a unit of its own its gradients are a shard by now, and layer 0's pre-backward prefetches the embedding.
        Under ``keep`` layers 0..i are still gathered and nothing is gathered."""
        if fs is None:
            return [("parameter gradients so far", held)]
        if fs.whole:  # every gradient so far unsharded but the [head, norm] unit's; its reduce-scatter input kept
            return [("root parameters (gathered)", fs.root),
                    ("root gradients (unsharded)", fs._whole_grads(held, root_grads)),
                    ("gradient shards of the layers above", fs.head_grad_shard),
                    ("reduce-scatter input (layer above)", fs.head_reduce),
                    ("all-gather output (next unit, prefetched)", fs.prefetched)]
        done = (held - root_grads) // fs.layer_grads  # layers above i, already reduce-scattered
        reduce = fs.reduce_input
        if fs.wrap == "root":
            root, shards, last_reduce, prefetch, ar = root_grads // fs.width * fs.gathered_width, 0, 0, 0, 0
        else:
            root = fs.norm_grads if fs.wrap == "separate-reshard" else 0
            shards, last_reduce, prefetch, ar = fs.head_grad_shard, fs.head_reduce, fs.embed, fs.head_held_reduce
        flat = 0 if fs.keep or (fs.flat and not fs.prefetch) else \
            fs.layer_flat if i > 0 or (gather and not fs.flat) else prefetch
        if fs.flat:  # FSDP1 reduce-scatters the flat gradient and frees it before the next unit's
            reduce = last_reduce = 0
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", root)] + fs._kept(0) + [
                ("this layer's parameters (gathered)" if not fs.keep else f"layers 0..{i} parameters (gathered)",
                 fs.layer * (i + 1 if fs.keep else 1)),
                ("all-gather output (this layer)" if gather else "all-gather output (next layer, prefetched)", flat),
                ("gradient shards of the layers above", done * fs.layer_grad_shard + shards),
                ("reduce-scatter input (layer above)", reduce if done else last_reduce),
                ("all-reduce buffers (HSDP)", done * fs.held_reduce + ar)]

    def _whole_grads(self, held: int, root_grads: int) -> int:
        """``whole``: the unsharded gradients in the gathered dtype of ``held`` single-GPU gradient bytes, of which
        ``root_grads`` are the head's and the final norm's (the root's under the root wrap, the final norm's under
        separate-reshard, reduce-scattered by their unit under separate)."""
        ends = {"root": root_grads // self.width * self.gathered_width, "separate-reshard": self.norm_grads}
        return (held - root_grads) // self.width * self.gathered_width + ends.get(self.wrap, 0)

    @staticmethod
    def whole_gather(fs: FsdpOverlay) -> list[tuple[str, int]]:
        """``whole``, the forward's start: the root's all-gather copied out (FSDP2: its output still alive; FSDP1:
        gathered straight into the unsharded FlatParameter, the low-precision shard it sent not yet freed), and
        under a separate wrap the embedding's all-gather copied out before the root's output is freed."""
        if fs.flat:
            return [("root parameters (gathered)", fs.root), ("low-precision shard for the all-gather", fs.mp_shard)]
        return [("root parameters (gathered)", fs.root), ("all-gather output (root)", fs.root_flat),
                ("embedding parameters (gathered)", fs.embed),
                ("all-gather output (embedding's unit)", fs.embed + fs.tail)]

    @staticmethod
    def whole_copy_in(fs: FsdpOverlay, held: int, root_grads: int) -> list[tuple[str, int]]:
        """FSDP2 ``whole``: the root's post-backward, in the backward's final callback before the embedding's: the
        layers resharded, then its reduce-scatter input allocated beside every unsharded gradient (the head unit's
        input dropped first); the embedding's unit still gathered with its unsharded gradient. ``held``: the
        single-GPU gradients of the root's parameters, ``root_grads`` of them the head's and the final norm's."""
        return [("root gradients (unsharded)", fs._whole_grads(held, root_grads)),
                ("reduce-scatter input (root)", fs.root_reduce),
                ("embedding parameters (gathered)", fs.embed + fs.tail), ("embedding gradients (unsharded)", fs.embed),
                ("gradient shards of the layers above", fs.head_grad_shard)]

    @staticmethod
    def tail_copy_in(fs: FsdpOverlay, grads: int) -> list[tuple[str, int]]:
        """FSDP2 ``whole`` under the root wrap: the [norm, embedding, head] unit's post-backward after the root's:
        resharded, its reduce-scatter input and output (and the output's cast to the shard's dtype when they differ)
        beside its unsharded gradients (``grads`` bytes in the single-GPU width), as ``embedding_copy_in``."""
        shard = fs.tail_shard
        return [("embedding gradients (unsharded)", grads // fs.width * fs.gathered_width),
                ("gradient shards of the layers above", fs.layer_count * fs.layer_grad_shard),
                ("reduce-scatter input (embedding)", fs.tail),
                ("reduce-scatter output (embedding)", fs.gathered_width * shard),
                ("embedding gradient shard (cast)", fs.width * shard if fs.width != fs.gathered_width else 0)]

    @staticmethod
    def copy_in(fs: FsdpOverlay, i: int, held: int, root_grads: int) -> list[tuple[str, int]]:
        """Layer ``i``'s post-backward: its parameters resharded, its reduce-scatter input allocated and its
        unsharded gradients (the parameters' dtype, unpadded) not yet freed (``_fsdp_collectives.foreach_reduce``:
        the copy-in, then ``unsharded_grads.clear()``); the previous reduce-scatter's input was dropped before
        (``post_backward`` waits on ``reduce_scatter_state`` and clears it first)."""
        parts = [(n, 0 if n.startswith("reduce-scatter input") else x)
                 for n, x in FsdpOverlay.backward(fs, i, held, root_grads)]
        if fs.frozen_layers:  # frozen: resharded once the input's gradient is made, the layer below prefetched
            return parts + [("next layer's parameters (prefetched)", fs.layer if i > 0 and fs.prefetch else 0)]
        if fs.flat:  # FSDP1: still gathered; the gradients copied into one padded flat gradient, reduced from it
            return parts + [("this layer's unsharded gradients", fs.unsharded_grads),
                            ("flat gradient (reduce-scatter input)", fs.layer)]
        layer = next(k for k, (n, _) in enumerate(parts) if n.endswith("parameters (gathered)") and "layer" in n)
        parts[layer] = (f"layers 0..{i - 1} parameters (gathered)", fs.layer * i if fs.keep else 0)
        return parts + [("this layer's unsharded gradients", fs.unsharded_grads),
                        ("reduce-scatter input (this layer)", fs.reduce_input)]

    @staticmethod
    def embedding_backward(fs: FsdpOverlay | None, done: int) -> list[tuple[str, int]]:
        """After layer 0's backward, under a wrap with the embedding's own unit: the embedding gathered (its
        prefetch copied out), its unsharded gradient and the layers' and the head's gradient shards, layer 0's
        reduce-scatter input; ``done``: the layers reduce-scattered. Empty under the root wrap (the root's
        embedding is gathered through the whole step, its gradient counted with the root's)."""
        if fs is None or fs.wrap == "root":
            return []
        if fs.whole:  # before the root's post-backward (done 0) every layer gathered with its gradients unsharded
            root, grads = (fs.root, fs._whole_grads(fs.layer_count * fs.layer_grads, 0)) if not done else (0, 0)
            return [("root parameters (gathered)", root), ("root gradients (unsharded)", grads),
                    ("embedding parameters (gathered)", fs.embed), ("embedding gradients (unsharded)", fs.embed),
                    ("gradient shards of the layers above", fs.head_grad_shard + done * fs.layer_grad_shard),
                    ("reduce-scatter input (layer above)", fs.head_reduce if not done else fs.root_reduce)]
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", fs.norm_grads
                                                          if fs.wrap == "separate-reshard" else 0),
                ("embedding parameters (gathered)", fs.embed),
                ("embedding gradients (unsharded)", 0 if fs.frozen_ends else fs.embed),
                ("gradient shards of the layers above", done * fs.layer_grad_shard + fs.head_grad_shard),
                ("reduce-scatter input (layer above)", fs.reduce_input),
                ("all-reduce buffers (HSDP)", done * fs.held_reduce + fs.head_held_reduce)]

    @staticmethod
    def tied_embedding_backward(fs: FsdpOverlay | None, held: int, root_grads: int, layers: int) -> list[tuple[str, int]]:
        """The embedding's backward under tied embeddings, before its gradient is added to the head's (``held``: the
        single-GPU gradients so far, ``root_grads`` of them the root's): one GPU's gradients; under FSDP the layers
        reduce-scattered (FSDP2: layer 0's reduce-scatter input alive until the next), the root gathered with its
        gradients unsharded; ``whole``: as in a layer's backward."""
        if fs is None:
            return [("parameter gradients so far", held)]
        if fs.whole:
            return FsdpOverlay.backward(fs, 0, held, root_grads)
        return [("root parameters (gathered)", fs.root),
                ("root gradients (unsharded)", root_grads // fs.width * fs.gathered_width),
                ("gradient shards of the layers above", layers * fs.layer_grad_shard),
                ("reduce-scatter input (layer above)", 0 if fs.flat else fs.reduce_input)]

    @staticmethod
    def root_copy_in(fs: FsdpOverlay, layers: int) -> list[tuple[str, int]]:
        """FSDP1's root post-backward, after layer 0's: the root still gathered, its parameters' unsharded gradients
        copied into its padded flat gradient, every layer's gradient shard."""
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", fs.root_grads),
                ("root flat gradient (reduce-scatter input)", fs.root),
                ("gradient shards of the layers above", layers * fs.layer_grad_shard)]

    @staticmethod
    def embedding_copy_in(fs: FsdpOverlay, done: int) -> list[tuple[str, int]]:
        """The embedding's post-backward: resharded, its reduce-scatter input and output (and the output's cast to
        the shard's dtype when the reduce dtype differs) allocated while its unsharded gradient is still alive
        (layer 0's input dropped first; the last unit's gradient is freed after its reduce-scatter output is made,
        as traced), as ``copy_in``. Under a MixedPrecisionPolicy the trace has the root's final norm
        (separate-reshard) already reduced here: counted gathered, 3 bytes per element of it above the trace."""
        parts = [(n, 0 if n.startswith(("reduce-scatter input", "embedding parameters")) else x)
                 for n, x in FsdpOverlay.embedding_backward(fs, done)]
        if fs.frozen_ends:  # no gradient: the post-backward reshards and reduces nothing
            return parts
        cast = fs.embed_reduce_out // fs.reduce_width * fs.width if fs.reduce_width != fs.width else 0
        return parts + [("reduce-scatter input (embedding)", fs.embed // fs.gathered_width * fs.reduce_width),
                        ("reduce-scatter output (embedding)", fs.embed_reduce_out),
                        ("embedding gradient shard (cast)", cast)]


def _whole_overlay(arch: Architecture, family: str, width: int, g: int, world: int, impl: str, wrap: str,
                   flat: bool) -> FsdpOverlay:
    """``FsdpOverlay.whole``: FSDP1's one FlatParameter over the model (``whole_flat_units``), or FSDP2's root over
    the layers (and, under the root wrap, the embedding, final norm and head), each parameter padded as per layer."""
    if flat:
        u = whole_flat_units(arch, world)
        root = g * world * u.root_shard
        return FsdpOverlay(sharded_states(arch, family, width, u, impl), g, root, 0, 0, 0, width,
                           width * u.layer, 0, flat=True, mp_shard=g * u.root_shard if g != width else 0,
                           root_grads=g * u.root, whole=True, layer_count=arch.layers)
    u = shard_units(arch, world)
    st = sharded_states(arch, family, width, u, impl)
    root = g * world * (u.root_shard + arch.layers * u.layer_shard)
    extra: dict = {"tail": g * world * u.root_shard, "tail_shard": u.root_shard} if wrap == "root" else {}
    if wrap != "root":
        head = u.head_shard + (u.norm_shard if wrap == "separate" else 0)
        extra.update(wrap=wrap, embed=g * world * u.embed_shard, head=g * world * head, head_grad_shard=width * head,
                     norm_grads=g * arch.hidden * (1 + arch.norm_bias), head_reduce=g * world * head,
                     embed_reduce_out=g * u.embed_shard)
        root -= extra["embed"] + extra["head"]
    layers = root - extra.get("tail", 0)  # the root's own: its all-gather output and reduce-scatter input
    return FsdpOverlay(st, g, root, 0, 0, width * u.layer_shard, width, width * u.layer, layers, reduce_width=g,
                       whole=True, root_reduce=layers, layer_count=arch.layers, **extra)


def whole_flat_units(arch: Architecture, world: int) -> ShardUnits:
    """FSDP1 without an auto-wrap policy: the model one ``FlatParameter``, its parameters in registration order
    (``param_tensors``) flattened, padded to a multiple of ``world`` and chunked (``_flat_param.py`` ``_get_shard``);
    rank 0 holds the first chunk, and the optimizer keeps state for the parameters reaching into it. As
    ``flat_units``, with the root the whole model and no layer unit (``layer``: one decoder layer's elements)."""
    if world < 1:
        raise InputError(f"world {world} must be at least 1")
    tensors = param_tensors(arch)
    sizes = [n for _, n in tensors]
    shard = -(-sum(sizes) // world)
    layer = sum(n for name, n in tensors if name.startswith("layer 0 "))
    return ShardUnits(world, sum(sizes), layer, shard, 0, _reach(sizes, shard))


def lora_overlay(arch: Architecture, family: str, width: int, gathered: int, world: int, impl: str,
                 lora: Any, wrap: str = "root", flat: bool = False, prefetch: bool = True) -> FsdpOverlay:  # fmt: skip
    """FSDP2 ``fully_shard`` per decoder layer and on the root of a peft LoRA model (accelerate's FSDP2 plugin on a
    ``get_peft_model`` model), as rank 0 of ``world``: every parameter, the frozen base and each adapter's
    ``lora_A`` (r × in) and ``lora_B`` (out × r), is chunked on dim 0 and padded like any other
    (``_fsdp_param.py``), so a layer's all-gather carries the base and its adapters; only the adapters get
    gradients, so a layer's reduce-scatter input, its gradient shards and AdamW's state (moments and a step per
    adapter tensor) are the adapters' alone; the root (embedding, final norm, head) is frozen: gathered, no
    gradient. ``wrap`` separate: the embedding and [final norm, head] in units of their own, as accelerate's
    ``fsdp2_prepare_model`` carves them (the head's kept gathered after forward), frozen too (``frozen_ends``).

    ``flat``: FSDP1 as the Hugging Face Trainer wraps a peft model (``FsdpOverlay.frozen_layers``): each adapter
    weight a FlatParameter of its own (its r × in or out × r elements padded to a multiple of ``world``), each decoder
    layer's and the root's FlatParameter the frozen base's (``flat_units``)."""
    from memcalc.model.lora import targeted

    if impl not in ("foreach", "fused") or lora.quantize != "none":
        raise InputError(f"LoRA under FSDP is modelled with torch AdamW foreach or fused and a base in the compute "
                         f"dtype; got {impl}, quantize {lora.quantize}")
    u = flat_units(arch, world) if flat else shard_units(arch, world)
    r = lora.rank
    sizes = [(r, p.fan_in) for p in targeted(arch, lora)] + [(p.fan_out, r) for p in targeted(arch, lora)]
    adapters = sum(rows * cols for rows, cols in sizes)  # one layer's, unsharded
    # rank 0's padded chunk of them: FSDP2 chunks each on dim 0, FSDP1 flattens each into a unit of its own
    shard = sum(-(-(rows * cols) // world) if flat else -(-rows // world) * cols for rows, cols in sizes)
    base = u.root_shard + arch.layers * u.layer_shard
    trainable = arch.layers * shard
    temp = {"foreach": width * trainable, "fused": 0}[impl]
    st = States(width * (base + trainable), width * trainable, 2 * width * trainable + 4 * len(sizes) * arch.layers,
                0, buffer_bytes(arch, family, width), temp, 0)
    root = gathered * world * u.root_shard
    if flat:
        if wrap != "root":
            raise InputError(f"fsdp_wrap {wrap!r} with LoRA under FSDP1: accepted root")
        layer = gathered * world * u.layer_shard
        return FsdpOverlay(st, gathered, root, layer, layer, width * shard, width, width * adapters, root, flat=True,
                           mp_shard=gathered * u.layer_shard if gathered != width else 0, prefetch=prefetch,
                           frozen_layers=True)
    layer = gathered * world * (u.layer_shard + shard)
    ends: dict = {}
    if wrap == "separate":
        ends = {"wrap": wrap, "embed": gathered * world * u.embed_shard,
                "head": gathered * world * (u.head_shard + u.norm_shard), "frozen_ends": True}
        root -= ends["embed"] + ends["head"]
    elif wrap != "root":
        raise InputError(f"fsdp_wrap {wrap!r} with LoRA: accepted root, separate")
    return FsdpOverlay(st, gathered, root, layer, layer, width * shard, width, width * adapters, root,
                       gathered * world * shard, **ends)
