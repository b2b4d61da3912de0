"""The core's one entry point: a ``Plan`` in, per-GPU memory and per-step communication out, as plain data.

Memory comes from one of three accountings, each behind the same small interface (rows of one rank, and for
the implementation accounting the collectives the framework issues): ``memcalc.memory.accountings.paper``,
``memcalc.memory.accountings.implementation``, ``memcalc.memory.accountings.estimator``. Communication comes from ``memcalc.comm``.
No pydantic here: the report floor (``memcalc.report.build``) turns an ``Evaluation`` into the public result.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from memcalc.comm import traffic
from memcalc.comm.traffic import Collective, HostTransfer
from memcalc.layout.compose import composition
from memcalc.layout.plan import Plan, Zero3Settings
from memcalc.memory.accountings import paper
from memcalc.memory.accountings import paper_notes
from memcalc.memory.accountings.rows import Row, overhead_rows


class StageLoad(NamedTuple):
    """What one pipeline stage's GPU holds (the fields of ``memcalc.report.results.StageMemory``)."""

    stage: int
    parameters: int
    layers: int
    micro_batches_in_flight: float
    model_states: int
    activations: int
    total: int
    peak_reserved: int | None = None
    """The realistic accounting's ``max_memory_reserved`` on this stage's GPU; None under the others."""


class Evaluation(NamedTuple):
    """Memory and communication of the most loaded GPU of one plan."""

    plan: Plan
    stages: tuple[StageLoad, ...]
    top: int
    """The most loaded pipeline stage (the first of equals)."""
    gpu_rows: tuple[Row, ...]
    """Every row of the most loaded GPU; ``total`` is their sum."""
    node_rows: tuple[Row, ...]
    """Offloaded states per node: the sum over the node's ranks."""
    collectives: tuple[Collective, ...]
    transfers: tuple[HostTransfer, ...]
    realistic: Any = None
    """The realistic accounting's peak, allocator figures, verdict and phase peaks (``memcalc.memory.accountings.realistic``)."""

    @property
    def total(self) -> int:
        return self.stages[self.top].total

    @property
    def paper_fit(self) -> paper.PaperFit | None:
        """The paper accounting's verdict (``memcalc.memory.accountings.paper.fit``: its band and the buffers its rows leave
        out); None under the other accountings. Drawn when asked for: the plan sweeps never read it."""
        return paper.fit(self.plan, self.total, self.top) if self.plan.accounting == "paper" else None


def _realistic(plan: Plan, stage: int = 0) -> tuple[StageLoad, Any]:
    """One GPU's peak over the step's timeline (the realistic accounting: its rows include the overheads); under
    pipeline parallelism, pipeline rank ``stage``'s."""
    from memcalc.memory.accountings import realistic
    from memcalc.memory.accountings.activations import pipeline_in_flight

    r = realistic.evaluate(plan, stage)
    ms = sum(x.bytes for x in r.rows if x.category == "model_state")
    a = sum(x.bytes for x in r.rows if x.category == "activation")
    assert plan.arch is not None
    psi = paper.param_groups(plan, stage)[0]
    layers = paper.layer_count(plan, stage) if plan.pp > 1 else plan.arch.layers
    flight = pipeline_in_flight(stage, plan.pp, plan.grad_accum, plan.virtual_stages) if plan.pp > 1 else 1.0
    return StageLoad(stage, psi, layers, flight, ms, a, sum(x.bytes for x in r.rows), r.peak_reserved), r


