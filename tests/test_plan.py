"""memcalc plan: the search's answers are estimate's answers, its pruning is sound, and its bad inputs are one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.evaluate import evaluate
from memcalc.inputs.build import build_input
from memcalc.inputs.plan import to_plan
from memcalc.planning import search as S
from memcalc.planning.space import SPACES, Shape, micro_batches, settings
from memcalc.planner import parse_gpus, parse_prices

runner = CliRunner()
JOB = dict(model="llama-3-8b", seq_len=8192, global_batch=16, gpus=8, gpu="h100")


@pytest.fixture(scope="module")
def small() -> memcalc.PlanResult:
    return memcalc.plan(**JOB, top=6)


def test_plan_is_pydantic_and_its_json_keeps_the_contract(small) -> None:
    import pydantic

    assert isinstance(small, pydantic.BaseModel)
    d = json.loads(small.model_dump_json())
    assert d["schema_version"] == 1
    assert {"job", "evaluated", "feasible", "seconds", "plans"} <= set(d)
    p = d["plans"][0]
    assert {"rank", "gpu", "gpus", "framework", "layout", "strategy", "recompute", "micro_batch", "grad_accum",
            "accounting", "memory", "time", "estimate_args"} <= set(p)
    assert set(p["layout"]) == {"dp", "tp", "pp", "cp", "ep", "virtual_stages"}
    assert set(p["memory"]) == {"peak_allocated", "peak_reserved", "verdict", "headroom_bytes"}
    assert set(p["time"]) == {"step_s", "tokens_per_s_per_gpu", "mfu", "time_to_train_s", "cost"}
    assert memcalc.PlanResult.model_json_schema()["title"] == "PlanResult"


def test_plans_fit_are_ranked_and_make_the_global_batch(small) -> None:
    assert [p.rank for p in small.plans] == list(range(1, len(small.plans) + 1))
    steps = [p.time.step_s for p in small.plans]
    assert steps == sorted(steps)
    for p in small.plans:
        lay = p.layout
        assert p.memory.verdict == "fits"
        assert lay.dp * lay.tp * lay.pp * lay.cp == p.gpus == 8
        assert p.micro_batch * p.grad_accum * lay.dp == 16
    assert small.evaluated >= small.checked >= small.feasible >= len(small.plans)


def test_every_plan_is_reproduced_by_estimate_with_its_arguments(small) -> None:
    for p in small.plans + ([small.closest_miss.plan] if small.closest_miss else []):
        r = runner.invoke(app, ["estimate", *p.estimate_args, "--json"])
        assert r.exit_code == 0, (p.estimate_args, r.output)
        d = json.loads(r.stdout)
        assert d["memory"]["per_gpu"]["peak_reserved"] == p.memory.peak_reserved
        assert d["memory"]["per_gpu"]["peak_allocated"] == p.memory.peak_allocated
        assert d["memory"]["fit"]["verdict"] == p.memory.verdict
        assert d["time"]["step_s"] == p.time.step_s
        assert d["accounting"] == p.accounting


def _groups(fw: str, gpus: int = 8, batch: int = 16, model: str = "llama-3-8b", offload: bool = False,
            **extra: object) -> list[S.Group]:
    from memcalc.inputs.presets import load_model

    arch = load_model(model)
    out = []
    for kw in settings(fw, gpus, 8, Shape(arch.layers), {}, offload=offload):
        dp = gpus // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
        pairs = micro_batches(batch, dp, kw.get("pp", 1), kw.get("virtual_stages", 1), {})
        if not pairs:
            continue
        args = dict(kw, model=model, seq_len=4096, gpus=gpus, gpu="h100-sxm", framework=fw,
                    precision=SPACES[fw].precision, **extra)
        try:
            plan = to_plan(build_input(micro_batch=pairs[0][0], grad_accum=pairs[0][1], **args))
        except memcalc.InputError:
            continue
        out.append(S.Group("h100-sxm", gpus, fw, args, plan, tuple(pairs)))
    return out


def test_a_plan_at_another_micro_batch_is_what_build_input_gives() -> None:
    for g in _groups("torchtitan")[:12] + _groups("deepspeed")[:4]:
        for mb, ga in g.pairs[1:3]:
            fast = evaluate(S.with_batch(g.plan, mb, ga))
            slow = evaluate(to_plan(build_input(micro_batch=mb, grad_accum=ga, **g.kwargs)))
            assert fast.total == slow.total, (g.kwargs, mb)
            assert fast.collectives == slow.collectives


def test_the_timing_evaluation_is_the_paper_evaluations_most_loaded_stage() -> None:
    """``evaluate_for_time`` (the search's timing: the first and last pipeline stages and the first of each kind
    between them) names the same most loaded stage as ``evaluate`` over every stage, with the same total, rows,
    collectives and host transfers, on every layout of four frameworks, pipelines of 2 to 32 stages, interleaved or
    not, MoE, LoRA, offload and torchtitan's every:K recompute."""
    from memcalc.evaluate import evaluate_for_time, top_candidates

    sample = (_groups("torchtitan", gpus=32, batch=64) + _groups("megatron", gpus=32, batch=64)
              + _groups("deepspeed", gpus=16, batch=32) + _groups("hf", gpus=16, batch=32)
              + _groups("megatron", gpus=16, batch=64, model="mixtral-8x7b")
              + _groups("torchtitan", gpus=16, batch=32, model="qwen3-30b-a3b")
              + _groups("torchtitan", gpus=16, batch=64, recompute="every:3")
              + _groups("megatron", gpus=16, batch=32, lora_rank=16) + _groups("deepspeed", offload=True))
    shortcut = pipelines = 0
    for g in sample:
        for mb, ga in g.pairs[:3]:
            plan = replace(S.with_batch(g.plan, mb, ga), accounting="paper")
            slow = evaluate(plan)
            fast = evaluate_for_time(plan)
            assert (fast.stages[fast.top].stage, fast.total) == (slow.top, slow.total), (g.kwargs, mb, ga)
            assert fast.gpu_rows == slow.gpu_rows and fast.node_rows == slow.node_rows
            assert fast.collectives == slow.collectives and fast.transfers == slow.transfers
            bare = evaluate_for_time(plan, activations=False)
            assert [r for r in bare.gpu_rows if r.category != "activation"] == \
                [r for r in slow.gpu_rows if r.category != "activation"]
            assert bare.collectives == slow.collectives and bare.transfers == slow.transfers
            pipelines += plan.pp > 1
            shortcut += len(top_candidates(plan)) < plan.pp
    assert pipelines >= 150 and shortcut >= 60, (pipelines, shortcut)


