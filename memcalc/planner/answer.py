"""The plans the search keeps, estimated again as ``memcalc estimate`` estimates their arguments, with the notes."""

from __future__ import annotations

from collections import Counter

from memcalc.inputs.arguments import flag
from memcalc.planning import search as S
from memcalc.report.planned import Miss, PlanJob, PlanLayout, PlanMemory, PlannedRun, PlanResult, PlanTime, layout_text


def _cli_args(model_args: dict, kwargs: dict) -> list[str]:
    """``memcalc estimate`` arguments for these keywords (a flag per keyword; True as a bare flag)."""
    out: list[str] = []
    for k, v in {**model_args, **kwargs}.items():
        if v is False and k in ("compile_loss", "zero_init"):
            out.append("--no-" + k.replace("_", "-"))
        if v is None or v is False:
            continue
        out += [flag(k)] if v is True else [flag(k), str(v)]
    return out


def estimate_again(rank: int, c: S.Candidate, job: PlanJob, model_args: dict) -> PlannedRun:
    """One candidate estimated again as ``memcalc estimate`` estimates its arguments."""
    from memcalc.api import estimate_from_input
    from memcalc.inputs.build import build_input

    g = c.group
    timing = {"tokens": job.tokens, "price_per_gpu_hour": g.price if job.tokens is not None else None}
    kwargs = {**g.kwargs, "micro_batch": c.micro_batch, "grad_accum": c.grad_accum,
              **{k: v for k, v in timing.items() if v is not None}}
    e = estimate_from_input(build_input(**kwargs, model=g.plan.arch))  # the model resolved once, as given
    t, pg, tr = e.time, e.memory.per_gpu, e.training
    assert t is not None  # every candidate was timed
    return PlannedRun(
        rank=rank, gpu=e.input.gpu.key, gpus=g.gpus, framework=g.framework,
        layout=PlanLayout(dp=tr.dp, tp=tr.tp, pp=tr.pp, cp=tr.cp, ep=tr.ep, virtual_stages=tr.virtual_stages),
        strategy=_strategy(e.strategy.name, g), recompute=kwargs.get("recompute", "none"), micro_batch=c.micro_batch,
        grad_accum=c.grad_accum, accounting=e.accounting,
        memory=PlanMemory(peak_allocated=pg.peak_allocated, peak_reserved=pg.peak_reserved,
                          verdict=e.memory.fit.verdict, headroom_bytes=e.memory.fit.headroom_bytes),
        time=PlanTime(step_s=t.step_s, tokens_per_s_per_gpu=t.tokens_per_s_per_gpu, mfu=t.mfu,
                      time_to_train_s=t.time_to_train_s, cost=t.cost),
        bound=c.bound, estimate_args=_cli_args(model_args, kwargs))


def _strategy(name: str, g: S.Group) -> str:
    """The strategy as the framework's users name it: FSDP1/FSDP2 FULL_SHARD, ZeRO-3, DDP, the distributed
    optimizer (Megatron-LM's ``--use-distributed-optimizer``, memcalc's ZeRO-1 under ``--framework megatron``)."""
    p = g.plan
    if p.spec.framework == "fsdp":
        base = f"FSDP{p.fsdp_version} {name}"
    elif name == "zero-1" and g.framework == "megatron":
        base = "distributed optimizer"
    elif name.startswith("zero-") and name != "zero-0":
        base = "ZeRO-" + name[-1]
    else:
        base = "DDP"
    mods = [f"+opt-{p.offload_optimizer}"] if p.offload_optimizer != "none" else []
    mods += [f"+param-{p.offload_params}"] if p.offload_params != "none" else []
    return base + "".join(mods)


