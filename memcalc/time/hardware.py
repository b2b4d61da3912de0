"""Hardware as data: clusters (``presets/clusters/*.toml``) and achievable rates (``presets/calibration/<gpu>.toml``).

Each file names its sources in a comment at the top. Read as TOML (``memcalc.inputs.presets``) into frozen dataclasses; every rate is
converted here to bytes/s, FLOP/s and seconds. A calibration file may say ``extends = "<other gpu>"`` to reuse
another's values (the H200 reuses the H100's compute, which is the same GH100 die).
"""

from __future__ import annotations

import math
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from memcalc.comm.timing import Link, interpolate
from memcalc.errors import InputError, did_you_mean
from memcalc.frozen import frozen

Curve = tuple[tuple[float, float], ...]
DTYPES = ("bf16", "fp16", "fp8", "tf32")
_CLUSTER_KEYS = {"name": str, "aliases": list, "gpus_per_node": int, "gpu": str, "intra_node_gbps": float,
                 "intra_node_latency_us": float, "network_gbits_per_gpu": float, "network_latency_us": float,
                 "pcie_gbps": float, "nvme_gbps": float, "host_memory_gbps": float, "host_memory_efficiency": float}
_CAL_KEYS = {"gpu": str, "extends": str, "bf16_tflops": float, "fp16_tflops": float, "fp8_tflops": float,
             "tf32_tflops": float, "hbm_gbps": float, "hbm_efficiency": float, "gemm_efficiency": list,
             "attention_flash_efficiency": list, "attention_cudnn_efficiency": list, "adamw_fused_efficiency": float,
             "adamw_foreach_efficiency": float, "cross_entropy_bytes_per_logit": float, "intra_node_efficiency": float,
             "intra_node_allreduce_gbps": float, "network_efficiency": float}  # fmt: skip
# Each group of rates, by the key that holds its efficiency; a file says where its own come from in ``<group>_source``
# ("measured: ...", "published: ...", "datasheet: ..."); what it takes from the file it extends is "datasheet: borrowed".
SOURCE_GROUPS = {"hbm": "hbm_efficiency", "gemm": "gemm_efficiency", "attention": "attention_flash_efficiency",
                 "optimizer": "adamw_fused_efficiency", "cross_entropy": "cross_entropy_bytes_per_logit",
                 "intra_node": "intra_node_efficiency", "network": "network_efficiency"}
_CAL_KEYS |= {f"{group}_source": str for group in SOURCE_GROUPS}
_OPTIONAL = {"aliases", "extends", "fp8_tflops", "tf32_tflops", "attention_cudnn_efficiency", "intra_node_allreduce_gbps",
             *(f"{group}_source" for group in SOURCE_GROUPS)}


def _dir(kind: str) -> Path:
    from memcalc.inputs.presets import presets_dir  # the one place that knows where presets live

    return presets_dir() / kind


def _read(path: Path) -> dict[str, Any]:
    """The preset file's TOML, parsed once per file version and shared with ``memcalc.inputs.presets`` (which reads the
    GPU files too): a fresh dict per call."""
    from memcalc.inputs.presets import _read as read_preset

    return read_preset(path)


def _find(kind: str, name: str, what: str) -> Path:
    text = str(name).strip()
    if text.endswith(".toml") or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise InputError(f"{what} file {text!r} does not exist")
        return path
    from memcalc.inputs.presets import _alias_index, _norm, find, names

    path = find(kind, text)  # parses only the files that can name it
    if path is None:  # the did-you-mean reads every name and alias
        raise InputError(f"unknown {what} {text!r}{did_you_mean(_norm(text), _alias_index(kind))}; known: "
                         f"{', '.join(names(kind))}")
    return path


def _check(data: dict[str, Any], keys: dict[str, type], where: str) -> None:
    for key, value in data.items():
        if key not in keys:
            raise InputError(f"{where}: unknown key {key!r}{did_you_mean(key, keys)}")
        want = keys[key]
        if want is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{where}: {key} = {value!r} is not a number")
        if want is float and (not math.isfinite(value) or value <= 0):
            raise InputError(f"{where}: {key} = {value!r} must be a positive number")
        if want is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(f"{where}: {key} = {value!r} must be a positive whole number")
        if want in (str, list) and not isinstance(value, want):
            raise InputError(f"{where}: {key} = {value!r} must be a {want.__name__}")
        if key.endswith("efficiency") and want is float and value > 1:
            raise InputError(f"{where}: {key} = {value} is above 1; give a fraction of the peak in (0, 1]")
    missing = [k for k in keys if k not in data and k not in _OPTIONAL]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")


