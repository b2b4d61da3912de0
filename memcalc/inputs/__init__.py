"""Inputs are data: frozen pydantic models, validated once, never mutated.

Every size inside is an ``int`` of bytes; preset and CLI values that carry another unit say so in
their name (``memory_gib``, ``hbm_gbps``) and are converted by properties through ``memcalc.units``.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memcalc.model.architecture import Architecture
from memcalc.errors import InputError, did_you_mean
from memcalc.layout.strategies import STRATEGIES, OffloadDevice, StrategyName, StrategySpec
from memcalc.units import GB, gib, parse_count

_FROZEN = ConfigDict(frozen=True, extra="forbid")
T = TypeVar("T")


class Frozen(BaseModel):
    model_config = _FROZEN


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class Model(Frozen):
    """The model being trained: a parameter count, or an architecture the count is derived from."""

    parameters: int | None = Field(default=None, gt=0)
    """Ψ, the number of trainable parameters (derived exactly from ``architecture`` when that is given)."""
    architecture: Architecture | None = None
    """The transformer's shape: needed for activations, tensor/pipeline splits and the largest module."""
    name: str | None = None
    """Where the count came from (a preset name), for display only."""

    @field_validator("parameters", mode="before")
    @classmethod
    def _parse(cls, v: object) -> int | None:
        if v is None:
            return None
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return parse_count(v, "parameters")
        raise InputError(f"parameters {v!r} is not a number; give a positive count such as 7e9 or 7B")

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if self.parameters is None and self.architecture is None:
            raise InputError("give the model size (--params 7B) or its shape (--model, --hf-config, --layers ...)")
        if self.parameters is not None and self.architecture is not None:
            raise InputError("give --params or a model shape (--model, --hf-config, --layers ...), not both")
        return self


# --------------------------------------------------------------------------------------------
# Precision: what each tensor is stored in.
# --------------------------------------------------------------------------------------------

PrecisionName = Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16"]


class Precision(Frozen):
    """Bytes per element of each model-state tensor under one training precision."""

    name: PrecisionName
    param_bytes: int
    """Working parameters, the copy forward and backward read (2 for fp16/bf16, 4 for fp32)."""
    grad_bytes: int
    """Gradients as backward produces and reduces them."""
    master_bytes: int
    """fp32 master copy of the parameters the optimizer updates; 0 where there is none."""
    description: str

    @property
    def state_bytes(self) -> int:
        """Bytes of an optimizer moment kept in the optimizer's working dtype.

        With a master copy (or fp32 params) moments are fp32 (ZeRO §3.1: "fp32 ... momentum and
        variance"); pure bf16 training keeps them in bf16 (torch.optim.AdamW: zeros_like(param)).
        """
        return 4 if self.master_bytes or self.param_bytes == 4 else self.param_bytes

    @property
    def low_dtype(self) -> str:
        """dtype of working parameters and gradients, as collectives carry them."""
        if self.param_bytes == 4:
            return "fp32"
        return "fp16" if self.name.startswith("fp16") else "bf16"


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        # Pure fp32 training: params 4 + grads 4, no master copy (the fp32 weights are what the optimizer updates).
        Precision(name="fp32", param_bytes=4, grad_bytes=4, master_bytes=0, description="fp32 params and grads"),
        # ZeRO §3.1 (Micikevicius et al. 2018 mixed precision): fp16 params and grads + fp32 master.
        Precision(
            name="fp16-mixed", param_bytes=2, grad_bytes=2, master_bytes=4, description="fp16 params/grads + fp32 master"
        ),
        Precision(
            name="bf16-mixed", param_bytes=2, grad_bytes=2, master_bytes=4, description="bf16 params/grads + fp32 master"
        ),
        Precision(name="bf16", param_bytes=2, grad_bytes=2, master_bytes=0, description="pure bf16, no master copy"),
    )
}
_PRECISION_ALIASES = {
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "float32": "fp32",
    "fp16-mixed": "fp16-mixed", "16-mixed": "fp16-mixed", "mixed-fp16": "fp16-mixed", "amp": "fp16-mixed",
    "bf16-mixed": "bf16-mixed", "mixed-bf16": "bf16-mixed",
    "bf16": "bf16", "bf16-true": "bf16", "bfloat16": "bf16", "pure-bf16": "bf16",
}  # fmt: skip


