"""DeepSpeed ZeRO-0/1/2 under the realistic accounting (``memcalc.memory.overlays.timeline_zero``).

The traced check (real DeepSpeed ranks on CPU) is tests/validation/test_deepspeed_timeline.py; the peaks pinned here
are what that trace measured for the same tiny Llama (``memcalc.validation.trace_deepspeed``, re-runnable)."""

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.memory.engine.timeline import timeline
from memcalc.memory.overlays.timeline_zero import partition, worst_rank, zero_timeline
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
    # DeepSpeed's default bucket (1 GB in bf16) holds every gradient: the bucket (allocated at the first hook) and
    # the gradients make the peak; the flatten copy for the all-reduce dies before the partition is allocated
    (2, 2, 500_000_000, "for-loop", 1_001_728_856, "backward"),
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


@pytest.mark.parametrize("stage,dp,peak,phase", [
    (0, 2, 3_160_980, "backward.epilogue"), (1, 2, 2_686_156, "backward"), (2, 2, 2_686_156, "backward"),
])  # fmt: skip
def test_fp32_states_and_peaks_as_traced(stage, dp, peak, phase):
    """Neither fp16 nor bf16 enabled: the flat buffer, the gradients and the bucket in fp32; ZeRO-1/2 still clone the
    fp32 master partition; ZeRO-0 keeps no fp32 copies (the client optimizer steps the parameters). Peaks as the
    traced DeepSpeed ranks measured them, within 256 bytes (tests/validation/test_deepspeed_timeline.py)."""
    t = tl(stage, dp, bucket=2000, optimizer_impl="for-loop", precision="fp32")
    p = partition(ARCH, dp)[0]
    base = (4 * 2 * p + 4 * p + 8 * p + 4 if stage else 4 * PSI + 8 * PSI + 4 * 21) + 64
    assert t.moments[0].live_bytes == base
    assert (t.peak.phase, abs(t.peak.live_bytes - peak) <= 256) == (phase, True)
    activations = timeline(ARCH, family="llama", regime="fp32", attention="sdpa", s=32, b=2, optimizer_impl="fused",
                           position_ids=False)  # fmt: skip
    assert t.phase_peaks["loss"] - activations.phase_peaks["loss"] == base - activations.moments[0].live_bytes


def test_fp32_is_refused_with_offload_and_lora_and_takes_the_realistic_accounting_in_estimate(tmp_path):
    import json

    with pytest.raises(InputError, match="fp32 DeepSpeed"):
        tl(2, 2, precision="fp32", offload=True)
    with pytest.raises(InputError, match="precision 'fp16'"):
        tl(2, 2, precision="fp16")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA, hidden_size=256, intermediate_size=704, vocab_size=32000)))
    kw = dict(hf_config=str(cfg), gpus=8, precision="fp32", seq_len=512, micro_batch=2)
    fp32, bf16 = memcalc.estimate(stage=2, **kw), memcalc.estimate(stage=2, **(kw | dict(precision="bf16-mixed")))
    assert fp32.accounting == bf16.accounting == "realistic"
    assert fp32.memory.per_gpu.peak_allocated > bf16.memory.per_gpu.peak_allocated
    assert memcalc.estimate(stage=3, **kw).accounting == "realistic"
    for other in (dict(stage=3, offload_optimizer="cpu"), dict(stage=2, offload_optimizer="cpu")):
        r = memcalc.estimate(**other, **kw)
        assert r.accounting == "paper" and any("fp32" in n for n in r.notes), other


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
    assert off.accounting == "realistic" and any("ZeRO-1/2 offload_optimizer" in n for n in off.notes)
    assert off.memory.per_gpu.peak_allocated < r2.memory.per_gpu.peak_allocated
    # ZeRO-1 with overlap_comm reduces in its hooks, which the traced step shows holding more: the paper answers
    ov = memcalc.estimate(stage=1, overlap_comm=True, **kw)
    assert ov.accounting == "paper" and any("overlap_comm" in n for n in ov.notes)
    with pytest.raises(InputError, match="zero-1 with overlap_comm"):
        memcalc.estimate(stage=1, overlap_comm=True, accounting="realistic", **kw)
    for other in (dict(fsdp="FULL_SHARD"), dict(stage=3), dict(stage=0)):
        with pytest.raises(InputError, match="^--overlap-comm: .*needs --stage 1 or 2"):
            memcalc.estimate(overlap_comm=True, **other, **kw)


