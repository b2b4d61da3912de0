"""How long one training step takes on one rank of the slowest pipeline stage, and what it implies (MFU, HFU).

Sources and rules (each also in docs/performance-model.md):
- Matmul time = FLOPs / (peak x GEMM efficiency at that GEMM's FLOPs); attention core = FLOPs / (peak x kernel
  efficiency); backward = 2 x forward (flash/cuDNN: the measured fwd+bwd = 3.5 x forward FLOPs); both curves from
  presets/calibration (measured H100 kernels). Memory-bound ops (norms, residual adds, dropout, activations, rotary,
  eager softmax, cross-entropy) = bytes moved / achievable HBM bandwidth; their backward moves twice the forward bytes.
- Recompute (Korthikanti et al. 2022, §5): full adds each layer's forward again; selective adds the attention core;
  op (torchtitan's per-op selective AC) adds every second weight matmul (k, o, up) and every memory-bound forward op,
  keeping the attention output (torchtitan parallelize_llama.py: save list = mm, SDPA flash/efficient, reduce-scatter).
- Pipeline (Narayanan et al. 2021, §2.2): 1F1B bubble = (p-1) x (time of one micro-batch on a stage), interleaved
  (p-1)/v x it; the slowest stage (uneven layer split, output head and loss on the last) sets the pace.
- Overlap (DOMAIN.md §11): tensor-parallel, expert all-to-all and pipeline send/recv are on the critical path of every
  micro-batch; context-parallel K/V exchange hides behind attention; DDP/ZeRO-1/2 gradient buckets hide behind the
  last micro-batch's backward except the last bucket; FSDP/ZeRO-3 prefetch one unit (layer) ahead, exposing
  max(0, comm - compute) per unit plus the first gather and last reduce-scatter.
- Host (memcalc.time.kernels): the launches of each layer's kernels, FSDP2's hooks and eager DTensor's dispatch are
  a floor under the GPU's time: exposed = max(0, host - GPU) over forward + backward, the same for the optimizer
  step, plus the first layer's launches after the step's sync.
- Optimizer: AdamW moves 28 B/param (read p, g, m, v; write p, m, v: 16 + 12) at the measured fraction of HBM
  bandwidth (fused vs foreach); on the CPU (offload) at the node's host-memory bandwidth shared by its GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import cache, lru_cache
from operator import attrgetter
from typing import Any

from memcalc.comm.timing import Group, primitive_time
from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.model.params import model_params
from memcalc.time.flops import layer_policy, layer_window, policy_name, step_flops
from memcalc.time.hardware import Calibration, Machine
from memcalc.time.layer import LayerTime, gemm_s, head_time, layer_time

DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel bucket_cap_mb=25 (the last bucket cannot overlap)
ADAMW_BYTES_PER_PARAM = 28  # fp32 AdamW: read param, grad, m, v (16) + write param, m, v (12); half in pure bf16
_DP_GROUPS = ("data-parallel", "shard group", "replica group")
_CRITICAL_GROUPS = ("tensor-parallel", "expert-parallel", "pipeline")


@frozen
class Plan:
    """One parallel layout and batch, as plain numbers."""

    gpus: int
    seq: int
    micro_batch: int
    micro_batches: int = 1
    """Micro-batches per optimizer step on each rank (gradient accumulation; the pipeline's m)."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    virtual: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B when > 1)."""
    sp: bool = False
    recompute: str = "none"
    attention: str = "flash"
    """flash | cudnn | te (cuDNN where the GPU has its curve, else flash: ``memcalc.time.kernels``) | eager
    (materialised scores, softmax in HBM)."""
    dtype: str = "bf16"
    dropout: bool = False
    optimizer: str = "fused"
    """fused | foreach (torch AdamW on the GPU) | cpu (offloaded, DeepSpeed CPUAdam)."""
    optimizer_state_bytes: int = 4
    """Bytes per element of the parameters, gradients and moments a GPU optimizer step reads and writes: 4 (fp32
    weights, or a master copy), 2 under pure bf16 (torch AdamW keeps its moments in the parameters' dtype): the
    step moves 7 x this per parameter."""
    optimizer_params: int | None = None
    """Parameters this rank's optimizer updates; default Ψ/(tp·pp) (nothing sharded over data parallelism)."""
    flops_attention: str = "full"
    """Attention convention of the reported model FLOPs: full (Megatron, PaLM, torchtitan) or causal."""
    stage_layers: tuple[int, ...] | None = None
    """Decoder layers of each model chunk (pp x virtual entries; chunk c runs on pipeline rank c % pp, as
    memcalc.layout.compose.rank_layers places them); None: divmod, the first stages taking one more layer."""
    float8: str = "none"
    elementwise: str = "fused"
    residual_bytes: int = 0
    """Bytes per element of the residual stream the norms read (0: the compute dtype's; 4 under autocast)."""
    sliding: str = "window"
    """How a sliding-window layer's attention kernel runs (Gemma 2 and 3): window (it skips the keys outside the
    window: FlashAttention-2's ``window_size``, flex attention) or masked (SDPA handed the sliding mask, which
    transformers passes once s ≥ the window: the kernel computes every query-key pair)."""
    """How the model code runs its norms and rotary embedding: fused (one read and one write per element: Megatron's
    fused kernels, torch's fused rms_norm, torch.compile), hf (Hugging Face's eager Python ops), torchtitan (torch's
    fused rms_norm, eager complex rotary): ``elementwise_bytes``."""
    """none, tensorwise or rowwise: the decoder layers' linears run their three GEMMs at the fp8 rate and pay the
    casts' memory traffic (``memcalc.model.float8``); attention and the head stay in ``dtype``."""
    frozen_base: bool = False
    """LoRA: the base weights are frozen, so backward runs only the input-gradient GEMM of each weight matmul
    (derivatives.yaml ``mm``: ``mat2``'s gradient only when it requires grad): backward = 1x forward, not 2x."""
    lora_flops_per_token: int = 0
    """Forward FLOPs per token of one layer's adapters: 2·r·(in + out) per target (x·A, then ·B); their backward is
    2x (input and weight gradients), like any trainable matmul."""
    gather_units: int = 0
    """The units sharded parameters are gathered and reduced in; 0: one per decoder layer, each gathered while the
    one before it computes. 1: the whole model (FSDP without an auto-wrap policy): its all-gather before the
    forward and its reduce-scatter after the backward have nothing to hide behind."""
    cp_kv_factor: float = 1.0
    """K and V as the context-parallel ring passes them, against the model's KV heads: heads / kv_heads where the
    model code expands K/V to the query heads before attention (``memcalc.time.kernels.Kernels.expands_kv``)."""
    host_forward_s: float = 0.0
    """Host seconds to launch one decoder layer's forward for one micro-batch (``memcalc.time.kernels``: launches x
    host per launch, FSDP2's hooks, eager DTensor); 0: the host is not modelled."""
    host_backward_s: float = 0.0
    """The same for its backward."""
    host_optimizer_s: float = 0.0
    """Host seconds to launch the optimizer step."""
    tp_overlap: bool = False
    """Tensor-parallel all-gathers and reduce-scatters overlapped with the GEMMs beside them, as Transformer Engine's
    userbuffers run them (``memcalc.time.kernels.Kernels.tp_overlap``; needs sequence parallelism): ``_tp_exposed``."""

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)




