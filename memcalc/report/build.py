"""The core's plain ``Evaluation`` turned into the public result (``memcalc.report.results.Estimate``), once."""

from __future__ import annotations

from memcalc.evaluate import Evaluation, notes
from memcalc.inputs import EstimateInput
from memcalc.layout.plan import Plan
from memcalc.memory.accountings import paper
from memcalc.memory.accountings.rows import total
from memcalc.report.results import (
    ActivationDetail,
    Collective,
    Communication,
    Estimate,
    Fit,
    HostTransfer,
    Memory,
    MemoryRow,
    ModelInfo,
    ParameterBreakdown,
    PerGPU,
    PerNode,
    StageMemory,
    StepTimeline,
    TimelineMoment,
    StrategyInfo,
    TensorBytes,
    Training,
)
from memcalc.report.results_time import StepTimeInfo, TimeBreakdown
from memcalc.units import format_count

_GRADIENT_KEYS = ("gradients", "gradient_buckets", "gradients_backward", "gradients_step")


def _row(r: tuple) -> MemoryRow:
    return MemoryRow(**r._asdict())  # type: ignore[attr-defined]


def _per_gpu(ev: Evaluation) -> PerGPU:
    rows = list(ev.gpu_rows)
    master = total(rows, "master_weights")
    moments = total(rows, "optimizer_moments") + total(rows, "optimizer_steps")
    # The paper's rows: all but the context and the reserve are tensors the allocator hands out.
    reserve = total(rows, "allocator_reserve")
    outside = total(rows, "cuda_context") + reserve
    return PerGPU(
        parameters=sum(total(rows, k) for k in ("parameters", "parameters_frozen", "parameters_adapters")),
        gradients=sum(total(rows, k) for k in _GRADIENT_KEYS),
        optimizer_states=master + moments,
        master_weights=master,
        optimizer_moments=moments,
        activations=sum(r.bytes for r in rows if r.category == "activation"),
        cuda_context=total(rows, "cuda_context"),
        allocator_reserve=total(rows, "allocator_reserve"),
        total=ev.total,
        rows=[_row(r) for r in rows],
        peak_allocated=ev.realistic.peak_allocated if ev.realistic else ev.total - outside,
        peak_reserved=ev.realistic.peak_reserved if ev.realistic else ev.total - outside + reserve,
    )


def _activations(plan: Plan) -> ActivationDetail | None:
    st, arch, w = paper.setting(plan), plan.arch, plan.work
    if st is None or arch is None or w is None:
        return None
    from memcalc.memory.accountings import activations as act

    layer = act.layer_activations(arch, st, plan.tp, plan.sequence_parallel, w.recompute)
    moe = act.layer_activations(arch, st, plan.tp, plan.sequence_parallel, w.recompute, moe=True) if arch.moe else None
    return ActivationDetail(kernel=st.kernel, recompute=w.recompute, layer_bytes=layer.total,
                            moe_layer_bytes=moe.total if moe else None,
                            layer_tensors=[TensorBytes(name=n, bytes=b) for n, b in layer.tensors])


def _communication(ev: Evaluation) -> Communication:
    cs = [Collective(**c._asdict()) for c in ev.collectives]
    ts = [HostTransfer(**t._asdict()) for t in ev.transfers]
    return Communication(
        collectives=cs,
        host_transfers=ts,
        payload_bytes=sum(c.payload_bytes for c in cs),
        sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in cs),
        intra_node_sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in cs if not c.crosses_nodes),
        inter_node_sent_bytes_per_gpu=sum(c.sent_bytes_per_gpu for c in cs if c.crosses_nodes),
        host_transfer_bytes=sum(t.bytes for t in ts),
    )