def plan_result(job: PlanJob, model_args: dict, out: S.Outcome, candidates: list[S.Candidate],
                reasons: Counter, offload: bool, seconds: float) -> PlanResult:  # fmt: skip
    runs = {id(c): estimate_again(i + 1, c, job, model_args) for i, c in enumerate(out.kept)}
    best = []
    for c in out.best_per_bucket.values():
        if id(c) not in runs:
            runs[id(c)] = estimate_again(0, c, job, model_args)
        best.append(runs[id(c)])
    best.sort(key=lambda r: (job.gpu.index(r.gpu), r.gpus))
    plans = [runs[id(c)] for c in out.kept]
    every = plans + best
    fastest = min(every, key=lambda r: r.time.step_s, default=None)
    priced = [r for r in every if r.time.cost is not None]
    cheapest = min(priced, key=lambda r: r.time.cost, default=None)  # type: ignore[arg-type, return-value]
    miss = _closest_miss(out, job, model_args)
    paper = sum(1 for c in candidates if c.plan.accounting == "paper")
    notes = _notes(job, plans, out, paper, offload, miss)
    checked = sum(1 for c in candidates if c.verdict is not None)
    return PlanResult(job=job, evaluated=out.evaluated, feasible=sum(1 for c in candidates if c.verdict == "fits"),
                      checked=checked, replays=out.replays, paper_accounted=paper,
                      not_runnable=dict(reasons.most_common()),
                      seconds=round(seconds, 4), candidates_per_s=round(out.evaluated / max(seconds, 1e-9), 1),
                      plans=plans, best_per_gpu=best, fastest=fastest, cheapest=cheapest, closest_miss=miss,
                      offload=offload, notes=notes)


def _closest_miss(out: S.Outcome, job: PlanJob, model_args: dict) -> Miss | None:
    """The checked candidate that comes closest to fitting: least over the GPU (its exact estimate)."""
    seen = [c for c in out.misses if c.exact] or [c for c in out.misses if c.peak is not None]
    if not seen:
        return None
    c = min(seen, key=lambda c: (c.peak - c.plan.usable_bytes, c.step_s))  # type: ignore[operator]
    run = estimate_again(0, c, job, model_args)
    usable = run.memory.headroom_bytes
    return Miss(plan=run, over_bytes=-usable)


def _notes(job: PlanJob, plans: list[PlannedRun], out: S.Outcome, paper: int, offload: bool,
           miss: Miss | None) -> list[str]:  # fmt: skip
    notes = []
    if plans:
        w = plans[0]
        notes.append(f"the winner's step is bound by {w.bound}")
    elif miss is not None:
        m = miss.plan
        notes.append(f"no plan fits; the closest, {m.framework} {layout_text(m)} {m.strategy} recompute {m.recompute} "
                     f"micro-batch {m.micro_batch}, is {miss.over_bytes / 2**30:.2f} GiB over: try more GPUs, a GPU "
                     "with more memory, offload, or a shorter sequence")
    else:
        notes.append("no plan fits, and no candidate could be laid out: try other GPU counts or a global batch that "
                     "more data-parallel sizes divide")
    if offload and plans:
        notes.append("nothing fits without offload: the plans offload optimizer states or parameters to the host")
    elif offload:
        notes.append("offload was searched too (optimizer states and parameters on the host): nothing fits with it")
    if paper:
        notes.append(f"{paper:,} candidates are answered by the paper accounting (the realistic one does not model "
                     "their layout yet: context or pipeline parallelism without FSDP, ...); "
                     "their verdicts are the paper's")
    return notes


def unheld_note(res: PlanResult, free: PlannedRun, held: dict) -> list[str]:
    given = " ".join(f"{flag(k)} {v}" if v is not True else flag(k) for k, v in held.items())
    if not res.plans:
        return [f"held to {given}, nothing fits; without it: {_describe(free)}"]
    best, key = res.plans[0], {"time": "step_s", "cost": "cost", "memory": None}[res.job.objective]
    if key is None:
        a, b, what = best.memory.peak_reserved, free.memory.peak_reserved, "memory"
    else:
        a, b, what = getattr(best.time, key), getattr(free.time, key), "step" if key == "step_s" else "cost"
    if a is None or b is None or b >= a:
        return [f"held to {given}: no free plan does better by the objective"]
    differs = [name for name, x, y in (("framework", best.framework, free.framework),
                                       ("layout", best.layout, free.layout), ("strategy", best.strategy, free.strategy),
                                       ("recompute", best.recompute, free.recompute),
                                       ("micro-batch", best.micro_batch, free.micro_batch)) if x != y]  # fmt: skip
    return [f"held to {given}: the free search's best is {100 * (a / b - 1):.1f} % better by {what} "
            f"({_describe(free)}; it differs in {', '.join(differs) or 'nothing shown'}; bound by {free.bound}, the "
            f"held plan by {best.bound})"]


def _describe(r: PlannedRun) -> str:
    return (f"{r.gpus} x {r.gpu} {r.framework} {layout_text(r)} {r.strategy} recompute {r.recompute} micro-batch "
            f"{r.micro_batch} x {r.grad_accum}, {r.time.step_s:.3f} s per step")
