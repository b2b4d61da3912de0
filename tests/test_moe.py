"""Mixtral's and Qwen3-MoE's mixture-of-experts layers under the realistic accounting (memcalc.memory.families.saved_moe): what
the block saves against a census of transformers' own modules, and the step's timeline against traced steps on fake
tensors, on one GPU and as FSDP2's and FSDP1's rank 0 (the fake process group). Every case is exact at the peak; the
phases listed are exact too.

The tiny models (h 64, one expert 96 wide, 4 experts, top 2, 2 layers, vocabulary 128) run in bf16: the experts'
grouped_mm takes bf16 only (torch's meta function, like its CUDA kernel). Qwen3-MoE differs from Mixtral in its
attention (q_norm, k_norm), in routing weights cast back to bf16 (so the weighted pairs are bf16, not fp32), in
``norm_topk_prob`` and in registering the experts before the router."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import memcalc  # noqa: E402
from memcalc.errors import InputError  # noqa: E402
from memcalc.memory.families.saved import layer_saved, outside_saved, total  # noqa: E402
from memcalc.memory.families.saved_moe import moe_saved  # noqa: E402
from memcalc.memory.families.saved_parts import shape  # noqa: E402
from memcalc.memory.engine.timeline import timeline  # noqa: E402
from memcalc.memory.engine.timeline_states import param_tensors  # noqa: E402
from memcalc.model.hf_config import architecture_from_config  # noqa: E402
from memcalc.model.params import model_params  # noqa: E402
from memcalc.validation.saved import build, census, tiny_config  # noqa: E402
from memcalc.validation.trace import trace_step  # noqa: E402
from memcalc.validation.trace_step import cache_promotes_values  # noqa: E402

MIXTRAL = dict(model_type="mixtral", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=None)
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=96,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                 max_position_embeddings=256, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
S, B = 32, 2
STEP_PHASES = ("baseline", "input", "forward.layer.0", "forward.layer.1", "forward.head", "backward",
               "backward.layer.1", "backward.layer.0", "optimizer", "zero_grad")


@pytest.mark.parametrize("family,norm", [("mixtral", True), ("qwen3_moe", True), ("qwen3_moe", False)])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("recompute", [False, True])
def test_moe_layer_saves_what_the_census_finds(family, norm, attention, recompute, monkeypatch):
    """The router's and the grouped experts' saved tensors, byte for byte, at two shapes (their scaling checked);
    Qwen3-MoE with and without ``norm_topk_prob`` (the division's sum and clone)."""
    from memcalc.validation import saved as census_module

    if family == "qwen3_moe":
        monkeypatch.setitem(census_module.TINY, family, {**census_module.TINY[family], "norm_topk_prob": norm})
    cfg = tiny_config(family)
    arch = architecture_from_config(cfg)
    assert arch.router_norm is norm
    m = build(family, "bf16", attention, recompute)
    assert m.config._experts_implementation == "grouped_mm"  # transformers' default where grouped_mm exists
    seen = set()
    for s, b in [(8, 2), (12, 3)]:
        c = census(family, "bf16", attention, s, b, recompute, model=m)
        kw = dict(family=family, regime="bf16", s=s, b=b, recompute=recompute)
        assert total(layer_saved(arch, attention=attention, **kw)) == c.layer_bytes()
        out = c.outside_bytes()
        if recompute:
            out.pop("shared", None)
        assert total(outside_saved(arch, **kw)) == sum(out.values())
        seen.add(c.layer_bytes())
    assert len(seen) == 2


def test_moe_saved_set_by_hand():
    """The MoE block's own tensors at T = 64 tokens, S = 128 pairs, h 64, f 96, E 4, k 2 in bf16, summed by hand:
    the router's input 2Th, softmax 4TE, indices 8Tk, sum 4T, pre-division weights 4Tk; three int64 index tensors 8S
    each, offsets 4E, sorted weights 4S; gathered states 2Sh; gate_up, SiLU, product 2S(2f + f + f); down 2Sh."""
    arch = architecture_from_config(MIXTRAL)
    t, s, h, f, e, k = 64, 128, 64, 96, 4, 2
    by_hand = (2 * t * h + 4 * t * e + 8 * t * k + 4 * t + 4 * t * k + 3 * 8 * s + 4 * e + 4 * s + 2 * s * h
               + 2 * s * 4 * f + 2 * s * h)
    assert total(moe_saved(arch, shape(arch, S, B), 2)) == by_hand == 137_488 + 2 * t * h


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_parameter_tensors_are_the_models(family):
    """Every parameter tensor of the model as torch.optim walks it: the names' order is the registration order (what
    the for-loop AdamW's peak and FSDP1's flat parameters follow), and the sizes are the model's."""
    arch = architecture_from_config(tiny_config(family))
    tensors = param_tensors(arch)
    sizes = dict(tensors)
    assert sizes["layer 0 router"] == 4 * 64
    assert sizes["layer 1 experts_gate_up"] == 4 * 2 * 96 * 64 and sizes["layer 1 experts_down"] == 4 * 64 * 96
    assert sum(sizes.values()) == model_params(arch).total
    hf = build(family, "bf16", "sdpa", False)
    assert [p.numel() for p in hf.parameters()] == [n for _, n in tensors]
    moe = [n.removeprefix("model.layers.0.mlp.") for n, _ in hf.named_parameters() if ".0.mlp." in n]
    assert moe == (["gate.weight", "experts.gate_up_proj", "experts.down_proj"] if family == "mixtral" else
                   ["experts.gate_up_proj", "experts.down_proj", "gate.weight"])
    mine = [n.removeprefix("layer 0 ") for n, _ in tensors if n.startswith("layer 0 ")]
    assert [n for n in mine if n in ("router", "experts_gate_up", "experts_down")] == (
        ["router", "experts_gate_up", "experts_down"] if family == "mixtral" else
        ["experts_gate_up", "experts_down", "router"])


def _one_gpu(cfg, opt, recompute, s=S, b=B, use_cache=True):
    tr = trace_step(cfg, seq_len=s, micro_batch=b, precision="bf16", optimizer_impl=opt, recompute=recompute)
    tl = timeline(architecture_from_config(cfg), family=cfg["model_type"], regime="bf16", attention="sdpa", s=s, b=b,
                  recompute=recompute, optimizer_impl=opt, use_cache=use_cache,
                  cache_promotes_values=cache_promotes_values())  # fmt: skip
    return tr, tl


ONE_GPU = [  # (model, config changes, optimizer, recompute, s, b, peak phase)
    (MIXTRAL, {}, "fused", "none", S, B, "backward.layer.1"),  # the routing weights' product's backward
    (MIXTRAL, {}, "foreach", "full", S, B, "optimizer"),
    (MIXTRAL, {}, "fused", "full", S, B, "backward.layer.0"),  # the gradient put back in pair order (recomputed)
    (MIXTRAL, {"use_cache": False}, "for-loop", "none", 128, 1, "backward"),  # the loss
    (MIXTRAL, {"num_local_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 40}, "fused", "none", S, B,
     "backward.layer.1"),
    (MIXTRAL, {"num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size": 24}, "fused", "full", S, B,
     "backward.layer.0"),  # the second norm's backward; one expert per token: the sum over k tops the forward
    (QWEN3_MOE, {"vocab_size": 64, "num_experts": 16, "num_experts_per_tok": 4}, "fused", "none", 64, B,
     "backward.layer.1"),  # bf16 pairs: the gradient put back in pair order
    (QWEN3_MOE, {"norm_topk_prob": False}, "foreach", "none", S, B, "optimizer"),
    (QWEN3_MOE, {}, "fused", "full", S, B, "backward.layer.0"),
]
FINAL_NORM = ("forward.layer.1",)
"""Qwen3's final norm holds one residual-sized tensor more than the timeline counts (dense Qwen3 alike; not an MoE
moment, and below the step's peak): its last layer's forward phase is left out for that family."""


@pytest.mark.parametrize("model,changes,opt,recompute,s,b,phase", ONE_GPU)
def test_moe_step_on_one_gpu_equals_the_trace(model, changes, opt, recompute, s, b, phase):
    cfg = model | changes
    tr, tl = _one_gpu(cfg, opt, recompute, s, b, use_cache=changes.get("use_cache", True))
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    assert tr.peak_phase == phase
    for p in STEP_PHASES:
        if p == "backward" and s * b > S * B:
            continue  # the loss's labels at micro-batch 1 (a dense model's too): not an MoE moment
        if p in FINAL_NORM and model is QWEN3_MOE and recompute == "none":
            continue
        assert tl.phase_peaks[p] == tr.phase_peaks[p], p


FSDP = [  # (model, world, precision, MixedPrecisionPolicy param_dtype, recompute, optimizer, version, prefetch)
    (MIXTRAL, 4, "fp32", "bf16", "none", "fused", 2, "pre"),  # bf16-mixed
    (MIXTRAL, 4, "bf16", None, "full", "fused", 2, "pre"),
    (MIXTRAL, 8, "fp32", "bf16", "none", "fused", 2, "pre"),  # 4 experts over 8 ranks: dim-0 shards padded
    (MIXTRAL, 4, "fp32", "bf16", "none", "fused", 1, "none"),  # FSDP1 as accelerate wraps it
    (QWEN3_MOE, 4, "bf16", None, "full", "fused", 2, "pre"),
    (QWEN3_MOE, 4, "fp32", "bf16", "none", "foreach", 1, "pre"),
]


@pytest.mark.parametrize("model,world,precision,mp,recompute,opt,version,prefetch", FSDP)
def test_moe_step_under_fsdp_equals_the_trace(model, world, precision, mp, recompute, opt, version, prefetch):
    tr = trace_step(model, seq_len=S, micro_batch=B, precision=precision, world=world, fsdp=True,
                    fsdp_param_dtype=mp, optimizer_impl=opt, recompute=recompute, fsdp_version=version,
                    backward_prefetch=prefetch)  # fmt: skip
    tl = timeline(architecture_from_config(model), family=model["model_type"], regime=precision, attention="sdpa",
                  s=S, b=B, recompute=recompute, optimizer_impl=opt, world=world, fsdp=True, fsdp_param_dtype=mp,
                  fsdp_flat=version == 1, fsdp_prefetch=prefetch == "pre",
                  cache_promotes_values=cache_promotes_values())  # fmt: skip
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    for p in ("baseline", "input", "forward.layer.0", "backward.layer.1", "optimizer", "zero_grad"):
        assert tl.phase_peaks[p] == tr.phase_peaks[p], p


def test_mixtral_under_fsdp2_counts_the_padded_expert_shards():
    """FSDP2 shards each expert tensor on dim 0: 8 experts over 16 ranks leave one expert tensor row on every rank,
    twice the even share; FSDP1's flat parameters split evenly. Rank 0's fp32 shards, summed here from the model's
    shapes (Mixtral-8x7B: 32 layers, h 4096, kv width 1024, expert ffn 14336, vocabulary 32000)."""
    kw = dict(model="mixtral-8x7b", fsdp="FULL_SHARD", gpus=16, gpu="h100", seq_len=4096)
    two = memcalc.estimate(fsdp_version=2, **kw)
    assert two.accounting == "realistic"
    h, kv, f, e, v, n = 4096, 1024, 14336, 8, 32000, 16
    rows = lambda out, width: -(-out // n) * width  # noqa: E731  rank 0's ceil(rows / 16) rows of a tensor
    layer = (rows(h, h) + 2 * rows(kv, h) + rows(h, h) + rows(e, h) + rows(e, 2 * f * h) + rows(e, h * f)
             + 2 * rows(h, 1))
    shards = 32 * layer + 2 * rows(v, h) + rows(h, 1)
    assert next(r.bytes for r in two.memory.per_gpu.rows if r.key == "parameters") == 4 * shards
    assert any(x.startswith("MoE:") and "2.00x the even share" in x for x in two.notes)
    one = memcalc.estimate(fsdp_version=1, **kw)
    # FSDP1: one FlatParameter per layer and one for the root, each padded to a multiple of 16 and split evenly
    flat = 2 * h * h + 2 * kv * h + e * h + e * 3 * f * h + 2 * h
    root = 2 * v * h + h
    even = 32 * -(-flat // n) + -(-root // n)
    assert next(r.bytes for r in one.memory.per_gpu.rows if r.key == "parameters") == 4 * even
    assert shards / even == pytest.approx(1.966, abs=0.001)  # the experts (98 % of the weights) twice over
    assert not any("even share" in x for x in one.notes)


def test_moe_outside_the_modelled_set_takes_the_paper_accounting_and_says_why():
    base = dict(model="mixtral-8x7b", gpus=16, gpu="h100", seq_len=4096)
    r = memcalc.estimate(stage=3, offload_optimizer="cpu", **base)
    assert r.accounting == "paper"
    assert any("MoE with zero-3, offload" in x for x in r.notes)
    r = memcalc.estimate(stage=2, precision="fp16-mixed", **base)
    assert r.accounting == "paper"
    assert any("MoE under DeepSpeed with --precision fp16-mixed" in x for x in r.notes)
    r = memcalc.estimate(fsdp="FULL_SHARD", precision="amp-bf16", **base)
    assert r.accounting == "paper"
    assert any("MoE with --precision amp-bf16: the experts' grouped_mm takes bf16 only" in x for x in r.notes)
    with pytest.raises(InputError, match="MoE with --precision fp32"):
        memcalc.estimate(fsdp="FULL_SHARD", precision="fp32", accounting="realistic", **base)


def test_a_backward_moments_layer_activations_row_says_what_it_is():
    """The row of the saved activations at a layer's backward (``layer activations (layers 0..i)``) carries the saved
    tensors' explanation, not the SHARD_GRAD_OP gathered layers' (whose rows are named ``layers 0..i parameters``)."""
    r = memcalc.estimate(model="mixtral-8x7b", fsdp="FULL_SHARD", fsdp_version=2, gpus=16, gpu="h100", seq_len=4096)
    row = next(r for r in r.memory.per_gpu.rows if r.label.startswith("layer activations (layers 0.."))
    assert row.detail.startswith("what the decoder layers save for backward")


def test_tracing_an_moe_model_outside_bf16_is_one_line(tmp_path):
    """grouped_mm refuses fp32 inputs: the tracer says so in one line, and the CLI exits 2 with it."""
    import json

    from typer.testing import CliRunner

    from memcalc.cli import app

    with pytest.raises(InputError, match="grouped_mm experts take bf16 only"):
        trace_step(MIXTRAL, seq_len=8, precision="amp-bf16")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_MOE))
    r = CliRunner().invoke(app, ["trace", "--hf-config", str(path), "--seq-len", "8", "--precision", "fp32"])
    assert r.exit_code == 2
    assert "precision 'fp32' with a mixture of experts" in r.output and len(r.output.strip().splitlines()) == 1


def test_moe_under_deepspeed_is_realistic_and_counts_the_experts_backward_at_its_hooks():
    """Mixtral-8x7B under ZeRO-3 on 32 GPUs (bf16-mixed, seq 4096, full recompute): the realistic accounting, its
    peak at the top layer's second RMSNorm backward. By then DeepSpeed's hooks have reduced the experts' gradients:
    gate_up's (E·2f·h elements, larger than the 5e8-element bucket) stays outside the bucket's buffer until the
    router's hook reduces it, so nothing of the experts' gradients is alive beside the norm's backward. The paper
    accounting's 16Ψ/N view is lower by the step's transients. The tiny model's every backward phase is held to
    DeepSpeed's own step in tests/validation/test_deepspeed_timeline.py."""
    from memcalc.inputs.presets import load_model
    from memcalc.memory.overlays.timeline_zero3 import _gradients

    base = dict(model="mixtral-8x7b", gpus=32, seq_len=4096, micro_batch=1, recompute="full", stage=3)
    r = memcalc.estimate(**base)
    paper = memcalc.estimate(accounting="paper", **base)
    assert r.accounting == "realistic" and paper.accounting == "paper"
    labels = {x.label: x.bytes for x in r.memory.per_gpu.rows}
    assert "RMSNorm backward (fp32), net of the MLP's freed tensors" in labels
    assert labels.get("gradients and the bucket's reduction", 0) == 0
    assert 1.2 < r.memory.per_gpu.total / paper.memory.per_gpu.total < 1.5
    # the hooks, in autograd's order: down's gradient (E·h·f) fits the empty bucket's buffer; gate_up's does not and
    # waits beside it; the router's hook reduces the bucket first, leaving nothing outside the buffer
    arch = load_model("mixtral-8x7b")
    hooks: dict[str, tuple[int, int]] = {}
    _gradients(arch, 32, 500_000_000, 2, hooks=hooks)
    e, f, h = 8, 14336, 4096
    assert hooks["layer31.experts.1"][0] >= 2 * e * h * f
    assert hooks["layer31.experts.0"][1] == 2 * e * 2 * f * h
    assert hooks["layer31.router.0"][1] == 0
