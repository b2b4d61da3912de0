"""Step time of an evaluated plan: the bridge from ``memcalc.evaluate.Evaluation`` to ``memcalc.time.step``.

``time_evaluation(ev, gpu=...)`` reads the layout, batch and strategy from ``ev.plan``, times the collectives and
host copies ``evaluate`` found (``ev.collectives``, ``ev.transfers``: memcalc's own traffic lists), and returns a
``StepTime``; ``time_fields`` turns it into plain JSON-ready numbers.

Where each group's ranks stand (Megatron-LM's rank order, arXiv 2104.04473 §3 and megatron/core/parallel_state.py:
tensor-parallel fastest, then context, then data, then pipeline): a group of n members ``stride`` ranks apart has
min(n, G // stride) members in each node of G GPUs. A data-parallel group under tp x cp = 8 on 8-GPU nodes therefore
has one member per node, and its ring runs over one NIC per node instead of eight.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from typing import Any, NamedTuple

from memcalc.errors import InputError, did_you_mean
from memcalc.layout.compose import composition
from memcalc.layout.plan import Plan as LayoutPlan
from memcalc.memory.accountings.paper import param_groups
from memcalc.time.datasheet import gpu_machine
from memcalc.time.hardware import Machine, cluster_names, load_cluster, load_machine
from memcalc.time.flops import policy_name
from memcalc.time.kernels import framework_kernels, overlaps_tp
from memcalc.time.step import Plan, StepTime, step_time
from memcalc.units import ceil_div

OPTIMIZER_IMPLS = ("fused", "foreach")
"""torch.optim.AdamW on the GPU: foreach is torch's default on CUDA (fused=None, foreach=None -> foreach)."""
# Training precision -> the dtype its matmuls run in. fp32 training is timed on TF32 tensor cores
# (torch.backends.cuda.matmul.allow_tf32 = True); with TF32 off, fp32 GEMMs run several times slower than this.
_MATMUL_DTYPE = {"fp32": "tf32", "fp16": "fp16", "bf16": "bf16"}
# Attention kernels the input names -> the step model's: PyTorch's SDPA dispatches to FlashAttention-2 on these GPUs.
_ATTENTION = {"eager": "eager", "flash": "flash", "sdpa": "flash"}
FLOP_CONVENTIONS = {
    "full": ("model FLOPs of one step: forward + backward (2 x forward) of every weight matmul (2·m·k·n) and the "
             "output head, attention QKᵀ and ·V over all s² query-key pairs (Megatron-LM, PaLM, torchtitan: "
             "6·N_matmul + 12·L·h·s per token); no recompute (MFU); HFU adds the recomputed work; "
             "element-wise ops not counted; peak = dense datasheet tensor-core rate of the dtype"),
    "causal": ("model FLOPs of one step: forward + backward (2 x forward) of every weight matmul (2·m·k·n) and the "
               "output head, attention QKᵀ and ·V over the s(s+1)/2 causal query-key pairs; no recompute (MFU); "
               "HFU adds the recomputed work; element-wise ops not counted; peak = dense datasheet tensor-core rate"),
}  # fmt: skip


class Placed(NamedTuple):
    """A collective with the number of its group's members inside one node (what ``step_time`` reads)."""

    op: str
    phase: str
    group: str
    group_size: int
    crosses_nodes: bool
    calls_per_step: int
    payload_bytes_per_call: int
    ranks_per_node: int


def group_stride(group: str, plan: LayoutPlan) -> int:
    """Ranks between neighbouring members of ``group`` in Megatron-LM's order (tp, cp, dp, pp; hybrid sharding:
    the shard group is consecutive data-parallel ranks, the replica group strides over whole shard groups;
    expert parallelism subdivides the data-parallel ranks, as ``memcalc.comm.traffic`` lays it out)."""
    tp, cp = plan.tp, plan.cp
    d = plan.domain_stride  # the gradient-reducing group: dp x cp ranks tp apart (shard_over dp-cp), else tp x cp
    strides = {
        "tensor-parallel": 1, "context-parallel": tp, "data-parallel": d, "shard group": d,
        "expert-parallel": tp * cp, "replica group": d * plan.shard_group_size, "pipeline": tp * cp * plan.dp,
    }  # fmt: skip
    if group not in strides:
        raise InputError(f"unknown communication group {group!r}{did_you_mean(group, strides)}; "
                         f"known: {', '.join(strides)}")  # fmt: skip
    return strides[group]


def group_ranks_per_node(c: Any, plan: LayoutPlan) -> int:
    """Members of collective ``c``'s group inside one node: min(n, G // stride), at least 1 (G = GPUs used per node).
    A pipeline send pairs two stages: both in one node unless ``memcalc.comm.traffic`` found it crossing nodes."""
    if c.group == "pipeline":
        return 1 if c.crosses_nodes else 2
    per_node = plan.ranks_per_node // group_stride(c.group, plan)
    return max(1, min(c.group_size, per_node))


