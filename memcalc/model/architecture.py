"""A transformer's shape: the input from which parameters and activations are counted.

Field names follow what the shape means, not one library's config keys; ``memcalc.model.hf_config`` maps
Hugging Face ``config.json`` files onto it and ``presets/models/*.toml`` use these names as keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memcalc.errors import InputError
from memcalc.units import ceil_div

Position = Literal["learned", "rotary", "alibi", "none"]
Norm = Literal["layernorm", "rmsnorm"]


class Architecture(BaseModel):
    """A decoder-only transformer. Defaults describe a GPT-2-style block."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    """Preset or config name, for display."""
    aliases: tuple[str, ...] = ()
    """Other names users type for a preset."""
    family: str | None = None
    """The Hugging Face ``model_type`` this shape follows (llama, gpt2, ...), where there is one."""
    layers: int = Field(gt=0)
    """L: decoder layers."""
    hidden: int = Field(gt=0)
    """h: model width."""
    heads: int = Field(gt=0)
    """a: attention (query) heads."""
    kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads (GQA; 1 = MQA). Default: heads (MHA)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width. Default: hidden / heads."""
    ffn: int | None = Field(default=None, gt=0)
    """MLP inner width. Default: 4h."""
    gated_mlp: bool = False
    """SwiGLU/GeGLU: gate, up and down matrices (three) instead of two."""
    vocab: int = Field(gt=0)
    """Vocabulary size as the tokenizer has it."""
    embedding_dim: int | None = Field(default=None, gt=0)
    """Width of the token embedding when it differs from hidden (OPT-350M): adds project-in/out matrices."""
    vocab_multiple: int = Field(default=1, gt=0)
    """Pad the embedding rows to a multiple of this (Megatron: 128 x tp)."""
    tied_embeddings: bool = False
    """The output head reuses the input embedding matrix."""
    position: Position = "learned"
    """Position encoding: learned table, rotary, ALiBi or none."""
    max_positions: int = Field(default=0, ge=0)
    """Rows of a learned position table."""
    position_offset: int = Field(default=0, ge=0)
    """Extra learned position rows (OPT keeps 2)."""
    norm: Norm = "layernorm"
    norm_bias: bool = True
    """LayerNorm with a bias (RMSNorm has none)."""
    norms_per_layer: int = Field(default=2, ge=1, le=2)
    """2 (pre-attention and pre-MLP); 1 for parallel blocks sharing one norm (Falcon-7B)."""
    embedding_norm: bool = False
    """A norm right after the embedding (BLOOM)."""
    final_norm: bool = True
    fused_qkv: bool = False
    """Q, K and V are one Linear module (GPT-2, BLOOM, Falcon, NeoX): matters for the largest module."""
    qkv_bias: bool = True
    out_bias: bool = True
    """Bias on the attention output projection."""
    mlp_bias: bool = True
    parallel_block: bool = False
    """Attention and MLP read the same input (GPT-J, NeoX, Falcon)."""
    experts: int = Field(default=0, ge=0)
    """MoE experts per MoE layer; 0 = dense."""
    top_k: int = Field(default=2, ge=1)
    """Experts each token is routed to."""
    shared_experts: int = Field(default=0, ge=0)
    """Always-on experts per MoE layer (DeepSeek, Qwen-MoE)."""
    expert_ffn: int | None = Field(default=None, gt=0)
    """Inner width of one expert. Default: ffn."""
    moe_every: int = Field(default=1, ge=1)
    """Every k-th layer is MoE (1 = all)."""
    router_bias: bool = False
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout probability on attention probabilities and residual branches (0 = none)."""
    source: str | None = None
    """Where the shape comes from."""

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.head_dim is None and self.hidden % self.heads:
            raise InputError(
                f"heads {self.heads} does not divide hidden {self.hidden}; give a hidden size that is a multiple "
                f"of the heads, or head_dim"
            )
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise InputError(f"kv_heads {self.kv_heads} does not divide heads {self.heads}")
        if self.experts and self.top_k > self.experts:
            raise InputError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if self.position == "learned" and self.max_positions == 0:
            raise InputError("a learned position table needs max_positions")
        return self

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
