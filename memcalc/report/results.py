"""Results: frozen pydantic models (``memcalc.validated``), the public contract of ``--json`` and of the Python API.

Every size is an integer number of bytes. ``model_dump()`` gives plain Python, ``model_dump_json()``
the JSON the CLI prints; in Jupyter and IPython a result displays as memcalc's rich tables.
"""

from typing import Literal

from pydantic import Field

from memcalc.inputs import EstimateInput
from memcalc.report.result_base import _Result
from memcalc.report.results_time import StepTimeInfo
from memcalc.validated import empty_list

Location = Literal["gpu", "cpu", "nvme"]
Category = Literal["model_state", "activation", "overhead"]


class MemoryRow(_Result):
    """One line of the memory breakdown."""

    key: str
    """Stable identifier: ``parameters``, ``gradients``, ``master_weights``, ``optimizer_moments``,
    ``cuda_context``, ``allocator_reserve``."""
    label: str
    """The row's name as the table shows it."""
    bytes: int
    """Bytes, per GPU (or per node for the per-node rows)."""
    location: Location
    """Where the bytes live: gpu, cpu (host RAM) or nvme."""
    category: Category
    """model_state, activation or overhead."""
    detail: str
    """The formula and its source."""


class PerGPU(_Result):
    """Memory one GPU holds at peak, in bytes. ``total`` is the sum of every row."""

    parameters: int
    """Working parameters (params row)."""
    gradients: int
    """Gradients (grads row)."""
    optimizer_states: int
    """master_weights + optimizer_moments."""
    master_weights: int
    """The fp32 master copy on the GPU (0 when there is none or it is offloaded)."""
    optimizer_moments: int
    """The optimizer's moments on the GPU (0 when offloaded)."""
    activations: int
    """Every activation row: the stage's layers x micro-batches in flight, plus embedding and output tensors."""
    cuda_context: int
    """The CUDA context and kernels (Overheads.cuda_context_bytes)."""
    allocator_reserve: int
    """Headroom kept for the caching allocator (Overheads.allocator_reserve_bytes)."""
    total: int
    """The sum of every row: what the GPU must hold."""
    rows: list[MemoryRow]
    """The breakdown, one row per part; their bytes add up to total."""
    peak_allocated: int = 0
    """What ``torch.cuda.max_memory_allocated`` reports at the step's peak (the rows but the allocator's gap, the
    CUDA context and NCCL's buffers)."""
    peak_reserved: int = 0
    """What the caching allocator holds then (``max_memory_reserved``): peak_allocated + its least gap + the cached
    blocks the peak cannot use (``memcalc.memory.allocator.reserved``), at most what the GPU leaves the allocator."""


class PerNode(_Result):
    """Offloaded model states one node holds: the sum over its ranks."""

    ranks: int
    """GPUs per node actually used (G, or the world size below one node)."""
    cpu: int
    """Host RAM for offloaded states, bytes per node."""
    nvme: int
    """NVMe for offloaded states, bytes per node."""
    rows: list[MemoryRow]
    """The offloaded states, one row per part, per node."""


class Fit(_Result):
    """Does the per-GPU total fit the GPU?"""

    fits: bool
    """Whether the per-GPU total is at most usable_bytes."""
    usable_bytes: int
    """What the framework can allocate on this GPU."""
    headroom_bytes: int
    """usable_bytes - total; negative when it does not fit."""
    verdict: str = "fits"
    """fits, at-risk (the margin is within the allocator's measured variability: fragmentation may make the step
    fail; under the paper's accounting also within the buffers its rows leave out: ``memcalc.memory.accountings.paper.fit``)
    or oom. The DeepSpeed estimator's and the implementation accounting's have no band: fits or oom."""