def _host_rows(plan: Plan) -> list[Row]:
    """What one rank keeps in host memory under offload, as the framework holds it. ZeRO-3 (DeepSpeed 0.19 stage3.py):
    the paper's offloaded states (the bf16 gradient partitions, ``grad_partitions_flat_buffer`` on ``self.device``, the
    fp32 master partitions and the moments; the bf16 partitions with offload_param) and the fp32 gradient of each
    optimizer sub-group the step reads (``fp32_partitioned_groups_flat[i].grad``, 4 bytes per partition element).
    ZeRO-1/2 (stage_1_and_2.py with ``cpu_offload``): the fp32 master partition and the moments, the partition's fp32
    gradient (``single_partition_of_fp32_groups[i].grad``, 4P) in place of a bf16 one, the bf16 buffer the updated
    partition is copied back through (``param_buffer_of_bit16_for_cpu_offload_groups``, 2P) and a bf16 buffer of
    the largest parameter (``temp_grad_buffer_for_cpu_offload``). FULL_SHARD with FSDP2's CPUOffloadPolicy (torch
    ``_fully_shard``) or FSDP1's CPUOffload (``_flat_param.py``): the sharded parameters in their own dtype (fp32 under
    bf16-mixed: the master copy, no bf16 one on the host), their gradients in the same dtype (``.grad`` of the sharded
    parameter; FSDP1's ``_cpu_grad``) and AdamW's moments."""
    if not plan.offloads:
        return []
    rows = [r for r in paper.model_state_rows(plan, paper.param_groups(plan, 0)[1]) if r.location != "gpu"]
    master = next((r for r in rows if r.key == "master_weights"), None)
    if master is None:
        return rows
    if plan.spec.name == "zero-3":
        rows.append(Row("gradients_fp32", "fp32 gradients (optimizer sub-groups)", master.bytes, master.location,
                        "model_state", "DeepSpeed ZeRO-3 offload: the fp32 .grad of each sub-group's master partition, "
                        "4 bytes per element (stage3.py)"))  # fmt: skip
    elif plan.spec.name == "FULL_SHARD":
        grads = next((r for r in rows if r.key == "gradients"), None)
        rows = [r for r in rows if r.key not in ("parameters", "gradients")]
        if grads is not None:
            rows.append(grads._replace(bytes=master.bytes, label="gradients (fp32)",
                                       detail="FSDP parameter offload: the sharded parameters' .grad on the host, in "
                                              "their dtype (FSDP2: _fsdp_collectives.py foreach_reduce; FSDP1: "
                                              "_cpu_grad, _runtime_utils.py _offload_grad)"))
    elif plan.spec.name in ("zero-1", "zero-2") and plan.arch is not None:
        from memcalc.memory.overlays.timeline_zero import partition, trainable

        # LoRA: DeepSpeed flattens and offloads the adapters alone (the parameters that require a gradient)
        where, p = master.location, partition(plan.arch, plan.dp, lora=plan.lora)[0]
        largest = max(n for _, n in trainable(plan.arch, plan.lora))
        rows = [r for r in rows if r.key != "gradients"] + [
            Row("gradients_fp32", "fp32 gradient partition", 4 * p, where, "model_state", "DeepSpeed ZeRO-1/2 offload: "
                "the fp32 .grad of the master partition, 4 bytes per element (stage_1_and_2.py)"),
            Row("parameters_staging", "bf16 partition copy-back buffer", 2 * p, where, "model_state",
                "the updated partition in bf16 on its way back to the GPU, 2 bytes per element (stage_1_and_2.py)"),
            Row("gradient_staging", "gradient staging buffer (bf16)", 2 * largest, where, "model_state",
                "temp_grad_buffer_for_cpu_offload: the largest parameter's elements (stage_1_and_2.py)")]  # fmt: skip
    return rows


def _stage(plan: Plan, k: int, st: object) -> tuple[StageLoad, list[Row], list[Row], list]:
    psi_k, groups = paper.param_groups(plan, k)
    issued: list = []
    if plan.accounting == "implementation":
        from memcalc.memory.accountings import implementation  # the framework replay: loaded only when asked for

        states, issued = implementation.model_state_rows(plan)
    else:
        states = paper.model_state_rows(plan, groups, k)
    gpu: list[Row] = []
    host: list[Row] = []
    ms = a = 0
    for r in states:
        if r.location == "gpu":
            gpu.append(r)
            ms += r.bytes
        else:
            host.append(r)
    flight = 0.0
    if st is not None:
        acts, flight = paper.activation_rows(plan, k, st)  # type: ignore[arg-type]
        gpu += acts
        if paper.fsdp_under_pipeline(plan):  # torch.distributed.pipelining's stages (torchtitan)
            from memcalc.memory.overlays.pipeline import interleave_fsdp, torch_stage_rows

            schedule = None
            if plan.virtual_stages > 1:
                gpu, flight, schedule = interleave_fsdp(plan, k, gpu, flight)
            gpu += torch_stage_rows(plan, k, st, flight, schedule)
            ms = sum(r.bytes for r in gpu if r.category == "model_state")
        a = sum(r.bytes for r in gpu if r.category == "activation")
    gpu += overhead_rows(plan.cuda_context, plan.reserve)
    layers = paper.layer_count(plan, k) if plan.arch else 0
    load = StageLoad(k, psi_k, layers, flight, ms, a, ms + a + plan.cuda_context + plan.reserve)
    return load, gpu, host, issued


