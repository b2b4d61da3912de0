"""Reserved memory beyond the live bytes (memcalc.memory.allocator.reserved): the loss's freed logits, FSDP2's stream pools and
the forward's blocks beside the loss's."""

import statistics
import sys
from pathlib import Path

import pytest

import memcalc
from memcalc.memory.allocator.allocator import GAP_LOW
from memcalc.memory.allocator.caching import replay
from memcalc.memory.allocator.reserved import blocks_at_peak, cached_at_peak, loss_cached, loss_events, reserved_peak
from memcalc.memory.engine.timeline import Moment
from memcalc.units import GiB

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import generate_published as published

T, V = 4096, 32000


def test_the_bf16_logits_block_is_left_cached_at_the_loss_peak():
    # logits 2n, fp32 copy 4n, log-softmax 4n; the backward's second fp32 gradient cannot use the freed 2n block
    assert loss_cached(T, V, 2) == 2 * T * V
    assert loss_cached(T, V, 2, parallel=True) == 2 * T * V
    # fp32 logits: no copy; the freed logits' block serves the first gradient
    assert loss_cached(T, V, 4) == 0
    # inductor's fused loss: logits saved, their gradient in the same dtype; only the per-token stats' small segment
    assert loss_cached(T, V, 2, compiled=True) < 2 << 20
    assert loss_events(T, V, 2, "chunked:8") == [] and loss_events(T, V, 2, "fused") == []


@pytest.mark.parametrize("dtype, width", [("bfloat16", 2), ("float32", 4)])
def test_loss_events_match_the_storages_torch_allocates(dtype, width):
    """cross_entropy(logits.float()) and its backward on fake tensors, every storage logged in order and replayed:
    the bytes cached and free at the most-live moment are the replay of memcalc's own events (the traced log adds
    the loss scalar's and the labels' small-pool segment)."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memcalc.validation.trace_tracker import LiveBytes

    with FakeTensorMode():
        h = torch.randn(T, 8, dtype=getattr(torch, dtype), requires_grad=True)
        w = torch.randn(8, V, dtype=getattr(torch, dtype), requires_grad=True)
        y = torch.randint(0, V, (T,))
        log = LiveBytes(record_timeline=False, record_blocks=True)
        with log:
            logits = h @ w
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            del logits  # the Trainer keeps only the loss; torchtitan's train step deletes pred
            loss.backward()
            del loss
    traced = cached_at_peak(log.blocks)
    assert 0 <= traced - loss_cached(T, V, width) <= 4 << 20


def test_side_stream_pools_are_reserved_for_the_whole_step():
    moments = [Moment("forward", "gather", 100, (("layer", 60), ("all-gather output (this layer)", 40))),
               Moment("backward", "loss", 300, (("activations", 300),)),
               Moment("optimizer", "step", 150, (("parameters", 100), ("gradients (shards)", 50)))]
    # default stream: its own bytes at each moment (60, 300, 100), the loss's cache at moment 1
    assert reserved_peak(moments, 1, 20, streams=True) == (300 + 20 + 40 + 50, [40, 50], 0)
    assert reserved_peak(moments, 1, 20, streams=False) == (320, [0, 0], 0)
    # the loss's cache counts only where its moment is the default stream's peak
    assert reserved_peak(moments, 0, 20, streams=True) == (300 + 40 + 50, [40, 50], -1)
    assert reserved_peak(moments, 0, 20, streams=False) == (300, [0, 0], -1)


MiB = 1 << 20


def test_the_forward_blocks_stay_beside_the_loss():
    """Replayed through the caching allocator: four checkpointed layers, each keeping a 32 MiB checkpoint and making
    two 128 MiB transients in its forward, then the head's input and the standard loss over 8,192 tokens of a
    32,000-word vocabulary (bf16 logits, 500 MiB: larger than any forward tensor). The loss takes fresh segments
    for all of its blocks; the forward's stay reserved beside them."""
    fwd = []
    for i in range(4):
        fwd += [(f"ckpt {i}", 32 * MiB), (f"a {i}", 128 * MiB), (f"b {i}", 128 * MiB), (f"a {i}", -1), (f"b {i}", -1)]
    fwd += [("head input", 64 * MiB)]
    loss = loss_events(8192, 32000, 2)
    live, cached = blocks_at_peak(loss)
    assert (live, cached) == (3 * 4 * 8192 * 32000, 2 * 8192 * 32000)  # log-softmax, two gradients; the logits
    forward, step = replay(fwd), replay(fwd + loss)
    assert step.peak_reserved == forward.peak_reserved + live + cached
    # the timeline's view: the most live before the loss (the last layer's transients over four checkpoints), then
    # the loss's moment (the checkpoints and the head's input beside the loss's blocks)
    before, kept = 4 * 32 * MiB + 2 * 128 * MiB, 4 * 32 * MiB + 64 * MiB
    moments = [Moment("forward.layer.3", "transients", before, (("layers", before),)),
               Moment("backward", "loss", kept + live, (("kept", kept), ("loss", live)))]
    held, _, forward_cached = reserved_peak(moments, 1, cached, loss_blocks=live)
    assert forward_cached == before - kept
    assert held == before + live + cached
    # without the forward's blocks the estimate was the loss's moment and its freed logits only
    assert reserved_peak(moments, 1, cached)[0] == kept + live + cached
    # what the forward reserved beyond its most live bytes (best fit splitting a freed transient for the next
    # checkpoint) is not counted: the estimate stays at or below the replay
    assert held <= step.peak_reserved
    assert step.peak_reserved - held == forward.peak_reserved - before


