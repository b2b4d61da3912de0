"""Pipeline schedules as torch runs them, and what a rank holds at its schedule's peak.

torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` (schedules.py) orders each rank's forwards and backwards
over its model chunks; under FSDP2 inside the stages (torchtitan) each stage's unsharded gradients live from its first
backward to the reduce-scatter after its last, so which chunks' gradients coexist with which checkpoints is the
schedule's to say. Plain 1F1B needs no replay: its peak is the first backward, with every micro-batch of the warm-up
in flight and the stage's gradients allocated (``memcalc.memory.activations.pipeline_in_flight``).
"""

from __future__ import annotations

from memcalc.layout.plan import Plan
from memcalc.memory.paper import stage_chunks
from memcalc.memory.rows import Row
from memcalc.model.params import Shard, layer_params


def interleaved_ops(rank: int, pp: int, n: int, virtual: int) -> list[tuple[bool, int]]:
    """The actions of pipeline rank ``rank`` under torch's ScheduleInterleaved1F1B, in order: (backward?, local model
    chunk). torch/distributed/pipelining/schedules.py ``_calculate_single_rank_operations`` (warm-up
    ``(v - 1)·m_round + 2(pp - 1 - rank)`` forwards, capped at n·v; the forward chunk turns every ``m_round`` =
    n / max(1, n // pp) actions, the backward chunk the other way round) and ``_get_1f1b_rank_ops`` (warm-up
    forwards, then a forward and a backward per step, then the remaining backwards)."""
    per_round = n // max(1, n // pp)
    total = n * virtual
    warmup = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), total)
    ops: list[tuple[bool, int]] = []
    for op in range(total + warmup):
        if op < total:
            ops.append((False, (op // per_round) % virtual))
        if op >= warmup:
            ops.append((True, virtual - 1 - ((op - warmup) // per_round) % virtual))
    return ops


def interleaved_peak(rank: int, pp: int, n: int, act: list[int], grad: list[int]) -> tuple[int, int, int]:
    """(activation bytes, gradient-accumulator bytes, chunk micro-batches in flight) at the moment of rank ``rank``'s
    interleaved schedule when their sum is largest. ``act[c]``: what one micro-batch of local chunk c keeps from its
    forward to its backward; ``grad[c]``: chunk c's unsharded gradients under FSDP, alive from its first backward to
    the reduce-scatter after its n-th (each stage reduces after its own last backward: pipelining schedules.py
    ``backward_counter``, stage.py ``backward_maybe_with_nosync``)."""
    v = len(act)
    alive, done, live = [0] * v, [0] * v, [False] * v
    best = (-1, 0, 0, 0)
    for backward, c in interleaved_ops(rank, pp, n, v):
        if backward:
            live[c] = True  # the first backward allocates the chunk's accumulators; its micro-batch is still alive
        else:
            alive[c] += 1
        a = sum(x * y for x, y in zip(act, alive))
        g = sum(x for x, on in zip(grad, live) if on)
        if a + g > best[0]:
            best = (a + g, a, g, sum(alive))
        if backward:
            alive[c] -= 1
            done[c] += 1
            live[c] = done[c] < n
    return best[1], best[2], best[3]


def interleave_fsdp(plan: Plan, stage: int, rows: list[Row], flight: float) -> tuple[list[Row], float]:
    """An interleaved pipeline rank under FSDP2: its chunks' activations and unsharded gradients at the schedule's
    joint peak (``interleaved_peak``), where the rows above count every chunk's gradients beside the activations of
    the first backward. Uniform layers are assumed within the rank (the activation row's mean per layer)."""
    by = {r.key: r for r in rows}
    acts, grads = by.get("activations_layers"), by.get("pipeline_unsharded_gradients")
    if acts is None or grads is None or plan.arch is None or flight <= 0:
        return rows, flight
    chunks = stage_chunks(plan, stage)
    if len(chunks) != plan.virtual_stages:
        return rows, flight
    per = sum(len(c) for c in chunks)
    per_layer_mb = acts.bytes / (per * flight)
    acc = 4 if plan.precision.master_bytes else plan.precision.grad_bytes
    shard = Shard(plan.tp, plan.ep)
    grad = [acc * sum(layer_params(plan.arch, plan.arch.is_moe_layer(i), shard).total for i in c) for c in chunks]
    grad[-1 if stage == plan.pp - 1 else 0] += grads.bytes - sum(grad)  # embedding on stage 0, head on the last
    a, g, held = interleaved_peak(stage, plan.pp, plan.grad_accum, [round(per_layer_mb * len(c)) for c in chunks], grad)
    new_flight = held / plan.virtual_stages
    out = []
    for r in rows:
        if r is acts:
            r = r._replace(bytes=a, label=f"activations: {per} layers x {new_flight:g} micro-batch(es)",
                           detail=r.detail.replace("in flight: Eq. 5", "in flight at the schedule's peak: "
                                                   "pipelining schedules.py ScheduleInterleaved1F1B"))
        elif r is grads:
            r = r._replace(bytes=g, detail=r.detail + "; each stage reduces after its own last backward, so the "
                           "rank's chunks hold theirs at once only where the schedule overlaps them")
        out.append(r)
    return out, new_flight
