"""The step timeline under FSDP2 FULL_SHARD (``timeline(..., world=N)``) against the tracer's FSDP2 rank 0.

Exact: the peak and its phase, plus the baseline, input, optimizer and zero_grad phase peaks, byte for byte.
The trace's "forward" phase (the embedding and the rotary tables before layer 0) is not a moment of the timeline.
Bounded: full recompute with fp32 gathered weights (fp32, amp-bf16 without MixedPrecisionPolicy) peaks inside the
recomputed layer's backward, which the timeline orders at layer granularity (the single-GPU bound, here +16 KiB).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memcalc.errors import InputError
from memcalc.memory.engine.timeline import timeline
from memcalc.memory.engine.timeline_states import shard_units
from memcalc.model.hf_config import architecture_from_config
from memcalc.validation.trace import trace_step
from memcalc.validation.trace_step import cache_promotes_values

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
QWEN2 = dict(model_type="qwen2", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=True)
LLAMA3 = dict(LLAMA, hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6, vocab_size=130)
BIGVOCAB = dict(LLAMA, vocab_size=2000, num_hidden_layers=4)  # peaks at the loss's gradients
L4 = dict(LLAMA, num_hidden_layers=4, hidden_size=128, intermediate_size=344, vocab_size=250)
QBIG = dict(QWEN2, vocab_size=1500, num_hidden_layers=3)
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
QWEN3 = dict(LLAMA, model_type="qwen3", head_dim=16)
PHI3 = dict(LLAMA, model_type="phi3", **_IDS)
GRANITE = dict(LLAMA, model_type="granite", embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
               **_IDS)  # fmt: skip
SMOLLM3 = dict(LLAMA, model_type="smollm3", no_rope_layers=[1, 0], tie_word_embeddings=True, **_IDS)
_GEMMA = dict(LLAMA, head_dim=16)
_ALT = ["sliding_attention", "full_attention"]
GEMMA = dict(_GEMMA, model_type="gemma")
GEMMA2 = dict(_GEMMA, model_type="gemma2", layer_types=_ALT, sliding_window=16)
GEMMA3 = dict(_GEMMA, model_type="gemma3_text", layer_types=_ALT, sliding_window=16)
OLMO2 = dict(_GEMMA, model_type="olmo2", **_IDS)
CONFIGS = {"gemma": GEMMA, "gemma2": GEMMA2, "gemma3_text": GEMMA3, "olmo2": OLMO2, "llama": LLAMA, "qwen2": QWEN2, "llama3": LLAMA3, "bigvocab": BIGVOCAB, "l4": L4, "qbig": QBIG,
           "qwen3": QWEN3, "phi3": PHI3, "granite": GRANITE, "smollm3": SMOLLM3}
S, B = 32, 2


def both(name, world, precision, mp=None, recompute="none", opt="fused", s=S):
    """The traced FSDP2 rank 0 and the timeline for the same step."""
    cfg = CONFIGS[name]
    attention = "eager" if name == "gemma2" else "sdpa"  # Hugging Face's Gemma 2 is profiled eager
    tr = trace_step(cfg, seq_len=s, micro_batch=B, precision=precision, world=world, fsdp=True, fsdp_param_dtype=mp,
                    optimizer_impl=opt, recompute=recompute, attention=attention)  # fmt: skip
    tl = timeline(architecture_from_config(cfg), family=cfg["model_type"], regime=precision, attention=attention,
                  s=s, b=B, recompute=recompute, optimizer_impl=opt, world=world, fsdp=True, fsdp_param_dtype=mp,
                  cache_promotes_values=cache_promotes_values())  # fmt: skip
    return tr, tl


EXACT = [  # (config, world, precision, fsdp_param_dtype, recompute, optimizer, traced peak bytes)
    ("llama", 4, "fp32", None, "none", "fused", 1_614_172),
    ("llama", 8, "fp32", None, "none", "foreach", 1_450_876),
    ("llama", 4, "amp-bf16", None, "none", "foreach", 1_517_916),
    ("qwen2", 8, "amp-bf16", None, "none", "fused", None),
    ("llama", 4, "amp-bf16", "bf16", "none", "fused", 1_005_148),
    ("qwen2", 4, "amp-bf16", "bf16", "none", "fused", 965_488),
    ("llama", 8, "fp32", "bf16", "none", "fused", 841_852),
    ("llama", 4, "bf16", None, "none", "foreach", 841_852),
    ("qwen2", 8, "bf16", None, "none", "fused", None),
    ("llama", 4, "bf16", None, "full", "fused", 691_388),
    ("llama", 4, "amp-bf16", "bf16", "full", "fused", 877_788),
    ("llama3", 4, "fp32", None, "none", "fused", None),
    ("llama3", 8, "amp-bf16", None, "none", "foreach", None),
    ("bigvocab", 4, "amp-bf16", None, "none", "fused", None),
    ("qwen3", 4, "fp32", None, "none", "fused", 1_716_012),
    ("qwen3", 8, "amp-bf16", None, "none", "foreach", None),
    ("qwen3", 4, "bf16", None, "full", "fused", 730_044),
    ("phi3", 8, "amp-bf16", None, "none", "foreach", 1_321_828),
    ("phi3", 4, "amp-bf16", "bf16", "none", "fused", None),
    ("granite", 4, "bf16", None, "none", "foreach", None),
    ("smollm3", 4, "amp-bf16", "bf16", "none", "fused", 964_184),
    ("smollm3", 8, "amp-bf16", None, "none", "foreach", None),
    ("gemma", 4, "fp32", None, "none", "fused", 1_557_852),
    ("gemma", 8, "amp-bf16", None, "none", "foreach", 1_310_588),
    ("gemma", 4, "bf16", None, "full", "fused", 679_610),
    ("gemma3_text", 4, "fp32", None, "none", "fused", 1_794_684),
    ("olmo2", 4, "fp32", None, "none", "fused", 1_682_092),
    ("gemma2", 4, "fp32", None, "none", "fused", 1_821_548),
]  # fmt: skip


@pytest.mark.parametrize("name,world,precision,s", [("bigvocab", 8, "fp32", 64), ("bigvocab", 4, "amp-bf16", 64),
                                                    ("l4", 8, "fp32", 64), ("llama", 4, "amp-bf16", S)])
def test_fsdp_every_phase_equals_trace(name, world, precision, s):
    # without recompute, fp32 or autocast over fp32 gathered weights: every phase's peak, not only the step's
    tr, tl = both(name, world, precision, s=s)
    assert {k: tl.phase_peaks[k] for k in tr.phase_peaks if k != "forward"} == {
        k: v for k, v in tr.phase_peaks.items() if k != "forward"}


@pytest.mark.parametrize("name,world,precision,mp,recompute,opt,peak", EXACT)
def test_fsdp_peak_equals_trace(name, world, precision, mp, recompute, opt, peak):
    tr, tl = both(name, world, precision, mp, recompute, opt)
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    if peak is not None:
        assert tr.peak == peak
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase]
    assert all(m.live_bytes == sum(n for _, n in m.parts) for m in tl.moments)


BOUNDED = [  # (config, world, precision, recompute, phase, bound): the single-GPU timeline's own bounds
    ("llama", 4, "fp32", "full", "backward.layer.0", 0.015),  # the recomputed layer's backward, at layer grain
    ("llama", 4, "amp-bf16", "full", "backward.layer.0", 0.015),
    ("qbig", 8, "amp-bf16", "full", "loss", 0.001),  # qwen2 under autocast (tests/test_timeline.py BOUNDED)
    ("phi3", 4, "bf16", "full", "backward.layer.0", 0.02),  # the recomputed layer's backward (traced -1.7 %)
    # post-norm layers (Gemma 2 and 3: four norms; OLMo 2: post-norms) in 2-byte regimes: the timeline is below the
    # traced FSDP2 step by 1.9-3.2 % (exact in fp32, and exact on one GPU in every regime)
    ("gemma3_text", 8, "amp-bf16", "none", "backward.layer.1", 0.035),
    ("gemma3_text", 4, "bf16", "full", "backward.layer.0", 0.035),
    ("olmo2", 8, "amp-bf16", "none", "backward.layer.1", 0.035),
    ("olmo2", 4, "bf16", "full", "backward.layer.0", 0.035),
    ("gemma2", 4, "bf16", "full", "backward.layer.0", 0.035),
]  # fmt: skip


@pytest.mark.parametrize("name,world,precision,recompute,phase,bound", BOUNDED)
def test_fsdp_peak_within_bound(name, world, precision, recompute, phase, bound):
    tr, tl = both(name, world, precision, recompute=recompute)
    assert tl.peak.phase == tr.peak_phase == phase
    assert abs(tl.peak.live_bytes - tr.peak) <= bound * tr.peak


@pytest.mark.parametrize("precision,mp,opt", [("fp32", None, "fused"), ("amp-bf16", "bf16", "fused"),
                                               ("fp32", "bf16", "foreach"), ("bf16", None, "fused")])
def test_fsdp2_on_a_single_rank_is_bounded_from_above(precision, mp, opt):
    """FULL_SHARD on one GPU (fully_shard over a world of 1): the timeline counts the gathered copies a world of N
    holds; the traced rank of a world of 1 holds up to one layer's parameters less (within 8 %, never more)."""
    tr, tl = both("llama", 1, precision, mp, opt=opt)
    assert tr.peak <= tl.peak.live_bytes <= 1.08 * tr.peak
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase]