def test_the_step_time_is_the_same_under_the_paper_and_the_realistic_accounting() -> None:
    from memcalc.time.estimate import time_evaluation

    for g in _groups("torchtitan")[:10] + _groups("hf")[:6]:
        if g.plan.accounting != "realistic":
            continue
        real = time_evaluation(evaluate(g.plan), gpu="h100-sxm", optimizer_impl=g.plan.work.optimizer_impl)
        paper = time_evaluation(evaluate(replace(g.plan, accounting="paper")), gpu="h100-sxm",
                                optimizer_impl=g.plan.work.optimizer_impl)
        if g.plan.pp == 1:
            assert real.step_s == paper.step_s
        else:  # the stage whose collectives are timed is the most loaded one, which the accountings may name apart
            assert real.step_s == pytest.approx(paper.step_s, rel=1e-6)


def test_the_model_state_bound_never_exceeds_a_real_peak() -> None:
    """The search's lower bound (parameters, gradients and optimizer states, the paper's rows) is below every
    realistic peak it stands in for, across DDP, FSDP1/2, HSDP, ZeRO 0-3, TP, CP, PP, offload and LoRA."""
    checked = 0
    sample = (_groups("torchtitan") + _groups("torchtitan", gpus=16) + _groups("torchtitan", gpus=16, batch=64)
              + _groups("hf") + _groups("deepspeed")
              + _groups("deepspeed", offload=True) + _groups("hf", offload=True) + _groups("hf", lora_rank=16)
              + _groups("deepspeed", lora_rank=16))
    for g in sample:
        if g.plan.accounting != "realistic":
            continue
        ev = evaluate(replace(g.plan, accounting="paper"))
        real = evaluate(g.plan)
        assert S._lower(ev) <= real.realistic.peak_allocated + g.plan.cuda_context, g.kwargs
        checked += 1
    assert checked >= 40


