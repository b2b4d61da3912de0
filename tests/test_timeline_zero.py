"""DeepSpeed ZeRO-0/1/2 under the realistic accounting (``memcalc.memory.timeline_zero``).

The traced check (real DeepSpeed ranks on CPU) is tests/validation/test_deepspeed_timeline.py; the peaks pinned here
are what that trace measured for the same tiny Llama (``memcalc.validation.trace_deepspeed``, re-runnable)."""

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.memory.timeline import timeline
from memcalc.memory.timeline_zero import partition, worst_rank, zero_timeline
from memcalc.model.hf_config import architecture_from_config

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, tie_word_embeddings=False)
ARCH = architecture_from_config(LLAMA)
PSI = 158_016


def tl(stage, dp, **kw):
    return zero_timeline(ARCH, family="llama", stage=stage, dp=dp, attention="sdpa", s=32, b=2, **kw)


def test_partition_as_deepspeed_lays_it_out():
    # P = ceil(Ψ / 2N)·2; Σ: the parameters overlapping rank 0's slice of the flat buffer (traced facts)
    assert partition(ARCH, 2)[:2] == (79_008, 83_072)
    assert partition(ARCH, 4)[:2] == (39_504, 40_960)
    assert partition(ARCH, 1)[:2] == (PSI, PSI)
    # the rank whose slice cuts the most parameters holds the largest gradient partition
    assert [partition(ARCH, 4, r)[1] for r in range(4)] == [40_960, 44_160, 46_080, 44_224]
    assert worst_rank(ARCH, 4) == 2


@pytest.mark.parametrize("stage,dp,bucket,impl,peak,phase", [
    (0, 2, 2000, "for-loop", 3_423_380, "optimizer.adamw"),
    (1, 2, 2000, "for-loop", 2_212_816, "optimizer.adamw"),
    (2, 2, 2000, "for-loop", 2_212_816, "optimizer.adamw"),
    # DeepSpeed's default bucket (1 GB in bf16) holds every gradient: the bucket's flatten copy still alive when the
    # gradient partition is allocated, as in one of the traced runs (the others released it first: 1,001,728,856)
    (2, 2, 500_000_000, "for-loop", 1_001_746_900, "backward.epilogue"),
    (2, 2, 2000, "fused", 2_056_536, "backward"),
])  # fmt: skip
def test_peaks_as_traced(stage, dp, bucket, impl, peak, phase):
    t = tl(stage, dp, bucket=bucket, optimizer_impl=impl)
    assert t.peak.phase.split(".layer")[0] == phase
    assert abs(t.peak.live_bytes - peak) <= 256


def test_states_and_step_follow_the_formulas():
    p = partition(ARCH, 2)[0]
    t = tl(1, 2, bucket=2000, optimizer_impl="for-loop")
    base = t.moments[0].live_bytes
    assert base == 2 * 2 * p + 4 * p + 8 * p + 4 + 64  # flat bf16, fp32 master, moments, step, rotary buffers
    inputs = 8 * 2 * 32
    assert t.phase_peaks["optimizer.adamw"] == base + inputs + 4 * p + 8 * p  # fp32 gradient + for-loop sqrt, quotient
    assert tl(1, 2, bucket=2000, optimizer_impl="foreach").phase_peaks["optimizer.adamw"] == base + inputs + 8 * p
    z0 = tl(0, 2, bucket=2000, optimizer_impl="fused")
    assert z0.moments[0].live_bytes == 14 * PSI + 4 * 21 + 64  # bf16, fp32 copies, moments, 21 step scalars
    assert z0.phase_peaks["backward.epilogue"] == z0.moments[0].live_bytes + inputs + 4 * PSI


def test_activations_are_the_bf16_models():
    plain = timeline(ARCH, family="llama", regime="bf16", attention="sdpa", s=32, b=2, optimizer_impl="fused",
                     position_ids=False)  # fmt: skip
    z = tl(1, 4, bucket=2000)
    shift = z.moments[0].live_bytes - plain.moments[0].live_bytes
    assert z.phase_peaks["loss"] - plain.phase_peaks["loss"] == shift  # only the states differ in forward


def test_bad_input():
    with pytest.raises(InputError, match="stages 0, 1, 2"):
        tl(3, 2)
    with pytest.raises(InputError, match="rank"):
        tl(1, 2, rank=2)


def test_estimate_picks_the_realistic_accounting(tmp_path):
    import json

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA, hidden_size=256, intermediate_size=704, vocab_size=32000)))
    kw = dict(hf_config=str(cfg), gpus=8, precision="bf16-mixed", seq_len=512, micro_batch=2)
    r1, r2 = memcalc.estimate(stage=1, **kw), memcalc.estimate(stage=2, **kw)
    assert r1.accounting == r2.accounting == "realistic"
    assert r2.memory.per_gpu.peak_allocated < r1.memory.per_gpu.peak_allocated  # ZeRO-2 frees gradients in backward
    assert any("DeepSpeed ZeRO-2" in n for n in r2.notes)
    r3 = memcalc.estimate(stage=3, **kw)
    assert r3.accounting == "realistic" and any("DeepSpeed ZeRO-3" in n for n in r3.notes)
    off = memcalc.estimate(stage=2, offload_optimizer="cpu", **kw)
    assert off.accounting == "paper" and any("offload" in n for n in off.notes)
    with pytest.raises(InputError, match="offload"):
        memcalc.estimate(stage=2, offload_optimizer="cpu", accounting="realistic", **kw)


def test_reduce_bucket_size(tmp_path):
    import json

    from typer.testing import CliRunner

    from memcalc.cli.app import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    kw = dict(hf_config=str(cfg), gpus=2, stage=2, precision="bf16-mixed", seq_len=32, micro_batch=2,
              optimizer_impl="for-loop", device="cpu", attention="sdpa")  # fmt: skip
    default, small = memcalc.estimate(**kw), memcalc.estimate(reduce_bucket_size=2000, **kw)
    # the traced peaks of the same step (on CPU) with DeepSpeed's default bucket (the run whose flatten copy outlived the
    # partition's allocation: test_peaks_as_traced) and with 2,000 elements
    assert abs(default.memory.per_gpu.peak_allocated - 1_001_746_900) <= 256
    assert abs(small.memory.per_gpu.peak_allocated - 2_212_816) <= 256
    with pytest.raises(InputError, match="--reduce-bucket-size"):
        memcalc.estimate(params=1e9, fsdp="FULL_SHARD", gpus=8, reduce_bucket_size=1000)
    out = CliRunner().invoke(app, ["estimate", "--hf-config", str(cfg), "--stage", "2", "--gpus", "2", "--precision",
                                   "bf16-mixed", "--seq-len", "32", "--reduce-bucket-size", "0"])  # fmt: skip
    assert out.exit_code == 2 and "reduce" in out.output
    for bad in (0, -5):  # one line naming the flag and what it accepts (not an internal field's name)
        with pytest.raises(InputError, match=r"^--reduce-bucket-size .* must be positive; give a positive count"):
            memcalc.estimate(params=1e9, stage=2, gpus=8, reduce_bucket_size=bad)