def model_info(plan: Plan, name: str | None) -> ModelInfo:
    """Ψ and, with a shape, its exact breakdown by part."""
    arch = plan.arch
    if arch is None:
        return ModelInfo(parameters=plan.psi, name=name or format_count(plan.psi))
    from memcalc.model.params import active_params, largest_layer, largest_module, model_params

    p = model_params(arch)
    big, size = largest_module(arch)
    return ModelInfo(
        parameters=p.total,
        name=name or arch.name or format_count(p.total),
        breakdown=ParameterBreakdown(
            embeddings=p.embeddings, positions=p.positions, attention=sum(x.attention for x in p.layers),
            mlp=sum(x.mlp for x in p.layers), router=sum(x.router for x in p.layers),
            norms=sum(x.norms for x in p.layers) + p.embedding_norm + p.final_norm, head=p.head,
            per_layer=p.layers[0].total, largest_layer=largest_layer(arch), largest_module=big,
            largest_module_parameters=size, active_per_token=active_params(arch),
        ),
    )


def training(plan: Plan, auto: bool) -> Training:
    """The parallel layout and batch the estimate assumes."""
    w = plan.work
    global_batch = w.micro_batch * plan.grad_accum * plan.dp if w else None
    return Training(
        dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep, sequence_parallel=plan.sequence_parallel,
        virtual_stages=plan.virtual_stages, seq_len=w.seq_len if w else None,
        micro_batch=w.micro_batch if w else None, micro_batch_auto=auto, micro_batches=plan.grad_accum,
        global_batch=global_batch, tokens_per_step=global_batch * w.seq_len if (w and global_batch) else None,
    )


def step_time(inp: EstimateInput, ev: Evaluation, timing: dict | None = None) -> tuple[StepTimeInfo | None, str | None]:
    """(the step time of an evaluation, or None and why). ``timing``: ``cluster``, ``optimizer_impl``, ``tokens``,
    ``price_per_gpu_hour`` and link overrides (``memcalc.time.estimate.time_evaluation``)."""
    opts = dict(timing or {})
    tokens, price = opts.pop("tokens", None), opts.pop("price_per_gpu_hour", None)
    plan = ev.plan
    if plan.arch is None or plan.work is None:
        given = [name for name, v in (("tokens", tokens), ("price_per_gpu_hour", price), *opts.items())
                 if v is not None and name != "optimizer_impl"]
        if given:  # timing flags with nothing to time would be ignored
            from memcalc.errors import InputError

            flags = ", ".join("--" + n.replace("_", "-").replace("network-gbits-per-gpu", "network-gbits") for n in given)
            raise InputError(f"{flags} need{'s' * (len(given) == 1)} a step time: give the model's shape (--model, --hf-config or "
                             "--layers ...) and --seq-len")
        why = ("a bare parameter count has no FLOPs: give the model's shape (--model, --hf-config)"
               if plan.arch is None else "a step needs its tokens: give --seq-len")
        return None, why
    from memcalc.time.datasheet import gpu_machine
    from memcalc.time.estimate import time_evaluation, time_fields, time_unavailable
    from memcalc.time.hardware import load_machine

    cluster = opts.get("cluster")
    why = time_unavailable(ev, gpu=inp.gpu, cluster=cluster)
    if why is not None:
        asked = [n for n, v in (("tokens", tokens), ("price_per_gpu_hour", price), *opts.items())
                 if v is not None and n != "optimizer_impl"]
        if asked:  # a time flag was given: no answer without the time it asks for
            from memcalc.errors import InputError

            flags = ", ".join("--" + n.replace("_", "-").replace("network-gbits-per-gpu", "network-gbits") for n in asked)
            raise InputError(f"{flags} need{'s' * (len(asked) == 1)} a step time: {why}")
        return None, why
    st = time_evaluation(ev, gpu=inp.gpu, **opts)
    f = time_fields(st, tokens=tokens, price_per_gpu_hour=price)
    if f is None:
        return None, "nothing to time"
    b = f["breakdown"]
    machine = load_machine(cluster) if cluster else gpu_machine(inp.gpu)
    cal = machine.calibration
    return StepTimeInfo(
        cluster=machine.cluster.key, node=machine.cluster.name, calibration=cal.basis, efficiency_sources=dict(cal.sources),
        step_s=f["step_s"], tokens_per_step=f["tokens_per_step"],
        tokens_per_s=f["tokens_per_s"], tokens_per_s_per_gpu=f["tokens_per_s_per_gpu"],
        model_tflops_per_gpu=f["model_tflops_per_gpu"], peak_tflops_per_gpu=f["peak_tflops_per_gpu"], mfu=f["mfu"],
        hfu=f["hfu"], flop_convention=f["flop_convention"],
        breakdown=TimeBreakdown(compute_s=b["compute_s"], memory_bound_s=b["memory_bound_s"],
                                recompute_s=b["recompute_s"], communication_s=dict(b["communication_s"]),
                                bubble_s=b["bubble_s"], optimizer_s=b["optimizer_s"], offload_s=b["offload_s"],
                                host_s=b["host_s"]),
        time_to_train_s=f["time_to_train_s"], cost=f["cost"],
    ), None


