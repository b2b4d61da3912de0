"""The one place that composes: inputs -> formulas -> an ``Estimate``."""

from __future__ import annotations

from memcalc import comms, memory
from memcalc.inputs import EstimateInput
from memcalc.results import (
    Communication,
    Estimate,
    Fit,
    Memory,
    MemoryRow,
    ModelInfo,
    PerGPU,
    PerNode,
    StrategyInfo,
)
from memcalc.units import format_count

_LOCATIONS = ("gpu", "cpu", "nvme")


def _model_state_rows(inp: EstimateInput) -> list[MemoryRow]:
    """Every model-state tensor of one rank, one row per tensor per location it occupies."""
    psi, p, opt, spec = inp.model.parameters, inp.precision, inp.optimizer, inp.strategy.spec
    n = inp.shard_group_size
    opt_dev, param_dev = inp.strategy.optimizer_device, inp.strategy.offload_params
    div = f"/{n}" if n > 1 else ""
    shard = lambda sharded: div if sharded else ""  # noqa: E731
    b_mom = opt.moment_bytes_for(p)

    states = [
        ("parameters", f"parameters ({p.low_dtype})",
         memory.parameter_bytes(psi, p.param_bytes, spec.shards_params, n, param_dev),
         f"{p.param_bytes}Ψ{shard(spec.shards_params)} (ZeRO §5.3)"),
        ("gradients", f"gradients ({p.low_dtype})",
         memory.gradient_bytes(psi, p.grad_bytes, spec.shards_grads, spec.shards_optimizer, n, opt_dev),
         f"{p.grad_bytes}Ψ{shard(spec.shards_grads)} (ZeRO §5.2)"),
        ("master_weights", "master weights (fp32)",
         memory.master_bytes(psi, p.master_bytes, spec.shards_optimizer, n, opt_dev),
         f"{p.master_bytes}Ψ{shard(spec.shards_optimizer)} (ZeRO §3.1, §5.1)"),
        ("optimizer_moments", f"optimizer moments ({opt.name})",
         memory.moment_bytes(psi, opt.moments, b_mom, spec.shards_optimizer, n, opt_dev),
         f"{opt.moments}x{b_mom}Ψ{shard(spec.shards_optimizer)} ({opt.source})"),
    ]  # fmt: skip
    rows: list[MemoryRow] = []
    for key, label, placed, detail in states:
        for loc in _LOCATIONS:
            n_bytes = getattr(placed, loc)
            if loc == "gpu" or n_bytes:
                offloaded = loc == "gpu" and placed.gpu == 0 and (placed.cpu or placed.nvme)
                where = "offloaded: " if offloaded else ("" if loc == "gpu" else f"on {loc}: ")
                rows.append(MemoryRow(key=key, label=label, bytes=n_bytes, location=loc, category="model_state",
                                      detail=where + detail))  # fmt: skip
    return rows


def _overhead_rows(inp: EstimateInput) -> list[MemoryRow]:
    o = inp.overheads
    return [
        MemoryRow(key="cuda_context", label="CUDA context", bytes=o.cuda_context_bytes, location="gpu",
                  category="overhead", detail="CUDA context and loaded kernels (--cuda-context-gib)"),
        MemoryRow(key="allocator_reserve", label="allocator reserve", bytes=o.allocator_reserve_bytes,
                  location="gpu", category="overhead", detail="fragmentation headroom (--reserve-gib)"),
    ]  # fmt: skip


def _sum(rows: list[MemoryRow], key: str, location: str = "gpu") -> int:
    return sum(r.bytes for r in rows if r.key == key and r.location == location)


def _notes(inp: EstimateInput) -> list[str]:
    spec, notes = inp.strategy.spec, []
    notes.append(
        "accounting: paper (ZeRO §5: model states only, as the paper counts them); activations, "
        "communication buckets and framework buffers are not included yet"
    )
    if spec.shards_params:
        notes.append(
            "parameter sharding gathers one wrapped unit (a layer) at a time; its unsharded copy is "
            "transient and not counted for a bare parameter count"
        )
    if inp.strategy.offload_params != "none" and spec.shards_params:
        notes.append("offloaded parameters are fetched to the GPU layer by layer; that working copy is not counted")
    if inp.optimizer.note:
        notes.append(inp.optimizer.note)
    if inp.cluster.gpus < inp.cluster.gpus_per_node:
        notes.append(f"{inp.cluster.gpus} GPUs use part of one {inp.cluster.gpus_per_node}-GPU node")
    return notes


def estimate_from_input(inp: EstimateInput) -> Estimate:
    """Per-GPU memory and per-step communication for one fully specified input."""
    spec, cluster, p, psi = inp.strategy.spec, inp.cluster, inp.precision, inp.model.parameters
    n = inp.shard_group_size

    state_rows = _model_state_rows(inp)
    gpu_rows = [r for r in state_rows if r.location == "gpu"] + _overhead_rows(inp)
    host_rows = [r for r in state_rows if r.location != "gpu"]
    master, moments = _sum(gpu_rows, "master_weights"), _sum(gpu_rows, "optimizer_moments")
    total = sum(r.bytes for r in gpu_rows)
    per_gpu = PerGPU(
        parameters=_sum(gpu_rows, "parameters"),
        gradients=_sum(gpu_rows, "gradients"),
        optimizer_states=master + moments,
        master_weights=master,
        optimizer_moments=moments,
        cuda_context=_sum(gpu_rows, "cuda_context"),
        allocator_reserve=_sum(gpu_rows, "allocator_reserve"),
        total=total,
        rows=gpu_rows,
    )
    ranks = cluster.ranks_per_node
    # Host RAM and NVMe are per node: the sum over the node's ranks (DOMAIN §3; DeepSpeed's estimator does the same).
    node_rows = [r.model_copy(update={"bytes": r.bytes * ranks}) for r in host_rows]
    per_node = PerNode(
        ranks=ranks,
        cpu=sum(r.bytes for r in node_rows if r.location == "cpu"),
        nvme=sum(r.bytes for r in node_rows if r.location == "nvme"),
        rows=node_rows,
    )
    usable = inp.gpu.usable_memory_bytes
    fit = Fit(fits=total <= usable, usable_bytes=usable, headroom_bytes=usable - total)

    collectives = comms.data_parallel_collectives(
        psi, spec, n, inp.replicas, cluster.gpus, cluster.gpus_per_node,
        p.param_bytes, p.grad_bytes, p.low_dtype, inp.grad_accum, inp.gpu.intra_node_link,
    )  # fmt: skip
    opt_state_bytes = sum(r.bytes for r in host_rows if r.key in ("master_weights", "optimizer_moments"))
    transfers = comms.host_transfers(
        psi, spec, n, p.param_bytes, p.grad_bytes, opt_state_bytes,
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
        model=ModelInfo(parameters=psi, name=inp.model.name or format_count(psi)),
        strategy=StrategyInfo(
            name=spec.name,
            label=inp.strategy.label,
            framework=spec.framework,
            shards_params=spec.shards_params,
            shards_grads=spec.shards_grads,
            shards_optimizer=spec.shards_optimizer,
            shard_group_size=n,
            replicas=inp.replicas,
            offload_optimizer=inp.strategy.optimizer_device,
            offload_params=inp.strategy.offload_params,
        ),
        memory=Memory(per_gpu=per_gpu, per_node=per_node, fit=fit),
        communication=communication,
        notes=_notes(inp),
        input=inp,
    )