def test_overlap_comm_holds_a_second_bucket_as_traced():
    # the traced ZeRO-2 step with overlap_comm (trace_deepspeed(..., overlap_comm=True)): the end of backward at
    # 1,504,404 bytes, a second bucket (2,000 bf16 elements) above the step without it; the peak is the step's
    one, two = tl(2, 2, bucket=2000, optimizer_impl="for-loop"), tl(2, 2, bucket=2000, optimizer_impl="for-loop",
                                                                    overlap_comm=True)  # fmt: skip
    assert two.phase_peaks["backward.epilogue"] - one.phase_peaks["backward.epilogue"] == 2 * 2000
    assert abs(two.phase_peaks["backward.epilogue"] - 1_504_404) <= 256
    assert abs(two.peak.live_bytes - 2_212_816) <= 256 and two.peak.phase == "optimizer.adamw"


def test_offload_keeps_the_flat_buffer_the_buckets_and_the_slices_on_their_way_to_the_host():
    """offload_optimizer under ZeRO-1/2 (DeepSpeed 0.19 stage_1_and_2.py with cpu_offload): the GPU keeps the bf16 flat
    buffer and a bf16 buffer of the largest parameter; no fp32 master, moments or gradient partition; each reduced
    slice is copied to fp64 for its norm (8 bytes an element) on its way to the host; the step adds nothing."""
    p, inputs, emb = partition(ARCH, 2)[0], 8 * 2 * 32, 512 * 64
    for stage in (1, 2):
        t = tl(stage, 2, bucket=30_000, offload=True)
        base = t.moments[0].live_bytes
        assert base == 2 * 2 * p + 2 * emb + 64  # flat bf16, staging buffer (embedding and head: 32,768), rotary
        assert t.phase_peaks["optimizer"] == t.phase_peaks["zero_grad"] == base + inputs
        assert t.peak.live_bytes < tl(stage, 2, bucket=30_000).peak.live_bytes
    # ZeRO-1 reduces every gradient at the end of backward in parameter order; the embedding (larger than the bucket)
    # is cloned, then reduced alone when the next gradient overflows the bucket: rank 0 holds all of it, so its fp64
    # copy (8 x 32,768) rides on every gradient still waiting
    z1 = tl(1, 2, bucket=30_000, offload=True)
    assert z1.phase_peaks["backward.epilogue"] == z1.moments[0].live_bytes + inputs + 2 * 30_000 + 2 * PSI + 8 * emb
    # one bucket for every gradient: the gradients, then the last reduction's slices (smaller than 2Ψ here)
    big = tl(1, 2, bucket=10**6, offload=True)
    assert big.phase_peaks["backward.epilogue"] == big.moments[0].live_bytes + inputs + 2 * 10**6 + 2 * PSI
    with pytest.raises(InputError, match="stages 1 and 2"):
        tl(0, 2, offload=True)
    with pytest.raises(InputError, match="overlap_comm"):
        tl(1, 2, offload=True, overlap_comm=True)


def test_offload_host_rows(tmp_path):
    import json

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    r = memcalc.estimate(hf_config=str(cfg), gpus=2, gpus_per_node=2, stage=2, offload_optimizer="cpu",
                         precision="bf16-mixed", seq_len=32, micro_batch=2)  # fmt: skip
    p = partition(ARCH, 2)[0]
    host = {row.key: row.bytes for row in r.memory.per_node.rows}
    assert host["gradients_fp32"] == 2 * 4 * p and host["parameters_staging"] == 2 * 2 * p
    assert host["gradient_staging"] == 2 * 2 * 512 * 64 and "gradients" not in host


