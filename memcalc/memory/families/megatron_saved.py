"""What one Megatron-Core GPT decoder layer saves for backward, tensor by tensor, per micro-batch on one rank.

Read from megatron-core 0.16.1's code (paths under ``megatron/core/``) and, for the Transformer Engine spec, from the
TE modules it calls (``transformer_engine/pytorch/module/layernorm_linear.py``, ``linear.py``,
``attention/dot_product_attention``): the layer is ``transformer/transformer_layer.py`` ``TransformerLayer``
(input norm, ``SelfAttention``, bias-dropout-add, pre-MLP norm, ``MLP``, bias-dropout-add).

Two layer specs (``models/gpt/gpt_layer_specs.py``):

- ``te`` (``get_gpt_layer_with_transformer_engine_spec``, what Megatron-LM, NeMo and Megatron-Bridge run on GPUs):
  the norms fused into ``TELayerNormColumnParallelLinear`` (qkv and fc1), which saves its input and the norm's
  output (one byte per element in FP8: the quantized copy the wgrad GEMM reads) and the fp32 rsigma (and mu for
  LayerNorm); ``TEDotProductAttention`` (flash / cuDNN fused attention) saves q, k, v, its output and the fp32
  softmax statistics (b x heads x s); ``TERowParallelLinear`` (proj, fc2) saves its input, which for proj is the
  attention's output already saved (bf16) and in FP8 a one-byte copy besides; ``fusions/fused_bias_swiglu.py``
  ``SwiGLUFunction`` saves fc1's output (gate and up, 2·ffn wide).
- ``local`` (``get_gpt_layer_local_spec``: Megatron-Core's own modules, the spec that runs on a CPU and that
  ``memcalc.validation.trace_megatron`` traces): separate ``WrappedTorchNorm`` norms (each saves its input; the
  linear after it saves the norm's output), ``ColumnParallelLinear`` / ``RowParallelLinear``
  (``tensor_parallel/layers.py`` ``LinearWithGradAccumulationAndAsyncCommunication`` saves its input, the local
  sequence shard under sequence parallelism, all-gathered again in backward), and the unfused
  ``transformer/dot_product_attention.py`` ``DotProductAttention``: the scores' softmax (``FusedScaleMaskSoftmax``,
  fp32 on CPU) and the probabilities the value bmm reads are a·s² each.

Rotary embeddings (``models/common/embeddings/rope_utils.py``) make new q and k; v stays a view of the qkv GEMM's
output, so what keeps v alive keeps that whole output (counted as the qkv output for the local spec, traced; TE's
attention takes q, k, v as given: counted as v alone, see docs/timeline.md). Dropouts at 0 (Llama-style recipes)
save nothing (``torch.nn.functional.dropout`` returns its input at p = 0).

Selective recompute (``--recompute-granularity selective``, ``--recompute-modules``, default ``core_attn``):
``core_attn`` checkpoints the attention core (``attention.py`` ``_checkpointed_attention_forward``: q, k, v kept,
the a·s² tensors and the output's statistics dropped; the output is still saved by proj in bf16, under FP8 only
proj's one-byte copy of it); ``mlp`` checkpoints the MLP
(its input kept); ``layernorm`` drops the separate norms' outputs (``CheckpointWithoutOutput``; no effect under the
TE spec, whose norms are fused into the linears). Full recompute is ``memcalc.memory.accountings.megatron``'s.
"""

from __future__ import annotations

from typing import Any, NamedTuple

SPECS = ("te", "local")
MODULES = ("core_attn", "mlp", "layernorm", "moe_act")
"""Megatron-Core's ``--recompute-modules`` memcalc models (megatron/core/transformer/transformer_config.py)."""


def megatron_recompute(text: str) -> bool:
    """Megatron-Core's recompute settings as one --recompute value: ``selective:core_attn+mlp``
    (``--recompute-granularity selective --recompute-modules core_attn mlp``), ``full:uniform:N`` and ``full:block:N``
    (``--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N``)."""
    head, _, rest = text.partition(":")
    if head == "selective":
        mods = rest.split("+")
        return bool(rest) and len(set(mods)) == len(mods) and all(m in MODULES for m in mods)
    if head == "full":
        method, _, n = rest.partition(":")
        return (method in ("uniform", "block") and n.isdigit() and int(n) <= 100_000
                and (int(n) > 0 or method == "block"))
    return False
SELECTIVE = ("core_attn", "mlp", "layernorm")
"""The ``--recompute-modules`` of a dense layer this module models; MoE layers: moe_act (``moe_saved``)."""


class Shape(NamedTuple):
    """What the saved set reads of the model and the micro-batch on one rank."""

    hidden: int
    q_width: int
    kv_width: int
    ffn: int
    gated: bool
    heads: int
    norm: str
    """rmsnorm or layernorm (LayerNorm saves mu beside rsigma)."""
    s: int
    """The rank's sequence length (s / cp)."""
    b: int
    tp: int
    sp: bool
    qk_norm: bool = False
    kv_heads: int = 0