@frozen
class StepTime:
    """One optimizer step on one GPU of the slowest pipeline stage. Seconds unless named otherwise."""

    compute_s: float
    """Matmuls and attention, forward and backward, all micro-batches (no recompute)."""
    memory_bound_s: float
    """Norms, activations, residual adds, dropout, softmax, loss."""
    recompute_s: float
    communication_s: tuple[tuple[str, float], ...]
    """Exposed (not hidden behind compute) communication per group."""
    bubble_s: float
    optimizer_s: float
    offload_s: float
    """Exposed host (PCIe) and NVMe transfers."""
    tokens_per_step: int
    gpus: int
    model_flops: int
    hardware_flops: int
    peak_flops: float
    host_s: float = 0.0
    """Time the GPU waits for the host to launch its kernels (``memcalc.time.kernels``): max(0, host - GPU) over the
    forward and backward and over the optimizer step, plus the first layer's launches after the step's sync."""

    @property
    def exposed_communication_s(self) -> float:
        return sum(t for _, t in self.communication_s)

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.memory_bound_s + self.recompute_s + self.exposed_communication_s + self.bubble_s
                + self.optimizer_s + self.offload_s + self.host_s)  # fmt: skip

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_s / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_s * self.gpus * self.peak_flops)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.step_s * self.gpus * self.peak_flops)





