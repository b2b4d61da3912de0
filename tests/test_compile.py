"""What a decoder layer saves under torch.compile: memcalc.memory.families.compiled against a census of the real modules.

memcalc.memory.families.compiled gives the tensors AOTAutograd's min-cut partitioner keeps per layer; the census
(memcalc.validation.saved_compile) compiles the tiny transformers model and counts what the compiled regions save
(saved_tensors_hooks, one count per storage). They must agree to the byte, at two (s, b). The census runs the
``aot_eager`` backend (same partitioner as inductor, no C++ build); ``MEMCALC_INDUCTOR=1`` adds an inductor run.
The hand-derived figures and the difference from eager run without torch.
"""

import functools
import os

import pytest

from memcalc.errors import InputError
from memcalc.memory.families.compiled import compile_saving, compiled_layer_saved
from memcalc.memory.families.saved import layer_saved, total
from memcalc.model.architecture import Architecture
from memcalc.model.hf_config import architecture_from_config

# The census's tiny llama (memcalc.validation.saved TINY): h 64, 4 heads of 16, 2 KV heads, ffn 96.
TINY = {"model_type": "llama", "vocab_size": 120, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "tie_word_embeddings": False}  # fmt: skip
ARCH = architecture_from_config(TINY)
SHAPES = [(8, 2), (12, 3)]
# torchtitan's census model (memcalc.validation.saved_torchtitan): dim 256, 4 heads of 64, 2 kv heads, ffn 704.
TT = Architecture(name="tt-tiny", family="llama", layers=2, hidden=256, heads=4, kv_heads=2, ffn=704,
                  gated_mlp=True, vocab=1000, position="rotary", norm="rmsnorm")  # fmt: skip


def compiled(regime, attention="sdpa", s=8, b=2, scope="layer", family="llama"):
    return compiled_layer_saved(ARCH, family=family, regime=regime, attention=attention, s=s, b=b, scope=scope)


# ---- the formula by hand (no torch) --------------------------------------------------------------------------


def test_llama_sdpa_per_token_by_hand():
    # per token: r·h input + 4 rstd + d·h q/k/v input + d·qw Q + 2·d·kvw K, V + d·qw output + 4·heads lse
    #            + d·h o_proj output + 4 rstd + d·h gate/up input + 3·d·ffn (gate, up, down input)
    h, qw, kvw, heads, f, t = 64, 64, 32, 4, 96, 16
    fp32 = 4 * h + 4 + 4 * h + 4 * qw + 8 * kvw + 4 * qw + 4 * heads + 4 * h + 4 + 4 * h + 12 * f  # 2968
    bf16 = 2 * h + 4 + 2 * h + 2 * qw + 4 * kvw + 2 * qw + 4 * heads + 2 * h + 4 + 2 * h + 6 * f  # 1496
    amp = 4 * h + 4 + 2 * h + 2 * qw + 4 * kvw + 2 * qw + 4 * heads + 2 * h + 4 + 2 * h + 6 * f  # 1624
    assert (fp32, bf16, amp) == (2968, 1496, 1624)
    assert total(compiled("fp32")) == fp32 * t == 47488
    assert total(compiled("bf16")) == bf16 * t == 23936
    assert total(compiled("amp-bf16")) == amp * t == 25984
    # autocast's bf16 weight copies are kept as in eager: 2 bytes x (q, k, v, o, gate, up, down) weights
    assert total(compiled("amp-bf16"), "weight_cast") == 2 * (64 * 128 + 64 * 64 + 3 * 64 * 96) == 61440


def test_llama_eager_attention_and_whole_model_by_hand():
    s, b, t, qw, scores = 8, 2, 16, 64, 4 * 8 * 8 * 2
    # eager attention: Q, Kᵀ, V at full width 3·d·qw, softmax 4·S², probabilities d·S², output d·qw (no lse, K/V)
    sdpa_attn = 4 * t * (qw + 2 * 32) + 4 * t * qw + 4 * 4 * t
    eager_attn = 3 * 4 * t * qw + 4 * scores + 4 * scores + 4 * t * qw
    assert total(compiled("fp32", "eager", s, b)) == 47488 - sdpa_attn + eager_attn == 55424
    # whole-model graph under amp: the residual h + o is kept in fp32 (4·T·h) instead of o_proj's bf16 output
    assert total(compiled("amp-bf16", scope="model")) == 25984 + 2 * t * 64 == 28032
    assert total(compiled("fp32", scope="model")) == total(compiled("fp32"))


