"""config.json -> Architecture, and counts against transformers itself on the meta device."""

import json

import pytest

import memcalc
from memcalc.model.architecture import Architecture
from memcalc.errors import InputError
from memcalc.model.hf_config import READERS, architecture_from_config, load_hf_config
from memcalc.model.params import model_params
from memcalc.inputs.presets import load_model, model_names


def to_hf(a: Architecture) -> dict:
    """The config.json a model of this shape would have (the keys its model_type reads)."""
    v = a.padded_vocab
    if a.family in ("llama", "mistral", "qwen2", "mixtral"):
        d = {"hidden_size": a.hidden, "intermediate_size": a.ffn_size, "num_hidden_layers": a.layers,
             "num_attention_heads": a.heads, "num_key_value_heads": a.n_kv, "vocab_size": v,
             "tie_word_embeddings": a.tied_embeddings, "max_position_embeddings": 4096}  # fmt: skip
        if a.family == "mixtral":
            d |= {"num_local_experts": a.experts, "num_experts_per_tok": a.top_k}
        return {"model_type": a.family, **d}
    if a.family == "gpt2":
        return {"model_type": "gpt2", "n_embd": a.hidden, "n_layer": a.layers, "n_head": a.heads, "vocab_size": v,
                "n_positions": a.max_positions, "n_inner": a.ffn_size}  # fmt: skip
    if a.family == "opt":
        return {"model_type": "opt", "hidden_size": a.hidden, "num_hidden_layers": a.layers, "ffn_dim": a.ffn_size,
                "num_attention_heads": a.heads, "vocab_size": v, "max_position_embeddings": a.max_positions,
                "word_embed_proj_dim": a.embedding_dim or a.hidden}  # fmt: skip
    if a.family == "bloom":
        return {"model_type": "bloom", "hidden_size": a.hidden, "n_layer": a.layers, "n_head": a.heads, "vocab_size": v}
    if a.family == "falcon":
        return {"model_type": "falcon", "hidden_size": a.hidden, "num_hidden_layers": a.layers,
                "num_attention_heads": a.heads, "multi_query": a.n_kv == 1, "parallel_attn": a.parallel_block,
                "bias": a.qkv_bias, "alibi": False, "new_decoder_architecture": False, "vocab_size": v}  # fmt: skip
    raise AssertionError(a.family)


HF_PRESETS = [n for n in model_names() if load_model(n).family]


@pytest.mark.parametrize("name", HF_PRESETS)
def test_config_round_trip_keeps_the_count(name):
    a = load_model(name)
    back = architecture_from_config(to_hf(a))
    assert model_params(back).total == model_params(a).total


# Real config.json files as published (the keys that matter), with counts as transformers reports them.
REAL_CONFIGS = {
    "pythia-1b": ({"model_type": "gpt_neox", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 8,
                   "num_hidden_layers": 16, "vocab_size": 50304, "use_parallel_residual": True,
                   "tie_word_embeddings": False, "rotary_pct": 0.25}, 1_011_781_632),
    "opt-350m": ({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "ffn_dim": 4096,
                  "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
                  "word_embed_proj_dim": 512, "do_layer_norm_before": False}, 331_196_416),
    "falcon-40b": ({"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
                    "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True, "bias": False,
                    "alibi": False, "vocab_size": 65024}, 41_303_293_952),
    "tinyllama-1.1b": ({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                        "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}, 1_100_048_384),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_real_configs(name, tmp_path):
    cfg, count = REAL_CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert model_params(load_hf_config(path)).total == count
    r = memcalc.estimate(hf_config=str(path), stage=3, gpus=8)
    assert r.model.parameters == count


def test_unknown_model_type_lists_the_supported(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(InputError, match="model_type 't5' is not supported; supported: bloom, falcon, gpt2"):
        load_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON file"):
        load_hf_config(path)
    with pytest.raises(InputError, match="config.json for llama lacks the key 'num_hidden_layers'"):
        architecture_from_config({"model_type": "llama"})


def test_dropout_comes_from_the_config():
    assert load_model("gpt2").dropout == 0.1
    cfg = to_hf(load_model("gpt2")) | {"attn_pdrop": 0.0, "resid_pdrop": 0.2}
    assert architecture_from_config(cfg).dropout == 0.2
    assert load_model("llama-2-7b").dropout == 0.0


def test_every_supported_model_type_has_a_reader():
    assert set(READERS) >= {"llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "bloom", "opt", "falcon"}


@pytest.mark.parametrize("name", HF_PRESETS + sorted(REAL_CONFIGS))
def test_counts_equal_transformers_on_the_meta_device(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = REAL_CONFIGS[name][0] if name in REAL_CONFIGS else to_hf(load_model(name))
    ours = model_params(architecture_from_config(cfg)).total
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert sum(p.numel() for p in model.parameters()) == ours