_UNREAD_BY_PROFILE = ("gpus", "micro_batches", "optimizer", "optimizer_state_bytes", "optimizer_params",
                      "flops_attention", "gather_units", "tp_overlap")
"""Step-plan fields ``_stage_profile`` does not read: plans that differ only in them (another sharding strategy,
another accumulation count) share one profile."""
_PROFILE_KEY = attrgetter(*(f.name for f in dataclasses.fields(Plan) if f.name not in _UNREAD_BY_PROFILE))
_profiles: dict[tuple, tuple[float, float, float, float, float, float, int]] = {}


def _shared_profile(arch: Architecture, cal: Calibration, plan: Plan) -> tuple[float, float, float, float, float,
                                                                                 float, int]:  # fmt: skip
    """``_stage_profile``, computed once for plans that differ only in fields it does not read."""
    key = (arch, cal, _PROFILE_KEY(plan))
    hit = _profiles.get(key)
    if hit is None:
        if len(_profiles) >= 8192:  # bounded: a long-running process does not grow without end
            _profiles.clear()
        hit = _profiles[key] = _stage_profile(arch, cal, plan)
    return hit


def _stage_profile(arch: Architecture, cal: Calibration, plan: Plan) -> tuple[float, float, float, float, float, float, int]:
    """(compute, memory, recompute, fwd, bwd, attention) seconds per micro-batch on the slowest stage, and its layers."""
    p = plan
    if p.stage_layers is None and arch.layers < p.pp * p.virtual:
        raise InputError(f"layers({arch.layers}) < pp({p.pp}) x virtual({p.virtual}); give fewer stages")
    ranks = _stage_kinds(arch, p.pp, p.stage_layers, p.recompute)
    best: tuple[float, float, float, float, float, float, int] | None = None
    kinds: dict[tuple[bool, int | None], LayerTime] = {}  # a layer's time depends on its kind alone: one per kind
    terms: dict[tuple, tuple[LayerTime, float, float, float, float, float]] = {}  # and its policy: the same terms
    for stage in range(p.pp):
        n = len(ranks[stage])
        comp = mem = rec = fwd = bwd = attn = 0.0
        for kind in ranks[stage]:
            t = terms.get(kind)
            if t is None:
                lt = kinds.get(kind[:2])
                if lt is None:
                    lt = kinds[kind[:2]] = layer_time(arch, kind[0], cal, p.dtype, p.seq, p.micro_batch, p.tp, p.cp,
                                                      p.ep, p.sp, p.attention, p.dropout, p.float8, p.elementwise,
                                                      p.residual_bytes, kind[1], p.sliding)  # fmt: skip
                again = lt.recompute(kind[2])
                t = terms[kind] = (lt, 3 * lt.matmul_fwd + lt.attention_fwd + lt.attention_bwd, 3 * lt.memory_fwd,
                                   again, lt.backward + again, lt.attention_fwd + lt.attention_bwd)
            lt, c1, m1, again, b1, a1 = t
            comp += c1
            mem += m1
            rec += again
            fwd += lt.forward
            bwd += b1
            if p.frozen_base:  # no weight-gradient GEMMs for the base; the adapters' three GEMM passes instead
                ad = gemm_s(cal, cal.peak(p.dtype), p.seq // p.cp * p.micro_batch * p.lora_flops_per_token)
                comp += 3 * ad - lt.matmul_fwd
                fwd += ad
                bwd += 2 * ad - lt.matmul_fwd
            attn += a1
        if stage == p.pp - 1:
            head_mm, loss = head_time(arch, cal, p.dtype, p.seq // p.cp * p.micro_batch, p.tp)
            one = head_mm / 3  # forward, input gradient, weight gradient (a frozen head skips the last)
            passes = 2 if p.frozen_base else 3
            comp, mem, fwd, bwd = comp + passes * one, mem + loss, fwd + one + loss / 3, bwd + (passes - 1) * one + 2 * loss / 3
        row = (comp, mem, rec, fwd, bwd, attn, max(1, n))  # a stage of embedding or head alone: one unit
        if best is None or comp + mem + rec > best[0] + best[1] + best[2]:
            best = row
    assert best is not None
    return best


@lru_cache(maxsize=1024)
def _stage_kinds(arch: Architecture, pp: int, stage_layers: tuple[int, ...] | None,
                 recompute: str) -> tuple[tuple[tuple[bool, int | None, str], ...], ...]:  # fmt: skip
    """Each pipeline stage's layers, in order, by what their time depends on: (MoE?, sliding window, recompute
    policy). The plan's split, else the even one with the first stages taking one more layer where it is uneven."""
    if stage_layers is not None:
        from memcalc.layout.compose import rank_layers

        ranks = [[i for r in rank_layers(stage_layers, pp, k) for i in r] for k in range(pp)]
    else:
        base, extra = divmod(arch.layers, pp)  # uneven split: the first stages take one more layer
        bounds = [0, *(base * (k + 1) + min(k + 1, extra) for k in range(pp))]
        ranks = [list(range(bounds[k], bounds[k + 1])) for k in range(pp)]
    return tuple(tuple((arch.is_moe_layer(i), layer_window(arch, i), layer_policy(recompute, i)) for i in r)
                 for r in ranks)


def _time(c: Any, machine: Machine, size: int | None = None) -> float:
    size = c.payload_bytes_per_call if size is None else size
    per_node = getattr(c, "ranks_per_node", None)  # optional: members per node when the caller knows the stride
    key = (c.op, size, c.group_size, c.crosses_nodes, per_node)
    t = machine.memo.get(key)
    if t is None:
        group = (Group(c.group_size, per_node) if per_node else
                 Group.of(c.group_size, machine.cluster.gpus_per_node, c.crosses_nodes))  # fmt: skip
        op = "send/recv" if c.op in ("send", "recv") else c.op
        t = machine.memo[key] = primitive_time(op, size, group, machine.intra, machine.inter).time_s
    return t


@cache
def _plan_profile(arch: Architecture, cal: Calibration, plan: Plan) -> tuple[tuple[float, ...], int, int, int, float]:
    """Everything that depends only on the architecture and the plan: the stage profile, FLOPs, Ψ/(tp·pp), peak."""
    p = plan
    fl = step_flops(arch, p.seq, p.dp * p.micro_batch * p.micro_batches, p.recompute, p.flops_attention)  # type: ignore[arg-type]
    n_opt = p.optimizer_params if p.optimizer_params is not None else model_params(arch).total // (p.tp * p.pp)
    model, hardware = fl.model, fl.hardware
    if p.frozen_base:  # skipped weight gradients of the base (layers and head); the adapters' 3 passes added
        tokens = p.seq * p.dp * p.micro_batch * p.micro_batches
        delta = 3 * arch.layers * p.lora_flops_per_token * tokens - fl.layer_matmul_forward - fl.head_forward
        model, hardware = model + delta, hardware + delta
    return _shared_profile(arch, cal, p), model, hardware, n_opt, cal.peak(p.dtype)


def _tp_exposed(forward: float, backward: float, gemm: float, tp: int) -> float:
    """Seconds of tensor-parallel communication left exposed when Transformer Engine's userbuffers overlap it with
    the GEMMs (Megatron-Core with ``--tp-comm-overlap``, sequence parallelism), ``forward`` and ``backward`` its
    collectives' seconds, ``gemm`` the seconds of one GEMM pass (the forward; the backward runs two).

    transformer_engine/pytorch/module/base.py ``initialize_ub``, default methods: the forward's all-gathers before
    the qkv and fc1 GEMMs and the backward's before the proj and fc2 input-gradient GEMMs run as a ring exchange in
    ``tp`` chunks (each GEMM chunk on the chunk already received: the first chunk's wait exposed, 1/tp); the
    forward's reduce-scatters after proj and fc2 pipelined in 4 splits (the last split's reduce-scatter exposed,
    1/4); the backward's reduce-scatters of the qkv and fc1 input gradients run in bulk beside the weight-gradient
    GEMMs (hidden). Half of each phase's volume is all-gathers and half reduce-scatters (``memcalc.comm.traffic``).
    No overlap hides more than the GEMMs last: at least ``forward - gemm`` and ``backward - 2 gemm`` stay exposed.
    Left out: the 16 SMs the pipelined reduce-scatter takes from its GEMM (``num_sm``), about 2 % of the GEMMs."""
    fwd = max(forward * (1 / tp + 1 / 4) / 2, forward - gemm)
    bwd = max(backward * (1 / tp) / 2, backward - 2 * gemm)
    return fwd + bwd


def step_time(arch: Architecture, plan: Plan, machine: Machine, collectives: Iterable[Any] = (),
              host_transfers: Iterable[Any] = ()) -> StepTime:  # fmt: skip
    """Step time of ``plan`` on ``machine``; ``collectives`` are objects with ``op, phase, group, group_size,
    crosses_nodes, calls_per_step, payload_bytes_per_call`` (memcalc.report.results.Collective), ``host_transfers``
    objects with ``phase, link, bytes`` (HostTransfer)."""
    p, cal = plan, machine.calibration
    if p.gpus % (p.tp * p.pp * p.cp) or p.dp < 1:
        raise InputError(f"gpus({p.gpus}) is not a multiple of tp({p.tp}) x pp({p.pp}) x cp({p.cp})")
    if p.virtual > 1 and p.micro_batches % p.pp:
        raise InputError(f"interleaved pipeline: micro_batches({p.micro_batches}) must be a multiple of pp({p.pp}) "
                         f"(Megatron-LM's rule)")  # fmt: skip
    policy_name(p.recompute)  # an unknown policy is one line
    m = p.micro_batches
    profile, model_fl, hardware_fl, n_opt, peak = _plan_profile(arch, cal, p)
    comp, mem, rec, fwd, bwd, attn, units = profile
    units = p.gather_units or units
    per_mb = comp + mem + rec

    exposed: dict[str, float] = {}
    critical = 0.0
    dp_rows = []
    cp_total = 0.0
    tp_phase = {"forward": 0.0, "backward": 0.0}
    for c in collectives:
        if p.tp_overlap and c.group == "tensor-parallel" and c.phase in tp_phase:
            tp_phase[c.phase] += _time(c, machine) * c.calls_per_step
        elif c.group in _CRITICAL_GROUPS:
            t = _time(c, machine) * c.calls_per_step
            exposed[c.group] = exposed.get(c.group, 0.0) + t
            critical += t
        elif c.group == "context-parallel":
            size = c.payload_bytes_per_call if p.cp_kv_factor == 1 else int(c.payload_bytes_per_call * p.cp_kv_factor)
            cp_total += _time(c, machine, size) * c.calls_per_step
        elif c.group in _DP_GROUPS:
            dp_rows.append(c)
        else:
            raise InputError(f"unknown communication group {c.group!r}")
    if cp_total:
        exposed["context-parallel"] = max(0.0, cp_total - m * attn)  # the K/V ring runs beside attention
    if tp_phase["forward"] or tp_phase["backward"]:
        gemm = m * (comp - attn) / 3  # one of the three GEMM passes (forward, input and weight gradients)
        t = _tp_exposed(tp_phase["forward"], tp_phase["backward"], gemm, p.tp)
        exposed["tensor-parallel"] = exposed.get("tensor-parallel", 0.0) + t
        critical += t

    sharded = any(c.op == "all-gather" and c.phase == "forward" for c in dp_rows)
    for c in dp_rows:
        if c.phase == "optimizer step":
            exposed[c.group] = exposed.get(c.group, 0.0) + _time(c, machine) * c.calls_per_step
    if sharded:  # FSDP / ZeRO-3: one unit (layer) ahead, forward and backward
        for phase, work in (("forward", fwd), ("backward", bwd)):
            rows = [c for c in dp_rows if c.phase == phase]
            if not rows:
                continue
            each = [_time(c, machine, c.payload_bytes_per_call // units) * c.calls_per_step / m for c in rows]
            unit_comm = sum(each)
            if unit_comm == 0:  # a group of one rank (one GPU) sends nothing
                continue
            t = m * (unit_comm + (units - 1) * max(0.0, unit_comm - work / units))
            for c, u in zip(rows, each):  # attributed to groups in proportion to their share of the unit's traffic
                exposed[c.group] = exposed.get(c.group, 0.0) + t * u / unit_comm
    else:  # DDP / ZeRO-1/2: buckets reduced while the last micro-batch's backward runs
        rows = [c for c in dp_rows if c.phase == "backward"]
        if rows:
            each = [_time(c, machine) * c.calls_per_step for c in rows]
            total = sum(each)
            tail = max(_time(c, machine, min(DDP_BUCKET_BYTES, c.payload_bytes_per_call)) for c in rows)
            t = max(total - bwd, tail)
            for c, u in zip(rows, each) if total > 0 else ():  # a group of one rank sends nothing
                exposed[c.group] = exposed.get(c.group, 0.0) + t * u / total

    offload = 0.0
    per_node = machine.cluster.gpus_per_node
    for x in host_transfers:
        bw = machine.cluster.pcie_bytes_per_s if x.link == "pcie" else machine.cluster.nvme_bytes_per_s / per_node
        t = x.bytes / bw
        hide = {"forward": m * fwd, "backward": m * bwd}.get(x.phase, 0.0)
        offload += max(0.0, t - hide)

    if p.optimizer == "cpu":
        opt = n_opt * per_node * ADAMW_BYTES_PER_PARAM / machine.cluster.host_memory_bytes_per_s
    else:
        opt = n_opt * ADAMW_BYTES_PER_PARAM * p.optimizer_state_bytes / 4 / (cal.hbm_peak_bytes_per_s * cal.adamw(p.optimizer))

    bubble = (p.pp - 1) / p.virtual * (per_mb + critical / m) if p.pp > 1 else 0.0
    host = 0.0
    if p.host_forward_s or p.host_backward_s:
        # the host queues kernels ahead of the GPU and only shows where it falls behind: its launches for the
        # stage's layers (a fully recomputed forward launched again) against the GPU's time for the same work; and
        # after the step's sync (loss.item(), the optimizer) the queue is empty until the first layer is launched
        again = p.host_forward_s if p.recompute == "full" else 0.0
        launched = m * profile[6] * (p.host_forward_s + p.host_backward_s + again)
        host = max(0.0, launched - (m * per_mb + critical)) + p.host_forward_s
    if p.host_optimizer_s:
        host += max(0.0, p.host_optimizer_s - opt)
    sequences = p.dp * p.micro_batch * m
    return StepTime(
        compute_s=m * comp, memory_bound_s=m * mem, recompute_s=m * rec,
        communication_s=tuple(sorted(exposed.items())), bubble_s=bubble, optimizer_s=opt, offload_s=offload,
        tokens_per_step=sequences * p.seq, gpus=p.gpus, model_flops=model_fl, hardware_flops=hardware_fl,
        peak_flops=peak, host_s=host,
    )  # fmt: skip