def evaluate(plan: Plan) -> Evaluation:
    """Per-GPU memory (most loaded pipeline stage) and per-step communication of one plan."""
    st = paper.setting(plan)
    real = None
    if plan.accounting == "realistic":
        found = [_realistic(plan, k) for k in range(plan.pp)]
        stages = [load for load, _ in found]
        top = max(range(plan.pp), key=lambda k: (stages[k].total, -k))
        real = found[top][1]
        gpu_rows, host_rows, issued = real.rows, _host_rows(plan), []
    elif plan.pp == 1:
        load, gpu_rows, host_rows, issued = _stage(plan, 0, st)
        stages, top = [load], 0
    else:
        stages = []
        found = []
        for k in range(plan.pp):
            load, gpu, host, issued = _stage(plan, k, st)
            stages.append(load)
            found.append((gpu, host, issued))
        top = max(range(plan.pp), key=lambda k: (stages[k].total, -k))
        gpu_rows, host_rows, issued = found[top]
    return _finish(plan, st, stages, top, gpu_rows, host_rows, issued, real)


def _finish(plan: Plan, st: object, stages: list[StageLoad], top: int, gpu_rows: Any, host_rows: list[Row],
            issued: list, real: Any = None) -> Evaluation:  # fmt: skip
    """The evaluation of ``plan`` from its stages and its most loaded one: the node's host rows, the collectives and
    the host transfers of stage ``stages[top]``."""
    psi_top, top_stage = stages[top].parameters, stages[top].stage
    ranks = plan.ranks_per_node
    # Host RAM and NVMe are per node: the sum over the node's ranks (DeepSpeed's estimator does the same).
    node_rows = [r._replace(bytes=r.bytes * ranks) for r in host_rows]
    if plan.accounting == "deepspeed-estimator":
        from memcalc.memory.accountings import estimator

        gpu_rows, cpu = estimator.model_state_rows(plan)
        node_rows = [estimator.host_row(cpu)]
        ms = sum(r.bytes for r in gpu_rows)
        stages = [StageLoad(0, stages[0].parameters, stages[0].layers, stages[0].micro_batches_in_flight, ms, 0, ms)]
        host_rows = []
    collectives = _collectives(plan, issued, psi_top, top_stage, st)
    opt_device = plan.optimizer_device
    transfers: list[HostTransfer] = []
    if opt_device != "none" or plan.offload_params != "none":  # nothing moves to or from the host otherwise
        opt_state_bytes = sum(r.bytes for r in host_rows if r.key in ("master_weights", "optimizer_moments"))
        adapters = None
        if plan.lora is not None and plan.arch is not None:  # only the adapters' gradients and updates move
            from memcalc.model import lora as lr

            adapters = lr.layer_lora(plan.arch, plan.lora).adapters * plan.arch.layers
        transfers = traffic.host_transfers(psi_top, plan.spec, plan.shard_group_size, plan.precision.param_bytes,
                                           plan.precision.grad_bytes, opt_state_bytes, opt_device,
                                           plan.offload_params, plan.grad_accum, trainable=adapters)
    return Evaluation(plan, tuple(stages), top, tuple(gpu_rows), tuple(node_rows), tuple(collectives),
                      tuple(transfers), real)



