"""LoRA and QLoRA: adapter counts, NF4 storage, the accountings' rows, and the saved tensors of a real peft model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.inputs.presets import load_model
from memcalc.model.lora import LoraPlan, layer_lora, nf4_bytes, resolve_targets, split
from memcalc.model.params import model_params

ALL = ("q", "k", "v", "o", "gate", "up", "down")


def test_llama2_7b_r16_all_linear_matches_peft():
    # peft print_trainable_parameters for Llama-2-7B, r=16, target_modules="all-linear":
    # "trainable params: 39,976,960 || all params: 6,778,392,576"
    arch = load_model("llama-2-7b")
    ly = layer_lora(arch, LoraPlan(16, resolve_targets(arch, None)))
    assert ly.adapters * arch.layers == 39_976_960
    assert model_params(arch).total + ly.adapters * arch.layers == 6_778_392_576
    assert resolve_targets(arch, "v,q") == ("q", "v")
    assert layer_lora(arch, LoraPlan(8, ("q", "v"))).adapters == 8 * (4096 + 4096) * 2


def test_nf4_bytes_double_quantization():
    # 4096 x 4096: 8,388,608 packed + 262,144 8-bit absmax + 1,024 blocks of 256 x 4 B + 4 + 64 + 1,024 constants,
    # as bitsandbytes 0.50 quantize_4bit(compress_statistics=True, quant_type="nf4") stores it (measured below)
    assert nf4_bytes(4096 * 4096) == 8_388_608 + 262_144 + 4_096 + 1_092 == 8_655_940
    assert nf4_bytes(11008 * 4096) == 23_260_996
    assert nf4_bytes(49_157) == 26_456  # odd count, partial blocks
    # QLoRA §3: 0.127 bits of constants per parameter on top of 4 (8/64 + 32/(64·256)), constants per tensor aside
    n = 64 * 256 * 1024
    assert (nf4_bytes(n) - 1_092) * 8 / n == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))


def test_nf4_bytes_equal_bitsandbytes():
    torch = pytest.importorskip("torch")
    F = pytest.importorskip("bitsandbytes.functional")
    for n in (4097, 64 * 256 * 3 + 5):
        q, st = F.quantize_4bit(torch.randn(n), blocksize=64, compress_statistics=True, quant_type="nf4")
        parts = (q, st.absmax, st.offset, st.code, st.state2.absmax, st.state2.code)
        assert sum(t.numel() * t.element_size() for t in parts) == nf4_bytes(n)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "opt", "phi3"])
def test_module_names_pick_what_peft_adapts(family):
    # peft's target_modules (the module names, or a path's tail) and all-linear pick the projections peft itself wraps
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.model.lora import projections
    from memcalc.validation.saved import build, tiny_config

    arch = architecture_from_config(tiny_config(family))
    modules = list(dict.fromkeys(p.module.rsplit(".", 1)[-1] for p in projections(arch)))
    for given in (modules[:1], modules[-2:], "all-linear"):
        model = peft.get_peft_model(build(family, "fp32", "sdpa", False), peft.LoraConfig(r=2, target_modules=given))
        adapted = {n.split(".0.", 1)[1].removesuffix(".lora_A")  # layer 0's wrapped modules, as named inside it
                   for n, _ in model.named_modules() if n.endswith(".lora_A") and ".0." in n}
        mine = resolve_targets(arch, given if isinstance(given, str) else ",".join(given))
        picked = [p.module for p in projections(arch) if p.names[0] in mine]
        # peft's path inside the layer (self_attn.q_proj) ends with memcalc's module name (q_proj, attn.c_proj)
        assert len(picked) == len(adapted) and all(any(a.endswith(m) for a in adapted) for m in picked), given


def test_validation_adapters_follow_the_module_paths():
    """The traced steps' peft adapters (memcalc.validation.lora.add_adapters): GPT-2's o alone is ``attn.c_proj``, its
    down alone ``mlp.c_proj`` (a bare ``c_proj`` would adapt both)."""
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from memcalc.validation import lora as vl

    for targets, want in ((("o",), {"attn.c_proj"}), (("down",), {"mlp.c_proj"}),
                          (("q", "up"), {"attn.c_attn", "mlp.c_fc"})):  # fmt: skip
        m = vl.build("gpt2", "fp32", "sdpa", LoraPlan(4, targets))
        got = {n.split(".lora_A")[0].split(".h.")[-1].split(".", 1)[1] for n, _ in m.named_parameters() if "lora_A" in n}
        assert got == want, (targets, got)


def test_targets_refused_in_one_line():
    gpt2 = load_model("gpt2")
    accepted = "accepted: a comma-separated subset of q,k,v,o,up,down"
    with pytest.raises(InputError, match=rf"'gate' does not exist in .*{accepted}"):
        resolve_targets(gpt2, "q,k,v,gate")
    with pytest.raises(InputError, match="fuses q,k,v into one module \\(c_attn\\)"):
        resolve_targets(gpt2, "q,v")
    with pytest.raises(InputError, match="needs the model's shape"):
        memcalc.estimate(params=7e9, lora_rank=16)
    with pytest.raises(InputError, match="int8 .*accepted: none, nf4"):
        memcalc.estimate(model="llama-2-7b", lora_rank=16, quantize="int8")
    with pytest.raises(InputError, match="--quantize nf4 needs --lora-rank"):
        memcalc.estimate(model="llama-2-7b", quantize="nf4")
    with pytest.raises(InputError, match="'w1' is not accepted"):
        memcalc.estimate(model="llama-2-7b", lora_rank=16, lora_targets="w1")


def _rows(r):
    return {x.key: x.bytes for x in r.memory.per_gpu.rows if x.location == "gpu"}


def test_paper_states_adapters_only_and_sharded_base():
    a = 39_976_960
    psi = 6_738_415_616
    r = memcalc.estimate(model="llama-2-7b", lora_rank=16, accounting="paper", precision="bf16-mixed")
    rows = _rows(r)
    assert rows["parameters_frozen"] == 2 * psi and rows["parameters_adapters"] == 2 * a
    assert (rows["gradients"], rows["master_weights"], rows["optimizer_moments"]) == (2 * a, 4 * a, 8 * a)
    assert r.memory.per_gpu.parameters == 2 * (psi + a)
    z3 = _rows(memcalc.estimate(model="llama-2-7b", lora_rank=16, accounting="paper", stage=3, gpus=8,
                                precision="bf16-mixed"))
    assert z3["parameters_frozen"] == 2 * psi // 8 and z3["optimizer_moments"] == 8 * a // 8
    q = _rows(memcalc.estimate(model="llama-2-7b", lora_rank=16, accounting="paper", quantize="nf4",
                               precision="bf16-mixed"))
    arch = load_model("llama-2-7b")
    ly = layer_lora(arch, LoraPlan(16, ALL, "nf4"))
    assert q["parameters_frozen"] == 32 * ly.nf4 + 2 * (psi - 32 * ly.linear) == 3_865_836_416
    assert split(psi, 32, ly, "nf4", 2).frozen_bytes == q["parameters_frozen"]


def test_realistic_states_and_rows():
    r = memcalc.estimate(model="llama-2-7b", lora_rank=16, seq_len=2048, precision="bf16", attention="sdpa",
                         quantize="nf4")
    assert r.accounting == "realistic"
    rows = {x.label: x.bytes for x in r.memory.per_gpu.rows}
    assert rows["parameters (frozen base, nf4)"] == 3_865_836_416
    assert rows["parameters (LoRA adapters)"] == 2 * 39_976_960
    # bf16 AdamW moments of the adapters + a 4-byte step per adapter tensor (7 targets x A, B x 32 layers)
    assert rows["optimizer states"] == 2 * 2 * 39_976_960 + 4 * 14 * 32
    full = memcalc.estimate(model="llama-2-7b", seq_len=2048, precision="bf16", attention="sdpa")
    assert r.memory.per_gpu.total < full.memory.per_gpu.total / 3


def test_cli_flags_and_json_input():
    runner = CliRunner()
    res = runner.invoke(app, ["estimate", "--model", "llama-2-7b", "--lora-rank", "16", "--lora-targets", "q,v",
                              "--quantize", "nf4", "--accounting", "paper", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["input"]["lora"] == {"rank": 16, "targets": ["q", "v"], "quantize": "nf4"}
    bad = runner.invoke(app, ["estimate", "--model", "gpt2", "--lora-rank", "8", "--lora-targets", "gate"])
    assert bad.exit_code == 2 and "does not exist in" in bad.output
    cmp = runner.invoke(app, ["compare", "--model", "llama-2-7b", "--lora-rank", "16", "--gpus", "8", "--json"])
    assert cmp.exit_code == 0, cmp.output


@pytest.mark.parametrize("targets", [ALL, ("q", "v")])
@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_layer_saved_matches_peft_census(targets, regime, attention):
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from memcalc.memory.families.saved import layer_saved, total
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation import lora as vl
    from memcalc.validation.saved import tiny_config

    lp = LoraPlan(8, targets)
    c = vl.census("llama", regime, attention, 16, 2, lp)
    arch = architecture_from_config(tiny_config("llama"))
    m = layer_saved(arch, family="llama", regime=regime, attention=attention, s=16, b=2, lora=lp)
    assert c.layer_bytes() == total(m)
    assert c.layer_bytes("weight_cast") == total(m, "weight_cast")


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
def test_qwen3_and_smollm3_layers_match_the_peft_census(family, regime):
    """Qwen3's q_norm/k_norm keep their fp32 input and rstd under LoRA, not the normalized tensor (frozen weights)."""
    pytest.importorskip("peft")
    from memcalc.memory.families.saved import layer_saved, total
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation import lora as vl
    from memcalc.validation.saved import tiny_config

    arch = architecture_from_config(tiny_config(family))
    for targets in (ALL, ("q", "v")):
        lp = LoraPlan(8, targets)
        c = vl.census(family, regime, "sdpa", 16, 2, lp)
        m = layer_saved(arch, family=family, regime=regime, attention="sdpa", s=16, b=2, lora=lp)
        assert (c.layer_bytes(), c.layer_bytes("weight_cast")) == (total(m), total(m, "weight_cast"))


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3_text"])
@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
def test_gemma_layers_match_the_peft_census(family, regime):
    """Gemma's RMSNorm with a frozen weight keeps its fp32 input, rstd and 1 + weight, not the normalized tensor;
    Gemma 2 and 3 norm the attention output and the MLP's input and output too (each layer: Gemma 3's sliding ones
    and Gemma 2's eager soft-capped scores)."""
    pytest.importorskip("peft")
    from memcalc.memory.families.saved import layer_saved, total
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation import lora as vl
    from memcalc.validation.saved import tiny_config

    arch = architecture_from_config(tiny_config(family))
    for attention in ("eager",) if family == "gemma2" else ("sdpa", "eager"):
        for targets in (ALL, ("q", "v")):
            lp = LoraPlan(8, targets)
            c = vl.census(family, regime, attention, 16, 2, lp)
            for i in range(c.layers):
                m = layer_saved(arch, family=family, regime=regime, attention=attention, s=16, b=2, lora=lp, index=i)
                assert (c.part_bytes(f"layer.{i}"), c.part_bytes(f"layer.{i}", "weight_cast")) == (
                    total(m), total(m, "weight_cast")), (attention, targets, i)


