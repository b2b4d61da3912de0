"""Per-step communication of data-parallel strategies: which collectives, on which group, how big.

Source: ZeRO (arXiv 1910.02054) §7.2: DDP all-reduces gradients (reduce-scatter Ψ + all-gather Ψ =
2Ψ); P_os and P_os+g reduce-scatter gradients (Ψ) and all-gather updated parameters (Ψ) = 2Ψ;
P_os+g+p all-gathers parameters in forward (Ψ) and again in backward (Ψ) and reduce-scatters
gradients (Ψ) = 3Ψ. FSDP (arXiv 2304.11277) §3.2-3.3: FULL_SHARD = 3Ψ, SHARD_GRAD_OP = all-gather in
forward + reduce-scatter; hybrid sharding reduce-scatters inside the shard group and all-reduces
each GPU's 1/F gradient shard across the R = W/F replicas.
"""

from __future__ import annotations

from typing import NamedTuple

from memcalc.comm.collectives import CollectiveOp, sent_bytes_per_rank
from memcalc.layout.strategies import StrategySpec, shard_numel
from memcalc.units import ceil_div


class Collective(NamedTuple):
    """One collective issued every optimizer step, as one GPU sees it (the fields of
    ``memcalc.report.results.Collective``, where each is documented). Byte counts are per step."""

    op: str
    phase: str
    tensor: str
    group: str
    group_size: int
    crosses_nodes: bool
    link: str
    dtype: str
    calls_per_step: int
    payload_bytes_per_call: int
    payload_bytes: int
    sent_bytes_per_gpu: int


class HostTransfer(NamedTuple):
    """A copy between GPU memory and host RAM, or host RAM and NVMe, per GPU per step
    (``memcalc.report.results.HostTransfer``)."""

    op: str
    phase: str
    tensor: str
    link: str
    calls_per_step: int
    bytes_per_call: int
    bytes: int


def _group_crosses_nodes(span: int, gpus_per_node: int) -> bool:
    """A group whose ranks spread over more consecutive GPUs than one node holds must use the network.

    Ranks are laid out as Megatron-LM does (tp fastest, then cp, then dp, then pp): a group of ``size``
    members ``stride`` ranks apart spans size x stride ranks.
    """
    return span > gpus_per_node


def collective(
    op: CollectiveOp,
    phase: str,
    tensor: str,
    group: str,
    n: int,
    crosses_nodes: bool,
    intra_link: str,
    dtype: str,
    payload_bytes_per_call: int,
    calls: int,
) -> Collective:
    per_call_sent = sent_bytes_per_rank(op, payload_bytes_per_call, n)
    return Collective(op, phase, tensor, group, n, crosses_nodes, "network" if crosses_nodes else intra_link, dtype,
                      calls, payload_bytes_per_call, payload_bytes_per_call * calls, per_call_sent * calls)