def placed(collectives: Any, plan: LayoutPlan) -> tuple[Placed, ...]:
    """``collectives`` with each group's members per node from the plan's layout."""
    return tuple(Placed(c.op, c.phase, c.group, c.group_size, c.crosses_nodes, c.calls_per_step,
                        c.payload_bytes_per_call, group_ranks_per_node(c, plan)) for c in collectives)  # fmt: skip


def optimizer_params(plan: LayoutPlan) -> int:
    """Parameters this rank's optimizer updates, on the stage that holds the most: ⌈Ψ_group/N⌉ per sharding group
    when the strategy shards optimizer states (ZeRO-1/2/3, FSDP; routed experts over N/ep), else all it holds."""
    best = 0
    if plan.lora is not None and plan.arch is not None:  # only the adapters have optimizer states
        from memcalc.model.lora import layer_lora

        a = layer_lora(plan.arch, plan.lora).adapters * plan.arch.layers // plan.pp
        return ceil_div(a, plan.shard_group_size) if plan.spec.shards_optimizer else a
    for stage in range(plan.pp):
        _, groups = param_groups(plan, stage)
        n = sum(ceil_div(g.psi, g.n) if plan.spec.shards_optimizer else g.psi for g in groups)
        best = max(best, n)
    return best


def time_unavailable(ev: Any, *, gpu: Any = None, cluster: str | None = None) -> str | None:
    """Why this evaluation has no step time, in one line, or None when it has one. ``gpu``: a preset name, a TOML
    path or a GPU record (``memcalc.time.datasheet.gpu_machine``)."""
    plan = ev.plan
    if plan.arch is None:
        return "a bare parameter count has no FLOPs: give the model's shape (--model, --hf-config or --layers ...)"
    if plan.work is None:
        return "a step needs its tokens: give --seq-len (and --micro-batch)"
    if cluster is None:
        if gpu is None:
            return "give the GPU or the cluster to time a step"
        try:
            cal = gpu_machine(gpu).calibration
        except InputError as e:
            return f"no step time for this GPU: {e}"
        return _missing_dtype(cal, _MATMUL_DTYPE[plan.precision.compute_dtype], plan.float8 != "none")
    return None


# The precision to suggest where the GPU lacks the one asked for: its matmuls then run in a dtype it has.
_PRECISION_FOR = {"fp16": "fp16-mixed or amp-fp16", "bf16": "bf16-mixed or amp-bf16", "tf32": "fp32"}


def _missing_dtype(cal: Any, dtype: str, float8: bool) -> str | None:
    """Why the GPU cannot time matmuls in ``dtype`` (or fp8, under float8), or None."""
    have = [d for d, _ in cal.peak_flops]
    for want in (dtype, "fp8") if float8 else (dtype,):
        if want not in have:
            hint = "; ".join(f"--precision {_PRECISION_FOR[d]}" for d in have if d in _PRECISION_FOR)
            return (f"{cal.gpu} has no {want} tensor cores (its datasheet gives {', '.join(have)}), so a step in "
                    f"{want} is not timed" + (f"; to time one, give {hint}" if hint else ""))
    return None


SMALLEST_RATE = 1e-3
"""The least link rate (GB/s, Gb/s) or efficiency accepted: 1 MB/s, 0.1 % of a link."""


def _positive(name: str, value: float | None, fraction: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} = {value!r} must be a positive number")
    if value < SMALLEST_RATE:  # a denormal rate makes bytes / rate overflow to inf, and the step's sums NaN
        raise InputError(f"{name} = {value!r} is below {SMALLEST_RATE}; give "
                         + ("a fraction in [0.001, 1]" if fraction else "the link's rate (GB/s; Gb/s for the network)"))
    if fraction and value > 1:
        raise InputError(f"{name} = {value!r} is above 1; give a fraction of the link's nominal bandwidth in (0, 1]")