GEMMA = dict(model_type="gemma", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=256,
             tie_word_embeddings=False)


@pytest.mark.parametrize("precision,impl,recompute,targets", [
    ("fp32", "fused", "none", ("q", "v")), ("bf16", "fused", "none", ALL), ("amp-bf16", "fused", "none", ALL),
    ("fp32", "foreach", "none", ALL), ("bf16", "fused", "full", ALL), ("amp-bf16", "fused", "full", ("q", "v")),
])  # fmt: skip
def test_gemma_timeline_against_a_traced_peft_step(precision, impl, recompute, targets):
    """Gemma under peft on one GPU: the states byte for byte, the peak at the trace's or above it by at most 5 % (the
    layers' backward transients are the full model's, an upper bound, as for Llama's LoRA)."""
    pytest.importorskip("peft")
    from memcalc.memory.engine.timeline import timeline
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation.lora import trace_lora_step
    from memcalc.validation.trace_step import cache_promotes_values

    lp = LoraPlan(8, targets)
    tr = trace_lora_step(GEMMA, lp, seq_len=32, micro_batch=2, precision=precision, optimizer_impl=impl,
                         recompute=recompute, fake=False)
    tl = timeline(architecture_from_config(GEMMA), family="gemma", regime=precision, attention="sdpa", s=32, b=2,
                  optimizer_impl=impl, recompute=recompute, lora=lp, cache_promotes_values=cache_promotes_values())
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase]
    assert tr.peak <= tl.peak.live_bytes <= 1.05 * tr.peak


