"""Pipeline schedules as torch runs them, and what a rank holds at its schedule's peak.

torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` (schedules.py) orders each rank's forwards and backwards
over its model chunks; under FSDP2 inside the stages (torchtitan) each stage's unsharded gradients live from its first
backward to the reduce-scatter after its last, so which chunks' gradients coexist with which checkpoints is the
schedule's to say. Plain 1F1B needs no replay: its peak is the first backward, with every micro-batch of the warm-up
in flight and the stage's gradients allocated (``memcalc.memory.accountings.activations.pipeline_in_flight``). Beside the
states and the checkpoints, a stage holds what torch's ``PipelineStage`` keeps (receive buffers, stage outputs, input
gradients) and the backward of one layer (``torch_stage_rows``).
"""

from __future__ import annotations

from functools import cache, lru_cache
from itertools import compress, takewhile
from operator import le, mul

from typing import Any

from memcalc.layout.compose import composition
from memcalc.layout.plan import Plan
from memcalc.memory.accountings.paper import layer_count, moe_layers, stage_chunks
from memcalc.memory.accountings.rows import Row
from memcalc.model.memo import per_architecture
from memcalc.model.params import Shard, layer_params
from memcalc.units import MiB


@cache
def interleaved_ops(rank: int, pp: int, n: int, virtual: int) -> tuple[tuple[bool, int], ...]:
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
    return tuple(ops)


@cache
def interleaved_moments(rank: int, pp: int, n: int, virtual: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...],
                                                                            tuple[int, ...]], ...]:  # fmt: skip
    """The distinct moments of rank ``rank``'s interleaved schedule (``interleaved_ops``), in the order each first
    occurs: (micro-batches in flight per local chunk, chunks whose gradient accumulators are alive as 0/1, backwards
    each chunk has finished at that first occurrence). What a moment holds depends on the first two alone, so the
    first moment that holds the most is the first occurrence of one of these (an earlier occurrence of the same
    state would hold as much): ``interleaved_peak`` scans these instead of every action of the schedule."""
    alive, done, live = [0] * virtual, [0] * virtual, [0] * virtual
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}
    for backward, c in interleaved_ops(rank, pp, n, virtual):
        if backward:
            live[c] = 1  # the first backward allocates the chunk's accumulators; its micro-batch is still alive
        else:
            alive[c] += 1
        seen.setdefault((tuple(alive), tuple(live)), tuple(done))
        if backward:
            alive[c] -= 1
            done[c] += 1
            if done[c] >= n:
                live[c] = 0
    return tuple((a, g, d) for (a, g), d in seen.items())


@cache
def _maximal_moments(rank: int, pp: int, n: int, virtual: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...],
                                                                              tuple[int, ...]], ...]:  # fmt: skip
    """The moments of ``interleaved_moments`` that no other one dominates (as many micro-batches or more in flight in
    every chunk, and every accumulator it has alive), in the same order. With every chunk's activations and gradients
    positive a dominated moment holds strictly less than the one dominating it, so the peak is among these."""
    moments = interleaved_moments(rank, pp, n, virtual)
    # largest first: a moment can be dominated only by one holding at least as much in all, so each is compared with
    # the undominated ones already found (distinct moments: dominating means larger somewhere)
    # (and only by one holding more in total: an equal total with as much everywhere is the same moment)
    vectors = sorted(((sum(alive) + sum(live), alive + live, i) for i, (alive, live, _) in enumerate(moments)),
                     key=lambda x: -x[0])
    kept: list[tuple[int, tuple[int, ...], int]] = []
    for total, m, i in vectors:
        if not any(all(map(le, m, k)) for t, k, _ in takewhile(lambda x: x[0] > total, kept)):
            kept.append((total, m, i))
    return tuple(moments[i] for i in sorted(i for _, _, i in kept))


def interleaved_peak(rank: int, pp: int, n: int, act: list[int],
                     grad: list[int]) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """(activation bytes, gradient-accumulator bytes, micro-batches in flight per local chunk, backwards each local
    chunk has finished) at the moment of rank ``rank``'s interleaved schedule when the first two's sum is largest (the
    first such moment). ``act[c]``: what one micro-batch of local chunk c keeps from its forward to its backward;
    ``grad[c]``: chunk c's unsharded gradients under FSDP, alive from its first backward to the reduce-scatter after
    its n-th (each stage reduces after its own last backward: pipelining schedules.py ``backward_counter``, stage.py
    ``backward_maybe_with_nosync``). The moments scanned are ``interleaved_moments``', or only the undominated ones
    where every size is positive (tests/test_pipeline_schedule.py holds both to a walk over every action)."""
    return _peak(rank, pp, n, tuple(act), tuple(grad))