def data_parallel_collectives(
    psi: int,
    spec: StrategySpec,
    n: int,
    replicas: int,
    world: int,
    gpus_per_node: int,
    param_bytes: int,
    grad_bytes: int,
    dtype: str,
    grad_accum: int,
    intra_link: str,
    stride: int = 1,
    trainable: int | None = None,
    gathered_bytes: int | None = None,
    kept_gathered: bool = False,
    grad_dtype: str | None = None,
    whole: bool = False,
) -> list[Collective]:
    """Collectives one GPU takes part in per optimizer step.

    ``trainable`` (default Ψ) is the elements that have gradients to reduce and ``gathered_bytes`` (default
    Ψ x param bytes) what one all-gather of the parameters carries: under LoRA only the adapters are reduced, while
    ZeRO-3/FSDP gather the frozen base (NF4-packed under QLoRA) with them. (FSDP1 with one flat parameter mixing
    frozen and trainable weights reduces the flat gradient, zeros included; peft's FSDP recipes wrap the adapters
    apart from the base, which this follows.) ``kept_gathered``: FSDP2 inside pipeline stages (``memcalc.memory.accountings.paper
    .fsdp_under_pipeline``) gathers each unit once per step and reduce-scatters once, after the last micro-batch.
    ``grad_dtype``: the dtype gradients are reduced in when it is not ``dtype`` (``grad_bytes`` per element).
    ``whole``: FSDP without an auto-wrap policy (accelerate's NO_WRAP): the root holds the layers and is never
    resharded after forward (FSDP1 ``_post_forward_reshard``, FSDP2's root ``reshard_after_forward=False``), so the
    parameters are gathered once per micro-batch, in forward, and not again in backward (2Ψ, not FULL_SHARD's 3Ψ;
    the embedding's unit FSDP2 regathers in backward is left out).

    ``n`` is the shard group (ZeRO's N; 1 when nothing is sharded), ``replicas`` the copies across
    which hybrid strategies all-reduce. Gathered/scattered tensors are padded to ⌈Ψ/n⌉·n elements,
    as the flat buffers the frameworks shard are. Groups of one rank send nothing and are left out.
    ``world`` is the size of the group that reduces gradients: dp x cp ranks standing ``stride`` = tp apart when
    the frameworks' flattened data x context group shards (torchtitan ``dp_shard_cp``, Megatron-LM's data-parallel
    group with context parallelism; ``memcalc.layout.compose``), else dp ranks standing tp x cp apart.
    """
    rows: list[Collective] = []
    sharded = spec.shards_params or spec.shards_grads or spec.shards_optimizer
    micro = grad_accum if spec.reduce_each_micro_batch else 1
    grads = psi if trainable is None else trainable
    gdt = grad_dtype or dtype
    gather = spec.param_gather
    if kept_gathered:
        gather, grad_accum, micro = "forward", 1, 1
    elif whole and gather == "forward_and_backward":
        gather = "forward"

    if not sharded:
        # DDP / ZeRO-0 / NO_SHARD: one all-reduce of all gradients per step (accumulated under no_sync).
        if world > 1:
            rows.append(
                collective("all-reduce", "backward", "gradients", "data-parallel", world,
                           _group_crosses_nodes(world * stride, gpus_per_node), intra_link, gdt, grads * grad_bytes, micro)
            )  # fmt: skip
        return rows

    group = "shard group" if spec.hybrid else "data-parallel"
    padded = shard_numel(psi, n) * n
    gathered = padded * param_bytes if gathered_bytes is None else ceil_div(gathered_bytes, n) * n
    reduced = shard_numel(grads, n) * n * grad_bytes
    crosses = _group_crosses_nodes(n * stride, gpus_per_node)
    # Appended in step order (forward, backward, optimizer step), as ``in_step_order`` would sort them.
    if n > 1:
        if gather in ("forward", "forward_and_backward"):
            rows.append(
                collective("all-gather", "forward", "parameters", group, n, crosses, intra_link, dtype,
                           gathered, grad_accum)
            )  # fmt: skip
        if gather == "forward_and_backward":
            rows.append(
                collective("all-gather", "backward", "parameters", group, n, crosses, intra_link, dtype,
                           gathered, grad_accum)
            )  # fmt: skip
        rows.append(
            collective("reduce-scatter", "backward", "gradients", group, n, crosses, intra_link, gdt,
                       reduced, micro)
        )  # fmt: skip
    if spec.hybrid and replicas > 1:
        # Each GPU all-reduces its 1/n gradient shard with the same shard on the other replicas; the
        # replica group's members stand n ranks apart, so it spans the whole world.
        rows.append(
            collective("all-reduce", "backward", "gradients", "replica group", replicas,
                       _group_crosses_nodes(world * stride, gpus_per_node), intra_link, gdt,
                       shard_numel(grads, n) * grad_bytes, micro)
        )  # fmt: skip
    if n > 1 and gather == "after_step":
        rows.append(
            collective("all-gather", "optimizer step", "parameters", group, n, crosses, intra_link, dtype,
                       shard_numel(grads, n) * n * param_bytes, 1)
        )  # fmt: skip
    return rows


