"""config.json -> Architecture, and counts against transformers itself on the meta device."""

import json
import math

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.inputs.presets import load_model, model_names
from memcalc.model.architecture import Architecture
from memcalc.model.hf_config import READERS, architecture_from_config, load_hf_config
from memcalc.model.params import model_params


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
    if a.family == "qwen3":
        return {"model_type": "qwen3", "hidden_size": a.hidden, "intermediate_size": a.ffn_size,
                "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.n_kv,
                "head_dim": a.d_head, "vocab_size": v, "tie_word_embeddings": a.tied_embeddings}  # fmt: skip
    if a.family == "qwen3_moe":
        return {"model_type": "qwen3_moe", "hidden_size": a.hidden, "intermediate_size": a.ffn_size,
                "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.n_kv,
                "head_dim": a.d_head, "vocab_size": v, "tie_word_embeddings": a.tied_embeddings,
                "moe_intermediate_size": a.expert_ffn_size, "num_experts": a.experts, "num_experts_per_tok": a.top_k,
                "decoder_sparse_step": a.moe_every, "norm_topk_prob": a.router_norm}  # fmt: skip
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
    # counted by transformers 5.23 on the meta device (sum of p.numel() over AutoModelForCausalLM.from_config)
    "qwen3-0.6b": ({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                    "tie_word_embeddings": True}, 596_049_920),
    "qwen3-8b": ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                  "tie_word_embeddings": False}, 8_190_735_360),
    "qwen3-30b-a3b": ({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                       "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
                       "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                       "mlp_only_layers": [], "tie_word_embeddings": False}, 30_532_122_624),
    "phi-3-mini-4k": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064}, 3_821_079_552),
    "smollm3-3b": ({"model_type": "smollm3", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 128256}, 3_075_098_624),
    "granite-3.1-2b": ({"model_type": "granite", "hidden_size": 2048, "intermediate_size": 8192,
                        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 49155, "tie_word_embeddings": True}, 2_533_531_648),
    "gemma-2b": ({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
                  "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000},
                 2_506_172_416),
    "gemma-2-2b": ({"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                    "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
                   2_614_341_888),
    "gemma-3-1b": ({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                    "vocab_size": 262144, "sliding_window": 512, "sliding_window_pattern": 6,
                    "final_logit_softcapping": None, "attn_logit_softcapping": None}, 999_885_952),
    "olmo-2-1b": ({"model_type": "olmo2", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                   "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 100352,
                   "tie_word_embeddings": False}, 1_484_916_736),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_real_configs(name, tmp_path):
    cfg, count = REAL_CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert model_params(load_hf_config(path)).total == count
    r = memcalc.estimate(hf_config=str(path), stage=3, gpus=8)
    assert r.model.parameters == count


def test_smollm3_nope_layers_and_qwen3_head_dim_default():
    base = REAL_CONFIGS["smollm3-3b"][0]
    assert architecture_from_config(base).nope_layers == tuple(range(3, 36, 4))  # no_rope_layer_interval 4
    flags = [1] * 35 + [0]
    assert architecture_from_config(base | {"no_rope_layers": flags}).nope_layers == (35,)
    with pytest.raises(InputError, match="no_rope_layers .* one per layer; accepted: a JSON array of 36 integers"):
        architecture_from_config(base | {"no_rope_layers": [1, 0]})
    qwen3 = {k: v for k, v in REAL_CONFIGS["qwen3-0.6b"][0].items() if k != "head_dim"}
    assert architecture_from_config(qwen3).d_head == 128  # Qwen3Config's default, not hidden // heads = 64
    assert architecture_from_config(qwen3 | {"head_dim": None}).d_head == 64


def test_gemma_layer_types_and_softcaps():
    g3 = REAL_CONFIGS["gemma-3-1b"][0]
    a = architecture_from_config(g3)
    assert a.sliding_layers == tuple(i for i in range(26) if (i + 1) % 6) and a.sliding_window == 512
    assert (a.norms_per_layer, a.norm_placement, a.qk_norm, a.qk_norm_width) == (4, "sandwich", True, "head")
    assert not a.attention_softcap and not a.logit_softcap  # Gemma 3 never passes the attention cap
    types = ["full_attention"] * 25 + ["sliding_attention"]
    assert architecture_from_config(g3 | {"layer_types": types}).sliding_layers == (25,)
    assert architecture_from_config(g3 | {"sliding_window": None}).sliding_layers == ()
    assert architecture_from_config(g3 | {"final_logit_softcapping": 30}).logit_softcap
    with pytest.raises(InputError, match="layer_types .* one per layer; accepted: a JSON array of 26 strings"):
        architecture_from_config(g3 | {"layer_types": ["full_attention"]})
    g2 = {k: v for k, v in REAL_CONFIGS["gemma-2-2b"][0].items() if "softcapping" not in k}
    a = architecture_from_config(g2)  # Gemma2Config defaults: both caps on, layers alternate from a sliding one
    assert a.attention_softcap and a.logit_softcap and a.sliding_layers == tuple(range(0, 26, 2))
    with pytest.raises(InputError, match="attn_logit_softcapping -1.0 is out of range; accepted: a positive JSON"):
        architecture_from_config(g2 | {"attn_logit_softcapping": -1.0})
    gemma = {k: v for k, v in REAL_CONFIGS["gemma-2b"][0].items() if k not in ("head_dim", "num_key_value_heads")}
    a = architecture_from_config(gemma | {"num_attention_heads": 16})  # GemmaConfig: head_dim 256, 16 KV heads, tied
    assert (a.d_head, a.n_kv, a.tied_embeddings, a.norms_per_layer) == (256, 16, True, 2)
    olmo = architecture_from_config(REAL_CONFIGS["olmo-2-1b"][0])
    assert (olmo.qk_norm_widths, olmo.norm_placement) == ((2048, 2048), "post")


def test_unknown_model_type_lists_the_supported(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(InputError, match="model_type 't5' is not supported; supported: bloom, falcon, gemma, gemma2, gemma3_text, gpt2"):
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


def test_neox_partial_rotary_and_falcon_layouts_come_from_the_config():
    neox = REAL_CONFIGS["pythia-1b"][0]
    assert architecture_from_config(neox).rotary_dims == 256 // 4  # head 256, rotary_pct 0.25
    no_key = {k: v for k, v in neox.items() if k != "rotary_pct"}
    assert architecture_from_config(no_key).rotary_dims == 64  # GPTNeoXConfig's default, 0.25
    five = no_key | {"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}}
    assert architecture_from_config(five).rotary_dims == 128  # transformers 5's key
    with pytest.raises(InputError, match=r"rotary_pct 1\.5 is out of range; accepted: a JSON number above 0"):
        architecture_from_config(neox | {"rotary_pct": 1.5})
    falcon = REAL_CONFIGS["falcon-40b"][0]
    new = architecture_from_config(falcon)
    assert (new.kv_expanded, new.norms_per_layer, new.parallel_block) == (True, 2, True)
    eleven = architecture_from_config(falcon | {"num_ln_in_parallel_attn": 1})  # Falcon-11B: one norm
    assert (eleven.kv_expanded, eleven.norms_per_layer) == (True, 1)
    seven = architecture_from_config(to_hf(load_model("falcon-7b")))
    assert (seven.kv_expanded, seven.norms_per_layer, seven.kv_heads) == (False, 1, 1)


def test_every_supported_model_type_has_a_reader():
    assert set(READERS) >= {"llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "granite", "smollm3", "gemma",
                            "gemma2", "gemma3_text", "olmo2", "gpt2", "gpt_neox", "bloom", "opt", "falcon"}


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


# ---- strict, bounded reading: every mistake is one InputError line naming the file, the key and the value ----

from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc.model import architecture as arch_bounds
from memcalc.model.hf_config import MAX_FILE_BYTES, parse_config

GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
LLAMA = REAL_CONFIGS["tinyllama-1.1b"][0]


def _written(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _refused(tmp_path, cfg, *parts: str) -> str:
    """load_hf_config refuses ``cfg`` with one line that contains the file and every one of ``parts``."""
    path = _written(tmp_path, cfg)
    with pytest.raises(InputError) as e:
        load_hf_config(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def test_a_string_count_is_refused_not_read_as_quadrillions(tmp_path):
    _refused(tmp_path, GPT2 | {"n_embd": "768"}, "n_embd '768' is a string", "a JSON integer from 1 to 1,048,576")


def test_a_boolean_is_not_a_layer_count(tmp_path):
    _refused(tmp_path, LLAMA | {"num_hidden_layers": True}, "num_hidden_layers True is a boolean", "from 1 to 10,000")


def test_a_string_false_is_not_a_boolean(tmp_path):
    _refused(tmp_path, LLAMA | {"tie_word_embeddings": "false"}, "tie_word_embeddings 'false' is a string",
             "a JSON boolean, true or false")  # fmt: skip
    _refused(tmp_path, GPT2 | {"tie_word_embeddings": 0}, "tie_word_embeddings 0 is an integer")
    assert load_hf_config(_written(tmp_path, LLAMA | {"tie_word_embeddings": True})).tied_embeddings is True


def test_zero_and_negative_counts_are_refused(tmp_path):
    _refused(tmp_path, LLAMA | {"num_key_value_heads": 0}, "num_key_value_heads 0 is out of range", "from 1 to 65,536")
    _refused(tmp_path, GPT2 | {"n_layer": -1}, "n_layer -1 is out of range")
    _refused(tmp_path, GPT2 | {"vocab_size": 0}, "vocab_size 0 is out of range", "from 1 to 16,777,216")


def test_whole_floats_are_refused_for_counts(tmp_path):
    # transformers writes ints; nn.Linear(4096.0, ...) fails, so 4096.0 is a hand edit the model itself refuses.
    _refused(tmp_path, LLAMA | {"hidden_size": 2048.0}, "hidden_size 2048.0 is a float")


@pytest.mark.parametrize(("key", "value", "bound"), [
    ("num_hidden_layers", 10_001, "10,000"), ("hidden_size", 2**20 + 32, "1,048,576"),
    ("intermediate_size", 4 * 2**20 + 1, "4,194,304"), ("vocab_size", 2**24 + 1, "16,777,216"),
    ("num_attention_heads", 2**16 + 1, "65,536"), ("head_dim", 2**16 + 1, "65,536"),
])  # fmt: skip
def test_sizes_above_their_bound_are_refused(tmp_path, key, value, bound):
    _refused(tmp_path, LLAMA | {key: value}, f"{key} {value} is out of range", f"from 1 to {bound}")


def test_huge_and_non_finite_numbers_are_refused(tmp_path):
    _refused(tmp_path, GPT2 | {"n_layer": 10**30}, "is out of range")
    _refused(tmp_path, GPT2 | {"n_layer": 2**200}, "<a 201-bit integer> is out of range")
    path = tmp_path / "config.json"
    for text, part in ((json.dumps(GPT2)[:-1] + ', "attn_pdrop": NaN}', "holds NaN"),
                       (json.dumps(GPT2)[:-1] + ', "n_layer": Infinity}', "holds Infinity"),
                       ('{"model_type": "gpt2", "n_layer": ' + "9" * 5000 + "}", "not a readable JSON file"),
                       (json.dumps(GPT2)[:-1] + ', "n_layer": 3}', "has the key 'n_layer' twice")):  # fmt: skip
        path.write_text(text)
        with pytest.raises(InputError, match=part):
            load_hf_config(path)
    _refused(tmp_path, GPT2 | {"attn_pdrop": 1.0}, "attn_pdrop 1.0 is out of range", "from 0 up to (not including) 1")
    _refused(tmp_path, GPT2 | {"resid_pdrop": "0.1"}, "resid_pdrop '0.1' is a string")


def test_null_means_absent_only_where_transformers_says_so(tmp_path):
    a = load_hf_config(_written(tmp_path, LLAMA | {"num_key_value_heads": None, "head_dim": None}))
    assert (a.n_kv, a.d_head) == (32, 64)
    assert load_hf_config(_written(tmp_path, GPT2 | {"n_inner": None})).ffn_size == 3072
    _refused(tmp_path, LLAMA | {"vocab_size": None}, "vocab_size None is null")
    _refused(tmp_path, LLAMA | {"attention_bias": None}, "attention_bias None is null")


def test_relations_name_the_config_keys(tmp_path):
    _refused(tmp_path, LLAMA | {"num_key_value_heads": 5}, "num_key_value_heads 5 does not divide num_attention_heads 32")
    _refused(tmp_path, GPT2 | {"n_head": 7}, "n_head 7 does not divide n_embd 768")
    mixtral = LLAMA | {"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}
    _refused(tmp_path, mixtral, "num_experts_per_tok 3 is more than num_local_experts 2")


def test_wrong_kinds_of_path_and_file(tmp_path):
    for bad in (123, None, 4.5, [str(tmp_path)]):
        with pytest.raises(InputError, match="not a path; accepted: the path of a config.json file"):
            load_hf_config(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"--hf-config 123 is an integer, not a path"):
        memcalc.estimate(hf_config=123, stage=3, gpus=8)
    with pytest.raises(InputError, match=r"^--hf-config '.*' is a folder; accepted: the path of a config.json file "
                                         r"\(such as '.*config.json'\)$"):  # said once, not wrapped in "cannot be read"
        load_hf_config(tmp_path)
    with pytest.raises(InputError, match=r"^--hf-config '' is empty; accepted: the path of a config.json file$"):
        load_hf_config("")
    with pytest.raises(InputError, match="does not exist"):
        load_hf_config(tmp_path / "missing.json")
    with pytest.raises(InputError, match="cannot be read"):
        load_hf_config("config\0.json")
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "gpt2", "n_embd": 768, "name": "\xff\xfe"}')
    with pytest.raises(InputError, match=r"is not UTF-8 text \(byte 47\)"):
        load_hf_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="does not hold a JSON object"):
        load_hf_config(path)
    path.write_text(json.dumps(GPT2 | {"_name_or_path": 7}))
    with pytest.raises(InputError, match="_name_or_path 7 is an integer; accepted: a JSON string"):
        load_hf_config(path)
    with pytest.raises(InputError, match=r"model_type \['llama'\] is not supported"):
        architecture_from_config({"model_type": ["llama"]})
    with pytest.raises(InputError, match="config.json holds an array, not a JSON object"):
        architecture_from_config([])  # type: ignore[arg-type]


def test_deep_nesting_is_refused_before_parsing(tmp_path):
    path = tmp_path / "config.json"
    for text in ("[" * 100_000 + "]" * 100_000, json.dumps(GPT2)[:-1] + ', "x": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001):
        path.write_text(text)
        with pytest.raises(InputError, match="nests deeper than 32 levels"):
            load_hf_config(path)
    # Brackets inside strings (escaped quotes included) do not count as nesting.
    path.write_text(json.dumps(GPT2 | {"note": '[[[[ "\\" {{{{' * 20, "rope_scaling": {"a": {"b": [[1]]}}}))
    assert load_hf_config(path).hidden == 768


def test_large_files_and_devices_are_refused_quickly(tmp_path):
    import time

    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2) + " " * MAX_FILE_BYTES)
    with pytest.raises(InputError, match="larger than 1,048,576 bytes"):
        load_hf_config(path)
    path.write_text(json.dumps(GPT2) + " " * (MAX_FILE_BYTES - len(json.dumps(GPT2))))
    assert load_hf_config(path).layers == 12  # exactly 1 MiB is accepted
    start = time.perf_counter()
    with pytest.raises(InputError, match="'/dev/zero' is larger than 1,048,576 bytes"):
        load_hf_config("/dev/zero")
    assert time.perf_counter() - start < 1.0


def test_architecture_bounds_hold_for_flags_too():
    base = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "position": "rotary"}
    for field, bound in (("layers", arch_bounds.MAX_LAYERS), ("hidden", arch_bounds.MAX_HIDDEN),
                         ("vocab", arch_bounds.MAX_VOCAB), ("ffn", arch_bounds.MAX_FFN),
                         ("experts", arch_bounds.MAX_EXPERTS), ("max_positions", arch_bounds.MAX_POSITIONS)):  # fmt: skip
        with pytest.raises(InputError, match=f"architecture.{field} {bound + 1} is out of bounds; accepted: .*at most {bound:,}"):
            Architecture(**base | {field: bound + 1})
    with pytest.raises(InputError, match="at most 10,000"):
        memcalc.estimate(layers=10_001, hidden=64, heads=4, vocab=100, stage=3, gpus=8)


def test_the_largest_accepted_shape_answers_quickly(tmp_path):
    import time

    biggest = {"model_type": "mixtral", "num_hidden_layers": arch_bounds.MAX_LAYERS, "hidden_size": arch_bounds.MAX_HIDDEN,
               "num_attention_heads": 2**14, "num_key_value_heads": 2**13, "intermediate_size": arch_bounds.MAX_FFN,
               "vocab_size": arch_bounds.MAX_VOCAB, "num_local_experts": arch_bounds.MAX_EXPERTS,
               "num_experts_per_tok": arch_bounds.MAX_EXPERTS}  # fmt: skip
    start = time.perf_counter()
    a = load_hf_config(_written(tmp_path, biggest))
    total = model_params(a).total
    assert time.perf_counter() - start < 1.0
    # L x (attention 2h(h + h/2) + router h·E + E experts x 3·h·f + 2 norms h) + 2 V h + final norm h, exactly:
    L, h, f, V, E = 10_000, 2**20, 2**22, 2**24, 2**16
    assert total == L * (h * h + 2 * h * (h // 2) + h * h + h * E + E * 3 * h * f + 2 * h) + 2 * V * h + h


# Every key a reader looks at, found by reading each family's config through a dict that records lookups.
class _Recording(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.seen: set[str] = set()

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)


BASES = [to_hf(load_model(n)) for n in ("gpt2", "llama-2-7b", "mistral-7b", "qwen2-7b", "mixtral-8x7b", "opt-1.3b",
                                         "bloom-176b", "falcon-7b")] + [c for c, _ in REAL_CONFIGS.values()]  # fmt: skip
USED_KEYS = sorted({"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "attention_bias",
                    "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings",
                    "attention_dropout", "mlp_bias", "num_local_experts", "num_experts_per_tok", "n_embd", "n_layer",
                    "n_head", "n_inner", "n_positions", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                    "use_parallel_residual",
                    "hidden_dropout", "n_embed", "ffn_dim", "enable_bias", "word_embed_proj_dim",
                    "max_position_embeddings", "do_layer_norm_before", "dropout", "new_decoder_architecture",
                    "num_kv_heads", "multi_query", "bias", "parallel_attn", "ffn_hidden_size", "alibi",
                    "no_rope_layers", "no_rope_layer_interval", "sliding_window", "layer_types",
                    "sliding_window_pattern", "attn_logit_softcapping", "final_logit_softcapping", "rotary_pct",
                    "rope_parameters", "num_ln_in_parallel_attn", "num_experts", "moe_intermediate_size",
                    "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers"})  # fmt: skip


def test_the_fuzzed_keys_are_every_key_the_readers_use():
    seen: set[str] = set()
    dropped = [{k: v for k, v in b.items() if k != d} for b in BASES for d in ("n_layer", "n_head", "hidden_size")]
    for cfg in BASES + dropped:
        rec = _Recording(cfg)
        try:
            architecture_from_config(rec)
        except InputError:
            pass
        seen |= rec.seen
    assert seen == set(USED_KEYS)


_leaf = (st.none() | st.booleans() | st.integers(-5, 300) | st.integers(-(2**80), 2**80)
         | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.1, 64.0, 4096.0, 0.999])
         | st.text(max_size=6) | st.sampled_from(["768", "false", "true", "1e3", "llama", "gpt2"]))  # fmt: skip
_json = st.recursive(_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                     max_leaves=6)  # fmt: skip


@settings(max_examples=2000, derandomize=True, deadline=None)
@given(base=st.sampled_from(BASES), over=st.dictionaries(st.sampled_from(USED_KEYS), _json, max_size=5),
       drop=st.lists(st.sampled_from(USED_KEYS), max_size=3), through_file=st.booleans())  # fmt: skip
def test_random_values_give_an_architecture_or_one_input_error(base, over, drop, through_file):
    cfg = {k: v for k, v in base.items() if k not in drop} | over
    try:
        if through_file:
            where = "--hf-config 'x.json'"
            rec = _Recording(parse_config(json.dumps(cfg).encode(), where))
            a = architecture_from_config(rec, where=where)
        else:
            rec = _Recording(cfg)
            a = architecture_from_config(rec)
    except InputError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
        return
    assert isinstance(a, Architecture)
    for key in rec.seen - {"model_type"}:  # whatever the reader looked at and accepted had the right JSON type
        value = cfg.get(key)
        if key == "no_rope_layers" and isinstance(value, list):  # SmolLM3's per-layer 0/1 flags
            assert len(value) == a.layers and all(type(v) is int and v in (0, 1) for v in value), value
            continue
        if key == "layer_types" and value is not None:  # Gemma 2/3's per-layer attention kinds
            assert len(value) == a.layers and set(value) <= {"sliding_attention", "full_attention"}, value
            continue
        if key == "rotary_pct" and isinstance(value, float):  # a fraction of each head
            assert 0 < value <= 1, value
            continue
        if key == "rope_parameters" and isinstance(value, dict):  # read for its partial_rotary_factor
            factor = value.get("partial_rotary_factor")
            assert factor is None or (type(factor) in (int, float) and 0 < factor <= 1), value
            continue
        if key == "mlp_only_layers":  # Qwen3-MoE's dense layers by index: only none is accepted
            assert value in (None, []), value
            continue
        if key.endswith("softcapping") and isinstance(value, float):  # a cap is a positive number or null
            assert value > 0 and math.isfinite(value), value
            continue
        assert value is None or isinstance(value, (bool, int)) or key.endswith(("dropout", "pdrop")), (key, value)
        assert not (isinstance(value, float) and not key.endswith(("dropout", "pdrop"))), (key, value)
        assert not (isinstance(value, int) and not isinstance(value, bool) and value < 0), (key, value)
    assert model_params(a).total > 0


@settings(max_examples=300, derandomize=True, deadline=None)
@given(data=st.binary(max_size=200) | st.text(alphabet='{}[]":,0123456789.eE-+ ntrufalsNIy\\', max_size=200).map(str.encode))
def test_random_bytes_give_a_config_or_one_input_error(data):
    try:
        cfg = parse_config(data)
    except InputError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(cfg, dict)
