"""One training run as plain data: what the core evaluates.

The edges (``memcalc.api``, the CLI, config files) validate the user's input with pydantic and turn it into a
``Plan`` once (``memcalc.inputs.plan.to_plan``); the core (memory, comm, time) reads only these numbers, so a
planner can evaluate many plans without building a pydantic object per candidate (``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcalc.frozen import frozen
from memcalc.layout.dtypes import Optimizer, Precision
from memcalc.layout.strategies import StrategySpec
from memcalc.model.architecture import Architecture

if TYPE_CHECKING:
    from memcalc.model.lora import LoraPlan


def nodes(gpus: int, gpus_per_node: int) -> int:
    """Nodes a job of ``gpus`` fills (one when it is smaller than a node)."""
    return max(1, gpus // gpus_per_node)


def ranks_per_node(gpus: int, gpus_per_node: int) -> int:
    """GPUs actually used in each node: G, or W when the job is smaller than a node."""
    return min(gpus, gpus_per_node)


@frozen
class Zero3Settings:
    """DeepSpeed's zero_optimization settings that decide what ZeRO-3 gathers, in elements (defaults: DeepSpeed
    0.19's, runtime/zero/config.py)."""

    max_reuse_distance: int = 1_000_000_000
    """stage3_max_reuse_distance: keep a module's parameters when they are used again within this many elements."""
    max_live_parameters: int = 1_000_000_000
    """stage3_max_live_parameters: prefetch only while fewer elements than this are gathered."""
    prefetch_bucket_size: int = 50_000_000
    """stage3_prefetch_bucket_size: elements prefetched at most after each fetch (0: no prefetching)."""
    param_persistence_threshold: int = 100_000
    """stage3_param_persistence_threshold: parameters of at most this many elements stay whole on every rank."""
    sub_group_size: int = 1_000_000_000
    """sub_group_size: the optimizer steps the rank's partitions in sub-groups closed once they reach this many
    elements (0: one parameter each); each sub-group's gradients are flattened and upcast at its step."""


@frozen
class Work:
    """One micro-batch: what activation memory depends on."""

    seq_len: int
    micro_batch: int
    recompute: str
    """none, selective or full."""
    attention: str
    """eager, flash or sdpa."""
    dropout: float
    """The dropout probability in force (the workload's, else the architecture's)."""
    device: str
    """cuda or cpu."""
    loss: str = "standard"
    """standard, chunked:N or fused."""
    optimizer_impl: str = "foreach"
    """foreach, fused, for-loop or in-backward."""
    compile: bool = False
    """Each decoder layer under torch.compile: its partitioner's saved set (``memcalc.memory.families.compiled``), fused
    element-wise kernels in the step time."""
    compile_loss: bool | None = None
    """The loss compiled too (None: as the framework does; ``memcalc.memory.accountings.realistic``)."""


