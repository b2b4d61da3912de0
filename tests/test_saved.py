"""Saved-tensor profiles of Hugging Face families against a census of the real modules on this CPU.

memcalc.memory.families.saved gives, per family and regime, the tensors one decoder layer saves for backward;
memcalc.validation.saved builds the tiny model with transformers and counts what autograd really saves
(saved_tensors_hooks, one count per storage). They must agree to the byte, at two (s, b) so that the
scaling in s, b and s² is checked too.
"""

import functools
import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memcalc.errors import InputError  # noqa: E402
from memcalc.memory.families.saved import layer_saved, loss_transient, outside_saved, total  # noqa: E402
from memcalc.model.hf_config import architecture_from_config  # noqa: E402
from memcalc.validation.saved import FAMILIES, build, census, tiny_config  # noqa: E402

SHAPES = [(8, 2), (12, 3)]
REGIMES = ["fp32", "bf16", "amp-bf16"]
# BLOOM has no SDPA path in transformers; under recompute the layer keeps its input whatever the attention,
# so recompute is checked with eager attention only (keeps the file fast).
CASES = [(f, r, a, rc) for f, r, a, rc in itertools.product(FAMILIES, REGIMES, ["eager", "sdpa"], [False, True])
         if not (f in ("bloom", "gemma2") and a == "sdpa") and not (rc and a == "sdpa")]


def arch_and_rot(family):
    cfg = tiny_config(family)
    arch = architecture_from_config(cfg)
    rot = int(arch.d_head * cfg["rotary_pct"]) if family == "gpt_neox" else None
    return arch, rot


@functools.cache
def model(family, regime, attention, recompute):
    return build(family, regime, attention, recompute)


@pytest.mark.parametrize("family, regime, attention, recompute", CASES)
def test_layer_and_outside_match_census(family, regime, attention, recompute):
    arch, rot = arch_and_rot(family)
    m = model(family, regime, attention, recompute)
    seen = set()
    for s, b in SHAPES:
        c = census(family, regime, attention, s, b, recompute, model=m)
        kw = dict(family=family, regime=regime, s=s, b=b, recompute=recompute, rotary_dims=rot)
        layer = layer_saved(arch, attention=attention, **kw)
        assert total(layer) == c.layer_bytes()
        assert total(layer, "weight_cast") == c.layer_bytes("weight_cast")
        out = c.outside_bytes()
        if recompute:  # the checkpoints' shared arguments (masks, position ids, rotary tables) are not modelled
            out.pop("shared", None)
        assert total(outside_saved(arch, **kw)) == sum(out.values())
        assert total(outside_saved(arch, **kw), "weight_cast") == sum(c.outside_bytes("weight_cast").values())
        seen.add(c.layer_bytes())
    assert len(seen) == 2  # the two shapes give different figures: the test checks the scaling


@pytest.mark.parametrize("regime", REGIMES)
def test_smollm3_layer_without_rotary_saves_what_a_rotary_layer_saves(regime, monkeypatch):
    """SmolLM3 skips the rotary embedding in every fourth layer (no_rope_layers): such a layer saves the same bytes;
    only the shared cos/sin tables are then saved by the rotating layer alone (so the census files them under it)."""
    from memcalc.validation import saved as census_module

    monkeypatch.setitem(census_module.TINY, "smollm3", {**census_module.TINY["smollm3"], "no_rope_layers": [1, 0]})
    arch, _ = arch_and_rot("smollm3")
    s, b = 12, 3
    c = census("smollm3", regime, "sdpa", s, b)
    layer = total(layer_saved(arch, family="smollm3", regime=regime, attention="sdpa", s=s, b=b))
    rotary = next(x.bytes for x in outside_saved(arch, family="smollm3", regime=regime, s=s, b=b)
                  if x.name.startswith("rotary"))
    assert (c.part_bytes("layer.0"), c.part_bytes("layer.1")) == (layer + rotary, layer)


