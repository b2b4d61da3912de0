"""Megatron-Core's own code on CPU against memcalc's Megatron accounting: the local-spec GPT layer's saved tensors
(memcalc.validation.trace_megatron) and the pipeline schedule's warm-up count. Needs megatron-core (a venv of its
own in CI: .ci/run); skipped where it is not importable."""

import pytest

pytest.importorskip("megatron.core")

from memcalc.memory.accountings.megatron import chunks_in_flight, in_flight  # noqa: E402
from memcalc.memory.families.megatron_saved import Shape, layer_bytes  # noqa: E402
from memcalc.validation.trace_megatron import trace  # noqa: E402

SHAPE = dict(hidden=64, heads=8, kv_heads=2, ffn=160)


@pytest.mark.parametrize("tp,modules", [(1, ()), (2, ()), (2, ("core_attn",)), (2, ("mlp",))])
def test_local_layer_saved_set(tp, modules):
    """Every decoder layer but the first (whose count also holds the model's causal mask) saves what
    megatron_saved counts for the local spec, within 512 bytes (0.3 %); under core_attn's checkpoint the CPU's RNG
    states it keeps (5 KiB, a few bytes on CUDA) besides. (``layernorm`` recompute needs Transformer Engine.)"""
    s, b = 32, 2
    got = trace(layers=3, **SHAPE, s=s, b=b, tp=tp, modules=modules)
    want = layer_bytes(Shape(64, 64, 16, 160, True, 8, "rmsnorm", s, b, tp, False), "local", False, modules)
    for n in got["layers"][1:]:
        extra = 5 * 1024 if "core_attn" in modules else 0
        assert 0 <= n - want + 512 <= 1024 + extra, (got, want)


def test_local_layer_scales_with_sequence():
    """Doubling the sequence: the a·s² probabilities quadruple, the rest doubles, as counted."""
    got = trace(layers=2, **SHAPE, s=64, b=1, tp=2)
    want = layer_bytes(Shape(64, 64, 16, 160, True, 8, "rmsnorm", 64, 1, 2, False), "local")
    assert abs(got["layers"][1] - want) <= 512


@pytest.mark.parametrize("pp,v,m", [(4, 1, 8), (4, 5, 8), (8, 5, 16), (2, 2, 2), (4, 2, 3)])
def test_in_flight_matches_megatron_schedule(pp, v, m, monkeypatch):
    """memcalc's chunk micro-batches in flight = Megatron-Core's warm-up count + 1 (capped at all of them)."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table

    for rank in range(pp):
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: pp)
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_rank", lambda r=rank: r)
        monkeypatch.setattr(ps, "get_virtual_pipeline_model_parallel_world_size", lambda: v if v > 1 else None)
        total, all_warm, warm, _ = get_pp_rank_microbatches(m, v, pp)
        assert in_flight(rank, pp, m, v) == (total if all_warm else warm + 1)
        if v > 1:  # which chunks those forwards ran: the schedule table's first entries
            table = get_schedule_table(m, v, pp)
            assert chunks_in_flight(rank, pp, m, v) == [c for _, c in table[:in_flight(rank, pp, m, v)]]


@pytest.mark.parametrize("dp,overlap,bucket", [(4, False, None), (8, True, 20_000), (3, True, 30_000)])
def test_distributed_optimizer_states(dp, overlap, bucket):
    """Megatron-Core's DDP and distributed optimizer on rank 0 of dp (fake process group): fp32 grad buffers, each
    bucket padded to a multiple of lcm(dp, 128); the fp32 master shard and both Adam moments 4 bytes per element of
    the rank's 1/dp of the buffers: 12·n/dp, as memory/accountings/megatron.py counts them; its padding an upper bound."""
    import math

    from memcalc.memory.accountings.megatron import buffer_elements
    from memcalc.validation.trace_megatron import states

    got = states(dp=dp, overlap=overlap, bucket_size=bucket)
    lcm = math.lcm(dp, 128)
    numel = 0
    for buf in got["buffers"]:
        assert buf["grad_dtype"] == "torch.float32"
        for unpadded, padded in buf["buckets"]:
            assert padded == -(-unpadded // lcm) * lcm
        numel += buf["numel"]
        assert buf["unpadded"] <= buf["numel"] <= buffer_elements(buf["unpadded"], dp, True, bucket)
    assert got["master"] == got["exp_avg"] == got["exp_avg_sq"] == 4 * numel // dp
