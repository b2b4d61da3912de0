"""How the run is laid out: the data-parallel strategy, model parallelism and the framework's own settings."""

from typing import Literal


from memcalc.errors import InputError
from memcalc.validated import Validated, bounded
from memcalc.layout.strategies import STRATEGIES, OffloadDevice, StrategyName, StrategySpec
from memcalc.layout.plan import Zero3Settings
from memcalc.model.architecture import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_POSITIONS
from memcalc.inputs.hardware import MAX_GPUS
from memcalc.units import MAX_COUNT


class Strategy(Validated):
    """A data-parallel strategy (a row of the strategy table) and where it offloads."""

    name: StrategyName = "zero-0"
    """The strategy: zero-0..3 (DeepSpeed), FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 (FSDP) or ddp."""
    offload_optimizer: OffloadDevice = "none"
    """Where optimizer states (master copy, moments) and the reduced gradient shard live."""
    offload_params: OffloadDevice = "none"
    """Where the parameter shard lives between uses."""
    shard_group: int | None = bounded(default=None, gt=0, le=MAX_GPUS, why="a shard group holds at most every GPU")
    """Hybrid strategies: GPUs in one shard group (default: one node)."""

    @property
    def spec(self) -> StrategySpec:
        return STRATEGIES[self.name]

    @property
    def offload(self) -> tuple[str, str]:
        """(optimizer states, parameters) devices: none, cpu or nvme."""
        return self.offload_optimizer, self.offload_params

    @property
    def offloads(self) -> bool:
        """Something (optimizer states or parameters) lives off the GPU."""
        return self.offload != ("none", "none")

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

    def _check(self) -> None:
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
            return
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

    @property
    def optimizer_device(self) -> OffloadDevice:
        """Where optimizer states live (FSDP's CPUOffload takes them along with the params)."""
        if self.spec.offload_together:
            return self.offload_params
        return self.offload_optimizer


class Parallelism(Validated):
    """Model parallelism. dp = gpus / (tp x pp x cp); ZeRO and FSDP shard over dp x cp (the frameworks' flattened
    data x context group; ``shard_over="dp"`` for dp only)."""

    tp: int = bounded(default=1, gt=0, le=MAX_HEADS, why="tp divides the attention heads")
    """Tensor-parallel degree (Megatron); 1 means disabled."""
    pp: int = bounded(default=1, gt=0, le=MAX_LAYERS, why="a pipeline stage holds at least one layer")
    """Pipeline stages; 1 means disabled."""
    cp: int = bounded(default=1, gt=0, le=MAX_POSITIONS, why="cp divides the sequence")
    """Context-parallel degree: the sequence is split over cp ranks; 1 means disabled."""
    ep: int = bounded(default=1, gt=0, le=MAX_EXPERTS, why="ep divides the experts")
    """Expert-parallel degree: MoE experts are spread over ep data-parallel ranks; 1 means disabled."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropouts split over the tp ranks."""
    virtual_stages: int = bounded(default=1, gt=0, le=MAX_LAYERS, why="a model chunk holds at least one layer")
    """Model chunks per pipeline rank (interleaved 1F1B); 1 means the plain schedule."""
    framework: Literal["hf", "torchtitan", "torchtune", "megatron", "deepspeed"] | None = None
    """The framework whose composition applies (memcalc.layout.compose): what it can run, the group it shards over,
    how it splits layers over pipeline stages. None: dp x cp sharding, the even split."""
    shard_over: Literal["dp", "dp-cp"] | None = None
    """Override: the ranks model states are sharded over, dp or dp-cp (None: the framework's, else dp-cp)."""
    stage_layers: tuple[int, ...] | None = None
    """Decoder layers per pipeline stage (pp x virtual_stages entries, in stage order); None: the framework's split."""

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def _check(self) -> None:
        from memcalc.layout.compose import check_framework, framework

        check_framework(framework(self.framework), self.cp, self.pp)


