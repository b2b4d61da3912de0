"""The paper's accounting: ZeRO's model states (§3.1, §5) and Korthikanti et al.'s activations, per rank.

``--accounting paper``. Model states follow Rajbhandari et al. 2020 (arXiv 1910.02054): 2Ψ + 2Ψ + KΨ, each
term divided by N where the strategy partitions it (``memcalc.memory.accountings.states``). Activations follow Korthikanti
et al. 2022 (arXiv 2205.05198) Table 2 tensor by tensor (``memcalc.memory.accountings.activations``), times the micro-batches
a pipeline stage keeps in flight (Eq. 5).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from memcalc.layout.compose import composition
from memcalc.layout.dtypes import Optimizer, Precision
from memcalc.layout.plan import Plan
from memcalc.layout.strategies import StrategySpec, shard_numel
from memcalc.memory.accountings import states
from memcalc.memory.accountings.rows import Row
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture

if TYPE_CHECKING:  # loaded on first use: a bare parameter count needs neither
    from memcalc.memory.accountings import activations as act

_STATE_KEYS = ("parameters", "gradients", "master_weights", "optimizer_moments")


class ParamGroup(NamedTuple):
    """Parameters one rank holds that are sharded over the same group (dense over dp; routed experts over dp/ep)."""

    psi: int
    n: int


def param_groups(plan: Plan, stage: int) -> tuple[int, list[ParamGroup]]:
    """(parameters on this rank, their sharding groups) for pipeline stage ``stage``."""
    n, arch = plan.shard_group_size, plan.arch
    if arch is None:  # a bare count: no model parallelism (the inputs ask for the shape with tp or pp)
        return plan.psi, [ParamGroup(plan.psi, n)]
    if plan.stage_layers is None:
        total, routed = _held(arch, stage, plan.pp, plan.tp, plan.ep)
    else:
        total, routed = _held_split(arch, stage, plan.pp, plan.tp, plan.ep, plan.stage_layers)
    groups = [ParamGroup(total - routed, n)]
    if routed:
        # Megatron-LM's expert-data-parallel group: routed experts are replicated over dp/ep ranks only.
        groups.append(ParamGroup(routed, max(1, n // plan.ep) if n % plan.ep == 0 else n))
    return total, groups


@per_architecture
def _held(arch: Architecture, stage: int, pp: int, tp: int, ep: int) -> tuple[int, int]:
    """(parameters, routed-expert parameters) one TP/EP rank of pipeline stage ``stage`` holds."""
    from memcalc.model.params import Shard, stage_params

    held = stage_params(arch, stage, pp, Shard(tp, ep))
    return held.total, sum(x.routed for x in held.layers)


@per_architecture
def _held_split(arch: Architecture, stage: int, pp: int, tp: int, ep: int, split: tuple[int, ...]) -> tuple[int, int]:
    """``_held`` under an explicit split: the rank's chunks' layers, the embeddings on rank 0, the final norm and
    head on the last rank (a tied head is a copy of the embedding there when pp > 1, as ``stage_params`` counts)."""
    from memcalc.layout.compose import rank_layers
    from memcalc.model.params import Shard, embedding_params, model_params

    whole = model_params(arch, Shard(tp, ep))
    layers = [whole.layers[i] for r in rank_layers(split, pp, stage) for i in r]
    total, routed = sum(x.total for x in layers), sum(x.routed for x in layers)
    if stage == 0:
        total += whole.embeddings + whole.positions + whole.embedding_norm
    if stage == pp - 1:
        head = whole.head if not arch.tied_embeddings else (embedding_params(arch, tp) if pp > 1 else 0)
        total += whole.final_norm + head
    return total, routed


@per_architecture
def _moe_layers(arch: Architecture, start: int, stop: int) -> int:
    """MoE layers among decoder layers ``start`` to ``stop - 1``."""
    return sum(arch.is_moe_layer(i) for i in range(start, stop))


@per_architecture
def _layer_bytes(arch: Architecture, st: act.Setting, tp: int, sp: bool, recompute: str, moe: bool,
                 dtensor: bool = False) -> int:
    """What one layer saves per micro-batch (``memcalc.memory.accountings.activations.layer_activations``)."""
    from memcalc.memory.accountings import activations as act

    return act.layer_activations(arch, st, tp, sp, recompute, moe=moe, dtensor=dtensor).total  # type: ignore[arg-type]


def moe_layers(plan: Plan, stage: int) -> int:
    """MoE layers on pipeline stage ``stage``."""
    assert plan.arch is not None
    if not plan.arch.moe:  # a dense model has none (Architecture.is_moe_layer)
        return 0
    return sum(_moe_layers(plan.arch, r.start, r.stop) for r in stage_chunks(plan, stage))


def model_state_rows(plan: Plan, groups: list[ParamGroup], stage: int = 0) -> list[Row]:
    """Every model-state tensor of one rank (of pipeline stage ``stage``), one row per tensor per location."""
    if plan.lora is not None:
        return lora_state_rows(plan, groups[0])
    p, opt, spec, gb = plan.precision, plan.optimizer, plan.spec, plan.grad_bytes
    opt_dev, param_dev = plan.optimizer_device, plan.offload_params
    b_mom = opt.moment_bytes_for(p)
    if len(groups) == 1 and opt_dev == "none" and param_dev == "none":
        # Nothing offloaded, one sharding group (a planner's common case): the states.* formulas, inline.
        psi, n = groups[0]
        shard = shard_numel(psi, n)  # states.state_bytes, element count taken once for the four tensors
        sizes = ((shard if spec.shards_params else psi) * p.param_bytes,
                 (shard if spec.shards_grads else psi) * gb,
                 (shard if spec.shards_optimizer else psi) * p.master_bytes,
                 (shard if spec.shards_optimizer else psi) * opt.moments * b_mom)
        rows = [Row(key, label, size, "gpu", "model_state", detail) for key, (label, detail, _), size
                in zip(_STATE_KEYS, _state_labels(p, opt, spec, plan.shard_group_size, gb), sizes)]
        return rows + pipeline_fsdp_rows(plan, groups, stage) if plan.pp > 1 else rows
    placed = [
        (
            states.parameter_bytes(g.psi, p.param_bytes, spec.shards_params, g.n, param_dev),
            states.gradient_bytes(g.psi, gb, spec.shards_grads, spec.shards_optimizer, g.n, opt_dev),
            states.master_bytes(g.psi, p.master_bytes, spec.shards_optimizer, g.n, opt_dev),
            states.moment_bytes(g.psi, opt.moments, b_mom, spec.shards_optimizer, g.n, opt_dev),
        )
        for g in groups
    ]
    # _STATE_KEYS x (gpu, cpu, nvme), summed over the groups
    sums = placed[0] if len(placed) == 1 else [states.StateBytes(*map(sum, zip(*col))) for col in zip(*placed)]
    rows: list[Row] = []
    for key, (label, detail, offloaded), (on_gpu, cpu, nvme) in zip(
        _STATE_KEYS, _state_labels(p, opt, spec, plan.shard_group_size, gb), sums
    ):
        rows.append(Row(key, label, on_gpu, "gpu", "model_state", offloaded if on_gpu == 0 and (cpu or nvme) else detail))
        if cpu:
            rows.append(Row(key, label, cpu, "cpu", "model_state", "on cpu: " + detail))
        if nvme:
            rows.append(Row(key, label, nvme, "nvme", "model_state", "on nvme: " + detail))
    return rows + pipeline_fsdp_rows(plan, groups, stage) if plan.pp > 1 else rows


def lora_state_rows(plan: Plan, group: ParamGroup) -> list[Row]:
    """LoRA (Hu et al. 2021 §4): the frozen base has no gradient, master copy or optimizer state and is sharded like
    any parameter (ZeRO-3, FULL_SHARD); the adapters are trainable parameters under the ZeRO rows (§3.1, §5). QLoRA:
    the base's linear weights in NF4 (``memcalc.model.lora.nf4_bytes``)."""
    from memcalc.model import lora as lr

    arch, lp = plan.arch, plan.lora
    assert arch is not None and lp is not None
    p, opt, spec, n = plan.precision, plan.optimizer, plan.spec, group.n
    opt_dev, param_dev = plan.optimizer_device, plan.offload_params
    layer = lr.layer_lora(arch, lp)
    sp = lr.split(group.psi, arch.layers, layer, lp.quantize, p.param_bytes)
    a, div = sp.adapters, f"/{n}" if n > 1 else ""
    b_mom = opt.moment_bytes_for(p)
    base = "nf4" if lp.quantize == "nf4" else p.low_dtype
    how = (f"NF4 linear weights (bitsandbytes, double quantization) + the rest at {p.param_bytes} B"
           if lp.quantize == "nf4" else f"{p.param_bytes}Ψ_frozen")
    src = f"r = {lp.rank} on {','.join(lp.targets)} x {arch.layers} layers"
    placed = (
        ("parameters_frozen", f"parameters (frozen base, {base})",
         states.parameter_bytes(sp.frozen_bytes, 1, spec.shards_params, n, param_dev),
         f"{how}{div if spec.shards_params else ''}; no gradients or optimizer states"),
        ("parameters_adapters", f"parameters (LoRA adapters, {p.low_dtype})",
         states.parameter_bytes(a, p.param_bytes, spec.shards_params, n, param_dev),
         f"{p.param_bytes}Ψ_lora{div if spec.shards_params else ''}, Ψ_lora = {a:,} ({src})"),
        ("gradients", f"gradients (LoRA adapters, {p.low_dtype})",
         states.gradient_bytes(a, p.grad_bytes, spec.shards_grads, spec.shards_optimizer, n, opt_dev),
         f"{p.grad_bytes}Ψ_lora{div if spec.shards_grads else ''} (ZeRO §5.2; adapters only)"),
        ("master_weights", "master weights (LoRA adapters, fp32)",
         states.master_bytes(a, p.master_bytes, spec.shards_optimizer, n, opt_dev),
         f"{p.master_bytes}Ψ_lora{div if spec.shards_optimizer else ''} (ZeRO §3.1; adapters only)"),
        ("optimizer_moments", f"optimizer moments (LoRA adapters, {opt.name})",
         states.moment_bytes(a, opt.moments, b_mom, spec.shards_optimizer, n, opt_dev),
         f"{opt.moments}x{b_mom}Ψ_lora{div if spec.shards_optimizer else ''} ({opt.source}; adapters only)"),
    )
    rows: list[Row] = []
    for key, label, (on_gpu, cpu, nvme), detail in placed:
        rows.append(Row(key, label, on_gpu, "gpu", "model_state",
                        ("offloaded: " if on_gpu == 0 and (cpu or nvme) else "") + detail))
        if cpu:
            rows.append(Row(key, label, cpu, "cpu", "model_state", "on cpu: " + detail))
        if nvme:
            rows.append(Row(key, label, nvme, "nvme", "model_state", "on nvme: " + detail))
    return rows