@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("scope", ["layer", "model"])
def test_difference_from_eager_is_the_closed_formula(regime, attention, scope):
    for s, b in SHAPES:
        t, h, f, scores = s * b, 64, 96, 4 * s * s * b
        eager = total(layer_saved(ARCH, family="llama", regime=regime, attention=attention, s=s, b=b))
        got = total(compiled(regime, attention, s, b, scope))
        d = 4 if regime == "fp32" else 2
        # the norms' fp32 input copies and normalized tensors, autocast's extra casts, SiLU's output
        per_h = {"fp32": 8, "bf16": 8, "amp-bf16": 16 if scope == "layer" else 14}[regime]
        want = per_h * t * h + d * t * f - (4 * scores if attention == "eager" and regime == "fp32" else 0)
        assert eager - got == want == compile_saving(ARCH, regime=regime, attention=attention, s=s, b=b, scope=scope)
    assert 0 < want < eager


def test_torchtitan_block_by_hand():
    s, b, t, h, f, hd = 64, 2, 128, 256, 704, 64

    def tt(regime, attention="flex"):
        kw = {"family": "llama", "regime": regime, "attention": attention, "s": s, "b": b}
        return total(compiled_layer_saved(TT, code="torchtitan", **kw))

    # the Hugging Face list (r = d) plus the complex64 rotary table gathered per layer, 4·T·hd
    assert tt("fp32") - total(compiled_layer_saved(TT, family="llama", regime="fp32", attention="sdpa", s=s, b=b)) \
        == 4 * t * hd
    assert tt("bf16") == tt("bf16", "sdpa") == 1_035_264  # census (memcalc.validation.saved_compile, code=torchtitan)
    # against torchtitan eager (memcalc.memory.families.saved code="torchtitan", itself equal to its census): the norms'
    # fp32 input copies and normalized tensors and SiLU's output: (16 - 2·d)·T·h + d·T·ffn
    for regime, d in (("fp32", 4), ("bf16", 2)):
        eager = total(layer_saved(TT, family="llama", regime=regime, attention="sdpa", s=s, b=b, code="torchtitan"))
        assert eager - tt(regime) == (16 - 2 * d) * t * h + d * t * f
    with pytest.raises(InputError, match="torchtitan"):
        tt("amp-bf16")


def test_unprofiled_inputs_raise():
    with pytest.raises(InputError, match="gpt2"):
        compiled_layer_saved(ARCH, family="gpt2", regime="fp32", attention="sdpa", s=8, b=2)
    with pytest.raises(InputError, match="flex"):
        compiled("fp32", attention="flex")
    with pytest.raises(InputError, match="fp8"):
        compiled("fp8")
    with pytest.raises(InputError, match="region"):
        compiled("fp32", scope="region")
    with pytest.raises(InputError, match="tpu"):
        compiled_layer_saved(ARCH, family="llama", regime="fp32", attention="sdpa", s=8, b=2, device="tpu")


# ---- the census (torch.compile on CPU) -----------------------------------------------------------------------


