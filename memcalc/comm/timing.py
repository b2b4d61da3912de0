"""How long one collective takes: the latency-bandwidth (alpha-beta) model per algorithm, and the bus bandwidth it implies.

Sources:
- NVIDIA nccl-tests doc/PERFORMANCE.md and src/*.cu: algbw = S / t, busbw = algbw x factor, with the factors of
  ``memcalc.comm.collectives.bus_factor``; gather and scatter (src/gather.cu, src/scatter.cu) use (n-1)/n, send/recv 1.
- Ring time = steps x alpha + factor x S / B (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
  communication operations in MPICH"; DOMAIN.md §11). A tree (NCCL's double binary tree) moves the same bytes per rank
  in 2 log2(n) steps. Groups spanning nodes: a flat ring runs at the slower of NVLink and the group's NICs in one node
  (each rank's ring channel crosses the node boundary through its own NIC), and a two-level (hierarchical) all-reduce
  reduce-scatters inside the node, all-reduces 1/g of the data across nodes, and all-gathers inside the node.
The faster algorithm is taken and named, as NCCL's tuner does.
"""

from __future__ import annotations

import bisect
import math
from functools import cache

from memcalc.comm.collectives import bus_factor
from memcalc.errors import InputError, did_you_mean
from memcalc.frozen import frozen

PRIMITIVES = ("broadcast", "scatter", "gather", "reduce", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
              "send/recv")  # fmt: skip
_ALIASES = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
            "alltoall": "all-to-all", "send": "send/recv", "recv": "send/recv", "sendrecv": "send/recv",
            "p2p": "send/recv"}  # fmt: skip


@frozen
class Link:
    """One GPU's port on one kind of link."""

    name: str
    bandwidth: float
    """Bytes/s per direction per GPU, nominal (NVLink per GPU, or the GPU's share of the node's NICs)."""
    latency_s: float
    """Seconds per algorithm step (one hop)."""
    efficiency: float = 1.0
    """Fraction of ``bandwidth`` a large ring collective reaches (measured busbw / nominal)."""
    allreduce_bandwidth: float | None = None
    """Measured all-reduce bus bandwidth where the switch reduces in-network (NVLink SHARP) and beats the ring."""

    @property
    def achievable(self) -> float:
        return self.bandwidth * self.efficiency


@frozen
class Group:
    """The ranks of one collective: ``n`` in all, ``per_node`` of them inside each node."""

    n: int
    per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.n // self.per_node)

    @classmethod
    def of(cls, n: int, gpus_per_node: int, crosses_nodes: bool | None = None) -> Group:
        """Ranks packed into nodes of ``gpus_per_node`` (Megatron order); ``crosses_nodes`` with a node-sized or
        smaller group means its members stand one per node (a data-parallel group under TP x PP)."""
        if crosses_nodes and n <= gpus_per_node:
            return cls(n, 1)
        return cls(n, min(n, gpus_per_node))


@frozen
class PrimitiveTime:
    """One collective on a message of ``size_bytes`` (nccl-tests' S) over a group."""

    name: str
    algorithm: str
    size_bytes: int
    ranks: int
    sent_bytes: int
    """Per rank (the busiest one for rooted primitives)."""
    received_bytes: int
    time_s: float
    bus_bandwidth: float
    """Bytes/s, nccl-tests' busbw: S / time x factor."""

    @property
    def alg_bandwidth(self) -> float:
        return self.size_bytes / self.time_s if self.time_s else 0.0


def canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key.replace("-", ""), key)
    if key not in PRIMITIVES:
        raise InputError(f"unknown collective {name!r}{did_you_mean(key, PRIMITIVES)}; known: {', '.join(PRIMITIVES)}")
    return key


def factor(name: str, n: int) -> float:
    """nccl-tests' bus factor; gather/scatter (n-1)/n (src/gather.cu), send/recv 1 (src/sendrecv.cu)."""
    if name in ("gather", "scatter"):
        return (n - 1) / n
    if name == "send/recv":
        return 1.0
    f = bus_factor(name, n)  # type: ignore[arg-type]
    return f.numerator / f.denominator


