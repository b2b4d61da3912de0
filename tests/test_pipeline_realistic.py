"""A pipeline rank's realistic step (``memcalc.memory.overlays.timeline_pp``) against torch's own pipelining, traced.

``memcalc.validation.trace_pipeline`` runs torch's ``PipelineStage`` with ``Schedule1F1B`` or
``ScheduleInterleaved1F1B`` as one rank of a (pp, dp) fake process group, FSDP2 inside the stage with
``reshard_after_forward=False`` (torchtitan's composition), Hugging Face Llama layers on fake tensors. The baseline
(sharded parameters, AdamW's state, buffers, the receive buffers the first step made) is exact; the peak is 0 to
1.1 % below at 64 tokens against hidden 128. With torchtitan's sequence-parallel tensor parallelism inside the stages
(a (pp, dp, tp) mesh) at 256 tokens against hidden 256: the baseline exact, the peak within 0.2 %.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import memcalc
from memcalc.errors import InputError
from memcalc.memory.overlays.timeline_pp import one_f_one_b, stage_timeline
from memcalc.model.hf_config import architecture_from_config
from memcalc.units import GiB
from memcalc.validation.trace_pipeline import trace_pipeline_rank
from memcalc.validation.trace_step import StepSpec

CFG = dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=6, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=250, max_position_embeddings=256, tie_word_embeddings=False)
S, B = 32, 2


def _chunks(pp: int, rank: int, virtual: int) -> tuple[range, ...]:
    n, stages = CFG["num_hidden_layers"], pp * virtual
    sizes = [n // stages + (k < n % stages) for k in range(stages)]
    starts = [sum(sizes[:k]) for k in range(stages)]
    return tuple(range(starts[rank + c * pp], starts[rank + c * pp] + sizes[rank + c * pp]) for c in range(virtual))


CASES = [  # (pp, dp, rank, micro-batches, precision, recompute, FSDP param dtype, reduce in fp32, chunks per rank)
    (2, 2, 0, 4, "bf16", "none", None, False, 1),
    (2, 2, 1, 4, "bf16", "none", None, False, 1),
    (2, 2, 0, 4, "fp32", "none", "bf16", True, 1),
    (2, 2, 1, 4, "fp32", "none", "bf16", True, 1),
    (2, 2, 0, 4, "bf16", "full", None, False, 1),
    (2, 2, 1, 4, "bf16", "full", None, False, 1),
    (3, 2, 1, 4, "bf16", "none", None, False, 1),
    (2, 2, 0, 4, "bf16", "none", None, False, 2),
    (2, 2, 1, 4, "bf16", "none", None, False, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "pp{}-dp{}-rank{}-n{}-{}-{}-{}-{}-v{}".format(*c))
def test_stage_timeline_against_traced_rank(case):
    pp, dp, rank, n, precision, recompute, mp, reduce_fp32, virtual = case
    spec = StepSpec(S, B, precision, "fused", recompute, "sdpa")
    traced = trace_pipeline_rank(CFG, spec, pp=pp, dp=dp, rank=rank, micro_batches=n, virtual=virtual,
                                 fsdp_param_dtype=mp, reduce_fp32=reduce_fp32)
    tl = stage_timeline(architecture_from_config(CFG), family="llama", regime=precision, attention="sdpa", s=S, b=B,
                        pp=pp, rank=rank, micro_batches=n, chunks=_chunks(pp, rank, virtual), recompute=recompute,
                        optimizer_impl="fused", device="cpu", world=dp, fsdp_param_dtype=mp,
                        fsdp_reduce_fp32=reduce_fp32)  # fmt: skip
    assert tl.moments[0].live_bytes == traced.baseline
    assert abs(tl.peak.live_bytes - traced.peak) / traced.peak < 0.02
    assert tl.peak.phase.startswith("backward")  # every rank peaks in a backward, never at the optimizer


# Tensor parallelism inside the stages, as torchtitan composes it: the (pp, dp, tp) mesh, the sequence-parallel plan
# with plain local outputs (a stage boundary is the rank's 1/tp of the sequence), FSDP2 over dp, the loss under
# loss_parallel. ffn / tp below hidden at tp 4: the down projection's backward, its output gradient all-gathered, peaks.
CFG_TP = dict(CFG, hidden_size=256, intermediate_size=832, num_attention_heads=8, num_key_value_heads=4,
              vocab_size=1000)
TP_CASES = [  # (pp, dp, tp, rank, micro-batches, precision, recompute, FSDP param dtype, reduce in fp32)
    (2, 2, 2, 0, 4, "bf16", "full", None, False),  # the embedding's gradient accumulated whole (Replicate)
    (2, 2, 4, 0, 4, "bf16", "full", None, False),
    (2, 2, 2, 1, 4, "fp32", "full", "bf16", True),  # the last stage, torchtitan's bf16 policy, fp32 accumulators
    (3, 2, 4, 1, 4, "bf16", "full", None, False),  # a middle stage: its input gradient sent back
    (2, 2, 2, 0, 4, "bf16", "none", None, False),
    (3, 2, 2, 1, 4, "bf16", "none", None, False),
]


@pytest.mark.parametrize("case", TP_CASES, ids=lambda c: "pp{}-dp{}-tp{}-rank{}-n{}-{}-{}-{}-{}".format(*c))
def test_stage_timeline_with_tensor_parallelism_against_traced_rank(case):
    pp, dp, tp, rank, n, precision, recompute, mp, reduce_fp32 = case
    spec = StepSpec(128, B, precision, "fused", recompute, "sdpa")
    traced = trace_pipeline_rank(CFG_TP, spec, pp=pp, dp=dp, rank=rank, micro_batches=n, tp=tp,
                                 fsdp_param_dtype=mp, reduce_fp32=reduce_fp32)
    n_layers = CFG_TP["num_hidden_layers"]
    start = sum(n_layers // pp + (k < n_layers % pp) for k in range(rank))
    chunk = range(start, start + n_layers // pp + (rank < n_layers % pp))
    tl = stage_timeline(architecture_from_config(CFG_TP), family="llama", regime=precision, attention="sdpa", s=128,
                        b=B, pp=pp, rank=rank, micro_batches=n, chunks=(chunk,), recompute=recompute,
                        optimizer_impl="fused", device="cpu", world=dp, tp=tp, sequence_parallel=True,
                        fsdp_param_dtype=mp, fsdp_reduce_fp32=reduce_fp32)  # fmt: skip
    assert tl.moments[0].live_bytes == traced.baseline
    assert abs(tl.peak.live_bytes - traced.peak) / traced.peak < 0.002
    assert tl.peak.phase.startswith("backward.layer")
    # every layer's backward, the trace's phases labelled by the model's own layer index (the forward phases hold the
    # checkpointed layers' transients, which the timeline leaves out: below the trace there, never the step's peak)
    layers = [p for p in traced.phase_peaks if p.startswith("backward.layer.")]
    assert sorted(layers) == sorted(f"backward.layer.{i}" for i in chunk)
    for phase in layers + ["optimizer", "zero_grad"]:
        assert abs(tl.phase_peaks[phase] - traced.phase_peaks[phase]) / traced.phase_peaks[phase] < 0.002, phase


def test_schedule_1f1b_actions():
    # torch Schedule1F1B: warm-up min(n, pp - rank) forwards, then backward/forward pairs, then the backwards
    assert one_f_one_b(0, 4, 6) == [(False, 0)] * 4 + [(True, 0), (False, 0)] * 2 + [(True, 0)] * 4
    assert one_f_one_b(3, 4, 6) == [(False, 0)] + [(True, 0), (False, 0)] * 5 + [(True, 0)]
    assert one_f_one_b(0, 8, 4) == [(False, 0)] * 4 + [(True, 0)] * 4


def test_first_stage_holds_more_micro_batches_than_the_last():
    arch = architecture_from_config(CFG)
    kw = dict(family="llama", regime="bf16", attention="sdpa", s=S, b=B, pp=3, micro_batches=6, recompute="none",
              optimizer_impl="fused", device="cpu", world=2)

    def held(rank):
        tl = stage_timeline(arch, rank=rank, chunks=_chunks(3, rank, 1), **kw)
        return max(dict(m.parts).get("micro-batches in flight (saved tensors, stage outputs)", 0) for m in tl.moments)

    first, middle, last = held(0), held(1), held(2)
    assert first > middle > last == 0  # 1F1B: 3, 2 and 1 in flight (the last holds only the current one)


def test_stage_timeline_bad_input():
    arch = architecture_from_config(CFG)
    kw = dict(family="llama", regime="bf16", attention="sdpa", s=S, b=B, device="cpu", world=2)
    with pytest.raises(InputError, match="pipeline rank 2 of 2"):
        stage_timeline(arch, pp=2, rank=2, micro_batches=4, chunks=(range(3),), **kw)
    with pytest.raises(InputError, match="divisible by pp"):
        stage_timeline(arch, pp=2, rank=0, micro_batches=3, chunks=(range(2), range(3, 4)), **kw)
    tied = architecture_from_config(dict(CFG, tie_word_embeddings=True))
    with pytest.raises(InputError, match="untied"):
        stage_timeline(tied, pp=2, rank=0, micro_batches=4, chunks=(range(3),), **kw)


TITAN = dict(model="llama-3-8b", framework="torchtitan", precision="bf16-mixed", fsdp="FULL_SHARD", fsdp_version=2,
             attention="flash", seq_len=8192, gpus=32, pp=4, micro_batch=1, grad_accum=8, recompute="full",
             gpu="h100")


def test_estimate_pipeline_is_realistic_per_stage():
    r = memcalc.estimate(**TITAN)
    assert r.accounting == "realistic"
    assert len(r.memory.stages) == 4
    top = r.memory.stages[r.memory.most_loaded_stage]
    assert top.total == max(s.total for s in r.memory.stages)
    assert r.memory.per_gpu.total == top.total
    # 1F1B: the first ranks hold more micro-batches in flight than the middle ones; the last holds one, and the loss
    # over Llama 3's 128,256-word vocabulary (logits, their fp32 copy, log-softmax, two fp32 gradients)
    assert r.memory.stages[0].activations > r.memory.stages[2].activations
    assert r.memory.stages[3].activations > r.memory.stages[0].activations
    assert r.memory.most_loaded_stage == 3
    # each stage keeps its layers' parameters gathered and their fp32 gradient accumulators all step: 2 + 4 bytes per
    # parameter of the stage (Llama 3 8B over 4 stages: about 2 x 8 GiB / 4 ... 12 GiB and more)
    assert top.model_states > 6 * top.parameters * 0.95
    paper = memcalc.estimate(**TITAN, accounting="paper")
    assert paper.accounting == "paper"
    assert abs(r.memory.per_gpu.total - paper.memory.per_gpu.total) / paper.memory.per_gpu.total < 0.25


def test_estimate_pipeline_interleaved_and_uneven_split():
    r = memcalc.estimate(**dict(TITAN, virtual_stages=2, grad_accum=8))
    assert r.accounting == "realistic"
    u = memcalc.estimate(**dict(TITAN, stage_layers="7,8,9,8"))
    assert u.accounting == "realistic"
    assert [s.layers for s in u.memory.stages] == [7, 8, 9, 8]
    assert u.memory.stages[2].model_states > u.memory.stages[1].model_states  # 9 layers hold more than 8


def test_estimate_pipeline_outside_the_model_says_why():
    # Qwen3 0.6B ties its embedding and head: they cannot be split over stages
    r = memcalc.estimate(**dict(TITAN, model="qwen3-0.6b", framework=None))
    assert r.accounting == "paper"
    assert any("not used: --pp" in n and "untied" in n for n in r.notes)
    r = memcalc.estimate(**dict(TITAN, precision="amp-bf16", framework=None))
    assert r.accounting == "paper"
    assert any("not used: --pp" in n and "bf16-mixed" in n for n in r.notes)


def test_estimate_405b_stage_rows_in_gib():
    r = memcalc.estimate(model="llama-3-405b", framework="torchtitan", gpu="h100-96g", precision="bf16-mixed",
                         fsdp="FULL_SHARD", fsdp_version=2, fsdp_wrap="root", attention="flash", seq_len=8192,
                         gpus=512, tp=8, pp=8, sequence_parallel=True, recompute="full", compile=True,
                         float8="tensorwise", float8_all_gather=True, micro_batch=4, grad_accum=8)
    assert r.accounting == "realistic"
    # stage 0 (15 layers, 8 micro-batches in flight) is the most loaded: its fp32 gradient accumulators hold 4 bytes
    # per parameter of its layers on this tensor-parallel rank and the embedding's gradient whole (Replicate under
    # sequence parallelism), 128,256 x 16,384 x 4 bytes, where stage 1's hold 16 layers' alone
    assert r.memory.most_loaded_stage == 0
    acc = next(x.bytes for x in r.memory.per_gpu.rows if x.label == "gradient accumulators (unsharded)")
    layer = (2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248) // 8 + 2 * 16384  # q, o; k, v; MLP; norms
    assert acc == 4 * (15 * layer + 128256 * 16384)
    assert 60 * GiB < r.memory.per_gpu.total < 75 * GiB


def test_estimate_405b_interleaving_and_fp8_gathers():
    kw = dict(model="llama-3-405b", framework="torchtitan", gpu="h100-96g", precision="bf16-mixed", fsdp="FULL_SHARD",
              fsdp_version=2, fsdp_wrap="root", attention="flash", seq_len=8192, gpus=512, tp=8, pp=8,
              sequence_parallel=True, recompute="full", compile=True, float8="tensorwise", micro_batch=4,
              grad_accum=8)  # fmt: skip
    plain = memcalc.estimate(**kw, float8_all_gather=True)
    inter = memcalc.estimate(**kw, float8_all_gather=True, virtual_stages=2)
    # torchtitan measured 82.5 and 72.7 GiB (Table 5): 9.8 GiB apart. The replayed ranks are 14.1 GiB apart: 1F1B's
    # rank 0 peaks with the embedding's whole-vocabulary fp32 accumulator (7.8 GiB) beside its layers', while every
    # interleaved rank peaks at its second chunk's first backward, before any first chunk has accumulated
    apart = (plain.memory.per_gpu.total - inter.memory.per_gpu.total) / GiB
    assert 13.0 < apart < 15.0
    assert plain.memory.most_loaded_stage == 0 and inter.memory.most_loaded_stage == 1
    # the fp8 all-gather keeps the converted linears gathered at 1 byte: the stage's gathered weights about halve
    bf16 = memcalc.estimate(**kw)
    gathered = [next(r.bytes for r in e.memory.per_gpu.rows if r.label == "parameters (gathered)")
                for e in (plain, bf16)]
    assert 0.5 < gathered[0] / gathered[1] < 0.55


def test_trace_command_traces_one_pipeline_rank(tmp_path):
    import json

    from typer.testing import CliRunner

    from memcalc.cli import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CFG_TP))
    base = ["trace", "--hf-config", str(cfg), "--seq-len", "128", "--micro-batch", str(B), "--precision", "bf16",
            "--recompute", "full", "--optimizer-impl", "fused"]
    r = CliRunner().invoke(app, base + ["--pp", "2", "--pp-rank", "1", "--tp", "2", "--world", "8", "--fsdp"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["label"] == "pipeline rank 1 of 2, 2 micro-batches, dp 2, tp 2 sp"  # --grad-accum: pp by default
    tl = stage_timeline(architecture_from_config(CFG_TP), family="llama", regime="bf16", attention="sdpa", s=128, b=B,
                        pp=2, rank=1, micro_batches=2, chunks=(range(3, 6),), recompute="full", optimizer_impl="fused",
                        device="cpu", world=2, tp=2, sequence_parallel=True)  # fmt: skip
    assert out["baseline_bytes"] == tl.moments[0].live_bytes
    assert abs(out["peak_bytes"] - tl.peak.live_bytes) / out["peak_bytes"] < 0.002
    assert {f"backward.layer.{i}" for i in range(3, 6)} <= set(out["phase_peak_bytes"])
    assert out["end_bytes"] >= out["baseline_bytes"]  # what the step ended with, not the teardown after it

    bad = {("--pp", "2", "--pp-rank", "2"): "--pp-rank 2 is not a rank of --pp 2; give 0 to 1",
           ("--pp", "2", "--tp", "2", "--world", "6", "--fsdp"): "not a multiple of --pp 2 x --tp 2",
           ("--pp", "2", "--world", "4"): "add --fsdp",
           ("--pp", "2", "--tp", "2", "--fsdp"): "--fsdp under --pp shards over the data-parallel ranks",
           ("--pp", "2", "--tp", "3"): "tp(3) must divide heads(8)",
           ("--pp", "2", "--virtual-stages", "2", "--grad-accum", "3"): "divisible by --pp 2",
           ("--pp", "2", "--world", "4", "--fsdp", "--fsdp-version", "1"): "--fsdp-version 1 is not traced under --pp",
           ("--pp", "1", "--pp-rank", "1"): "--pp 1 traces no pipeline"}  # fmt: skip
    for extra, says in bad.items():
        r = CliRunner().invoke(app, base + list(extra))
        assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, (extra, r.output)
    r = CliRunner().invoke(app, base[:-6] + ["--pp", "2"])  # the command's default precision: autocast
    assert r.exit_code == 2 and "--precision amp-bf16 is not traced under --pp" in r.output


def test_first_stage_embedding_gradients_take_fresh_segments():
    """Rank 0 of a (pp 2, dp 2, tp 2) mesh with sequence parallelism, torchtitan's bf16 policy with fp32 reduction,
    a 128,256-word vocabulary: the embedding's first backward makes its whole-vocabulary bf16 gradient (501 MiB) and
    the post-backward its fp32 accumulator (1,002 MiB), each larger than any block the stage freed before, so both
    take segments of their own beside what the stage had reserved. The traced step's storages replayed through the
    caching allocator reserve 3.11 GiB; the estimate counts 3.01 (2.97 without the mechanism): the rest is the
    backward's own fragmentation."""
    from memcalc.memory.allocator.reserved import reserved_peak

    cfg = dict(CFG, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=4, vocab_size=128256, max_position_embeddings=4096)
    spec = StepSpec(1024, 1, "fp32", "fused", "full", "sdpa")
    traced = trace_pipeline_rank(cfg, spec, pp=2, dp=2, rank=0, micro_batches=4, tp=2, fsdp_param_dtype="bf16",
                                 reduce_fp32=True, record_blocks=True)  # fmt: skip
    tl = stage_timeline(architecture_from_config(cfg), family="llama", regime="fp32", attention="sdpa", s=1024, b=1,
                        pp=2, rank=0, micro_batches=4, chunks=(range(2),), recompute="full", optimizer_impl="fused",
                        device="cpu", world=2, tp=2, sequence_parallel=True, fsdp_param_dtype="bf16",
                        fsdp_reduce_fp32=True)  # fmt: skip
    assert 0 <= traced.peak - tl.peak.live_bytes < 0.002 * traced.peak
    eg = 128256 * 2048
    assert (tl.loss_blocks, tl.fresh_detail) == (
        2 * eg + 4 * eg, "the blocks reserved before them, too small for the embedding's whole-vocabulary gradients")
    assert tl.moments[tl.fresh_from].label == "micro-batch 0: the embedding's backward"
    assert tl.moments[tl.loss_moment].label == "micro-batch 0: the embedding's gradient upcast into its accumulator"
    held, _, kept = reserved_peak(tl.moments, tl.loss_moment, 0, loss_blocks=tl.loss_blocks, fresh_from=tl.fresh_from)
    without = reserved_peak(tl.moments)[0]
    before = max(m.live_bytes for m in tl.moments[:tl.fresh_from])
    own = tl.moments[tl.loss_moment].live_bytes
    assert kept == before - (own - tl.loss_blocks) > 0 and held == own + kept == before + tl.loss_blocks
    assert without < held <= traced.peak_reserved < 1.04 * held


