"""Where FSDP2's units put the embedding and the head (``--fsdp-wrap``, ``memcalc.layout.compose.FSDP_WRAPS``).

The timeline under ``separate`` (torchtitan's ``apply_fsdp`` since v0.2: the embedding a unit resharded after its
forward, [final norm, head] a unit kept gathered after its forward) and ``separate-reshard`` (torchtune's
``custom_sharded_layers: ['tok_embeddings', 'output']``) against the tracer's FSDP2 rank 0 wrapped the same way:
the peak, its phase and every phase's peak but the embedding's forward (not a moment of the timeline), byte for byte.
"""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import memcalc
from memcalc.errors import InputError
from memcalc.layout.compose import FRAMEWORKS, fsdp_wrap
from memcalc.memory.timeline import timeline
from memcalc.model.hf_config import architecture_from_config
from memcalc.validation.trace import trace_step

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
CONFIGS = {
    "llama": LLAMA,
    "bigvocab": dict(LLAMA, vocab_size=2000, num_hidden_layers=4),  # peaks at the loss or the head's backward
    "l4": dict(LLAMA, num_hidden_layers=4, hidden_size=128, intermediate_size=344, vocab_size=250),
    "llama3": dict(LLAMA, hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                   vocab_size=130),  # vocab 130 over 4 or 8 ranks: padded shards
    "qwen3": dict(LLAMA, model_type="qwen3", head_dim=16),
    "phi3": dict(LLAMA, model_type="phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2),
}
S, B = 32, 2


def both(name, world, precision, mp, recompute, opt, wrap):
    cfg = CONFIGS[name]
    tr = trace_step(cfg, seq_len=S, micro_batch=B, precision=precision, world=world, fsdp=True, fsdp_param_dtype=mp,
                    optimizer_impl=opt, recompute=recompute, fsdp_wrap=wrap)  # fmt: skip
    tl = timeline(architecture_from_config(cfg), family=cfg["model_type"], regime=precision, attention="sdpa", s=S,
                  b=B, recompute=recompute, optimizer_impl=opt, world=world, fsdp=True, fsdp_param_dtype=mp,
                  fsdp_wrap=wrap)  # fmt: skip
    return tr, tl


EVERY_PHASE = [  # (config, world, precision, MixedPrecisionPolicy param dtype, recompute, optimizer)
    ("bigvocab", 4, "fp32", None, "none", "fused"),
    ("bigvocab", 4, "amp-bf16", None, "none", "fused"),
    ("bigvocab", 4, "bf16", None, "full", "fused"),
    ("l4", 4, "fp32", None, "none", "fused"),
    ("llama3", 4, "fp32", None, "none", "fused"),
    ("llama3", 4, "amp-bf16", None, "none", "fused"),
    ("qwen3", 4, "fp32", None, "none", "fused"),
    ("phi3", 4, "amp-bf16", None, "none", "fused"),
]  # fmt: skip
PEAK = [  # the peak and its phase (the forward phases of checkpointed or bf16-gathered layers are at layer grain)
    ("bigvocab", 8, "amp-bf16", "bf16", "none", "fused"),
    ("l4", 8, "amp-bf16", "bf16", "none", "foreach"),
    ("llama3", 8, "amp-bf16", "bf16", "none", "foreach"),
    ("llama3", 4, "bf16", None, "full", "fused"),
    ("qwen3", 4, "bf16", None, "full", "fused"),
    ("llama", 4, "amp-bf16", "bf16", "full", "fused"),
]  # fmt: skip


@pytest.mark.parametrize("wrap", ["separate", "separate-reshard"])
@pytest.mark.parametrize("name,world,precision,mp,recompute,opt", EVERY_PHASE)
def test_every_phase_equals_trace(name, world, precision, mp, recompute, opt, wrap):
    tr, tl = both(name, world, precision, mp, recompute, opt, wrap)
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    assert {k: tl.phase_peaks[k] for k in tr.phase_peaks if k != "forward"} == {
        k: v for k, v in tr.phase_peaks.items() if k != "forward"}
    assert all(m.live_bytes == sum(n for _, n in m.parts) for m in tl.moments)


@pytest.mark.parametrize("wrap", ["separate", "separate-reshard"])
@pytest.mark.parametrize("name,world,precision,mp,recompute,opt", PEAK)
def test_peak_equals_trace(name, world, precision, mp, recompute, opt, wrap):
    tr, tl = both(name, world, precision, mp, recompute, opt, wrap)
    assert (tl.peak.live_bytes, tl.peak.phase) == (tr.peak, tr.peak_phase)
    for phase in ("baseline", "input", "optimizer", "zero_grad") + tuple(
            k for k in tr.phase_peaks if k.startswith("backward")):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase], phase