@cache
def machine_for(cluster: str | Machine, ranks_per_node: int, intra_node_gbps: float | None = None,
                network_gbits_per_gpu: float | None = None, intra_node_efficiency: float | None = None,
                network_efficiency: float | None = None, pcie_gbps: float | None = None,
                host_memory_gbps: float | None = None) -> Machine:  # fmt: skip
    """The cluster preset with its own GPU's calibration (or a machine, ``gpu_machine``'s), the plan's GPUs per node
    (CPU Adam and NVMe share a node among the ranks in it) and the user's link overrides. A new NVLink bandwidth drops
    the preset's measured NVLink SHARP all-reduce rate, which belongs to the preset's switch."""
    base = load_machine(cluster) if isinstance(cluster, str) else cluster
    c, cal = base.cluster, base.calibration
    intra, net = c.intra_node, c.network
    if intra_node_gbps is not None:
        intra = replace(intra, bandwidth=intra_node_gbps * 1e9)
        cal = replace(cal, intra_node_allreduce_bytes_per_s=None)
    if network_gbits_per_gpu is not None:
        net = replace(net, bandwidth=network_gbits_per_gpu * 1e9 / 8)
    if intra_node_efficiency is not None:
        cal = replace(cal, intra_node_efficiency=intra_node_efficiency)
    if network_efficiency is not None:
        cal = replace(cal, network_efficiency=network_efficiency)
    host = c.host_memory_bytes_per_s if host_memory_gbps is None else host_memory_gbps * 1e9
    pcie = c.pcie_bytes_per_s if pcie_gbps is None else pcie_gbps * 1e9
    c = replace(c, gpus_per_node=ranks_per_node, intra_node=intra, network=net, pcie_bytes_per_s=pcie,
                host_memory_bytes_per_s=host)  # fmt: skip
    return Machine(c, cal)


def step_plan(plan: LayoutPlan, optimizer_impl: str = "foreach", flops_attention: str = "full",
              recompute: str | None = None) -> Plan:
    """The step model's plan from the core's: layout, batch, recompute, kernels, dtype and optimizer. ``recompute``
    replaces the plan's policy in time only: "op" is torchtitan's per-op selective AC (memcalc.time.flops)."""
    if recompute is not None:
        policy_name(recompute)
    if optimizer_impl not in OPTIMIZER_IMPLS:
        raise InputError(f"optimizer implementation {optimizer_impl!r} is not one of "
                         f"{', '.join(OPTIMIZER_IMPLS)}{did_you_mean(optimizer_impl, OPTIMIZER_IMPLS)}")  # fmt: skip
    w = plan.work
    assert w is not None
    fw = composition(plan.framework)
    autocast, impl = plan.precision.autocast, "cpu" if plan.optimizer_device != "none" else optimizer_impl
    attention, elementwise, host_f, host_b, host_o, expands = framework_kernels(
        fw.model_code, w.compile, autocast, _ATTENTION[w.attention], plan.tp > 1 and fw.dtensor_tp,
        plan.spec.shards_params and plan.fsdp_version == 2, impl)  # fmt: skip
    return Plan(
        gpus=plan.gpus, seq=w.seq_len, micro_batch=w.micro_batch, micro_batches=plan.grad_accum, tp=plan.tp,
        pp=plan.pp, cp=plan.cp, ep=plan.ep, virtual=plan.virtual_stages, sp=plan.sequence_parallel,
        recompute=w.recompute if recompute is None else recompute,
        attention=attention, dtype=_MATMUL_DTYPE[plan.precision.compute_dtype],
        dropout=w.dropout > 0, optimizer=impl,
        optimizer_params=optimizer_params(plan), optimizer_state_bytes=plan.precision.state_bytes,
        flops_attention=flops_attention, stage_layers=plan.stage_layers,
        float8=plan.float8, elementwise=elementwise, residual_bytes=4 if autocast else 0,
        sliding="masked" if w.attention == "sdpa" else "window", **_lora_fields(plan),
        gather_units=1 if plan.fsdp_auto_wrap == "none" and plan.spec.shards_params else 0,
        host_forward_s=host_f, host_backward_s=host_b, host_optimizer_s=host_o,
        cp_kv_factor=plan.arch.heads / plan.arch.n_kv if expands else 1.0,
        tp_overlap=overlaps_tp(fw.model_code, plan.tp, plan.sequence_parallel),
    )  # fmt: skip


def _lora_fields(plan: LayoutPlan) -> dict:
    """The step model's LoRA fields: a frozen base, and the adapters' forward FLOPs per token per layer."""
    if plan.lora is None or plan.arch is None:
        return {}
    from memcalc.model.lora import targeted

    flops = sum(2 * plan.lora.rank * (p.fan_in + p.fan_out) for p in targeted(plan.arch, plan.lora))
    return {"frozen_base": True, "lora_flops_per_token": flops}