def test_memory_grows_with_the_micro_batch_in_every_group() -> None:
    """What the search's bisection on the micro-batch rests on: the realistic verdict never improves with it."""
    order = {"fits": 0, "at-risk": 1, "oom": 2}
    pipelines = [g for g in _groups("torchtitan", gpus=16, batch=64) if g.plan.pp > 1][:6]
    for g in _groups("torchtitan", batch=32)[:8] + _groups("hf", batch=32)[:4] + pipelines:
        if g.plan.accounting != "realistic":
            continue
        peaks = [evaluate(S.with_batch(g.plan, mb, ga)).total for mb, ga in g.pairs]
        assert peaks == sorted(peaks), g.kwargs
        verdicts = [order[evaluate(S.with_batch(g.plan, mb, ga)).realistic.verdict] for mb, ga in g.pairs]
        assert verdicts == sorted(verdicts)


def test_a_pipeline_never_needs_less_with_more_micro_batches() -> None:
    """What the search's pipeline probe rests on: at one micro-batch size, the realistic peak of a pipeline rank does
    not fall as the micro-batches per step grow (receive buffers and input slices per micro-batch, min(n, pp - rank)
    in flight)."""
    seen = 0
    for g in _groups("torchtitan", gpus=16, batch=64):
        if g.plan.pp == 1 or g.plan.accounting != "realistic":
            continue
        from memcalc.memory.accountings import realistic

        mb = g.pairs[0][0]
        counts = [n for n in (g.plan.pp, 2 * g.plan.pp, 4 * g.plan.pp, 8 * g.plan.pp)]
        totals = [evaluate(S.with_batch(g.plan, mb, n)).total for n in counts]
        assert totals == sorted(totals), (g.kwargs, counts, totals)
        for stage in (0, g.plan.pp - 1):  # each rank alone, as the search's probe replays them
            peaks = [realistic.evaluate(S.with_batch(g.plan, mb, n), stage).peak_allocated for n in counts]
            assert peaks == sorted(peaks), (g.kwargs, stage, peaks)
        seen += 1
        if seen == 8:
            break
    assert seen >= 4


def test_a_recompute_policy_that_keeps_more_never_needs_less() -> None:
    """What the search's dominance across recompute policies rests on: at one layout, strategy and micro-batch,
    none >= op-sac (torchtitan's per-op policy) >= full in the realistic peak."""
    by: dict = {}
    for g in _groups("torchtitan", batch=32) + _groups("torchtitan", gpus=16, batch=32):
        if g.plan.accounting == "realistic":
            key = S._family(g)
            for mb, ga in g.pairs[:3]:
                by.setdefault((key, mb), {})[g.kwargs["recompute"]] = evaluate(S.with_batch(g.plan, mb, ga)).total
    full = [d for d in by.values() if len(d) == 3]
    assert len(full) >= 10
    for d in full:
        assert d["none"] >= d["op-sac"] >= d["full"], d


def test_the_search_keeps_exactly_what_checking_every_candidate_keeps() -> None:
    """Best-first with the bounds gives the same top plans as checking every candidate's verdict."""
    from memcalc.time.estimate import time_fields

    groups = _groups("torchtitan", batch=32)
    cands = [c for g in groups for c in S.timed(g, time_fields)]
    found = S.search(cands, "time", 5)
    brute = []
    for g in groups:
        for c in S.timed(g, time_fields):
            ev = evaluate(c.plan)
            v = ev.realistic.verdict if ev.realistic else ev.paper_fit.verdict
            if v == "fits":
                brute.append(c)
    brute.sort(key=lambda c: S._tie(c))
    assert [(id(c.group), c.micro_batch) for c in found.kept] == [(id(c.group), c.micro_batch) for c in brute[:5]]
    assert found.replays < len(brute)


def test_hybrid_sharding_is_proposed_only_where_it_differs_from_full_sharding() -> None:
    one_node = [kw for kw in settings("torchtitan", 8, 8, Shape(32), {})]
    assert not any(kw.get("fsdp") == "HYBRID_SHARD" for kw in one_node)
    two = [kw for kw in settings("torchtitan", 16, 8, Shape(32), {})]
    assert any(kw.get("fsdp") == "HYBRID_SHARD" and "tp" not in kw for kw in two)


