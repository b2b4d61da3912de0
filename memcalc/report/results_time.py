"""The step-time part of a result: where one optimizer step's seconds go, and the throughput, MFU and cost they
give (``Estimate.time``)."""

from pydantic import Field

from memcalc.report.result_base import _Result
from memcalc.validated import empty_dict


class TimeBreakdown(_Result):
    """Where one optimizer step's seconds go on the slowest GPU; the parts add up to ``step_s``."""

    compute_s: float
    """Matmuls and attention at the GPU's achievable rate for their shapes (memcalc/time/flops.py, step.py)."""
    memory_bound_s: float
    """Norms, activations, element-wise ops: bytes moved over HBM bandwidth."""
    recompute_s: float
    """The forward work recomputation repeats."""
    communication_s: dict[str, float]
    """Exposed (not hidden behind compute) time of each group's collectives, seconds."""
    bubble_s: float
    """Pipeline bubble: (p - 1) micro-batches' worth for 1F1B, divided by the chunks when interleaved."""
    optimizer_s: float
    """The optimizer step (foreach or fused AdamW on the GPU; CPU Adam when offloaded)."""
    offload_s: float
    """Exposed host copies (PCIe, NVMe)."""
    host_s: float = 0.0
    """Time the GPU waits for the host to launch its kernels (eager launches, FSDP2 hooks, DTensor dispatch;
    ``memcalc.time.kernels``): a floor the GPU cannot go under, shown where the host falls behind."""


class StepTimeInfo(_Result):
    """How long one optimizer step takes, and what that buys (``memcalc.time``)."""

    cluster: str
    """The cluster preset whose links and calibration timed the step (``<gpu>-node``: a generic node built from the
    GPU's datasheet, ``memcalc.time.datasheet``)."""
    node: str = ""
    """The cluster's node in words (a generic node says where each of its rates comes from)."""
    calibration: str = ""
    """How the GPU's achievable rates were made: its calibration file, or derived from its datasheet and whose
    efficiency curves it borrows."""
    efficiency_sources: dict[str, str] = Field(default_factory=empty_dict)
    """Each group of efficiencies (hbm, gemm, attention, optimizer, cross_entropy, intra_node, network) and where it
    comes from: "measured: ...", "published: ..." or "datasheet: borrowed from <gpu> ..."."""
    step_s: float
    """Seconds per optimizer step on the slowest GPU."""
    tokens_per_step: float
    """Tokens per optimizer step, over all data-parallel ranks."""
    tokens_per_s: float
    """tokens_per_step / step_s."""
    tokens_per_s_per_gpu: float
    """tokens_per_s / GPUs."""
    model_tflops_per_gpu: float
    """Model FLOPs per GPU per second, in TFLOP/s (``flop_convention``)."""
    peak_tflops_per_gpu: float
    """The GPU's dense datasheet rate in the training dtype, TFLOP/s."""
    mfu: float
    """Model FLOPs utilisation: model_tflops_per_gpu / peak (no recompute counted)."""
    hfu: float
    """Hardware FLOPs utilisation: recomputed work counted too."""
    flop_convention: str
    """How model FLOPs are counted (6N per token plus attention, or as the paper named)."""
    breakdown: TimeBreakdown
    """Where the step's seconds go."""
    time_to_train_s: float | None = None
    """With ``tokens``: seconds to train on them at this rate."""
    cost: float | None = None
    """With ``tokens`` and ``price_per_gpu_hour``: price x GPUs x hours, in the price's currency."""