@pytest.mark.parametrize("regime", REGIMES)
def test_gemma3_sliding_layers_under_sdpa_save_the_mask_and_full_width_kv(regime, monkeypatch):
    """Gemma 3, SDPA, s >= sliding_window: a sliding layer (0) passes a materialised mask, so K, V are repeat_kv
    copies at full width and SDPA keeps the mask in the compute dtype; a full layer (1) saves what it did. At
    (8, 2) the window 12 is not reached (both layers alike), at (12, 3) it is."""
    from memcalc.validation import saved as census_module

    cfg = {**census_module.TINY["gemma3_text"], "sliding_window": 12}
    monkeypatch.setitem(census_module.TINY, "gemma3_text", cfg)
    arch = architecture_from_config(tiny_config("gemma3_text"))
    assert arch.sliding_layers == (0, 2) and arch.sliding_window == 12
    m = build("gemma3_text", regime, "sdpa", False)
    d = 4 if regime == "fp32" else 2
    for (s, b), differs in (((8, 2), False), ((12, 3), True)):
        c = census("gemma3_text", regime, "sdpa", s, b, model=m)
        kw = dict(family="gemma3_text", regime=regime, attention="sdpa", s=s, b=b)
        sliding, full = (total(layer_saved(arch, index=i, **kw)) for i in (0, 1))
        assert (c.part_bytes("layer.0"), c.part_bytes("layer.1")) == (sliding, full)
        assert sliding - full == (d * b * s * s + 2 * d * s * b * (64 - 32) if differs else 0)
        assert total(layer_saved(arch, **kw)) == full  # no index: a full-attention layer
        outside = dict(family="gemma3_text", regime=regime, s=s, b=b)  # two rotary tables (sliding and full layers)
        assert total(outside_saved(arch, **outside)) == sum(c.outside_bytes().values())


def test_gemma_families_against_their_llama_counterparts():
    """Gemma's norm adds the fp32 (1 + weight) vector and keeps its normalized tensor in fp32 under bf16 too; Gemma 2
    adds two such norms and the score softcap's tanh output (eager), by hand from the census's per-tensor list."""
    s, b = 8, 2
    t, h, f, scores = s * b, 64, 96, 4 * s * s * b
    llama = architecture_from_config({**tiny_config("llama"), "head_dim": 16})
    kw = dict(regime="bf16", attention="eager", s=s, b=b)
    base = total(layer_saved(llama, family="llama", **kw))
    gemma = architecture_from_config(tiny_config("gemma"))
    assert total(layer_saved(gemma, family="gemma", **kw)) - base == 2 * (4 * h + 2 * t * h)
    gemma2 = architecture_from_config(tiny_config("gemma2"))
    two_norms = 2 * (4 * t * h + 4 * t + 4 * h + 4 * t * h)
    assert total(layer_saved(gemma2, family="gemma2", **kw)) - base == 2 * (4 * h + 2 * t * h) + two_norms + 2 * scores
    with pytest.raises(InputError, match="attention 'sdpa' is not available for gemma2; use eager"):
        layer_saved(gemma2, family="gemma2", regime="bf16", attention="sdpa", s=s, b=b)


def test_llama_amp_per_token_constants():
    # Hand count from the census (llama, amp-bf16, sdpa, GQA 4/2 heads, head_dim 16): per token
    # 2 RMSNorms x (4h + 4 + 4h) + casts (3 + 2) x 2h + Q 2h + K, V 2 x 2·kv_w + out 2h + lse 4·heads + 8·ffn.
    arch, _ = arch_and_rot("llama")
    s, b, h, f = 8, 2, 64, 96
    per_token = 2 * (8 * h + 4) + 10 * h + 2 * h + 4 * 32 + 2 * h + 4 * 4 + 8 * f
    assert total(layer_saved(arch, family="llama", regime="amp-bf16", attention="sdpa", s=s, b=b)) == per_token * s * b


def test_loss_transient_standard_and_chunked():
    t, v = 4096, 128256
    std = loss_transient(t, v, "amp-bf16")
    assert std.forward == 10 * t * v and std.backward == 14 * t * v
    assert loss_transient(t, v, "fp32").backward == 16 * t * v
    ch = loss_transient(t, v, "amp-bf16", "chunked:8")
    assert ch.backward == 6 * t * v + 8 * t * v // 8
    assert loss_transient(t, v, "bf16", "fused").backward == 0