def test_shards_pad_dim0_to_world():
    # vocab 130 over 8 ranks: ceil(130 / 8) = 17 rows of 96 on every rank, for the embedding and the head
    u = shard_units(architecture_from_config(LLAMA3), 8)
    assert u.root == 2 * 130 * 96 + 96
    assert u.root_shard == 2 * 17 * 96 + 12
    # norms 96 -> 12 each; q, o 96 rows -> 12; k, v 32 rows -> 4; gate, up 200 rows -> 25; down 96 rows of 200
    assert u.layer_shard == 2 * 12 + (12 + 4 + 4 + 12 + 25 + 25) * 96 + 12 * 200 == 10_296


def test_fsdp_rejects_what_it_does_not_model():
    arch = architecture_from_config(LLAMA)
    with pytest.raises(InputError):
        timeline(arch, family="llama", regime="fp32", attention="sdpa", s=S, b=B, world=4, optimizer_impl="for-loop")
    with pytest.raises(InputError):
        timeline(arch, family="llama", regime="fp32", attention="sdpa", s=S, b=B, world=4, fsdp_param_dtype="fp16")


def test_estimate_full_shard_is_realistic(tmp_path):
    import json

    import memcalc

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA, num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)))  # fmt: skip
    e = memcalc.estimate(hf_config=str(cfg), fsdp="FULL_SHARD", fsdp_version=2, gpus=8, precision="amp-bf16",
                         seq_len=2048, micro_batch=4)  # fmt: skip
    assert e.model_dump()["accounting"] == "realistic"