def evaluate_for_time(plan: Plan, activations: bool = True) -> Evaluation:
    """What the step time, the paper verdict and the planner's model-state bound read of the paper evaluation
    (``evaluate`` of a ``--accounting paper`` plan): the most loaded stage's rows and total, its collectives and host
    transfers, found from fewer stages. Its ``stages`` are the stages evaluated (``StageLoad.stage`` names each) and
    ``top`` indexes them (so ``paper_fit`` is not its to give: ``paper.fit(plan, ev.total, ev.stages[ev.top].stage)``).
    ``activations=False``: without a pipeline, the one stage's rows without its activations (its total then is not
    the stage's). The stages evaluated are ``top_candidates``'; tests/test_plan.py holds the rows, totals, collectives
    and transfers to ``evaluate``'s."""
    assert plan.accounting == "paper", plan.accounting
    st = paper.setting(plan)
    if plan.pp == 1:
        load, gpu_rows, host_rows, issued = _stage(plan, 0, st if activations else None)
        return _finish(plan, st, [load], 0, gpu_rows, host_rows, issued)
    stages, found = [], []
    for k in top_candidates(plan):
        load, gpu, host, issued = _stage(plan, k, st)
        stages.append(load)
        found.append((gpu, host, issued))
    top = max(range(len(stages)), key=lambda i: (stages[i].total, -stages[i].stage))
    return _finish(plan, st, stages, top, *found[top])


def top_candidates(plan: Plan) -> tuple[int, ...]:
    """The pipeline stages among which the paper accounting's most loaded one is (the first of equals): the first,
    the last, and of the stages between them the first of each kind, stages of one kind holding the same parameters,
    layers and MoE layers. Two stages k < k' of one kind hold the same rows but for the micro-batches in flight,
    min(pp - k, n) under 1F1B (Korthikanti et al. 2022 Eq. 5) or Megatron's interleaved count, which never grows
    with k, and what torch's ``PipelineStage`` keeps beside them (``memcalc.memory.overlays.pipeline.torch_stage_rows``: two
    receive buffers per micro-batch, the stage outputs in flight, the input gradient being sent once a backward has
    finished, which it has on every such stage when n >= pp). So k' never holds more than k, and of equals k is
    named. Every stage where that does not hold: torchtitan's every:K recompute (which layers are recomputed depends
    on their index), fewer micro-batches than stages, and FSDP2's interleaved schedule (its peak per rank is replayed:
    ``memcalc.memory.overlays.pipeline.interleave_fsdp``)."""
    pp, w = plan.pp, plan.work
    every = tuple(range(pp))
    if pp <= 3 or w is None or plan.arch is None or w.recompute.startswith("every:") or plan.grad_accum < pp:
        return every
    if plan.virtual_stages > 1 and paper.fsdp_under_pipeline(plan):
        return every
    first: dict[tuple, int] = {}
    for k in range(1, pp - 1):
        psi, groups = paper.param_groups(plan, k)
        first.setdefault((psi, tuple(groups), paper.layer_count(plan, k), paper.moe_layers(plan, k)), k)
    return (0, *first.values(), pp - 1)


def _collectives(plan: Plan, issued: list, psi: int, stage: int, st: object) -> list[Collective]:
    """Data-parallel traffic (the framework's own under the implementation accounting) and model-parallel traffic."""
    p, arch = plan.precision, plan.arch
    if plan.accounting == "implementation":
        from memcalc.memory.accountings import implementation

        rows = [implementation.collective(x, plan) for x in issued]
    else:
        # Gradients are reduced over the shard domain: dp x cp ranks (stride tp) under shard_over dp-cp, else dp.
        trainable = gathered = None
        if plan.lora is not None and arch is not None:
            from memcalc.model import lora as lr  # LoRA: only the adapters have gradients to reduce

            sp = lr.split(psi, arch.layers, lr.layer_lora(arch, plan.lora), plan.lora.quantize, p.param_bytes)
            trainable, gathered = sp.adapters, sp.frozen_bytes + sp.adapters * p.param_bytes
        elif plan.float8_all_gather and arch is not None:  # the converted weights travel as 1-byte fp8 data
            gathered = paper.fp8_gathered_bytes(plan, stage, psi)
        # torchtitan reduces FSDP gradients in fp32 (MixedPrecisionPolicy reduce_dtype: its default
        # ``mixed_precision_reduce = "float32"``, torchtitan config/configs.py) when a master copy exists.
        fp32_reduce = ((composition(plan.framework).fsdp_reduce_fp32 and plan.spec.framework == "fsdp"
                        and p.master_bytes > 0) or plan.grad_bytes == 4 != p.grad_bytes)  # Megatron's main_grad
        rows = traffic.data_parallel_collectives(psi, plan.spec, plan.shard_group_size, plan.replicas,
                                                 plan.shard_domain, plan.gpus_per_node, p.param_bytes,
                                                 4 if fp32_reduce else p.grad_bytes,
                                                 p.low_dtype, plan.grad_accum, plan.intra_link,
                                                 stride=plan.domain_stride, trainable=trainable, gathered_bytes=gathered,
                                                 kept_gathered=plan.pp > 1 and paper.fsdp_under_pipeline(plan),
                                                 whole=plan.fsdp_auto_wrap == "none",
                                                 grad_dtype="fp32" if fp32_reduce else None)
        if arch is None or st is None or (plan.model_parallel == 1 and plan.ep == 1):
            return rows  # already in step order, and no model-parallel traffic to merge
    if arch is not None and st is not None:
        rows += traffic.model_parallel_collectives(
            tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep, dp=plan.dp, sp=plan.sequence_parallel, stage=stage,
            virtual=plan.virtual_stages, layers=paper.layer_count(plan, stage), moe_layers=paper.moe_layers(plan, stage),
            tokens=st.s * st.b, hidden=arch.hidden, kv_width=arch.kv_width, top_k=arch.top_k,  # type: ignore[attr-defined]
            act_bytes=st.dtype_bytes, dtype=p.low_dtype, micro_batches=plan.grad_accum,  # type: ignore[attr-defined]
            full_recompute=plan.work is not None and plan.work.recompute == "full",
            gpus_per_node=plan.gpus_per_node, intra_link=plan.intra_link,
        )
    return traffic.in_step_order(rows)


