"""The one shape every accounting returns: rows of the memory breakdown, as plain tuples.

An accounting (``paper``, ``implementation``, ``estimator``) answers with rows for one rank; the report floor
turns them into ``memcalc.report.results.MemoryRow`` once. Tuples, because a planner makes millions of them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple


class Row(NamedTuple):
    """One line of the memory breakdown (same fields as ``memcalc.report.results.MemoryRow``)."""

    key: str
    """Stable identifier: ``parameters``, ``gradients``, ``master_weights``, ``optimizer_moments``, ..."""
    label: str
    bytes: int
    location: str
    """gpu, cpu or nvme."""
    category: str
    """model_state, activation or overhead."""
    detail: str
    """The formula and its source."""


def total(rows: list[Row], key: str, location: str = "gpu") -> int:
    """Bytes of the rows named ``key`` at ``location``."""
    return sum(r.bytes for r in rows if r.key == key and r.location == location)


@lru_cache(maxsize=64)
def overhead_rows(cuda_context: int, reserve: int) -> tuple[Row, ...]:
    """GPU memory outside the model: each overhead its own row, with its own input (STYLE: overheads are visible)."""
    return (
        Row("cuda_context", "CUDA context", cuda_context, "gpu", "overhead",
            "CUDA context and loaded kernels (--cuda-context-gib)"),
        Row("allocator_reserve", "allocator reserve", reserve, "gpu", "overhead",
            "fragmentation headroom (--reserve-gib)"),
    )


class Realistic(NamedTuple):
    """A realistic accounting's answer for one rank: ``memcalc.memory.accountings.realistic`` (Hugging Face, torchtitan,
    torchtune, DeepSpeed) and ``memcalc.memory.accountings.megatron`` return it."""

    rows: list[Row]
    """The parts alive at the peak moment, then the allocator's, the context's and NCCL's."""
    peak_allocated: int
    peak_reserved: int
    total: int
    verdict: str
    margin: int
    peak_phase: str
    peak_moment: str
    phases: dict[str, int]
    """Each phase's own peak of allocated bytes (layers folded into forward and backward)."""
