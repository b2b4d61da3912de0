"""DeepSpeed ZeRO-3's parameter coordinator, replayed (memcalc.memory.overlays.zero3): what a step all-gathers and keeps.

The figures marked "measured" come from real DeepSpeed 0.19.8 runs on CPU (gloo, 2 ranks, bf16, the third
step), as tests/validation measures them; the rest are properties of the coordinator's rules.
"""

import pytest

import memcalc
from memcalc.model.architecture import Architecture
from memcalc.inputs.presets import load_model
from memcalc.memory.overlays.zero3 import Zero3Settings, persistent, replay

# memcalc.validation.measure.TinyGPT at its defaults: Ψ = 107,520, a tied 100 x 64 embedding.
TINY = Architecture(family=None, layers=2, hidden=64, heads=4, vocab=100, max_positions=16, tied_embeddings=True,
                    fused_qkv=True)  # fmt: skip
TINY4 = TINY.model_copy(update={"layers": 4})
PSI, PSI4, EMBED = 107_520, 207_488, 6_400
NONE = Zero3Settings(param_persistence_threshold=0)


def test_first_step_gathers_every_parameter_on_each_use():
    g = replay(TINY, 2, NONE, first_step=True)
    assert (g.forward, g.backward, g.after_step) == (PSI + EMBED, PSI + EMBED, 0)  # measured: 227,840 bytes each
    assert g.forward_calls == g.backward_calls == 16  # 15 modules with parameters, the tied head once more