def shape_of(arch: Any, s: int, b: int, tp: int, sp: bool) -> Shape:
    return Shape(arch.hidden, arch.q_width, arch.kv_width, arch.ffn_size, arch.gated_mlp, arch.heads,
                 "rmsnorm" if arch.norm == "rmsnorm" else "layernorm", s, b, tp, sp and tp > 1, arch.qk_norm,
                 arch.n_kv)


def layer_saved(x: Shape, spec: str = "te", fp8: bool = False,
                modules: tuple[str, ...] = ()) -> list[tuple[str, int]]:  # fmt: skip
    """(tensor, bytes) one dense layer keeps for its backward per micro-batch; ``modules``: the selective
    recompute modules in force (empty: none)."""
    t = x.s * x.b
    seq = t // x.tp if x.sp else t  # the sequence-sharded tensors (norm inputs and outputs under SP)
    tq, tkv, tf = t * x.q_width // x.tp, t * x.kv_width // x.tp, t * x.ffn // x.tp
    stats = 4 * seq * (2 if x.norm == "layernorm" else 1)  # rsigma (and mu), fp32 per token
    lin = 1 if fp8 else 2  # what a linear keeps of its input: bf16, or TE's one-byte FP8 copy
    up = 2 if x.gated else 1
    out: list[tuple[str, int]] = []
    add = out.append
    core = "core_attn" in modules
    if spec == "te":
        add(("norm 1 input (qkv LayerNormLinear)", 2 * x.hidden * seq))
        add(("norm 1 output (qkv input" + (", fp8)" if fp8 else ")"), lin * x.hidden * seq))
        add(("norm 1 rsigma (fp32)", stats))
        if x.qk_norm:  # TENorm on each head of q and k (qk_layernorm): their inputs and fp32 rsigma
            add(("q, k norm inputs and rsigma", 2 * (tq + tkv) + 4 * t * (x.heads + x.kv_heads) // x.tp))
        add(("q, k (after rotary)", 2 * (tq + tkv)))
        add(("v", 2 * tkv))
        if not (core and fp8):  # the fused attention keeps its output for its backward; under the core_attn
            # checkpoint it keeps nothing and proj, under FP8, only its one-byte copy (linear.py saves the quantized
            # input alone)
            add(("attention output (proj input)", 2 * tq))
        if not core:
            add(("softmax statistics (fp32)", 4 * x.b * x.heads // x.tp * x.s))
        if fp8:
            add(("proj input (fp8 copy)", tq))
        if "mlp" in modules:
            add(("MLP checkpoint input", 2 * x.hidden * seq))
            return out
        add(("norm 2 input (fc1 LayerNormLinear)", 2 * x.hidden * seq))
        add(("norm 2 output (fc1 input" + (", fp8)" if fp8 else ")"), lin * x.hidden * seq))
        add(("norm 2 rsigma (fp32)", stats))
    else:
        # CPU's torch.rms_norm (WrappedTorchNorm without apex) upcasts: it saves the fp32 input, rsqrt, the fp32
        # normalized input and an fp32 copy of the weight (traced)
        norm = 2 * 4 * x.hidden * seq + 4 * seq + 4 * x.hidden
        d = x.q_width // x.heads
        add(("norm 1 (fp32 input, rsqrt, normalized, weight)", norm))
        add(("qkv input (norm 1 output)", 2 * x.hidden * seq))
        add(("rotary cos, sin (q and k)", 4 * 2 * x.s * d))
        if core:  # the checkpoint keeps its inputs: q, and k and v before the repeat
            add(("q, k, v (core_attn checkpoint inputs)", 2 * (tq + 2 * tkv)))
        else:  # the local DotProductAttention repeats k and v over the query heads (GQA) before its bmm
            add(("q, k, v (k and v repeated to the query heads)", 3 * 2 * tq))
        if not core:
            scores = x.b * x.heads // x.tp * x.s * x.s
            add(("attention probabilities (fp32 softmax output)", 4 * scores))
            add(("attention probabilities (bf16, value bmm input)", 2 * scores))
        add(("attention output (proj input)", 2 * tq))
        add(("norm 2 (fp32 input, rsqrt, normalized, weight)", norm))
        if "mlp" in modules:  # the local spec's pre-MLP norm stays outside the checkpoint, whose input is its output
            add(("MLP checkpoint input (norm 2 output)", 2 * x.hidden * seq))
            return out
        add(("fc1 input (norm 2 output)", 2 * x.hidden * seq))
        if x.gated:
            add(("gate activation output, up half", 2 * 2 * tf))
    add(("fc1 output (activation input)", 2 * up * tf))
    add(("fc2 input (activation output" + (", fp8)" if fp8 else ")"), lin * tf))
    return out


def moe_saved(x: Shape, experts: int, top_k: int, expert_ffn: int, shared_ffn: int = 0, fp8: bool = False,
              modules: tuple[str, ...] = ()) -> list[tuple[str, int]]:  # fmt: skip
    """The MoE half of a Transformer Engine MoE layer (``transformer/moe/moe_layer.py``) per micro-batch on one rank,
    after the attention half of ``layer_saved``: the pre-MLP ``TENorm`` (its input, rsigma; its output the router's
    and the dispatcher's input), the router (``router.py``: the gate's input, fp32 logits, their softmax/top-k and the
    routing map), the experts (``experts.py`` ``TEGroupedMLP``: the grouped fc1's input, fc1's output, kept by the
    probability-weighted swiglu with the permuted probabilities, fc2's input) on the tokens the all-to-all dispatcher
    (``token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``) brings: s·b·k per rank with routing balanced (the
    experts' tensor parallelism, expert_tensor_parallel_size = tp by default, all-gathers the tp shards' tokens and
    splits the expert ffn), the permutations saving indices only; a shared expert as a dense MLP. ``moe_act``
    recompute (``TEGroupedMLP``'s ``CheckpointWithoutOutput`` around the activation) keeps fc1's output and drops
    the activation's output, fc2's input, rebuilding it in backward."""
    t = x.s * x.b
    seq = t // x.tp if x.sp else t
    lin = 1 if fp8 else 2
    tokens = t * top_k  # per rank, balanced routing, tp shards' tokens gathered for the expert tensor parallelism
    fe = expert_ffn // x.tp
    stats = 4 * seq * (2 if x.norm == "layernorm" else 1)
    out = [("norm 2 input", 2 * x.hidden * seq), ("norm 2 rsigma (fp32)", stats),
           ("router input (norm 2 output)", 2 * x.hidden * seq),
           ("router logits, probabilities, top-k (fp32), routing map", 3 * 4 * seq * experts + seq * experts),
           ("experts: fc1 input (dispatched tokens" + (", fp8)" if fp8 else ")"), lin * x.hidden * tokens),
           ("experts: fc1 output (activation input)", 2 * 2 * fe * tokens),
           ("experts: permuted probabilities (fp32)", 4 * tokens)]
    if "moe_act" not in modules:
        out.append(("experts: fc2 input (activation output" + (", fp8)" if fp8 else ")"), lin * fe * tokens))
    if shared_ffn:
        fs = t * shared_ffn // x.tp
        out += [("shared expert: fc1 input", lin * x.hidden * seq), ("shared expert: fc1 output", 2 * 2 * fs),
                ("shared expert: fc2 input", lin * fs)]
    return out


def moe_transient(x: Shape, top_k: int, expert_ffn: int) -> int:
    """The experts' backward working set: fc1's output gradient and fc2's input gradient over the dispatched tokens,
    and the dispatcher's all-to-all buffers of the tokens' gradients (bf16)."""
    tokens = x.s * x.b * top_k
    return 2 * tokens * (3 * expert_ffn // x.tp + 2 * x.hidden)


def layer_bytes(x: Shape, spec: str = "te", fp8: bool = False, modules: tuple[str, ...] = ()) -> int:
    return sum(n for _, n in layer_saved(x, spec, fp8, modules))


def backward_transient(x: Shape) -> int:
    """The largest working set of one layer's backward beyond what it saved: the MLP's, where the activation's
    backward makes fc1's output gradient (2·ffn wide, bf16) from fc2's input gradient (ffn wide) while fc2's
    saved input is still held; the attention's and the norms' are smaller for every shape memcalc knows."""
    t = x.s * x.b
    up = 2 if x.gated else 1
    return 2 * (up + 1) * t * x.ffn // x.tp


def head_saved(arch: Any, x: Shape, spec: str = "te") -> list[tuple[str, int]]:
    """The last stage's final norm and output layer per micro-batch (``models/gpt/gpt_model.py``): the final norm's
    input and its output (the output layer's input, sequence-sharded under SP), rsigma."""
    seq = x.s * x.b // x.tp if x.sp else x.s * x.b
    return [("final norm input", 2 * x.hidden * seq), ("output layer input (final norm output)", 2 * x.hidden * seq),
            ("final norm rsigma (fp32)", 4 * seq)]


def loss_transient(arch: Any, x: Shape) -> int:
    """The loss of one micro-batch on the last stage (``tensor_parallel/cross_entropy.py``
    ``_VocabParallelCrossEntropy``): the output layer's bf16 logits (s·b·V/tp), their fp32 copy
    (``calculate_logits_max``: ``.float()``) made while they live; the fp32 softmax saved for backward, turned into the
    gradient in place and cast to bf16 for the output layer's backward: 6 bytes per vocabulary-shard logit at most."""
    vocab = -(-arch.padded_vocab // x.tp)
    return 6 * x.s * x.b * vocab
