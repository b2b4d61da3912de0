"""FSDP with its parameters offloaded to the host, moment by moment: the step's timeline (``memcalc.memory.engine.timeline``)
less what lives in host memory, plus what the all-gathers bring over."""

from __future__ import annotations

from memcalc.memory.engine.timeline_states import flat_units, param_tensors, shard_elements
from memcalc.model.architecture import Architecture

FSDP_OFFLOADED = ("parameters", "optimizer states", "gradient shards of the layers above", "gradients (shards)",
                  "step temporaries")
"""The FSDP timeline's parts that parameter offload keeps in host memory: the sharded parameters, AdamW's moments,
the reduced gradient shards and the step (FSDP2's ``CPUOffloadPolicy``: ``offload_fsdp``; FSDP1's ``CPUOffload``:
``offload_fsdp1``)."""


def offload_fsdp(moments: tuple, arch: Architecture, world: int) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """FSDP2 with ``CPUOffloadPolicy`` (torch 2.13 ``distributed/fsdp/_fully_shard``), moment by moment: the sharded
    fp32 parameters are pinned host tensors (``_fsdp_param.py`` ``_init_sharded_param``), each reduced gradient shard
    is copied to a host ``.grad`` and its GPU copy freed when ``foreach_reduce`` returns (``_fsdp_collectives.py``),
    and AdamW steps on the host (no GPU bytes); buffers, the gathered units, the all-gather outputs and the
    reduce-scatter inputs stay as without offload. An all-gather copies each parameter's fp32 shard to the GPU before
    casting it to bf16 (``all_gather_inputs``), one parameter at a time: 4 × the largest layer shard while a layer's
    all-gather is in flight. Returns (phase, label, parts) for ``timeline._moment``."""
    largest = max((shard_elements(arch, name, n, world) for name, n in param_tensors(arch)
                   if name.startswith("layer 0 ")), default=0)
    out = []
    for m in moments:
        parts = [(n, x) for n, x in m.parts if n not in FSDP_OFFLOADED]
        if any(n.startswith("all-gather output (") for n, _ in parts) and m.phase.startswith(("forward", "backward")):
            parts.append(("fp32 shard copied in for the all-gather", 4 * largest))
        out.append((m.phase, m.label, parts))
    return out


def offload_fsdp1(moments: tuple, arch: Architecture, world: int, width: int, gathered: int
                  ) -> list[tuple[str, str, list[tuple[str, int]]]]:  # fmt: skip
    """FSDP1 with ``CPUOffload(offload_params=True)`` (torch 2.13 ``distributed/fsdp/_flat_param.py``,
    ``_runtime_utils.py``), moment by moment: each unit's sharded ``FlatParameter`` (``_local_shard``, ``width``
    bytes per element) is a pinned host tensor, each reduced gradient shard is copied to the host ``_cpu_grad`` and
    its GPU copy released (``_offload_grad``), and AdamW steps on the host; the buffers, the gathered units, the
    flat gradients and the activations stay as without offload. Before a unit's all-gather, ``pre_unshard`` brings
    its whole shard to the GPU:

    - under a MixedPrecision ``param_dtype`` (``gathered`` < ``width``), ``_use_low_precision_shard`` copies it
      (``_local_shard.to(device)``, a ``width``-byte temporary) into the low-precision ``_mp_shard`` before the
      unsharded parameter is allocated: a moment of its own ahead of each forward gather;
    - without one, ``flat_param_to(device)`` makes the GPU copy the all-gather sends, released when the unit
      switches to its unsharded view (``_use_unsharded_flat_param``): it sits beside the gathered unit.

    The backward's prefetches do the same on the pre-unshard stream, one layer shard at a time, and the root's
    shard at the forward's start (not counted: smaller than the gather they precede from two ranks on). Returns
    (phase, label, parts) for ``timeline._moment``."""
    shard = flat_units(arch, world).layer_shard
    out = []
    for m in moments:
        parts = [(n, x) for n, x in m.parts if n not in FSDP_OFFLOADED]
        if not (m.phase.startswith("forward.layer.") and m.label.endswith("parameters gathered")):
            out.append((m.phase, m.label, parts))
        elif gathered < width:
            pre = [(n, 0 if n == "this layer's parameters (gathered)" else x) for n, x in parts]
            out.append((m.phase, m.label.replace("parameters gathered", "shard copied to the GPU (pre-unshard)"),
                        pre + [("fp32 shard copied to the GPU (pre-unshard)", width * shard)]))
            out.append((m.phase, m.label, parts))
        else:
            out.append((m.phase, m.label, parts + [("shard copied to the GPU for the all-gather", width * shard)]))
    return out


__all__ = ["FSDP_OFFLOADED", "offload_fsdp", "offload_fsdp1"]