def time_evaluation(
    ev: Any,
    *,
    gpu: Any = None,
    cluster: str | None = None,
    optimizer_impl: str = "foreach",
    flops_attention: str = "full",
    intra_node_gbps: float | None = None,
    network_gbits_per_gpu: float | None = None,
    intra_node_efficiency: float | None = None,
    network_efficiency: float | None = None,
    pcie_gbps: float | None = None,
    host_memory_gbps: float | None = None,
    recompute: str | None = None,
) -> StepTime | None:
    """One optimizer step of ``ev`` (a ``memcalc.evaluate.Evaluation``) on one GPU of the slowest pipeline stage.

    The machine: ``cluster`` (a preset name, alias or TOML path, with its own GPU), else the first cluster preset
    built from ``gpu`` (a preset name, TOML path or GPU record), else a generic node and a calibration derived from its
    datasheet (``memcalc.time.datasheet``). Link overrides: NVLink GB/s per GPU per direction, network
    Gb/s per GPU, fractions of those reached by large collectives, PCIe GB/s per direction, host-memory GB/s per
    node (achievable, e.g. STREAM's; the preset's is its theoretical rate x its host_memory_efficiency).
    Returns None when there is nothing to time; ``time_unavailable`` says why in one line.
    The optimizer is timed as AdamW (28 B per parameter), whichever optimizer the plan names."""
    for name, value, frac in (("intra_node_gbps", intra_node_gbps, False),
                              ("network_gbits_per_gpu", network_gbits_per_gpu, False),
                              ("intra_node_efficiency", intra_node_efficiency, True),
                              ("network_efficiency", network_efficiency, True), ("pcie_gbps", pcie_gbps, False),
                              ("host_memory_gbps", host_memory_gbps, False)):  # fmt: skip
        _positive(name, value, frac)
    if cluster is not None:
        load_cluster(cluster)  # an unknown name fails here, with the known ones listed
    elif gpu is None:
        raise InputError(f"give the GPU or the cluster to time a step; clusters: {', '.join(cluster_names())}")
    if time_unavailable(ev, gpu=gpu, cluster=cluster) is not None:
        return None
    plan = ev.plan
    base = cluster if cluster is not None else gpu_machine(gpu)
    machine = machine_for(base, plan.ranks_per_node, intra_node_gbps, network_gbits_per_gpu, intra_node_efficiency,
                          network_efficiency, pcie_gbps, host_memory_gbps)  # fmt: skip
    sp = step_plan(plan, optimizer_impl, flops_attention, recompute)
    return step_time(plan.arch, sp, machine, placed(ev.collectives, plan), ev.transfers)


def time_fields(st: StepTime | None, *, flops_attention: str = "full", tokens: float | None = None,
                price_per_gpu_hour: float | None = None) -> dict[str, Any] | None:  # fmt: skip
    """Plain JSON-ready numbers (floats, seconds) of a step time; ``tokens`` to train on gives the time to train,
    and with ``price_per_gpu_hour`` the cost, in whatever currency the price is given in."""
    for name, value in (("tokens", tokens), ("price_per_gpu_hour", price_per_gpu_hour)):
        if value is None:
            continue
        least = "positive" if name == "tokens" else "non-negative"
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
                or (name == "tokens" and value == 0)):  # fmt: skip
            raise InputError(f"{name} = {value!r} must be a {least} number")
    if price_per_gpu_hour is not None and tokens is None:
        raise InputError("price_per_gpu_hour needs tokens: the cost is that of training on them (give --tokens)")
    if flops_attention not in FLOP_CONVENTIONS:
        raise InputError(f"attention count {flops_attention!r} is not one of {', '.join(FLOP_CONVENTIONS)}")
    if st is None:
        if tokens is not None:
            raise InputError("tokens need a step time: give the model's shape (--model, --hf-config) and --seq-len")
        return None
    train_s = None if tokens is None else float(tokens) / st.tokens_per_s
    cost = None
    if train_s is not None and price_per_gpu_hour is not None:
        cost = float(price_per_gpu_hour) * st.gpus * train_s / 3600  # price per GPU-hour x GPUs x hours
    return {
        "step_s": float(st.step_s),
        "tokens_per_step": float(st.tokens_per_step),
        "tokens_per_s": float(st.tokens_per_s),
        "tokens_per_s_per_gpu": float(st.tokens_per_s_per_gpu),
        "model_tflops_per_gpu": float(st.model_tflops_per_gpu),
        "peak_tflops_per_gpu": float(st.peak_flops / 1e12),
        "mfu": float(st.mfu),
        "hfu": float(st.hfu),
        "flop_convention": FLOP_CONVENTIONS[flops_attention],
        "breakdown": {
            "compute_s": float(st.compute_s),
            "memory_bound_s": float(st.memory_bound_s),
            "recompute_s": float(st.recompute_s),
            "communication_s": {g: float(t) for g, t in st.communication_s},
            "bubble_s": float(st.bubble_s),
            "optimizer_s": float(st.optimizer_s),
            "offload_s": float(st.offload_s),
            "host_s": float(st.host_s),
        },
        "time_to_train_s": train_s,
        "cost": cost,
        "cost_currency": "the currency price_per_gpu_hour is given in",
    }


def breakdown_sum(fields: dict[str, Any]) -> float:
    """The breakdown's parts added up (equal to ``step_s``)."""
    b = fields["breakdown"]
    return sum(v for k, v in b.items() if k != "communication_s") + sum(b["communication_s"].values())
