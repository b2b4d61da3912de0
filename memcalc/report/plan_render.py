"""``memcalc plan``'s result as rich renderables: the plans in one table, then what the search did. Never prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from memcalc.report.planned import layout_text
from memcalc.units import MemoryUnit, memory_label, to_memory_unit

if TYPE_CHECKING:
    from memcalc.report.planned import PlannedRun, PlanResult


def _days(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 86400:,.1f}"


def plan_table(plans: list[PlannedRun], title: str, unit: MemoryUnit = "gib", with_cost: bool = False,
               with_days: bool = False) -> Table:  # fmt: skip
    label = memory_label(unit)
    t = Table(title=title, title_justify="left")
    for name, right in (("#", True), ("GPUs", False), ("framework", False), ("layout", False), ("strategy", False),
                        ("recompute", False), ("mb x acc", True), (f"peak {label}", True), ("verdict", False),
                        ("headroom", True), ("step s", True), ("tok/s/GPU", True), ("MFU", True)):
        t.add_column(name, justify="right" if right else "left")
    if with_days:
        t.add_column("days", justify="right")
    if with_cost:
        t.add_column("cost", justify="right")
    for r in plans:
        verdict = r.memory.verdict + ("" if r.accounting == "realistic" else " (paper)")
        row = [str(r.rank or ""), f"{r.gpus} x {r.gpu}", r.framework, layout_text(r), r.strategy, r.recompute,
               f"{r.micro_batch} x {r.grad_accum}", f"{to_memory_unit(r.memory.peak_reserved, unit):,.2f}", verdict,
               f"{to_memory_unit(r.memory.headroom_bytes, unit):,.2f}", f"{r.time.step_s:.3f}",
               f"{r.time.tokens_per_s_per_gpu:,.0f}", f"{100 * r.time.mfu:.1f}%"]  # fmt: skip
        if with_days:
            row.append(_days(r.time.time_to_train_s))
        if with_cost:
            row.append("" if r.time.cost is None else f"{r.time.cost:,.0f}")
        t.add_row(*row)
    return t


def summary(res: PlanResult, unit: MemoryUnit = "gib") -> list[Text]:
    """How many candidates, how fast, what was left out, and the closest miss."""
    lines = [Text(f"{res.evaluated:,} candidates timed · {res.checked:,} checked for memory ({res.replays:,} step "
                  f"replays, the rest settled by bounds) · {res.feasible:,} fit · {res.paper_accounted:,} "
                  "answered by the paper accounting"),
             Text(f"searched in {res.seconds:.2f} s, {res.candidates_per_s:,.0f} candidates/s")]
    if res.not_runnable:
        n = sum(res.not_runnable.values())
        first = next(iter(res.not_runnable))
        lines.append(Text(f"{n:,} candidates not runnable as laid out (most often: {first})", style="dim"))
    if res.closest_miss is not None:
        m = res.closest_miss.plan
        over = to_memory_unit(res.closest_miss.over_bytes, unit)
        lines.append(Text(f"closest that does not fit: {m.gpus} x {m.gpu} {m.framework} {layout_text(m)} {m.strategy} "
                          f"recompute {m.recompute} micro-batch {m.micro_batch}: {m.memory.verdict}, "
                          f"{over:,.2f} {memory_label(unit)} over the GPU", style="dim"))
    for note in res.notes:
        lines.append(Text(f"note: {note}", style="dim"))
    return lines


def render_plan(res: PlanResult, unit: MemoryUnit = "gib") -> Group:
    j = res.job
    head = Text(f"{j.model} ({j.parameters:,} parameters) · seq {j.seq_len:,} x global batch {j.global_batch:,} = "
                f"{j.tokens_per_step:,} tokens per step · objective: {j.objective}", style="bold")
    with_cost = any(r.time.cost is not None for r in res.plans)
    with_days = any(r.time.time_to_train_s is not None for r in res.plans)
    parts: list = [head]
    if res.plans:
        parts.append(plan_table(res.plans, "Best plans that fit", unit, with_cost, with_days))
    else:
        parts.append(Text("no plan fits", style="bold red"))
    if len(res.best_per_gpu) > 1:
        parts.append(plan_table(res.best_per_gpu, "Best plan per GPU type and count", unit, with_cost, with_days))
        if res.fastest is not None:
            parts.append(Text(f"fastest: {res.fastest.gpus} x {res.fastest.gpu}, {res.fastest.time.step_s:.3f} s per "
                              "step"))
        if res.cheapest is not None:
            parts.append(Text(f"cheapest: {res.cheapest.gpus} x {res.cheapest.gpu}, {res.cheapest.time.cost:,.0f} "
                              "to train"))
    parts += summary(res, unit)
    return Group(*parts)
