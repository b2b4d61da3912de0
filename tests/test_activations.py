"""Activation memory against Korthikanti et al. 2022 (arXiv 2205.05198): Table 2, Eq. 5, and the configurations of
its Table 3 (22B, 175B, 530B, 1T)."""

import pytest

import memcalc
from memcalc.memory.accountings.activations import Setting, layer_activations, output_saved, pipeline_in_flight
from memcalc.model.architecture import Architecture
from memcalc.inputs.presets import load_model

# Table 3: name, a, h, L, t, p (seq 2048, micro-batch 1 for all but 22B, which used 4).
PAPER = [("megatron-22b", 64, 6144, 48, 8, 1, 4), ("megatron-175b", 96, 12288, 96, 8, 8, 1),
         ("megatron-530b", 128, 20480, 105, 8, 35, 1), ("megatron-1t", 160, 25600, 128, 8, 64, 1)]  # fmt: skip
S = 2048


def table2(kind, s, b, h, a, t):
    sbh = s * b * h
    return {
        "none": sbh * 34 + 5 * a * s * s * b,
        "tp": sbh * 10 + sbh * 24 // t + 5 * a * s * s * b // t,
        "tp+sp": (sbh * 34 + 5 * a * s * s * b) // t,
        "tp+selective": sbh * 10 + sbh * 24 // t,
        "tp+sp+selective": sbh * 34 // t,
        "full": 2 * sbh,
    }[kind]


KW = {"none": {}, "tp": {"tp": True}, "tp+sp": {"tp": True, "sp": True}, "tp+selective": {"tp": True, "recompute": "selective"},
      "tp+sp+selective": {"tp": True, "sp": True, "recompute": "selective"}, "full": {"recompute": "full"}}  # fmt: skip


@pytest.mark.parametrize("name, a, h, layers, t, p, b", PAPER)
@pytest.mark.parametrize("kind", list(KW))
def test_table_2_exactly_for_the_papers_models(name, a, h, layers, t, p, b, kind):
    arch = load_model(name)
    assert (arch.heads, arch.hidden, arch.layers) == (a, h, layers)
    st = Setting(s=S, b=b, dtype_bytes=2, dropout=True)  # 16-bit activations, 1-byte masks (CUDA)
    kw = dict(KW[kind])
    tp = t if kw.pop("tp", False) else 1
    got = layer_activations(arch, st, tp=tp, sp=kw.pop("sp", False), **kw).total
    assert got == table2(kind, S, b, h, a, t)


@pytest.mark.parametrize("name, a, h, layers, t, p, b", PAPER)
def test_first_stage_holds_L_layers_eq_5(name, a, h, layers, t, p, b):
    # Eq. 5: with 1F1B the first stage keeps p micro-batches of L/p layers = L layers' worth, whatever p.
    r = memcalc.estimate(model=name, gpus=t * p, tp=t, pp=p, seq_len=S, micro_batch=b, sequence_parallel=True,
                         recompute="selective", grad_accum=max(p, 2), cuda_context_gib=0, attention="eager")  # fmt: skip
    first = r.memory.stages[0]
    assert first.micro_batches_in_flight == p
    layer_rows = [x for x in r.memory.per_gpu.rows if x.key == "activations_layers"]
    if r.memory.most_loaded_stage == 0:
        assert layer_rows[0].bytes == layers * S * b * h * 34 // t
    assert r.memory.stages[-1].micro_batches_in_flight == 1


def test_interleaved_schedule_factor():
    # §4.2.3: interleaving with m model chunks multiplies the first stage's memory by (1 + (p-1)/(pm)).
    p, m = 8, 4
    assert pipeline_in_flight(0, p, 64, virtual=m) == pytest.approx(p * (1 + (p - 1) / (p * m)))
    assert pipeline_in_flight(0, p, 64) == p
    assert [pipeline_in_flight(i, 4, 64) for i in range(4)] == [4, 3, 2, 1]
    assert pipeline_in_flight(0, 8, 3) == 3  # fewer micro-batches than stages


def gpt(**kw):
    base = dict(layers=1, hidden=1024, heads=16, vocab=50000, max_positions=2048, dropout=0.1)
    return Architecture(**(base | kw))


def test_no_dropout_drops_the_masks_and_the_dropout_copy():
    s, b, h, a = 1024, 2, 1024, 16
    st = Setting(s=s, b=b, dtype_bytes=2, dropout=False)
    assert layer_activations(gpt(dropout=0.0), st).total == 32 * s * b * h + 2 * a * s * s * b


def test_flash_attention_keeps_no_score_matrix():
    s, b, h, a = 4096, 1, 1024, 16
    st = Setting(s=s, b=b, dtype_bytes=2, dropout=True, attention="flash")
    # 34sbh - (no change in sbh terms) with the 5as²b terms replaced by an fp32 log-sum-exp per head and token;
    # the flash kernel's output is the projection's input.
    assert layer_activations(gpt(), st).total == 34 * s * b * h + 4 * a * s * b