def model_parallel_collectives(
    *,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    dp: int,
    sp: bool,
    stage: int,
    virtual: int,
    layers: int,
    moe_layers: int,
    tokens: int,
    hidden: int,
    kv_width: int,
    top_k: int,
    act_bytes: int,
    dtype: str,
    micro_batches: int,
    full_recompute: bool,
    gpus_per_node: int,
    intra_link: str,
) -> list[Collective]:
    """Tensor, pipeline, context and expert parallelism traffic of one GPU (of pipeline stage ``stage``) per step.

    ``layers`` and ``moe_layers`` are this stage's; ``tokens`` = s/cp x b of one micro-batch.
    - TP (Megatron-LM, arXiv 1909.08053 §3): per layer 2 all-reduces of s·b·h in forward (after attention and
      MLP) and 2 in backward; with sequence parallelism (arXiv 2205.05198 §4.2.2) each becomes an all-gather
      + reduce-scatter pair of the same volume. Full recompute runs the forward's collectives again.
    - PP: one point-to-point send of the s·b·h activation per micro-batch and model chunk forward (not from
      the last stage) and of its gradient backward (not from the first); s·b·h/t under sequence parallelism.
    - CP: K and V all-gathered along the sequence in forward and again in backward, dK/dV reduce-scattered.
    - EP (MoE): two all-to-alls (dispatch, combine) of top_k·s·b·h per MoE layer forward, two backward.
    """
    rows: list[Collective] = []
    if tp == pp == cp == ep == 1:
        return rows
    m = micro_batches
    act = tokens * hidden * act_bytes
    if tp > 1 and layers:
        crosses = _group_crosses_nodes(tp, gpus_per_node)
        fwd = 2 * layers * m * (2 if full_recompute else 1)
        bwd = 2 * layers * m
        if sp:
            for phase, calls in (("forward", fwd), ("backward", bwd)):
                rows.append(collective("all-gather", phase, "activations", "tensor-parallel", tp, crosses, intra_link,
                                       dtype, act, calls))  # fmt: skip
                rows.append(collective("reduce-scatter", phase, "activations", "tensor-parallel", tp, crosses,
                                       intra_link, dtype, act, calls))  # fmt: skip
        else:
            rows.append(collective("all-reduce", "forward", "activations", "tensor-parallel", tp, crosses, intra_link,
                                   dtype, act, fwd))  # fmt: skip
            rows.append(collective("all-reduce", "backward", "activation grads", "tensor-parallel", tp, crosses,
                                   intra_link, dtype, act, bwd))  # fmt: skip
    if cp > 1 and layers:
        crosses = _group_crosses_nodes(cp * tp, gpus_per_node)
        kv = tokens * cp * kv_width // tp * act_bytes * 2  # K and V of the whole sequence, this TP rank's heads
        rows.append(collective("all-gather", "forward", "K, V", "context-parallel", cp, crosses, intra_link, dtype,
                               kv, layers * m))  # fmt: skip
        rows.append(collective("all-gather", "backward", "K, V", "context-parallel", cp, crosses, intra_link, dtype,
                               kv, layers * m))  # fmt: skip
        rows.append(collective("reduce-scatter", "backward", "dK, dV", "context-parallel", cp, crosses, intra_link,
                               dtype, kv, layers * m))  # fmt: skip
    if ep > 1 and moe_layers:
        crosses = _group_crosses_nodes(ep * tp * cp, gpus_per_node)
        tokens_out = top_k * tokens * hidden * act_bytes
        rows.append(collective("all-to-all", "forward", "tokens", "expert-parallel", ep, crosses, intra_link, dtype,
                               tokens_out, 2 * moe_layers * m))  # fmt: skip
        rows.append(collective("all-to-all", "backward", "token grads", "expert-parallel", ep, crosses, intra_link,
                               dtype, tokens_out, 2 * moe_layers * m))  # fmt: skip
    if pp > 1:
        # Neighbouring stages stand tp x cp x dp ranks apart; a send crosses nodes when the two stages' ranks sit in
        # different nodes. Interleaved chunks also wrap around from the last stage to the first.
        stride = tp * cp * dp
        node = lambda k: (k % pp) * stride // gpus_per_node  # noqa: E731
        p2p = act // tp if sp else act
        sends_fwd = m * virtual if (virtual > 1 or stage < pp - 1) else 0
        sends_bwd = m * virtual if (virtual > 1 or stage > 0) else 0
        for phase, what, calls, peer in (("forward", "activations", sends_fwd, stage + 1),
                                          ("backward", "activation grads", sends_bwd, stage - 1)):  # fmt: skip
            crosses = node(stage) != node(peer)
            if calls:
                rows.append(Collective(op="send", phase=phase, tensor=what, group="pipeline", group_size=2,  # type: ignore[arg-type]
                                       crosses_nodes=crosses, link="network" if crosses else intra_link, dtype=dtype,
                                       calls_per_step=calls, payload_bytes_per_call=p2p, payload_bytes=p2p * calls,
                                       sent_bytes_per_gpu=p2p * calls))  # fmt: skip
    return rows


