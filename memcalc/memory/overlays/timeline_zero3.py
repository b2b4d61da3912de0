"""The live bytes of one DeepSpeed ZeRO-3 step of a Hugging Face model, moment by moment.

As for ZeRO-0/1/2 (``memcalc.memory.overlays.timeline_zero``), DeepSpeed casts the module to the training dtype, so the
layers save what a pure bf16 model saves (``memcalc.memory.engine.timeline``, ``regime="bf16"``) and only the model states
and their transients differ. What rank ``rank`` of N holds, read from DeepSpeed 0.19 (``runtime/zero/stage3.py``,
``partition_parameters.py``, ``partitioned_param_coordinator.py``, ``runtime/comm/coalesced_collectives.py``) and
traced op by op on CPU ranks (``memcalc.validation.trace_deepspeed``; tests/validation/test_deepspeed_timeline.py),
with each parameter of n elements partitioned into ⌈n/N⌉ (P3 = Σ⌈n/N⌉ on rank 0, which holds full chunks):

- between steps: the bf16 partitions (2·P3), the fp32 master partitions (4·P3), AdamW's moments (8·P3), the bf16
  gradient partitions (2·P3, ``grad_partitions_flat_buffer``, allocated once), the gradient bucket
  (2·``reduce_bucket_size``, ``ipg_buckets[...].buffer``, with ``contiguous_gradients``, the default) and the
  persistent parameters whole (those of at most ``stage3_param_persistence_threshold`` elements);
- forward and backward: the parameters the coordinator holds gathered while each module runs, replayed hook by
  hook with its prefetching and ``stage3_max_reuse_distance`` (``memcalc.memory.overlays.zero3.gathered_bytes``);
- backward: each gradient as autograd makes it, copied into the bucket in its hook and freed (one that does not fit
  stays until the bucket is reduced); a gradient that overflows the bucket reduces it first:
  ``reduce_scatter_coalesced`` concatenates the bucket's gradients padded to N·⌈n/N⌉ each into a new buffer (none
  for a single gradient divisible by N), reduce-scatters in place and copies the rank's slice into its partitions
  (what a backend copies inside the collective is not counted: NCCL reduces in place, and the traced runs stage
  gloo's collectives out of sight, ``memcalc.validation.trace_deepspeed``);
- optimizer step, per sub-group of at most ``sub_group_size`` partition elements: an fp64 copy of each gradient
  partition for the norm, the flattened partitions and their fp32 copy (``flatten(...).to(fp32)``: 2 + 4 bytes per
  element), then AdamW on the fp32 gradient (its temporaries: for-loop 8, foreach 4, fused 0 bytes per element).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memcalc.errors import InputError
from memcalc.layout.plan import REDUCE_BUCKET_SIZE, Zero3Settings
from memcalc.memory.engine.timeline import MLP_FRAME, O_PROJ_FRAME, Moment, Timeline, _moment, timeline, with_loss
from memcalc.memory.engine.timeline_states import adapter_tensors, buffer_bytes, param_tensors, step_temporaries
from memcalc.memory.overlays.timeline_zero import _GRADS, _STATES, embedding_leaf, module_dtype, trainable
from memcalc.memory.overlays.zero3 import _called, gathered_bytes, persistent, released_bytes
from memcalc.model.architecture import Architecture
from memcalc.units import ceil_div

SUB_GROUP_SIZE = 1_000_000_000
"""``zero_optimization.sub_group_size`` (DeepSpeed's default): the optimizer steps this many partition elements at
a time."""
NOTE = ("DeepSpeed ZeRO-3: the module in {dtype} saves what a pure {dtype} model saves; rank 0's partitions, the "
        "gradient partitions and bucket (reduce_bucket_size {bucket:,} elements), the parameters its coordinator holds "
        "gathered module by module (stage3_prefetch_bucket_size {z.prefetch_bucket_size:,}, stage3_max_reuse_distance "
        "{z.max_reuse_distance:,}, stage3_max_live_parameters {z.max_live_parameters:,}, persistence threshold "
        "{z.param_persistence_threshold:,}), the bucket's reductions and the step's fp32 gradients per sub-group "
        "(sub_group_size {z.sub_group_size:,}) as "
        "DeepSpeed 0.19 holds them (memory/overlays/timeline_zero3.py, against traced DeepSpeed steps on CPU ranks)")


def sub_groups(arch: Architecture, dp: int, size: int = SUB_GROUP_SIZE, lora=None) -> tuple[int, ...]:
    """Partition elements of each optimizer sub-group (``stage3.py`` ``_create_fp16_sub_groups``: the parameters
    that train, in order, a group closed once it reaches ``size``)."""
    out, run = [], 0
    tensors = trainable(arch, lora)
    for k, (_, n) in enumerate(tensors):
        run += ceil_div(n, dp)
        if run >= size or k == len(tensors) - 1:
            out.append(run)
            run = 0
    return tuple(out)


def _layer_of(module: str) -> str:
    """The timeline phase a module's work belongs to: ``layer<i>...`` → ``layer.i``; the rest by name."""
    if module.startswith("layer"):
        return "layer." + module[5:].split(".", 1)[0]
    return module


_FRAME_MODULES = {O_PROJ_FRAME: ("running", "o"), MLP_FRAME: ("released", "mlp.up")}
"""A checkpointed layer's forward moments between its submodules (``memcalc.memory.engine.timeline``), and the module
whose gathered parameters they see: o_proj while it runs; after up_proj's post-hook, before down_proj's fetch."""

NORM_BUFFER = 250_000_000
"""``_constant_buffered_norm2``'s buffer_size (runtime/zero/stage3.py): the elements cast to fp64 at a time."""


def _to_host(n: int, width: int = 2) -> int:
    """GPU bytes one reduced gradient partition of ``n`` elements takes on its way to the CPU under offload_optimizer
    (stage3.py ``partition_grads``): its copy ``grad_buffer.to(device)`` (width·n) while its norm runs in fp64 chunks
    (``get_norm_dtype``: torch.double on CUDA; 8·min(n, 2.5e8)), then while the fp32 copy for the CPU's ``.grad`` is
    made (4n)."""
    return width * n + max(8 * min(n, NORM_BUFFER), 4 * n)


def _gradients(arch: Architecture, dp: int, bucket: int, width: int = 2, offload: bool = False, lora=None,
               hooks: dict[str, tuple[int, int]] | None = None) -> tuple[dict[str, int], int]:  # fmt: skip
    """Per phase key (``layer.i``, ``head``...), the most bytes of gradients and reduction buffers alive at one of
    its gradient hooks; and at the end of backward (the last bucket reduced). ``offload``: the optimizer is on the
    CPU, and each reduced partition leaves the GPU one parameter at a time (``_to_host``) while the bucket's
    reduction buffer holds it. ``lora``: only the adapters get gradients (peft freezes the base). ``hooks``, where
    given, gets each MoE block parameter's (bytes at its hook, bytes still outside the buffer once it returned), and
    ``layer.<i>.before`` the bytes outside the buffer before the block's first hook: the experts' grouped backward
    makes down's gradient before gate_up's, so their hooks run in that order."""
    events, mods, numel = _called(arch, False, lora)
    order = [m for kind, m in events[events.index(("backward", "")) + 1:] if kind == "fetch" and mods[m].params]
    held: list[tuple[str, int]] = []  # (parameter, elements) in the bucket
    own = 0  # bytes of gradients in the bucket's list but not in its buffer (larger than the room left)
    elements = 0
    out: dict[str, int] = {}

    def flush() -> int:
        if not held:
            return 0
        padded = width * dp * sum(ceil_div(n, dp) for _, n in held)
        concat = 0 if len(held) == 1 and held[0][1] % dp == 0 else padded
        host = max(_to_host(ceil_div(n, dp), width) for _, n in held) if offload else 0
        return concat + host

    for m in order:
        key = _layer_of(m)
        moe = m.endswith((".experts", ".router"))
        if hooks is not None and m.endswith(".experts"):
            hooks[f"{key}.before"] = (own, own)
        for p in reversed(mods[m].params) if m.endswith(".experts") else mods[m].params:
            if lora is not None and ".lora_" not in p:
                continue
            n = numel[p]
            at = width * n + own
            if elements + n > bucket and elements > 0:
                at += flush()
                held, own, elements = [], 0, 0
            out[key] = max(out.get(key, 0), at)
            if elements + n > bucket:
                own += width * n
            held.append((p, n))
            elements += n
            if hooks is not None and moe:
                hooks[p] = (at, own)
    return out, own + flush()


TRANSIENT = "layer backward transient (MLP gradients)"


def _moe_backward(arch: Architecture, s: int, b: int, w: int, recomputed: bool, parts: list[tuple[str, int]],
                  hooks: dict[str, tuple[int, int]], key: str, label: str) -> tuple[list[tuple[str, int]], int]:
    """An MoE block's backward under ZeRO-3, moment by moment with the gradients alive at each: the pairs reordered
    and the routing weights' product with what the hooks before the block left outside the bucket's buffer; down's
    grouped backward at down's hook; SiLU·up's after it; gate_up's at gate_up's hook. The second norm's backward
    comes after the router's hook. Returns the moment's parts (the block's transient, net of weight gradients, in
    place of the layer's) and the gradient bytes alive beside them."""
    from memcalc.memory.families.saved_moe import moe_backward_moments
    from memcalc.memory.families.saved_parts import shape

    layer = "layer" + key.split(".", 1)[1]
    if label.endswith("second RMSNorm's backward"):
        return parts, hooks[f"{layer}.router.0"][1]
    steps = moe_backward_moments(arch, shape(arch, s, b), w, 0, recomputed)
    before = hooks[f"{key}.before"][0]
    down, gate_up = hooks[f"{layer}.experts.1"], hooks[f"{layer}.experts.0"]
    held = {"reorder": before, "weights": before, "down": down[0], "gated": down[1], "gate_up": gate_up[0]}
    top = max(steps, key=lambda k: steps[k] + held[k])
    return [(n, steps[top] if n == TRANSIENT else x) for n, x in parts], held[top]


PARAM_OFFLOAD_NOTE = ("DeepSpeed ZeRO-3 offload_param without offload_optimizer: the bf16 partitions in pinned host "
                      "memory; the fp32 master partitions, moments and gradient partitions, the bucket and the gathered "
                      "parameters on the GPU, the step there, its updated partitions copied to the host (a blocking "
                      "copy_, cast on the host side); read from DeepSpeed 0.19's stage3.py, not traced (a CPU run cannot "
                      "tell the devices apart)")
OFFLOAD_NOTE = ("DeepSpeed ZeRO-3 offload: on the GPU the bf16 partitions (on the host too with offload_param), the "
                "1-bucket gradient buffer, the gathered parameters and each reduced gradient partition's copies on its "
                "way to the host (bf16 copy, fp64 norm chunks of at most 2.5e8 elements, fp32 copy); the fp32 master "
                "partitions, moments, bf16 and fp32 gradient partitions in host memory; read from DeepSpeed 0.19's "
                "stage3.py, not traced (a CPU run cannot tell the devices apart)")


def zero3_timeline(arch: Architecture, *, family: str, dp: int, attention: str, s: int, b: int,
                   recompute: str = "none", optimizer_impl: str = "fused", loss: str = "standard",
                   device: str = "cpu", bucket: int = REDUCE_BUCKET_SIZE, settings: Zero3Settings = Zero3Settings(),
                   sub_group_size: int = SUB_GROUP_SIZE, compiled: bool = False, loss_compiled: bool | None = None,
                   position_ids: bool = False, use_cache: bool = True, offload_optimizer: bool = False,
                   offload_params: bool = False, lora=None, precision: str = "bf16") -> Timeline:  # fmt: skip
    """Moments of one DeepSpeed ZeRO-3 step (bf16 or fp16 training dtype, or fp32: ``precision``; torch AdamW of
    ``optimizer_impl`` or DeepSpeed's FusedAdam: ``fused``) on data-parallel rank 0 of ``dp`` (the rank with the
    largest partitions).

    ``offload_optimizer`` (``offload_optimizer.device`` cpu or nvme, ratio 1, DeepSpeedCPUAdam): the fp32 master
    partitions, the moments and the gradient partitions (``grad_partitions_flat_buffer``, ``device=self.device``:
    stage3.py ``self.device`` is the CPU) live on the host; the GPU keeps the bf16 partitions, the bucket (allocated on
    the accelerator whatever offloads), the gathered parameters, and each reduced gradient partition's copies on its
    way to the CPU (``_to_host``); the step runs on the CPU and writes the updated partitions back into the bf16 GPU
    partitions (``copy_``, no GPU temporary). ``offload_params`` (``offload_param.device``): the bf16 partitions
    live in pinned host memory (``param_groups_fp16_flat_cpu_memory``); parameters are gathered onto the GPU as
    without offload. Without ``offload_optimizer`` the rest is as without offload: ``self.device`` is the
    accelerator, so the fp32 master partitions (``_create_fp32_partitions``: the host partitions converted
    ``.to(self.device)``), the moments and the gradient partitions stay on the GPU and the step runs there; the
    updated fp32 partitions are written into the host's bf16 partitions (``_reassign_or_swap_out_partitioned_parameters``:
    a blocking ``copy_`` to the host, cast on the host side, no GPU temporary).

    ``lora``: peft adapters on a frozen base (``memcalc.model.lora.LoraPlan``, the base in the training dtype).
    DeepSpeed partitions every parameter, the frozen base's too, and gathers each module's as it runs (peft's
    ``base_layer``, ``lora_A`` and ``lora_B`` are modules of their own: ``memcalc.model.tree.lora_tree``); the fp32
    master partitions, the moments, the gradient partitions, the bucket's gradients and the step are the
    adapters' alone (``trainable_param_groups``), on the host under ``offload_optimizer``."""
    lora = _checked(dp, bucket, sub_group_size, optimizer_impl, recompute, lora)
    # fp32: the partitions, gradients, bucket and gathered parameters in 4 bytes; the fp32 master partitions are
    # still clones (stage3.py ``_create_fp32_partitions``) and the upcast of a flattened sub-group is the same tensor
    dtype, w = module_dtype(precision, offload_optimizer or offload_params, lora)
    tl = timeline(arch, family=family, regime=dtype, attention=attention, s=s, b=b, recompute=recompute,
                  optimizer_impl="fused", loss=loss, device=device, position_ids=position_ids, use_cache=use_cache,
                  compiled=compiled, loss_compiled=loss_compiled, lora=lora, hooked_grads=True)  # fmt: skip
    tensors = trainable(arch, lora)
    groups = sub_groups(arch, dp, sub_group_size, lora)
    states = _states(arch, family, dp, settings, lora, dtype, w, bucket, tensors, groups, offload_optimizer,
                     offload_params)
    g = _gathers(arch, dp, settings, recompute == "full", w, lora)
    hooks: dict[str, tuple[int, int]] = {}
    grads, epilogue = _gradients(arch, dp, bucket, w, offload=offload_optimizer, lora=lora, hooks=hooks)
    moments = _forward_backward(tl, arch, s, b, w, recompute == "full", lora, states, g, grads, hooks)
    inputs = [(n, x) for n, x in tl.moments[1].parts if n.startswith("input ids")]
    base = states + inputs
    moments.append(_moment("backward.epilogue", "the last bucket reduced", base + [
        ("gathered parameters", g.gathered.get(("backward", "embed"), 0)),
        ("gradients and the bucket's reduction", epilogue)] + embedding_leaf(arch, s, b, lora)))
    if offload_optimizer:  # the norm, clipping and Adam on the host; the write-back copies into the bf16 partitions
        moments += [_moment("optimizer", "DeepSpeedCPUAdam on the host, the bf16 partitions written back", base),
                    _moment("zero_grad", "after the step", base)]
        return with_loss(tl, moments)
    return with_loss(tl, moments + _optimizer_step(base, dtype, w, groups, max(ceil_div(n, dp) for _, n in tensors),
                                                   optimizer_impl))


def _checked(dp: int, bucket: int, sub_group_size: int, optimizer_impl: str, recompute: str, lora):
    """``zero3_timeline``'s arguments refused with one line; the LoRA plan with every projection's input saved."""
    if lora is not None and lora.quantize != "none":
        raise InputError("LoRA under DeepSpeed ZeRO-3: the realistic timeline models a base in the training dtype "
                         "(--quantize none)")
    if lora is not None:  # DeepSpeed's linear saves every projection's input, a frozen one's too (below)
        lora = replace(lora, inputs_saved=True)
    if dp < 1 or bucket < 0 or sub_group_size < 0:
        raise InputError(f"dp {dp} must be positive, reduce_bucket_size {bucket} and sub_group_size {sub_group_size} "
                         "0 or more")
    if optimizer_impl not in ("foreach", "fused", "for-loop"):
        raise InputError(f"optimizer implementation {optimizer_impl!r} under DeepSpeed: accepted foreach, fused, "
                         "for-loop")  # fmt: skip
    if recompute not in ("none", "full"):
        raise InputError(f"recompute {recompute!r} under ZeRO-3: accepted none, full")
    return lora


def _states(arch: Architecture, family: str, dp: int, settings: Zero3Settings, lora, dtype: str, w: int,
            bucket: int, tensors, groups: tuple[int, ...], offload_optimizer: bool,
            offload_params: bool) -> list[tuple[str, int]]:  # fmt: skip
    """What rank 0 holds all step: its partitions (on the host under offload), the fp32 master partitions, moments
    and gradient partitions (on the host under ``offload_optimizer``), the bucket, the persistent parameters, the
    buffers."""
    p3 = sum(ceil_div(n, dp) for _, n in tensors)  # the partitions that train
    every = param_tensors(arch) + (adapter_tensors(arch, lora) if lora is not None else ())
    # Persistent parameters stay whole beside their partitions; on one rank the partition is the whole parameter,
    # already counted (that case was traced with no persistent parameters only).
    whole = w * sum(persistent(arch, settings, lora).values()) if dp > 1 else 0
    mine = w * sum(ceil_div(n, dp) for _, n in every)
    on_gpu = [] if offload_params else [(f"parameters ({dtype} partitions)", mine)]
    if not offload_optimizer:
        on_gpu += [("fp32 master partitions", 4 * p3), ("optimizer states (fp32 moments)", 8 * p3 + 4 * len(groups)),
                   (f"gradient partitions ({dtype})", w * p3)]  # fmt: skip
    return [*on_gpu, ("gradient bucket (reduce_bucket_size)", w * bucket), ("persistent parameters (whole)", whole),
            ("buffers", buffer_bytes(arch, family, w))]  # fmt: skip


@dataclass(frozen=True)
class _Gathered:
    """The bytes of gathered parameters over a later step (``memcalc.memory.overlays.zero3``), by (phase, layer or module)."""

    gathered: dict[tuple[str, str], int]  # while each module runs, the most of its layer
    fetching: dict[tuple[str, str], int]  # at a fetch, an emptied flat buffer not yet freed (when larger)
    # a checkpointed layer's forward between its submodules (``timeline``'s frame moments): the o projection
    # running, the MLP's product once up's post-hook released what it lets go (prefetched modules included)
    running: dict[tuple[str, str], int]
    released: dict[tuple[str, str], int]
    after_forward: int  # as backward starts


def _gathers(arch: Architecture, dp: int, settings: Zero3Settings, recomputed: bool, w: int, lora) -> _Gathered:
    """Gathered parameters while each module runs; at world 1 nothing is gathered (``_no_gather_coalesced``)."""
    gathered: dict[tuple[str, str], int] = {}
    fetching: dict[tuple[str, str], int] = {}
    running: dict[tuple[str, str], int] = {}
    if dp == 1:
        return _Gathered(gathered, fetching, running, {}, 0)
    after_forward = 0
    for phase, module, x, at in gathered_bytes(arch, dp, settings, recomputed, w, lora):
        if phase == "loss":
            after_forward = x
            continue
        key = (phase, _layer_of(module))
        gathered[key] = max(gathered.get(key, 0), x)
        running[(phase, module)] = x
        if at > x:
            fetching[key] = max(fetching.get(key, 0), at)
    released = {(phase, module): x for phase, module, x in
                released_bytes(arch, dp, settings, True, w, lora)} if recomputed else {}  # fmt: skip
    return _Gathered(gathered, fetching, running, released, after_forward)


def _forward_backward(tl: Timeline, arch: Architecture, s: int, b: int, w: int, recomputed: bool, lora,
                      states: list[tuple[str, int]], g: _Gathered, grads: dict[str, int],
                      hooks: dict[str, tuple[int, int]]) -> list[Moment]:  # fmt: skip
    """The step's moments to the end of backward: each of ``timeline``'s with rank 0's states in place of the
    model's, the parameters gathered then, the gradients in flight to the bucket, and each fetch's emptied buffer."""
    moments: list[Moment] = []
    last: list[tuple[str, int]] = []  # the previous moment's parts, less the gathered parameters
    seen: set[tuple[str, str]] = set()
    for m in tl.moments:
        if m.phase in ("optimizer", "zero_grad"):
            continue
        # no parameter's gradient made yet: none in flight (LoRA: no head gradient comes before the layers')
        made = sum(x for n, x in m.parts if n in _GRADS) or (lora is not None and m.phase.startswith("backward.layer."))
        parts = [(n, x) for n, x in m.parts if n not in (*_STATES, *_GRADS)]
        extra: list[tuple[str, int]] = []
        if m.phase.startswith(("forward", "backward")):
            phase, _, rest = m.phase.partition(".")
            key = rest if rest.startswith("layer.") else ("head" if phase == "forward" else "final_norm")
            parts, here = _module_gathered(m, phase, rest, key, made, g, arch, s, b, w, recomputed, parts, grads,
                                           hooks, extra)
            extra.insert(0, ("gathered parameters", here))
            k = (phase, key)
            if k in g.fetching and k not in seen:  # the fetch, before this phase's work: what the moment before held
                moments.append(_moment(m.phase, "the parameters gathered, the emptied all-gather buffer not yet freed",
                                       last + [("gathered parameters", g.fetching[k])]))
            seen.add(k)
        elif m.phase == "loss":
            extra.append(("gathered parameters", g.after_forward))
        if lora is not None and m.phase == "backward":
            # ZeRO-3 replaces F.linear with its own autograd function (runtime/zero/linear.py
            # LinearFunctionForZeroStage3, installed for good by the engine's zero.Init: memory_efficient_linear),
            # which saves every linear's input, a frozen one's too: the frozen head keeps the final norm's output
            # until its backward (traced); the layers' projections without an adapter keep theirs as well
            # (``LoraPlan.inputs_saved``: the saved set of adapters on every projection, traced with q,v alone)
            extra.append(("head input (saved by DeepSpeed's linear)", 2 * s * b * arch.hidden))
        moments.append(_moment(m.phase, m.label, states + parts + extra))
        last = states + parts + [e for e in extra if e[0] != "gathered parameters"]
    return moments


def _module_gathered(m: Moment, phase: str, rest: str, key: str, made: int, g: _Gathered, arch: Architecture, s: int,
                     b: int, w: int, recomputed: bool, parts: list[tuple[str, int]], grads: dict[str, int],
                     hooks: dict[str, tuple[int, int]],
                     extra: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], int]:  # fmt: skip
    """At a forward or backward moment of module ``key``: its parts (an MoE block's backward: the experts'
    gradients as their hooks move them) and the bytes gathered; the gradients in flight added to ``extra``."""
    gathered = g.gathered
    here = gathered.get((phase, key), 0)
    frame = _FRAME_MODULES.get(m.label.split(": ", 1)[-1]) if phase == "forward" and rest else None
    if frame is not None:  # within the layer: what is gathered beside that moment's work
        table, module = frame
        layer = "layer" + key.removeprefix("layer.")
        here = (g.running if table == "running" else g.released).get((phase, f"{layer}.{module}"), here)
    if phase == "forward" and m.label.startswith("the final norm"):
        here = max(here, gathered.get((phase, "final_norm"), 0))
    if phase == "backward" and not rest:  # the loss's backward, then the head's and the final norm's
        here = gathered.get((phase, "final_norm"), gathered.get((phase, "head"), 0)) if made else g.after_forward
        extra.append(("gradients and the bucket's reduction", max(grads.get("head", 0),
                                                                  grads.get("final_norm", 0)) if made else 0))
    elif phase == "backward" and arch.moe and made and m.label.endswith(("MLP gradients",
                                                                        "second RMSNorm's backward")):
        parts, held = _moe_backward(arch, s, b, w, recomputed, parts, hooks, key, m.label)
        extra.append(("gradients and the bucket's reduction", held))
    elif phase == "backward":
        extra.append(("gradients and the bucket's reduction", grads.get(key, 0) if made else 0))
    return parts, here


