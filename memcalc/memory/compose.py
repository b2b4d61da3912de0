"""The one place that composes: inputs -> formulas -> an ``Estimate``."""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.memory import activations as act
from memcalc.comm import traffic as comms
from memcalc.memory import states as memory
from memcalc.memory import deepspeed_estimator as dse
from memcalc.memory import frameworks as fw
from memcalc.comm.collectives import sent_bytes_per_rank
from memcalc.inputs import EstimateInput
from memcalc.model.params import Shard, active_params, largest_layer, largest_module, model_params, stage_params
from memcalc.report.results import (
    ActivationDetail,
    Collective,
    Communication,
    Estimate,
    Fit,
    Memory,
    MemoryRow,
    ModelInfo,
    ParameterBreakdown,
    PerGPU,
    PerNode,
    StageMemory,
    StrategyInfo,
    TensorBytes,
    Training,
)
from memcalc.units import ceil_div, format_count

_LOCATIONS = ("gpu", "cpu", "nvme")
_STATE_KEYS = ("parameters", "gradients", "master_weights", "optimizer_moments")


@dataclass(frozen=True)
class ParamGroup:
    """Parameters one rank holds that are sharded over the same group (dense over dp; routed experts over dp/ep)."""

    psi: int
    n: int


def _param_groups(inp: EstimateInput, stage: int) -> tuple[int, list[ParamGroup]]:
    """(parameters on this rank, their sharding groups) for pipeline stage ``stage``."""
    par, n = inp.parallelism, inp.shard_group_size
    arch = inp.model.architecture
    if arch is None:
        # A bare count: the weights split evenly over tp x pp, Ψ/(t·p) (Megatron-LM, arXiv 2104.04473 §2).
        psi = ceil_div(inp.model.parameters or 0, par.tp * par.pp)
        return psi, [ParamGroup(psi, n)]
    held = stage_params(arch, stage, par.pp, Shard(par.tp, par.ep))
    routed = sum(x.routed for x in held.layers)
    groups = [ParamGroup(held.total - routed, n)]
    if routed:
        # Megatron-LM's expert-data-parallel group: routed experts are replicated over dp/ep ranks only.
        groups.append(ParamGroup(routed, max(1, n // par.ep) if n % par.ep == 0 else n))
    return held.total, groups


def _model_state_rows(inp: EstimateInput, groups: list[ParamGroup]) -> list[MemoryRow]:
    """Every model-state tensor of one rank, one row per tensor per location it occupies."""
    p, opt, spec = inp.precision, inp.optimizer, inp.strategy.spec
    opt_dev, param_dev = inp.strategy.optimizer_device, inp.strategy.offload_params
    b_mom = opt.moment_bytes_for(p)
    totals = {(k, loc): 0 for k in _STATE_KEYS for loc in _LOCATIONS}
    for g in groups:
        placed = {
            "parameters": memory.parameter_bytes(g.psi, p.param_bytes, spec.shards_params, g.n, param_dev),
            "gradients": memory.gradient_bytes(g.psi, p.grad_bytes, spec.shards_grads, spec.shards_optimizer, g.n, opt_dev),
            "master_weights": memory.master_bytes(g.psi, p.master_bytes, spec.shards_optimizer, g.n, opt_dev),
            "optimizer_moments": memory.moment_bytes(g.psi, opt.moments, b_mom, spec.shards_optimizer, g.n, opt_dev),
        }
        for key, sb in placed.items():
            for loc in _LOCATIONS:
                totals[(key, loc)] += getattr(sb, loc)
    n = inp.shard_group_size
    div = f"/{n}" if n > 1 else ""
    shard = lambda sharded: div if sharded else ""  # noqa: E731
    meta = {
        "parameters": (f"parameters ({p.low_dtype})", f"{p.param_bytes}Ψ{shard(spec.shards_params)} (ZeRO §5.3)"),
        "gradients": (f"gradients ({p.low_dtype})", f"{p.grad_bytes}Ψ{shard(spec.shards_grads)} (ZeRO §5.2)"),
        "master_weights": ("master weights (fp32)", f"{p.master_bytes}Ψ{shard(spec.shards_optimizer)} (ZeRO §3.1, §5.1)"),
        "optimizer_moments": (f"optimizer moments ({opt.name})",
                              f"{opt.moments}x{b_mom}Ψ{shard(spec.shards_optimizer)} ({opt.source})"),
    }  # fmt: skip
    rows: list[MemoryRow] = []
    for key in _STATE_KEYS:
        label, detail = meta[key]
        on_gpu, off = totals[(key, "gpu")], totals[(key, "cpu")] + totals[(key, "nvme")]
        for loc in _LOCATIONS:
            n_bytes = totals[(key, loc)]
            if loc == "gpu" or n_bytes:
                where = "offloaded: " if loc == "gpu" and on_gpu == 0 and off else ("" if loc == "gpu" else f"on {loc}: ")
                rows.append(MemoryRow(key=key, label=label, bytes=n_bytes, location=loc, category="model_state",
                                      detail=where + detail))  # fmt: skip
    return rows


def _setting(inp: EstimateInput) -> act.Setting | None:
    wl = inp.workload
    if wl is None:
        return None
    return act.Setting(s=wl.seq_len // inp.parallelism.cp, b=wl.micro_batch, dtype_bytes=inp.precision.param_bytes,
                       dropout=inp.dropout > 0, device=wl.device, attention=wl.attention,
                       paper=inp.accounting == "paper")  # fmt: skip


def _activation_rows(inp: EstimateInput, stage: int, st: act.Setting) -> tuple[list[MemoryRow], float]:
    """Activation rows of one pipeline stage's GPU, and the micro-batches it holds in flight."""
    arch, par, wl = inp.model.architecture, inp.parallelism, inp.workload
    assert arch is not None and wl is not None
    tp, sp = par.tp, par.sequence_parallel
    per = arch.layers // par.pp
    indices = range(stage * per, (stage + 1) * per)
    n_moe = sum(arch.is_moe_layer(i) for i in indices)
    dense = act.layer_activations(arch, st, tp, sp, wl.recompute).total
    moe = act.layer_activations(arch, st, tp, sp, wl.recompute, moe=True).total if n_moe else 0
    flight = act.pipeline_in_flight(stage, par.pp, inp.grad_accum, par.virtual_stages)
    layers_bytes = round(((per - n_moe) * dense + n_moe * moe) * flight)
    src = "Korthikanti et al. 2022 Table 2, tensor by tensor"
    rows = [MemoryRow(key="activations_layers", label=f"activations: {per} layers x {flight:g} micro-batch(es)",
                      bytes=layers_bytes, location="gpu", category="activation",
                      detail=f"{wl.recompute} recompute, {st.kernel} attention ({src}; in flight: Eq. 5)")]  # fmt: skip
    first, last = stage == 0, stage == par.pp - 1
    if first:
        emb = sum(act.split_bytes(x, tp, sp) for x in act.embedding_saved(arch, st))
        rows.append(MemoryRow(key="activations_embedding", label="activations: embedding", bytes=round(emb * flight),
                              location="gpu", category="activation", detail="token ids, embedding dropout mask (§4.3)"))  # fmt: skip
    if last:
        out = act.output_saved(arch, st)
        logits = sum(act.split_bytes(x, tp, sp) for x in out if "logits" in x.name)
        head = sum(act.split_bytes(x, tp, sp) for x in out if "logits" not in x.name)
        rows.append(MemoryRow(key="activations_output", label="activations: final norm, head input", bytes=head,
                              location="gpu", category="activation", detail="final norm and output head input"))  # fmt: skip
        rows.append(MemoryRow(key="activations_logits", label="activations: logits + fp32 loss copy", bytes=logits,
                              location="gpu", category="activation",
                              detail=f"s·b·v x {st.dtype_bytes} + 4·s·b·v (v = {arch.padded_vocab}{', /tp' if tp > 1 else ''})"))  # fmt: skip
    rot = sum(x.bytes for x in act.rotary_saved(arch, st))
    if rot:
        rows.append(MemoryRow(key="activations_rotary", label="activations: rotary tables", bytes=rot, location="gpu",
                              category="activation", detail="cos, sin shared by every layer"))  # fmt: skip
    return rows, flight


def _deepspeed_estimator(inp: EstimateInput) -> tuple[list[MemoryRow], int]:
    """GPU rows and host RAM per node as DeepSpeed's estimator gives them (its terms, its int() truncation)."""
    psi = inp.model.parameters or 0
    arch = inp.model.architecture
    if arch is not None:
        psi = model_params(arch).total
    c, opt = inp.cluster, inp.strategy
    nodes, per_node = c.nodes, c.ranks_per_node
    if opt.spec.name == "zero-3":
        largest = inp.estimator.largest_layer_params or (largest_module(arch)[1] if arch is not None else 0)
        e = dse.zero3(psi, largest, per_node, nodes, opt.offload_optimizer != "none", opt.offload_params != "none",
                      inp.estimator.zero_init, inp.estimator.buffer_factor)  # fmt: skip
        src = "deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs"
    else:
        e = dse.zero2(psi, per_node, nodes, opt.offload_optimizer != "none", inp.estimator.buffer_factor)
        src = "deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs"
    rows = [MemoryRow(key=k, label=label, bytes=b, location="gpu", category="model_state", detail=f"{formula} ({src})")
            for k, label, formula, b in e.terms]  # fmt: skip
    return rows, e.cpu


def _implementation(inp: EstimateInput) -> tuple[list[MemoryRow], list[fw.Issued]]:
    """Model-state rows and collectives of DDP / FSDP1 / FSDP2 as the framework allocates and issues them."""
    arch, p, opt, spec = inp.model.architecture, inp.precision, inp.optimizer, inp.strategy.spec
    assert arch is not None
    # Mixed precision: DDP runs under autocast and FSDP shards fp32 parameters (the master copy); collectives
    # and gathered parameters are in the low dtype under FSDP MixedPrecision. Pure bf16 stores everything in bf16.
    store = p.param_bytes if p.master_bytes == 0 else p.master_bytes
    comm = p.param_bytes
    mom = opt.moment_bytes_for(p) if opt.moment_bytes is not None else store
    if spec.framework == "deepspeed":
        stage = int(spec.name.split("-")[1])
        held, issued = fw.deepspeed(arch, stage, inp.dp, p.param_bytes, opt.moments, opt.step_counter,
                                    inp.framework.zero3(), first_step=inp.framework.zero3_step == "first")  # fmt: skip
        store = p.param_bytes
        what = f"DeepSpeed ZeRO-{stage} ({'flat buffer padded to 2 x dp' if stage in (1, 2) else 'per-parameter partitions' if stage == 3 else 'replicated'})"
    elif spec.framework == "ddp":
        held, issued = fw.ddp(arch, inp.dp, store, opt.moments, mom, opt.step_counter, inp.framework.bucket_view)
        what = "DDP (replicated, autocast keeps fp32 parameters)" if p.master_bytes else "DDP"
    else:
        v = inp.framework.fsdp_version
        held, issued = fw.fsdp(arch, v, inp.dp, inp.shard_group_size, inp.replicas,
                               reshard_after_forward=spec.shards_params, shards=spec.shards_grads, store_bytes=store,
                               comm_bytes=comm, moments=opt.moments, moment_bytes=mom, step_counter=opt.step_counter,
                               min_num_params=inp.framework.min_num_params)  # fmt: skip
        what = f"FSDP{v} {'FlatParameter per unit, padded to' if v == 1 else 'dim-0 shards padded to'} x{inp.shard_group_size}"
    src = "torch 2.13, DeepSpeed 0.19; measured in tests/validation"
    master_label = "" if held.master else ", the master copy"
    rows = [
        MemoryRow(key="parameters", label=f"parameters ({'fp32' if store == 4 else p.low_dtype}{master_label})",
                  bytes=held.parameters, location="gpu", category="model_state", detail=f"{what} ({src})"),
        MemoryRow(key="master_weights", label="master weights (fp32)", bytes=held.master, location="gpu",
                  category="model_state", detail="DeepSpeed's fp32 partition the optimizer updates"),
        MemoryRow(key="gradients", label=f"gradients ({'fp32' if store == 4 else p.low_dtype})", bytes=held.gradients,
                  location="gpu", category="model_state", detail=f"kept like the parameters ({src})"),
        MemoryRow(key="optimizer_moments", label=f"optimizer moments ({opt.name})", bytes=held.optimizer_moments,
                  location="gpu", category="model_state", detail=f"{opt.moments} per parameter element"),
        MemoryRow(key="optimizer_steps", label="optimizer step counters", bytes=held.optimizer_steps, location="gpu",
                  category="model_state", detail="4-byte step tensor per parameter tensor (torch.optim)"),
    ]  # fmt: skip
    if held.backward_gradients:
        rows.append(MemoryRow(key="gradients_backward", label=f"gradients during backward ({p.low_dtype})",
                              bytes=held.backward_gradients, location="gpu", category="model_state",
                              detail="ZeRO-0/1: every gradient until the boundary; ZeRO-2: the averaged partition "
                                     "(DeepSpeed's code; freed by the end of the step, so not in the after-step proof)"))  # fmt: skip
    if held.step_gradients:
        rows.append(MemoryRow(key="gradients_step", label="fp32 gradients (during the step)", bytes=held.step_gradients,
                              location="gpu", category="model_state",
                              detail="the reduced gradients upcast for the optimizer; freed after the step"))  # fmt: skip
    if held.buckets:
        rows.append(MemoryRow(key="gradient_buckets", label="DDP gradient buckets", bytes=held.buckets, location="gpu",
                              category="model_state", detail="a copy of the gradients (gradient_as_bucket_view=False)"))  # fmt: skip
    if held.live:
        z = inp.framework.zero3()
        rows.append(MemoryRow(key="gathered_parameters", label=f"gathered parameters ({p.low_dtype})", bytes=held.live,
                              location="gpu", category="model_state",
                              detail=f"at peak: the most elements DeepSpeed's coordinator holds gathered in the "
                                     f"{'first' if inp.framework.zero3_step == 'first' else 'steady-state'} step "
                                     f"(max_live_parameters {z.max_live_parameters:,} bounds prefetching, not fetching; "
                                     "memcalc.memory.zero3)"))  # fmt: skip
    if spec.framework == "fsdp":
        us = fw.units(arch, inp.framework.min_num_params)
        if spec.shards_params:
            # The root stays gathered from forward to backward; one layer is gathered while the next is prefetched.
            gathered = (us[0].numel + 2 * max((u.numel for u in us[1:]), default=0)) * comm
            how = "root unit (not resharded after forward) + the largest layer twice (current + prefetched)"
        else:
            gathered = sum(u.numel for u in us) * comm if spec.shards_grads else 0
            how = "every unit, kept from forward to backward"
        if gathered:
            rows.append(MemoryRow(key="gathered_parameters", label=f"gathered parameters ({p.low_dtype})", bytes=gathered,
                                  location="gpu", category="model_state", detail=f"at peak: {how}"))  # fmt: skip
    return rows, issued


def _overhead_rows(inp: EstimateInput) -> list[MemoryRow]:
    o = inp.overheads
    return [
        MemoryRow(key="cuda_context", label="CUDA context", bytes=o.cuda_context_bytes, location="gpu",
                  category="overhead", detail="CUDA context and loaded kernels (--cuda-context-gib)"),
        MemoryRow(key="allocator_reserve", label="allocator reserve", bytes=o.allocator_reserve_bytes,
                  location="gpu", category="overhead", detail="fragmentation headroom (--reserve-gib)"),
    ]  # fmt: skip


def _issued(x: fw.Issued, inp: EstimateInput) -> Collective:
    """A framework's collective as a row of the communication table (per micro-batch ones x grad_accum)."""
    spec = inp.strategy.spec
    per_micro = x.phase == "forward" or x.op != "all-reduce" or spec.reduce_each_micro_batch or x.group == "replica group"
    k = inp.grad_accum if per_micro else 1
    span = x.group_size if x.group != "replica group" else inp.dp
    crosses = span > inp.cluster.gpus_per_node
    per_call = x.payload_bytes // x.calls
    dtype = {2: inp.precision.low_dtype, 4: "fp32"}[x.dtype_bytes]
    return Collective(op=x.op, phase=x.phase, tensor=x.tensor, group=x.group, group_size=x.group_size,  # type: ignore[arg-type]
                      crosses_nodes=crosses, link="network" if crosses else inp.gpu.intra_node_link, dtype=dtype,
                      calls_per_step=x.calls * k, payload_bytes_per_call=per_call, payload_bytes=x.payload_bytes * k,
                      sent_bytes_per_gpu=sent_bytes_per_rank(x.op, per_call, x.group_size) * x.calls * k)  # fmt: skip


def _sum(rows: list[MemoryRow], key: str, location: str = "gpu") -> int:
    return sum(r.bytes for r in rows if r.key == key and r.location == location)


def _notes(inp: EstimateInput) -> list[str]:
    spec, notes = inp.strategy.spec, []
    if inp.accounting == "deepspeed-estimator":
        return [
            "accounting: deepspeed-estimator: exactly DeepSpeed's estimate_zero2/3_model_states_mem_needs (model "
            "states only, no CUDA context, host RAM with its 1.5 buffer factor); DeepSpeed prints these in GiB "
            "labelled 'GB'",
            "communication is the paper's (DeepSpeed's estimator has none)",
        ]
    if inp.accounting == "implementation":
        arch = inp.model.architecture
        assert arch is not None
        name = {"ddp": "DDP", "deepspeed": f"DeepSpeed {spec.label}"}.get(spec.framework,
                                                                         f"FSDP{inp.framework.fsdp_version} {spec.name}")  # fmt: skip
        notes.append(
            f"accounting: implementation: what {name} allocates and issues (padding, step counters, buckets), "
            "proven against real runs on CPU in tests/validation"
        )
        if spec.framework == "fsdp" and spec.shards_params:
            root = fw.units(arch, inp.framework.min_num_params)[0].numel * inp.precision.param_bytes
            notes.append(f"the root unit is not resharded after forward: backward all-gathers {root:,} bytes less than "
                         "forward (3Ψ becomes 3Ψ minus the root unit)" if root else
                         "the root unit is not resharded after forward, but the wrapping leaves it no parameters: "
                         "backward all-gathers as much as forward")  # fmt: skip
        if spec.framework == "fsdp":
            mnp = inp.framework.min_num_params
            k = 0 if mnp is None else sum(1 for u in fw.units(arch, mnp) if u.shapes)
            notes.append("wrapping: one unit per decoder layer plus the root (embeddings, final norm, head)" if mnp is None
                         else f"wrapping: size_based_auto_wrap_policy(min_num_params={mnp:,}): {k} unit{'s' * (k != 1)} "
                              "holding parameters (the root counted if it keeps any)")  # fmt: skip
        if spec.name == "zero-3":
            from memcalc.memory.zero3 import persistent, replay

            z = inp.framework.zero3()
            lp = inp.precision.param_bytes
            whole = persistent(arch, z)
            settings = (f"max_reuse_distance {z.max_reuse_distance:,}, max_live_parameters {z.max_live_parameters:,}, "
                        f"prefetch_bucket_size {z.prefetch_bucket_size:,}")  # fmt: skip
            if inp.framework.zero3_step == "steady":
                first = replay(arch, inp.dp, z, first_step=True)
                notes.append(
                    f"ZeRO-3 traffic is a steady-state step's, replayed through DeepSpeed's parameter coordinator "
                    f"({settings}). The first step records the module trace and gathers every parameter on each use "
                    f"instead: {first.forward * lp:,} bytes in forward and {first.backward * lp:,} in backward "
                    "(--zero3-step first shows it)"
                )
            else:
                steady = replay(arch, inp.dp, z)
                notes.append(
                    "ZeRO-3 traffic is the first step's: DeepSpeed records its module trace and gathers every parameter "
                    f"on each use. Every later step ({settings}) gathers {steady.forward * lp:,} bytes in forward and "
                    f"{steady.backward * lp:,} in backward"
                )
            if fw.layout(arch) is None:
                notes.append(
                    f"ZeRO-3 replay: the module call order is memcalc's generic layout (family {arch.family or 'unset'}"
                    f"{', MoE' if arch.moe else ''}); it follows Hugging Face's model classes for "
                    f"{', '.join(fw.LAYOUTS)} (dense). Parameter-less modules a model calls (dropout, activation) each "
                    "give the prefetcher one more round, so gathers can differ"
                )
            if arch.moe:
                notes.append("ZeRO-3 replay: every expert is assumed to run in every step; experts that receive no "
                             "tokens break DeepSpeed's trace (mark MoE blocks with deepspeed.utils.set_z3_leaf_modules)")  # fmt: skip
            notes.append(
                f"ZeRO-3 persistence_threshold {z.param_persistence_threshold:,}: {len(whole)} parameter tensors "
                f"({sum(whole.values()):,} elements) stay whole on every rank, are all-gathered after each optimizer "
                "step and, after the first step, never in forward or backward"
                if whole else f"ZeRO-3 persistence_threshold {z.param_persistence_threshold:,}: every parameter is partitioned"
            )
        if spec.framework == "deepspeed":
            notes.append("DeepSpeed: small scalar collectives (gradient norm, overflow flags) are left out")
        if inp.workload is None:
            notes.append("activations are not counted: give --seq-len")
        return notes
    what = "model states" + (" and activations (Korthikanti et al. 2022)" if inp.workload else "")
    notes.append(f"accounting: paper ({what}); communication buckets and framework buffers are not included yet")
    if inp.workload is None:
        notes.append("activations are not counted: give the model's shape (--model ...) and --seq-len")
    if spec.shards_params:
        notes.append(
            "parameter sharding gathers one wrapped unit (a layer) at a time; its unsharded copy is transient and "
            "not counted"
        )
    if inp.strategy.offload_params != "none" and spec.shards_params:
        notes.append("offloaded parameters are fetched to the GPU layer by layer; that working copy is not counted")
    if inp.optimizer.note:
        notes.append(inp.optimizer.note)
    if inp.model.architecture is None and inp.parallelism.model_parallel > 1:
        notes.append("a bare parameter count is split evenly over tp x pp; give the shape for exact per-rank counts")
    if inp.parallelism.sequence_parallel and inp.parallelism.tp == 1:
        notes.append("sequence parallelism has no effect without tensor parallelism (tp = 1)")
    if inp.cluster.gpus < inp.cluster.gpus_per_node:
        notes.append(f"{inp.cluster.gpus} GPUs use part of one {inp.cluster.gpus_per_node}-GPU node")
    return notes


def _model_info(inp: EstimateInput) -> ModelInfo:
    arch = inp.model.architecture
    if arch is None:
        psi = inp.model.parameters or 0
        return ModelInfo(parameters=psi, name=inp.model.name or format_count(psi))
    p = model_params(arch)
    name, size = largest_module(arch)
    first = p.layers[0]
    return ModelInfo(
        parameters=p.total,
        name=inp.model.name or arch.name or format_count(p.total),
        breakdown=ParameterBreakdown(
            embeddings=p.embeddings, positions=p.positions, attention=sum(x.attention for x in p.layers),
            mlp=sum(x.mlp for x in p.layers), router=sum(x.router for x in p.layers),
            norms=sum(x.norms for x in p.layers) + p.embedding_norm + p.final_norm, head=p.head,
            per_layer=first.total, largest_layer=largest_layer(arch), largest_module=name,
            largest_module_parameters=size, active_per_token=active_params(arch),
        ),  # fmt: skip
    )


def _training(inp: EstimateInput, auto: bool) -> Training:
    par, wl = inp.parallelism, inp.workload
    global_batch = wl.micro_batch * inp.grad_accum * inp.dp if wl else None
    return Training(
        dp=inp.dp, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, sequence_parallel=par.sequence_parallel,
        virtual_stages=par.virtual_stages, seq_len=wl.seq_len if wl else None, micro_batch=wl.micro_batch if wl else None,
        micro_batch_auto=auto, micro_batches=inp.grad_accum, global_batch=global_batch,
        tokens_per_step=global_batch * wl.seq_len if (wl and global_batch) else None,
    )  # fmt: skip


def estimate_from_input(inp: EstimateInput, micro_batch_auto: bool = False) -> Estimate:
    """Per-GPU memory and per-step communication for one fully specified input."""
    spec, cluster, p, par = inp.strategy.spec, inp.cluster, inp.precision, inp.parallelism
    arch, st = inp.model.architecture, _setting(inp)
    overheads = _overhead_rows(inp)

    stages: list[StageMemory] = []
    stage_rows: list[tuple[list[MemoryRow], list[MemoryRow], int]] = []
    issued: list[fw.Issued] | None = None
    for k in range(par.pp):
        psi_k, groups = _param_groups(inp, k)
        if inp.accounting == "implementation":
            states, issued = _implementation(inp)
        else:
            states = _model_state_rows(inp, groups)
        acts, flight = _activation_rows(inp, k, st) if st is not None else ([], 0.0)
        gpu = [r for r in states if r.location == "gpu"] + acts + overheads
        ms = sum(r.bytes for r in states if r.location == "gpu")
        a = sum(r.bytes for r in acts)
        stages.append(StageMemory(stage=k, parameters=psi_k, layers=arch.layers // par.pp if arch else 0,
                                  micro_batches_in_flight=flight, model_states=ms, activations=a,
                                  total=sum(r.bytes for r in gpu)))  # fmt: skip
        stage_rows.append((gpu, [r for r in states if r.location != "gpu"], psi_k))
    top = max(range(par.pp), key=lambda k: (stages[k].total, -k))
    gpu_rows, host_rows, psi_top = stage_rows[top]
    ds_cpu = None
    if inp.accounting == "deepspeed-estimator":
        gpu_rows, ds_cpu = _deepspeed_estimator(inp)
        host_rows = []  # the estimator gives one host figure per node, below
        stages = [stages[0].model_copy(update={"model_states": sum(r.bytes for r in gpu_rows), "activations": 0,
                                               "total": sum(r.bytes for r in gpu_rows)})]  # fmt: skip

    master = _sum(gpu_rows, "master_weights")
    moments = _sum(gpu_rows, "optimizer_moments") + _sum(gpu_rows, "optimizer_steps")
    per_gpu = PerGPU(
        parameters=_sum(gpu_rows, "parameters"),
        gradients=sum(_sum(gpu_rows, k) for k in ("gradients", "gradient_buckets", "gradients_backward", "gradients_step")),
        optimizer_states=master + moments,
        master_weights=master,
        optimizer_moments=moments,
        activations=sum(r.bytes for r in gpu_rows if r.category == "activation"),
        cuda_context=_sum(gpu_rows, "cuda_context"),
        allocator_reserve=_sum(gpu_rows, "allocator_reserve"),
        total=stages[top].total,
        rows=gpu_rows,
    )
    ranks = cluster.ranks_per_node
    # Host RAM and NVMe are per node: the sum over the node's ranks (DeepSpeed's estimator does the same).
    node_rows = [r.model_copy(update={"bytes": r.bytes * ranks}) for r in host_rows]
    if ds_cpu is not None:
        node_rows = [MemoryRow(key="host", label="host RAM (DeepSpeed's estimate)", bytes=ds_cpu, location="cpu",
                               category="model_state", detail="per node, with the buffer factor")]  # fmt: skip
    per_node = PerNode(
        ranks=ranks,
        cpu=sum(r.bytes for r in node_rows if r.location == "cpu"),
        nvme=sum(r.bytes for r in node_rows if r.location == "nvme"),
        rows=node_rows,
    )
    usable = inp.gpu.usable_memory_bytes
    fit = Fit(fits=per_gpu.total <= usable, usable_bytes=usable, headroom_bytes=usable - per_gpu.total)
    detail = None
    if st is not None and arch is not None:
        wl = inp.workload
        assert wl is not None
        layer = act.layer_activations(arch, st, par.tp, par.sequence_parallel, wl.recompute)
        moe = act.layer_activations(arch, st, par.tp, par.sequence_parallel, wl.recompute, moe=True) if arch.moe else None
        detail = ActivationDetail(kernel=st.kernel, recompute=wl.recompute, layer_bytes=layer.total,
                                  moe_layer_bytes=moe.total if moe else None,
                                  layer_tensors=[TensorBytes(name=n, bytes=b) for n, b in layer.tensors])  # fmt: skip

    n = inp.shard_group_size
    if issued is not None:
        collectives = [_issued(x, inp) for x in issued]
    else:
        collectives = comms.data_parallel_collectives(
            psi_top, spec, n, inp.replicas, inp.dp, cluster.gpus_per_node, p.param_bytes, p.grad_bytes, p.low_dtype,
            inp.grad_accum, inp.gpu.intra_node_link, stride=par.tp * par.cp,
        )  # fmt: skip
    if arch is not None and st is not None:
        per = arch.layers // par.pp
        collectives += comms.model_parallel_collectives(
            tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, dp=inp.dp, sp=par.sequence_parallel, stage=top,
            virtual=par.virtual_stages, layers=per,
            moe_layers=sum(arch.is_moe_layer(i) for i in range(top * per, (top + 1) * per)),
            tokens=st.s * st.b, hidden=arch.hidden, kv_width=arch.kv_width, top_k=arch.top_k,
            act_bytes=st.dtype_bytes, dtype=p.low_dtype, micro_batches=inp.grad_accum,
            full_recompute=inp.workload is not None and inp.workload.recompute == "full",
            gpus_per_node=cluster.gpus_per_node, intra_link=inp.gpu.intra_node_link,
        )  # fmt: skip
    collectives = comms.in_step_order(collectives)
    opt_state_bytes = sum(r.bytes for r in host_rows if r.key in ("master_weights", "optimizer_moments"))
    transfers = comms.host_transfers(
        psi_top, spec, n, p.param_bytes, p.grad_bytes, opt_state_bytes,
        inp.strategy.optimizer_device, inp.strategy.offload_params, inp.grad_accum,
    )  # fmt: skip
    communication = Communication(
        collectives=collectives,
        host_transfers=transfers,
        payload_bytes=sum(c.payload_bytes for c in collectives),
        sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in collectives),
        intra_node_sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in collectives if not c.crosses_nodes),
        inter_node_sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in collectives if c.crosses_nodes),
        host_transfer_bytes=sum(t.bytes for t in transfers),
    )
    return Estimate(
        accounting=inp.accounting,
        model=_model_info(inp),
        strategy=StrategyInfo(
            name=spec.name, label=inp.strategy.label, framework=spec.framework, shards_params=spec.shards_params,
            shards_grads=spec.shards_grads, shards_optimizer=spec.shards_optimizer, shard_group_size=n,
            replicas=inp.replicas, offload_optimizer=inp.strategy.optimizer_device,
            offload_params=inp.strategy.offload_params,
        ),  # fmt: skip
        training=_training(inp, micro_batch_auto),
        memory=Memory(per_gpu=per_gpu, per_node=per_node, fit=fit, stages=stages, most_loaded_stage=top,
                      activations=detail),  # fmt: skip
        communication=communication,
        notes=_notes(inp),
        input=inp,
    )