@functools.cache
def can_compile(backend="aot_eager"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memcalc.validation.saved_compile import available

    return available(backend)


def census(*args, **kw):
    if not can_compile(kw.get("backend", "aot_eager")):
        pytest.skip("torch.compile cannot run here")
    from memcalc.validation.saved_compile import census_rows

    rows = census_rows(*args, **kw)
    return sum(r[3] for r in rows if r[4] == "activation"), sum(r[3] for r in rows if r[4] == "weight_cast"), rows


CASES = [("llama", r, "sdpa", "layer", sb) for r in ("fp32", "bf16", "amp-bf16") for sb in SHAPES]
CASES += [("llama", "amp-bf16", "sdpa", "model", sb) for sb in SHAPES] + [("llama", "fp32", "sdpa", "model", (8, 2))]
CASES += [("llama", "fp32", "eager", "layer", sb) for sb in SHAPES]
CASES += [("llama", r, "eager", "layer", (12, 3)) for r in ("bf16", "amp-bf16")]
CASES += [(f, "amp-bf16", "sdpa", "layer", (12, 3)) for f in ("mistral", "qwen2")]


@pytest.mark.parametrize("family, regime, attention, scope, sb", CASES)
def test_compiled_layer_matches_census(family, regime, attention, scope, sb):
    s, b = sb
    act, casts, _ = census(family, regime, s, b, attention=attention, scope=scope)
    want = compiled(regime, attention, s, b, scope, family)
    assert act == total(want)
    assert casts == total(want, "weight_cast")


@pytest.mark.parametrize("regime, sb", [("fp32", (64, 2)), ("bf16", (64, 2)), ("bf16", (32, 3))])
def test_torchtitan_block_matches_census(regime, sb):
    tt = pytest.importorskip("memcalc.validation.saved_torchtitan")
    if not tt.available():
        pytest.skip("torchtitan is not installed")
    s, b = sb
    act, casts, rows = census("llama", regime, s, b, code="torchtitan")
    want = compiled_layer_saved(TT, family="llama", regime=regime, attention="sdpa", s=s, b=b, code="torchtitan")
    assert (act, casts) == (total(want), 0)
    assert any(r[2] == "complex64" and r[3] == 4 * s * b * 64 for r in rows)  # the rotary table


def test_census_names_what_the_partitioner_keeps():
    _, _, rows = census("llama", "amp-bf16", 8, 2)
    names = [r[0].split(":")[0] for r in rows if r[4] == "activation"]
    # kept: the layer input, two rstd, ONE bf16 cast per norm output, the matmul outputs gate/up (mm_4, mm_5),
    # their product (down input) and o_proj's output (mm_3); not kept: x.float(), x·rstd, SiLU's output
    assert names[0] == "primals_1" and sum(n.startswith("rsqrt") for n in names) == 2
    assert {"mm_3", "mm_4", "mm_5"} <= set(names) and not any(n.startswith(("silu", "mul", "pow")) for n in names)
    dtypes = {(r[1], r[2]) for r in rows if r[0].startswith(("view:", "view_9:"))}
    assert dtypes == {((16, 64), "bfloat16")}


@pytest.mark.skipif(os.environ.get("MEMCALC_INDUCTOR") != "1", reason="inductor compiles C++: set MEMCALC_INDUCTOR=1")
def test_inductor_saves_what_aot_eager_saves():
    _, _, rows = census("llama", "amp-bf16", 8, 2, backend="inductor")
    want = compiled("amp-bf16")
    assert sum(r[3] for r in rows) == total(want) + total(want, "weight_cast") == 87424


@pytest.mark.skipif(os.environ.get("MEMCALC_INDUCTOR") != "1", reason="inductor compiles C++: set MEMCALC_INDUCTOR=1")
def test_inductor_cross_entropy_saves_its_input_and_two_floats_per_token():
    """``F.cross_entropy(logits.float(), y)`` under inductor: saved are the bf16 logits themselves, the targets and two
    fp32 values per token (memcalc.memory.families.saved.loss_transient, compiled); eager saves the fp32 log-softmax."""
    import torch
    import torch.nn.functional as F

    t, v = 64, 1000

    def loss(logits, y):
        return F.cross_entropy(logits.float(), y, reduction="sum")

    def saved(fn):
        logits = torch.randn(t, v, dtype=torch.bfloat16, requires_grad=True)
        y = torch.randint(0, v, (t,))
        kept: dict[int, tuple] = {}

        def pack(x):
            kept[x.untyped_storage().data_ptr()] = (x.untyped_storage().nbytes(), x.dtype)
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            fn(logits, y)
        return kept, logits.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()

    kept, lp, yp = saved(torch.compile(loss, backend="inductor", dynamic=False))
    assert kept.pop(lp) == (2 * t * v, torch.bfloat16) and kept.pop(yp)[0] == 8 * t
    assert sum(n for n, _ in kept.values()) == 8 * t  # max and log-sum-exp, fp32, one each per token
    eager, _, _ = saved(loss)
    assert max(n for n, _ in eager.values()) == 4 * t * v  # the fp32 log-softmax


def test_compiled_loss_keeps_the_logits_not_the_fp32_log_softmax():
    import memcalc
    from memcalc.memory.families.saved import loss_transient
    from memcalc.units import GiB

    t, v = 8192, 128256
    n = t * v
    eager, comp = loss_transient(t, v, "bf16"), loss_transient(t, v, "bf16", compiled=True)
    assert (eager.forward, eager.backward) == (10 * n, 14 * n)
    assert (comp.forward, comp.backward) == (2 * n + 8 * t, 4 * n + 8 * t)
    assert loss_transient(t, v, "bf16", "chunked:8", compiled=True) == comp  # every chunk saved, every gradient made
    # torchtune drops what compile_loss returns: a plain loss stays eager, a chunked one is compiled in place
    kw = dict(hf_config="docs/published/llama32_3b.json", gpus=1, precision="bf16", seq_len=4096, micro_batch=2,
              attention="flash", gpu="a100-80g", compile=True, recompute="full", optimizer_impl="fused")
    peak = {(fw, loss): memcalc.estimate(framework=fw, loss=loss, **kw).memory.per_gpu.peak_allocated
            for fw in ("torchtune", "hf") for loss in ("standard", "chunked:8")}
    assert peak["hf", "standard"] == peak["hf", "chunked:8"] == peak["torchtune", "chunked:8"]
    assert (peak["torchtune", "standard"] - peak["hf", "standard"]) / GiB > 5  # the eager fp32 loss tensors


def test_compiled_loss_parallel_saves_one_fp32_tensor_per_logit_not_the_logits():
    """The loss compiled under ``loss_parallel`` on vocabulary-sharded logits (rank 0 of 2, the fake process group):
    the partitioner saves ``scatter + exp(log-softmax)`` (fp32, one per logit of the rank's share), a mask and a
    scalar, and not the logits, whose gradient comes back in bf16 (``saved.loss_transient``, compiled and parallel).
    ``aot_eager`` runs inductor's partitioner; inductor's generated forward also makes the fp32 one-hot scatter."""
    if not can_compile():
        pytest.skip("torch.compile cannot run here")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memcalc.memory.families.saved import loss_transient

    b, s, v, tp = 2, 16, 1000, 2
    n = b * s * v // tp  # rank 0's logits

    def loss_fn(pred, labels):  # torchtitan's cross_entropy_loss
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        mesh = init_device_mesh("cpu", (tp,))
        local = torch.randn(b, s, v // tp, dtype=torch.bfloat16)
        pred = DTensor.from_local(local, mesh, [Shard(2)], run_check=False).requires_grad_()
        kept: dict[int, tuple] = {}

        def pack(x):
            t = x._local_tensor if isinstance(x, DTensor) else x
            kept[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype)
            return x

        fn = torch.compile(loss_fn, backend="aot_eager", dynamic=False)
        with loss_parallel():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                loss = fn(pred, torch.randint(0, v, (b, s)))
            loss.backward()
    finally:
        dist.destroy_process_group()
    assert local.untyped_storage().data_ptr() not in kept  # the logits are not saved
    big = [k for k in kept.values() if k[0] >= n]
    assert big == [(4 * n, torch.float32)] and sum(k[0] for k in kept.values()) - 4 * n <= 8 * b * s
    assert pred.grad._local_tensor.dtype == torch.bfloat16
    lp = loss_transient(b * s, v // tp, "bf16", compiled=True, parallel=True)
    assert dict(lp.names)["softmax minus one-hot (fp32, saved)"] == 4 * n
    assert (lp.forward, lp.backward) == (2 * n + 8 * n, 4 * n + 2 * n)


def test_compiled_op_sac_block_keeps_the_policy_but_the_down_projection_output():
    """torchtitan's per-op SAC policy (every second matmul's output and the attention kernel's outputs saved,
    activation_checkpoint.py ``_get_custom_policy``) on the tiny Llama layer, compiled (``aot_eager``): the partitioner
    saves q, v, gate, the attention output and log-sum-exp beside the block's inputs, not w2's output, which eager SAC
    caches (memcalc.memory.engine.timeline_layers._op_sac)."""
    if not can_compile():
        pytest.skip("torch.compile cannot run here")
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer,
        LlamaRotaryEmbedding,
    )

    from memcalc.memory.engine.timeline_layers import layer_sizes, parse_recompute

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default}

    def context():
        count = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = "recompute" if ctx.is_recompute else "forward"
            count[key] += func == aten.mm.default
            keep = func in save and not (func == aten.mm.default and count[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    cfg = LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"}, attn_implementation="sdpa")
    layer, rotary = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)
    s, b = 8, 2

    def block(x, cos, sin):
        out = layer(x, position_embeddings=(cos, sin), attention_mask=None)
        return out[0] if isinstance(out, tuple) else out

    fn = torch.compile(lambda x, cos, sin: checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=context),
                       backend="aot_eager", dynamic=False)
    x = torch.randn(b, s, TINY["hidden_size"], requires_grad=True)
    cos, sin = rotary(x, torch.arange(s)[None])
    mine = {t.untyped_storage().data_ptr() for t in (x, cos, sin, *layer.parameters())}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in mine:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x, cos, sin)
    out.sum().backward()
    kw = {"family": "llama", "regime": "fp32", "attention": "sdpa", "s": s, "b": b,
          "policy": parse_recompute("op-sac"), "index": 0}
    compiled, eager = layer_sizes(ARCH, compiled=True, **kw), layer_sizes(ARCH, **kw)
    t, h = s * b, TINY["hidden_size"]
    assert sum(kept.values()) == compiled.kept - 4 * t * h  # all it keeps but the block input (an input here)
    assert eager.kept - compiled.kept == 4 * t * h  # w2's output, which eager SAC caches


