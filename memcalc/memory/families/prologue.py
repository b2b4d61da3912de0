"""What each model family adds to a step beyond its decoder layers, as data: its forward prologue (the tensors the
model makes before the first layer and keeps, ``prologue``) and what its layers leave cached until the forward
returns (``cached``).

A family's prologue is one entry of ``ROWS`` (its own tensors, after the rotary tables every rotary family makes)
and one of ``MASKS`` (the attention masks it builds: by default the eager 4-D mask of the Llama-style and
Gemma/OLMo 2 families); a new family is a new entry, not a new branch of ``memcalc.memory.engine.timeline``.
"""

from __future__ import annotations

from memcalc.memory.families.saved import LLAMA_STYLE, OTHER_NORMS, embedding_norm
from memcalc.memory.families.saved_gemma import GEMMAS, rope_types, sliding_sdpa_masked
from memcalc.model.architecture import Architecture

FP32_ROTARY = ("olmo2",)
"""OLMo 2's rotary embedding returns fp32 cos, sin in every regime."""
PARALLEL_RESIDUAL = ("gpt_neox",)
"""GPT-NeoX's parallel residual (``mlp_output + attn_output + residual``, where ``parallel_block``): the attention's
output and the first sum are alive at the second add."""
FUSED_GATE_UP = ("phi3",)
"""Phi-3's fused gate_up projection: its output (2f) stays beside the activation and the product in a checkpointed
layer's MLP frame, and its attention frame is not modelled apart."""


