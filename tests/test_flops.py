"""FLOPs per step against Megatron's closed forms and 6·N·tokens."""

from __future__ import annotations

import pytest

from memcalc.errors import InputError
from memcalc.inputs.presets import load_model
from memcalc.model.architecture import Architecture
from memcalc.time.flops import (attention_core_flops, layer_gemms, megatron_model_flops, narayanan_hardware_flops,
                                step_flops)  # fmt: skip


@pytest.mark.parametrize("name", ["megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t"])
def test_megatron_formula_exact(name):
    # Korthikanti et al. 2022 §6: 72·B·L·s·h²(1 + s/6h + V/12hL), full attention, V = padded vocabulary.
    a = load_model(name)
    B, s = 64, 2048
    f = step_flops(a, s, B)
    assert f.model == megatron_model_flops(B, a.layers, s, a.hidden, a.padded_vocab)
    # Narayanan et al. 2021 eq. 3 (full recompute, the head is not recomputed).
    assert step_flops(a, s, B, "full").hardware == narayanan_hardware_flops(B, a.layers, s, a.hidden, a.padded_vocab)


def test_six_n_tokens_for_the_matmuls():
    # 6·N·tokens with N = the weight matrices the tokens pass through (no biases, norms or embeddings here).
    a = load_model("llama-3-8b")
    tokens = 4 * 8192
    f = step_flops(a, 8192, 4)
    n_matmul = a.layers * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) + 4096 * 128256
    assert 3 * (f.layer_matmul_forward + f.head_forward) == 6 * n_matmul * tokens
    # PaLM/torchtitan: attention adds 12·L·h·s per token (full convention).
    assert 3 * f.attention_forward == 12 * a.layers * 4096 * 8192 * tokens


def test_causal_halves_attention_and_recompute_adds():
    a = load_model("llama-3-8b")
    s = 4096
    assert attention_core_flops(a, s, "causal") * 2 == attention_core_flops(a, s, "full") + 4 * s * a.q_width
    none, sel, full = (step_flops(a, s, 2, r) for r in ("none", "selective", "full"))
    assert none.model == sel.model == full.model
    assert sel.hardware - none.hardware == none.attention_forward
    assert full.hardware - none.hardware == none.layer_matmul_forward + none.attention_forward


def test_gqa_and_moe_shapes():
    mix = load_model("mixtral-8x7b")
    g = {x.name: x for x in layer_gemms(mix, True)}
    assert (g["k"].k, g["k"].n) == (4096, 1024)  # 8 KV heads x 128
    assert g["expert gate"].count == 2 and g["router"].n == 8
    assert g["q"].n == 4096 and layer_gemms(mix, True, 8)[0].n == 512  # column-parallel under TP 8
    gpt = Architecture(layers=2, hidden=64, heads=4, vocab=100, max_positions=16)
    assert [x.name for x in layer_gemms(gpt, False)] == ["q", "k", "v", "o", "up", "down"]


def test_bad_inputs():
    a = load_model("gpt2")
    with pytest.raises(InputError):
        step_flops(a, 0, 1)
    with pytest.raises(InputError, match="recompute"):
        step_flops(a, 128, 1, "some")  # type: ignore[arg-type]


GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
             "sliding_window": 512, "sliding_window_pattern": 6}  # fmt: skip


@pytest.mark.parametrize("seq", [1, 7, 511, 512, 513, 2048])
@pytest.mark.parametrize("window", [None, 1, 512, 4096])
def test_attention_pairs_count_the_mask(seq, window):
    """The pairs transformers' masks allow, counted one by one: causal ``kv <= q``, sliding ``kv > q - w``."""
    from memcalc.time.flops import attention_pairs

    allowed = sum(1 for q in range(seq) for kv in range(seq) if kv <= q and (window is None or kv > q - window))
    assert attention_pairs(seq, "causal", window) == allowed
    assert attention_pairs(seq, "full", window) == seq * seq  # the full convention ignores every mask


def test_sliding_layers_count_their_window_under_the_causal_convention():
    from memcalc.model.hf_config import architecture_from_config

    a = architecture_from_config(GEMMA3_1B)
    assert len(a.sliding_layers) == 22 and a.sliding_window == 512  # 5 of every 6 layers slide
    s, q = 8192, 4 * 256
    causal = step_flops(a, s, 2, attention="causal").attention_forward
    sliding_pairs = 512 * 513 // 2 + (s - 512) * 512
    assert causal == 2 * 4 * q * (22 * sliding_pairs + 4 * s * (s + 1) // 2)
    # The Megatron/PaLM convention counts s² on every layer, sliding or not.
    assert step_flops(a, s, 2).attention_forward == 2 * 4 * q * 26 * s * s
    # Selective recompute runs each layer's own attention again.
    sel = step_flops(a, s, 2, "selective", attention="causal")
    assert sel.recompute == causal