def fsdp_under_pipeline(plan: Plan) -> bool:
    """FSDP2 sharding inside pipeline stages, as torch.distributed.pipelining and torchtitan run it (the one
    framework that composes them; Megatron and DeepSpeed pipelines shard optimizer states only)."""
    return (plan.pp > 1 and plan.spec.framework == "fsdp" and plan.spec.shards_params and plan.offload_params == "none"
            and composition(plan.framework).fsdp_in_pipeline)


def fp8_gathered_bytes(plan: Plan, stage: int, psi: int) -> int:
    """Bytes FSDP gathers for stage ``stage``'s ``psi`` parameters under ``--float8-all-gather``: the converted weights
    (Ψ8, ``memcalc.model.float8.layer_weights`` per layer) as 1-byte fp8 data, the rest in the compute dtype:
    Ψ8 + b·(Ψ − Ψ8) (torchao fsdp_utils.py ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``)."""
    from memcalc.model.float8 import layer_weights

    assert plan.arch is not None
    b = plan.precision.param_bytes
    return psi * b - layer_count(plan, stage) * layer_weights(plan.arch, plan.tp) * (b - 1)


def pipeline_fsdp_rows(plan: Plan, groups: list[ParamGroup], stage: int = 0) -> list[Row]:
    """What a pipeline stage under FSDP2 keeps unsharded for the whole step. torchtitan does not reshard after
    forward when pipelining ("to avoid per-microbatch all-gathers", torchtitan/distributed/fsdp.py
    ``get_fsdp_reshard_after_forward_policy``: default = ``not pp_enabled``), and the pipeline stage turns gradient
    sync and resharding off for every micro-batch's backward (torch/distributed/pipelining/stage.py
    ``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``)
    until ``perform_reduce_grad`` after the last one. So the stage's parameters stay gathered in the compute dtype,
    and its unsharded gradients accumulate in FSDP's reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``:
    fp32 under torchtitan's default ``mixed_precision_reduce = "float32"`` when a master copy exists). Under
    ``--float8-all-gather`` the converted weights are gathered, and so kept, as their 1-byte fp8 data (torchao
    fsdp_utils.py ``fsdp_post_all_gather`` wraps the gathered fp8 bytes), the rest in the compute dtype."""
    if not fsdp_under_pipeline(plan):
        return []
    p = plan.precision
    psi = sum(g.psi for g in groups)
    acc = 4 if p.master_bytes else p.grad_bytes
    gathered, what, formula = psi * p.param_bytes, p.low_dtype, f"{p.param_bytes}Ψ_stage"
    if plan.float8_all_gather and plan.arch is not None:
        gathered = fp8_gathered_bytes(plan, stage, psi)
        what, formula = f"fp8 linears, the rest {p.low_dtype}", f"Ψ8 + {p.param_bytes}(Ψ_stage - Ψ8)"
    return [Row("pipeline_gathered_parameters", f"stage parameters, gathered ({what})", gathered,
                "gpu", "model_state", f"{formula}: not resharded after forward under pipelining "
                "(torchtitan fsdp.py; pipelining stage.py)"),
            Row("pipeline_unsharded_gradients", f"stage gradients, unsharded until the last micro-batch "
                f"({'fp32' if acc == 4 else p.low_dtype})", psi * acc, "gpu", "model_state",
                f"{acc}Ψ_stage: reduce-scatter after the last micro-batch (pipelining stage.py perform_reduce_grad)")]