def _time_notes(st: StepTimeInfo | None, plan: Plan) -> list[str]:
    """Where the step time's rates come from: the calibration, each efficiency's source, and what the framework's
    kernel table decided that changes the time (``memcalc.time.kernels``)."""
    if st is None or not st.calibration:
        return []
    from memcalc.layout.compose import composition
    from memcalc.time.kernels import overlaps_tp

    named = {"hbm": "HBM", "gemm": "GEMM", "cross_entropy": "cross-entropy", "intra_node": "intra-node collectives",
             "network": "network collectives"}
    parts = "; ".join(f"{named.get(g, g)}: {label}" for g, label in st.efficiency_sources.items())
    out = [f"step time on {st.cluster} ({st.node}): {st.calibration}", f"step-time efficiencies: {parts}"]
    if overlaps_tp(composition(plan.framework).model_code, plan.tp, plan.sequence_parallel):
        out.append("tensor-parallel communication timed as Transformer Engine's userbuffers overlap it with the GEMMs "
                   "(Megatron-Bridge's performance recipes set tp_comm_overlap; Megatron-LM does it only with "
                   "--tp-comm-overlap, and without it every all-gather and reduce-scatter waits)")
    return out


def _verdict_notes(f: paper.PaperFit | None) -> list[str]:
    """How the paper accounting's verdict is drawn (``memcalc.memory.accountings.paper.fit``)."""
    if f is None:
        return []
    from memcalc.memory.allocator.allocator import GAP_LOW
    from memcalc.units import GiB

    left = "".join(f" + {what} {n / GiB:.2f} GiB" for what, n in f.uncounted)
    return [f"verdict (paper accounting): {f.verdict}, margin {f.margin / GiB:.2f} GiB; at-risk under "
            f"{f.band / GiB:.2f} GiB: the allocator's variability for a step of this size "
            f"{(f.band - sum(n for _, n in f.uncounted)) / GiB:.2f} GiB"
            + (f"{left}, which a real step holds beyond the paper's rows" if left else "")
            + f"; oom under {GAP_LOW / GiB:.1f} GiB (the least reserved overhead measured)"]


def _layout_notes(ev: Evaluation) -> list[str]:
    """How the layout composes: the group that shards under context parallelism, the pipeline split and its peak."""
    plan, out = ev.plan, []
    if plan.cp > 1:
        group = "dp x cp" if plan.shard_over == "dp-cp" else "dp"
        out.append(f"gradients reduced (and model states sharded, where the strategy shards) over {group} = "
                   f"{plan.shard_domain} ranks (--shard-over {plan.shard_over}; memcalc.layout.compose)")
    if plan.pp > 1 and plan.arch is not None and plan.accounting != "realistic":
        from memcalc.memory.accountings.paper import layer_count

        split = ",".join(str(layer_count(plan, k)) for k in range(plan.pp))
        out.append(f"pipeline: decoder layers per stage {split} (embedding on stage 0, final norm and head on stage "
                   f"{plan.pp - 1}); the most loaded is stage {ev.top}, shown")
    return out


