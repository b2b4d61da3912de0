"""The CUDA caching allocator on top of allocated bytes: rounding, reserved memory, context, NCCL, a fit verdict.

Source: torch ``c10/cuda/CUDACachingAllocator.cpp``: ``kMinBlockSize = 512`` (``round_size`` rounds every request
up to a multiple of 512 B), ``kSmallSize = 1 MiB`` (requests up to it come from the small pool, carved from
``kSmallBuffer = 2 MiB`` segments), ``kMinLargeAlloc = 10 MiB`` (larger requests below it get a
``kLargeBuffer = 20 MiB`` segment), ``kRoundLarge = 2 MiB`` (requests from 10 MiB up get their own segment rounded
to 2 MiB); ``should_split`` splits a large block only when more than ``kSmallSize`` would remain, so a block that
leaves at most 1 MiB over is handed out whole and counts whole in ``allocated_bytes``. Freed blocks stay reserved
(``max_memory_reserved`` ≥ ``max_memory_allocated``) and only wholly free segments can be released to retry a
failed ``cudaMalloc`` (``release_cached_blocks``), so free memory split across partly used segments cannot serve a
large request: a step can fail with free but fragmented memory.

Measured (``/work/shared/measurements/h100-single-gpu.md``, DOMAIN §10): the CUDA context and kernels outside the
allocator take 0.58-0.75 GiB on an H100 with torch 2.11; ``max_memory_reserved − max_memory_allocated`` was
0.3-7.8 GiB on one GPU over the measured runs. NCCL: ``NCCL_BUFFSIZE`` (4 MiB) per channel and peer per
communicator (NCCL docs, env.html).
"""

from __future__ import annotations


from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.units import GiB

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20

CONTEXT_LOW = int(0.58 * GiB)
CONTEXT_HIGH = int(0.75 * GiB)
"""CUDA context, cuDNN/cuBLAS handles and kernels outside the allocator, H100 + torch 2.11 (measured range)."""
GAP_LOW = int(0.3 * GiB)
GAP_HIGH = int(7.8 * GiB)
"""Reserved − allocated over every single-GPU run measured (the extremes of the set, not one row's value)."""
GAP_FRACTION = 0.186
"""The widest reserved − allocated gap relative to the allocated peak over the measured single-GPU runs:
TinyLlama 1.1B, pure bf16, sdpa, recompute on, seq 4096, micro-batch 8: 25.12 GiB reserved over 21.18 GiB
allocated (``/work/shared/measurements/h100-single-gpu.md``; the others: 1.5-15.4 %). The blocks the allocator
caches are blocks the step allocated, so its gap grows with the step: a 2 GiB step cannot strand 7.8 GiB."""
NCCL_BUFFSIZE = 4 << 20


def round_request(size: int) -> int:
    """``round_size``: requests below 512 B take 512 B; others round up to a multiple of 512 B."""
    if size < 0:
        raise InputError(f"allocation size {size} must be non-negative")
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """``get_allocation_size``: the ``cudaMalloc`` a request triggers when no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def block_from_new_segment(size: int) -> int:
    """Bytes ``allocated_bytes`` counts for a large request served by a fresh segment: the rounded request if the
    remainder is split off (more than 1 MiB left), else the whole segment (``should_split``)."""
    need = round_request(size)
    if need <= SMALL_SIZE:
        return need  # small pool: always split (remainder >= kMinBlockSize)
    rest = segment_size(need) - need
    return need if rest > SMALL_SIZE else need + rest


def allocated(tensor_bytes: list[int] | tuple[int, ...]) -> int:
    """Allocated bytes of live tensors, each rounded to 512 B (the least the allocator counts)."""
    return sum(round_request(n) for n in tensor_bytes if n)


def nccl_buffers(communicators: int, channels: int, peers: int, buffsize: int = NCCL_BUFFSIZE) -> int:
    """NCCL's staging buffers: ``NCCL_BUFFSIZE`` per channel and peer, per communicator (outside the allocator)."""
    if min(communicators, channels, peers) < 0:
        raise InputError("communicators, channels and peers must be non-negative")
    return communicators * channels * peers * buffsize


@frozen
class Fit:
    peak_allocated: int
    peak_reserved: int
    """Point estimate: allocated + the low end of the measured gap (reserved is never below it)."""
    reserved_high: int
    """Allocated + the fragmentation band's top: max(measured largest gap, the largest request at the peak)."""
    context: int
    communication: int
    total: int
    """peak_reserved + context + communication buffers."""
    capacity: int
    verdict: str
    """fits | at-risk | oom"""
    margin: int
    """capacity − (peak_allocated + context + communication)."""


def fit(peak_allocated: int, capacity: int, *, largest_request: int = 0, context: int = CONTEXT_HIGH,
        communication: int = 0, gap_low: int = GAP_LOW, gap_high: int = GAP_HIGH,
        gap_fraction: float = GAP_FRACTION) -> Fit:  # fmt: skip
    """The verdict for a step whose allocated peak is ``peak_allocated`` on a GPU of ``capacity`` bytes.

    oom: even the least reserved overhead ever measured (``gap_low``) does not fit. at-risk: the margin left is
    within the allocator's variability, whose top is the larger of the widest measured gap for a step of this size
    (``gap_fraction`` of the allocated peak, at most ``gap_high``, the widest measured at all) and the largest single
    request at the peak (a request is served by one block; free memory split among partly used segments cannot
    serve it, so a margin below that request can fail however much is free in total). fits: otherwise.
    On an 80 GB card every step near capacity allocates more than 42 GiB, where the band is the full 7.8 GiB; on a
    24 GB card a 20 GiB step's band is 3.7 GiB.
    """
    if capacity <= 0 or peak_allocated < 0:
        raise InputError(f"capacity {capacity} must be positive and peak_allocated {peak_allocated} non-negative")
    band = max(min(gap_high, int(gap_fraction * peak_allocated)), largest_request)
    margin = capacity - (peak_allocated + context + communication)
    verdict = "oom" if margin < gap_low else "at-risk" if margin < band else "fits"
    reserved = peak_allocated + gap_low
    return Fit(peak_allocated, reserved, peak_allocated + band, context, communication,
               reserved + context + communication, capacity, verdict, margin)  # fmt: skip