def _resolve(what: str, text: str, aliases: dict[str, str], table: dict[str, T], hint: str = "") -> T:
    """A table entry by any of its names (case-insensitive, ``-`` and ``_`` alike), or a one-line error."""
    key = str(text).strip().lower().replace("_", "-")
    if key in aliases:
        return table[aliases[key]]
    names = list(table)
    raise InputError(f"unknown {what} {text!r}{did_you_mean(key, names)}; accepted: {', '.join(names)}{hint}")


def resolve_precision(text: str) -> Precision:
    return _resolve("precision", text, _PRECISION_ALIASES, PRECISIONS)


# --------------------------------------------------------------------------------------------
# Optimizer: state bytes per parameter.
# --------------------------------------------------------------------------------------------

OptimizerName = Literal["adamw", "sgd", "sgd-momentum", "adam-8bit", "adafactor", "lion"]


class Optimizer(Frozen):
    """The optimizer's per-parameter state, apart from the master copy (which belongs to the precision)."""

    name: OptimizerName
    moments: int
    """Full-size state tensors per parameter (Adam: m and v = 2; momentum SGD and Lion: 1)."""
    moment_bytes: int | None
    """Fixed bytes per moment element (8-bit Adam: 1); None = the precision's state dtype."""
    source: str
    note: str | None = None
    step_counter: bool = False
    """torch.optim keeps a 4-byte ``step`` tensor per parameter tensor (Adam, AdamW, Adafactor)."""

    def moment_bytes_for(self, precision: Precision) -> int:
        return self.moment_bytes if self.moment_bytes is not None else precision.state_bytes

    def state_bytes_per_param(self, precision: Precision) -> int:
        """K in the ZeRO paper (§3.1): master copy + moments, bytes per parameter. AdamW, bf16-mixed: 4 + 4 + 4 = 12."""
        return precision.master_bytes + self.moments * self.moment_bytes_for(precision)


OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer(name="adamw", moments=2, moment_bytes=None, source="ZeRO §3.1: momentum + variance", step_counter=True),
        Optimizer(name="sgd", moments=0, moment_bytes=None, source="torch.optim.SGD, momentum=0: no state (master only)"),
        Optimizer(name="sgd-momentum", moments=1, moment_bytes=None, source="torch.optim.SGD: momentum_buffer"),
        Optimizer(
            name="adam-8bit",
            moments=2,
            moment_bytes=1,
            source="Dettmers et al. 2022 (arXiv 2110.02861): 8-bit m and v, 1 byte each",
            note="8-bit Adam's block-wise quantization statistics (one fp32 per 2048 values) are not counted",
        ),
        Optimizer(
            name="adafactor",
            moments=0,
            moment_bytes=None,
            source="Shazeer & Stern 2018 (arXiv 1804.04235): factored second moment, no first moment by default",
            note="Adafactor's factored second moment (rows + columns of each matrix) is not counted for a bare parameter count",
            step_counter=True,
        ),
        Optimizer(name="lion", moments=1, moment_bytes=None, source="Chen et al. 2023 (arXiv 2302.06675): one momentum"),
    )
}
_OPTIMIZER_ALIASES = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "sgd-momentum": "sgd-momentum",
                      "momentum": "sgd-momentum", "adam-8bit": "adam-8bit", "adamw-8bit": "adam-8bit",
                      "adam8bit": "adam-8bit", "8bit-adam": "adam-8bit", "adafactor": "adafactor", "lion": "lion"}  # fmt: skip