def test_reduce_bucket_size(tmp_path):
    import json

    from typer.testing import CliRunner

    from memcalc.cli.app import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    kw = dict(hf_config=str(cfg), gpus=2, stage=2, precision="bf16-mixed", seq_len=32, micro_batch=2,
              optimizer_impl="for-loop", device="cpu", attention="sdpa")  # fmt: skip
    default, small = memcalc.estimate(**kw), memcalc.estimate(reduce_bucket_size=2000, **kw)
    # the traced peaks of the same step (on CPU) with DeepSpeed's default bucket (test_peaks_as_traced) and with 2,000
    # elements
    assert abs(default.memory.per_gpu.peak_allocated - 1_001_728_856) <= 256
    assert abs(small.memory.per_gpu.peak_allocated - 2_212_816) <= 256
    with pytest.raises(InputError, match="--reduce-bucket-size"):
        memcalc.estimate(params=1e9, fsdp="FULL_SHARD", gpus=8, reduce_bucket_size=1000)
    out = CliRunner().invoke(app, ["estimate", "--hf-config", str(cfg), "--stage", "2", "--gpus", "2", "--precision",
                                   "bf16-mixed", "--seq-len", "32", "--reduce-bucket-size", "0"])  # fmt: skip
    assert out.exit_code == 0  # DeepSpeed accepts 0 (ge=0): every gradient is reduced alone
    for bad in (-5, "-1", 1.5):  # one line naming the flag and what it accepts (not an internal field's name)
        with pytest.raises(InputError, match=r"^--reduce-bucket-size .* is not accepted; give a count of elements, 0 "
                                             r"or more"):
            memcalc.estimate(params=1e9, stage=2, gpus=8, reduce_bucket_size=bad)


def _lora():
    from memcalc.model.lora import TARGETS, LoraPlan

    return LoraPlan(4, tuple(TARGETS))


@pytest.mark.parametrize("stage,dp,recompute,peak", [
    (0, 2, "none", 1_205_580), (1, 2, "none", 1_149_416), (2, 2, "none", 1_149_416), (2, 4, "full", 791_912),
])  # fmt: skip
def test_lora_peaks_as_traced(stage, dp, recompute, peak):
    # peft r = 4 on every projection under DeepSpeed, for-loop AdamW over the adapters, bucket 2,000: the traced peaks
    # (memcalc.validation.trace_deepspeed(..., lora=...); tests/validation/test_deepspeed_timeline.py)
    t = tl(stage, dp, recompute=recompute, bucket=2000, optimizer_impl="for-loop", lora=_lora())
    assert t.peak.phase == "backward" and abs(t.peak.live_bytes - peak) <= 256


