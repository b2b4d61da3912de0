"""A transformer's shape: the input from which parameters and activations are counted.

Field names follow what the shape means, not one library's config keys; ``memcalc.model.hf_config`` maps
Hugging Face ``config.json`` files onto it and ``presets/models/*.toml`` use these names as keys.
"""

from typing import Literal


from memcalc.errors import InputError
from memcalc.validated import Validated, bounded
from memcalc.units import ceil_div

Position = Literal["learned", "rotary", "alibi", "none"]
Norm = Literal["layernorm", "rmsnorm"]
NormPlacement = Literal["pre", "sandwich", "post"]

# Upper bounds on every size: far above any published model, low enough that each answer stays exact and quick
# (per-layer and per-expert loops stay short). The largest published shapes, for scale: 126 layers and hidden
# 16,384 (Llama 3.1 405B, arXiv 2407.21783 Table 3), hidden 20,480 (MT-NLG 530B, arXiv 2201.11990 §3), FFN 73,728
# (PaLM 540B, arXiv 2204.02311 Table 1), a 256,000-token vocabulary (Gemma, arXiv 2403.08295 §2), 2,048 experts
# (Switch-C, arXiv 2101.03961 Table 9).
MAX_LAYERS = 10_000
"""~80x the deepest published decoder stack (126 layers)."""
MAX_HIDDEN = 2**20
"""1,048,576: 51x the widest published model; one h x h bf16 matrix this wide is 2 TiB, beyond any GPU."""
MAX_HEADS = 2**16
"""65,536: published models use at most a few hundred query heads (Falcon-180B: 232); bounds kv_heads too."""
MAX_HEAD_DIM = 2**16
"""65,536: published head widths are 64..256."""
MAX_FFN = 4 * MAX_HIDDEN
"""4,194,304: the default 4h at the widest accepted hidden size (57x PaLM's 73,728)."""
MAX_VOCAB = 2**24
"""16,777,216: 64x the largest published vocabulary; above 2**24 token ids are no longer exact in fp32."""
MAX_POSITIONS = 2**24
"""16,777,216 positions: 1.6x the longest advertised context (10M tokens, Llama 4 Scout); GPT-3 and OPT learn 2,048."""
MAX_VOCAB_MULTIPLE = 2**20
"""Megatron pads the vocabulary to a multiple of 128 x tp: this leaves tp up to 8,192."""
MAX_EXPERTS = 2**16
"""65,536: 32x Switch-C's 2,048 experts; bounds top_k and shared experts too (activations loop over them)."""
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
"""Family-neutral names of a decoder layer's projections (LoRA's ``--lora-targets``: ``memcalc.model.lora``)."""
MAX_LORA_RANK = 65_536
"""LoRA's r at most: wider than any model's hidden size."""