@lru_cache(maxsize=256)
def _state_labels(p: Precision, opt: Optimizer, spec: StrategySpec, n: int,
                  gb: int | None = None) -> tuple[tuple[str, str, str], ...]:  # fmt: skip
    """(label, detail, detail when offloaded) of each model-state row: the same for every plan that shares them.
    ``gb``: the gradients' bytes where the framework's differ from the precision's (``Plan.grad_bytes``)."""
    b_mom = opt.moment_bytes_for(p)
    div = f"/{n}" if n > 1 else ""
    main = gb is not None and gb != p.grad_bytes
    grads = (("gradients (fp32 main_grad)", (f"{gb}Ψ{div if spec.shards_grads else ''} (Megatron-LM: bf16 gradients "
                                             "accumulated and reduced in fp32, arguments.py "
                                             "accumulate_allreduce_grads_in_fp32)")) if main
             else (f"gradients ({p.low_dtype})", f"{p.grad_bytes}Ψ{div if spec.shards_grads else ''} (ZeRO §5.2)"))
    meta = (
        (f"parameters ({p.low_dtype})", f"{p.param_bytes}Ψ{div if spec.shards_params else ''} (ZeRO §5.3)"),
        grads,
        ("master weights (fp32)", f"{p.master_bytes}Ψ{div if spec.shards_optimizer else ''} (ZeRO §3.1, §5.1)"),
        (f"optimizer moments ({opt.name})",
         f"{opt.moments}x{b_mom}Ψ{div if spec.shards_optimizer else ''} ({opt.source})"),
    )
    return tuple((label, detail, "offloaded: " + detail) for label, detail in meta)