def test_lora_states_are_the_adapters_partitioned_beside_the_frozen_base():
    from memcalc.memory.engine.timeline_states import adapter_tensors
    from memcalc.model.lora import LoraPlan

    lora = _lora()
    adapters = sum(n for _, n in adapter_tensors(ARCH, lora))
    # 2 layers x r = 4 x (in + out) of q, o (64 + 64), k, v (64 + 32), gate, up, down (64 + 176)
    assert adapters == 2 * 4 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 176)) == 9344
    p, sigma, _, _ = partition(ARCH, 2, lora=lora)
    assert p == 4672 and sigma == 4672  # ⌈9344 / 4⌉·2; rank 0's slice cuts no adapter
    base = tl(2, 2, bucket=2000, lora=lora).moments[0]
    parts = dict(base.parts)
    assert parts["parameters (frozen base)"] == 2 * PSI  # the whole base in bf16 on every rank
    assert parts["parameters (bf16 flat buffer)"] == 2 * 2 * p and parts["fp32 master partition"] == 4 * p
    assert parts["optimizer states (fp32 moments)"] == 8 * p + 4
    z0 = dict(tl(0, 2, bucket=2000, lora=lora).moments[0].parts)
    assert z0["optimizer states (fp32 moments)"] == 8 * adapters + 4 * 28  # a step per adapter tensor
    # ZeRO-1's end of backward: the leading gradients that fit the bucket (layer 0's attention adapters: 1,792
    # elements) are copied and freed before the partition is allocated
    z1 = tl(1, 2, bucket=2000, optimizer_impl="for-loop", lora=lora)
    end = next(m for m in z1.moments if m.phase == "backward.epilogue")
    assert dict(end.parts)["gradients (bf16)"] == 2 * (adapters - 1792)
    # offload_optimizer: the adapters' flat buffer and a staging buffer of the largest adapter (B of gate/up/down:
    # 176 x 4) beside the whole frozen base; their fp32 master, moments and gradient partition go to the host. The
    # layers' moments are those of the step without offload less those states
    for stage in (1, 2):
        off, on = tl(stage, 2, bucket=2000, offload=True, lora=lora), tl(stage, 2, bucket=2000, lora=lora)
        parts = dict(off.moments[0].parts)
        assert parts["parameters (frozen base)"] == 2 * PSI and parts["parameters (bf16 flat buffer)"] == 2 * 2 * p
        assert parts["gradient staging buffer (temp_grad_buffer_for_gpu_offload)"] == 2 * 176 * 4
        assert "fp32 master partition" not in parts
        assert off.phase_peaks["loss"] == on.phase_peaks["loss"] - (4 * p + 8 * p + 4) + 2 * 176 * 4
    with pytest.raises(InputError, match="LoRA under DeepSpeed.*--quantize none"):
        tl(2, 2, lora=LoraPlan(4, lora.targets, "nf4"))


def test_estimate_lora_under_zero(tmp_path):
    import json

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA, hidden_size=256, intermediate_size=704, vocab_size=32000)))
    kw = dict(hf_config=str(cfg), gpus=4, precision="bf16-mixed", seq_len=512, micro_batch=2, lora_rank=8)
    z2 = memcalc.estimate(stage=2, **kw)
    assert z2.accounting == "realistic"
    rows = {r.key: r.bytes for r in z2.memory.per_gpu.rows}
    from memcalc.memory.engine.timeline_states import param_tensors

    arch = architecture_from_config(json.loads(cfg.read_text()))
    assert rows["parameters_frozen"] == 2 * sum(n for _, n in param_tensors(arch))  # the whole base, bf16
    full = memcalc.estimate(stage=2, **{k: v for k, v in kw.items() if k != "lora_rank"})
    assert z2.memory.per_gpu.peak_allocated < full.memory.per_gpu.peak_allocated
    # offload_optimizer under LoRA: the adapters' states, and only theirs, on the host and over PCIe
    from memcalc.memory.engine.timeline_states import adapter_tensors
    from memcalc.memory.overlays.timeline_zero import partition as part
    from memcalc.model.lora import LoraPlan, resolve_targets

    lora = LoraPlan(8, resolve_targets(arch, None))
    a, p = sum(n for _, n in adapter_tensors(arch, lora)), part(arch, 4, lora=lora)[0]
    for stage in (1, 2):
        r = memcalc.estimate(stage=stage, offload_optimizer="cpu", gpus_per_node=4, **kw)
        assert r.accounting == "realistic"
        host = {row.key: row.bytes for row in r.memory.per_node.rows}
        assert host["gradients_fp32"] == 4 * 4 * p and host["parameters_staging"] == 4 * 2 * p
        assert host["master_weights"] == 4 * a  # the four ranks' fp32 partitions
        moved = {(t.op, t.phase): t.bytes_per_call for t in r.communication.host_transfers}
        assert moved[("device-to-host", "backward")] == moved[("host-to-device", "optimizer step")] == 2 * a // 4
        assert r.memory.per_gpu.peak_allocated < z2.memory.per_gpu.peak_allocated
