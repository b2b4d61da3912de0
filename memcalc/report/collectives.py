"""``memcalc collectives``: every collective primitive on one message, group and machine, as a result record.

The times come from ``memcalc.comm.timing`` (latency per step + bytes over the link's achievable bandwidth, the
faster of the algorithms NCCL would pick), the links from a cluster preset (``presets/clusters``) with its GPU's
calibration (``presets/calibration``).
"""

import math
import re
from pydantic import Field

from memcalc.errors import InputError
from memcalc.validated import Result, empty_list

_SIZE = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
         "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40,
         "tib": 2**40}
MAX_SIZE = 2**50
"""1 PiB: far above any message a step sends (a 1T-parameter model's bf16 gradients are 2 TB)."""
MAX_GROUP = 2**20
"""1,048,576 ranks: above any cluster built."""


def parse_size(text: str | int | float, what: str = "--size") -> int:
    """Bytes in ``1GiB``, ``512MiB``, ``4KB``, ``1e9`` (decimal units as written, binary ones with an ``i``)."""
    accepted = "a size such as 1GiB, 512MiB, 64KB or 1e9 (bytes), at most 1 PiB"
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a size; give {accepted}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise InputError(f"{what} {text!r} is not a size; give {accepted}")
        value = float(m.group(1)) * _UNIT[(m.group(2) or "").lower()]
    if not math.isfinite(value) or value < 1 or value > MAX_SIZE:
        raise InputError(f"{what} {text!r} is out of range; give {accepted}")
    return round(value)


class PrimitiveRow(Result):
    """One primitive on the message, as one rank of the group sees it."""

    name: str
    algorithm: str
    """ring, tree, nvls (NVLink SHARP), direct, or hierarchical (two-level across nodes)."""
    sent_bytes: int
    """Per rank (the busiest one for rooted primitives)."""
    received_bytes: int
    time_s: float
    bus_bandwidth: float
    """Bytes/s: nccl-tests' busbw = S / time x the primitive's bus factor."""
    alg_bandwidth: float
    """Bytes/s: S / time."""


class CollectiveTimes(Result):
    """``memcalc collectives``: every primitive on one message size and group."""

    schema_version: int = 1
    size_bytes: int
    """nccl-tests' S: the gathered output, the unreduced input, the tensor."""
    group: int
    ranks_per_node: int
    nodes: int
    cluster: str
    gpu: str
    intra_node_link: str
    network_link: str
    primitives: list[PrimitiveRow] = Field(default_factory=empty_list)


def collectives(size: str | int | float, group: int, *, gpu: str | None = None, cluster: str | None = None,
                gpus_per_node: int | None = None, across_nodes: bool = False) -> CollectiveTimes:
    """Every collective primitive on ``size`` bytes over ``group`` ranks of a cluster preset (or the first cluster
    built from ``gpu``, else a generic node of that GPU: ``memcalc.time.datasheet``; neither given: ``DEFAULT_GPU``'s,
    as ``estimate`` takes); ``across_nodes`` puts one rank per node (a data-parallel group under tensor parallelism)."""
    from dataclasses import replace

    from memcalc.comm.timing import Group, primitives
    from memcalc.inputs.hardware import DEFAULT_GPU
    from memcalc.time.datasheet import gpu_machine
    from memcalc.time.hardware import load_machine

    n_bytes = parse_size(size)
    if isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= MAX_GROUP:
        raise InputError(f"--group {group!r} is not accepted; accepted: a whole number of ranks from 1 to {MAX_GROUP:,}")
    if gpu is None and cluster is None:
        gpu = DEFAULT_GPU  # as estimate's
    if cluster is None:
        machine = gpu_machine(gpu)
    else:
        machine = load_machine(cluster)
        if gpu is not None:
            machine = replace(machine, calibration=gpu_machine(gpu).calibration)
    name = machine.cluster.key
    g_node = gpus_per_node or machine.cluster.gpus_per_node
    if isinstance(g_node, bool) or not isinstance(g_node, int) or g_node < 1:
        raise InputError(f"--gpus-per-node {g_node!r} is not accepted; accepted: a whole number of 1 or more")
    grp = Group.of(group, g_node, across_nodes)
    rows = [PrimitiveRow(name=p.name, algorithm=p.algorithm, sent_bytes=p.sent_bytes, received_bytes=p.received_bytes,
                         time_s=p.time_s, bus_bandwidth=p.bus_bandwidth, alg_bandwidth=p.alg_bandwidth)
            for p in primitives(n_bytes, grp, machine.intra, machine.inter)]
    return CollectiveTimes(size_bytes=n_bytes, group=group, ranks_per_node=grp.per_node, nodes=grp.nodes,
                           cluster=name, gpu=machine.calibration.gpu if gpu else machine.cluster.gpu,
                           intra_node_link=machine.intra.name,
                           network_link=machine.inter.name, primitives=rows)


def collectives_table(c: CollectiveTimes):  # noqa: ANN201 - a rich Table; rich is imported here only
    from rich.table import Table

    size = next(f"{c.size_bytes / d:,.3g} {u}" for d, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))
                if c.size_bytes >= d or d == 1)
    t = Table(title=f"{size} over {c.group} ranks ({c.nodes} node{'s' * (c.nodes > 1)} of "
                    f"{c.ranks_per_node}) on {c.cluster}: {c.intra_node_link} inside a node, {c.network_link} across",
              title_justify="left")
    for name, justify in (("primitive", "left"), ("algorithm", "left"), ("sent/rank GiB", "right"),
                          ("received/rank GiB", "right"), ("time", "right"), ("bus GB/s", "right"),
                          ("alg GB/s", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for p in c.primitives:
        t.add_row(p.name, p.algorithm, f"{p.sent_bytes / 2**30:,.3f}", f"{p.received_bytes / 2**30:,.3f}",
                  f"{p.time_s * 1e3:,.3f} ms" if p.time_s < 1 else f"{p.time_s:,.3f} s",
                  f"{p.bus_bandwidth / 1e9:,.1f}", f"{p.alg_bandwidth / 1e9:,.1f}")
    return t