def test_frameworks_propose_only_what_they_run() -> None:
    ds = list(settings("deepspeed", 16, 8, Shape(32), {}))
    assert all("tp" not in kw and "pp" not in kw and "cp" not in kw for kw in ds)
    assert {kw["stage"] for kw in ds} == {"0", "1", "2", "3"}
    hf = list(settings("hf", 16, 8, Shape(32), {}))
    assert not any("pp" in kw for kw in hf)
    titan = list(settings("torchtitan", 16, 8, Shape(32), {}))
    assert all(kw.get("sequence_parallel") for kw in titan if "tp" in kw)  # torchtitan's TP plan is sequence-parallel
    assert not any(kw.get("ddp") and ("tp" in kw or "pp" in kw or "cp" in kw) for kw in titan)
    mg = list(settings("megatron", 16, 8, Shape(30), {}))
    assert all(30 % (kw.get("pp", 1) * kw.get("virtual_stages", 1)) == 0 for kw in mg)  # Megatron splits evenly


def test_micro_batch_pairs_fill_the_pipeline() -> None:
    assert micro_batches(16, 2, 1, 1, {}) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert micro_batches(16, 2, 4, 1, {}) == [(1, 8), (2, 4)]  # at least pp micro-batches
    assert micro_batches(16, 2, 4, 2, {}) == [(1, 8), (2, 4)]  # interleaved: a multiple of pp
    assert micro_batches(12, 2, 4, 2, {}) == []  # 6 or fewer micro-batches: 6 is no multiple of 4
    assert micro_batches(15, 2, 1, 1, {}) == []


def test_held_flags_narrow_the_search() -> None:
    r = memcalc.plan(**JOB, framework="torchtitan", tp=2, recompute="full", top=3)
    assert r.plans
    assert all(p.layout.tp == 2 and p.recompute == "full" and p.framework == "torchtitan" for p in r.plans)
    assert r.job.fixed["tp"] == 2


# torchtitan's benchmark (benchmarks/llama3_h100_202412_torchtitan.md), Llama 3.1 8B on 8 H100 96GB, FSDP2 (bf16
# parameters, fp32 reduction), torch.compile of the model: (row, global batch, the flags that hold its layout)
PUBLISHED = [
    ("Table 1: FSDP 8, local batch 2, seq 8192, op AC", 8192, 16,
     dict(fsdp="FULL_SHARD", tp=1, pp=1, cp=1, micro_batch=2, recompute="op-sac")),
    ("Table 2: FSDP 8, seq 32768, full AC, float8", 32768, 8,
     dict(fsdp="FULL_SHARD", tp=1, pp=1, cp=1, micro_batch=1, recompute="full")),
    ("Table 2: FSDP 4 x CP 2, seq 65536, full AC, float8", 65536, 4,
     dict(fsdp="FULL_SHARD", tp=1, pp=1, cp=2, micro_batch=1, recompute="full")),
]


@pytest.mark.parametrize("row, seq, batch, held", PUBLISHED, ids=[r[0] for r in PUBLISHED])
def test_a_published_layout_is_feasible_when_held_and_the_free_search_is_no_slower(row, seq, batch, held) -> None:
    job = dict(model="llama-3-8b", seq_len=seq, global_batch=batch, gpus=8, gpu="h100-96g", framework="torchtitan",
               compile=True, float8="tensorwise" if "float8" in row else None)
    job = {k: v for k, v in job.items() if v is not None}
    fixed = memcalc.plan(**job, **held, top=1)
    assert fixed.plans and fixed.plans[0].memory.verdict == "fits", row
    p = fixed.plans[0]
    assert (p.layout.dp, p.layout.cp, p.micro_batch, p.recompute) == (8 // held["cp"], held["cp"],
                                                                      held["micro_batch"], held["recompute"])
    free = memcalc.plan(**job, top=1)
    assert free.plans[0].time.step_s <= p.time.step_s
    assert fixed.unheld_best is not None and fixed.unheld_best.time.step_s == free.plans[0].time.step_s
    assert any(n.startswith("held to --fsdp FULL_SHARD") for n in fixed.notes)