def _titan(**kw):
    return memcalc.estimate(**(published.TITAN | kw))


def test_fsdp2_reserved_adds_the_logits_block_and_both_stream_pools():
    r = _titan(gpus=8, micro_batch=2, recompute="op-sac")
    g = r.memory.per_gpu
    h, v, layers = 4096, 128256, 32
    logits = 2 * 2 * 8192 * v  # bf16, micro-batch 2 x 8192 tokens
    root = 2 * (2 * v * h + h)  # embedding, head and final norm gathered in bf16 (8 ranks divide them evenly)
    layer = 2 * (2 * h * h + 2 * h * 1024 + 3 * h * 14336 + 2 * h)  # q, o; k, v (8 of 32 heads); MLP; 2 norms
    grads = 4 * (layers * layer // 2 + root // 2) // 8  # fp32 gradient shards of every parameter
    # the copy-in pool holds the root's and one layer's all-gather outputs at once (layer 0's gather); at the peak the
    # last layer's output is alive (counted in the allocated peak), so the root's is what the pool adds
    # and the forward's blocks (its most live bytes, the last layer's op-SAC transients, less what the loss's moment
    # keeps beside its own blocks): less than the last MLP's two intermediates (16,384 tokens x 14,336 in bf16)
    forward = g.peak_reserved - g.peak_allocated - (GAP_LOW + logits + (root + layer) - layer + grads)
    assert 0 < forward < 2 * 2 * 2 * 8192 * 14336
    detail = next(x.detail for x in g.rows if x.key == "allocator_reserve")
    assert f"the forward's blocks, too small for the loss's, {forward / GiB:.2f} GiB" in detail
    # released before a cudaMalloc fails: the total and the verdict are the allocated peak's
    assert g.total == g.peak_allocated + GAP_LOW + g.cuda_context + 2 ** 27  # NCCL: 16 channels x 2 peers x 4 MiB
    assert "cached blocks the peak cannot use" in next(x.detail for x in g.rows if x.key == "allocator_reserve")


def test_fresh_blocks_from_a_marked_moment():
    """Blocks made before the fresh ones count: the most live before the first moment that holds one (fresh_from),
    not the most before the moment that holds them all (a pipeline stage's embedding gradient, then its upcast)."""
    moments = [Moment("forward", "a", 300, (("a", 300),)),
               Moment("backward", "bf16 gradient", 450, (("kept", 250), ("gradient", 200))),
               Moment("backward", "its fp32 accumulator", 850, (("kept", 250), ("gradient", 200), ("acc", 400)))]
    held, _, kept = reserved_peak(moments, 2, 0, loss_blocks=600, fresh_from=1)
    assert (held, kept) == (300 + 600, 300 - 250)
    # the default (the first moment with logits): none here, so every moment before the marked one counts
    assert reserved_peak(moments, 2, 0, loss_blocks=600)[0] == 450 + 600


def test_a_pipeline_first_stage_names_its_fresh_blocks():
    r = memcalc.estimate(**published.TORCHTITAN_PP[0][2])  # Table 5's 1F1B: stage 0 is the most loaded
    assert r.memory.most_loaded_stage == 0
    detail = next(x.detail for x in r.memory.per_gpu.rows if x.key == "allocator_reserve")
    assert "the blocks reserved before them, too small for the embedding's whole-vocabulary gradients" in detail
    assert r.memory.stages[0].peak_reserved == r.memory.per_gpu.peak_reserved


def test_each_pipeline_stage_carries_its_reserved_peak():
    """Table 5's interleaved row: stage 1 allocates the most (its second chunk's first backward), stage 0 reserves the
    most (its embedding's gradients, made after its second chunk's were reduced, in segments of their own)."""
    r = memcalc.estimate(**published.TORCHTITAN_PP[1][2])
    stages = r.memory.stages
    assert r.memory.most_loaded_stage == 1 and r.memory.per_gpu.peak_reserved == stages[1].peak_reserved
    assert max(stages, key=lambda st: st.peak_reserved).stage == 0
    assert stages[0].total < stages[1].total and stages[0].peak_reserved > stages[1].peak_reserved + 10 * GiB
    assert all(isinstance(st.peak_reserved, int) and st.peak_reserved > st.total for st in stages)
    # the paper accounting has no reserved peak per stage
    paper = memcalc.estimate(**published.TORCHTITAN_PP[1][2], accounting="paper")
    assert all(st.peak_reserved is None for st in paper.memory.stages)


def test_the_reserved_peak_never_passes_what_the_gpu_leaves_the_allocator():
    # on an 80 GB H100 the same step's cached blocks do not all fit beside it: the allocator reserves what is left
    r = _titan(gpus=8, micro_batch=2, recompute="op-sac", gpu="h100")
    g, fit = r.memory.per_gpu, r.memory.fit
    assert g.peak_allocated + GAP_LOW < g.peak_reserved == fit.usable_bytes - g.cuda_context - 2 ** 27


def test_torchtitan_published_reserved_memory():
    """torchtitan's Dec-2024 H100 benchmark and a June-2025 H200 run (its logged "Memory", max_memory_reserved):
    every row within 15 %, the median within 10 % (docs/timeline.md)."""
    errors = []
    for name, measured, kw in published.TORCHTITAN + published.TORCHTITAN_2025:
        got = memcalc.estimate(**kw).memory.per_gpu.peak_reserved / GiB
        errors.append(abs(got - measured) / measured)
        assert errors[-1] < 0.15, (name, got, measured)
    assert statistics.median(errors) < 0.10


def test_reserved_at_llama_3_70b_widths_against_the_replayed_trace():
    """Two layers of Llama 3 70B's widths as Table 4 of torchtitan's benchmark runs them (TP 8 with sequence
    parallelism over 256 ranks, FSDP2's bf16 policy with fp32 reduction, full recompute, 16 x 8192 tokens), traced
    on fake tensors and every allocation replayed through the caching allocator (one stream). The forward's phases
    are the trace's; the reserved peak counts the forward's blocks beside the loss's fresh segments, and stays below
    the replay by what the forward's own fragmentation reserves beyond its most live bytes."""
    pytest.importorskip("transformers")
    import json

    from memcalc.memory.engine.timeline import timeline
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.validation.trace import trace_step
    from memcalc.validation.trace_step import cache_promotes_values

    cfg = json.loads((Path(__file__).parent / "data" / "llama-3-8b-config.json").read_text())
    cfg.update(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
               num_hidden_layers=2)
    tr = trace_step(cfg, seq_len=8192, micro_batch=16, precision="fp32", fsdp_param_dtype="bf16",
                    fsdp_reduce_fp32=True, recompute="full", world=256, tp=8, fsdp=True, sequence_parallel=True)
    tl = timeline(architecture_from_config(cfg), family="llama", regime="fp32", attention="sdpa", s=8192, b=16,
                  recompute="full", optimizer_impl="foreach", world=32, fsdp_param_dtype="bf16",
                  fsdp_reduce_fp32=True, tp=8, sequence_parallel=True, cache_promotes_values=cache_promotes_values())
    for phase in ("forward.layer.0", "forward.layer.1", "forward.head", "loss", "backward.layer.0"):
        assert tl.phase_peaks[phase] == tr.phase_peaks[phase], phase
    # the loss's backward: its per-token target vectors left out (48 B a token at most)
    assert 0 <= tr.peak - tl.peak.live_bytes <= 48 * 16 * 8192
    held, _, forward = reserved_peak(tl.moments, tl.loss_moment, tl.loss_cache, loss_blocks=tl.loss_blocks)
    old = reserved_peak(tl.moments, tl.loss_moment, tl.loss_cache)[0]
    assert held - old == forward > 4 * GiB  # a checkpointed layer's transients under SP: gathered inputs, partials
    assert old < held <= tr.peak_reserved < 1.05 * held  # 46.6 GiB replayed, 44.5 counted (39.4 without them)
