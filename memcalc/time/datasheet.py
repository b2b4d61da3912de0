"""A step time for every GPU: a calibration derived from its datasheet, and a generic node built around it.

A GPU with its own calibration file (``presets/calibration/<gpu>.toml``) and a cluster preset keeps them. Any other
GPU, shipped or the user's own TOML, is timed with its datasheet's dense peaks and HBM bandwidth and the efficiency
curves of the nearest calibrated GPU (same generation first), each efficiency labelled "datasheet: borrowed from X";
its node is a generic one: ``gpus_per_node`` GPUs (8 unless the GPU file says otherwise) on the GPU's intra-node
link, the GPU file's network per GPU (else a default by generation), the latencies of ``dgx-h100`` and the host
of ``dgx-a100``. The GPU arrives as a preset name, a TOML path or a GPU record (read by attribute: the core does not
import the inputs' classes).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from typing import Any

from memcalc.comm.timing import Link
from memcalc.errors import InputError
from memcalc.time.hardware import (
    Calibration,
    Cluster,
    Machine,
    borrowed,
    calibration_names,
    cluster_names,
    load_calibration,
    load_cluster,
    load_machine,
)

NEAREST = {
    "hopper": ("h100-sxm", "same generation (Hopper), measured"),
    "blackwell": ("b200", "same generation (Blackwell)"),
    "ampere": ("a100-sxm-80gb", "same generation (Ampere)"),
    "ada": ("a100-sxm-80gb", "no Ada calibration: Ada runs Ampere-class kernels (mma.sync tensor cores, "
                             "FlashAttention-2; no Hopper wgmma or TMA), so the nearest is Ampere's"),
    "turing": ("a100-sxm-80gb", "no Turing calibration: the nearest generation with one is Ampere"),
    "volta": ("a100-sxm-80gb", "no Volta calibration: the nearest generation with one is Ampere"),
    "cdna2": ("a100-sxm-80gb", "no AMD calibration: CDNA 2 (2021) is the A100's contemporary and peak class"),
    "cdna3": ("h100-sxm", "no AMD calibration: CDNA 3 (2023) is the H100's contemporary and peak class"),
}  # fmt: skip
"""Generation -> (the calibration whose curves it borrows, why that one). An assumption for all but Hopper, whose
H100 SXM curves were measured: measure your GPU's kernels and add a calibration file to replace it."""
NETWORK_GBITS = {"hopper": 400, "blackwell": 400, "cdna3": 400, "ampere": 200, "cdna2": 200}
"""Network per GPU, Gb/s, where a GPU file gives none: one NDR 400 Gb/s NIC per GPU (DGX H100 datasheet), one HDR
200 Gb/s NIC per GPU (DGX A100 datasheet); 100 Gb/s for any other generation (assumed: a typical cloud NIC)."""
OTHER_NETWORK_GBITS = 100
GPUS_PER_NODE = 8
"""An HGX board's 8 GPUs; PCIe servers too are mostly built with 8 cards (PCIe as their intra-node link)."""
PCIE_GBPS = 32
"""Host link each way, GB/s, where a GPU file gives none: PCIe Gen4 x16 (DOMAIN.md §9: about 32 GB/s each way)."""
_REFERENCE_NODE = "dgx-h100"
"""Latencies per hop (derived from DOMAIN.md §11's all-reduce anchors) come from this preset, for every link (a
PCIe hop is likely slower: an assumption)."""
_REFERENCE_HOST = "dgx-a100"
"""NVMe and host-memory rates (per node) come from this preset: 2-socket DDR4-3200, 4 NVMe drives (assumed)."""


def _value(gpu: Any, key: str) -> Any:
    return gpu.get(key) if isinstance(gpu, dict) else getattr(gpu, key, None)


def _record(gpu: Any) -> Any:
    if isinstance(gpu, str):
        from memcalc.inputs.presets import load_gpu

        return load_gpu(gpu)
    return gpu


def peaks(gpu: Any) -> tuple[tuple[str, float], ...]:
    """(dtype, dense FLOP/s) of each tensor-core dtype the datasheet gives; 0 or absent: the dtype is absent."""
    out = []
    for dtype in ("bf16", "fp16", "fp8", "tf32"):
        v = _value(gpu, f"{dtype}_tflops")
        if dtype == "fp8" and _value(gpu, "fp8") is False:
            continue
        if _positive(v):
            out.append((dtype, float(v) * 1e12))
    return tuple(out)


def clock_fields(gpu: Any) -> None:
    """Refuse, in one line, a GPU whose file lacks what the step time needs (its memory is still answered)."""
    missing = []
    for key in ("hbm_gbps", "intra_node_gbps", "pcie_gbps", "network_gbps"):  # the last two have defaults
        v = _value(gpu, key)
        if v is None and key in ("hbm_gbps", "intra_node_gbps"):
            missing.append(key)
        elif v is not None and not _positive(v):
            missing.append(f"{key} above 0 (it is {v:g})" if isinstance(v, (int, float)) else f"{key} above 0 (it is {v!r})")
    if not peaks(gpu):
        missing.append("a tensor-core rate (bf16_tflops, fp16_tflops or tf32_tflops)")
    if missing:
        where = _value(gpu, "key") or _value(gpu, "name") or "this GPU"
        raise InputError(f"GPU {where!r}: the step time needs {', '.join(missing)} in its file (GB/s, TFLOP/s); "
                         "memory alone is answered without them")


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def nearest(gpu: Any) -> tuple[str, str]:
    """The calibration whose curves this GPU borrows, and why: its generation's, else the one closest in peak."""
    arch = str(_value(gpu, "architecture") or "").strip().lower()
    if arch in NEAREST:
        return NEAREST[arch]
    mine = dict(peaks(gpu))
    rate = mine.get("bf16") or mine.get("fp16") or next(iter(mine.values()))
    options = [(n, load_calibration(n).peak("bf16")) for n in ("h100-sxm", "a100-sxm-80gb", "b200")]
    name, peak = min(options, key=lambda o: abs(math.log(rate / o[1])))
    why = f"generation {arch!r} unknown" if arch else "no architecture in the GPU file"
    return name, f"{why}: the calibrated GPU nearest in dense peak ({peak / 1e12:,.0f} TFLOP/s)"