@pytest.mark.parametrize("precision,mp,targets,recompute", [("amp-bf16", "bf16", ("q", "v"), "none"),
                                                             ("bf16", None, ALL, "none"), ("fp32", None, ALL, "full")])
def test_gemma_under_fsdp2_against_a_traced_peft_step(precision, mp, targets, recompute):
    """Gemma under peft and FSDP2 FULL_SHARD as rank 0 of 4 (accelerate's FSDP2 plugin, the root wrap): the states
    exact, the peak at the trace's or above by at most 5.1 %, the bounds Llama's LoRA has there."""
    pytest.importorskip("peft")
    from memcalc.memory.engine.timeline import timeline
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation.lora import trace_lora_step
    from memcalc.validation.trace_step import cache_promotes_values

    cfg = dict(GEMMA, hidden_size=128, intermediate_size=344, num_hidden_layers=4, head_dim=32, vocab_size=250)
    lp = LoraPlan(8, targets)
    tr = trace_lora_step(cfg, lp, seq_len=32, micro_batch=2, precision=precision, optimizer_impl="fused", fake=False,
                         world=4, fsdp_param_dtype=mp, recompute=recompute)
    tl = timeline(architecture_from_config(cfg), family="gemma", regime=precision, attention="sdpa", s=32, b=2,
                  optimizer_impl="fused", lora=lp, recompute=recompute, world=4, fsdp=True, fsdp_param_dtype=mp,
                  cache_promotes_values=cache_promotes_values())  # fmt: skip
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase]
    assert tr.peak <= tl.peak.live_bytes <= 1.051 * tr.peak