def test_cpu_offload_policy_leaves_the_gathered_units_on_the_gpu(tmp_path):
    """FSDP2 CPUOffloadPolicy (torch 2.13 _fully_shard, read, not traced): every moment loses the sharded parameters,
    the moments, the reduced gradient shards and the step; a moment with an all-gather in flight gains the largest
    layer parameter's fp32 shard (copied in, then cast to bf16); the rest is the same moment without offload."""
    import json

    import memcalc
    from memcalc.memory.overlays.timeline_offload import FSDP_OFFLOADED, offload_fsdp

    arch = architecture_from_config(LLAMA3)
    plain = timeline(arch, family="llama", regime="amp-bf16", attention="sdpa", s=S, b=B, world=8,
                     fsdp=True, fsdp_param_dtype="bf16", position_ids=False, use_cache=False)  # fmt: skip
    largest = 25 * 96  # gate, up: 200 rows -> 25 on each of 8 ranks, of 96; down 96 rows -> 12 of 200
    for m, (phase, _, parts) in zip(plain.moments, offload_fsdp(plain.moments, arch, 8)):
        gone = sum(x for n, x in m.parts if n in FSDP_OFFLOADED)
        staged = 4 * largest if any(n.startswith("all-gather output (") for n, _ in m.parts) \
            and phase.startswith(("forward", "backward")) else 0  # fmt: skip
        assert sum(x for _, x in parts) == m.live_bytes - gone + staged, phase
        assert phase not in ("optimizer", "zero_grad") or sum(x for _, x in parts) < m.live_bytes - 8 * 16 * 96
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3))
    kw = dict(hf_config=str(cfg), fsdp="FULL_SHARD", fsdp_version=2, gpus=8, precision="bf16-mixed", seq_len=S,
              micro_batch=B, attention="sdpa")  # fmt: skip
    on, off = memcalc.estimate(offload_params="cpu", **kw), memcalc.estimate(**kw)
    assert on.accounting == "realistic" and any("CPUOffloadPolicy" in n for n in on.notes)
    assert on.memory.per_gpu.peak_allocated < off.memory.per_gpu.peak_allocated
    host = {r.key: r.bytes for r in on.memory.per_node.rows}
    # per node: fp32 shards (the master copy), their fp32 gradients, AdamW's two fp32 moments; no bf16 copy
    assert host["gradients"] == host["master_weights"] and host["optimizer_moments"] == 2 * host["master_weights"]
    assert "parameters" not in host