def test_gpt2_cuda_gelu_new_under_autocast():
    arch, _ = arch_and_rot("gpt2")
    kw = dict(family="gpt2", regime="amp-bf16", attention="sdpa", s=8, b=2)
    cpu, cuda = total(layer_saved(arch, **kw)), total(layer_saved(arch, device="cuda", **kw))
    assert cuda - cpu == (14 - 8) * 16 * 256


def test_bad_inputs():
    arch, _ = arch_and_rot("bloom")
    with pytest.raises(InputError, match="sdpa"):
        layer_saved(arch, family="bloom", regime="fp32", attention="sdpa", s=8, b=1)
    with pytest.raises(InputError, match="fp8"):
        layer_saved(arch, family="bloom", regime="fp8", attention="eager", s=8, b=1)
    with pytest.raises(InputError, match="chunked"):
        loss_transient(8, 8, "fp32", "chunked:0")


@pytest.mark.parametrize("family", ["llama", "phi3", "gpt2", "gpt_neox", "opt", "falcon"])
@pytest.mark.parametrize("regime", REGIMES)
def test_layer_without_cache_matches_census(family, regime):
    """``use_cache=False`` (checkpointing, or a fine-tuning framework that turns the cache off): SDPA saves K and V as
    the layer makes them, which differs from the cache's copies where they are views of a fused projection."""
    arch, rot = arch_and_rot(family)
    m = build(family, regime, "sdpa", False, use_cache=False)
    on, off = (total(layer_saved(arch, family=family, regime=regime, attention="sdpa", s=8, b=2, rotary_dims=rot,
                                 use_cache=c)) for c in (True, False))
    for s, b in SHAPES:
        c = census(family, regime, "sdpa", s, b, False, model=m)
        assert total(layer_saved(arch, family=family, regime=regime, attention="sdpa", s=s, b=b, rotary_dims=rot,
                                 use_cache=False)) == c.layer_bytes()
    x = arch.hidden * 16 * (4 if regime == "fp32" else 2)  # d·T·h at s 8 x b 2
    kv = arch.n_kv * arch.d_head * 16 * (4 if regime == "fp32" else 2)
    # the fused storage whole beside the rotated K (Phi-3: GQA widths), no cache copies (GPT-2), the same (the rest)
    assert off - on == {"phi3": x + kv, "gpt_neox": 2 * x, "gpt2": -2 * kv}.get(family, 0)


FALCONS = {  # Falcon's other layouts than Falcon-7B's (the tiny config: multi-query, parallel, one norm)
    "new decoder (Falcon-40B, 180B)": dict(new_decoder_architecture=True, num_kv_heads=2),
    "new decoder, one norm (Falcon-11B)": dict(new_decoder_architecture=True, num_kv_heads=2,
                                                num_ln_in_parallel_attn=1),
    "multi-head, parallel": dict(multi_query=False),
    "sequential (parallel_attn false)": dict(parallel_attn=False),
}


@pytest.mark.parametrize("variant", FALCONS)
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_falcon_layouts_match_census(variant, regime, attention):
    """Falcon's decoder layouts: two norms on one input (ln_attn, ln_mlp) or a sequential block's second norm, K and V
    broadcast to the query heads (new decoder) or reshaped (multi-head), SDPA with the mask Falcon always builds;
    with and without the cache."""
    cfg = tiny_config("falcon") | FALCONS[variant]
    arch = architecture_from_config(cfg)
    for use_cache in (True, False):
        m = build("falcon", regime, attention, False, use_cache=use_cache, overrides=FALCONS[variant])
        for s, b in SHAPES:
            c = census("falcon", regime, attention, s, b, False, model=m)
            mine = layer_saved(arch, family="falcon", regime=regime, attention=attention, s=s, b=b, use_cache=use_cache)
            assert total(mine) == c.layer_bytes(), (use_cache, s, b)