class Architecture(Validated):
    """A decoder-only transformer. Defaults describe a GPT-2-style block."""

    __error_name__ = "architecture"  # messages name the field as the shape flags do: ``architecture.layers 0 ...``

    name: str | None = None
    """Preset or config name, for display."""
    aliases: tuple[str, ...] = ()
    """Other names users type for a preset."""
    family: str | None = None
    """The Hugging Face ``model_type`` this shape follows (llama, gpt2, ...), where there is one."""
    layers: int = bounded(gt=0, le=MAX_LAYERS)
    """L: decoder layers."""
    hidden: int = bounded(gt=0, le=MAX_HIDDEN)
    """h: model width."""
    heads: int = bounded(gt=0, le=MAX_HEADS)
    """a: attention (query) heads."""
    kv_heads: int | None = bounded(default=None, gt=0, le=MAX_HEADS)
    """Key/value heads (GQA; 1 = MQA). Default: heads (MHA)."""
    head_dim: int | None = bounded(default=None, gt=0, le=MAX_HEAD_DIM)
    """Per-head width. Default: hidden / heads."""
    ffn: int | None = bounded(default=None, gt=0, le=MAX_FFN)
    """MLP inner width. Default: 4h."""
    gated_mlp: bool = False
    """SwiGLU/GeGLU: gate, up and down matrices (three) instead of two."""
    vocab: int = bounded(gt=0, le=MAX_VOCAB)
    """Vocabulary size as the tokenizer has it."""
    embedding_dim: int | None = bounded(default=None, gt=0, le=MAX_HIDDEN)
    """Width of the token embedding when it differs from hidden (OPT-350M): adds project-in/out matrices."""
    vocab_multiple: int = bounded(default=1, gt=0, le=MAX_VOCAB_MULTIPLE)
    """Pad the embedding rows to a multiple of this (Megatron: 128 x tp)."""
    tied_embeddings: bool = False
    """The output head reuses the input embedding matrix."""
    position: Position = "learned"
    """Position encoding: learned table, rotary, ALiBi or none."""
    max_positions: int = bounded(default=0, ge=0, le=MAX_POSITIONS)
    """Rows of a learned position table."""
    position_offset: int = bounded(default=0, ge=0, le=MAX_POSITIONS)
    """Extra learned position rows (OPT keeps 2)."""
    norm: Norm = "layernorm"
    """The norm: layernorm or rmsnorm."""
    norm_bias: bool = True
    """LayerNorm with a bias (RMSNorm has none)."""
    norms_per_layer: int = bounded(default=2, ge=1, le=4)
    """2 (pre-attention and pre-MLP); 1 for parallel blocks sharing one norm (Falcon-7B); 4 when each sublayer has
    a norm before and after it (Gemma 2 and 3: ``norm_placement`` "sandwich")."""
    norm_placement: NormPlacement = "pre"
    """Where the layer's norms sit: "pre" (before attention and MLP), "sandwich" (before and after each: Gemma 2,
    Gemma 3), "post" (on the attention and MLP outputs before the residual add, none before: OLMo 2)."""
    embedding_norm: bool = False
    """A norm right after the embedding (BLOOM)."""
    final_norm: bool = True
    """A norm after the last decoder layer."""
    fused_qkv: bool = False
    """Q, K and V are one Linear module (GPT-2, BLOOM, Falcon, NeoX, Phi-3): matters for the largest module."""
    fused_gate_up: bool = False
    """Gate and up are one Linear module of width 2·ffn, split after the matmul (Phi-3's ``gate_up_proj``)."""
    nope_layers: tuple[int, ...] = ()
    """0-based indices of the layers that skip the rotary embedding (SmolLM3's ``no_rope_layers`` zeros)."""
    rotary_dims: int | None = bounded(default=None, gt=0, le=MAX_HEAD_DIM)
    """Head dims the rotary embedding turns (GPT-NeoX's ``partial_rotary_factor``, 0.25 by default); None: all."""
    qk_norm: bool = False
    """An RMSNorm over each head of Q and of K before the rotary embedding (Qwen3's ``q_norm``/``k_norm``): two
    head_dim-wide weights per layer."""
    qk_norm_width: Literal["head", "full"] = "head"
    """q_norm/k_norm over one head (Qwen3, Gemma 3: head_dim weights) or over all heads (OLMo 2: q and kv width)."""
    sliding_layers: tuple[int, ...] = ()
    """0-based indices of the layers with sliding-window attention (Gemma 2 and 3 ``layer_types``)."""
    sliding_window: int | None = bounded(default=None, gt=0, le=MAX_POSITIONS)
    """Tokens a sliding layer attends to (None: no sliding layers)."""
    attention_softcap: bool = False
    """Attention scores pass through cap·tanh(x/cap) before the softmax (Gemma 2 ``attn_logit_softcapping``)."""
    logit_softcap: bool = False
    """The logits pass through cap·tanh(x/cap) (Gemma 2 ``final_logit_softcapping``)."""
    qkv_bias: bool = True
    """Biases on the Q, K and V projections."""
    out_bias: bool = True
    """Bias on the attention output projection."""
    mlp_bias: bool = True
    """Biases on the MLP's projections."""
    parallel_block: bool = False
    """Attention and MLP read the same input (GPT-J, NeoX, Falcon)."""
    kv_expanded: bool = False
    """K and V are broadcast to the query heads and copied before attention (Falcon's new decoder architecture)."""
    experts: int = bounded(default=0, ge=0, le=MAX_EXPERTS)
    """MoE experts per MoE layer; 0 = dense."""
    top_k: int = bounded(default=2, ge=1, le=MAX_EXPERTS)
    """Experts each token is routed to."""
    shared_experts: int = bounded(default=0, ge=0, le=MAX_EXPERTS)
    """Always-on experts per MoE layer (DeepSeek, Qwen-MoE)."""
    expert_ffn: int | None = bounded(default=None, gt=0, le=MAX_FFN)
    """Inner width of one expert. Default: ffn."""
    moe_every: int = bounded(default=1, ge=1, le=MAX_LAYERS)
    """Every k-th layer is MoE (1 = all)."""
    router_bias: bool = False
    """A bias on the MoE router."""
    router_norm: bool = True
    """The top-k routing weights divided by their sum (Mixtral always; Qwen3-MoE's ``norm_topk_prob``)."""
    dropout: float = bounded(default=0.0, ge=0, lt=1)
    """Dropout probability on attention probabilities and residual branches (0 = none)."""
    source: str | None = None
    """Where the shape comes from."""

    def _check(self) -> None:
        if self.head_dim is None and self.hidden % self.heads:
            raise InputError(
                f"heads {self.heads} does not divide hidden {self.hidden}; give a hidden size that is a multiple "
                f"of the heads, or head_dim"
            )
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise InputError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")
        if self.experts and self.top_k > self.experts:
            raise InputError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if any(not 0 <= i < self.layers for i in self.nope_layers):
            raise InputError(f"nope_layers {list(self.nope_layers)[:8]} name a layer outside 0..{self.layers - 1}")
        if any(not 0 <= i < self.layers for i in self.sliding_layers):
            raise InputError(f"sliding_layers {list(self.sliding_layers)[:8]} name a layer outside 0..{self.layers - 1}")
        if self.sliding_layers and self.sliding_window is None:
            raise InputError("sliding_layers need a sliding_window")
        if self.position == "learned" and self.max_positions == 0:
            raise InputError("a learned position table needs max_positions")

    # ---- derived sizes ----
    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """heads x head_dim (= h unless head_dim says otherwise)."""
        return self.heads * self.d_head

    @property
    def kv_width(self) -> int:
        return self.n_kv * self.d_head

    @property
    def qk_norm_widths(self) -> tuple[int, int]:
        """(q_norm, k_norm) weight elements: head_dim each, or the q and kv widths (``qk_norm_width``)."""
        if not self.qk_norm:
            return 0, 0
        return (self.d_head, self.d_head) if self.qk_norm_width == "head" else (self.q_width, self.kv_width)

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn_size(self) -> int:
        return self.expert_ffn or self.ffn_size

    @property
    def padded_vocab(self) -> int:
        return ceil_div(self.vocab, self.vocab_multiple) * self.vocab_multiple

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) is an MoE layer: every ``moe_every``-th, counting from the last of each run."""
        return self.moe and (index + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))