def _optimizer_step(base: list[tuple[str, int]], dtype: str, w: int, groups: tuple[int, ...], largest: int,
                    optimizer_impl: str) -> list[Moment]:  # fmt: skip
    """Sub-group by sub-group (stage3.py step): its gradients flattened and upcast (the flat copy freed once upcast),
    AdamW on it, its fp32 gradients released; the sub-groups after the first are flattened while the step runs.
    ``largest``: the elements of rank 0's largest gradient partition (its fp64 copy for the norm)."""
    big = max(groups)
    temp = step_temporaries(optimizer_impl, (("fp32 sub-group", big),), 4)

    def flattened(n: int) -> list[tuple[str, int]]:
        return [(f"flattened gradients ({dtype})", w * n), ("fp32 gradients", 4 * n if w == 2 else 0)]

    return [
        _moment("optimizer", "fp64 copy of a gradient partition for the norm", base
                + [("fp64 gradient partition", 8 * largest)]),
        _moment("optimizer", "the first sub-group's gradients flattened and upcast", base + flattened(groups[0])),
        *([_moment("optimizer.adamw", "a later sub-group's gradients flattened and upcast",
                   base + flattened(max(groups[1:])))] if len(groups) > 1 else []),
        _moment("optimizer.adamw", "AdamW on a sub-group's fp32 partition", base
                + [("fp32 gradients", 4 * big), ("step temporaries", temp)]),
        _moment("zero_grad", "after the step", base),
    ]  # fmt: skip
