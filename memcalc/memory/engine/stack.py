"""A stack of decoder layers: each layer's sizes, computed once per shape, and the layers whose moments bound the rest.

A step's timeline repeats the same few moments for every decoder layer. Within a run of layers that are alike (the
same ``LayerSizes``, the same recompute decision, the same kind of attention and cache) each part of a layer's
moment is an affine function of the layer's index: the activations kept grow by the same bytes per layer going
forward, fall by them going backward, the gradients and gradient shards grow by one layer's each. A sum of affine
functions is affine, so over a run every moment's live bytes (and any part's, such as a stream pool's) take their
largest value at the run's first or last layer, and where they are equal all along, the run's first layer in the
step's order is one of those two as well. The peak, the first moment that holds it, every phase's peak and the
allocator's reserved peak (``memcalc.memory.allocator.reserved``: maxima of such sums) are therefore the same over the
moments of the runs' end layers as over every layer's (checked against the moment-by-moment timeline:
tests/test_stack.py).

The runs are cut where a layer's description changes and at the layers FSDP treats apart: the first (its gather
follows the root's, its backward prefetches the embedding's unit or nothing) and the last (no layer above has
reduce-scattered yet); ``distinct`` keeps each run's two ends.

Each layer's sizes are computed once per kind of layer (``memcalc.memory.engine.timeline_layers.layer_kind``: all that
``layer_sizes`` reads of the index) and cached per model and shape, so that the plans of a layout search which differ
in their parallelism over data, their framework's overlays or their GPU share them.
"""

from __future__ import annotations

from memcalc.memory.families.saved_gemma import sliding_sdpa_masked
from memcalc.memory.engine.timeline_layers import LayerSizes, Policy, checkpointed, layer_kind, layer_sizes
from memcalc.memory.engine.timeline_states import param_tensors
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture


@per_architecture
def layer_stack(arch: Architecture, family: str, regime: str, attention: str, s: int, b: int, policy: Policy,
                device: str, rotary_dims: int | None, lora, code: str, compiled: bool, sp: int, float8: str,
                float8_weight_cast: bool, use_cache: bool,
                hooked_grads: bool) -> tuple[tuple[LayerSizes, ...], frozenset[int]]:  # fmt: skip
    """Every decoder layer's ``LayerSizes`` (``memcalc.memory.engine.timeline_layers.layer_sizes``, the arguments
    ``timeline`` gives it), and ``distinct`` of them: the same for every plan of this shape, whatever its
    parallelism over data."""
    # one layer of each kind computed (``layer_kind``: what the sizes read of the index), the others share its sizes
    sizes: dict[tuple, LayerSizes] = {}
    for i in range(arch.layers):
        kind = layer_kind(arch, policy, attention, s, i)
        if kind not in sizes:
            sizes[kind] = layer_sizes(arch, family=family, regime=regime, attention=attention, s=s, b=b,
                                      policy=policy, index=i, device=device, rotary_dims=rotary_dims, lora=lora,
                                      code=code, compiled=compiled, sp=sp, float8=float8,
                                      float8_weight_cast=float8_weight_cast,
                                      use_cache=use_cache and not checkpointed(policy, i), hooked_grads=hooked_grads)
    layers = tuple(sizes[layer_kind(arch, policy, attention, s, i)] for i in range(arch.layers))
    # what else ``timeline`` reads of a layer's index: its recompute decision, and for the cast cache whether it
    # has rotary, a sliding window, Gemma 3's masked sliding SDPA
    kinds = [(ly, checkpointed(policy, i), i in arch.nope_layers, i in arch.sliding_layers,
              sliding_sdpa_masked(arch, attention, s, i)) for i, ly in enumerate(layers)]
    return layers, distinct(kinds)


def distinct(kinds: list) -> frozenset[int]:
    """The layers that end a run of alike ``kinds`` (any equality-comparable description per layer), and the first
    two and last two layers (the first and the last are FSDP's own cases, so the runs between start and end next to
    them)."""
    n = len(kinds)
    ends = {0, 1, n - 2, n - 1}
    ends.update(i for i in range(1, n) if kinds[i] != kinds[i - 1])
    ends.update(i - 1 for i in range(1, n) if kinds[i] != kinds[i - 1])
    return frozenset(i for i in ends if 0 <= i < n)


def affine(per_layer: int, fs) -> bool:
    """Whether the FSDP overlay's per-layer parts grow by the same bytes per layer: the count of layers done,
    ``held // layer_grads``, and the unsharded gradients, ``held // width``, are exact multiples (``per_layer``: one
    layer's gradients in bytes, what ``held`` grows by)."""
    return fs is None or (fs.layer_grads > 0 and per_layer % fs.layer_grads == 0 and per_layer % fs.width == 0)


@per_architecture
def tensor_groups(arch: Architecture) -> tuple[int, int]:
    """Elements of one decoder layer's parameters (layer 0's: they are alike) and of the input side's (the names that
    start with "embedding" or "position embedding": the token embedding, its norm, a learned position table), as
    ``param_tensors`` lists them."""
    tensors = param_tensors(arch)
    return (sum(e for name, e in tensors if name.startswith("layer 0 ")),
            sum(e for name, e in tensors if name.startswith(("embedding", "position embedding"))))


__all__ = ["affine", "distinct", "layer_stack", "tensor_groups"]