def test_405b_first_stage_reserved_against_the_replayed_trace():
    """Stage 0 of torchtitan's 405B pipeline (15 of 126 layers, pp 8 x dp 8 x tp 8 with SP, 8 micro-batches of
    4 x 8192 tokens, the bf16 policy with fp32 reduction, full recompute), traced on fake tensors and replayed through
    the caching allocator: allocated within 0.5 MiB; 77.6 GiB reserved, of which the estimate counts 74.5 (71.7 without the
    embedding's fresh segments), the rest the first backward's per-layer fragmentation."""
    cfg = dict(CFG, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192)
    spec = StepSpec(8192, 4, "fp32", "fused", "full", "sdpa")
    split = [15, 16, 16, 16, 16, 16, 16, 15]
    traced = trace_pipeline_rank(cfg, spec, pp=8, dp=8, rank=0, micro_batches=8, tp=8, fsdp_param_dtype="bf16",
                                 reduce_fp32=True, record_blocks=True, stage_layers=split)  # fmt: skip
    tl = stage_timeline(architecture_from_config(cfg), family="llama", regime="fp32", attention="sdpa", s=8192, b=4,
                        pp=8, rank=0, micro_batches=8, chunks=(range(15),), recompute="full", optimizer_impl="fused",
                        device="cpu", world=8, tp=8, sequence_parallel=True, fsdp_param_dtype="bf16",
                        fsdp_reduce_fp32=True)  # fmt: skip
    assert 0 <= traced.peak - tl.peak.live_bytes < 2**19  # 71.7 GiB
    from memcalc.memory.allocator.reserved import reserved_peak

    held = reserved_peak(tl.moments, tl.loss_moment, 0, loss_blocks=tl.loss_blocks, fresh_from=tl.fresh_from)[0]
    assert traced.peak + 2.5 * GiB < held <= traced.peak_reserved < 1.05 * held