def step_timeline(ev: Evaluation, moments: bool = False) -> StepTimeline | None:
    """The realistic accounting's peak moment and phase peaks; with ``moments``, every moment of the most loaded
    GPU's step by kind, from a replay of every decoder layer (the estimate's own replay keeps only the layers that
    bound the rest)."""
    real = ev.realistic
    if real is None:
        return None
    listed: list[TimelineMoment] = []
    if moments:
        from memcalc.memory.engine.moments import step_moments

        listed = [TimelineMoment(phase=m.phase, label=m.label, bytes=m.by_kind())
                  for m in step_moments(ev.plan, ev.top)]
    return StepTimeline(peak_phase=real.peak_phase, peak_moment=real.peak_moment, phases=dict(real.phases),
                        moments=listed)


def estimate(inp: EstimateInput, ev: Evaluation, micro_batch_auto: bool = False, timing: dict | None = None,
             timeline: bool = False) -> Estimate:
    """The public result of one evaluation, with the input it was computed from and the step's time; ``timeline``:
    with every moment of the step (``StepTimeline.moments``)."""
    plan = ev.plan
    if timing is None:
        tm = inp.timing
        timing = {k: v for k, v in (("cluster", tm.cluster), ("intra_node_gbps", tm.intra_node_gbps),
                                    ("network_gbits_per_gpu", tm.network_gbits_per_gpu),
                                    ("intra_node_efficiency", tm.intra_node_efficiency),
                                    ("network_efficiency", tm.network_efficiency), ("pcie_gbps", tm.pcie_gbps),
                                    ("host_memory_gbps", tm.host_memory_gbps), ("tokens", tm.tokens),
                                    ("price_per_gpu_hour", tm.price_per_gpu_hour)) if v is not None}
        w = plan.work
        if w is not None and w.optimizer_impl in ("foreach", "fused"):
            timing["optimizer_impl"] = w.optimizer_impl  # for-loop and in-backward are timed as foreach
    time, why = step_time(inp, ev, timing)
    per_gpu = _per_gpu(ev)
    node_rows = [_row(r) for r in ev.node_rows]
    per_node = PerNode(ranks=plan.ranks_per_node, cpu=sum(r.bytes for r in node_rows if r.location == "cpu"),
                       nvme=sum(r.bytes for r in node_rows if r.location == "nvme"), rows=node_rows)
    usable = plan.usable_bytes
    paper_fit = ev.paper_fit
    if ev.realistic is not None:
        fit = Fit(fits=ev.realistic.verdict == "fits", usable_bytes=usable, headroom_bytes=usable - per_gpu.total,
                  verdict=ev.realistic.verdict)
    elif paper_fit is not None:
        fit = Fit(fits=paper_fit.verdict == "fits", usable_bytes=usable, headroom_bytes=usable - per_gpu.total,
                  verdict=paper_fit.verdict)
    else:
        fits = per_gpu.total <= usable
        fit = Fit(fits=fits, usable_bytes=usable, headroom_bytes=usable - per_gpu.total, verdict="fits" if fits else "oom")
    stages = [StageMemory(stage=s.stage, parameters=s.parameters, layers=s.layers,
                          micro_batches_in_flight=s.micro_batches_in_flight, model_states=s.model_states,
                          activations=s.activations, total=s.total, peak_reserved=s.peak_reserved)
              for s in ev.stages]  # fmt: skip
    spec = plan.spec
    return Estimate(
        accounting=plan.accounting,
        model=model_info(plan, inp.model.name),
        strategy=StrategyInfo(
            name=spec.name, label=inp.strategy.label, framework=spec.framework, shards_params=spec.shards_params,
            shards_grads=spec.shards_grads, shards_optimizer=spec.shards_optimizer,
            shard_group_size=plan.shard_group_size, replicas=plan.replicas, offload_optimizer=plan.optimizer_device,
            offload_params=plan.offload_params,
        ),
        training=training(plan, micro_batch_auto),
        memory=Memory(per_gpu=per_gpu, per_node=per_node, fit=fit, stages=stages, most_loaded_stage=ev.top,
                      activations=_activations(plan) if plan.accounting != "realistic" else None,
                      timeline=step_timeline(ev, timeline)),
        communication=_communication(ev),
        notes=notes(plan) + _layout_notes(ev) + _verdict_notes(paper_fit) + ([f"step time: {why}"] if why else [])
        + _time_notes(time, plan),
        assumed=list(inp.assumed),
        input=inp,
        time=time,
    )