def test_units_of_their_own_hold_less_than_the_root():
    """At a big vocabulary the root's gathered embedding and head dominate: separate units free them outside their
    own forward and backward (traced: 5,443,236 bytes under the root wrap, 4,747,700 and 4,746,404 without)."""
    peaks = {w: both("bigvocab", 4, "fp32", None, "none", "fused", w)[0].peak
             for w in ("root", "separate", "separate-reshard")}
    assert peaks == {"root": 5_443_236, "separate": 4_747_700, "separate-reshard": 4_746_404}


def test_tied_embeddings_stay_in_the_root(tmp_path):
    tied = dict(LLAMA, model_type="qwen2", tie_word_embeddings=True)
    arch = architecture_from_config(tied)
    with pytest.raises(InputError, match="tied"):
        timeline(arch, family="qwen2", regime="fp32", attention="sdpa", s=S, b=B, world=4, fsdp_wrap="separate")
    with pytest.raises(InputError, match="untied"):
        trace_step(tied, seq_len=S, micro_batch=B, world=4, fsdp=True, fsdp_wrap="separate")
    assert fsdp_wrap(None, FRAMEWORKS["torchtitan"], tied=True) == "root"
    with pytest.raises(InputError, match="accepted for tied embeddings: root"):
        fsdp_wrap("separate-reshard", FRAMEWORKS["torchtune"], tied=True)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(tied, num_hidden_layers=4, hidden_size=512, intermediate_size=1024,
                                   num_attention_heads=8, num_key_value_heads=8, vocab_size=32000)))  # fmt: skip
    kw = dict(hf_config=str(cfg), fsdp="FULL_SHARD", fsdp_version=2, gpus=8, precision="bf16-mixed", seq_len=256)
    assert any("--fsdp-wrap root" in n for n in memcalc.estimate(framework="torchtitan", **kw).notes)
    with pytest.raises(InputError, match="ties its embedding"):
        memcalc.estimate(fsdp_wrap="separate", **kw)


def test_each_framework_wraps_as_its_code_does():
    kw = dict(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, precision="bf16-mixed", seq_len=4096,
              micro_batch=1, recompute="full", attention="sdpa", gpu="h100")  # fmt: skip
    got = {fw: memcalc.estimate(framework=fw, **kw) for fw in (None, "hf", "torchtitan", "torchtune")}
    wraps = {fw: next(n for n in e.notes if "--fsdp-wrap" in n).split("--fsdp-wrap ")[1].split(":")[0]
             for fw, e in got.items()}
    assert wraps == {None: "root", "hf": "root", "torchtitan": "separate", "torchtune": "separate-reshard"}
    root = memcalc.estimate(fsdp_wrap="root", framework="torchtitan", **kw)
    rows = {w: {r.key: r.bytes for r in e.memory.per_gpu.rows} for w, e in (("root", root), ("separate", got["torchtitan"]))}
    # Llama 3 8B in bf16 over 8 ranks: the root keeps the embedding, the final norm and the head gathered
    # (2 x 128256 x 4096 x 2 + 4096 x 2 bytes) and the last layer's all-gather output at the loss's backward; under
    # torchtitan's wrap the peak is the loss, with the [norm, head] unit gathered and its all-gather output alive
    assert rows["root"]["activations_root_parameters_(gathered)"] == 2 * 128256 * 4096 * 2 + 4096 * 2
    assert rows["separate"]["activations_head_parameters_(gathered)"] == 128256 * 4096 * 2 + 4096 * 2
    assert "activations_root_parameters_(gathered)" not in rows["separate"]
    drop = root.memory.per_gpu.peak_allocated - got["torchtitan"].memory.per_gpu.peak_allocated
    assert 1.3 * 2**30 < drop < 1.5 * 2**30  # the embedding (0.98 GiB) and a layer's all-gather output (0.41 GiB)


def test_bad_wraps_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from memcalc.cli.app import app

    base = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "1024"]
    for extra, says in ((["--fsdp", "FULL_SHARD", "--fsdp-version", "2", "--fsdp-wrap", "seperate"],
                         "did you mean 'separate'"),
                        (["--ddp", "--fsdp-wrap", "separate"], "needs --fsdp with --fsdp-version 2"),
                        (["--fsdp", "FULL_SHARD", "--fsdp-wrap", "separate"], "--fsdp-version 1")):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 2, r.output
        lines = [x for x in r.output.splitlines() if x.strip()]
        assert len(lines) == 1 and says in lines[0], r.output


def test_torchtitan_release_decides_the_wrap():
    from pathlib import Path

    from memcalc.configs import read_torchtitan

    here = Path(__file__).parent / "data" / "configs" / "torchtitan"
    old = read_torchtitan(here / "v0.1.0_llama3_8b.toml", world_size=8)
    assert old.arguments["fsdp_wrap"] == "root" and any("v0.1.0 keeps the embedding" in n for n in old.notes)
    new = read_torchtitan(here / "v0.2.2_llama3_70b.toml", world_size=64)
    assert "fsdp_wrap" not in new.arguments and new.arguments["framework"] == "torchtitan"  # the framework's: separate
