"""Bytes the model code moves through HBM in its memory-bound ops, op by op as each code base writes them: the norms
and rotary embedding (``elementwise_bytes``) and eager attention's passes over the score matrix
(``eager_attention_bytes``). ``memcalc.time.step`` times them at the achievable HBM bandwidth."""

from __future__ import annotations

from functools import cache


@cache
def elementwise_bytes(code: str, e: int, r: int) -> tuple[float, float]:
    """(bytes per element of one RMSNorm, bytes per q or k element of the rotary embedding), forward, for a residual
    stream of ``r`` bytes and compute dtype of ``e``; the backward moves twice as much (the model's convention).

    - fused: a norm reads its input and writes its output (2r); rotary reads and writes q and k (2e).
    - hf, LlamaRMSNorm (transformers modeling_llama.py): ``x.to(float32)`` (read r, write 4 unless r = 4), ``pow(2)``
      (8), ``mean`` (read 4), ``x * rsqrt`` (8), ``.to(input_dtype)`` (read 4, write r unless r = 4), ``weight *``
      (2r): 36 bytes for a bf16 stream, 28 for fp32. ``apply_rotary_pos_emb``: ``rotate_half`` (negate half: e,
      ``cat``: 2e), ``q * cos`` (2e), ``rotate_half(q) * sin`` (2e), the sum (3e): 10e.
    - torchtitan on torch 2.13: ``nn.RMSNorm`` dispatches to the fused ``_fused_rms_norm`` on CUDA (2r); its complex
      rotary upcasts (read e, write 4 unless e = 4), multiplies in complex64 (8) and casts back (read 4, write e
      unless e = 4): 20 bytes at bf16, 8 at fp32.
    """
    if code == "hf":
        up = 0 if r == 4 else r + 4 + 4 + r
        return float(up + 8 + 4 + 8 + 2 * r), float(10 * e)
    if code == "torchtitan":
        return float(2 * r), float(8 if e == 4 else (e + 4) + 8 + (4 + e))
    return float(2 * r), float(2 * e)


@cache
def eager_attention_bytes(code: str, e: int, m: int, dropout: bool) -> tuple[float, float]:
    """(forward, backward) bytes moved per attention score element (one query-key pair of one head) around the two
    batched matmuls of eager attention, whose own FLOPs are timed as GEMMs; ``e``: bytes of the scores' dtype (the
    compute dtype), ``m``: bytes of the additive mask (the model's dtype: fp32 weights under autocast).

    - fused (Megatron-LM's ``FusedScaleMaskSoftmax``, the paper's case): QKᵀ written (e), one kernel reads it and
      writes the probabilities (2e), P·V reads them (e): 4e forward; backward dP written (e), P read for dV (e),
      the softmax's backward reads both and writes dS (3e), the dQ and dK matmuls read dS (2e): 7e. Dropout reads
      and writes the probabilities and writes a 1-byte mask (2e + 1), and its backward the same.
    - hf (transformers ``eager_attention_forward``): QKᵀ written (e); ``* scaling`` (2e); ``+ attention_mask``
      (read e and m, write w = the promoted dtype's bytes, max(e, m)); ``softmax(dtype=float32)``, whose ATen takes
      the half-to-float path for fp16 only, so other inputs are first cast (read w, write 4, unless w = 4), then
      read 4 and write 4; ``.to(query.dtype)`` (read 4, write e, unless e = 4); dropout with a probability above 0
      (2e + 1; at 0 it returns its input); P·V reads P (e). Backward (derivatives.yaml, autograd casting each
      gradient to its input's dtype): dP written (e) and P read for dV (e); dropout (2e + 1); the ``.to``'s cast
      (e + 4, unless e = 4); ``_softmax_backward_data`` reads the gradient and the output and writes (12); the
      pre-softmax cast undone (4 + w, unless w = 4); the add's gradient cast to the scores' dtype (w + e, unless
      w = e); ``* scaling`` (2e); dS read by the dQ and dK matmuls (2e). Autocast (e = 2, m = 4): 32 forward, 36
      backward.
    """
    drop = 2 * e + 1 if dropout else 0
    if code != "hf":
        return float(4 * e + drop), float(7 * e + drop)
    w = max(e, m)
    cast_in = 0 if w == 4 else w + 4
    cast_out = 0 if e == 4 else 4 + e
    fwd = e + 2 * e + (e + m + w) + cast_in + 8 + cast_out + drop + e
    bwd = 2 * e + drop + cast_out + 12 + cast_in + (0 if w == e else w + e) + 2 * e + 2 * e
    return float(fwd), float(bwd)