@lru_cache(maxsize=65536)
def _peak(rank: int, pp: int, n: int, act: tuple[int, ...],
          grad: tuple[int, ...]) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """``interleaved_peak``, once per sizes (plans alike but for their sharding share it)."""
    v = len(act)
    positive = all(x > 0 for x in act) and all(x > 0 for x in grad)
    moments = _maximal_moments(rank, pp, n, v) if positive else interleaved_moments(rank, pp, n, v)
    best: tuple = (-1, 0, 0, (), ())
    for alive, live, done in moments:
        a = sum(map(mul, act, alive))
        g = sum(compress(grad, live))
        if a + g > best[0]:
            best = (a + g, a, g, alive, done)
    return best[1], best[2], best[3], best[4]


Schedule = tuple[tuple[int, ...], tuple[int, ...]]
"""Micro-batches each local chunk holds and backwards each has finished, at a schedule's peak."""


def interleave_fsdp(plan: Plan, stage: int, rows: list[Row], flight: float) -> tuple[list[Row], float, Schedule | None]:
    """An interleaved pipeline rank under FSDP2: its chunks' activations and unsharded gradients at the schedule's
    joint peak (``interleaved_peak``), where the rows above count every chunk's gradients beside the activations of
    the first backward. Uniform layers are assumed within the rank (the activation row's mean per layer). Also returns
    the micro-batches each local chunk holds and the backwards it has finished at that moment (None where the
    schedule was not replayed)."""
    by = {r.key: r for r in rows}
    acts, grads = by.get("activations_layers"), by.get("pipeline_unsharded_gradients")
    if acts is None or grads is None or plan.arch is None or flight <= 0:
        return rows, flight, None
    chunks = stage_chunks(plan, stage)
    if len(chunks) != plan.virtual_stages:
        return rows, flight, None
    per = sum(len(c) for c in chunks)
    per_layer_mb = acts.bytes / (per * flight)
    acc = 4 if plan.precision.master_bytes else plan.precision.grad_bytes
    shard = Shard(plan.tp, plan.ep)
    size = {m: layer_params(plan.arch, m, shard).total for m in (False, True)} if plan.arch.moe else \
        {False: layer_params(plan.arch, False, shard).total}  # a layer's parameters depend on its kind alone
    grad = [acc * sum(size[plan.arch.is_moe_layer(i)] for i in c) for c in chunks]
    grad[-1 if stage == plan.pp - 1 else 0] += grads.bytes - sum(grad)  # embedding on stage 0, head on the last
    held = [round(per_layer_mb * len(c)) for c in chunks]
    a, g, alive, done = interleaved_peak(stage, plan.pp, plan.grad_accum, held, grad)
    new_flight = sum(alive) / plan.virtual_stages
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
    return out, new_flight, (alive, done)


def receive_buffers(stage: int, stages: int, n: int) -> int:
    """Stage-boundary tensors torch's ``PipelineStage`` ``stage`` of ``stages`` allocates for ``n`` micro-batches and
    keeps: one input per micro-batch unless it is the first stage (``_setup_forward_recv_info``), one output gradient
    per micro-batch unless it is the last (``_create_grad_recv_info``)."""
    return n * ((stage > 0) + (stage < stages - 1))