def _gpt2_rows(arch: Architecture, x, *, code: str, device: str, r: int, sp: int, **_) -> list[tuple[str, int]]:
    if arch.dropout > 0 and code == "hf":  # GPT2Model's drop(wte + wpe): its mask to the end
        return [("embedding dropout mask", (1 if device == "cuda" else r) * x.t * x.h // sp)]
    return []


def _opt_rows(arch: Architecture, x, *, code: str, **_) -> list[tuple[str, int]]:
    if code == "hf":  # OPTLearnedPositionalEmbedding's b x s indices, saved for its backward
        return [("learned position indices (int64)", 8 * x.t)]
    return []


def _bloom_rows(arch: Architecture, x, *, r: int, amp: bool, device: str, **_) -> list[tuple[str, int]]:
    # word_embeddings_layernorm keeps its input and statistics until the backward's last op
    return [(k.name, k.bytes) for k in embedding_norm(x, r, amp, device == "cuda")]


ROWS = {"gpt2": _gpt2_rows, "opt": _opt_rows, "bloom": _bloom_rows}
"""family -> its own prologue tensors, alive to the end of the step (after the rotary tables)."""


def mask_kinds(arch: Architecture) -> int:
    """Eager 4-D masks the model builds: Gemma 2 and 3 one causal and one sliding-window mask when both kinds of layer
    are present (``create_causal_mask``, ``create_sliding_window_causal_mask``), the others one."""
    return 2 if arch.sliding_layers and len(arch.sliding_layers) < arch.layers else 1


def _eager_mask(arch: Architecture, x, *, attention: str, code: str, lora, r: int, **_) -> list[tuple[str, int]]:
    # Eager attention: the model's 4-D causal mask (b × s × s in the embedding output's dtype; transformers
    # ``masking_utils.create_causal_mask``) lives until the model's forward returns; the attention's add saves
    # nothing, but each checkpointed layer keeps it as an argument until its backward (tests/test_timeline_tp.py)
    if attention == "eager" and code == "hf" and lora is None:
        return [("eager attention mask", r * x.b * x.s * x.s * mask_kinds(arch))]
    return []


def _no_mask(arch: Architecture, x, **_) -> list[tuple[str, int]]:
    return []


def _falcon_mask(arch: Architecture, x, *, attention: str, code: str, lora, r: int, **_) -> list[tuple[str, int]]:
    if code == "hf" and lora is None:
        # FalconModel builds its causal mask even for SDPA (``allow_is_causal_skip=False``): a boolean s x s broadcast
        # over the batch (SDPA), or b x s x s in the embedding's dtype (eager), alive through the forward and kept by
        # checkpointed layers as an argument
        s = x.s
        return [("causal mask (bool)", s * s)] if attention == "sdpa" else [("eager attention mask", r * x.b * s * s)]
    return []


def _bloom_mask(arch: Architecture, x, *, lora, r: int, **kw) -> list[tuple[str, int]]:
    mask = _eager_mask(arch, x, lora=lora, r=r, **kw)
    if lora is None:  # build_alibi_tensor: (b·heads, 1, s) in the embedding's dtype
        mask.append(("ALiBi biases", r * x.b * x.heads * x.s))
    return mask


def _gemma3_mask(arch: Architecture, x, *, attention: str, **kw) -> list[tuple[str, int]]:
    s = x.s
    if attention == "sdpa" and arch.sliding_layers and s >= (arch.sliding_window or s + 1):
        return [("sliding-window attention mask (bool)", x.b * s * s)]  # masking_utils: built once s >= the window
    return _eager_mask(arch, x, attention=attention, **kw)


MASKS = {**{f: _eager_mask for f in (*LLAMA_STYLE, *OTHER_NORMS)}, "gemma3_text": _gemma3_mask, "bloom": _bloom_mask,
         "falcon": _falcon_mask}
"""family -> the attention masks (and biases) its model builds, alive until its forward returns (else none)."""


def _bloom_slopes(arch: Architecture, x, *, lora, **_) -> list[tuple[str, int]]:
    return [("ALiBi slopes (fp32, until the forward returns)", 4 * x.heads)] if lora is None else []


SLOPES = {"bloom": _bloom_slopes}
"""family -> what its forward holds until it returns and no layer keeps (BLOOM's ALiBi slopes)."""


def prologue(arch: Architecture, x, *, family: str, attention: str, code: str, device: str, lora, position_ids: bool,
             r: int, amp: bool, sp: int) -> tuple[list, list, list]:  # fmt: skip
    """(tables, masks, slopes): what the model's forward makes before its first decoder layer beside the embedding
    output. tables: alive to the end of the step (rotary cos, sin, the family's own ``ROWS``); masks: until the
    forward returns, and as an argument of each checkpointed layer until its backward; slopes: until the forward
    returns (``x``: the step's ``memcalc.memory.families.saved.shape``, ``r``: the residual stream's bytes)."""
    kw = dict(attention=attention, code=code, device=device, lora=lora, r=r, amp=amp, sp=sp)
    tables = []
    if arch.position == "rotary" and code == "hf":  # torchtitan gathers its table inside each layer
        rows = x.b if position_ids else 1
        # Gemma 3: one table per layer type in use; OLMo 2's rotary returns fp32 cos, sin in every regime
        width = rope_types(arch) * (4 if family in FP32_ROTARY else r)
        tables.append(("rotary cos, sin", 2 * rows * x.s * x.rot * width))
    if family in ROWS:
        tables += ROWS[family](arch, x, **kw)
    mask = MASKS.get(family, _no_mask)(arch, x, **kw)
    slopes = SLOPES[family](arch, x, **kw) if family in SLOPES else []
    return tables, mask, slopes


UNCACHED_WEIGHTS = ("falcon",)
"""FalconLinear multiplies by ``self.weight.T``, a view: autocast casts it on every call and caches nothing."""
BIAS_CASTS = ("bloom", "gpt_neox", "opt")
"""Linears with biases that autocast casts and caches (all of BLOOM's and OPT's; NeoX's attention ones as
``attention_bias`` says)."""
ROTARY_CACHE = (*LLAMA_STYLE, *GEMMAS)
"""Rotary families whose DynamicCache keeps an fp32 K under autocast (the rotary product promotes it)."""
EAGER_CACHE = (*LLAMA_STYLE, *OTHER_NORMS)
"""Families whose DynamicCache keeps K, V that eager attention saves as repeat_kv copies (Hugging Face layers)."""
SLIDING_CACHE = OTHER_NORMS
"""Families whose DynamicSlidingWindowLayer keeps an int64 window tensor per sliding layer."""


def layer_cache(arch: Architecture, x, *, family: str, amp: bool, d: int, code: str, lora, use_cache: bool, policy,
                attention: str, promotes: bool):  # fmt: skip
    """The function of (``i``, ``ly``) that says what layer ``i``'s forward adds to the bytes cached until the forward
    returns (``x``: the step's shape, ``ly``: the layer's ``LayerSizes``, ``d``: the compute dtype's bytes):
    autocast's bf16 casts of recomputed layers' weights and of the biases, DynamicCache's K, V where nothing saves
    them, a sliding layer's window tensor; ``promotes``: the cache promotes V to fp32 (``timeline``'s
    ``cache_promotes_values``). What does not depend on the layer is worked out once, here."""
    t, h, s = x.t, x.h, x.s
    weights = family not in UNCACHED_WEIGHTS
    biases = 0
    if amp and arch.qkv_bias and family in (*LLAMA_STYLE, *OTHER_NORMS) and code == "hf" and lora is None:
        # bf16 casts of the q, k, v biases (Qwen2): cached by autocast (trainable leaves), saved by no op (addmm's
        # bias gradient is a sum of the output gradient), alive until the autocast block exits
        biases += 2 * (x.qw + 2 * x.kvw)
    if amp and family in BIAS_CASTS and lora is None:
        # the linears' biases: autocast caches the bf16 cast of each, alive until the autocast block exits
        attn_bias = x.qw + 2 * x.kvw + h if arch.qkv_bias else 0
        biases += 2 * (attn_bias + (h + x.ffn if arch.mlp_bias else 0))
    caching = use_cache and policy.kind == "none"
    rotary = amp and caching and family in ROTARY_CACHE
    # DynamicCache keeps this layer's K, V (kv width) until the forward returns; eager attention saves their
    # repeat_kv copies instead (traced with peft: memcalc.validation.lora.trace_lora_step; without:
    # tests/test_timeline_tp.py)
    eager = (attention == "eager" and x.kv < x.heads and caching
             and (lora is not None or (family in EAGER_CACHE and code == "hf")))  # fmt: skip
    eager_kv = 2 * d * t * x.kvw
    window = caching and family in SLIDING_CACHE
    nope, sliding = arch.nope_layers, arch.sliding_layers

    def cached(i: int, ly) -> int:
        out = ly.casts - ly.kept_casts if weights else 0
        out += biases
        if rotary and i not in nope:
            # (a layer without rotary, SmolLM3's, caches the bf16 K, V that SDPA saves anyway: nothing beyond them)
            # V beyond what SDPA saves only where repeat_kv's copies are saved instead (GQA under eager, Gemma 3's
            # masked sliding SDPA), or where the cache promoted it to fp32
            copied = (attention == "eager" and x.kv < x.heads) or sliding_sdpa_masked(arch, attention, s, i)
            value = 4 if promotes else 2 if copied else 0
            out += (4 + value) * t * x.kvw
        elif eager:
            out += eager_kv
        if window and i in sliding:
            # DynamicSlidingWindowLayer (transformers cache_utils.py): an int64 ``_sliding_window_tensor`` per sliding
            # layer, alive with the cache until the causal LM's forward returns
            out += 8
        return out

    return cached
