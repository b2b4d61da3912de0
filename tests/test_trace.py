"""Traced training steps (fake tensors, no weights) against the same step run for real, and against counts by hand.

The tracker counts storages (memcalc.validation.trace_tracker); the real runs use real CPU tensors under the same
tracker, so equal timelines mean the fake step allocated and freed the same bytes in the same order.
"""

import contextlib
import io
import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memcalc.errors import InputError  # noqa: E402
from memcalc.model.hf_config import architecture_from_config  # noqa: E402
from memcalc.model.params import model_params  # noqa: E402
from memcalc.validation.trace import main, trace_step, trace_summary  # noqa: E402

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256)
QWEN2 = dict(model_type="qwen2", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=True)
# Dimensions that 4 ranks do not divide: FSDP2 gives rank 0 ceil(rows / 4) rows of each parameter.
LLAMA_ODD = dict(LLAMA, vocab_size=130, intermediate_size=174)
CONFIGS = {"llama": LLAMA, "gpt2": GPT2, "qwen2": QWEN2}
S, B = 32, 2
ROTARY_BUFFERS = 2 * (64 // 4 // 2) * 4  # inv_freq and original_inv_freq: head_dim/2 fp32 values each
INPUT = B * S * 8 + S * 8  # int64 input ids (labels share them) and one row of int64 position ids


def llama_shapes(cfg: dict) -> list[tuple[int, ...]]:
    """Every parameter tensor of a Llama model (modeling_llama.py), embedding and head untied."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    layer = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    return [(v, h)] + layer * cfg["num_hidden_layers"] + [(h,), (v, h)]


def params(cfg: dict) -> int:
    return model_params(architecture_from_config(cfg)).total


def same_bytes(a, b) -> None:
    """Equal baseline, peak (and where), phase peaks, end, and number of events."""
    assert (a.baseline, a.peak, a.peak_phase, a.end) == (b.baseline, b.peak, b.peak_phase, b.end)
    assert a.phase_peaks == b.phase_peaks
    assert len(a.timeline) == len(b.timeline)


def deltas(trace) -> list[int]:
    lives = [trace.baseline] + [x[1] for x in trace.timeline]
    return [y - x for x, y in zip(lives, lives[1:])]


def canonical(trace) -> list[tuple[str, int]]:
    """(phase, bytes) per event, each run of consecutive frees sorted: the order in which storages released
    together die can follow a hash map keyed by address (autocast's cast cache, checkpoint's recomputed tensors),
    and no order of frees moves a peak."""
    out: list[tuple[str, int]] = []
    run: list[tuple[str, int]] = []
    for (_, _, phase), d in zip(trace.timeline, deltas(trace)):
        if d < 0 and (not run or run[-1][0] == phase):
            run.append((phase, d))
            continue
        out += sorted(run)
        run = [(phase, d)] if d < 0 else []
        if d >= 0:
            out.append((phase, d))
    return out + sorted(run)


def test_baseline_by_hand():
    # fp32 AdamW before a step: 4 B parameter + 4 B exp_avg + 4 B exp_avg_sq (gradients were set to None by the
    # last zero_grad), a 4-byte fp32 "step" scalar per parameter tensor, and the rotary buffers.
    t = trace_step(LLAMA, seq_len=S, micro_batch=B, precision="fp32", optimizer_impl="foreach")
    p, tensors = params(LLAMA), len(llama_shapes(LLAMA))
    assert p == sum(math.prod(s) for s in llama_shapes(LLAMA)) == 108_864
    assert t.baseline == 12 * p + 4 * tensors + ROTARY_BUFFERS == 1_306_516
    # After the optimizer step, before zero_grad: the fp32 gradients too, 16 B per parameter.
    assert t.phase_peaks["zero_grad"] == 16 * p + 4 * tensors + ROTARY_BUFFERS + INPUT
    assert t.end == t.baseline + INPUT
    # foreach: the step's peak is at sqrt(exp_avg_sq), one temporary per parameter (torch/optim/adamw.py).
    assert (t.peak, t.peak_phase) == (t.phase_peaks["zero_grad"] + 4 * p, "optimizer")


def test_pure_bf16_and_autocast_states():
    p, tensors = params(LLAMA), len(llama_shapes(LLAMA))
    bf16 = trace_step(LLAMA, seq_len=S, micro_batch=B, precision="bf16")
    amp = trace_step(LLAMA, seq_len=S, micro_batch=B, precision="amp-bf16")
    # Pure bf16: bf16 weights and bf16 AdamW moments (2 + 2 + 2 B), the step scalars and rotary buffers stay fp32.
    assert bf16.baseline == 6 * p + 4 * tensors + ROTARY_BUFFERS
    assert amp.baseline == 12 * p + 4 * tensors + ROTARY_BUFFERS
    assert bf16.phase_peaks["zero_grad"] - bf16.end == 2 * p
    assert amp.phase_peaks["zero_grad"] - amp.end == 4 * p  # autocast: fp32 gradients


@pytest.mark.parametrize("precision,width", [("fp32", 4), ("bf16", 2)])
def test_foreach_temporaries(precision, width):
    # foreach AdamW allocates sqrt(exp_avg_sq) for every parameter at once; fused none; the for-loop one
    # parameter at a time (three temporaries of the largest tensor, 176 x 64, live together at its peak).
    kw = dict(seq_len=S, micro_batch=B, precision=precision)
    opt = {impl: trace_step(LLAMA, optimizer_impl=impl, **kw).phase_peaks["optimizer"]
           for impl in ("foreach", "fused", "for-loop")}  # fmt: skip
    assert opt["foreach"] - opt["fused"] == width * params(LLAMA)
    assert opt["for-loop"] - opt["fused"] == 3 * width * 176 * 64


def test_recompute_keeps_less_and_recomputes_in_backward():
    kw = dict(seq_len=128, micro_batch=B, precision="amp-bf16")
    none = trace_step(LLAMA, recompute="none", **kw)
    full = trace_step(LLAMA, recompute="full", **kw)
    assert full.baseline == none.baseline
    assert full.phase_peaks["forward.layer.1"] < none.phase_peaks["forward.layer.1"]
    assert full.phase_peaks["loss"] < none.phase_peaks["loss"]
    # The recomputed forward of each layer runs inside that layer's backward.
    events = [sum(1 for e in t.timeline if e[2] == "backward.layer.1") for t in (none, full)]
    assert events[1] > events[0]


REAL_VS_FAKE = [
    ("llama", dict(precision="fp32", attention="sdpa", recompute="none", optimizer_impl="foreach")),
    ("llama", dict(precision="bf16", attention="eager", recompute="full", optimizer_impl="fused")),
    ("llama", dict(precision="amp-bf16", attention="sdpa", recompute="full", optimizer_impl="for-loop")),
    ("gpt2", dict(precision="fp32", attention="eager", recompute="full", optimizer_impl="foreach")),
    ("gpt2", dict(precision="amp-bf16", attention="sdpa", recompute="none", optimizer_impl="fused")),
    ("qwen2", dict(precision="bf16", attention="sdpa", recompute="none", optimizer_impl="foreach")),
    ("qwen2", dict(precision="amp-bf16", attention="eager", recompute="full", optimizer_impl="foreach")),
    ("llama", dict(world=4, fsdp=True)),
    ("llama", dict(world=4, fsdp=True, fsdp_param_dtype="bf16", precision="amp-bf16", recompute="full")),
    ("llama", dict(world=2, tp=2, precision="bf16")),
    ("llama", dict(world=4, tp=2, fsdp=True, precision="amp-bf16")),
]  # fmt: skip


@pytest.mark.parametrize("name,kw", REAL_VS_FAKE)
def test_fake_step_equals_real_step(name, kw):
    fake = trace_step(CONFIGS[name], seq_len=S, micro_batch=B, **kw)
    real = trace_step(CONFIGS[name], seq_len=S, micro_batch=B, fake=False, **kw)
    same_bytes(fake, real)
    assert canonical(fake) == canonical(real)
    if kw.get("precision") != "amp-bf16" and kw.get("recompute") != "full":
        assert fake.timeline == real.timeline


def test_fsdp2_rank0_holds_a_padded_quarter():
    one = trace_step(LLAMA_ODD, seq_len=S, micro_batch=B)
    four = trace_step(LLAMA_ODD, seq_len=S, micro_batch=B, world=4, fsdp=True)
    shapes = llama_shapes(LLAMA_ODD)
    whole = sum(math.prod(s) for s in shapes)
    rank0 = sum(-(-s[0] // 4) * math.prod(s[1:]) for s in shapes)  # FSDP2 Shard(0): ceil(rows / 4) on rank 0
    assert whole == params(LLAMA_ODD) == 108_352
    # whole / 4 = 27_088; padding: vocab 130 -> 33 rows (2 x 0.5 x 64), ffn 174 -> 44 rows (4 x 0.5 x 64)
    assert rank0 == 27_088 + 64 + 128 == 27_280
    steps_and_buffers = 4 * len(shapes) + ROTARY_BUFFERS  # step scalars and rotary buffers are not sharded
    assert one.baseline == 12 * whole + steps_and_buffers
    assert four.baseline == 12 * rank0 + steps_and_buffers
    assert four.phase_peaks["zero_grad"] - four.end == 4 * rank0  # the fp32 gradient shards
    assert not torch.distributed.is_initialized()


def test_tensor_parallel_shards_the_layers():
    two = trace_step(LLAMA, seq_len=S, micro_batch=B, world=2, tp=2)
    shapes = llama_shapes(LLAMA)
    layer = shapes[1:10]
    sharded = sum(math.prod(s) for s in layer[:7]) * LLAMA["num_hidden_layers"]  # q k v o gate up down
    assert two.baseline == 12 * (params(LLAMA) - sharded // 2) + 4 * len(shapes) + ROTARY_BUFFERS
    with pytest.raises(InputError, match="kv_heads"):
        trace_step(LLAMA, seq_len=S, world=4, tp=4)


def test_summary_and_entry_point(tmp_path):
    t = trace_step(GPT2, seq_len=S, micro_batch=B, recompute="full")
    s = trace_summary(t)
    assert s["peak_bytes"] == t.peak and s["baseline_bytes"] == t.baseline and s["peak_phase"] == t.peak_phase
    assert s["phase_peak_bytes"]["optimizer"] == t.phase_peaks["optimizer"]
    assert all(isinstance(v, int) for v in s["phase_peak_bytes"].values())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = ["--hf-config", str(path), "--seq-len", str(S), "--micro-batch", str(B), "--recompute", "full"]
        assert main(args) == 0
    printed = json.loads(out.getvalue())
    assert printed["peak_bytes"] == t.peak and printed["phase_peak_bytes"] == s["phase_peak_bytes"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--hf-config", str(path), "--seq-len", "8", "--precision", "fp16"]) == 2
    assert "precision 'fp16'" in err.getvalue() and "amp-bf16" in err.getvalue()


@pytest.mark.parametrize("kw,match", [
    (dict(precision="fp8"), "precision"), (dict(optimizer_impl="adam"), "optimizer_impl"),
    (dict(recompute="selective"), "recompute"), (dict(attention="flash"), "attention"),
    (dict(world=4, tp=3), "tp"), (dict(steps=0), "steps"), (dict(world=2), "fsdp"),
])  # fmt: skip
def test_bad_input(kw, match):
    with pytest.raises(InputError, match=match):
        trace_step(LLAMA, seq_len=S, **kw)


def test_trace_command_prints_nothing_but_its_answer(tmp_path) -> None:
    """`memcalc trace` under full recompute, in a process of its own: stderr stays empty (no transformers
    FutureWarning for the renamed checkpointing call, no torchao loader lines where torchao is installed)."""
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)))
    run = subprocess.run([sys.executable, "-m", "memcalc", "trace", "--hf-config", str(cfg), "--seq-len", "32",
                          "--recompute", "full"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert json.loads(run.stdout)["peak_phase"]
