"""Float8 training (torchao ``convert_to_float8_training``, as torchtitan applies it): which weights compute in fp8.

torchao swaps every ``nn.Linear`` whose in and out features are multiples of 16 for a ``Float8Linear``
(torchao/float8/float8_linear_utils.py ``convert_to_float8_training``, ``module_filter_fn``); torchtitan's Llama 3
configs filter the output head (``filter_fqns = ["output"]``), so the converted weights are the decoder layers'
projections: q, k, v, o and the MLP's (gate,) up, down. Embeddings, norms, attention and the head stay in the compute
dtype. Per layer and tensor-parallel rank (column-parallel q/k/v/gate/up, row-parallel o/down split the weight):

    N8 = (h·(qw + 2·kvw) + qw·h + (3 if gated else 2)·h·f) / tp

What changes, and what does not (torchao >= 0.13, read in its source):
- saved for backward: nothing (``matmul_with_hp_or_float8_args.forward`` saves the high-precision input and weight
  before casting, float8_linear.py; the fp8 copies are transient);
- FSDP2 with ``enable_fsdp_float8_all_gather``: a converted weight is gathered as its fp8 data, 1 byte per element
  (fsdp_utils.py ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``), the rest in the compute dtype; the
  gradient reduce-scatter is unchanged;
- step time: the forward, input-gradient and weight-gradient GEMMs of a converted linear run at the fp8 tensor-core
  rate (``torch._scaled_mm``; torchao/testing/training/roofline_utils.py ``get_gemm_time_sympy``), and each cast
  moves bytes (``get_tensor_memory_traffic_ovhd_s``): per linear and token, input 6 bytes per input feature and
  grad_output 6 per output feature (tensorwise: amax read 2, cast read 2, two 1-byte fp8 layouts), 8 (rowwise);
  per weight element 8 (tensorwise: amax 2, forward cast 3, backward cast 3) or 10 (rowwise).
"""

from __future__ import annotations

from memcalc.model.architecture import Architecture
from memcalc.model.params import kv_heads_per_rank

RECIPES = ("none", "tensorwise", "rowwise")
CONVERTED = ("q", "k", "v", "o", "gate", "up", "down", "fc1", "fc2")
"""The decoder layer's projections that become ``Float8Linear`` (those ``linears`` lists), as
``memcalc.memory.engine.timeline_states.param_tensors`` names their weights after ``layer N ``; biases, norms, the
embedding and the head stay in the compute dtype."""
CAST_BYTES = {"tensorwise": (6, 8), "rowwise": (8, 10)}
"""Recipe -> (bytes moved per activation element cast, per weight element cast), torchao roofline_utils.py."""


def linears(arch: Architecture, tp: int = 1) -> tuple[tuple[int, int], ...]:
    """(in, out) features of one decoder layer's converted linears on one tensor-parallel rank."""
    h, f = arch.hidden, arch.ffn_size
    # k and v keep whole heads per rank, replicated when tp exceeds the KV heads (as the step time's layer_gemms)
    qw, kvw = arch.q_width // tp, kv_heads_per_rank(arch, tp) * arch.d_head
    mlp = [(h, f // tp)] * (2 if arch.gated_mlp else 1) + [(f // tp, h)]
    return ((h, qw), (h, kvw), (h, kvw), (qw, h), *mlp)


def layer_weights(arch: Architecture, tp: int = 1) -> int:
    """N8: weight elements of one decoder layer's converted linears on one tensor-parallel rank."""
    return sum(i * o for i, o in linears(arch, tp))


def eager_backward(tokens: int, i: int, o: int, d: int, weight_cast: bool = True) -> int:
    """Bytes one eager ``Float8Linear`` (in ``i``, out ``o``) holds in its backward above its saved input and output
    gradient: the larger of its two cast moments (torchao float8_linear.py ``matmul_with_hp_or_float8_args.backward``;
    rowwise as tensorwise but for its per-row scales). Each cast of an activation-sized tensor holds 9 bytes per
    element while it runs (``hp_tensor_and_scale_to_float8``: the fp32 product with the scale, its clamp, the fp8
    result).

    - the output gradient cast a second time (for the weight gradient): 9·T·o, beside the first fp8 copy (T·o), the
      input gradient (d·T·i) and the weight's fp8 copy (i·o, not when FSDP gathered it in fp8);
    - the input cast: 9·T·i, beside both fp8 copies of the output gradient (2·T·o), the input gradient and the weight's.

    Traced on fake tensors with torchao 0.18 (tests/test_float8_timeline.py): the moments land on these bytes to within
    torchao's fp32 scalars."""
    w = i * o if weight_cast else 0
    return max(10 * tokens * o + d * tokens * i + w, 2 * tokens * o + (9 + d) * tokens * i + w)


def cast_bytes(arch: Architecture, recipe: str, tokens: int, tp: int = 1) -> int:
    """Bytes the fp8 casts of one layer move in one forward and backward over ``tokens`` tokens (memory-bound)."""
    act, weight = CAST_BYTES[recipe]
    return sum(act * tokens * (i + o) + weight * i * o for i, o in linears(arch, tp))
