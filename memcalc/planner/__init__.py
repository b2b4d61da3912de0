"""``memcalc.plan``: the fastest (or cheapest, or smallest) plans that fit one job, searched.

The edge of the search: the user's job validated once, every candidate setting validated by ``build_input`` (what
memcalc or the framework refuses is counted with its reason), the search run on plain plans
(``memcalc.planning.search``), and each plan it returns estimated again exactly as ``memcalc estimate`` would, so that
its ``estimate_args`` reproduce its figures.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from memcalc.errors import InputError
from memcalc.planner.answer import estimate_again, plan_result, unheld_note
from memcalc.planner.job import parse_gpus, parse_prices, read_job
from memcalc.planning import search as S
from memcalc.planning.space import SPACES, Shape, micro_batches, settings
from memcalc.report.planned import PlanJob, PlannedRun, PlanResult

__all__ = ["MAX_CANDIDATES", "parse_gpus", "parse_prices", "plan"]


MAX_CANDIDATES = 1_000_000
"""A search larger than this asks for a narrower one instead of running for minutes."""


def plan(params: Any = None, *, seq_len: int | None = None, global_batch: int | None = None,
         global_batch_tokens: float | str | None = None, gpus: int | str | Sequence[int] = 8,
         gpu: str | Sequence[str] | None = None, gpus_per_node: int = 8, framework: str | Sequence[str] = "any",
         objective: str = "time", tokens: float | str | None = None, price: float | str | dict | None = None,
         top: int = 10, **fixed: Any) -> PlanResult:  # fmt: skip
    """The ``top`` best plans that fit one job: ``memcalc.plan(model="llama-3-70b", seq_len=8192, global_batch=128,
    gpus=64, gpu="h100")``. Any other ``memcalc.estimate`` keyword holds its dimension fixed (``tp=8``,
    ``recompute="full"``, ``stage=3``) or applies to every candidate (``attention``, ``lora_rank``, ...)."""
    t0 = time.perf_counter()
    job, arch, model_args, held, passthrough, gpu_args = read_job(
        params, seq_len, global_batch, global_batch_tokens, gpus, gpu, gpus_per_node, framework, objective, tokens,
        price, top, fixed)
    reasons: Counter[str] = Counter()
    offload = False
    groups = _groups(job, arch, held, passthrough, reasons, gpu_args, offload=False)
    out, candidates = _search(groups, job, top)
    if not out.kept and not any(k in held for k in ("stage", "fsdp", "ddp", "strategy")):
        more = _groups(job, arch, held, passthrough, reasons, gpu_args, offload=True)
        if more:
            offload = True
            out2, cands2 = _search(more, job, top)
            out2.evaluated += out.evaluated
            out2.misses += out.misses
            out, candidates = out2, candidates + cands2
    reasons.update(out.refused)
    free = _unheld(job, arch, held, passthrough, gpu_args, model_args)
    seconds = time.perf_counter() - t0
    result = plan_result(job, model_args, out, candidates, reasons, offload, seconds)
    if free is None:
        return result
    return result.model_copy(update={"unheld_best": free, "notes": result.notes + unheld_note(result, free, held)})


def _unheld(job: PlanJob, arch: Any, held: dict, passthrough: dict, gpu_args: dict,
            model_args: dict) -> PlannedRun | None:  # fmt: skip
    """With dimensions held, the best plan of the free search too (what holding them costs)."""
    layout_keys = [k for k in held if k != "precision"]
    if not layout_keys:
        return None
    out, _ = _search(_groups(job, arch, {}, passthrough, Counter(), gpu_args, offload=False), job, 1)
    return estimate_again(0, out.kept[0], job, model_args) if out.kept else None


def _settings(job: PlanJob, arch: Any, held: dict, offload: bool,
              gpu_args: dict) -> Iterable[tuple[str, int, str, dict, list]]:  # fmt: skip
    """(gpu, count, framework, estimate keywords, micro-batch pairs) of every candidate setting."""
    shape = Shape(layers=arch.layers, experts=arch.experts)
    for gpu in (gpu_args[k] for k in job.gpu):
        for n in job.gpus:
            for fw in job.frameworks:
                for kw in settings(fw, n, job.gpus_per_node, shape, held, offload=offload):
                    dp = n // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
                    pairs = micro_batches(job.global_batch, dp, kw.get("pp", 1), kw.get("virtual_stages", 1), held)
                    yield gpu, n, fw, kw, pairs


def _groups(job: PlanJob, arch: Any, held: dict, passthrough: dict, reasons: Counter, gpu_args: dict,
            offload: bool) -> list[S.Group]:  # fmt: skip
    """Every candidate setting validated by ``build_input`` once (at its first micro-batch pair)."""
    from memcalc.inputs.plan import to_plan
    from memcalc.inputs.build import build_input

    every = list(_settings(job, arch, held, offload, gpu_args))
    key_of = {arg: key for key, arg in gpu_args.items()}
    total = sum(len(p) for *_, p in every)
    if total > MAX_CANDIDATES:
        raise InputError(f"this search has {total:,} candidates, more than {MAX_CANDIDATES:,}: narrow it (fewer --gpus "
                         "or --gpu, one --framework, or hold --tp, --pp or --recompute fixed)")
    if every and total == 0:
        counts = ", ".join(map(str, job.gpus))
        raise InputError(f"--global-batch {job.global_batch}: no layout of {counts} GPUs divides "
                         "it into micro-batch x accumulation x data-parallel size (a pipeline also needs at least pp "
                         "micro-batches); accepted: a global batch that a data-parallel size divides, e.g. "
                         f"{max(job.gpus) * max(1, job.global_batch // max(job.gpus))}")
    from memcalc.inputs.presets import load_gpu

    records = {arg: load_gpu(arg) for arg in gpu_args.values()}  # each GPU's file read once, not per setting
    groups = []
    for gpu, n, fw, kw, pairs in every:
        if not pairs:
            reasons["no micro-batch x accumulation x dp makes the global batch (or fills the pipeline)"] += 1
            continue
        args = _estimate_kwargs(job, fw, gpu, n, kw, passthrough)
        try:
            plan = to_plan(build_input(model=arch, micro_batch=pairs[0][0], grad_accum=pairs[0][1],
                                       **{**args, "gpu": records[gpu]}))
        except InputError as e:
            reasons[_reason(str(e))] += len(pairs)
            continue
        groups.append(S.Group(gpu, n, fw, args, plan, tuple(pairs), job.prices.get(key_of[gpu])))
    return groups


def _estimate_kwargs(job: PlanJob, fw: str, gpu: str, n: int, kw: dict, passthrough: dict) -> dict:
    precision = passthrough.get("precision", kw.get("precision", SPACES[fw].precision))
    return {**passthrough, **kw, "seq_len": job.seq_len, "gpus": n, "gpu": gpu, "gpus_per_node": job.gpus_per_node,
            "framework": fw, "precision": precision}


def _reason(message: str) -> str:
    """A refusal's reason without its numbers, so that alike refusals count together."""
    import re

    return re.sub(r"\d[\d,._]*", "N", message.split(";")[0])[:160]


def _search(groups: list[S.Group], job: PlanJob, top: int) -> tuple[S.Outcome, list[S.Candidate]]:
    from memcalc.time.estimate import time_fields

    candidates = [c for g in groups for c in S.timed(g, time_fields)]
    return S.search(candidates, job.objective, top), candidates