def test_lora_on_gemma_under_fsdp1_takes_the_paper_accounting():
    """FSDP1 with peft's wrap policy is traced for Llama-style layers (tests/test_fsdp_layouts.py); Gemma's layers
    under it are not (the bf16-MixedPrecision step was 1.3 % below a trace): the paper accounting answers, with
    the reason, while Llama 2 7B under FSDP1 is answered realistically."""
    from memcalc.memory.accountings.scope import why_not
    from memcalc.model.hf_config import architecture_from_config

    why = why_not(architecture_from_config(GEMMA), "bf16-mixed", "adamw", "FULL_SHARD", None, fsdp_version=1,
                  lora=LoraPlan(8, ALL))  # fmt: skip
    assert why is not None and "FSDP1 FULL_SHARD (peft's wrap policy, Llama-style layers)" in why
    r = memcalc.estimate(model="llama-2-7b", fsdp="FULL_SHARD", fsdp_version=1, gpus=8, lora_rank=8, seq_len=512)
    assert r.accounting == "realistic" and any(n.startswith("LoRA under FSDP1") for n in r.notes)


def test_tiny_counts_match_peft():
    pytest.importorskip("peft")
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation import lora as vl
    from memcalc.validation.saved import tiny_config

    arch = architecture_from_config(tiny_config("llama"))
    lp = LoraPlan(8, ALL)
    trainable, everything = vl.trainable("llama", lp)
    assert trainable == arch.layers * layer_lora(arch, lp).adapters == 14_848
    assert everything == model_params(arch).total + trainable


