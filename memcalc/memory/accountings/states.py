"""Model-state memory per rank: parameters, gradients, master copy and optimizer moments.

Source: Rajbhandari et al. 2020, "ZeRO", arXiv 1910.02054, §3.1 (16Ψ for mixed-precision Adam) and
§5.1-5.3 (what each stage partitions). Offload placement: Ren et al. 2021, "ZeRO-Offload", arXiv
2101.06840, §4.1 (fp16 params stay on GPU; fp16 gradients, fp32 master, momentum, variance on CPU),
and Rajbhandari et al. 2021, "ZeRO-Infinity", arXiv 2104.07857 (parameters and optimizer states on NVMe).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from memcalc.layout.strategies import shard_numel

Location = Literal["gpu", "cpu", "nvme"]


def state_bytes(numel: int, bytes_per_element: int, sharded: bool, n: int) -> int:
    """Bytes one rank keeps of one model-state tensor: Ψ·b replicated, or ⌈Ψ/N⌉·b sharded."""
    return (shard_numel(numel, n) if sharded else numel) * bytes_per_element


class StateBytes(NamedTuple):
    """One model-state tensor on one rank: how many bytes sit in GPU memory, host RAM and NVMe."""

    gpu: int = 0
    cpu: int = 0
    nvme: int = 0


def _at(location: Location, n_bytes: int) -> StateBytes:
    if location == "gpu":
        return StateBytes(n_bytes, 0, 0)
    return StateBytes(0, n_bytes, 0) if location == "cpu" else StateBytes(0, 0, n_bytes)


def _device(offload: str) -> Location:
    return "gpu" if offload == "none" else offload  # type: ignore[return-value]


def parameter_bytes(
    psi: int, param_bytes: int, shards_params: bool, n: int, param_offload: str
) -> StateBytes:
    """Working (fp16/bf16) parameters on one rank.

    ZeRO §5.3 (P_os+g+p): 2Ψ/N with parameter partitioning, else 2Ψ. With parameter offload the
    resident copy (the shard, or all of it unsharded) lives off the GPU; a strategy that keeps the
    gathered parameters through forward and backward (SHARD_GRAD_OP, NO_SHARD) still holds all 2Ψ
    on the GPU at peak.
    """
    resident = state_bytes(psi, param_bytes, shards_params, n)
    if param_offload == "none":
        return StateBytes(resident, 0, 0)
    on_gpu = 0 if shards_params else psi * param_bytes
    return StateBytes(on_gpu, resident, 0) if param_offload == "cpu" else StateBytes(on_gpu, 0, resident)


def gradient_bytes(
    psi: int, grad_bytes: int, shards_grads: bool, shards_optimizer: bool, n: int, optimizer_offload: str
) -> StateBytes:
    """Gradients on one rank.

    ZeRO §5.2 (P_os+g): 2Ψ/N with gradient partitioning, else 2Ψ. With the optimizer offloaded,
    the reduced gradient partition the optimizer consumes moves to host memory (ZeRO-Offload §4.1;
    DeepSpeed keeps it in pinned CPU memory even when the optimizer states are on NVMe); the GPU
    keeps full gradients only where the strategy does not partition them (ZeRO-1, NO_SHARD).
    """
    if optimizer_offload == "none":
        return StateBytes(state_bytes(psi, grad_bytes, shards_grads, n), 0, 0)
    on_gpu = 0 if shards_grads else psi * grad_bytes
    return StateBytes(on_gpu, state_bytes(psi, grad_bytes, shards_optimizer, n), 0)


def master_bytes(psi: int, master: int, shards_optimizer: bool, n: int, optimizer_offload: str) -> StateBytes:
    """fp32 master copy of the parameters: 4Ψ (ZeRO §3.1), /N when optimizer states are partitioned (§5.1)."""
    return _at(_device(optimizer_offload), state_bytes(psi, master, shards_optimizer, n))


def moment_bytes(
    psi: int, moments: int, bytes_per_moment: int, shards_optimizer: bool, n: int, optimizer_offload: str
) -> StateBytes:
    """Optimizer moments: Adam m + v = 2 x 4Ψ = 8Ψ (ZeRO §3.1), /N when partitioned (§5.1)."""
    return _at(_device(optimizer_offload), state_bytes(psi, moments * bytes_per_moment, shards_optimizer, n))