def resolve_optimizer(text: str) -> Optimizer:
    return _resolve("optimizer", text, _OPTIMIZER_ALIASES, OPTIMIZERS, " (adam = adamw)")


# --------------------------------------------------------------------------------------------
# GPU: a datasheet, loaded from presets/gpus/*.toml.
# --------------------------------------------------------------------------------------------


class GPU(Frozen):
    """One accelerator, as its datasheet describes it. Preset keys equal these field names."""

    key: str
    """The preset name (file stem), e.g. ``a100-sxm-80gb``."""
    name: str
    """The marketing name."""
    aliases: tuple[str, ...] = ()
    """Other names users type (``a100-80g``)."""
    memory_gb: float = Field(gt=0)
    """Memory as sold, decimal GB (the datasheet's figure)."""
    usable_memory_gib: float = Field(gt=0)
    """Memory the framework can allocate, GiB: the total capacity PyTorch reports for the device."""
    hbm_gbps: float = Field(gt=0)
    """Peak memory bandwidth, GB/s."""
    bf16_tflops: float = Field(ge=0)
    """Peak dense BF16 tensor throughput, TFLOPS (0 = not supported)."""
    fp16_tflops: float = Field(ge=0)
    """Peak dense FP16 tensor throughput, TFLOPS."""
    fp32_tflops: float = Field(ge=0)
    """Peak FP32 throughput (non-tensor), TFLOPS."""
    intra_node_link: str
    """The GPU-to-GPU link inside a node (``nvlink4``, ``pcie4``, ``infinity-fabric``)."""
    intra_node_gbps: float = Field(gt=0)
    """GPU-to-GPU bandwidth inside a node, GB/s, both directions summed as datasheets quote it."""
    pcie_gbps: float = Field(gt=0)
    """Host link bandwidth each way, GB/s (PCIe Gen4 x16 about 32, Gen5 x16 about 64)."""
    network_gbps: float = Field(gt=0)
    """Typical inter-node network bandwidth per GPU each way, GB/s (200 Gb/s HDR = 25)."""
    source: str
    """Where the figures come from."""

    @property
    def usable_memory_bytes(self) -> int:
        return gib(self.usable_memory_gib)

    @property
    def memory_bytes(self) -> int:
        return round(self.memory_gb * GB)


# --------------------------------------------------------------------------------------------
# Cluster, strategy, overheads
# --------------------------------------------------------------------------------------------


class Cluster(Frozen):
    """How many GPUs, and how they sit in nodes."""

    gpus: int = Field(gt=0)
    """World size W."""
    gpus_per_node: int = Field(default=8, gt=0)
    """G: GPUs in one node, behind one NVLink/PCIe domain and one host's RAM."""

    @model_validator(mode="after")
    def _whole_nodes(self) -> Cluster:
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise InputError(
                f"--gpus {self.gpus} is not a multiple of --gpus-per-node {self.gpus_per_node}; "
                f"use a world size up to one node or a multiple of {self.gpus_per_node}"
            )
        return self

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        """GPUs actually used in each node: G, or W when the job is smaller than a node."""
        return min(self.gpus, self.gpus_per_node)