class StageMemory(_Result):
    """One pipeline stage's GPU (every stage, when pp = 1, is stage 0)."""

    stage: int
    """The stage's index, 0 first."""
    parameters: int
    """Parameters this rank holds (its layers, TP/EP-sharded, and embeddings or head on the ends)."""
    layers: int
    """Decoder layers on this stage."""
    micro_batches_in_flight: float
    """Micro-batches whose activations the stage holds at peak under 1F1B (Korthikanti Eq. 5)."""
    model_states: int
    """Parameters, gradients and optimizer states this stage's GPU holds."""
    activations: int
    """Activations the stage holds at its peak."""
    total: int
    """model_states + activations + overheads on this stage's GPU."""
    peak_reserved: int | None = None
    """Realistic accounting: what ``max_memory_reserved`` reports on this stage's GPU (the per-GPU figure is the most
    loaded stage's, by ``total``; a stage's cached blocks can make another stage's reserved peak the larger)."""


class TensorBytes(_Result):
    name: str
    """The saved tensor (its role in the layer)."""
    bytes: int
    """Its bytes, per micro-batch, on one GPU."""


class ActivationDetail(_Result):
    """What one layer saves for backward on one GPU, per micro-batch."""

    kernel: str
    """The attention kernel that runs: eager (keeps a·s² scores) or flash."""
    recompute: str
    """The recomputation policy the figures assume (none, selective, full, every:K, op-sac)."""
    layer_bytes: int
    """One dense layer, per micro-batch."""
    moe_layer_bytes: int | None
    """One MoE layer, per micro-batch (None: a dense model)."""
    layer_tensors: list[TensorBytes]
    """What one dense layer saves, tensor by tensor; the bytes add up to layer_bytes."""


class TimelineMoment(_Result):
    """One moment of the step (realistic accounting, every decoder layer replayed): live bytes by kind."""

    phase: str
    """baseline, input, forward.layer.i, loss, backward.layer.i, optimizer, zero_grad, ... (the tracer's names)."""
    label: str
    """What happens at that moment."""
    bytes: dict[str, int]
    """Live bytes by kind (``memcalc.memory.engine.moments.KINDS``: parameters, gradients, optimizer_states, activations,
    temporaries, communication_buffers; ``other`` for a part no rule names). Their sum is the moment's total."""


class StepTimeline(_Result):
    """When in the step the peak happens (realistic accounting)."""

    peak_phase: str
    """baseline, input, forward.layer.i, forward.head, loss, backward, backward.layer.i, optimizer, zero_grad."""
    peak_moment: str
    """What happens at that moment (e.g. log_softmax's backward)."""
    phases: dict[str, int]
    """Each phase's own peak of allocated bytes (forward and backward over all their layers)."""
    moments: list[TimelineMoment] = Field(default_factory=empty_list)
    """Every moment of the step in order, when asked for (``--timeline``, ``timeline=True``); empty otherwise. The
    largest sum of a moment's bytes is ``per_gpu.peak_allocated``."""


class Memory(_Result):
    per_gpu: PerGPU
    """The most loaded GPU (the most loaded pipeline stage)."""
    per_node: PerNode
    """Offloaded states a node holds in host RAM and on NVMe."""
    fit: Fit
    """Whether the most loaded GPU fits, and by how much."""
    stages: list[StageMemory]
    """Every pipeline stage's GPU (one entry when pp = 1)."""
    most_loaded_stage: int
    """The stage whose GPU holds the most (its figures are per_gpu's)."""
    activations: ActivationDetail | None = None
    """What one layer saves for backward (None: model states only, no --seq-len)."""
    timeline: StepTimeline | None = None
    """Realistic accounting: the moment of the peak and each phase's peak."""


class Collective(_Result):
    """One collective issued every optimizer step, as one GPU sees it. Byte counts are per step."""

    op: str
    """all-reduce, reduce-scatter, all-gather, ..."""
    phase: Literal["forward", "backward", "optimizer step"]
    """When in the step it is issued."""
    tensor: str
    """What it moves: ``gradients`` or ``parameters``."""
    group: Literal["data-parallel", "shard group", "replica group", "tensor-parallel", "pipeline",
                   "context-parallel", "expert-parallel"]
    """The process group it runs over."""
    group_size: int
    """Ranks in the group."""
    crosses_nodes: bool
    """Whether the group spans more than one node (then it runs on the network)."""
    link: str
    """The link it runs on: the GPU's intra-node link, or ``network``."""
    dtype: str
    """The dtype of the elements it moves (bf16, fp16, fp32)."""
    calls_per_step: int
    """How often it is issued per optimizer step (micro-batches with gradient accumulation)."""
    payload_bytes_per_call: int
    """nccl-tests' S for one call: the gathered output (all-gather), the unreduced input
    (reduce-scatter), the tensor (all-reduce)."""
    payload_bytes: int
    """payload_bytes_per_call x calls_per_step."""
    sent_bytes_per_gpu: int
    """Bytes each GPU sends per step under a ring: payload x the nccl-tests bus factor."""