def derive(gpu: Any) -> Calibration:
    """The GPU's datasheet peaks and HBM bandwidth with the nearest calibrated GPU's fractions of them."""
    clock_fields(gpu)
    base_key, why = nearest(gpu)
    base = load_calibration(base_key)
    hbm = float(_value(gpu, "hbm_gbps")) * 1e9
    key = str(_value(gpu, "key") or _value(gpu, "name"))
    return replace(
        base, gpu=key, peak_flops=peaks(gpu), hbm_peak_bytes_per_s=hbm,
        hbm_bytes_per_s=hbm * base.hbm_bytes_per_s / base.hbm_peak_bytes_per_s,
        intra_node_allreduce_bytes_per_s=None,  # NVLink SHARP's measured rate belongs to the base's switch
        sources=tuple((g, borrowed(base_key, label)) for g, label in base.sources),
        basis=f"derived: {key}'s datasheet peaks and HBM bandwidth with {base_key}'s efficiency curves ({why})",
    )  # fmt: skip


def generic_cluster(gpu: Any) -> Cluster:
    """A node of the GPU's typical count (8) on its intra-node link, its network per GPU, reference latencies; its
    name says where each rate comes from."""
    clock_fields(gpu)
    key = str(_value(gpu, "key") or _value(gpu, "name"))
    n = _value(gpu, "gpus_per_node") or GPUS_PER_NODE
    ref, host = load_cluster(_REFERENCE_NODE), load_cluster(_REFERENCE_HOST)
    link = str(_value(gpu, "intra_node_link") or "intra-node")
    intra = Link(link, float(_value(gpu, "intra_node_gbps")) / 2 * 1e9, ref.intra_node.latency_s)  # both ways / 2
    gbits, whence = _network_gbits(gpu)
    net = Link("network", gbits * 1e9 / 8, ref.network.latency_s)
    pcie = _value(gpu, "pcie_gbps") if _positive(_value(gpu, "pcie_gbps")) else PCIE_GBPS
    name = (f"generic node of {n} x {_value(gpu, 'name') or key}: {link} at {intra.bandwidth / 1e9:g} GB/s per "
            f"direction (the GPU file's), network {gbits:g} Gb/s per GPU ({whence}), latencies of {_REFERENCE_NODE}, "
            f"host of {_REFERENCE_HOST}")
    return Cluster(f"{key}-node", name, n, key, intra, net, float(pcie) * 1e9, host.nvme_bytes_per_s,
                   host.host_memory_bytes_per_s)  # fmt: skip


def _network_gbits(gpu: Any) -> tuple[float, str]:
    """Network per GPU in Gb/s, and where it comes from: the GPU file, else the generation's default."""
    gbytes = _value(gpu, "network_gbps")
    if _positive(gbytes):
        return float(gbytes) * 8, "the GPU file's"
    arch = str(_value(gpu, "architecture") or "").strip().lower()
    if arch in NETWORK_GBITS:
        nic = "one NDR NIC per GPU, as the DGX H100 datasheet" if NETWORK_GBITS[arch] == 400 else (
            "one HDR NIC per GPU, as the DGX A100 datasheet")
        return NETWORK_GBITS[arch], f"none in the GPU file: {arch}'s default, {nic}"
    return OTHER_NETWORK_GBITS, "none in the GPU file: the default for other GPUs, a typical cloud NIC (assumed)"


def _preset(gpu: Any) -> str | None:
    """The shipped GPU preset this is (by name, alias, or a record equal to the preset's), else None."""
    from memcalc.inputs.presets import find, load_gpu

    if isinstance(gpu, str):
        text = gpu.strip()
        if text.endswith(".toml") or "/" in text:
            return None
        path = find("gpus", text)
        return path.stem if path is not None else None
    key = _value(gpu, "key")
    if not isinstance(key, str) or find("gpus", key) is None:
        return None
    return key if load_gpu(key) == gpu else None


def _preset_cluster(key: str) -> str | None:
    from memcalc.inputs.presets import _read, presets_dir

    for name in cluster_names():
        if _read(presets_dir() / "clusters" / f"{name}.toml").get("gpu") == key:
            return name
    return None


@cache
def gpu_machine(gpu: Any) -> Machine:
    """The machine a step on this GPU is timed on: its cluster preset and calibration file where it has them (a
    shipped preset, named or given whole), else a generic node and a calibration derived from its datasheet."""
    key = _preset(gpu)
    record = _record(gpu)
    cluster = _preset_cluster(key) if key else None
    if cluster is not None:
        return load_machine(cluster)
    cal = load_calibration(key) if key in calibration_names() else derive(record)
    return Machine(generic_cluster(record), cal)
