"""The interleaved pipeline schedule as torch runs it, and what an FSDP2 rank holds at its peak under it."""

from __future__ import annotations

import pytest

import memcalc
from memcalc.memory.overlays.pipeline import interleaved_ops, interleaved_peak, receive_buffers
from memcalc.units import GiB


@pytest.mark.parametrize("pp, n, v", [(8, 8, 2), (8, 32, 2), (4, 8, 2), (4, 4, 3), (2, 6, 4)])
def test_interleaved_ops_are_torchs(pp: int, n: int, v: int) -> None:
    # torch's own order (torch/distributed/pipelining/schedules.py), built without stages or a process group
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    s = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = pp, v, n
    s.number_of_rounds = max(1, n // pp)
    s.microbatches_per_round = n // s.number_of_rounds
    for rank in range(pp):
        s.rank = rank
        theirs = [(a.computation_type != schedules._ComputationType.FORWARD, a.stage_index // pp)
                  for a in s._calculate_single_rank_operations(rank) if a is not None]  # fmt: skip
        assert list(interleaved_ops(rank, pp, n, v)) == theirs


def test_the_interleaved_peak_follows_the_schedule() -> None:
    # pp 8, 8 micro-batches, 2 chunks: rank 0 runs all 16 forwards first, then chunk 1's backwards: its gradients are
    # reduced before chunk 0's first backward, so the two never coexist
    a, g, alive, done = interleaved_peak(0, 8, 8, [10, 10], [1000, 1000])
    assert (a, g, alive, done) == (160, 1000, (8, 8), (0, 0))
    # 32 micro-batches: both chunks' accumulators are alive together during the steady phase
    a, g, alive, done = interleaved_peak(0, 8, 32, [10, 10], [1000, 1000])
    assert g == 2000 and sum(alive) == 23  # warm-up 22 + the steady phase's forward


def test_interleaving_holds_less_than_1f1b_by_what_torchtitan_measured() -> None:
    # torchtitan's Table 5 (benchmarks/llama3_h100_202412_torchtitan.md: 405B, FSDP 8 x TP 8 x PP 8, 8 micro-batches
    # of 4 x 8192): 1F1B 82.5 GiB, interleaved 72.7 GiB, 9.8 GiB apart. The paper accounting's rows (the realistic
    # replay: tests/test_pipeline_realistic.py; both below either figure: docs/timeline.md). What the schedule decides, the checkpoints in flight and the unsharded
    # gradients alive beside them, is 10.2 GiB apart here; the interleaved rank's second stage has receive buffers
    # and stage outputs of its own (torch_stage_rows), which leave the totals 6.9 GiB apart
    kw = dict(framework="torchtitan", gpu="h100-96g", precision="bf16-mixed", fsdp="FULL_SHARD", fsdp_version=2,
              attention="flash", model="llama-3-405b", seq_len=8192, gpus=512, tp=8, pp=8, sequence_parallel=True,
              recompute="full", compile=True, float8="tensorwise", float8_all_gather=True, micro_batch=4,
              grad_accum=8, accounting="paper")  # fmt: skip
    plain, inter = memcalc.estimate(**kw).memory, memcalc.estimate(**kw, virtual_stages=2).memory

    def scheduled(m) -> int:
        return sum(r.bytes for r in m.per_gpu.rows if r.key in ("activations_layers", "pipeline_unsharded_gradients"))

    assert (scheduled(plain) - scheduled(inter)) / GiB == pytest.approx(82.5 - 72.7, rel=0.1)
    # the most loaded rank is 1 in both: a stage boundary is 4 x 8192 / 8 tokens x 16384 x 2 bytes = 128 MiB; 1F1B's
    # stage 1 has 8 + 8 receive buffers and 7 micro-batches in flight, the interleaved rank's stages 1 and 9 twice the
    # buffers and all 8 micro-batches of each (it runs its 16 forwards first)
    boundary = 4 * 8192 // 8 * 16384 * 2
    for m, buffers, outputs in ((plain, 16, 7), (inter, 32, 16)):
        assert m.most_loaded_stage == 1
        rows = {r.key: r.bytes for r in m.per_gpu.rows}
        assert (rows["pipeline_receive_buffers"], rows["pipeline_stage_outputs"]) == (buffers * boundary,
                                                                                     outputs * boundary)
    assert (plain.per_gpu.total - inter.per_gpu.total) / GiB == pytest.approx(6.9, abs=0.1)


def test_receive_buffers_are_the_ones_torchs_stages_allocate() -> None:
    # torch's PipelineStage as rank 1 of 4 under the fake process group: the buffers it makes for 5 micro-batches
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._utils import InferenceMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    b, s, h, n, stages = 2, 16, 32, 5, 4
    boundary = b * s * h * 4
    x, y = torch.empty(b, s, h), torch.empty(b, s, h, requires_grad=True)
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=stages)
    try:
        for k in range(stages):
            stage = PipelineStage(torch.nn.Linear(h, h), k, stages, torch.device("cpu"), input_args=(x,),
                                  output_args=(y,))
            stage._inference_mode = InferenceMode.STATIC  # what the schedule's first step decides
            stage._prepare_forward_infra(n, (x,) if k == 0 else None, {}, True)
            stage._prepare_backward_infra(n)
            held = sum(a.buffer.numel() * a.buffer.element_size()
                       for infos in (stage.args_recv_info, stage.grad_recv_info) for t in infos.values() for a in t
                       if a.buffer is not None)  # fmt: skip
            assert held == receive_buffers(k, stages, n) * boundary
            assert held == {0: n, stages - 1: n}.get(k, 2 * n) * boundary
    finally:
        dist.destroy_process_group()


def test_1f1b_stage_rows_follow_the_schedule() -> None:
    # 32 layers over 4 stages, 6 micro-batches of 2 x 4096, tp 2 with sequence parallelism: a stage boundary is the
    # rank's half of the sequence, 2 x 2048 x 4096 x 2 bytes; stage k holds min(4 - k, 6) micro-batches at its peak
    kw = dict(framework="torchtitan", precision="bf16-mixed", fsdp="FULL_SHARD", model="llama-3-8b", seq_len=4096,
              micro_batch=2, grad_accum=6, gpus=16, tp=2, pp=4, sequence_parallel=True, recompute="full",
              attention="flash", accounting="paper")  # fmt: skip
    from memcalc.evaluate import _stage, evaluate
    from memcalc.inputs.build import build_input
    from memcalc.inputs.plan import to_plan
    from memcalc.memory.accountings import activations as act
    from memcalc.memory.accountings import paper

    plan = to_plan(build_input(**kw))
    boundary = 2 * 2048 * 4096 * 2
    st = paper.setting(plan)
    rebuilt = (act.layer_activations(plan.arch, st, 2, True, "none", dtensor=True).total
               - act.layer_activations(plan.arch, st, 2, True, "full", dtensor=True).total)

    for k in range(4):
        _, gpu, _, _ = _stage(plan, k, st)
        rows = {r.key: r.bytes for r in gpu}
        flight = min(4 - k, 6)
        assert rows["pipeline_receive_buffers"] == receive_buffers(k, 4, 6) * boundary
        assert rows["pipeline_stage_outputs"] == (flight if k < 3 else 0) * boundary
        # torch 2.13: only the previous backward's, held by Schedule1F1B's send ops (traced)
        assert rows["pipeline_input_gradients"] == (boundary if k > 0 and 6 - flight > 0 else 0)
        assert rows["activations_layer_backward"] == rebuilt + boundary
        # bf16 gradients of the rank's q, o (4096 x 4096 / 2), k, v (4096 x 1024 / 2), three MLP matrices, two norms
        assert rows["pipeline_layer_gradients"] == 2 * (2 * 4096 * 4096 // 2 + 2 * 4096 * 1024 // 2
                                                        + 3 * 4096 * 14336 // 2 + 2 * 4096)  # fmt: skip
    assert evaluate(plan).top == 3  # the last stage: its logits and their fp32 copy (2 x 4096 tokens x 128256 / 2)


def _peak_by_every_action(rank: int, pp: int, n: int, act: list[int], grad: list[int]) -> tuple:
    """The interleaved peak walked over every action of the schedule (the reference ``interleaved_peak`` keeps to)."""
    v = len(act)
    alive, done, live = [0] * v, [0] * v, [False] * v
    a = g = 0
    best: tuple = (-1, 0, 0, (), ())
    for backward, c in interleaved_ops(rank, pp, n, v):
        if backward:
            if not live[c]:
                live[c], g = True, g + grad[c]
        else:
            alive[c], a = alive[c] + 1, a + act[c]
        if a + g > best[0]:
            best = (a + g, a, g, tuple(alive), tuple(done))
        if backward:
            alive[c], a = alive[c] - 1, a - act[c]
            done[c] += 1
            if done[c] >= n:
                live[c], g = False, g - grad[c]
    return best[1], best[2], best[3], best[4]


def test_the_interleaved_peak_scans_the_schedules_distinct_moments_exactly() -> None:
    import random

    rng = random.Random(49)
    for pp in (2, 3, 4, 8, 16):
        for n in (pp, 2 * pp, 3 * pp, 8 * pp, 5 * pp + 1):
            for v in (1, 2, 3, 4):
                for rank in range(pp):
                    for _ in range(3):
                        act = [rng.choice((0, 1, rng.randrange(1, 10**9))) for _ in range(v)]
                        grad = [rng.choice((0, 1, rng.randrange(1, 10**10))) for _ in range(v)]
                        assert interleaved_peak(rank, pp, n, act, grad) == _peak_by_every_action(rank, pp, n, act,
                                                                                                 grad)