def setting(plan: Plan) -> act.Setting | None:
    """What the activation formulas need of the workload (None: no workload, no activations)."""
    w = plan.work
    if w is None:
        return None
    from memcalc.memory.accountings import activations as act

    return act.Setting(s=w.seq_len // plan.cp, b=w.micro_batch, dtype_bytes=plan.precision.activation_bytes,
                       dropout=w.dropout > 0, device=w.device, attention=w.attention,
                       paper=plan.accounting == "paper")


def stage_layers(plan: Plan, stage: int) -> range:
    """The decoder layers pipeline stage ``stage`` holds (even split)."""
    assert plan.arch is not None
    per = plan.arch.layers // plan.pp
    return range(stage * per, (stage + 1) * per)


def stage_chunks(plan: Plan, stage: int) -> tuple[range, ...]:
    """The decoder layers pipeline rank ``stage`` runs, one range per model chunk: the plan's explicit split
    (``memcalc.layout.compose.rank_layers``), else the even split as one range."""
    if plan.stage_layers is None:
        return (stage_layers(plan, stage),)
    from memcalc.layout.compose import rank_layers

    return rank_layers(plan.stage_layers, plan.pp, stage)


def layer_count(plan: Plan, stage: int) -> int:
    """Decoder layers on pipeline rank ``stage``."""
    return sum(len(r) for r in stage_chunks(plan, stage))