@pytest.mark.parametrize("world,precision,mp,recompute,version", [
    (4, "fp32", None, "none", 2), (4, "amp-bf16", None, "none", 2), (4, "fp32", "bf16", "none", 2),
    (4, "fp32", None, "full", 2), (8, "fp32", None, "none", 1),
])  # fmt: skip
def test_gpt2_under_fsdp_within_its_bound(world, precision, mp, recompute, version):
    """GPT-2 (tied, fused c_attn, residual and embedding dropout on; attention dropout off, which on CPU sends SDPA
    to its math kernel) under FSDP2 and FSDP1: the states and the loss exact, the peak from 0.02 % below to 3 % above
    the trace, the single-GPU GPT-2 bounds (gelu_new's backward, the recomputed layer)."""
    cfg = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, attn_pdrop=0.0)
    tr = trace_step(cfg, seq_len=S, micro_batch=B, precision=precision, world=world, fsdp=True, fsdp_param_dtype=mp,
                    optimizer_impl="fused", recompute=recompute, fsdp_version=version)  # fmt: skip
    tl = timeline(architecture_from_config(cfg), family="gpt2", regime=precision, attention="sdpa", s=S, b=B,
                  optimizer_impl="fused", world=world, fsdp=True, fsdp_param_dtype=mp, recompute=recompute,
                  fsdp_flat=version == 1, cache_promotes_values=cache_promotes_values())  # fmt: skip
    assert -0.0002 * tr.peak <= tl.peak.live_bytes - tr.peak <= 0.03 * tr.peak
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert abs(tl.phase_peaks[phase] - tr.phase_peaks[phase]) <= 16, phase  # FSDP1: the flat parameter's padding


BLOOM = dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=4, vocab_size=128, hidden_dropout=0.0,
             attention_dropout=0.0)


@pytest.mark.parametrize("world,precision,mp,recompute,version,s", [
    (4, "fp32", None, "none", 2, S), (4, "amp-bf16", None, "none", 2, S), (4, "fp32", "bf16", "none", 2, S),
    (4, "bf16", None, "full", 2, S), (4, "amp-bf16", None, "none", 2, 256), (4, "bf16", None, "full", 2, 256),
    (8, "fp32", None, "none", 1, S), (4, "amp-bf16", None, "none", 1, 256),
])  # fmt: skip
def test_bloom_under_fsdp_as_traced(world, precision, mp, recompute, version, s):
    """BLOOM under FSDP2 and FSDP1, at its GELU backward's peak (32 tokens) and its attention forward's (256): the
    peak and its phase byte for byte under FSDP2; under FSDP1 within the flat parameter's padding (16 bytes) and
    the 0.02 % of the per-rank padded flat shard the timeline rounds."""
    tr = trace_step(BLOOM, seq_len=s, micro_batch=B, precision=precision, world=world, fsdp=True, fsdp_param_dtype=mp,
                    optimizer_impl="fused", recompute=recompute, fsdp_version=version, attention="eager")
    tl = timeline(architecture_from_config(BLOOM), family="bloom", regime=precision, attention="eager", s=s, b=B,
                  optimizer_impl="fused", world=world, fsdp=True, fsdp_param_dtype=mp, recompute=recompute,
                  fsdp_flat=version == 1, cache_promotes_values=cache_promotes_values())  # fmt: skip
    assert tl.peak.phase == tr.peak_phase
    if version == 2:
        assert tl.peak.live_bytes == tr.peak
    else:
        assert abs(tl.peak.live_bytes - tr.peak) <= 0.0002 * tr.peak
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert abs(tl.phase_peaks[phase] - tr.phase_peaks[phase]) <= 16, phase