TRACE_LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
# (precision, optimizer_impl, attention, recompute, targets, bound): bound 0 = the step's peak and its phase equal the
# traced peft step's byte for byte; else the timeline is above the trace by at most that fraction (the layers'
# backward transients are the full model's: an upper bound where the peak is in a layer's backward)
TRACED = [
    ("fp32", "fused", "sdpa", "none", ("q", "v"), 0),
    ("fp32", "fused", "eager", "none", ("q", "v"), 0),
    ("bf16", "fused", "sdpa", "none", ALL, 0),
    ("amp-bf16", "fused", "sdpa", "none", ALL, 0),
    ("amp-bf16", "for-loop", "sdpa", "none", ("q", "k", "v", "o"), 0),
    ("fp32", "foreach", "sdpa", "none", ALL, 0.03),
    ("fp32", "fused", "eager", "none", ALL, 0.03),
    ("bf16", "fused", "sdpa", "full", ALL, 0.035),
]


QWEN3 = dict(TRACE_LLAMA, model_type="qwen3", head_dim=16)


@pytest.mark.parametrize("precision,impl,targets", [("fp32", "fused", ("q", "v")), ("amp-bf16", "fused", ALL),
                                                    ("bf16", "fused", ALL)])
def test_qwen3_timeline_against_a_traced_peft_step(precision, impl, targets):
    pytest.importorskip("peft")
    from memcalc.memory.engine.timeline import timeline
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation.lora import trace_lora_step

    lp = LoraPlan(8, targets)
    tr = trace_lora_step(QWEN3, lp, seq_len=32, micro_batch=2, precision=precision, optimizer_impl=impl, fake=False)
    from memcalc.validation.trace_step import cache_promotes_values

    tl = timeline(architecture_from_config(QWEN3), family="qwen3", regime=precision, attention="sdpa", s=32, b=2,
                  optimizer_impl=impl, lora=lp, cache_promotes_values=cache_promotes_values())  # fmt: skip
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)


@pytest.mark.parametrize("precision,impl,attention,recompute,targets,bound", TRACED)
def test_timeline_against_a_traced_peft_step(precision, impl, attention, recompute, targets, bound):
    pytest.importorskip("peft")
    from memcalc.memory.engine.timeline import timeline
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation.lora import trace_lora_step

    lp = LoraPlan(8, targets)
    tr = trace_lora_step(TRACE_LLAMA, lp, seq_len=32, micro_batch=2, precision=precision, optimizer_impl=impl,
                         attention=attention, recompute=recompute, fake=False)
    from memcalc.validation.trace_step import cache_promotes_values

    tl = timeline(architecture_from_config(TRACE_LLAMA), family="llama", regime=precision, attention=attention, s=32,
                  b=2, optimizer_impl=impl, recompute=recompute, lora=lp, cache_promotes_values=cache_promotes_values())
    for phase in ("baseline", "input", "optimizer", "zero_grad"):  # the states: adapters trainable, base frozen
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase]
    if bound == 0:
        assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    else:
        assert tr.peak <= tl.peak.live_bytes <= (1 + bound) * tr.peak


def test_other_families_and_json_round_trip():
    from memcalc.report.results import Estimate

    gpt2 = memcalc.estimate(model="gpt2", lora_rank=4, accounting="paper", seq_len=128)
    rows = _rows(gpt2)
    # GPT-2 small: c_attn 768 -> 2304, attn.c_proj 768 -> 768, c_fc 768 -> 3072, mlp.c_proj 3072 -> 768, 12 layers
    a = 12 * 4 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768))
    assert rows["parameters_adapters"] == 2 * a and rows["gradients"] == 2 * a
    assert rows["activations_lora"] == 12 * 4 * 128 * 4 * 2  # 4 targets x s·r x 2 bytes, 12 layers
    again = Estimate.model_validate_json(gpt2.model_dump_json())
    assert again.input.lora is not None and again.input.lora.rank == 4
    custom = memcalc.estimate(layers=2, hidden=64, heads=4, vocab=100, lora_rank=2, lora_targets="q,v",
                              precision="bf16-mixed")
    assert _rows(custom)["parameters_adapters"] == 2 * 2 * 2 * (64 + 64) * 2
    cmp = memcalc.compare(model="llama-2-7b", lora_rank=8, seq_len=1024, strategies=["ddp", "FULL_SHARD"], gpus=8,
                          precision="amp-bf16")
    # DDP and FSDP1 (peft's wrap policy) both answered realistically, side by side
    assert {e.accounting for e in cmp.estimates} == {"realistic"}
    ddp, fsdp = cmp.estimates
    assert fsdp.memory.per_gpu.peak_allocated < ddp.memory.per_gpu.peak_allocated  # the frozen base sharded