def test_torchtitan_tensor_parallel_step_with_the_compiled_loss():
    """torchtitan's 2D layout (Llama-3-70B, FSDP 32 x TP 8 with sequence parallelism, full recompute) under --compile:
    its releases compile the loss, which loss_parallel runs on the rank's vocabulary share n = T·V/8; the peak is the
    compiled loss's forward (the bf16 logits, the fp32 one-hot scatter and the fp32 sum it saves), where the eager
    loss peaks in its backward (the saved fp32 log-softmax and 12 bytes per logit of gradients and temporaries)."""
    import memcalc

    kw = {"framework": "torchtitan", "gpu": "h100-96g", "precision": "bf16-mixed", "fsdp": "FULL_SHARD",
          "fsdp_version": 2, "attention": "flash", "model": "llama-3-70b", "seq_len": 8192, "gpus": 256, "tp": 8,
          "sequence_parallel": True, "micro_batch": 16, "recompute": "full", "compile": True}
    n = 16 * 8192 * 128256 // 8
    compiled, eager = memcalc.estimate(**kw), memcalc.estimate(compile_loss=False, **kw)
    assert compiled.accounting == eager.accounting == "realistic"
    rows = {r.label: r.bytes for r in compiled.memory.per_gpu.rows}
    assert compiled.memory.timeline.peak_phase == "loss"
    assert (rows["logits"], rows["one-hot scatter (fp32, the forward's)"], rows["softmax minus one-hot (fp32, saved)"]) \
        == (2 * n, 4 * n, 4 * n)
    assert not any("loss_parallel" in label for label in rows)
    rows = {r.label: r.bytes for r in eager.memory.per_gpu.rows}
    assert (rows["log-softmax output (fp32)"], rows["loss gradients (fp32)"]) == (4 * n, 12 * n)
    assert any("the loss compiled too" in x and "torchtitan's releases" in x for x in compiled.notes)
    assert any("the loss left eager (--no-compile-loss)" in x for x in eager.notes)


