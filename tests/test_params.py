"""Exact parameter counts from shapes, against Hugging Face's published counts and by hand."""

import pytest

from memcalc.model.architecture import Architecture
from memcalc.errors import InputError
from memcalc.model.params import (
    Shard,
    active_params,
    attention_params,
    largest_layer,
    largest_module,
    model_params,
    stage_params,
)
from memcalc.inputs.presets import load_model, model_names

# sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters()) for each model's config.json.
HF_COUNTS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "opt-1.3b": 1_315_758_080,
    "bloom-176b": 176_247_271_424,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2-7b": 7_615_616_512,
    "falcon-7b": 6_921_720_704,
}


@pytest.mark.parametrize("name, count", sorted(HF_COUNTS.items()))
def test_counts_equal_hugging_face(name, count):
    assert model_params(load_model(name)).total == count


def test_every_preset_loads_and_cites_a_source():
    names = model_names()
    required = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "opt-1.3b", "opt-175b", "bloom-176b",
                "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3-405b", "mistral-7b",
                "mixtral-8x7b", "qwen2-7b", "falcon-7b", "megatron-22b", "megatron-175b", "megatron-530b",
                "megatron-1t", "fsdp-gpt-175b", "fsdp-gpt-1t"}  # fmt: skip
    assert required <= set(names)
    for name in names:
        a = load_model(name)
        assert a.source and model_params(a).total > 0


def test_gpt2_breakdown_by_hand():
    # h = 768, L = 12, v = 50257, 1024 positions, tied head.
    p = model_params(load_model("gpt2"))
    h = 768
    assert p.embeddings == 50257 * h == 38_597_376
    assert p.positions == 1024 * h == 786_432
    layer = p.layers[0]
    assert layer.attention == h * 3 * h + 3 * h + h * h + h  # c_attn + c_proj with biases
    assert layer.mlp == h * 4 * h + 4 * h + 4 * h * h + h  # c_fc + c_proj with biases
    assert layer.norms == 2 * 2 * h  # ln_1, ln_2: weight + bias
    assert layer.total == 12 * h * h + 13 * h == 7_087_872
    assert p.final_norm == 2 * h and p.head == 0
    assert largest_module(load_model("gpt2")) == ("embedding", 38_597_376)
    assert largest_layer(load_model("gpt2")) == 7_087_872


def test_llama_2_7b_breakdown_by_hand():
    # h = 4096, L = 32, ffn 11008, v = 32000, no bias, RMSNorm, untied.
    p = model_params(load_model("llama-2-7b"))
    h, f, v = 4096, 11008, 32000
    assert p.embeddings == p.head == v * h == 131_072_000
    layer = p.layers[0]
    assert layer.attention == 4 * h * h == 67_108_864
    assert layer.mlp == 3 * h * f == 135_266_304
    assert layer.norms == 2 * h
    assert layer.total == 202_383_360
    assert p.final_norm == h
    assert largest_module(load_model("llama-2-7b")) == ("embedding", 131_072_000)


def test_mixtral_breakdown_by_hand():
    a = load_model("mixtral-8x7b")
    p = model_params(a)
    h, f, kv = 4096, 14336, 8 * 128
    layer = p.layers[0]
    assert layer.attention == 2 * h * h + 2 * h * kv == 41_943_040
    assert layer.mlp == 8 * 3 * h * f == 1_409_286_144
    assert layer.router == 8 * h
    assert largest_module(a) == ("embedding", 131_072_000)
    # A token passes through 2 of 8 experts: 12.9B active parameters.
    assert active_params(a) == 46_702_792_704 - 32 * 6 * 3 * h * f == 12_879_925_248


def test_falcon_multi_query_and_shared_norm():
    layer = model_params(load_model("falcon-7b")).layers[0]
    h = 4544
    assert layer.attention == h * (h + 2 * 64) + h * h  # fused QKV with one K/V head, no bias
    assert layer.norms == 2 * h  # one LayerNorm (weight + bias) shared by attention and MLP


def test_tensor_parallel_split_follows_megatron():
    a = load_model("gpt2")
    h, t = 768, 4
    # Column-parallel QKV splits weights and bias; the row-parallel projection keeps its bias whole.
    assert attention_params(a, t) == h * 3 * h // t + 3 * h // t + h * h // t + h
    one = model_params(a, Shard(tp=t))
    assert one.embeddings == 50260 // t * h  # vocab split (50257 rounded up per rank)
    assert one.layers[0].norms == model_params(a).layers[0].norms  # replicated
    llama = load_model("llama-2-7b")
    # No biases, so every matrix splits exactly: the ranks together hold the whole model plus t-1 extra norms.
    per_rank = model_params(llama, Shard(tp=8)).total
    whole = model_params(llama).total
    norms = 32 * 2 * 4096 + 4096
    assert 8 * (per_rank - norms) == whole - norms


def test_gqa_kv_heads_replicate_when_tp_exceeds_them():
    a = load_model("llama-2-70b")  # 8 KV heads
    assert attention_params(a, 8) == 8192 * (8192 // 8 + 2 * 128) + 8192 // 8 * 8192
    with pytest.raises(InputError, match="tp 3 and kv_heads 8"):
        attention_params(a, 3)


def test_pipeline_stages_hold_their_layers_and_the_ends():
    a = load_model("llama-2-7b")
    whole = model_params(a)
    stages = [stage_params(a, k, 4) for k in range(4)]
    assert sum(s.total for s in stages) == whole.total
    assert stages[0].embeddings == whole.embeddings and stages[3].head == whole.head
    assert all(len(s.layers) == 8 for s in stages)
    # Tied embeddings: the last stage keeps its own copy of the matrix as the head.
    g = load_model("gpt2")
    tied = [stage_params(g, k, 2) for k in range(2)]
    assert tied[1].head == tied[0].embeddings == 50257 * 768
    with pytest.raises(InputError, match=r"layers\(32\) is not divisible by pp\(3\)"):
        stage_params(a, 0, 3)


def test_moe_every_other_layer_and_expert_parallel():
    a = Architecture(layers=4, hidden=64, heads=4, vocab=100, gated_mlp=True, position="rotary", experts=4, top_k=1,
                     moe_every=2, mlp_bias=False)  # fmt: skip
    p = model_params(a)
    assert [x.router > 0 for x in p.layers] == [False, True, False, True]
    split = model_params(a, Shard(ep=2))
    assert split.layers[1].routed == p.layers[1].routed // 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hidden": 100, "heads": 3}, "heads 3 does not divide hidden 100"),
        ({"hidden": 64, "heads": 4, "kv_heads": 3}, "kv_heads 3 does not divide heads 4"),
        ({"hidden": 64, "heads": 4, "experts": 2, "top_k": 3}, "top_k 3 is more than the 2 experts"),
    ],
)
def test_bad_shapes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Architecture(layers=2, vocab=10, position="rotary", **kwargs)