from test_timeline import LAYERNORM_FAMILIES as NEOX_FALCON  # noqa: E402  (tests/ is on the path under pytest)


@pytest.mark.parametrize("name", NEOX_FALCON)
@pytest.mark.parametrize("world,precision,mp,recompute,version", [
    (4, "fp32", None, "none", 2), (4, "amp-bf16", None, "none", 2), (4, "fp32", "bf16", "none", 2),
    (4, "bf16", None, "full", 2), (8, "fp32", None, "none", 1), (4, "amp-bf16", None, "none", 1),
])  # fmt: skip
def test_neox_and_falcon_under_fsdp_as_traced(name, world, precision, mp, recompute, version):
    """GPT-NeoX and Falcon (SDPA, the cache off as the realistic accounting runs them) under FSDP2, byte for byte, and
    FSDP1, within its flat parameter's padding."""
    cfg = NEOX_FALCON[name]
    tr = trace_step(cfg, seq_len=S, micro_batch=B, precision=precision, world=world, fsdp=True, fsdp_param_dtype=mp,
                    optimizer_impl="fused", recompute=recompute, fsdp_version=version)
    tl = timeline(architecture_from_config(cfg), family=cfg["model_type"], regime=precision, attention="sdpa", s=S,
                  b=B, optimizer_impl="fused", world=world, fsdp=True, fsdp_param_dtype=mp, recompute=recompute,
                  fsdp_flat=version == 1, use_cache=False)  # fmt: skip
    assert tl.peak.phase == tr.peak_phase
    assert abs(tl.peak.live_bytes - tr.peak) <= (0 if version == 2 else 32)
    for phase in ("baseline", "input", "optimizer", "zero_grad"):
        assert abs(tl.phase_peaks[phase] - tr.phase_peaks[phase]) <= (0 if version == 2 else 32), phase


OPT = dict(model_type="opt", hidden_size=64, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
           max_position_embeddings=256, word_embed_proj_dim=64, dropout=0.0, attention_dropout=0.0, use_cache=False)


@pytest.mark.parametrize("world,precision,mp,recompute,version,s", [
    (1, "fp32", None, "none", 0, 256), (1, "amp-bf16", None, "full", 0, 256), (1, "bf16", None, "none", 0, 256),
    (4, "fp32", None, "none", 2, S), (4, "amp-bf16", None, "none", 2, S), (4, "fp32", "bf16", "none", 2, S),
    (4, "bf16", None, "full", 2, S), (8, "fp32", None, "none", 1, S), (4, "amp-bf16", None, "none", 1, S),
])  # fmt: skip
def test_opt_as_traced_within_its_bound(world, precision, mp, recompute, version, s):
    """OPT (ReLU, whose output is fc2's saved input, kept through the ReLU's backward: two ffn-wide gradients as the
    generic MLP counts; its learned positions' b x s indices saved to the end; under autocast every bias's cast in
    autocast's cache and fc2's weight cast freed by its backward), on one GPU (version 0) and under FSDP2 and FSDP1:
    within 0.05 % of the trace (a few hundred bytes below, a bias gradient's ordering) at the same peak moment."""
    sharded = version > 0
    tr = trace_step(OPT, seq_len=s, micro_batch=B, precision=precision, world=world, fsdp=sharded,
                    fsdp_param_dtype=mp, optimizer_impl="fused", recompute=recompute, fsdp_version=version or 2)
    tl = timeline(architecture_from_config(OPT), family="opt", regime=precision, attention="sdpa", s=s, b=B,
                  optimizer_impl="fused", world=world, fsdp=sharded, fsdp_param_dtype=mp, recompute=recompute,
                  fsdp_flat=version == 1, use_cache=False)  # fmt: skip
    assert tl.peak.phase == tr.peak_phase
    assert abs(tl.peak.live_bytes - tr.peak) <= 0.0005 * tr.peak