def test_estimate_with_compile_keeps_the_compiled_saved_set():
    import memcalc
    from memcalc.errors import InputError as Refused
    from memcalc.inputs.presets import load_model

    # Llama-3-8B under FSDP2 (bf16 activations), 8 GPUs, s = 8192, b = 2: the peak (the loss's backward, every layer's
    # activations alive) falls by 32 layers x the partitioner's saving per layer (8·T·h + 2·T·ffn at bf16) and by the
    # compiled loss's: the saved fp32 log-softmax and the two fp32 gradients (4n + 8n) become the saved bf16 logits,
    # two fp32 values per token and the bf16 gradient (2n + 8T + 2n)
    kw = dict(model="llama-3-8b", gpus=8, fsdp="FULL_SHARD", fsdp_version=2, gpu="h100", precision="bf16-mixed",
              seq_len=8192, micro_batch=2, attention="flash")
    eager, compiled = memcalc.estimate(**kw), memcalc.estimate(compile=True, **kw)
    t, h, f = 8192 * 2, 4096, 14336
    saving = compile_saving(load_model("llama-3-8b"), regime="bf16", attention="sdpa", s=8192, b=2)
    assert saving == 8 * t * h + 2 * t * f
    n = t * 128256
    assert eager.memory.per_gpu.peak_allocated - compiled.memory.per_gpu.peak_allocated == 32 * saving + 8 * n - 8 * t
    assert compiled.time.step_s < eager.time.step_s  # the element-wise kernels fused
    assert compiled.input.workload.compile is True
    with pytest.raises(Refused, match="--compile"):
        memcalc.estimate(compile=True, accounting="realistic", **{**kw, "recompute": "selective"})
    # full recompute: each layer keeps its checkpoint, compiled or not; the note says the recomputed layer is eager's
    full = memcalc.estimate(compile=True, accounting="realistic", **{**kw, "recompute": "full"})
    assert any("--compile with full recompute" in n for n in full.notes)
    # the paper accounting (ZeRO-3) counts the eager layer and says so; without a shape there is nothing to compile
    zero3 = memcalc.estimate(model="llama-3-8b", gpus=8, stage=3, seq_len=2048, compile=True)
    assert zero3.accounting == "paper" and any(n.startswith("--compile: the activations are the eager") for n in zero3.notes)
    assert zero3.input.workload.attention == "sdpa"  # the model's own attention, as without --compile
    assert zero3.memory.per_gpu.total == memcalc.estimate(model="llama-3-8b", gpus=8, stage=3, seq_len=2048,
                                                          accounting="paper", attention="sdpa").memory.per_gpu.total
    with pytest.raises(Refused, match="--compile"):
        memcalc.estimate(params=8e9, gpus=8, stage=3, seq_len=2048, compile=True)
