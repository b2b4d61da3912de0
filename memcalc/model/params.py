"""Exact parameter counts of a decoder-only transformer, in total and per tensor-parallel rank.

The count is the sum of the weight and bias tensors each module holds, the way
``sum(p.numel() for p in model.parameters())`` counts a Hugging Face model (tied matrices once).
Tensor-parallel sharding follows Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, §3):
column-parallel QKV / fc1 / gate / up split weights and biases over t; row-parallel out-proj / fc2 /
down split weights and keep the bias whole; norms are replicated; embedding and output head are
split along the vocabulary.
"""

from __future__ import annotations


from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture
from memcalc.errors import InputError


@frozen
class Shard:
    """Tensor- and expert-parallel degrees a rank's weights are split by."""

    tp: int = 1
    ep: int = 1


def kv_heads_per_rank(arch: Architecture, tp: int) -> int:
    """KV heads one TP rank holds: kv/t, or 1 (replicated) when t is a multiple of kv (Megatron's GQA rule)."""
    kv = arch.n_kv
    if kv % tp == 0:
        return kv // tp
    if tp % kv == 0:
        return 1
    raise InputError(f"tp {tp} and kv_heads {kv} do not divide one another; choose a tp that divides {kv} or is a multiple of it")


def check_tp(arch: Architecture, tp: int) -> None:
    if arch.heads % tp:
        raise InputError(f"tp {tp} does not divide heads {arch.heads}; accepted: a divisor of {arch.heads}")
    kv_heads_per_rank(arch, tp)


def attention_params(arch: Architecture, tp: int = 1) -> int:
    """Q, K, V and output projections with their biases: h(q + 2kv) + q·h (+ q + 2kv + h)."""
    h, d = arch.hidden, arch.d_head
    q = arch.q_width // tp
    kv = kv_heads_per_rank(arch, tp) * d
    n = h * (q + 2 * kv) + q * h
    if arch.qkv_bias:
        n += q + 2 * kv
    if arch.out_bias:
        n += h  # row-parallel bias is kept whole on every rank
    return n


def mlp_params(h: int, f: int, gated: bool, bias: bool, tp: int = 1) -> int:
    """Dense MLP: 2·h·f (+ f + h), or gated 3·h·f (+ 2f + h); column-parallel f split over t."""
    fr = f // tp
    if gated:
        return 3 * h * fr + ((2 * fr + h) if bias else 0)
    return 2 * h * fr + ((fr + h) if bias else 0)


def norm_params(arch: Architecture) -> int:
    return arch.hidden * (2 if arch.norm == "layernorm" and arch.norm_bias else 1)


@frozen
class LayerParams:
    attention: int
    mlp: int
    """Dense MLP, or all experts (+ shared experts) of an MoE layer that this rank holds."""
    router: int
    norms: int
    largest_mlp_module: int
    """The largest single MLP module (one expert in an MoE layer)."""
    routed: int = 0
    """Routed experts' parameters on this rank (in ``mlp``; sharded over the expert-data-parallel group)."""

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.router + self.norms


