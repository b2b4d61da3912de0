"""FSDP1, FSDP2 and HSDP as an overlay on the step: the sizes each moment's FSDP parts read (``FsdpOverlay``, made
once per architecture and layout), the whole-model and LoRA variants. The parts themselves:
``memcalc.memory.overlays.fsdp_moments``; the sharded states: ``memcalc.memory.engine.timeline_states``."""

from __future__ import annotations

from typing import Any

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.layout.compose import check_wrap
from memcalc.memory.overlays.fsdp_moments import FsdpMoments
from memcalc.memory.engine.timeline_states import (ShardUnits, States, reach, buffer_bytes, flat_units, fp8_gathered,
                                                   param_tensors, shard_units, sharded_states)
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture


@frozen
class FsdpOverlay(FsdpMoments):
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
    return ShardUnits(world, sum(sizes), layer, shard, 0, reach(sizes, shard))


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
