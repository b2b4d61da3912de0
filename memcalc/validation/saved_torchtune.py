"""A census of what torchtune's Llama 3 saves for backward, layer by layer, on this CPU (torchtune installed).

Builds ``torchtune.models.llama3._component_builders.llama3`` at a tiny size (GQA: 4 heads over 2 KV heads), runs
one forward in bf16 or fp32 (torchtune trains in one dtype: its recipes' ``dtype: bf16``, no autocast) followed by
``cross_entropy`` on the fp32 logits (torchtune's ``CEWithChunkedOutputLoss`` upcasts each chunk), and records
every tensor autograd packs (``torch.autograd.graph.saved_tensors_hooks``). A tensor belongs to the decoder layer
running when it was first saved: torchtune shares modules between layers (one ``RotaryPositionalEmbeddings``, and in
some builders one activation), so the layer is tracked by hooks on ``model.layers[i]``, not by module names.
Parameters and buffers (the rotary cache) count zero; bytes count once per storage, as ``memcalc.validation.saved``.

What it found (torchtune 0.6.1, torch 2.13, CPU; ``memcalc.memory.saved`` ``code="torchtune"`` encodes it):
- ``RMSNorm.forward`` is ``F.rms_norm(x.float(), weight=scale).to(x.dtype)``: the composite keeps the fp32 copy of
  its input, rstd and the fp32 normalized tensor (4·T·h + 4·T + 4·T·h), in bf16 and fp32 alike.
- ``MultiHeadAttention`` expands K and V to the query heads before SDPA (``k.unsqueeze(2).expand(...).flatten(1,
  2)``, modules/attention.py): SDPA keeps Q, K, V at full width, its output and the fp32 log-sum-exp; there is no
  KV cache in training. q, k and v share one saved input (the norm output).
- The rotary embedding keeps only the shared cache (a buffer); the MLP keeps w1's output, SiLU's, w3's and the
  product, as Hugging Face's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_H, _HEADS, _KV, _FFN, _VOCAB, _LAYERS = 64, 4, 2, 96, 120, 2


def available() -> bool:
    try:
        from torchtune.models.llama3._component_builders import llama3  # noqa: F401
    except Exception:  # noqa: BLE001  torchtune absent, or its own imports (torchao, datasets) missing
        return False
    return True


def build(dtype: str):
    import torch
    from torchtune.models.llama3._component_builders import llama3

    torch.manual_seed(0)
    model = llama3(vocab_size=_VOCAB, num_layers=_LAYERS, num_heads=_HEADS, num_kv_heads=_KV, embed_dim=_H,
                   max_seq_len=256, intermediate_dim=_FFN)  # fmt: skip
    return model.to(torch.bfloat16 if dtype == "bf16" else torch.float32).train()


@contextlib.contextmanager
def _current_layer(model) -> Iterator[list[int | None]]:
    where: list[int | None] = [None]
    handles = []
    for i, layer in enumerate(model.layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, None)))
    try:
        yield where
    finally:
        for h in handles:
            h.remove()


def census(dtype: str, s: int, b: int) -> dict[str, int]:
    """Bytes saved per part: ``layer.i`` for each decoder layer, ``outside`` for the rest (embedding, final norm,
    output projection, loss)."""
    import torch
    import torch.nn.functional as F

    model = build(dtype)
    fixed = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    parts: dict[str, int] = {}
    keep = []
    with _current_layer(model) as where:

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in fixed and ptr not in seen:
                seen.add(ptr)
                part = "outside" if where[0] is None else f"layer.{where[0]}"
                parts[part] = parts.get(part, 0) + t.untyped_storage().nbytes()
            keep.append(t)
            return t

        ids = torch.randint(0, _VOCAB, (b, s), generator=torch.Generator().manual_seed(0))
        labels = ids.clone()  # the recipe's batch carries its own (shifted) labels
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(ids)
            F.cross_entropy(logits.float().reshape(-1, _VOCAB), labels.reshape(-1))
    return parts


def tiny_architecture():
    """The same shape as memcalc reads it."""
    from memcalc.model.architecture import Architecture

    return Architecture(layers=_LAYERS, hidden=_H, heads=_HEADS, kv_heads=_KV, ffn=_FFN, gated_mlp=True, vocab=_VOCAB,
                        position="rotary", norm="rmsnorm", norm_bias=False, qkv_bias=False, out_bias=False,
                        mlp_bias=False, family="llama")  # fmt: skip