def torch_stage_rows(plan: Plan, stage: int, st: Any, flight: float, schedule: Schedule | None) -> list[Row]:
    """What torch.distributed.pipelining and one layer's backward add on pipeline rank ``stage`` at its peak, a
    backward of the steady phase, beside the rows of the states and of the micro-batches in flight (FSDP2 inside the
    stages: ``memcalc.memory.accountings.paper.fsdp_under_pipeline``).

    - Receive buffers (torch/distributed/pipelining/stage.py ``_setup_forward_recv_info``, ``_create_grad_recv_info``):
      one per micro-batch for the stage's input from the previous stage and one for its output's gradient from the
      next, made when the schedule first runs and kept for the run; a stage boundary is the residual stream of one
      micro-batch, the rank's ``1/tp`` of the sequence under torchtitan's sequence-parallel plan.
    - Stage outputs: each micro-batch in flight keeps its stage's output for the backward (``fwd_cache``) beside the
      layers' checkpoints, which keep their inputs; on the last stage the output is the logits, counted with the loss.
    - Input gradients: torch's ``stage_backward`` takes each received input's gradient off its buffer
      (``val.grad = None``, torch 2.13; pytorch#164329 of October 2025; before, each stayed on its buffer until
      ``clear_runtime_states`` at the next step), and only its send ops hold it: ``Schedule1F1B`` keeps the previous
      backward's (``bwd_sends``) through the next backward, the interleaved runtime none. Traced:
      tests/test_pipeline_realistic.py.
    - One layer's backward: what the layer saves without recompute less what the policy kept (the recomputed forward
      rebuilds it for the layer's backward: Korthikanti et al. 2022 §5), the gradient of its output, and its weights'
      gradients in the compute dtype until FSDP2's post-backward adds them to the accumulated ones
      (``FSDPParam.accumulate_unsharded_grad_if_needed``).
    ``schedule``: the micro-batches each local chunk holds and the backwards it has finished at the peak (interleaved
    schedules: ``interleave_fsdp``); 1F1B's are ``flight`` and ``n - flight``."""
    arch, w, n = plan.arch, plan.work, plan.grad_accum
    assert arch is not None and w is not None
    v, tp, sp = plan.virtual_stages, plan.tp, plan.sequence_parallel
    boundary = st.b * st.s * arch.hidden * st.dtype_bytes // (tp if sp and tp > 1 else 1)
    last = plan.pp * v - 1
    stages = [stage + c * plan.pp for c in range(v)]  # torch's looped placement (ScheduleInterleaved1F1B)
    buffers = sum(receive_buffers(g, last + 1, n) for g in stages)
    alive, finished = schedule if schedule is not None else ((round(flight),) * v, (max(0, n - round(flight)),) * v)
    sending = boundary if v == 1 and stage > 0 and finished[0] > 0 else 0
    outputs = sum(k for g, k in zip(stages, alive) if g < last)
    dtensor = composition(plan.framework).dtensor_tp
    policy = "full" if w.recompute.startswith("every:") else w.recompute
    n_moe = moe_layers(plan, stage)
    kinds = (False,) * (layer_count(plan, stage) > n_moe) + (True,) * (n_moe > 0)  # dense and MoE layers present
    rebuilt, new_params = _one_layer(arch, st, tp, sp, policy, dtensor, kinds, plan.ep)
    new_grads = new_params * plan.precision.param_bytes
    return [
        Row("pipeline_receive_buffers", f"pipeline receive buffers ({buffers} x {boundary / MiB:.0f} MiB)", buffers * boundary,
            "gpu", "activation", "one per micro-batch for the stage input and one for the output gradient, made once "
            "and kept (pipelining stage.py _setup_forward_recv_info, _create_grad_recv_info)"),
        Row("pipeline_stage_outputs", f"stage outputs kept for the backward ({outputs})", outputs * boundary, "gpu",
            "activation", "each micro-batch in flight keeps its stage output until its backward (pipelining stage.py "
            "fwd_cache); the layers' checkpoints keep their inputs"),
        Row("pipeline_input_gradients", "stage input gradient being sent (the previous backward's)", sending,
            "gpu", "activation", "Schedule1F1B's send ops of the previous backward hold its input gradient through the "
            "next backward (pipelining schedules.py bwd_sends; stage_backward took it off the buffer)"),
        Row("activations_layer_backward", "backward of one layer: recomputed activations, output gradient",
            rebuilt + boundary, "gpu", "activation", f"one layer without recompute less what {w.recompute} recompute "
            "keeps (rebuilt for the layer's backward: Korthikanti et al. 2022 §5) + the gradient of its output"),
        Row("pipeline_layer_gradients", f"one layer's new gradients ({plan.precision.low_dtype})", new_grads, "gpu",
            "model_state", "autograd's gradients of the layer's weights until FSDP2's post-backward adds them to the "
            "accumulated ones (FSDPParam.accumulate_unsharded_grad_if_needed)"),
    ]


@per_architecture
def _one_layer(arch: Any, st: Any, tp: int, sp: bool, policy: str, dtensor: bool, kinds: tuple[bool, ...],
               ep: int) -> tuple[int, int]:  # fmt: skip
    """(what one layer's backward rebuilds, the parameters of the largest layer) over the layer kinds present: the
    same for every stage and micro-batch count that share them (``torch_stage_rows``)."""
    from memcalc.memory.accountings.activations import layer_activations

    rebuilt = max((layer_activations(arch, st, tp, sp, "none", moe=m, dtensor=dtensor).total
                  - layer_activations(arch, st, tp, sp, policy, moe=m, dtensor=dtensor).total
                  for m in kinds), default=0) if policy != "none" else 0  # fmt: skip
    return rebuilt, max((layer_params(arch, m, Shard(tp, ep)).total for m in kinds), default=0)