def in_step_order(rows: list[Collective]) -> list[Collective]:
    """Forward, backward, optimizer step; stable inside a phase (gather before reduce)."""
    return sorted(rows, key=_step_order)


_PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer step": 2}


def _step_order(row: Collective) -> int:
    return _PHASE_ORDER[row.phase]


def host_transfers(
    psi: int,
    spec: StrategySpec,
    n: int,
    param_bytes: int,
    grad_bytes: int,
    optimizer_state_bytes: int,
    optimizer_device: str,
    param_device: str,
    grad_accum: int,
    trainable: int | None = None,
) -> list[HostTransfer]:
    """Copies between GPU and host (PCIe) and host and NVMe that offload adds, per GPU per step.

    ``trainable``: the elements that train where fewer than Ψ do (LoRA's adapters): only their gradients go to the
    host and only their updated partitions come back; offloaded parameters are still fetched whole.

    ZeRO-Offload (arXiv 2101.06840) §4.1: per step each rank sends its fp16 gradient partition to
    the CPU and receives its updated fp16 parameter partition: 2Ψ/N + 2Ψ/N bytes (4Ψ on one GPU).
    ZeRO-Infinity (arXiv 2104.07857) §5: offloaded parameters are fetched for every gather, and
    optimizer states on NVMe are read and written back once per step.
    """
    if param_device == "none" and optimizer_device == "none":
        return []
    rows: list[HostTransfer] = []

    def add(op: str, phase: str, tensor: str, per_call: int, calls: int) -> None:
        link = "nvme" if op.startswith("nvme") else "pcie"
        rows.append(
            HostTransfer(op=op, phase=phase, tensor=tensor, link=link, calls_per_step=calls,  # type: ignore[arg-type]
                         bytes_per_call=per_call, bytes=per_call * calls)
        )  # fmt: skip

    t = psi if trainable is None else trainable
    grad_shard = shard_numel(t, n) * grad_bytes if spec.shards_optimizer else t * grad_bytes
    param_shard = shard_numel(t, n) * param_bytes if spec.shards_params or spec.shards_optimizer else t * param_bytes
    resident_params = shard_numel(psi, n) * param_bytes if spec.shards_params else psi * param_bytes
    reduces = grad_accum if spec.reduce_each_micro_batch else 1

    if param_device != "none":
        # Fetched for every gather: forward, and backward too where they were freed after forward.
        phases = ["forward", "backward"] if spec.param_gather == "forward_and_backward" else ["forward"]
        for phase in phases:
            if param_device == "nvme":
                add("nvme-read", phase, "parameters", resident_params, grad_accum)
            add("host-to-device", phase, "parameters", resident_params, grad_accum)
    if optimizer_device != "none":
        add("device-to-host", "backward", "gradients", grad_shard, reduces)
        if param_device == "none":
            # The updated low-precision partition comes back to the GPU after the CPU step.
            add("host-to-device", "optimizer step", "parameters", param_shard, 1)
        if optimizer_device == "nvme":
            add("nvme-read", "optimizer step", "optimizer states", optimizer_state_bytes, 1)
            add("nvme-write", "optimizer step", "optimizer states", optimizer_state_bytes, 1)
        if param_device == "nvme":
            add("nvme-write", "optimizer step", "parameters", resident_params, 1)
    return rows