class Strategy(Frozen):
    """A data-parallel strategy (a row of the strategy table) and where it offloads."""

    name: StrategyName = "zero-0"
    offload_optimizer: OffloadDevice = "none"
    """Where optimizer states (master copy, moments) and the reduced gradient shard live."""
    offload_params: OffloadDevice = "none"
    """Where the parameter shard lives between uses."""
    shard_group: int | None = Field(default=None, gt=0)
    """Hybrid strategies: GPUs in one shard group (default: one node)."""

    @property
    def spec(self) -> StrategySpec:
        return STRATEGIES[self.name]

    @property
    def label(self) -> str:
        parts = [self.spec.label]
        if self.spec.offload_together and self.offload_params != "none":
            parts.append(f"offload {self.offload_params}")
        else:
            if self.offload_optimizer != "none":
                parts.append(f"opt→{self.offload_optimizer}")
            if self.offload_params != "none":
                parts.append(f"param→{self.offload_params}")
        return " + ".join(parts)

    @model_validator(mode="after")
    def _framework_rules(self) -> Strategy:
        spec = self.spec
        if spec.offload_together:
            # torch.distributed.fsdp.CPUOffload(offload_params=True) moves params, grads and the optimizer
            # step to the CPU together; there is no optimizer-only offload and no NVMe.
            if self.offload_optimizer not in ("none", self.offload_params):
                raise InputError(
                    f"FSDP offloads the optimizer only together with the parameters (CPUOffload(offload_params=True)); "
                    f"use --offload-params cpu instead of --offload-optimizer {self.offload_optimizer}"
                )
            if self.offload_params not in spec.param_offload:
                raise InputError(
                    f"--offload-params {self.offload_params} is not available with FSDP; accepted: none, cpu"
                )
            return self
        if self.offload_optimizer not in spec.optimizer_offload:
            if spec.name in ("zero-1", "zero-2"):
                why = "DeepSpeed ZeRO-1/2 keep offloaded optimizer states in host memory; NVMe needs --stage 3"
            elif spec.framework == "deepspeed":
                why = "DeepSpeed offloads the optimizer from ZeRO stage 1 up"
            else:
                why = "DDP has no offload; use --stage 1-3 or --fsdp"
            accepted = ", ".join(spec.optimizer_offload)
            raise InputError(f"--offload-optimizer {self.offload_optimizer} with {spec.label}: {why}; accepted: {accepted}")
        if self.offload_params not in spec.param_offload:
            why = "parameter offload is ZeRO-3 only" if spec.framework == "deepspeed" else "DDP has no offload"
            raise InputError(f"--offload-params {self.offload_params} with {spec.label}: {why}; accepted: none")
        return self

    @property
    def optimizer_device(self) -> OffloadDevice:
        """Where optimizer states live (FSDP's CPUOffload takes them along with the params)."""
        if self.spec.offload_together:
            return self.offload_params
        return self.offload_optimizer


class Overheads(Frozen):
    """GPU memory that is not model state; each becomes its own row of the breakdown."""

    cuda_context_bytes: int = Field(default=gib(0.5), ge=0)
    """CUDA context and kernels loaded by the framework (about 0.3-0.5 GiB on A100/H100 with lazy loading)."""
    allocator_reserve_bytes: int = Field(default=0, ge=0)
    """Headroom kept for the caching allocator's fragmentation; 0 unless you set it."""


class Parallelism(Frozen):
    """Model parallelism. dp = gpus / (tp x pp x cp); ZeRO and FSDP shard over dp only."""

    tp: int = Field(default=1, gt=0)
    """Tensor-parallel degree (Megatron); 1 means disabled."""
    pp: int = Field(default=1, gt=0)
    """Pipeline stages; 1 means disabled."""
    cp: int = Field(default=1, gt=0)
    """Context-parallel degree: the sequence is split over cp ranks; 1 means disabled."""
    ep: int = Field(default=1, gt=0)
    """Expert-parallel degree: MoE experts are spread over ep data-parallel ranks; 1 means disabled."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropouts split over the tp ranks."""
    virtual_stages: int = Field(default=1, gt=0)
    """Model chunks per pipeline rank (interleaved 1F1B); 1 means the plain schedule."""

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp


class Workload(Frozen):
    """What one micro-batch looks like, for activation memory."""

    seq_len: int = Field(gt=0)
    """s: tokens per sequence."""
    micro_batch: int = Field(default=1, gt=0)
    """b: sequences per micro-batch on one data-parallel rank."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation: none, selective (core attention, Korthikanti §5) or full (every layer)."""
    attention: Literal["eager", "flash", "sdpa"] = "eager"
    """eager keeps the a·s² score matrices (the paper's case); flash does not; sdpa is PyTorch's dispatcher."""
    dropout: float | None = Field(default=None, ge=0, lt=1)
    """Dropout probability; None takes the architecture's (0 when it has none)."""
    device: Literal["cuda", "cpu"] = "cuda"
    """Where it runs: CUDA keeps 1-byte dropout masks, CPU keeps them in the activation dtype."""