def test_step_time_skips_the_base_weight_gradients():
    kw = dict(model="llama-2-7b", seq_len=4096, precision="amp-bf16", attention="sdpa", gpu="h100-sxm")
    full, lora = memcalc.estimate(**kw).time, memcalc.estimate(lora_rank=16, **kw).time
    # backward of a frozen linear is its input gradient only: compute falls from 3 to about 2 matmul passes
    assert 0.6 < lora.breakdown.compute_s / full.breakdown.compute_s < 0.8
    # AdamW steps 39,976,960 adapter parameters instead of 6.7e9
    assert lora.breakdown.optimizer_s == pytest.approx(full.breakdown.optimizer_s * 39_976_960 / 6_738_415_616)


def test_8bit_adam_on_the_adapters():
    kw = dict(model="llama-2-7b", lora_rank=64, seq_len=1024, precision="bf16", attention="sdpa", quantize="nf4")
    opt = {o: {x.label: x.bytes for x in memcalc.estimate(optimizer=o, **kw).memory.per_gpu.rows}["optimizer states"]
           for o in ("adamw", "adam-8bit", "paged-adam-8bit")}
    steps = 4 * 14 * 32  # a 4-byte step per adapter tensor
    assert opt["adamw"] == 2 * 2 * 159_907_840 + steps
    # bitsandbytes: uint8 m, v + fp32 absmax per 256 values. Per layer: q, k, v, o: 8 tensors of 64 x 4096 (532,480
    # bytes each); gate, up, down: 64 x 4096 (532,480) and 64 x 11008 (2 x 704,512 + 8 x 2,752 = 1,431,040) each
    assert opt["adam-8bit"] == 32 * (8 * 532_480 + 3 * (532_480 + 1_431_040)) + steps == 324_814_592
    assert opt["paged-adam-8bit"] == steps  # paged states live outside the caching allocator


def test_only_adapter_gradients_are_reduced_and_the_frozen_base_is_gathered():
    # Llama-3-8B, r = 16 on q,k,v,o,gate,up,down: 16 x (8,192 + 2 x 5,120 + 8,192 + 2 x 18,432 + 18,432) per layer
    # x 32 layers = 41,943,040 adapter parameters (peft's print_trainable_parameters for this model).
    adapters, psi = 41_943_040, 8_030_261_248
    kw = dict(hf_config="tests/data/llama-3-8b-config.json", lora_rank=16, gpus=8, gpu="h100", seq_len=2048,
              precision="bf16-mixed")
    ddp = memcalc.estimate(**kw).communication.collectives
    assert [(c.op, c.payload_bytes_per_call) for c in ddp] == [("all-reduce", 2 * adapters)]
    z3 = {(c.op, c.phase): c.payload_bytes_per_call for c in memcalc.estimate(stage=3, **kw).communication.collectives}
    assert z3[("reduce-scatter", "backward")] == 2 * adapters
    assert z3[("all-gather", "forward")] == z3[("all-gather", "backward")] == 2 * (psi + adapters)
    z2 = {(c.op, c.phase): c.payload_bytes_per_call for c in memcalc.estimate(stage=2, **kw).communication.collectives}
    assert z2[("all-gather", "optimizer step")] == 2 * adapters  # only the adapters changed
    # QLoRA under ZeRO-3: the gathered base is the NF4-packed bytes the parameter row holds, times the 8 shards
    q = memcalc.estimate(stage=3, quantize="nf4", **kw)
    rows = {r.key: r.bytes for r in q.memory.per_gpu.rows}
    gathered = {c.phase: c.payload_bytes_per_call for c in q.communication.collectives if c.op == "all-gather"}
    assert gathered["forward"] == pytest.approx(8 * (rows["parameters_frozen"] + rows["parameters_adapters"]), abs=16)