def _curve(points: list, where: str, key: str) -> Curve:
    out = []
    for p in points:
        ok = isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
        if not ok or p[0] <= 0 or not 0 < p[1] <= 1:
            raise InputError(f"{where}: {key} point {p!r} must be [size > 0, efficiency in (0, 1]]")
        out.append((float(p[0]), float(p[1])))
    if not out or [x for x, _ in out] != sorted({x for x, _ in out}):
        raise InputError(f"{where}: {key} needs at least one point, sizes strictly increasing")
    return tuple(out)


@frozen
class Cluster:
    """One kind of node and the network between nodes."""

    key: str
    name: str
    gpus_per_node: int
    gpu: str
    """GPU preset key (presets/gpus/<gpu>.toml)."""
    intra_node: Link
    network: Link
    """Per GPU: its NIC's bandwidth (bytes/s) and per-hop latency."""
    pcie_bytes_per_s: float
    nvme_bytes_per_s: float
    """Per node."""
    host_memory_bytes_per_s: float
    """Per node, achievable (theoretical x host_memory_efficiency)."""


@frozen
class Calibration:
    """Achievable rates of one GPU, each traced to a measurement or datasheet in its file."""

    gpu: str
    peak_flops: tuple[tuple[str, float], ...]
    """(dtype, dense FLOP/s) from the datasheet."""
    hbm_bytes_per_s: float
    """Achievable: datasheet x measured copy efficiency."""
    hbm_peak_bytes_per_s: float
    gemm_efficiency: Curve
    attention_efficiency: tuple[tuple[str, Curve], ...]
    adamw_efficiency: tuple[tuple[str, float], ...]
    """(implementation, fraction of datasheet HBM bandwidth) at 28 B/param."""
    cross_entropy_bytes_per_logit: float
    intra_node_efficiency: float
    intra_node_allreduce_bytes_per_s: float | None
    network_efficiency: float
    sources: tuple[tuple[str, str], ...] = ()
    """(group of SOURCE_GROUPS, where its efficiency comes from: "measured: ...", "published: ..." or "datasheet: ...")."""
    basis: str = ""
    """How this calibration was made: the GPU's own file, or derived from its datasheet (``memcalc.time.datasheet``)."""

    def peak(self, dtype: str) -> float:
        for d, v in self.peak_flops:
            if d == dtype:
                return v
        known = [d for d, _ in self.peak_flops]
        if dtype == "fp8":  # torchao's float8 GEMMs need fp8 tensor cores (compute capability 8.9 and up)
            raise InputError(f"--float8 needs fp8 tensor cores, which {self.gpu} lacks (it has {', '.join(known)}); "
                             "give a --gpu with them (h100, h200, b200) or leave --float8 out")
        raise InputError(f"{self.gpu} has no {dtype!r} tensor-core rate{did_you_mean(dtype, known)}; known: {', '.join(known)}")

    def gemm(self, flops: float) -> float:
        return interpolate(self.gemm_efficiency, flops)

    def attention(self, kernel: str, flops: float) -> float:
        curves = dict(self.attention_efficiency)
        if kernel not in curves:
            raise InputError(f"no {kernel!r} attention calibration for {self.gpu}; known: {', '.join(curves)}")
        return interpolate(curves[kernel], flops)

    def adamw(self, impl: str) -> float:
        effs = dict(self.adamw_efficiency)
        if impl not in effs:
            raise InputError(f"unknown optimizer implementation {impl!r}{did_you_mean(impl, effs)}; known: {', '.join(effs)}")
        return effs[impl]


def cluster_names() -> list[str]:
    from memcalc.inputs.presets import names

    return names("clusters")


def calibration_names() -> list[str]:
    from memcalc.inputs.presets import names

    return names("calibration")


@cache
def gpu_key(name: str) -> str:
    """A GPU preset key from its name or alias (``h100`` -> ``h100-sxm``), read from presets/gpus without pydantic."""
    return _find("gpus", name, "GPU").stem


@cache
def load_cluster(name: str) -> Cluster:
    """A cluster by file name (``dgx-h100``), alias (``hgx-h100``) or path to a TOML file."""
    path = _find("clusters", name, "cluster")
    data = _read(path)
    where = f"cluster preset {path.stem!r}"
    _check(data, _CLUSTER_KEYS, where)
    gpu = gpu_key(data["gpu"])
    intra = Link("nvlink", data["intra_node_gbps"] * 1e9, data["intra_node_latency_us"] * 1e-6)
    net = Link("network", data["network_gbits_per_gpu"] * 1e9 / 8, data["network_latency_us"] * 1e-6)
    return Cluster(path.stem, data["name"], data["gpus_per_node"], gpu, intra, net, data["pcie_gbps"] * 1e9,
                   data["nvme_gbps"] * 1e9, data["host_memory_gbps"] * 1e9 * data["host_memory_efficiency"])  # fmt: skip