def volumes(name: str, size: int, n: int) -> tuple[int, int]:
    """(sent, received) bytes of the busiest rank: S x factor for rings, (n-1)/n S at the root of gather/scatter,
    S for send/recv and for the forwarding ranks of a pipelined broadcast/reduce chain."""
    if n == 1:
        return (0, 0)
    if name in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        v = round(size * factor(name, n))
        return (v, v)
    if name == "scatter":
        return (size * (n - 1) // n, size * (n - 1) // n)  # root sends, each leaf receives S/n: busiest is the root
    if name == "gather":
        return (size * (n - 1) // n, size * (n - 1) // n)
    return (size, size)  # broadcast, reduce (pipelined chain), send/recv


def _ring(steps: int, nbytes: float, link_bw: float, alpha: float) -> float:
    return steps * alpha + nbytes / link_bw


def _tree_steps(k: int) -> int:
    return 2 * math.ceil(math.log2(k)) if k > 1 else 0


def _flat_bandwidth(group: Group, intra: Link, inter: Link) -> tuple[float, float]:
    """(bytes/s per rank, seconds per step) of a flat ring over the group."""
    if group.nodes == 1:
        return intra.achievable, intra.latency_s
    bw = inter.achievable * group.per_node  # each rank's ring channel leaves the node on its own NIC
    if group.per_node > 1:
        bw = min(bw, intra.achievable)
    return bw, max(intra.latency_s, inter.latency_s)


def _all_reduce(size: float, group: Group, intra: Link, inter: Link) -> tuple[str, float]:
    n, g, k = group.n, group.per_node, group.nodes
    if k == 1:
        ring = ("ring", _ring(2 * (n - 1), 2 * (n - 1) / n * size, intra.achievable, intra.latency_s))
        if intra.allreduce_bandwidth:
            # Same step count as the ring: the 12 us small-message anchor was measured with whatever NCCL chose.
            nvls = ("nvls", _ring(2 * (n - 1), 2 * (n - 1) / n * size, intra.allreduce_bandwidth, intra.latency_s))
            return min(ring, nvls, key=lambda x: x[1])
        return ring
    bw, alpha = _flat_bandwidth(group, intra, inter)
    options = [("ring", _ring(2 * (n - 1), 2 * (n - 1) / n * size, bw, alpha))]
    if g == 1:
        options.append(("tree", _tree_steps(k) * inter.latency_s + 2 * (k - 1) / k * size / inter.achievable))
    else:
        intra_rs = _ring(g - 1, (g - 1) / g * size, intra.achievable, intra.latency_s)
        part = size / g
        inter_ar = min(_ring(2 * (k - 1), 2 * (k - 1) / k * part, inter.achievable, inter.latency_s),
                       _tree_steps(k) * inter.latency_s + 2 * (k - 1) / k * part / inter.achievable)  # fmt: skip
        options.append(("hierarchical", 2 * intra_rs + inter_ar))
    return min(options, key=lambda x: x[1])


@cache
def primitive_time(name: str, size_bytes: int, group: Group, intra: Link, inter: Link | None = None) -> PrimitiveTime:
    """Time of one ``name`` collective on S = ``size_bytes`` over ``group`` (links per GPU, inter for multi-node)."""
    name = canonical(name)
    n = group.n
    if n < 1 or group.per_node < 1 or group.per_node > n:
        raise InputError(f"group of {n} ranks with {group.per_node} per node is not possible; give 1 <= per_node <= n")
    if size_bytes < 0:
        raise InputError(f"message size {size_bytes} bytes is negative; give a size >= 0")
    inter = inter or intra
    sent, received = volumes(name, size_bytes, n)
    if n == 1 or size_bytes == 0:
        return PrimitiveTime(name, "local", size_bytes, n, 0, 0, 0.0, 0.0)
    s = float(size_bytes)
    bw, alpha = _flat_bandwidth(group, intra, inter)
    if name == "all-reduce":
        algo, t = _all_reduce(s, group, intra, inter)
    elif name in ("all-gather", "reduce-scatter"):
        algo, t = "ring", _ring(n - 1, (n - 1) / n * s, bw, alpha)
        if group.nodes > 1 and group.per_node > 1:
            g, k = group.per_node, group.nodes
            two = (_ring(g - 1, (g - 1) / g * s, intra.achievable, intra.latency_s)
                   + _ring(k - 1, (k - 1) / k * s / g, inter.achievable, inter.latency_s))  # fmt: skip
            if two < t:
                algo, t = "hierarchical", two
    elif name == "all-to-all":
        # Direct: every rank sends S/n to each peer at once; the bytes that leave the node go over its NICs.
        if group.nodes == 1:
            t = alpha + (n - 1) / n * s / intra.achievable
        else:
            off_node = (n - group.per_node) / n * s
            t = inter.latency_s + max((group.per_node - 1) / n * s / intra.achievable, off_node / inter.achievable)
        algo = "direct"
    elif name in ("scatter", "gather"):
        # Direct: the root exchanges S/n with every other rank; its own port is the bottleneck.
        root_bw = intra.achievable if group.nodes == 1 else min(intra.achievable, inter.achievable)
        algo, t = "direct", alpha + (n - 1) / n * s / root_bw
    elif name in ("broadcast", "reduce"):
        algo, t = "ring", _ring(n - 1, s, bw, alpha)  # pipelined chain: S per rank, n-1 hops of latency
        if group.nodes > 1:
            tree = _tree_steps(n) // 2 * alpha + s / bw
            if tree < t:
                algo, t = "tree", tree
    else:  # send/recv between two ranks (a pipeline boundary)
        link = inter if group.nodes > 1 else intra
        algo, t = "direct", link.latency_s + s / link.achievable
    return PrimitiveTime(name, algo, size_bytes, n, sent, received, t, s / t * factor(name, n))


def primitives(size_bytes: int, group: Group, intra: Link, inter: Link | None = None) -> list[PrimitiveTime]:
    """Every primitive on S = ``size_bytes`` over ``group``, in ``PRIMITIVES`` order (send/recv between two ranks)."""
    return [primitive_time(p, size_bytes, Group(2, min(2, group.per_node)) if p == "send/recv" else group, intra, inter)
            for p in PRIMITIVES]  # fmt: skip


def interpolate(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear in log(x) through ``(x, y)`` points sorted by x; the end values hold outside them."""
    xs = [p[0] for p in curve]
    if x <= xs[0]:
        return curve[0][1]
    if x >= xs[-1]:
        return curve[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)