class HostTransfer(_Result):
    """A copy between GPU memory and host RAM (over PCIe) or between host RAM and NVMe, per step."""

    op: Literal["host-to-device", "device-to-host", "nvme-read", "nvme-write"]
    """The direction of the copy."""
    phase: Literal["forward", "backward", "optimizer step"]
    """When in the step it happens."""
    tensor: str
    """What it moves (parameters, gradients, optimizer states)."""
    link: Literal["pcie", "nvme"]
    """pcie (GPU and host) or nvme (host and disk)."""
    calls_per_step: int
    """How often it happens per optimizer step."""
    bytes_per_call: int
    """Bytes per copy, per GPU."""
    bytes: int
    """bytes_per_call x calls_per_step, per GPU."""


class Communication(_Result):
    """What crosses links per optimizer step, per GPU."""

    collectives: list[Collective]
    """Every collective of the step, one row each."""
    host_transfers: list[HostTransfer]
    """Every copy to or from host memory or NVMe (offload), one row each."""
    payload_bytes: int
    """Σ payload_bytes over the collectives."""
    sent_bytes_per_gpu: int
    """Σ sent_bytes_per_gpu over the collectives."""
    intra_node_sent_bytes_per_gpu: int
    """The part of sent_bytes_per_gpu sent over the intra-node link."""
    inter_node_sent_bytes_per_gpu: int
    """The part of sent_bytes_per_gpu sent over the network."""
    host_transfer_bytes: int
    """Σ bytes over host_transfers (PCIe and NVMe), per GPU."""


class StrategyInfo(_Result):
    name: str
    """The strategy's key (zero-0..3, FULL_SHARD, ...)."""
    label: str
    """Its name as tables show it (with the offload)."""
    framework: str
    """The framework that implements it: ddp, deepspeed or fsdp."""
    shards_params: bool
    """Parameters are sharded over the shard group."""
    shards_grads: bool
    """Gradients are sharded over the shard group."""
    shards_optimizer: bool
    """Optimizer states are sharded over the shard group."""
    shard_group_size: int
    """N in the ZeRO formulas: ranks one copy of the model states is sharded over."""
    replicas: int
    """Copies of the (sharded) model states across the data-parallel group."""
    offload_optimizer: str
    """Where optimizer states live: none (GPU), cpu or nvme."""
    offload_params: str
    """Where the parameter shard lives between uses: none (GPU), cpu or nvme."""


class ParameterBreakdown(_Result):
    """Exact parameter counts by part (from the architecture)."""

    embeddings: int
    """The token embedding (padded rows included)."""
    positions: int
    """The learned position table (0 for rotary, ALiBi or none)."""
    attention: int
    """Q, K, V and output projections of every layer, with their biases and norms of q and k."""
    mlp: int
    """Dense MLPs and every expert of MoE layers."""
    router: int
    """The MoE routers of every layer."""
    norms: int
    """Every norm's weights and biases."""
    head: int
    """0 when tied to the embeddings."""
    per_layer: int
    """One dense decoder layer (or the first layer)."""
    largest_layer: int
    """The largest decoder layer: what FSDP gathers at once when it wraps each block."""
    largest_module: str
    """The module with the most parameters (what one FSDP unit or ZeRO-3 gather holds at least)."""
    largest_module_parameters: int
    """Its parameter count."""
    active_per_token: int
    """Parameters one token passes through (MoE: top_k experts)."""


class ModelInfo(_Result):
    parameters: int
    """Ψ: exact when derived from an architecture."""
    name: str | None = None
    """The preset or config name, when there is one."""
    breakdown: ParameterBreakdown | None = None
    """Exact counts by part (None for a bare parameter count)."""