def _raw_calibration(path: Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The file's keys over those of the file it extends; an efficiency it takes from there is labelled borrowed."""
    data = _read(path)
    base = data.get("extends")
    if base is None:
        return data
    if path.stem in seen:
        raise InputError(f"calibration {path.stem!r} extends itself through {' -> '.join(seen)}")
    merged = dict(_raw_calibration(_find("calibration", base, "calibration"), (*seen, path.stem)))
    for group, key in SOURCE_GROUPS.items():
        if key not in data and f"{group}_source" not in data:
            merged[f"{group}_source"] = borrowed(str(base), merged.get(f"{group}_source", ""))
    merged.update(data)
    return merged


def borrowed(base: str, label: str) -> str:
    """The source label of an efficiency taken from calibration ``base``: the curve of another GPU, kept as given."""
    if label.startswith("datasheet: borrowed from"):
        return label  # already another GPU's curve: name where it was made
    return f"datasheet: borrowed from {base}" + (f" ({label})" if label else "")


@cache
def load_calibration(gpu: str) -> Calibration:
    """Achievable rates of a GPU by its preset key or alias (``h100`` -> ``h100-sxm``), or a TOML path."""
    text = str(gpu).strip()
    if not (text.endswith(".toml") or "/" in text):
        try:
            text = gpu_key(text)
        except InputError:
            pass  # not a GPU preset: report it against the calibration files below
    path = _find("calibration", text, "GPU calibration")
    data = _raw_calibration(path)
    where = f"calibration preset {path.stem!r}"
    _check(data, _CAL_KEYS, where)
    peaks = tuple((d, data[f"{d}_tflops"] * 1e12) for d in DTYPES if f"{d}_tflops" in data)
    attn = [("flash", _curve(data["attention_flash_efficiency"], where, "attention_flash_efficiency"))]
    if "attention_cudnn_efficiency" in data:
        attn.append(("cudnn", _curve(data["attention_cudnn_efficiency"], where, "attention_cudnn_efficiency")))
    ar = data.get("intra_node_allreduce_gbps")
    return Calibration(
        gpu=data["gpu"], peak_flops=peaks, hbm_bytes_per_s=data["hbm_gbps"] * 1e9 * data["hbm_efficiency"],
        hbm_peak_bytes_per_s=data["hbm_gbps"] * 1e9,
        gemm_efficiency=_curve(data["gemm_efficiency"], where, "gemm_efficiency"), attention_efficiency=tuple(attn),
        adamw_efficiency=(("fused", data["adamw_fused_efficiency"]), ("foreach", data["adamw_foreach_efficiency"])),
        cross_entropy_bytes_per_logit=data["cross_entropy_bytes_per_logit"],
        intra_node_efficiency=data["intra_node_efficiency"],
        intra_node_allreduce_bytes_per_s=ar * 1e9 if ar else None, network_efficiency=data["network_efficiency"],
        sources=tuple((g, data.get(f"{g}_source", "datasheet: not stated in the file")) for g in SOURCE_GROUPS),
        basis=f"calibration file {path.stem}" + (f" (extends {data['extends']})" if "extends" in data else ""),
    )  # fmt: skip


@frozen
class Machine:
    """A cluster with its GPU's calibration: the links as collectives see them."""

    cluster: Cluster
    calibration: Calibration

    @cached_property
    def memo(self) -> dict[tuple[object, ...], float]:
        """Collective times already worked out on this machine (the step-time model's per-plan fast path)."""
        return {}

    @cached_property
    def intra(self) -> Link:
        c, k = self.cluster.intra_node, self.calibration
        return Link(c.name, c.bandwidth, c.latency_s, k.intra_node_efficiency, k.intra_node_allreduce_bytes_per_s)

    @cached_property
    def inter(self) -> Link:
        c = self.cluster.network
        return Link(c.name, c.bandwidth, c.latency_s, self.calibration.network_efficiency)


@cache
def load_machine(cluster: str, gpu: str | None = None) -> Machine:
    """``load_machine("dgx-h100")``; ``gpu`` swaps the cluster's GPU calibration (same links)."""
    c = load_cluster(cluster)
    return Machine(c, load_calibration(gpu or c.gpu))


@cache
def cluster_for_gpu(gpu: str) -> str:
    """The first cluster preset built from this GPU (``h100`` -> ``dgx-h100``), for commands that name only a GPU."""
    key = gpu_key(gpu)
    for name in cluster_names():
        if _read(_dir("clusters") / f"{name}.toml").get("gpu") == key:
            return name
    raise InputError(f"no cluster preset has GPU {key!r}; known clusters: {', '.join(cluster_names())}")
