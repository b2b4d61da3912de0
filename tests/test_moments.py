"""The step's moments by kind (``memcalc.memory.engine.moments``): every part of the shipped timelines has a kind, and the
largest moment of the every-layer replay is the estimate's peak_allocated."""

import pytest

import memcalc
from memcalc.api import build_input
from memcalc.inputs.plan import to_plan
from memcalc.memory.engine.moments import KINDS, OTHER, kind_of, step_moments
from test_stack import PLANS

TITAN = dict(framework="torchtitan", fsdp="FULL_SHARD", fsdp_version=2, gpu="h100")
MORE = {
    "ZeRO-1": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=1),
    "ZeRO-0": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=0),
    "ZeRO-2, optimizer offload": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=2, offload_optimizer="cpu"),
    "ZeRO-3, offload": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=3, offload_optimizer="cpu",
                            offload_params="cpu"),
    "ZeRO-3, LoRA": dict(model="llama-2-7b", gpus=8, seq_len=2048, stage=3, lora_rank=8),
    "FSDP1, offload": dict(model="llama-3-8b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=1,
                           offload_params="cpu"),
    "FSDP1, LoRA": dict(model="llama-2-7b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=1, lora_rank=8),
    "FSDP1, no wrap": dict(model="qwen3-0.6b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=1,
                           fsdp_auto_wrap="none"),
    "QLoRA": dict(model="llama-2-7b", gpus=1, seq_len=2048, lora_rank=16, quantize="nf4", precision="bf16"),
    "OPT": dict(model="opt-1.3b", gpus=1, seq_len=1024, precision="amp-bf16"),
    "Falcon": dict(model="falcon-7b", gpus=1, seq_len=1024, precision="amp-bf16"),
    "DDP, fp32, eager": dict(model="mistral-7b", gpus=2, seq_len=1024, ddp=True, precision="fp32", attention="eager"),
    "8-bit AdamW": dict(model="qwen2-7b", gpus=1, seq_len=1024, optimizer="adamw-8bit", precision="bf16"),
    "Qwen3 MoE, FSDP2": dict(model="qwen3-30b-a3b", gpus=8, seq_len=1024, fsdp="FULL_SHARD", fsdp_version=2),
    "chunked loss": dict(model="llama-3-8b", gpus=1, seq_len=1024, loss="chunked:8", precision="bf16"),
    "in-backward step": dict(model="qwen3-0.6b", gpus=1, seq_len=1024, optimizer_impl="in-backward", precision="bf16"),
    "CP 2": dict(model="llama-3-8b", gpus=16, cp=2, seq_len=8192, **TITAN),
    "HSDP, ZeRO-2-like": dict(model="llama-3-8b", gpus=16, seq_len=2048, fsdp="_HYBRID_SHARD_ZERO2", fsdp_version=2,
                              shard_group=8),
}


@pytest.mark.parametrize("name", [*PLANS, *MORE])
def test_every_part_of_the_shipped_timelines_has_a_kind(name):
    plan = to_plan(build_input(**{**PLANS, **MORE}[name]))
    assert plan.accounting == "realistic", name
    for stage in range(plan.pp):
        unnamed = {n for m in step_moments(plan, stage) for n, _ in m.parts if kind_of(n) == OTHER}
        assert not unnamed, (name, unnamed)


PEAKS = {
    "FSDP2": PLANS["FSDP2, llama-3-8b"],
    "DDP": PLANS["DDP"],
    "ZeRO-3": PLANS["ZeRO-3"],
    "TP + SP": PLANS["FSDP2, TP 8 + SP, full recompute"],
    "pipeline stage": PLANS["PP 4, 1F1B"],
}


@pytest.mark.parametrize("name", list(PEAKS))
def test_the_largest_moment_is_the_estimate_s_peak(name):
    r = memcalc.estimate(**PEAKS[name], timeline=True)
    moments = r.memory.timeline.moments
    totals = [sum(m.bytes.values()) for m in moments]
    assert max(totals) == r.memory.per_gpu.peak_allocated
    assert all(set(KINDS) <= set(m.bytes) for m in moments)
    peak = moments[totals.index(max(totals))]
    assert (peak.phase, peak.label) == (r.memory.timeline.peak_phase, r.memory.timeline.peak_moment)


def test_ddp_buckets_are_communication_buffers_all_step():
    r = memcalc.estimate(**PLANS["DDP"], timeline=True)
    buckets = {m.bytes["communication_buffers"] for m in r.memory.timeline.moments}
    assert len(buckets) == 1 and buckets.pop() > 0


def test_moments_only_when_asked():
    r = memcalc.estimate(**PEAKS["FSDP2"])
    assert r.memory.timeline.moments == []
    with pytest.raises(memcalc.errors.InputError, match="timeline"):
        memcalc.estimate(**PEAKS["FSDP2"], timeline="yes")


def test_the_largest_micro_batch_that_fits_comes_with_its_moments():
    r = memcalc.estimate(model="qwen3-0.6b", gpus=1, seq_len=1024, precision="bf16", gpu="h100", micro_batch="auto",
                         timeline=True)
    assert r.training.micro_batch_auto and r.memory.timeline.moments
    assert max(sum(m.bytes.values()) for m in r.memory.timeline.moments) == r.memory.per_gpu.peak_allocated


def test_a_part_no_rule_names_is_other_and_shows_as_its_own_column():
    from memcalc.memory.engine.moments import StepMoment
    from memcalc.report.timeline import kinds

    assert kind_of("a buffer nobody named yet") == OTHER
    assert kind_of("layer activations (layers 0..3)") == "activations"
    m = StepMoment("forward", "x", (("parameters", 10), ("a buffer nobody named yet", 5)))
    assert m.by_kind()[OTHER] == 5 and sum(m.by_kind().values()) == m.total == 15
    r = memcalc.estimate(**PEAKS["FSDP2"], timeline=True)
    assert kinds(r.memory.timeline.moments) == list(KINDS)