def layer_params(arch: Architecture, moe: bool, shard: Shard = Shard()) -> LayerParams:
    """One decoder layer on one rank."""
    h, tp = arch.hidden, shard.tp
    norms = arch.norms_per_layer * norm_params(arch) + sum(arch.qk_norm_widths)  # q_norm, k_norm
    attn = attention_params(arch, tp)
    if not moe:
        dense = mlp_params(h, arch.ffn_size, arch.gated_mlp, arch.mlp_bias, tp)
        return LayerParams(attn, dense, 0, norms, dense)
    if arch.experts % shard.ep:
        raise InputError(f"ep {shard.ep} does not divide the {arch.experts} experts")
    one = mlp_params(h, arch.expert_ffn_size, arch.gated_mlp, arch.mlp_bias, tp)
    shared = arch.shared_experts * mlp_params(h, arch.ffn_size, arch.gated_mlp, arch.mlp_bias, tp)
    router = h * arch.experts + (arch.experts if arch.router_bias else 0)
    routed = one * (arch.experts // shard.ep)
    return LayerParams(attn, routed + shared, router, norms, one, routed)


@frozen
class ModelParams:
    """Every parameter group of a model (or of one rank's part of it)."""

    embeddings: int
    """Token embedding, plus OPT-style project-in/out matrices when the embedding is narrower than hidden."""
    positions: int
    embedding_norm: int
    layers: list[LayerParams]
    final_norm: int
    head: int
    """0 when tied to the embeddings (and not a separate copy on another pipeline stage)."""

    @property
    def total(self) -> int:
        return (self.embeddings + self.positions + self.embedding_norm + sum(x.total for x in self.layers)
                + self.final_norm + self.head)  # fmt: skip


def embedding_params(arch: Architecture, tp: int = 1) -> int:
    """Token embedding: padded vocab x width, split along the vocabulary over t (rounded up)."""
    width = arch.embedding_dim or arch.hidden
    return -(-arch.padded_vocab // tp) * width


def projection_params(arch: Architecture) -> int:
    """OPT-350M: project_in (e x h) and project_out (h x e), no bias, when the embedding width e differs from h."""
    e = arch.embedding_dim
    return 0 if e is None or e == arch.hidden else 2 * e * arch.hidden


def position_params(arch: Architecture) -> int:
    """Learned position table: (max_positions + offset) x h; rotary and ALiBi have none."""
    return (arch.max_positions + arch.position_offset) * arch.hidden if arch.position == "learned" else 0


@per_architecture
def model_params(arch: Architecture, shard: Shard = Shard()) -> ModelParams:
    """The whole model, or one TP/EP rank's part of every layer (no pipeline split)."""
    emb = embedding_params(arch, shard.tp)
    return ModelParams(
        embeddings=emb + projection_params(arch),
        positions=position_params(arch),
        embedding_norm=norm_params(arch) if arch.embedding_norm else 0,
        layers=[layer_params(arch, arch.is_moe_layer(i), shard) for i in range(arch.layers)],
        final_norm=norm_params(arch) if arch.final_norm else 0,
        head=0 if arch.tied_embeddings else emb,  # the untied head is as wide as the embedding
    )


@per_architecture
def stage_params(arch: Architecture, stage: int, pp: int, shard: Shard = Shard()) -> ModelParams:
    """What pipeline stage ``stage`` of ``pp`` holds: its L/p layers, the embeddings on the first stage, the
    final norm and head on the last. With tied embeddings and pp > 1 the last stage keeps its own copy of the
    embedding matrix as the head (Megatron-LM keeps both in sync with an all-reduce)."""
    if arch.layers % pp:
        raise InputError(f"layers({arch.layers}) is not divisible by pp({pp}); choose a pp that divides {arch.layers}")
    per = arch.layers // pp
    whole = model_params(arch, shard)
    first, last = stage == 0, stage == pp - 1
    head = whole.head if not arch.tied_embeddings else (embedding_params(arch, shard.tp) if pp > 1 else 0)
    return ModelParams(
        embeddings=whole.embeddings if first else 0,
        positions=whole.positions if first else 0,
        embedding_norm=whole.embedding_norm if first else 0,
        layers=whole.layers[stage * per : (stage + 1) * per],
        final_norm=whole.final_norm if last else 0,
        head=head if last else 0,
    )


def largest_module(arch: Architecture) -> tuple[str, int]:
    """The largest single leaf module (an ``nn.Linear`` or ``nn.Embedding``) and its parameters."""
    h, q, kv, f = arch.hidden, arch.q_width, arch.kv_width, arch.ffn_size
    b = lambda on, n: n if on else 0  # noqa: E731  (bias elements when the module has a bias)
    emb = embedding_params(arch)
    c: dict[str, int] = {"embedding": emb, "position embedding": position_params(arch)}
    if not arch.tied_embeddings:
        c["lm_head"] = emb
    if arch.fused_qkv:
        c["qkv projection"] = h * (q + 2 * kv) + b(arch.qkv_bias, q + 2 * kv)
    else:
        c["q projection"] = h * q + b(arch.qkv_bias, q)
    c["output projection"] = q * h + b(arch.out_bias, h)
    if arch.fused_gate_up:  # Phi-3: one gate_up_proj of 2·ffn outputs
        c["mlp gate/up projection"] = 2 * h * f + b(arch.mlp_bias, 2 * f)
    widths = ([arch.ffn_size] if arch.moe_layers < arch.layers or arch.shared_experts else []) + (
        [arch.expert_ffn_size] if arch.moe else [])  # fmt: skip
    for width in widths:
        prefix = "expert " if arch.moe and width == arch.expert_ffn_size and f != width else ""
        c[f"{prefix}mlp up projection"] = max(c.get(f"{prefix}mlp up projection", 0), h * width + b(arch.mlp_bias, width))
        c[f"{prefix}mlp down projection"] = max(c.get(f"{prefix}mlp down projection", 0), width * h + b(arch.mlp_bias, h))
    name = max(c, key=lambda k: c[k])
    return name, c[name]


def largest_layer(arch: Architecture) -> int:
    """Parameters of the largest decoder layer: what FSDP gathers at once when it wraps each block."""
    return max(x.total for x in model_params(arch).layers)


def active_params(arch: Architecture) -> int:
    """Parameters one token passes through: in MoE layers only top_k experts (+ shared) of each."""
    p = model_params(arch)
    total = p.total
    if arch.moe:
        one = mlp_params(arch.hidden, arch.expert_ffn_size, arch.gated_mlp, arch.mlp_bias)
        total -= arch.moe_layers * one * (arch.experts - arch.top_k)
    return total