def test_the_repeated_actions_left_out_give_every_actions_figures():
    """``stage_timeline(every_micro_batch=False)`` leaves out the moments of actions that repeat an earlier action's
    state (the steady phase): the peak moment (phase, label, parts), the phase peaks, the reserved peaks with and
    without side streams and the moments the loss and fresh-block indices name are every action's, over 1F1B and
    interleaved ranks, 2 to 5 stages, up to 24 micro-batches, recompute policies, dtypes, reduce dtypes and TP + SP."""
    from memcalc.memory.allocator.reserved import reserved_peak

    arch, arch_tp = architecture_from_config(CFG), architecture_from_config(CFG_TP)
    checked = shorter = 0
    for pp, virtual in ((2, 1), (3, 1), (5, 1), (2, 2), (3, 2), (2, 3)):
        if pp * virtual > CFG["num_hidden_layers"]:
            continue
        for n in sorted({pp, 2 * pp, 4 * pp, 8 * pp} if virtual > 1 else {1, pp - 1, pp, pp + 1, 3 * pp, 24}):
            for precision, recompute, mp, reduce_fp32, tp in (("bf16", "none", None, False, 1),
                                                              ("fp32", "full", "bf16", True, 1),
                                                              ("bf16", "full", None, False, 2)):
                for rank in range(pp):
                    kw = dict(family="llama", regime=precision, attention="sdpa", s=S, b=B, pp=pp, rank=rank,
                              micro_batches=max(1, n), chunks=_chunks(pp, rank, virtual), recompute=recompute,
                              optimizer_impl="fused", device="cpu", world=2, fsdp_param_dtype=mp,
                              fsdp_reduce_fp32=reduce_fp32, tp=tp, sequence_parallel=tp > 1)
                    a = arch_tp if tp > 1 else arch
                    every = stage_timeline(a, **kw)
                    few = stage_timeline(a, **kw, every_micro_batch=False)
                    assert few.peak == every.peak and few.phase_peaks == every.phase_peaks, kw
                    assert list(few.phase_peaks) == list(every.phase_peaks)
                    for streams in (False, True):
                        assert reserved_peak(few.moments, few.loss_moment, few.loss_cache, streams, few.loss_blocks,
                                             few.fresh_from) == reserved_peak(every.moments, every.loss_moment,
                                                                              every.loss_cache, streams,
                                                                              every.loss_blocks, every.fresh_from)
                    assert (few.loss_cache, few.loss_blocks, few.fresh_detail) == (
                        every.loss_cache, every.loss_blocks, every.fresh_detail)
                    for i, j in ((few.loss_moment, every.loss_moment), (few.fresh_from, every.fresh_from)):
                        assert (i < 0) == (j < 0) and (i < 0 or few.moments[i] == every.moments[j])
                    assert few.moments[0] == every.moments[0] and few.moments[-1] == every.moments[-1]
                    checked += 1
                    shorter += len(few.moments) < len(every.moments)
    assert checked >= 150 and shorter >= 40, (checked, shorter)