def activation_rows(plan: Plan, stage: int, st: act.Setting) -> tuple[list[Row], float]:
    """Activation rows of one pipeline stage's GPU, and the micro-batches it holds in flight."""
    from memcalc.memory.accountings import activations as act

    arch, w = plan.arch, plan.work
    assert arch is not None and w is not None
    tp, sp = plan.tp, plan.sequence_parallel
    per = layer_count(plan, stage)
    n_moe = moe_layers(plan, stage)
    # torchtitan and accelerate run tensor parallelism as DTensor: the gathered inputs are saved whole
    dtensor = composition(plan.framework).dtensor_tp
    flight = act.pipeline_in_flight(stage, plan.pp, plan.grad_accum, plan.virtual_stages)
    if w.recompute.startswith("every:"):  # torchtitan's layer AC: the layers whose index is a multiple of K, fully
        k = int(w.recompute[6:])
        one = sum(_layer_bytes(arch, st, tp, sp, "full" if i % k == 0 else "none", arch.is_moe_layer(i), dtensor)
                  for r in stage_chunks(plan, stage) for i in r)
        layers_bytes = round(one * flight)
    else:
        dense = _layer_bytes(arch, st, tp, sp, w.recompute, False, dtensor)
        moe = _layer_bytes(arch, st, tp, sp, w.recompute, True, dtensor) if n_moe else 0
        layers_bytes = round(((per - n_moe) * dense + n_moe * moe) * flight)
    src = "Korthikanti et al. 2022 Table 2, tensor by tensor" + (
        "; DTensor TP saves the gathered q/k/v and MLP inputs whole" if dtensor and sp and tp > 1 else "")
    rows = [Row("activations_layers", f"activations: {per} layers x {flight:g} micro-batch(es)", layers_bytes, "gpu",
                "activation", f"{w.recompute} recompute, {st.kernel} attention ({src}; in flight: Eq. 5)")]
    if stage == 0:
        emb = sum(act.split_bytes(x, tp, sp) for x in act.embedding_saved(arch, st))
        rows.append(Row("activations_embedding", "activations: embedding", round(emb * flight), "gpu", "activation",
                        "token ids, embedding dropout mask (§4.3)"))
    if stage == plan.pp - 1:
        out = act.output_saved(arch, st)
        logits = sum(act.split_bytes(x, tp, sp) for x in out if "logits" in x.name)
        head = sum(act.split_bytes(x, tp, sp) for x in out if "logits" not in x.name)
        rows.append(Row("activations_output", "activations: final norm, head input", head, "gpu", "activation",
                        "final norm and output head input"))
        rows.append(Row("activations_logits", "activations: logits + fp32 loss copy", logits, "gpu", "activation",
                        f"s·b·v x {st.dtype_bytes} + 4·s·b·v (v = {arch.padded_vocab}{', /tp' if tp > 1 else ''})"))
    if plan.lora is not None:
        # peft's LoRA Linear: lora_B(lora_A(x)) saves x (the tensor the frozen matmul would have saved for its
        # weight gradient: same storage, already counted above) and A's output, r wide, for B's weight gradient.
        from memcalc.model.lora import targeted

        r_wide = len(targeted(arch, plan.lora)) * st.s * st.b * plan.lora.rank * st.dtype_bytes
        rows.append(Row("activations_lora", f"activations: LoRA x·A ({per} layers)", round(per * r_wide * flight),
                        "gpu", "activation", f"s·b·r x {st.dtype_bytes} per target per layer (A's output, saved for "
                        "B's gradient); the layers' rows keep the frozen projections' inputs (an upper bound where "
                        "a projection has no adapter)"))
    rot = sum(x.bytes for x in act.rotary_saved(arch, st))
    if rot:
        rows.append(Row("activations_rotary", "activations: rotary tables", rot, "gpu", "activation",
                        "cos, sin shared by every layer"))
    return rows, flight