Accounting = Literal["paper", "implementation", "deepspeed-estimator"]


class Zero3Settings(Frozen):
    """DeepSpeed's zero_optimization settings that decide what ZeRO-3 gathers, in elements (defaults: DeepSpeed
    0.19's, runtime/zero/config.py)."""

    max_reuse_distance: int = Field(default=1_000_000_000, ge=0)
    """stage3_max_reuse_distance: keep a module's parameters when they are used again within this many elements."""
    max_live_parameters: int = Field(default=1_000_000_000, ge=0)
    """stage3_max_live_parameters: prefetch only while fewer elements than this are gathered."""
    prefetch_bucket_size: int = Field(default=50_000_000, ge=0)
    """stage3_prefetch_bucket_size: elements prefetched at most after each fetch (0: no prefetching)."""
    param_persistence_threshold: int = Field(default=100_000, ge=0)
    """stage3_param_persistence_threshold: parameters of at most this many elements stay whole on every rank."""


class FrameworkOptions(Frozen):
    """How the framework is configured (``--accounting implementation``)."""

    fsdp_version: Literal[1, 2] = 1
    """1: FullyShardedDataParallel (FlatParameter per unit); 2: fully_shard (per-parameter DTensor shards)."""
    bucket_view: bool = False
    """DDP: gradient_as_bucket_view (buckets are the gradients, no second copy)."""
    min_num_params: int | None = Field(default=None, gt=0)
    """FSDP: size_based_auto_wrap_policy's threshold; None wraps one unit per decoder layer."""
    max_reuse_distance: int | None = Field(default=None, ge=0)
    """DeepSpeed ZeRO-3: stage3_max_reuse_distance in elements (None: DeepSpeed's default, 1e9)."""
    max_live_parameters: int | None = Field(default=None, ge=0)
    """DeepSpeed ZeRO-3: stage3_max_live_parameters in elements (None: DeepSpeed's default, 1e9)."""
    prefetch_bucket_size: int | None = Field(default=None, ge=0)
    """DeepSpeed ZeRO-3: stage3_prefetch_bucket_size in elements (None: DeepSpeed's default, 5e7)."""
    persistence_threshold: int | None = Field(default=None, ge=0)
    """DeepSpeed ZeRO-3: stage3_param_persistence_threshold in elements (None: DeepSpeed's default, 1e5)."""
    zero3_step: Literal["steady", "first"] = "steady"
    """DeepSpeed ZeRO-3: which step's gathers to report: any step after the first (``steady``), or the first, in
    which DeepSpeed records its module trace and gathers every parameter on each use."""

    @property
    def zero3_flags(self) -> list[str]:
        """The ZeRO-3 knobs that were set, as CLI flags."""
        return [flag for flag, v in (("--max-reuse-distance", self.max_reuse_distance),
                                     ("--max-live-parameters", self.max_live_parameters),
                                     ("--prefetch-bucket-size", self.prefetch_bucket_size),
                                     ("--persistence-threshold", self.persistence_threshold),
                                     ("--zero3-step", None if self.zero3_step == "steady" else self.zero3_step))
                if v is not None]  # fmt: skip

    def zero3(self) -> Zero3Settings:
        """The settings DeepSpeed's ZeRO-3 coordinator runs with: these, DeepSpeed's defaults where unset."""
        given = {"max_reuse_distance": self.max_reuse_distance, "max_live_parameters": self.max_live_parameters,
                 "prefetch_bucket_size": self.prefetch_bucket_size,
                 "param_persistence_threshold": self.persistence_threshold}  # fmt: skip
        return Zero3Settings(**{k: v for k, v in given.items() if v is not None})


