"""Collective primitives: what one GPU sends for a collective on a payload of S bytes over n ranks.

Source: NVIDIA nccl-tests, doc/PERFORMANCE.md. S is the full array (the gathered output for
all-gather, the unreduced input for reduce-scatter, the tensor for all-reduce); busbw = algbw x
factor, and with a ring each rank sends factor x S bytes:
    all-reduce 2(n-1)/n, reduce-scatter (n-1)/n, all-gather (n-1)/n, all-to-all (n-1)/n,
    broadcast 1, reduce 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from memcalc.units import ceil_div

if TYPE_CHECKING:
    from fractions import Fraction

CollectiveOp = Literal["all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast", "reduce"]


def bus_factor(op: CollectiveOp, n: int) -> Fraction:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``n`` ranks (exact; ``fractions`` and the ``decimal`` module it
    loads are imported here, not by every estimate: 2 ms)."""
    from fractions import Fraction

    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got {n}")
    if op == "all-reduce":
        return Fraction(2 * (n - 1), n)
    if op in ("reduce-scatter", "all-gather", "all-to-all"):
        return Fraction(n - 1, n)
    if op in ("broadcast", "reduce"):
        return Fraction(1) if n > 1 else Fraction(0)
    raise ValueError(f"unknown collective {op!r}")


def sent_bytes_per_rank(op: CollectiveOp, payload_bytes: int, n: int) -> int:
    """Bytes one rank sends under a ring: S x factor, rounded up to a whole byte (integer arithmetic: exact)."""
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got {n}")
    if op == "all-reduce":
        return ceil_div(payload_bytes * 2 * (n - 1), n)
    if op in ("reduce-scatter", "all-gather", "all-to-all"):
        return ceil_div(payload_bytes * (n - 1), n)
    if op in ("broadcast", "reduce"):
        return payload_bytes if n > 1 else 0
    raise ValueError(f"unknown collective {op!r}")