def notes(plan: Plan) -> list[str]:
    """The accounting's notes for this plan."""
    if plan.accounting == "deepspeed-estimator":
        from memcalc.memory.accountings import estimator

        return estimator.notes(plan)
    if plan.accounting == "implementation":
        from memcalc.memory.accountings import implementation

        return implementation.notes(plan)
    if plan.accounting == "realistic":
        from memcalc.memory.accountings import realistic_notes

        return realistic_notes.notes(plan)
    out = paper_notes.notes(plan)
    if plan.spec.name == "zero-3" and plan.zero3 != Zero3Settings():
        out.append("the ZeRO-3 coordinator settings given (stage3_max_live_parameters, ...) or sub_group_size are not "
                   "used: the paper accounting has no coordinator and no optimizer step (the realistic accounting "
                   "replays both, the implementation accounting the coordinator)")
    if plan.fsdp_wrap != "root" and plan.fsdp_auto_wrap != "none":
        out.append(f"--fsdp-wrap {plan.fsdp_wrap} (where FSDP2's units put the embedding and the head) is read by the "
                   "realistic accounting only; the paper accounting counts every unit alike")
    if plan.fsdp_auto_wrap == "none" and plan.spec.shards_params:
        out.append("--fsdp-auto-wrap none: the paper's rows are the sharded states; the whole model gathered from "
                   "the forward's start to the backward's end and its unsharded gradients are not among them (the "
                   "verdict's at-risk band counts the gathered model: memory/accountings/paper.py uncounted)")
    if plan.arch is not None and plan.work is not None:
        why = realistic_why_not(plan)
        if why is not None:
            out.append(f"realistic accounting (the peak of a real step) not used: {why}")
    return out


def realistic_why_not(plan: Plan) -> str | None:
    """Why the realistic accounting cannot replay ``plan`` (``memcalc.memory.accountings.scope.why_not``); None where it can."""
    if plan.arch is None or plan.work is None:
        return ("a bare parameter count has no layers to replay: give the model's shape (--model, --hf-config) and "
                "--seq-len")
    from memcalc.memory.accountings.scope import why_not

    return why_not(plan.arch, plan.precision.name, plan.optimizer.name, plan.spec.name, plan.work, plan.tp,
                   plan.pp, plan.cp, plan.ep, plan.fsdp_version, lora=plan.lora, framework=plan.framework,
                   sequence_parallel=plan.sequence_parallel,
                   offload=plan.offload, overlap_comm=plan.overlap_comm, fsdp_wrap=plan.fsdp_wrap,
                   fsdp_auto_wrap=plan.fsdp_auto_wrap, float8=plan.float8)