class EstimatorOptions(Frozen):
    """Arguments of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (``--accounting deepspeed-estimator``)."""

    zero_init: bool = True
    """ZeRO-3: the model was built under deepspeed.zero.Init (DeepSpeed's default)."""
    buffer_factor: float = Field(default=1.5, gt=0)
    """additional_buffer_factor on the CPU figure."""
    largest_layer_params: int | None = Field(default=None, gt=0)
    """ZeRO-3: the most parameters one module owns; taken from the architecture when there is one."""


class EstimateInput(Frozen):
    """Everything one estimate needs."""

    model: Model
    precision: Precision = PRECISIONS["bf16-mixed"]
    optimizer: Optimizer = OPTIMIZERS["adamw"]
    gpu: GPU
    cluster: Cluster
    strategy: Strategy = Strategy()
    parallelism: Parallelism = Parallelism()
    workload: Workload | None = None
    """None: model states only (no activations)."""
    overheads: Overheads = Overheads()
    grad_accum: int = Field(default=1, gt=0)
    """Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches)."""
    accounting: Accounting = "paper"
    """Which accounting: ``paper`` is the ZeRO paper's (§5) and Korthikanti et al.'s; ``deepspeed-estimator``
    is DeepSpeed's own estimate_zero2/3_model_states_mem_needs."""
    estimator: EstimatorOptions = EstimatorOptions()
    framework: FrameworkOptions = FrameworkOptions()

    @model_validator(mode="after")
    def _invariants(self) -> EstimateInput:
        par, w, g = self.parallelism, self.cluster.gpus, self.cluster.gpus_per_node
        mp = par.model_parallel
        if w % mp:
            raise InputError(
                f"tp({par.tp}) * pp({par.pp}) * cp({par.cp}) = {mp} does not divide gpus({w}); "
                f"dp = gpus / (tp * pp * cp) must be a whole number"
            )
        dp = w // mp
        if par.ep > 1 and dp % par.ep:
            raise InputError(f"ep({par.ep}) does not divide dp({dp}) = gpus({w}) / (tp({par.tp}) * pp({par.pp}) * cp({par.cp}))")
        if par.virtual_stages > 1 and par.pp == 1:
            raise InputError(f"--virtual-stages {par.virtual_stages} needs pipeline parallelism (--pp > 1)")
        arch = self.model.architecture
        needs_shape = [flag for flag, on in (("--seq-len", self.workload is not None), ("--cp", par.cp > 1),
                                             ("--ep", par.ep > 1), ("--virtual-stages", par.virtual_stages > 1)) if on]  # fmt: skip
        if arch is None and needs_shape:
            raise InputError(f"{', '.join(needs_shape)} needs the model's shape: give --model, --hf-config or --layers/--hidden/--heads/--vocab")
        if arch is not None:
            from memcalc.model.params import check_tp

            check_tp(arch, par.tp)
            if arch.layers % (par.pp * par.virtual_stages):
                raise InputError(
                    f"layers({arch.layers}) is not divisible by pp({par.pp}) * virtual_stages({par.virtual_stages})"
                )
            if par.ep > 1 and (not arch.moe or arch.experts % par.ep):
                raise InputError(f"ep({par.ep}) needs an MoE model whose experts ({arch.experts}) it divides")
            if self.workload is not None and self.workload.seq_len % par.cp:
                raise InputError(f"cp({par.cp}) does not divide seq_len({self.workload.seq_len})")
        spec = self.strategy.spec
        if self.accounting == "deepspeed-estimator":
            if spec.name not in ("zero-1", "zero-2", "zero-3"):
                raise InputError(f"--accounting deepspeed-estimator covers DeepSpeed ZeRO stages 1-3 (--stage 1|2|3), not {spec.label}")
            if self.workload is not None or mp > 1:
                raise InputError("--accounting deepspeed-estimator counts model states on plain data parallelism only, "
                                 "as DeepSpeed's functions do; drop --seq-len, --tp, --pp and --cp")  # fmt: skip
            if spec.name == "zero-3" and arch is None and self.estimator.largest_layer_params is None:
                raise InputError("DeepSpeed's ZeRO-3 estimator needs the largest layer: give --model/--hf-config or "
                                 "--largest-layer-params")  # fmt: skip
        if self.accounting == "implementation":
            if spec.framework == "deepspeed" and self.optimizer.name not in ("adamw", "sgd", "sgd-momentum"):
                raise InputError(f"--accounting implementation models DeepSpeed with a torch.optim client optimizer; "
                                 f"{self.optimizer.name} is not one")  # fmt: skip
            if arch is None:
                raise InputError("--accounting implementation follows the framework unit by unit: give the model's shape "
                                 "(--model, --hf-config or --layers/--hidden/--heads/--vocab)")  # fmt: skip
            if mp > 1 or par.ep > 1:
                raise InputError("--accounting implementation covers data parallelism (DDP, FSDP) only so far; drop --tp, --pp, --cp, --ep")
            if self.strategy.offload_params != "none" or self.strategy.offload_optimizer != "none":
                raise InputError("--accounting implementation does not model CPU offload yet; use --accounting paper")
        mnp = self.framework.min_num_params
        if mnp is not None and (spec.framework != "fsdp" or self.framework.fsdp_version != 1 or self.accounting != "implementation"):
            raise InputError("--min-num-params is FSDP1's size_based_auto_wrap_policy: it needs --fsdp with --fsdp-version 1 "
                             f"and --accounting implementation (got {spec.label}"
                             f"{', --fsdp-version 2' if spec.framework == 'fsdp' and self.framework.fsdp_version == 2 else ''}, "
                             f"--accounting {self.accounting})")  # fmt: skip
        z3 = self.framework.zero3_flags
        if z3 and (spec.name != "zero-3" or self.accounting != "implementation"):
            raise InputError(f"{', '.join(z3)}: DeepSpeed ZeRO-3 coordinator settings, used only with --stage 3 "
                             f"--accounting implementation (got {spec.label}, --accounting {self.accounting})")  # fmt: skip
        if self.strategy.shard_group is not None and not spec.hybrid:
            raise InputError(
                f"--shard-group applies to HYBRID_SHARD and _HYBRID_SHARD_ZERO2 only, not {spec.label}"
            )
        if spec.hybrid:
            f = self.shard_group_size
            if f > dp or dp % f:
                raise InputError(f"--shard-group {f} must divide the data-parallel size {dp}")
            span = f * par.tp * par.cp
            if span > g and span % g:
                raise InputError(f"--shard-group {f} spans nodes, so it must fill whole nodes of --gpus-per-node {g}")
        return self

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / (tp x pp x cp)."""
        return self.cluster.gpus // self.parallelism.model_parallel

    @property
    def dp_per_node(self) -> int:
        """Data-parallel ranks inside one node (tensor and context parallelism fill a node first)."""
        return max(1, min(self.dp, self.cluster.gpus_per_node // (self.parallelism.tp * self.parallelism.cp)))

    @property
    def shard_group_size(self) -> int:
        """N in the ZeRO formulas: the ranks one copy of the model states is sharded over."""
        spec = self.strategy.spec
        if not (spec.shards_params or spec.shards_grads or spec.shards_optimizer):
            return 1
        if spec.hybrid:
            return self.strategy.shard_group or self.dp_per_node
        return self.dp

    @property
    def replicas(self) -> int:
        """Copies of the sharded model states: dp / shard group for hybrids, 1 for plain sharding."""
        spec = self.strategy.spec
        if spec.hybrid:
            return self.dp // self.shard_group_size
        return self.dp if self.shard_group_size == 1 else 1

    @property
    def dropout(self) -> float:
        wl, arch = self.workload, self.model.architecture
        if wl is not None and wl.dropout is not None:
            return wl.dropout
        return arch.dropout if arch is not None else 0.0