REDUCE_BUCKET_SIZE = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` default in elements (DeepSpeed 0.19 ``runtime/zero/config.py``)."""


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything the core needs for one estimate, as numbers, strings and small frozen tables.

    Compared by identity (``eq=False``): a plan is evaluated, not looked up, and the 38-field ``__eq__`` and
    ``__hash__`` dataclasses would generate cost a millisecond at every start of the command line."""

    psi: int
    """Ψ for a bare parameter count; 0 when ``arch`` gives the shape."""
    arch: Architecture | None
    precision: Precision
    optimizer: Optimizer
    spec: StrategySpec
    gpus: int
    gpus_per_node: int
    usable_bytes: int
    """GPU memory the framework can allocate."""
    intra_link: str
    """The GPU-to-GPU link inside a node (nvlink4, pcie4, ...)."""
    offload_optimizer: str = "none"
    offload_params: str = "none"
    shard_group: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    virtual_stages: int = 1
    work: Work | None = None
    cuda_context: int = 0
    reserve: int = 0
    grad_accum: int = 1
    accounting: str = "paper"
    fsdp_version: int = 1
    bucket_view: bool = False
    min_num_params: int | None = None
    zero3: Zero3Settings = Zero3Settings()
    reduce_bucket_size: int = REDUCE_BUCKET_SIZE
    """DeepSpeed ZeRO-1/2: reduce_bucket_size in elements (the gradient bucket)."""
    overlap_comm: bool = False
    """DeepSpeed ZeRO-1/2: overlap_comm (a second gradient bucket)."""
    zero3_step: str = "steady"
    zero_init: bool = True
    buffer_factor: float = 1.5
    largest_layer_params: int | None = None
    fsdp_wrap: str = "root"
    """FSDP2: where its units put the embedding and the head (memcalc.layout.compose.FSDP_WRAPS)."""
    fsdp_auto_wrap: str = "transformer"
    """FSDP: transformer (a unit per decoder layer) or none (NO_WRAP: the decoder layers in the root unit)."""
    fsdp_prefetch: bool = True
    """FSDP1: BACKWARD_PRE, the next unit gathered at each pre-backward (False: BACKWARD_POST or none)."""
    shard_over: str = "dp-cp"
    """The ranks model states are sharded and gradients reduced over: dp-cp (data x context ranks, as torchtitan,
    Megatron-LM, DeepSpeed-Ulysses and accelerate do: memcalc.layout.compose) or dp (data-parallel ranks only)."""
    stage_layers: tuple[int, ...] | None = None
    """Decoder layers of each model chunk (pp x virtual_stages entries, chunk c on pipeline rank c % pp); None: the
    even split."""
    lora: LoraPlan | None = None
    """LoRA adapters on a frozen base (QLoRA: the base's linear weights in NF4); None: every parameter trains."""
    framework: str | None = None
    """Whose training code (``--framework``): torchtitan's model code changes what the layers save (the realistic
    accounting's ``code``); None and the others run Hugging Face's."""
    float8: str = "none"
    """none, tensorwise or rowwise: the decoder layers' linears compute in fp8 (``memcalc.model.float8``)."""
    float8_all_gather: bool = False
    """FSDP2 gathers the converted weights in fp8 (1 byte) instead of the compute dtype."""
    grad_reduce_dtype: str | None = None
    """Megatron-Core's gradient buffer: fp32 (``main_grad``), bf16 (``--grad-reduce-in-bf16``), None: the
    framework's (``grad_bytes``)."""
    defer_embedding_wgrad: int | None = None
    """Megatron-Core's deferred output-layer wgrad: the micro-batches deferred (0: all), None: off."""
    dp: int = field(init=False, repr=False, compare=False)
    """Data-parallel degree: gpus / (tp x pp x cp). Derived, like ``shard_group_size`` and ``replicas``."""
    shard_group_size: int = field(init=False, repr=False, compare=False)
    """N in the ZeRO formulas: the ranks one copy of the model states is sharded over."""
    replicas: int = field(init=False, repr=False, compare=False)
    """Copies of the sharded model states: domain / shard group for hybrids, the domain when nothing is sharded,
    else 1 (the domain: dp x cp ranks under ``shard_over`` dp-cp, else dp)."""
    shard_domain: int = field(init=False, repr=False, compare=False)
    """Ranks that hold (shards of) the same model states and reduce gradients together: dp x cp or dp."""

    def __post_init__(self) -> None:
        # Derived once per plan (the core reads them many times per evaluation).
        dp = self.gpus // (self.tp * self.pp * self.cp)
        domain = dp * self.cp if self.shard_over == "dp-cp" else dp
        spec = self.spec
        if not (spec.shards_params or spec.shards_grads or spec.shards_optimizer):
            n = 1
        elif spec.hybrid:
            # One node's worth of the domain's ranks (its members stand domain_stride ranks apart).
            n = self.shard_group or max(1, min(domain, self.gpus_per_node // self.domain_stride))
        else:
            n = domain
        object.__setattr__(self, "dp", dp)
        object.__setattr__(self, "shard_domain", domain)
        object.__setattr__(self, "shard_group_size", n)
        object.__setattr__(self, "replicas", domain // n if spec.hybrid else (domain if n == 1 else 1))

    @property
    def domain_stride(self) -> int:
        """Ranks between neighbouring members of the shard domain in Megatron-LM's order (tp, cp, dp, pp): tp when
        the domain is the flattened dp x cp group, tp x cp when it is dp alone."""
        return self.tp if self.shard_over == "dp-cp" else self.tp * self.cp

    @property
    def grad_bytes(self) -> int:
        """Bytes of a gradient element as the framework keeps and reduces it: the precision's, or 4 where the
        framework accumulates bf16 parameters' gradients in fp32 (``Framework.main_grads_fp32``: Megatron-LM), 2
        where the plan keeps Megatron-Core's buffer in bf16 (``grad_reduce_dtype``: ``--grad-reduce-in-bf16``)."""
        from memcalc.layout.compose import composition

        if self.grad_reduce_dtype == "bf16":
            return 2
        fp32 = composition(self.framework).main_grads_fp32 and self.precision.name == "bf16-mixed"
        return 4 if fp32 else self.precision.grad_bytes

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def nodes(self) -> int:
        return nodes(self.gpus, self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        return ranks_per_node(self.gpus, self.gpus_per_node)

    @property
    def dp_per_node(self) -> int:
        """Data-parallel ranks inside one node (tensor and context parallelism fill a node first)."""
        return max(1, min(self.dp, self.gpus_per_node // (self.tp * self.cp)))

    @property
    def offload(self) -> tuple[str, str]:
        """(optimizer states, parameters) devices: none, cpu or nvme."""
        return self.offload_optimizer, self.offload_params

    @property
    def offloads(self) -> bool:
        """Something (optimizer states or parameters) lives off the GPU."""
        return self.offload != ("none", "none")

    @property
    def optimizer_device(self) -> str:
        """Where optimizer states live (FSDP's CPUOffload takes them along with the params)."""
        return self.offload_params if self.spec.offload_together else self.offload_optimizer
