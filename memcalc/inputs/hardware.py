"""The hardware: a GPU datasheet (presets/gpus/*.toml), how GPUs sit in nodes, and memory outside the model."""


from memcalc.errors import InputError
from memcalc.layout import plan
from memcalc.validated import Validated, bounded
from memcalc.units import GB, GiB, gib

DEFAULT_GPU = "a100-sxm-80gb"
"""The GPU of ``memcalc estimate``, ``compare`` and ``collectives`` when none is named."""
MAX_GPUS = 2**20
"""1,048,576 GPUs: 64x the 16,384 H100s that trained Llama 3 405B (arXiv 2407.21783 §3.3.1); bounds the world size,
the GPUs of a node and a shard group alike."""
MAX_GIB = 2**20
"""A size in GiB up to 1 PiB: far beyond any GPU's memory (192 GB on an MI300X), and exact in bytes."""
MAX_DATASHEET = 1e9
"""GB, GB/s or TFLOPS on a datasheet: a billion is far beyond any device (an H100 moves 3,350 GB/s)."""


class GPU(Validated):
    """One accelerator, as its datasheet describes it. Preset keys equal these field names."""

    key: str
    """The preset name (file stem), e.g. ``a100-sxm-80gb``."""
    name: str
    """The marketing name."""
    aliases: tuple[str, ...] = ()
    """Other names users type (``a100-80g``)."""
    memory_gb: float = bounded(gt=0, le=MAX_DATASHEET)
    """Memory as sold, decimal GB (the datasheet's figure)."""
    usable_memory_gib: float = bounded(gt=0, le=MAX_DATASHEET)
    """Memory the framework can allocate, GiB: the total capacity PyTorch reports for the device."""
    hbm_gbps: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Peak memory bandwidth, GB/s. The step time needs it; memory does not (a file without it is answered memory
    alone, with a note saying why there is no step time)."""
    bf16_tflops: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Peak dense BF16 tensor throughput, TFLOPS (0 = not supported)."""
    fp16_tflops: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Peak dense FP16 tensor throughput, TFLOPS."""
    fp32_tflops: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Peak FP32 throughput (non-tensor), TFLOPS."""
    tf32_tflops: float | None = bounded(None, gt=0, le=MAX_DATASHEET)
    """Peak dense TF32 tensor throughput, TFLOPS, what fp32 training's matmuls run at (absent: no TF32 tensor cores,
    as on Volta, Turing and CDNA 2)."""
    fp8_tflops: float | None = bounded(None, gt=0, le=MAX_DATASHEET)
    """Peak dense FP8 tensor throughput with FP32 accumulate, TFLOPS (absent: no fp8 tensor cores)."""
    fp8: bool = True
    """Whether it has fp8 tensor cores, which torchao's float8 matmuls (``torch._scaled_mm``) need: NVIDIA compute
    capability 8.9 and up (Ada, Hopper, Blackwell) and AMD CDNA 3; ``false`` in the Volta, Turing, Ampere and CDNA 2
    files. A file that leaves it out is taken at its word for ``--float8``."""
    architecture: str | None = None
    """The chip's generation (``volta``, ``turing``, ``ampere``, ``ada``, ``hopper``, ``blackwell``, ``cdna2``,
    ``cdna3``): a GPU without its own calibration borrows the efficiency curves of the nearest measured one
    (``memcalc.time.datasheet``)."""
    intra_node_link: str = "intra-node"
    """The GPU-to-GPU link inside a node (``nvlink4``, ``pcie4``, ``infinity-fabric``)."""
    intra_node_gbps: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """GPU-to-GPU bandwidth inside a node, GB/s, both directions summed as datasheets quote it."""
    gpus_per_node: int | None = bounded(None, gt=0, le=MAX_GPUS)
    """GPUs behind one intra-node link in the typical system (absent: 8, the HGX board's and most PCIe servers')."""
    pcie_gbps: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Host link bandwidth each way, GB/s (PCIe Gen4 x16 about 32, Gen5 x16 about 64)."""
    network_gbps: float | None = bounded(None, ge=0, le=MAX_DATASHEET)
    """Typical inter-node network bandwidth per GPU each way, GB/s (200 Gb/s HDR = 25)."""
    source: str = ""
    """Where the figures come from."""

    @property
    def usable_memory_bytes(self) -> int:
        return gib(self.usable_memory_gib)

    @property
    def memory_bytes(self) -> int:
        return round(self.memory_gb * GB)

    def _check(self) -> None:
        # Datasheets' "GB" are binary in effect (an A100 80GB reports 79.15 GiB, more than 80e9 bytes), so the
        # usable GiB can at most equal the datasheet's figure.
        if self.usable_memory_gib > self.memory_gb:
            raise InputError(
                f"GPU {self.key!r}: usable_memory_gib {self.usable_memory_gib!r} is more than its memory_gb "
                f"{self.memory_gb!r}; accepted: at most {self.memory_gb!r} (the memory the card has)"
            )
        if not self.fp8 and self.fp8_tflops is not None:
            raise InputError(f"GPU {self.key!r}: fp8 = false with fp8_tflops = {self.fp8_tflops!r}; accepted: one or "
                             "the other (fp8_tflops alone says it has fp8 tensor cores)")


def check_precision(gpu: GPU, precision: str, compute_dtype: str) -> None:
    """A precision whose matmuls run in bf16 (bf16-mixed, bf16, amp-bf16) needs a GPU with bf16 (``bf16_tflops``
    above 0 in its datasheet: NVIDIA Ampere and later, AMD CDNA 2 and later; a V100 has none), else one line naming
    the GPU and the precisions it runs."""
    if compute_dtype == "bf16" and gpu.bf16_tflops == 0:
        from memcalc.layout.dtypes import PRECISIONS

        runs = ", ".join(n for n, p in PRECISIONS.items() if p.compute_dtype != "bf16")
        raise InputError(f"--precision {precision} computes in bf16, which {gpu.name} ({gpu.key}) does not run (its "
                         f"datasheet has no bf16); accepted on it: {runs}")


class Cluster(Validated):
    """How many GPUs, and how they sit in nodes."""

    gpus: int = bounded(gt=0, le=MAX_GPUS, why="64x the largest published training run")
    """World size W."""
    gpus_per_node: int = bounded(default=8, gt=0, le=MAX_GPUS, why="64x the largest published training run")
    """G: GPUs in one node, behind one NVLink/PCIe domain and one host's RAM."""

    def _check(self) -> None:
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise InputError(
                f"--gpus {self.gpus} is not a multiple of --gpus-per-node {self.gpus_per_node}; "
                f"use a world size up to one node or a multiple of {self.gpus_per_node}"
            )

    @property
    def nodes(self) -> int:
        return plan.nodes(self.gpus, self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        """GPUs actually used in each node: G, or W when the job is smaller than a node."""
        return plan.ranks_per_node(self.gpus, self.gpus_per_node)


class Overheads(Validated):
    """GPU memory that is not model state; each becomes its own row of the breakdown."""

    cuda_context_bytes: int = bounded(default=gib(0.5), ge=0, le=MAX_GIB * GiB, why="1 PiB")
    """CUDA context and kernels loaded by the framework (about 0.3-0.5 GiB on A100/H100 with lazy loading)."""
    allocator_reserve_bytes: int = bounded(default=0, ge=0, le=MAX_GIB * GiB, why="1 PiB")
    """Headroom kept for the caching allocator's fragmentation; 0 unless you set it."""