def test_gpu_types_and_counts_each_get_their_best_plan() -> None:
    r = memcalc.plan(model="llama-3-8b", seq_len=4096, global_batch=32, gpus="8,16", gpu="h100,a100-80g",
                     framework="torchtitan", tokens="1e9", price="h100=2.5,a100-80g=1.5", top=3)
    buckets = {(p.gpu, p.gpus) for p in r.best_per_gpu}
    assert buckets == {("h100-sxm", 8), ("h100-sxm", 16), ("a100-sxm-80gb", 8), ("a100-sxm-80gb", 16)}
    assert r.fastest is not None and r.fastest.time.step_s == min(p.time.step_s for p in r.best_per_gpu + r.plans)
    assert r.cheapest is not None and r.cheapest.time.cost == min(p.time.cost for p in r.best_per_gpu + r.plans)
    p = r.plans[0]
    price = 2.5 if p.gpu == "h100-sxm" else 1.5
    assert p.time.time_to_train_s == pytest.approx(1e9 / (p.time.tokens_per_s_per_gpu * p.gpus))
    assert p.time.cost == pytest.approx(price * p.gpus * p.time.time_to_train_s / 3600)


def test_cost_objective_ranks_by_cost() -> None:
    r = memcalc.plan(model="llama-3-8b", seq_len=4096, global_batch=32, gpus="8,16", gpu="h100",
                     framework="torchtitan", objective="cost", tokens="1e9", price=2.0, top=4)
    costs = [p.time.cost for p in r.plans]
    assert costs == sorted(costs)


def test_memory_objective_finds_the_smallest_peaks() -> None:
    r = memcalc.plan(**JOB, framework="torchtitan", objective="memory", top=3)
    totals = [p.memory.headroom_bytes for p in r.plans]
    assert totals == sorted(totals, reverse=True)  # least memory first: most headroom first


def test_nothing_fits_is_said_with_the_closest_candidate() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--seq-len", "262144", "--global-batch", "1",
                            "--gpus", "1", "--gpu", "a100-80g", "--framework", "deepspeed", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["plans"] == []
    assert d["closest_miss"]["over_bytes"] > 0
    assert any("no plan fits" in n for n in d["notes"])


def test_the_table_names_the_search() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--seq-len", "8192", "--global-batch", "16",
                            "--gpus", "8", "--gpu", "h100", "--framework", "torchtitan", "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "Best plans that fit" in r.stdout
    assert "candidates timed" in r.stdout and "candidates/s" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--seq-len", "4096", "--gpus", "8"], "--global-batch"),
    (["--seq-len", "4096", "--global-batch", "16", "--gpus", "0"], "--gpus"),
    (["--seq-len", "4096", "--global-batch", "16", "--gpus", "512..300"], "power of two"),
    (["--seq-len", "4096", "--global-batch", "16", "--gpu", "h100", "--price", "b200=5"], "not among the GPUs"),
    (["--seq-len", "4096", "--global-batch", "16", "--framework", "torchtitanx"], "torchtitan"),
    (["--seq-len", "4096", "--global-batch", "16", "--objective", "speed"], "accepted: time, cost, memory"),
    (["--seq-len", "4096", "--global-batch", "16", "--objective", "cost"], "price"),
    (["--seq-len", "4096", "--global-batch-tokens", "1000000"], "multiple of --seq-len"),
    (["--seq-len", "4096", "--global-batch", "7", "--gpus", "16", "--framework", "deepspeed"], "divides"),
])
def test_bad_inputs_are_one_line_and_exit_2(args, words) -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-3-8b", *args])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_search_too_large_asks_for_a_narrower_one(monkeypatch) -> None:
    import memcalc.planner as planner

    monkeypatch.setattr(planner, "MAX_CANDIDATES", 50)
    with pytest.raises(memcalc.InputError, match="candidates, more than 50: narrow it"):
        memcalc.plan(**JOB)


def test_gpu_counts_and_prices_parse() -> None:
    assert parse_gpus("32..512") == [32, 64, 128, 256, 512]
    assert parse_gpus("64,128, 64") == [64, 128]
    assert parse_gpus(8) == [8]
    assert parse_prices("h100=2.5", ["h100-sxm"]) == {"h100-sxm": 2.5}
    assert parse_prices(3, ["h100-sxm", "b200"]) == {"h100-sxm": 3.0, "b200": 3.0}


def test_global_batch_tokens_in_binary_millions() -> None:
    r = memcalc.plan(model="llama-3-8b", seq_len=8192, global_batch_tokens="1M", gpus=8, gpu="h100",
                     framework="torchtitan", top=1)
    assert r.job.global_batch == 128 and r.job.tokens_per_step == 1 << 20
