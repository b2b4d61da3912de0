"""The search behind ``memcalc plan``: every candidate timed, the fastest (or cheapest, or smallest) checked for memory
first, each check as exact as ``memcalc estimate``'s, and no more checks than the ranking needs.

Why it is sound (docs/planning.md):
- The step time does not depend on the memory accounting: ``memcalc.evaluate`` lists the same collectives and host
  copies under the paper and the realistic accounting, and ``memcalc.time`` reads nothing else of the evaluation. So
  every candidate is timed with the paper evaluation (tens of microseconds; ``memcalc.evaluate.evaluate_for_time``
  finds its most loaded stage from fewer stages, exactly) and its rank is exact before any realistic replay runs. (Under a pipeline the collectives timed are those of the stage most loaded in memory, which
  the two accountings can name apart: the stages' data-parallel traffic then differs by a few embedding rows, a few
  nanoseconds of a step. The plans returned are estimated again exactly.)
- A candidate's memory is needed only when it could enter the answer: candidates are visited best first, and a
  visited one is kept when its verdict is ``fits``. The first N kept are the top N.
- Memory grows with the micro-batch at a fixed layout, strategy and recompute (every activation and transient scales
  with the tokens of a micro-batch; under a pipeline the micro-batches in flight, min(accumulation, pp) x micro-batch
  = min(global / dp, pp x micro-batch), do not shrink either). So one verdict settles a side: a micro-batch that fits
  says every smaller one fits, one that does not says no larger one does. Likewise across recompute policies at one
  layout and strategy: a policy that keeps more of the forward never needs less (``SAVES``).
- A candidate whose parameters, gradients and optimizer states alone (the paper's rows of them, which every
  accounting holds at the optimizer step) leave no room on the GPU is out of memory without a replay.
- ``--objective memory`` visits candidates by that lower bound and replaces it by the exact peak when one is popped
  (best-first search with an admissible bound): the first N popped with an exact peak are the N smallest.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from memcalc.errors import InputError
from memcalc.evaluate import Evaluation, evaluate, evaluate_for_time
from memcalc.layout.plan import Plan
from memcalc.memory.accountings.paper import fit as paper_fit
from memcalc.time.estimate import time_evaluation

STATE_KEYS = ("parameters", "parameters_frozen", "parameters_adapters", "master_weights", "optimizer_moments",
              "optimizer_steps", "pipeline_receive_buffers")
"""The paper's rows that a rank holds from the first forward to the last optimizer step (torch pipelining's receive
buffers too: one per micro-batch, made when the schedule first runs and kept for the run)."""
GRADIENT_KEYS = ("gradients",)
"""The paper's gradient row (shards where the strategy shards them), alive beside the states when the optimizer
steps (unless the optimizer runs inside the backward: torchtune's optimizer-in-backward frees each gradient there)."""


@dataclass(frozen=True, eq=False)
class Group:
    """One layout, strategy and recompute policy on one GPU type and count; its micro-batch pairs vary."""

    gpu: str
    """The GPU preset key."""
    gpus: int
    framework: str
    kwargs: dict
    """The ``memcalc.estimate`` keywords of the group, without the micro-batch and the accumulation."""
    plan: Plan
    """The validated plan at the first pair (the others differ only in ``work.micro_batch`` and ``grad_accum``)."""
    pairs: tuple[tuple[int, int], ...]
    price: float | None = None


@dataclass(eq=False)
class Candidate:
    """One group at one (micro-batch, accumulation) pair, timed; its memory once checked."""

    group: Group
    micro_batch: int
    grad_accum: int
    plan: Plan
    step_s: float
    bound: str
    """What the step time is mostly made of: compute, exposed communication, pipeline bubble, optimizer, offload."""
    lower: int
    """Bytes the GPU holds at least (the model states every accounting keeps for the whole step)."""
    cost_per_step: float | None = None
    verdict: str | None = None
    peak: int | None = None
    """The accounting's per-GPU total (realistic: the reserved peak with the context), once checked."""
    exact: bool = False
    """``peak`` is the accounting's own figure (False: the model-state bound stands in for it)."""


@dataclass
class Outcome:
    """What the search found, with its counts."""

    kept: list[Candidate] = field(default_factory=list)
    """The best candidates that fit, best first (at most ``top``)."""
    best_per_bucket: dict[tuple[str, int], Candidate] = field(default_factory=dict)
    evaluated: int = 0
    replays: int = 0
    misses: list[Candidate] = field(default_factory=list)
    """Checked candidates that do not fit."""
    refused: Counter[str] = field(default_factory=Counter)
    """Candidates the realistic replay refused, by reason."""


def _bound(fields: dict) -> str:
    b = fields["breakdown"]
    parts = {"compute": b["compute_s"] + b["memory_bound_s"] + b["recompute_s"],
             "exposed communication": sum(b["communication_s"].values()), "pipeline bubble": b["bubble_s"],
             "optimizer": b["optimizer_s"], "offload": b["offload_s"]}  # fmt: skip
    return max(parts, key=parts.__getitem__)


def with_batch(plan: Plan, micro_batch: int, grad_accum: int) -> Plan:
    """The plan at another micro-batch pair (what ``build_input`` gives for it: the work and the accumulation)."""
    assert plan.work is not None
    return replace(plan, work=replace(plan.work, micro_batch=micro_batch), grad_accum=grad_accum)


def _lower(ev: Evaluation) -> int:
    """Bytes every accounting holds at the optimizer step: the model states and the gradients the step reads (the
    paper's rows of them, in their smallest dtype), and the CUDA context."""
    w = ev.plan.work
    keys = STATE_KEYS if w is not None and w.optimizer_impl == "in-backward" else STATE_KEYS + GRADIENT_KEYS
    states = sum(r.bytes for r in ev.gpu_rows if r.key in keys and r.location == "gpu")
    return states + ev.plan.cuda_context


def timed(group: Group, time_fields: Callable[..., dict | None]) -> list[Candidate]:
    """Every pair of ``group``, timed on the paper evaluation (the same step time the realistic one gives)."""
    out = []
    impl = group.plan.work.optimizer_impl if group.plan.work is not None else "foreach"
    impl = impl if impl in ("foreach", "fused") else "foreach"
    for mb, ga in group.pairs:
        plan = with_batch(group.plan, mb, ga)
        ev = evaluate_for_time(replace(plan, accounting="paper"), activations=plan.accounting == "paper")
        st = time_evaluation(ev, gpu=group.gpu, optimizer_impl=impl)
        f = time_fields(st)
        if f is None:
            continue
        cost = None if group.price is None else group.price * group.gpus * f["step_s"] / 3600
        c = Candidate(group, mb, ga, plan, f["step_s"], _bound(f), _lower(ev), cost)
        if plan.accounting == "paper":  # the answer is this evaluation's: settled now
            c.verdict, c.peak, c.exact = paper_fit(plan, ev.total, ev.stages[ev.top].stage).verdict, ev.total, True
        out.append(c)
        if c.lower > plan.usable_bytes:  # the model states alone do not fit: no micro-batch of this group does
            break
    return out


SAVES = {"none": 3, "op-sac": 2, "selective": 2, "selective:core_attn+mlp": 1, "full": 0}
"""Recompute policies by what they keep from the forward: none keeps every saved tensor, the selective policies a
subset of them (Megatron-Core's core_attn and mlp modules a subset of core_attn's), full only each layer's input. At one layout, strategy and micro-batch a policy that keeps more never
needs less memory (a test holds the realistic peaks so ordered)."""


def _family(g: Group) -> tuple:
    """A group's key without its recompute policy, when the policy is one of ``SAVES``."""
    rc = g.kwargs.get("recompute", "none")
    rest = tuple(sorted((k, repr(v)) for k, v in g.kwargs.items() if k != "recompute" or rc not in SAVES))
    return (g.gpu, g.gpus, g.framework, rest)


def _settled(c: Candidate, seen: list[tuple[int, int, str]]) -> str | None:
    """A verdict that a checked neighbour settles: one that keeps at least as much at a micro-batch at least as large
    fits, so this fits; one that keeps at most as much at a micro-batch at most as large does not, so neither does this
    (reported with that neighbour's verdict, the least it can be)."""
    r = SAVES.get(c.group.kwargs.get("recompute", "none"), 0)
    for r2, mb, v in seen:
        if v == "fits" and r2 >= r and mb >= c.micro_batch:
            return v
        if v != "fits" and r2 <= r and mb <= c.micro_batch:
            return v
    return None


def _probe(plan: Plan) -> Any:
    """A pipeline's first and last ranks replayed alone with pp micro-batches, as a bound. A plan is out of memory when
    one rank is (the verdict is its most loaded rank's), and at one micro-batch size each further micro-batch adds a
    receive buffer and an input slice and keeps as many in flight or more (1F1B holds min(n, pp - rank)), so no rank's
    peak falls as n grows (a test holds it). A replay costs in proportion to the ranks and micro-batches it runs: two
    ranks of pp micro-batches settle most of the pipelines that do not fit for a fraction of one whole replay. Returns
    the first rank found out of memory, else None."""
    if plan.pp == 1 or plan.accounting != "realistic":
        return None
    from memcalc.memory.accountings import realistic

    small = replace(plan, grad_accum=min(plan.grad_accum, plan.pp))
    for stage in (0, plan.pp - 1):
        try:
            r = realistic.evaluate(small, stage)
        except InputError:
            return None
        if r.verdict == "oom":
            return r
    return None


def _check(c: Candidate, known: dict[tuple, list[tuple[int, int, str]]], out: Outcome) -> None:
    """The candidate's verdict: from the accounting's own answer, a neighbour's, the bound, or a replay."""
    if c.verdict is not None:
        return
    seen = known.setdefault(_family(c.group), [])
    v = _settled(c, seen)
    if v is not None:
        c.verdict = v
        return
    if c.lower > c.plan.usable_bytes:
        c.verdict, c.peak = "oom", c.lower
        return
    probe = _probe(c.plan)
    if probe is not None:
        c.verdict, c.peak = "oom", probe.total
        return
    try:
        ev = evaluate(c.plan)
    except InputError as e:  # a combination the replay does not model: counted with its reason, never proposed
        c.verdict = "refused"
        out.refused[str(e).split(";")[0]] += 1
        return
    out.replays += 1
    c.verdict, c.peak, c.exact = ev.realistic.verdict, ev.total, True
    seen.append((SAVES.get(c.group.kwargs.get("recompute", "none"), 0), c.micro_batch, c.verdict))


def search(candidates: Iterable[Candidate], objective: str, top: int) -> Outcome:
    """The ``top`` best candidates that fit by ``objective`` (time, cost or memory), and the best one per (GPU, count).

    Candidates are visited best first by their exact key (time, cost) or by their memory lower bound (memory, where
    the exact peak replaces the bound when popped)."""
    out = Outcome()
    known: dict[tuple, list[tuple[int, int, str]]] = {}
    heap: list[tuple[float, tuple, int, int, Candidate]] = []
    remaining: dict[tuple[str, int], int] = {}
    for i, c in enumerate(candidates):
        out.evaluated += 1
        bucket = (c.group.gpu, c.group.gpus)
        remaining[bucket] = remaining.get(bucket, 0) + 1
        heap.append((_key(c, objective, exact=False), _tie(c), i, 0, c))
    heapq.heapify(heap)
    while heap:
        key, tie, i, exact, c = heapq.heappop(heap)
        bucket = (c.group.gpu, c.group.gpus)
        wanted = len(out.kept) < top or bucket not in out.best_per_bucket
        if not wanted:
            remaining[bucket] -= 1
            if not any(n > 0 for b, n in remaining.items() if b not in out.best_per_bucket):
                break
            continue
        _check(c, known, out)
        if c.verdict == "refused":
            remaining[bucket] -= 1
            continue
        if c.verdict != "fits":
            out.misses.append(c)
            remaining[bucket] -= 1
            continue
        if objective == "memory" and not exact:
            if not c.exact:
                ev = evaluate(c.plan)
                out.replays += int(c.plan.accounting == "realistic")
                c.peak = ev.total
            heapq.heappush(heap, (_key(c, objective, exact=True), tie, i, 1, c))
            continue
        remaining[bucket] -= 1
        if len(out.kept) < top:
            out.kept.append(c)
        out.best_per_bucket.setdefault(bucket, c)
    return out


def _tie(c: Candidate) -> tuple:
    """Between equal keys: the shorter step, then the simpler layout (fewer model-parallel ranks), the larger
    micro-batch."""
    p = c.plan
    return (c.step_s, p.tp * p.pp * p.cp * p.ep * p.virtual_stages, -c.micro_batch)


def _key(c: Candidate, objective: str, exact: bool) -> float:
    if objective == "cost":
        return c.cost_per_step if c.cost_per_step is not None else float("inf")
    if objective == "memory":
        return float(c.peak if exact and c.peak is not None else c.lower)
    return c.step_s