class FrameworkOptions(Validated):
    """How the framework is configured (``--accounting implementation``)."""

    fsdp_version: Literal[1, 2] = 1
    """1: FullyShardedDataParallel (FlatParameter per unit); 2: fully_shard (per-parameter DTensor shards)."""
    backward_prefetch: Literal["pre", "post", "none"] | None = None
    """FSDP1: its BackwardPrefetch (BACKWARD_PRE, BACKWARD_POST, none); None: the framework's (accelerate and the
    Hugging Face Trainer none, torch's own default pre)."""
    fsdp_wrap: Literal["root", "separate", "separate-reshard"] | None = None
    """FSDP2: where its units put the embedding and the head (memcalc.layout.compose.FSDP_WRAPS); None: the
    framework's (torchtitan separate, torchtune separate-reshard), else root."""
    fsdp_auto_wrap: Literal["transformer", "none"] | None = None
    """FSDP: its units over the decoder layers: transformer (one per decoder layer: accelerate's
    TRANSFORMER_BASED_WRAP, torchtitan, torchtune) or none (accelerate's NO_WRAP: the layers in the root unit,
    gathered all step, their gradients unsharded until the root's post-backward); None: transformer."""
    bucket_view: bool = False
    """DDP: gradient_as_bucket_view (buckets are the gradients, no second copy)."""
    min_num_params: int | None = bounded(default=None, gt=0, le=MAX_COUNT)
    """FSDP: size_based_auto_wrap_policy's threshold; None wraps one unit per decoder layer."""
    max_reuse_distance: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-3: stage3_max_reuse_distance in elements (None: DeepSpeed's default, 1e9)."""
    max_live_parameters: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-3: stage3_max_live_parameters in elements (None: DeepSpeed's default, 1e9)."""
    prefetch_bucket_size: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-3: stage3_prefetch_bucket_size in elements (None: DeepSpeed's default, 5e7)."""
    persistence_threshold: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-3: stage3_param_persistence_threshold in elements (None: DeepSpeed's default, 1e5)."""
    sub_group_size: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-3: sub_group_size in elements, the optimizer's sub-groups (None: DeepSpeed's default, 1e9;
    0: one parameter each). Realistic accounting."""
    reduce_bucket_size: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """DeepSpeed ZeRO-1/2/3: reduce_bucket_size in elements (None: DeepSpeed's default, 5e8), the gradient bucket the
    realistic accounting holds during backward (ZeRO-3: all step). 0, which DeepSpeed accepts (``ge=0`` in
    runtime/zero/config.py): an empty bucket, every gradient larger than it and reduced alone."""
    overlap_comm: bool | None = None
    """DeepSpeed ZeRO-1/2: overlap_comm (None: DeepSpeed's default, off for stages 1-2): the reduction runs beside
    backward in a second gradient bucket."""
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = None
    """Megatron-Core: the dtype of the contiguous gradient buffer, in which gradients are accumulated and reduced:
    fp32 (``main_grad``: Megatron-LM's default under ``--bf16``, ``grad_reduce_in_fp32``) or bf16
    (``--grad-reduce-in-bf16``; Megatron-Bridge's Llama 3 performance recipes set ``grad_reduce_in_fp32=False``);
    None: the framework's own (fp32)."""
    defer_embedding_wgrad: int | None = bounded(default=None, ge=0, le=MAX_COUNT)
    """Megatron-Core: the output layer's weight-gradient GEMMs deferred to the pipeline flush
    (``--defer-embedding-wgrad-compute`` with ``--wgrad-deferral-limit`` N, 0: every micro-batch), the last stage
    keeping each deferred micro-batch's input and output gradient; None: off (Megatron-LM's default)."""
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
                                     ("--sub-group-size", self.sub_group_size),
                                     ("--zero3-step", None if self.zero3_step == "steady" else self.zero3_step))
                if v is not None]  # fmt: skip

    def zero3(self) -> Zero3Settings:
        """The settings DeepSpeed's ZeRO-3 coordinator runs with: these, DeepSpeed's defaults where unset."""
        given = {"max_reuse_distance": self.max_reuse_distance, "max_live_parameters": self.max_live_parameters,
                 "prefetch_bucket_size": self.prefetch_bucket_size,
                 "param_persistence_threshold": self.persistence_threshold,
                 "sub_group_size": self.sub_group_size}  # fmt: skip
        return Zero3Settings(**{k: v for k, v in given.items() if v is not None})



MAX_BUFFER_FACTOR = 1000.0
"""DeepSpeed's additional_buffer_factor multiplies its CPU figure; its default is 1.5, and 1,000 times any host's
figure is beyond any host."""


class EstimatorOptions(Validated):
    """Arguments of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (``--accounting deepspeed-estimator``)."""

    zero_init: bool = True
    """ZeRO-3: the model was built under deepspeed.zero.Init (DeepSpeed's default)."""
    buffer_factor: float = bounded(default=1.5, gt=0, le=MAX_BUFFER_FACTOR, why="DeepSpeed's default is 1.5")
    """additional_buffer_factor on the CPU figure."""
    largest_layer_params: int | None = bounded(default=None, gt=0, le=MAX_COUNT)
    """ZeRO-3: the most parameters one module owns; taken from the architecture when there is one."""


    def check_largest(self, parameters: int | None, arch: object = None) -> None:
        """One module is part of the model: ``largest_layer_params`` at most the model's parameters (a bare count, or
        the architecture's), else one line."""
        big = self.largest_layer_params
        if big is None:
            return
        if parameters is None:
            from memcalc.model.params import model_params

            parameters = model_params(arch).total  # type: ignore[arg-type]
        if big > parameters:
            raise InputError(f"--largest-layer-params {big:,} is more than the model's {parameters:,} parameters; "
                             f"accepted: at most {parameters:,} (the largest module is one part of the model)")




class Timing(Validated):
    """How the step is timed (``memcalc.time``): the cluster, link overrides, and what to train."""

    cluster: str | None = None
    """A cluster preset (dgx-a100, dgx-h100, hgx-h200, p4d-a100, p5-h100) or TOML path; None: the first built from
    the GPU."""
    intra_node_gbps: float | None = bounded(default=None, gt=0, le=100_000, why="GB/s per GPU per direction")
    """NVLink/PCIe bandwidth between GPUs of a node, GB/s per GPU per direction (None: the cluster's)."""
    network_gbits_per_gpu: float | None = bounded(default=None, gt=0, le=100_000, why="Gb/s per GPU")
    """Network bandwidth per GPU, Gb/s (None: the cluster's)."""
    intra_node_efficiency: float | None = bounded(default=None, gt=0, le=1, why="a fraction of the link")
    """Fraction of the NVLink bandwidth large collectives reach (None: the calibration's)."""
    network_efficiency: float | None = bounded(default=None, gt=0, le=1, why="a fraction of the link")
    """Fraction of the network bandwidth large collectives reach (None: the calibration's)."""
    pcie_gbps: float | None = bounded(default=None, gt=0, le=10_000, why="GB/s per direction")
    """Host link bandwidth each way, GB/s per GPU (None: the cluster's)."""
    host_memory_gbps: float | None = bounded(default=None, gt=0, le=100_000, why="GB/s per node")
    """Host memory bandwidth per node, GB/s, for CPU Adam under offload (None: the cluster's)."""
    tokens: float | None = bounded(default=None, gt=0, le=1e18, why="a quintillion tokens")
    """Tokens to train on: gives the time to train."""
    price_per_gpu_hour: float | None = bounded(default=None, ge=0, le=1e6, why="per GPU-hour")
    """With tokens: gives the cost, in the price's currency."""

    def _check(self) -> None:
        if self.price_per_gpu_hour is not None and self.tokens is None:
            raise InputError("--price-per-gpu-hour needs --tokens: the cost is that of training on them")