def uncounted(plan: Plan, stage: int) -> list[tuple[str, int]]:
    """Buffers a real step holds beyond the paper's rows, where the plan gives their size: (what, bytes) each.

    - Sharded parameters (ZeRO-3, FSDP FULL_SHARD and HYBRID_SHARD, offloaded or not): the gathered copy of the unit
      being computed and of the next one, prefetched (FSDP2's implicit forward and backward prefetch, FSDP1's
      BACKWARD_PRE, ZeRO-3's prefetch bucket), in the dtype the forward reads (``param_bytes``; under LoRA the
      frozen base as stored, NF4-packed under QLoRA, with the adapters); a unit is the largest decoder layer this
      rank holds (its TP/EP share). A lower bound: a root unit holding the embedding and the head is larger, and
      ZeRO-3 may keep up to ``stage3_max_live_parameters`` gathered. Without a unit per decoder layer
      (``--fsdp-auto-wrap none``) the whole model instead, gathered all step, and its gradients unsharded until the
      root's post-backward (``grad_bytes``; a lower bound again: the reduce-scatter input or FSDP1's flat gradient
      is a third copy).
    - torch DDP with more than one rank: its gradient buckets, a second copy of the gradients made at construction
      and alive for the run (``gradient_as_bucket_view=False``, the default: torch/nn/parallel/distributed.py); under
      LoRA only the adapters have gradients.
    """
    arch, p, out = plan.arch, plan.precision, []
    if plan.spec.shards_params and arch is not None:
        from memcalc.model.params import Shard, model_params

        mp = model_params(arch, Shard(plan.tp, plan.ep))
        layer = max(x.total for x in mp.layers)
        unit, trainable = layer * p.param_bytes, layer
        if plan.lora is not None:  # the frozen base (NF4-packed under QLoRA) and the adapters gathered with it
            from memcalc.model import lora as lr

            sp = lr.split(layer, 1, lr.layer_lora(arch, plan.lora), plan.lora.quantize, p.param_bytes)
            unit, trainable = sp.frozen_bytes + sp.adapters * p.param_bytes, sp.adapters
        if plan.fsdp_auto_wrap == "none":  # NO_WRAP: the layers are the root's, gathered all step
            rest = mp.total - sum(x.total for x in mp.layers)
            whole = ("the whole model gathered from the forward's start to the backward's end (no unit per "
                     "decoder layer)")
            out.append((whole, len(mp.layers) * unit + rest * p.param_bytes))
            out.append(("its gradients unsharded until the root's post-backward", (
                len(mp.layers) * trainable + (rest if plan.lora is None else 0)) * p.grad_bytes))
        else:
            out.append(("gathered units: the layer computed and the next, prefetched", 2 * unit))
    if plan.spec.name == "ddp" and plan.dp > 1 and not plan.bucket_view:
        trainable = param_groups(plan, stage)[0]
        if plan.lora is not None and arch is not None:
            from memcalc.model import lora as lr

            trainable = lr.layer_lora(arch, plan.lora).adapters * layer_count(plan, stage)
        out.append(("DDP gradient buckets", trainable * p.grad_bytes))
    return out


class PaperFit(NamedTuple):
    """The paper accounting's verdict: the allocator's band (``memcalc.memory.allocator.allocator.fit``) widened by what the
    paper's rows leave out (``uncounted``)."""

    verdict: str
    margin: int
    """usable − total."""
    band: int
    """The margin under which the step is at risk: the allocator's band plus the uncounted buffers."""
    uncounted: tuple[tuple[str, int], ...]


def fit(plan: Plan, total: int, stage: int) -> PaperFit:
    """fits, at-risk or oom for a paper total (its rows include the CUDA context and --reserve-gib). oom: the margin
    is under the least reserved overhead ever measured, as the realistic verdict; at-risk: it is under the allocator's
    variability for a step of this size plus the buffers the paper's rows leave out (``uncounted``), which a real
    step holds on top of them; fits: otherwise."""
    from memcalc.memory.allocator.allocator import fit as allocator_fit

    left = tuple(uncounted(plan, stage))
    over = plan.cuda_context + plan.reserve
    f = allocator_fit(max(0, total - over), plan.usable_bytes - plan.reserve, context=plan.cuda_context)
    band = f.reserved_high - f.peak_allocated + sum(n for _, n in left)
    verdict = "oom" if f.verdict == "oom" else "at-risk" if f.margin < band else "fits"
    return PaperFit(verdict, f.margin, band, left)
