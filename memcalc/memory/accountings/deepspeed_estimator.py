"""DeepSpeed's own model-state estimator, reproduced exactly (``--accounting deepspeed-estimator``).

Source: deepspeed/runtime/zero/stage_1_and_2.py ``estimate_zero2_model_states_mem_needs`` and
deepspeed/runtime/zero/stage3.py ``estimate_zero3_model_states_mem_needs`` (DeepSpeed 0.19). Both return
(cpu bytes per node, gpu bytes per GPU), truncated with ``int()`` as DeepSpeed does; DeepSpeed prints them
in GiB (2**30) but labels them "GB". ``largest_layer_params`` is DeepSpeed's: the most parameters one module
owns directly (``recurse=False``).
"""

from __future__ import annotations

from memcalc.frozen import frozen


@frozen
class DeepSpeedEstimate:
    cpu: int
    """Host RAM per node, bytes."""
    gpu: int
    """GPU memory per GPU, bytes."""
    terms: tuple[tuple[str, str, str, int], ...]
    """(key, label, formula in DeepSpeed's own words, bytes) of the GPU figure; they sum to ``gpu``."""


def zero2(total_params: int, gpus_per_node: int, nodes: int, cpu_offload: bool, buffer_factor: float = 1.5) -> DeepSpeedEstimate:
    """estimate_zero2_model_states_mem_needs (ZeRO-1 and ZeRO-2 share it)."""
    total_gpus = nodes * gpus_per_node
    if cpu_offload:
        gpu = 2 * total_params
        cpu = total_params * max(4 * total_gpus, 16) * buffer_factor
        terms = (("parameters", "16-bit parameters", "2Ψ", gpu),)
    else:
        # 18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer states (momentum and variance)
        part = int(18 * total_params / total_gpus)
        gpu = 2 * total_params + part
        cpu = total_params * 4 * gpus_per_node * buffer_factor
        terms = (("parameters", "16-bit parameters", "2Ψ", 2 * total_params),
                 ("partition", "grads, fp32 params, Adam (partitioned)", "int(18Ψ/N): 2 grads16 + 4 grads32 + 4 params32 + 8 Adam",
                  part))  # fmt: skip
    return DeepSpeedEstimate(int(cpu), int(gpu), terms)


def zero3(
    total_params: int,
    largest_layer_params: int,
    gpus_per_node: int,
    nodes: int,
    cpu_offload: bool,
    cpu_offload_params: bool,
    zero_init: bool = True,
    buffer_factor: float = 1.5,
) -> DeepSpeedEstimate:
    """estimate_zero3_model_states_mem_needs."""
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    layer = ("largest_layer", "largest layer (gathered)", "4 x largest_layer_params", largest)
    if cpu_offload:
        if cpu_offload_params:
            gpu = largest
            cpu = total_params * (18 * gpus_factor if zero_init else max(4 * gpus_per_node, 18 * gpus_factor)) * buffer_factor
            terms: tuple[tuple[str, str, str, int], ...] = (layer,)
        else:
            part = int(2 * total_params / total_gpus)
            gpu = largest + part
            cpu = total_params * (16 * gpus_factor if zero_init else max(4 * gpus_per_node, 16 * gpus_factor)) * buffer_factor
            terms = (layer, ("parameters", "16-bit parameter partition", "int(2Ψ/N)", part))
    else:
        part = int(18 * total_params / total_gpus)
        gpu = largest + part
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
        terms = (layer, ("partition", "params, grads, Adam (partitioned)", "int(18Ψ/N)", part))
    return DeepSpeedEstimate(int(cpu), int(gpu), terms)