def test_gated_mlp_and_gqa_are_derived_not_copied():
    s, b, h, a, f, kv = 2048, 1, 4096, 32, 11008, 8
    llama = Architecture(layers=1, hidden=h, heads=a, kv_heads=kv, ffn=f, gated_mlp=True, vocab=32000,
                         position="rotary", norm="rmsnorm", norm_bias=False, qkv_bias=False, out_bias=False,
                         mlp_bias=False)  # fmt: skip
    sb = s * b
    eager = layer_activations(llama, Setting(s=s, b=b, dtype_bytes=2, dropout=False)).total
    # norms 2 x 2sbh; attention: input 2sbh + Q,K,V at full width (eager repeats K/V) 6sbh + softmax 2as²b +
    # projection input 2sbh; MLP: input 2sbh + gate, SiLU, up, product 4 x 2sbf.
    assert eager == sb * h * (4 + 2 + 6 + 2 + 2) + 2 * a * s * s * b + 4 * 2 * sb * f
    flash = layer_activations(llama, Setting(s=s, b=b, dtype_bytes=2, dropout=False, attention="flash")).total
    kvw = kv * (h // a)
    # norms 4sbh, QKV input, Q, output (the projection reads it in place), MLP input: 2sbh each; K, V at KV width.
    assert flash == sb * h * (4 + 2 + 2 + 2 + 2) + 2 * 2 * sb * kvw + 4 * a * sb + 4 * 2 * sb * f


def test_cpu_keeps_dropout_masks_in_the_activation_dtype():
    s, b, h, a = 512, 1, 1024, 16
    cuda = layer_activations(gpt(), Setting(s=s, b=b, dtype_bytes=2, dropout=True)).total
    cpu = layer_activations(gpt(), Setting(s=s, b=b, dtype_bytes=2, dropout=True, device="cpu")).total
    assert cpu - cuda == 2 * s * b * h + a * s * s * b  # two sbh masks and one as²b mask, one more byte each


def test_logits_and_the_fp32_loss_copy():
    a = load_model("llama-3-8b")  # 128256-token vocabulary
    s, b = 8192, 1
    out = {x.name: x.bytes for x in output_saved(a, Setting(s=s, b=b, dtype_bytes=2, dropout=False))}
    assert out["logits"] == s * b * 128256 * 2
    assert out["loss logits (fp32)"] == 4 * s * b * 128256
    r = memcalc.estimate(model="llama-3-8b", stage=3, gpus=8, seq_len=s, attention="flash", recompute="full",
                         accounting="paper")
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    assert rows["activations_logits"] == 6 * s * 128256  # larger than all 32 checkpointed layers together
    assert rows["activations_logits"] > rows["activations_layers"]


def test_activations_scale_with_micro_batch_and_split_with_context_parallel():
    one = memcalc.estimate(model="llama-2-7b", stage=3, gpus=8, seq_len=4096, micro_batch=1, accounting="paper")
    two = memcalc.estimate(model="llama-2-7b", stage=3, gpus=8, seq_len=4096, micro_batch=2, accounting="paper")
    assert two.memory.per_gpu.activations == 2 * one.memory.per_gpu.activations - 8 * 0  # linear in b
    cp = memcalc.estimate(model="llama-2-7b", stage=3, gpus=8, cp=2, seq_len=4096, attention="flash")
    flash = memcalc.estimate(model="llama-2-7b", stage=3, gpus=8, seq_len=2048, attention="flash", accounting="paper")
    assert cp.memory.activations.layer_bytes == flash.memory.activations.layer_bytes  # s/cp tokens per rank


def test_micro_batch_auto_is_the_largest_that_fits():
    kw = dict(model="llama-2-7b", stage=3, gpus=8, seq_len=4096, attention="flash")
    auto = memcalc.estimate(micro_batch="auto", **kw)
    b = auto.training.micro_batch
    assert auto.training.micro_batch_auto and auto.memory.fit.fits
    fits = [memcalc.estimate(micro_batch=x, **kw).memory.fit.fits for x in range(1, b + 3)]
    assert fits == [True] * b + [False, False]  # a manual search agrees
    assert auto.training.tokens_per_step == b * 8 * 4096 and auto.training.global_batch == b * 8


def test_micro_batch_auto_when_nothing_fits():
    r = memcalc.estimate(model="llama-2-70b", ddp=True, gpus=8, seq_len=4096, micro_batch="auto")
    assert r.training.micro_batch == 1 and not r.memory.fit.fits


def test_op_sac_keeps_torchtitans_saved_outputs_and_every_k_mixes_full_and_none():
    """torchtitan's per-op SAC under the paper accounting (memcalc.memory.accountings.activations.op_sac_saved), with TP and SP
    splitting as the tensors split; every:K averages checkpointed and plain layers over the stage's layers."""
    import memcalc
    from memcalc.inputs.presets import load_model
    from memcalc.memory.accountings.activations import Setting, layer_activations

    a = load_model("llama-3-8b")
    st = Setting(s=8192, b=1, dtype_bytes=2, dropout=False, attention="flash")
    t, h, q, kv, f = 8192, 4096, 4096, 1024, 14336
    whole = 2 * t * h + 2 * t * (q + kv) + 2 * t * f + 2 * t * h + 2 * t * q + 4 * 32 * t
    assert layer_activations(a, st, recompute="op-sac").total == whole
    split = 2 * t * h // 8 + 2 * t * (q + kv) // 8 + 2 * t * f // 8 + 2 * t * h // 8 + 2 * t * q // 8 + 4 * 32 * t // 8
    assert layer_activations(a, st, tp=8, sp=True, recompute="op-sac").total == split
    kw = dict(model="llama-3-8b", gpus=8, stage=3, seq_len=8192, micro_batch=1, attention="flash", accounting="paper")
    rows = {rc: next(r.bytes for r in memcalc.estimate(recompute=rc, **kw).memory.per_gpu.rows
                     if r.key == "activations_layers") for rc in ("none", "full", "every:2", "op-sac")}
    assert rows["every:2"] == (rows["none"] + rows["full"]) // 2  # layers 0, 2, ..., 30 checkpointed: 16 of 32
    assert rows["op-sac"] == 32 * whole