class Training(_Result):
    """The parallel layout and batch that the estimate assumes."""

    dp: int
    """Data-parallel degree: GPUs / (tp x pp x cp)."""
    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline stages."""
    cp: int
    """Context-parallel degree."""
    ep: int
    """Expert-parallel degree (1: dense, or experts not spread)."""
    sequence_parallel: bool
    """Megatron sequence parallelism over the tp ranks."""
    virtual_stages: int
    """Model chunks per pipeline rank (1: the plain schedule)."""
    seq_len: int | None
    """Tokens per sequence (None: model states only)."""
    micro_batch: int | None
    """Sequences per micro-batch per data-parallel rank (None: model states only)."""
    micro_batch_auto: bool = False
    """The micro-batch was chosen by ``--micro-batch auto``: the largest that fits, or 1 when none does."""
    micro_batch_none_fits: bool = False
    """With ``--micro-batch auto``: not even micro-batch 1 fits; the estimate is micro-batch 1's (a note says by how
    much)."""
    micro_batches: int
    """Micro-batches per optimizer step (gradient accumulation)."""
    global_batch: int | None
    """micro_batch x micro_batches x dp sequences."""
    tokens_per_step: int | None
    """global_batch x seq_len (None without a sequence length)."""


class Estimate(_Result):
    """One strategy's per-GPU memory and per-step communication."""

    schema_version: int = 1
    """The version of this JSON layout; it changes only when a field changes meaning or goes."""
    accounting: str
    """``paper``: the ZeRO paper's accounting (§5, §7)."""
    model: ModelInfo
    """The model: its parameter count and, with a shape, their breakdown."""
    strategy: StrategyInfo
    """The data-parallel strategy: what it shards, over how many ranks, where it offloads."""
    training: Training
    """The parallel layout and batch the estimate assumes."""
    memory: Memory
    """Per-GPU and per-node memory, the fit, each pipeline stage."""
    communication: Communication
    """Collectives and host copies: what crosses which link per optimizer step, per GPU."""
    notes: list[str] = Field(default_factory=empty_list)
    """What the numbers leave out, and assumptions worth knowing."""
    assumed: list[str] = Field(default_factory=empty_list)
    """Values a config file left to the training script, taken as its default, that change the answer (each with
    how to give yours): the output's header shows them."""
    input: EstimateInput
    """Everything the estimate was computed from."""
    time: StepTimeInfo | None = None
    """How long a step takes; None without a model shape and --seq-len, or for a GPU with no calibration (a note
    says why)."""


class Comparison(_Result):
    """Several strategies for one model and cluster, side by side."""

    schema_version: int = 1
    """The version of this JSON layout; it changes only when a field changes meaning or goes."""
    estimates: list[Estimate]
    """One estimate per strategy, in the order asked for."""
    by_memory: list[str] = Field(default_factory=empty_list)
    """Strategy labels from the least per-GPU memory to the most."""
    by_time: list[str] = Field(default_factory=empty_list)
    """Strategy labels from the shortest step to the longest (those with a step time); rows at different
    micro-batches (``--micro-batch auto``): from the most tokens per second per GPU to the fewest."""
    fastest_that_fits: str | None = None
    """The strategy with the shortest step among those that fit (None: none fits, or no step time)."""
    smallest: str | None = None
    """The strategy that needs the least memory per GPU."""

    def _check(self) -> None:
        # Rankings are derived from the estimates; given ones (a parsed JSON) are kept as they are.
        if self.estimates and not self.by_memory:
            es = self.estimates
            mem = sorted(es, key=lambda e: e.memory.per_gpu.total)
            same_batch = len({e.training.micro_batch for e in es}) == 1
            timed = sorted((e for e in es if e.time is not None),  # a step's length compares equal batches only
                           key=lambda e: e.time.step_s if same_batch else -e.time.tokens_per_s_per_gpu)  # type: ignore[union-attr]
            fitting = [e for e in timed if e.memory.fit.fits]
            self._set("by_memory", [e.strategy.label for e in mem])
            self._set("by_time", [e.strategy.label for e in timed])
            self._set("fastest_that_fits", fitting[0].strategy.label if fitting else None)
            self._set("smallest", mem[0].strategy.label)
