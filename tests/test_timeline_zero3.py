"""DeepSpeed ZeRO-3 under the realistic accounting (``memcalc.memory.overlays.timeline_zero3``).

The traced check (real DeepSpeed ranks on CPU) is tests/validation/test_deepspeed_timeline.py; the peaks pinned here
are what that tracer measured for the same tiny Llama (``memcalc.validation.trace_deepspeed``, re-runnable), beside
the model's figure."""

import json

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.layout.plan import Zero3Settings
from memcalc.memory.engine.timeline_states import buffer_bytes, param_tensors
from memcalc.memory.overlays.timeline_zero3 import sub_groups, zero3_timeline
from memcalc.memory.overlays.zero3 import gathered_bytes, released_bytes
from memcalc.model.hf_config import architecture_from_config

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, tie_word_embeddings=False)
ARCH = architecture_from_config(LLAMA)
ARCH4 = architecture_from_config(dict(LLAMA, num_hidden_layers=4))
PSI = 158_016
NONE = Zero3Settings(param_persistence_threshold=0)


def tl(arch=ARCH, dp=2, **kw):
    kw.setdefault("settings", NONE)
    return zero3_timeline(arch, family="llama", dp=dp, attention="sdpa", s=32, b=2, **kw)


@pytest.mark.parametrize("arch,dp,kw,traced,model,phase", [
    # DeepSpeed's coordinator defaults: the whole tiny model gathered from forward into backward
    (ARCH, 2, dict(bucket=2000, optimizer_impl="for-loop"), 2_376_573, 2_376_812, "backward"),
    # the default bucket: 1 GB in bf16, allocated once
    (ARCH, 2, dict(bucket=500_000_000, optimizer_impl="for-loop"), 1_002_372_573, 1_002_372_812, "backward"),
    (ARCH4, 2, dict(bucket=2000, optimizer_impl="for-loop"), 3_805_165, 3_796_964, "forward.layer.3"),
    (ARCH4, 2, dict(bucket=2000, optimizer_impl="for-loop", settings=Zero3Settings(
        max_reuse_distance=100_000, prefetch_bucket_size=20_000, param_persistence_threshold=0)),
     3_664_253, 3_664_492, "backward"),
    (ARCH4, 2, dict(bucket=2000, optimizer_impl="for-loop", recompute="full", settings=Zero3Settings(
        max_reuse_distance=100_000, prefetch_bucket_size=0, param_persistence_threshold=0)),
     3_510_661, 3_510_628, "optimizer.adamw"),
])
def test_peaks_beside_the_traced(arch, dp, kw, traced, model, phase):
    t = tl(arch, dp, **kw)
    assert (t.peak.live_bytes, t.peak.phase) == (model, phase)
    assert abs(model - traced) <= 0.0025 * traced  # the traced forward is above by DeepSpeed's hook outputs (8 KB)


