"""Reference transformer blocks in plain PyTorch, and what they save for backward.

The blocks are written the way Megatron-LM and Hugging Face write theirs (pre-norm, fused or separate
QKV, eager softmax attention or ``scaled_dot_product_attention``), so that the bytes autograd keeps
between forward and backward can be measured and compared with ``memcalc.memory.accountings.activations``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


class GPTAttention(nn.Module):
    """Hugging Face GPT-2's attention module: fused QKV, core attention, output projection (called as a module,
    so hooks on it fire as they do in Hugging Face models)."""

    def __init__(self, hidden: int, heads: int, dropout: float, attention: str):
        super().__init__()
        self.a, self.p, self.attention = heads, dropout, attention
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        probs = torch.softmax(scores + causal_bias(q.shape[-2], q), dim=-1)
        probs = F.dropout(probs, self.p, self.training)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.a, h // self.a).transpose(1, 2) for t in (q, k, v))
        return self.proj(self.core(q, k, v).transpose(1, 2).reshape(b, s, h))


class GPTMLP(nn.Module):
    """Hugging Face GPT-2's MLP module: up projection, GELU, down projection."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class GPTBlock(nn.Module):
    """GPT-2 / Megatron block: LayerNorm, fused QKV, GELU MLP of 4h, dropout on probabilities and residuals."""

    def __init__(self, hidden: int, heads: int, ffn: int | None = None, dropout: float = 0.0, attention: str = "eager"):
        super().__init__()
        self.h, self.p = hidden, dropout
        # Hugging Face GPT-2's layout and call order: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj).
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = GPTAttention(hidden, heads, dropout, attention)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = GPTMLP(hidden, ffn or 4 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(self.attn(self.ln1(x)), self.p, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.p, self.training)


def causal_bias(s: int, like: torch.Tensor) -> torch.Tensor:
    """Additive causal mask (0 on and below the diagonal, -inf above), as HF eager attention adds it: an
    addition saves nothing for backward, unlike ``masked_fill`` which keeps its boolean mask."""
    return torch.full((s, s), float("-inf"), dtype=like.dtype, device=like.device).triu(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    """LLaMA block: RMSNorm, separate Q/K/V (GQA), rotary, SwiGLU MLP, no bias, no dropout by default."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, dropout: float = 0.0, attention: str = "eager"):
        super().__init__()
        self.h, self.a, self.kv, self.p, self.attention = hidden, heads, kv_heads, dropout, attention
        d = hidden // heads
        self.norm1 = nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * d, bias=False)
        self.k = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o = nn.Linear(heads * d, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.a
        n = self.norm1(x)
        q = self.q(n).view(b, s, self.a, d).transpose(1, 2)
        k = self.k(n).view(b, s, self.kv, d).transpose(1, 2)
        v = self.v(n).view(b, s, self.kv, d).transpose(1, 2)
        pos = torch.arange(s, device=x.device, dtype=torch.float32)
        freqs = torch.outer(pos, 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device).float() / d)))
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True,
                                               enable_gqa=self.kv != self.a)  # fmt: skip
        else:
            rep = self.a // self.kv
            k = k[:, :, None].expand(b, self.kv, rep, s, d).reshape(b, self.a, s, d)
            v = v[:, :, None].expand(b, self.kv, rep, s, d).reshape(b, self.a, s, d)
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
            probs = torch.softmax(scores + causal_bias(s, q), dim=-1)
            probs = F.dropout(probs, self.p, self.training)
            y = torch.matmul(probs, v)
        x = x + F.dropout(self.o(y.transpose(1, 2).reshape(b, s, h)), self.p, self.training)
        m = self.norm2(x)
        return x + F.dropout(self.down(F.silu(self.gate(m)) * self.up(m)), self.p, self.training)


@contextmanager
def saved_bytes(exclude: nn.Module | None = None) -> Iterator[dict[str, int]]:
    """Bytes autograd saves for backward inside the block, one count per storage, parameters excluded.

    Yields a dict that holds ``bytes`` and ``tensors`` once the block exits.
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude.parameters()} if exclude is not None else set()
    seen: dict[int, int] = {}
    out = {"bytes": 0, "tensors": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out
    out["bytes"] = sum(seen.values())
    out["tensors"] = len(seen)