def test_first_step_pads_each_gather_to_the_ranks():
    # 4 ranks, odd sizes: every parameter padded to a multiple of 4 on each use, the tied embedding twice
    odd = Architecture(family=None, layers=3, hidden=30, heads=3, vocab=103, max_positions=15, tied_embeddings=True,
                       fused_qkv=True)  # fmt: skip
    from memcalc.memory.accountings import frameworks as fw

    padded = [-(-(s[0] * (s[1] if len(s) > 1 else 1)) // 4) * 4 for u in fw.units(odd) for s in u.shapes]
    g = replay(odd, 4, Zero3Settings(prefetch_bucket_size=3_000, param_persistence_threshold=0), first_step=True)
    assert g.forward == g.backward == sum(padded) + -(-(103 * 30) // 4) * 4


def test_small_model_stays_gathered_from_forward_to_backward():
    # measured: the defaults gather 215,040 bytes in forward and nothing in backward, all at the first fetch
    g = replay(TINY, 2, NONE)
    assert (g.forward, g.backward, g.forward_calls) == (PSI, 0, 1)
    assert g.peak_live == PSI


@pytest.mark.parametrize("kw", [dict(max_reuse_distance=0), dict(max_live_parameters=0)])
def test_either_reuse_or_prefetch_alone_keeps_parameters(kw):
    # measured: reuse distance 0 (prefetching marks what comes back) or live 0 (no prefetch, reuse keeps) change nothing
    g = replay(TINY, 2, Zero3Settings(param_persistence_threshold=0, **kw))
    assert (g.forward, g.backward) == (PSI, 0)


@pytest.mark.parametrize("arch", [TINY, TINY4, load_model("gpt2"), load_model("llama-2-7b")], ids=lambda a: a.name or "tiny")
def test_no_reuse_and_no_prefetch_is_the_first_step(arch):
    s = Zero3Settings(max_reuse_distance=0, max_live_parameters=0, param_persistence_threshold=0)
    assert replay(arch, 8, s) == replay(arch, 8, s, first_step=True)


@pytest.mark.parametrize(
    ("kw", "forward", "backward"),
    [  # measured on 2 ranks, 4 layers, bf16 (bytes / 2)
        (dict(prefetch_bucket_size=20_000), 414_976 // 2, 0),
        (dict(prefetch_bucket_size=20_000, max_reuse_distance=60_000), 463_616 // 2, 0),
        (dict(prefetch_bucket_size=0, max_reuse_distance=100_000), 427_776 // 2, 315_008 // 2),
        (dict(max_live_parameters=50_000, max_reuse_distance=30_000), 452_352 // 2, 315_392 // 2),
    ],
)
def test_measured_steady_states(kw, forward, backward):
    g = replay(TINY4, 2, Zero3Settings(param_persistence_threshold=0, **kw))
    assert (g.forward, g.backward) == (forward, backward)


def test_no_prefetch_regathers_in_backward_what_lies_beyond_the_reuse_distance():
    # Without prefetching, a layer's parameters stay gathered when fewer than max_reuse_distance elements run
    # between their forward and their backward use. One layer holds 49,984; the last layer's own parameters
    # come back after the final norm and the head (128 + 6,400 + 128 in between), the one before after two layers more.
    layer = 49_984
    kept_last = replay(TINY4, 2, Zero3Settings(param_persistence_threshold=0, prefetch_bucket_size=0,
                                               max_reuse_distance=2 * layer))  # fmt: skip
    none_kept = replay(TINY4, 2, Zero3Settings(param_persistence_threshold=0, prefetch_bucket_size=0, max_reuse_distance=1))
    # Everything again, except the head: its backward use follows its forward use with nothing in between.
    assert none_kept.backward == PSI4
    assert none_kept.backward - kept_last.backward >= layer  # at least the last layer stayed


def test_persistent_parameters_are_never_gathered_in_a_step():
    everything = Zero3Settings(param_persistence_threshold=10**9)
    g = replay(TINY, 2, everything)
    assert (g.forward, g.backward, g.after_step) == (0, 0, PSI)
    # measured: threshold 5,000 keeps wpe, the norms, the biases and the 64 x 64 projections whole
    whole = persistent(TINY, Zero3Settings(param_persistence_threshold=5_000))
    assert sum(whole.values()) == 11_008
    g = replay(TINY, 2, Zero3Settings(param_persistence_threshold=5_000))
    assert (g.forward, g.backward, g.after_step) == (PSI - 11_008, 0, 11_008)


def test_padding_to_the_data_parallel_size():
    # 4 ranks, odd sizes (measured: 171,984 / 116,416 / 3,664 bytes in fp32)
    odd = Architecture(family=None, layers=3, hidden=30, heads=3, vocab=103, max_positions=15, tied_embeddings=True,
                       fused_qkv=True)  # fmt: skip
    s = Zero3Settings(prefetch_bucket_size=3_000, max_live_parameters=9_000, max_reuse_distance=4_000,
                      param_persistence_threshold=100)  # fmt: skip
    g = replay(odd, 4, s)
    assert (4 * g.forward, 4 * g.backward, 4 * g.after_step) == (171_984, 116_416, 3_664)


def test_estimate_uses_the_steady_state_and_reports_the_first_step():
    r = memcalc.estimate(model=TINY, stage=3, gpus=2, precision="bf16-mixed", accounting="implementation",
                         persistence_threshold=0)  # fmt: skip
    ag = {(x.phase, x.op): x.payload_bytes for x in r.communication.collectives}
    assert ag == {("forward", "all-gather"): 2 * PSI, ("backward", "reduce-scatter"): 2 * PSI}
    assert any(f"{2 * (PSI + EMBED):,} bytes in forward" in n for n in r.notes)
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    assert rows["gathered_parameters"] == 2 * PSI
    regather = memcalc.estimate(model=TINY, stage=3, gpus=2, precision="bf16-mixed", accounting="implementation",
                                persistence_threshold=0, max_reuse_distance=0, max_live_parameters=0)  # fmt: skip
    ag = {(x.phase, x.op): x.payload_bytes for x in regather.communication.collectives}
    assert ag[("backward", "all-gather")] == 2 * (PSI + EMBED)
    first = memcalc.estimate(model=TINY, stage=3, gpus=2, precision="bf16-mixed", accounting="implementation",
                             persistence_threshold=0, zero3_step="first")  # fmt: skip
    ag = {(x.phase, x.op): x.payload_bytes for x in first.communication.collectives}
    assert ag[("forward", "all-gather")] == ag[("backward", "all-gather")] == 2 * (PSI + EMBED)
    assert any("Every later step (max_reuse_distance" in n and f"{2 * PSI:,} bytes in forward" in n for n in first.notes)


def test_large_models_regather_most_of_backward_with_the_defaults():
    # 70B: a layer is ~0.86B elements, so a 1e9 reuse distance keeps about the last layer from forward to backward.
    a = load_model("llama-2-70b")
    g = replay(a, 64, Zero3Settings())
    first = replay(a, 64, Zero3Settings(), first_step=True)
    assert first.backward > g.backward > 0.95 * first.backward
    # Prefetching runs from the end of forward into backward's first layers, so forward can gather more than in
    # the first step; the step as a whole gathers less.
    assert g.forward + g.backward < first.forward + first.backward


@pytest.mark.parametrize("flag", ["max_reuse_distance", "max_live_parameters", "prefetch_bucket_size", "persistence_threshold"])
def test_settings_are_refused_where_they_do_not_apply(flag):
    with pytest.raises(ValueError, match="--stage 3"):
        memcalc.estimate(model="gpt2", stage=2, gpus=8, accounting="implementation", **{flag: 0})
    with pytest.raises(ValueError, match="--accounting realistic or implementation"):
        memcalc.estimate(model="gpt2", stage=3, gpus=8, accounting="deepspeed-estimator", **{flag: 0})
    # the paper's accounting (here what auto answers without a sequence length) keeps them and says they are unused
    paper = memcalc.estimate(model="gpt2", stage=3, gpus=8, **{flag: 0})
    assert paper.accounting == "paper" and any("coordinator settings given" in n for n in paper.notes)
    with pytest.raises(ValueError, match="0 or more"):
        memcalc.estimate(model="gpt2", stage=3, gpus=8, accounting="implementation", **{flag: -1})


def test_zero3_step_is_checked():
    with pytest.raises(ValueError, match="accepted: steady, first"):
        memcalc.estimate(model="gpt2", stage=3, gpus=8, accounting="implementation", zero3_step="last")
    with pytest.raises(ValueError, match="--zero3-step"):
        memcalc.estimate(model="gpt2", stage=2, gpus=8, accounting="implementation", zero3_step="first")


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_archs = st.builds(
    lambda family, layers, hidden, vocab, tied: Architecture(
        family=family, layers=layers, hidden=hidden, heads=4, vocab=vocab, max_positions=16, tied_embeddings=tied,
        fused_qkv=family != "llama", gated_mlp=family == "llama", position="rotary" if family == "llama" else "learned",
        norm="rmsnorm" if family == "llama" else "layernorm", norm_bias=family != "llama",
        qkv_bias=family != "llama", out_bias=family != "llama", mlp_bias=family != "llama"),
    st.sampled_from([None, "gpt2", "llama"]), st.integers(1, 4), st.sampled_from([32, 48, 64]),
    st.integers(50, 130), st.booleans(),
)  # fmt: skip
_settings = st.builds(
    Zero3Settings, max_reuse_distance=st.sampled_from([0, 1, 5_000, 30_000, 10**9]),
    max_live_parameters=st.sampled_from([0, 5_000, 30_000, 10**9]),
    prefetch_bucket_size=st.sampled_from([0, 1, 3_000, 20_000, 5 * 10**7]),
    param_persistence_threshold=st.sampled_from([0, 100, 5_000]),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(arch=_archs, s=_settings, dp=st.sampled_from([1, 2, 3, 8]))
def test_a_later_step_never_gathers_more_than_the_first(arch, s, dp):
    """Each gather serves one use of a parameter, so a later step gathers at most what the first gathers (which is
    every use); it always holds at least the largest module it runs; without reuse or prefetch the two are equal."""
    later, first = replay(arch, dp, s), replay(arch, dp, s, first_step=True)
    assert later.forward + later.backward <= first.forward + first.backward
    whole = persistent(arch, s)
    from memcalc.memory.overlays.zero3 import _called

    _, mods, numel = _called(arch)
    largest = max(sum(numel[p] for p in set(m.params) if p not in whole) for m in mods.values())
    assert later.peak_live >= largest and first.peak_live >= largest
    if s.max_reuse_distance == 0 and (s.prefetch_bucket_size == 0 or s.max_live_parameters == 0):
        assert (later.forward, later.backward) == (first.forward - _persistent_uses(arch, whole, dp, "f"),
                                                   first.backward - _persistent_uses(arch, whole, dp, "b"))  # fmt: skip


def _persistent_uses(arch, whole, dp, phase):
    """Padded elements the first step gathers for persistent parameters (later steps keep them whole)."""
    from memcalc.memory.overlays.zero3 import _called

    events, mods, numel = _called(arch)
    cut = events.index(("backward", ""))
    part = events[:cut] if phase == "f" else events[cut:]
    return sum(-(-numel[p] // dp) * dp for kind, m in part if kind == "fetch" for p in set(mods[m].params) if p in whole)