def test_states_follow_the_formulas():
    p3 = sum(-(-n // 2) for _, n in param_tensors(ARCH))
    assert p3 == 79_008
    t = tl(bucket=2000, optimizer_impl="for-loop")
    base = dict(t.moments[0].parts)
    # 2 bf16 + 4 fp32 + 8 moments + 2 gradient partitions per partition element, the bucket, one step scalar
    assert base["parameters (bf16 partitions)"] == base["gradient partitions (bf16)"] == 2 * p3
    assert base["fp32 master partitions"] == 4 * p3
    assert base["optimizer states (fp32 moments)"] == 8 * p3 + 4
    assert base["gradient bucket (reduce_bucket_size)"] == 4000
    assert t.moments[0].live_bytes == 16 * p3 + 4000 + 4 + buffer_bytes(ARCH, "llama", 2)
    # optimizer: the flattened partition and its fp32 copy, then AdamW's for-loop temporaries (8 bytes per element)
    assert t.phase_peaks["optimizer"] - t.moments[0].live_bytes == 6 * p3 + 512  # + the batch (input ids)
    assert t.phase_peaks["optimizer.adamw"] - t.moments[0].live_bytes == 12 * p3 + 512
    fused = tl(bucket=2000, optimizer_impl="fused")
    assert fused.phase_peaks["optimizer.adamw"] - fused.moments[0].live_bytes == 4 * p3 + 512


def test_sub_groups_bound_the_step():
    assert sub_groups(ARCH, 2) == (79_008,)
    groups = sub_groups(ARCH, 2, 30_000)  # parameters in order, a group closed once it reaches the size
    # the embedding's 16,384 + q 2,048 + k, v 1,024 each + o 2,048 + gate, up 5,632 each crosses 30,000
    assert groups == (33_792, 45_216)  # the second: layer 0's down onwards, reaching 30,000 only with the head
    small = tl(bucket=2000, optimizer_impl="for-loop", sub_group_size=30_000)
    assert small.phase_peaks["optimizer.adamw"] - small.moments[0].live_bytes == 12 * 45_216 + 512
    assert small.moments[0].live_bytes == tl(bucket=2000).moments[0].live_bytes + 4  # a step scalar per sub-group
    # 0 (axolotl's configs): every parameter a sub-group of its own, the largest (the embedding's partition) bounds
    # the step
    each = sub_groups(ARCH, 2, 0)
    assert len(each) == len(param_tensors(ARCH)) and max(each) == 16_384
    one = tl(bucket=2000, optimizer_impl="for-loop", sub_group_size=0)
    assert one.phase_peaks["optimizer.adamw"] - one.moments[0].live_bytes == 12 * 16_384 + 512


def test_sub_group_size_reaches_the_step_and_is_refused_where_unused():
    """Llama 3 8B on 8 GPUs, full recompute, 2,048 tokens: with DeepSpeed's 1e9 the rank's 1e9-element partition is
    one sub-group, flattened and upcast at once (6 bytes per element) and the step is the peak; with 0 the largest
    sub-group is the embedding's partition and the peak moves to the backward."""
    kw = {"model": "llama-3-8b", "gpu": "h100-sxm", "stage": 3, "gpus": 8, "seq_len": 2048, "micro_batch": 1,
          "precision": "bf16-mixed", "recompute": "full"}
    one, each = memcalc.estimate(**kw), memcalc.estimate(**kw, sub_group_size=0)
    assert one.memory.timeline.peak_phase == "optimizer.adamw" and each.memory.timeline.peak_phase == "backward"
    p3 = sum(-(-n // 8) for _, n in param_tensors(one.input.model.architecture))
    emb = -(-128_256 * 4096 // 8)
    # the step's peak, foreach AdamW on a sub-group: its fp32 gradients and a temporary as large (8 bytes per
    # element), the whole partition against the embedding's; a step scalar per sub-group
    n = len(param_tensors(one.input.model.architecture))
    assert one.input.framework.sub_group_size is None and one.input.workload.optimizer_impl == "foreach"
    assert one.memory.timeline.phases["optimizer"] - each.memory.timeline.phases["optimizer"] == \
        8 * p3 - 8 * emb + 4 * (1 - n)
    assert any("sub_group_size 0" in n for n in each.notes)
    with pytest.raises(InputError, match="--sub-group-size"):
        memcalc.estimate(**kw, sub_group_size=0, accounting="implementation")
    with pytest.raises(InputError, match="--sub-group-size"):
        memcalc.estimate(**kw, sub_group_size=0, accounting="paper")
    with pytest.raises(InputError, match="--sub-group-size"):
        memcalc.estimate(**(kw | {"stage": 2}), sub_group_size=0)


def test_gathered_as_the_coordinator_holds_them():
    g = {(ph, m): (x, at) for ph, m, x, at in gathered_bytes(ARCH, 2, NONE)}
    # defaults: the root's prefetch gathers the whole model into one flat buffer (2Ψ bytes); the first wait copies
    # every parameter out of it (2Ψ more), and the buffer lives until the head, the last of them, is waited for
    assert g[("forward", "root")] == (2 * PSI, 0)  # nothing at its fetch; the prefetch after it
    assert g[("forward", "embed")] == (4 * PSI, 4 * PSI)
    assert g[("forward", "head")] == (2 * PSI, 4 * PSI)
    assert g[("loss", "")][0] == 2 * PSI  # all kept: each reused within stage3_max_reuse_distance
    # no prefetching, no reuse: each module's one parameter alone, a view of its padded all-gather buffer
    lone = {(ph, m): x for ph, m, x, _ in gathered_bytes(ARCH, 2, Zero3Settings(0, 10**9, 0, 0))}
    assert lone[("forward", "layer0.q")] == 2 * 64 * 64 and lone[("forward", "layer1.mlp.down")] == 2 * 64 * 176
    assert lone[("loss", "")] == 0
    # one rank gathers nothing
    assert tl(dp=1, bucket=2000).phase_peaks["loss"] == tl(dp=1, bucket=2000, settings=Zero3Settings()).phase_peaks["loss"]


def test_a_checkpointed_forward_between_submodules():
    """Full recompute: o_proj's output sees what is gathered while o_proj runs; the MLP's product what is left
    once up_proj's post-hook released its weight and down_proj is not fetched yet (just in time: nothing)."""
    jit = Zero3Settings(0, 10**9, 0, 0)  # no prefetching, no reuse
    rel = {(ph, m): x for ph, m, x in released_bytes(ARCH, 2, jit, True)}
    assert rel[("forward", "layer0.mlp.up")] == 0 and rel[("forward", "layer1.mlp.gate")] == 0

    def gathered(settings, label):
        m = next(m for m in tl(recompute="full", bucket=2000, settings=settings).moments
                 if m.phase == "forward.layer.0" and m.label == f"layer 0: {label}")
        return dict(m.parts).get("gathered parameters", 0)

    assert gathered(jit, "the o projection's output (no grad)") == 2 * 64 * 64  # o's weight alone
    assert gathered(jit, "the MLP's product (no grad: recomputed later)") == 0  # down's weight not yet fetched
    assert gathered(jit, "down projection's output before the residual add") == 2 * 64 * 176
    # the coordinator's defaults keep the whole model gathered (its copies and the flat buffer, 4 Psi bytes)
    assert gathered(NONE, "the MLP's product (no grad: recomputed later)") == 4 * PSI
    # prefetching within 20,000 elements and reuse within 100,000: below the layer's most (q, k, v's prefetch)
    some = Zero3Settings(max_reuse_distance=100_000, prefetch_bucket_size=20_000, param_persistence_threshold=0)
    running = {(ph, m): x for ph, m, x, _ in gathered_bytes(ARCH, 2, some, True)}
    after = {(ph, m): x for ph, m, x in released_bytes(ARCH, 2, some, True)}
    assert gathered(some, "the MLP's product (no grad: recomputed later)") == after[("forward", "layer0.mlp.up")]
    most = max(x for (ph, m), x in running.items() if ph == "forward" and m.startswith("layer0"))
    assert (after[("forward", "layer0.mlp.up")], most) == (361_088, 363_392)


def test_estimate_and_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    kw = dict(hf_config=str(cfg), gpus=2, stage=3, precision="bf16-mixed", seq_len=32, micro_batch=2,
              optimizer_impl="for-loop", device="cpu", attention="sdpa", reduce_bucket_size=2000,
              persistence_threshold=0)  # fmt: skip
    r = memcalc.estimate(**kw)
    assert r.accounting == "realistic" and r.memory.per_gpu.peak_allocated == 2_376_812
    assert any("DeepSpeed ZeRO-3" in n and "stage3_max_reuse_distance 1,000,000,000" in n for n in r.notes)
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    assert rows["gathered_parameters"] == 2 * PSI and rows["gradient_buckets"] == 4000
    # the coordinator's settings change the answer: with no reuse and no prefetching little is gathered
    lean = memcalc.estimate(max_reuse_distance=0, prefetch_bucket_size=0, **kw)
    assert lean.memory.per_gpu.peak_allocated == 2_216_804  # traced 2,216,837
    # a DeepSpeed config's reduce_bucket_size and coordinator knobs reach it
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "reduce_bucket_size": 2000, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
        "stage3_param_persistence_threshold": 0}}))
    from memcalc.configs import read_deepspeed

    got = read_deepspeed(str(ds), world_size=2, accounting="realistic").arguments
    assert got["reduce_bucket_size"] == 2000 and got["max_reuse_distance"] == 0 and got["prefetch_bucket_size"] == 0


def test_bad_input(tmp_path):
    with pytest.raises(InputError, match="recompute"):
        tl(recompute="selective")
    with pytest.raises(InputError, match="sub_group_size"):
        tl(sub_group_size=-1)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    kw = dict(hf_config=str(cfg), gpus=2, stage=3, seq_len=32)
    with pytest.raises(InputError, match=r"--zero3-step first: .*--accounting implementation"):
        memcalc.estimate(zero3_step="first", accounting="realistic", **kw)
    with pytest.raises(InputError, match="zero-3: the realistic accounting models recompute none or full"):
        memcalc.estimate(recompute="every:2", accounting="realistic", **kw)
    with pytest.raises(InputError, match="--max-reuse-distance"):
        memcalc.estimate(max_reuse_distance=0, accounting="paper", **kw)


def test_offload_keeps_the_bf16_partitions_the_bucket_and_the_gathered_parameters_on_the_gpu():
    """offload_optimizer (DeepSpeed 0.19 stage3.py): the fp32 master partitions, the moments and the gradient
    partitions move to the host; each reduced partition passes through the GPU on its way there (a bf16 copy, its
    fp64 norm, its fp32 copy); the step adds nothing on the GPU. offload_param moves the bf16 partitions, with the
    optimizer's states or alone."""
    from memcalc.memory.overlays.timeline_zero3 import _gradients, _to_host

    p3 = sum(-(-n // 2) for _, n in param_tensors(ARCH))
    plain = tl(bucket=2000, optimizer_impl="for-loop")
    off = tl(bucket=2000, optimizer_impl="for-loop", offload_optimizer=True)
    base = dict(off.moments[0].parts)
    assert "fp32 master partitions" not in base and "gradient partitions (bf16)" not in base
    assert base["parameters (bf16 partitions)"] == 2 * p3 and base["gradient bucket (reduce_bucket_size)"] == 4000
    assert off.moments[0].live_bytes == plain.moments[0].live_bytes - 14 * p3 - 4
    # The step on the host: the optimizer's moments hold the baseline and the batch alone.
    assert off.phase_peaks["optimizer"] == off.moments[0].live_bytes + 512
    assert "optimizer.adamw" not in off.phase_peaks
    # Each bucket's reduction carries the largest partition's trip to the host: 2n + max(8·min(n, 2.5e8), 4n).
    assert _to_host(1000) == 10_000 and _to_host(300_000_000) == 600_000_000 + 2_000_000_000
    assert _to_host(600_000_000) == 1_200_000_000 + 2_400_000_000
    g_plain, end_plain = _gradients(ARCH, 2, 2000)
    g_off, end_off = _gradients(ARCH, 2, 2000, offload=True)
    assert all(g_off[k] >= g_plain[k] for k in g_plain) and g_off != g_plain
    # The last bucket reduced is the embedding's alone (512 x 64 elements: 16,384 per rank).
    assert end_off - end_plain == _to_host(512 * 64 // 2) == 163_840
    params = tl(bucket=2000, optimizer_impl="for-loop", offload_optimizer=True, offload_params=True)
    assert params.moments[0].live_bytes == off.moments[0].live_bytes - 2 * p3
    assert params.peak.live_bytes < off.peak.live_bytes < plain.peak.live_bytes
    # offload_param alone: the bf16 partitions on the host, everything else as without offload (the fp32 master
    # partitions, moments and gradient partitions on the GPU, the step there), moment by moment
    alone = tl(bucket=2000, optimizer_impl="for-loop", offload_params=True)
    assert [(m.phase, m.label) for m in alone.moments] == [(m.phase, m.label) for m in plain.moments]
    assert [m.live_bytes for m in alone.moments] == [m.live_bytes - 2 * p3 for m in plain.moments]
    assert "parameters (bf16 partitions)" not in dict(alone.moments[0].parts)


def test_offload_under_the_default_accounting(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    kw = dict(hf_config=str(cfg), gpus=2, precision="bf16-mixed", seq_len=32, micro_batch=2, device="cpu",
              attention="sdpa", reduce_bucket_size=2000, persistence_threshold=0)  # fmt: skip
    r = memcalc.estimate(strategy="zero-3+opt-cpu", **kw)
    plain = memcalc.estimate(stage=3, optimizer_impl="for-loop", **kw)
    assert r.accounting == "realistic" and any("ZeRO-3 offload" in n for n in r.notes)
    assert r.memory.per_gpu.peak_allocated < plain.memory.per_gpu.peak_allocated
    host = {x.key: x.bytes for x in r.memory.per_node.rows}
    p3 = sum(-(-n // 2) for _, n in param_tensors(ARCH))
    # per node (2 ranks): bf16 gradient partitions, fp32 master, moments, and the sub-groups' fp32 gradients
    assert host["gradients_fp32"] == host["master_weights"] == 2 * 4 * p3
    # ZeRO-2 and FULL_SHARD offload (FSDP1 and FSDP2) are modelled too (tests/test_timeline_zero.py, test_timeline_fsdp.py);
    # FSDP's other strategies keep the paper accounting, saying why
    del kw["persistence_threshold"], kw["reduce_bucket_size"]
    assert memcalc.estimate(strategy="zero-2+opt-cpu", **kw).accounting == "realistic"
    fsdp = memcalc.estimate(fsdp="SHARD_GRAD_OP", offload_params="cpu", **kw)
    why = "ZeRO-1/2/3's CPU/NVMe offload and FULL_SHARD's parameter offload"
    assert fsdp.accounting == "paper" and any(why in n for n in fsdp.notes)
    with pytest.raises(InputError, match=why):
        memcalc.estimate(fsdp="SHARD_GRAD_OP", offload_params="cpu", accounting="realistic", **kw)


def _lora():
    from memcalc.model.lora import TARGETS, LoraPlan

    return LoraPlan(4, tuple(TARGETS))


@pytest.mark.parametrize("arch,dp,kw,traced", [
    # peft r = 4 on every projection, for-loop AdamW over the adapters, bucket 2,000: the traced peaks
    # (trace_deepspeed(..., lora=...); tests/validation/test_deepspeed_timeline.py), each at the loss's backward
    (ARCH, 2, dict(settings=Zero3Settings(max_reuse_distance=10**9, prefetch_bucket_size=50_000_000,
                                          param_persistence_threshold=0)), 1_338_317),
    (ARCH4, 4, dict(settings=Zero3Settings(max_reuse_distance=0, prefetch_bucket_size=0,
                                           param_persistence_threshold=0)), 1_308_717),
    # adapters on q and v alone, 4 layers on 2 ranks, reuse distance 1e5, prefetch bucket 2e4
    (ARCH4, 2, {"settings": Zero3Settings(max_reuse_distance=100_000, prefetch_bucket_size=20_000,
                                          param_persistence_threshold=0), "targets": ("q", "v")}, 1_885_645),
])  # fmt: skip
def test_lora_peaks_as_traced(arch, dp, kw, traced):
    from memcalc.model.lora import LoraPlan

    kw = dict(kw)
    targets = kw.pop("targets", None)
    lora = _lora() if targets is None else LoraPlan(4, targets)
    t = tl(arch, dp, bucket=2000, optimizer_impl="for-loop", lora=lora, **kw)
    assert t.peak.phase == "backward" and abs(t.peak.live_bytes - traced) <= 256


def test_lora_partitions_the_base_and_steps_the_adapters():
    from memcalc.memory.engine.timeline_states import adapter_tensors

    lora = _lora()
    adapters = [n for _, n in adapter_tensors(ARCH, lora)]
    a3, p3 = sum(-(-n // 2) for n in adapters), 79_008
    t = tl(bucket=2000, optimizer_impl="for-loop", lora=lora)
    base = dict(t.moments[0].parts)
    assert base["parameters (bf16 partitions)"] == 2 * (p3 + a3)  # the frozen base partitioned with the adapters
    assert base["fp32 master partitions"] == 4 * a3 and base["gradient partitions (bf16)"] == 2 * a3
    assert base["optimizer states (fp32 moments)"] == 8 * a3 + 4
    assert sub_groups(ARCH, 2, lora=lora) == (a3,)
    # DeepSpeed's linear keeps the frozen head's input (bf16, 2 x 32 tokens x 64) through the loss's backward
    back = [dict(m.parts) for m in t.moments if m.phase == "backward"]
    assert all(p["head input (saved by DeepSpeed's linear)"] == 2 * 64 * 64 for p in back)
    # the end of backward also holds the embedding's output, a leaf that requires grad, and its gradient
    end = next(dict(m.parts) for m in t.moments if m.phase == "backward.epilogue")
    assert end["embedding output (a leaf: enable_input_require_grads) and its gradient"] == 2 * 2 * 64 * 64
    from memcalc.model.lora import LoraPlan

    # adapters on q and v alone: DeepSpeed's linear keeps the frozen k, o, gate, up and down inputs anyway, so the
    # layers save what they save with adapters everywhere; only A's r-wide outputs and the adapters' states shrink
    qv = tl(bucket=2000, optimizer_impl="for-loop", lora=LoraPlan(4, ("q", "v")))
    saved = next(dict(m.parts) for m in qv.moments if m.phase == "loss")
    assert saved["layer activations"] == next(
        dict(m.parts) for m in t.moments if m.phase == "loss")["layer activations"] - 2 * 5 * 2 * 64 * 4
    with pytest.raises(InputError, match="training dtype"):
        tl(bucket=2000, lora=LoraPlan(4, tuple(lora.targets), "nf4"))
    # offload: the adapters' fp32 states and gradient partitions on the host; the GPU keeps every bf16 partition
    # (the host too with offload_param), the bucket, the gathered parameters and each adapter's reduced partition on
    # its way to the host
    off = dict(tl(bucket=2000, lora=lora, offload_optimizer=True).moments[0].parts)
    assert off["parameters (bf16 partitions)"] == 2 * (p3 + a3) and "fp32 master partitions" not in off
    both = dict(tl(bucket=2000, lora=lora, offload_optimizer=True, offload_params=True).moments[0].parts)
    assert "parameters (bf16 partitions)" not in both and both["gradient bucket (reduce_bucket_size)"] == 4000


def test_lora_under_zero3_estimate(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA, hidden_size=256, intermediate_size=704, vocab_size=32000)))
    kw = dict(hf_config=str(cfg), gpus=4, stage=3, precision="bf16-mixed", seq_len=512, micro_batch=2, lora_rank=8)
    r = memcalc.estimate(**kw)
    assert r.accounting == "realistic" and any("DeepSpeed ZeRO-3" in n for n in r.notes)
    full = memcalc.estimate(**{k: v for k, v in kw.items() if k != "lora_rank"})
    assert r.memory.per_gpu.peak_allocated < full.memory.per_gpu.peak_allocated
    # a subset of the projections: the frozen ones keep the inputs DeepSpeed's linear saves (traced), so q,v holds
    # less than every projection only by the adapters and their r-wide outputs
    sub = memcalc.estimate(lora_targets="q,v", **kw)
    assert sub.accounting == "realistic"
    assert 0 < r.memory.per_gpu.peak_allocated - sub.memory.per_gpu.peak_allocated < 0.05 * r.memory.per_gpu.peak_allocated
