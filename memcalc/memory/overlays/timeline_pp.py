"""The live bytes of one pipeline rank over one optimizer step: FSDP2 inside the stages, as torchtitan runs them.

torch.distributed.pipelining (torch 2.13 ``stage.py``, ``schedules.py``) with ``fully_shard`` on each stage's decoder
layers and on the stage (torchtitan ``parallelize``: ``reshard_after_forward`` is False under pipelining), replayed
action by action over the rank's schedule:

- **Parameters**: each unit is all-gathered at the first forward of its micro-batches and stays gathered (no
  reshard after forward; ``backward_maybe_with_nosync`` turns ``set_reshard_after_backward`` off) until
  ``perform_reduce_grad`` after the stage's last backward.
- **Gradients**: every backward runs with ``set_requires_gradient_sync(False)``: a layer's new gradients (the compute
  dtype) are added by its post-backward to unsharded accumulators, in FSDP's reduce dtype (``FSDPParam.
  to_accumulated_grad_if_needed``: fp32 under torchtitan's ``mixed_precision_reduce``), alive from the stage's first
  backward to ``perform_reduce_grad``, which reduce-scatters them unit by unit (each unit's flat reduce-scatter input
  beside the accumulators not yet freed) into the sharded gradients the optimizer reads.
- **Activations**: each micro-batch in flight keeps what its layers save (``memcalc.memory.engine.timeline_layers``) and
  its stage output (``fwd_cache``); the receive buffers (one input per micro-batch, one output gradient per
  micro-batch) are made once and kept, the first layer's input is its receive buffer, and each finished backward
  leaves the received input's ``.grad`` until the next step (``clear_runtime_states``).
- **The last stage** computes the loss right after each forward and keeps the logits (``fwd_cache``) until that
  micro-batch's backward, through the loss's backward; the first runs the embedding.

Schedules: ``Schedule1F1B`` (warm-up ``min(n, pp - rank)`` forwards, then a backward and a forward while forwards
remain, then the backwards) and ``ScheduleInterleaved1F1B`` (``memcalc.memory.overlays.pipeline.interleaved_ops``; each
chunk reduces after its own last backward). Checked against a traced pipeline rank
(``memcalc.validation.trace_pipeline``: torch's own ``PipelineStage`` and schedule on fake tensors, one process as
one rank of the fake process group).
"""

from __future__ import annotations

from itertools import compress
from operator import mul

from memcalc.errors import InputError
from memcalc.memory.overlays.pipeline import interleaved_ops
from memcalc.memory.engine.timeline import Moment, Timeline, _moment
from memcalc.memory.engine.timeline_layers import DOWN_GRADS, checkpointed
from memcalc.memory.engine.timeline_loss import _chunk, inside_log_softmax, largest_tensor
from memcalc.memory.overlays.timeline_pp_stage import _largest_layer_tensor, _Stage, _stage


def one_f_one_b(rank: int, pp: int, n: int) -> list[tuple[bool, int]]:
    """The actions of pipeline rank ``rank`` under torch's ``Schedule1F1B`` (schedules.py ``_step_microbatches``):
    ``min(n, pp - rank)`` warm-up forwards, then a backward and a forward while forwards remain, then the rest of the
    backwards. (backward?, local chunk 0)."""
    warm = min(n, pp - rank)
    ops: list[tuple[bool, int]] = [(False, 0)] * warm
    for k in range(n):
        ops.append((True, 0))
        if warm + k < n:
            ops.append((False, 0))
    return ops


def stage_timeline(arch, *, family: str, regime: str, attention: str, s: int, b: int, pp: int, rank: int,
                   micro_batches: int, chunks: tuple[range, ...], recompute: str = "full",
                   optimizer_impl: str = "fused", loss: str = "standard", device: str = "cuda", code: str = "hf",
                   tp: int = 1, sequence_parallel: bool = False, compiled: bool = False,
                   loss_compiled: bool | None = None, float8: str = "none", float8_all_gather: bool = False,
                   world: int = 1, fsdp_param_dtype: str | None = "bf16",
                   fsdp_reduce_fp32: bool = False, every_layer: bool = True,
                   every_micro_batch: bool = True) -> Timeline:  # fmt: skip
    """Moments of pipeline rank ``rank`` of ``pp`` over one step of ``micro_batches`` micro-batches of ``b`` x ``s``
    tokens, FSDP2 over ``world`` ranks inside the stage. ``chunks``: the decoder layers of each of the rank's local
    model chunks (global stage ``rank + c·pp``, torch's looped placement); one chunk: ``Schedule1F1B``, more:
    ``ScheduleInterleaved1F1B``. The other arguments are ``memcalc.memory.engine.timeline.timeline``'s. Parameters and
    gradients are FSDP2's under ``MixedPrecisionPolicy(param_dtype=fsdp_param_dtype)``: fp32 shards (or the
    regime's width), gathered in the param dtype, accumulated in fp32 under ``fsdp_reduce_fp32``. ``every_layer``:
    False makes the moments of the layers that bound the others only (``memcalc.memory.engine.stack``), the same peaks.
    ``every_micro_batch``: False leaves out the moments of an action whose moments an earlier action already made
    (``_action_state``: the schedule's steady phase repeats the same forwards and backwards), the same peaks."""
    v, n = len(chunks), micro_batches
    if pp < 2 or not 0 <= rank < pp or v < 1 or n < 1:
        raise InputError(f"pipeline rank {rank} of {pp} with {v} chunk(s) and {n} micro-batch(es): give pp >= 2, "
                         "0 <= rank < pp, at least one chunk and one micro-batch")
    if v > 1 and n % pp:
        raise InputError(f"the interleaved schedule (torch ScheduleInterleaved1F1B) needs the micro-batches per step "
                         f"(--grad-accum {n}) divisible by pp ({pp}); give a multiple of {pp}")
    if regime == "amp-bf16" and fsdp_param_dtype is None:
        raise InputError("a pipeline stage is modelled under FSDP2's bf16 policy, fp32 or pure bf16, not autocast")
    st = _stage(arch, family, regime, attention, s, b, pp, rank, n, chunks, recompute, optimizer_impl, loss, device,
                code, tp, sequence_parallel, compiled, loss_compiled, float8, float8_all_gather, world,
                fsdp_param_dtype, fsdp_reduce_fp32, every_layer)
    run = _Run(st)
    made: set[tuple] = set()  # the states of the actions whose moments are made
    for backward, c in one_f_one_b(rank, pp, n) if v == 1 else interleaved_ops(rank, pp, n, v):
        if not every_micro_batch:
            state = _action_state(backward, c, run.alive, run.gathered, run.acc, run.done, n, st.sends)
            if state in made:  # the same moments again, later: no peak, phase peak or reserved figure changes
                if backward:
                    run.alive[c], run.done[c] = run.alive[c] - 1, run.done[c] + 1
                else:
                    run.gathered[c], run.fwd[c], run.alive[c] = True, run.fwd[c] + 1, run.alive[c] + 1
                continue
            made.add(state)
        if backward:
            _backward(st, run, c)
        else:
            _forward(st, run, c)
    return _step_end(st, run)


class _Run:
    """What a pipeline rank's schedule changes action by action: per chunk, the micro-batches in flight, done and
    run forward, whether its units are gathered or reduced and the bytes of its accumulators; the moments made."""

    __slots__ = ("alive", "done", "fwd", "gathered", "acc", "reduced", "root_new", "returned", "fresh_at",
                 "fresh_from", "fresh", "moments")

    def __init__(self, st: _Stage) -> None:
        v = st.v
        self.alive, self.done, self.fwd = [0] * v, [0] * v, [0] * v
        self.gathered = [False] * v
        self.acc = [0] * v  # bytes of each chunk's accumulators alive
        self.reduced = [False] * v
        # the head's and the final norm's new gradients in the compute dtype, where the accumulators keep the reduce
        # dtype: the stage's root unit holds them from the head's backward to its post-backward, after the stage's
        # last layer (FSDP2 upcasts them there: ``to_accumulated_grad_if_needed``,
        # ``accumulate_unsharded_grad_if_needed``)
        self.root_new = 0
        self.returned = False  # the schedule's step has returned: its send ops are gone
        # the first stage's embedding gradients: the moment of all their fresh blocks, of the first, their bytes
        self.fresh_at, self.fresh_from, self.fresh = -1, -1, 0
        self.moments: list[Moment] = [_moment("baseline", "before the step (no gradients after zero_grad)", st.base)]


def _common(st: _Stage, run: _Run, c_cur: int, exclude_current: bool) -> list[tuple[str, int]]:
    """What every moment holds: the states, the step's ids, the gathered units, the accumulators, the micro-batches
    in flight (but the current one, where ``exclude_current``), the input gradient being sent, the head's new
    gradients."""
    full = st.full
    held = sum(map(mul, full, run.alive)) - (full[c_cur] if exclude_current else 0)
    # Schedule1F1B's previous backward's input gradient, referenced by its send ops (``bwd_sends``) until the
    # next backward's replace them (stage_backward has taken it off the buffer: ``val.grad = None``); the
    # interleaved runtime drops its sends once waited (traced)
    sending = st.resid if st.sends and run.done[0] > 0 and not run.returned else 0
    return st.base + [st.batch_ids, ("parameters (gathered)", sum(compress(st.gathered_c, run.gathered))),
                      ("gradient accumulators (unsharded)", sum(run.acc)),
                      ("micro-batches in flight (saved tensors, stage outputs)", held),
                      ("stage input gradient being sent (the previous backward's)", sending),
                      ("head's new gradients (until the stage's post-backward)", run.root_new)]


def _forward(st: _Stage, run: _Run, c: int) -> None:
    """One micro-batch's forward through chunk c: the first gathers every unit (they stay gathered), each layer's
    down projection, and on the last stage the loss right after."""
    moments = run.moments
    if not run.gathered[c]:  # the first forward gathers each unit; they stay gathered
        run.gathered[c] = True
        moments.append(_moment("forward", f"chunk {c}: first forward, every unit gathered",
                               _common(st, run, c, False) + [("all-gather output (last unit)",
                                                              st.g * st.world * st.lsh)]))
    shown, t, h = st.shown[c], st.x.t, st.x.h
    for i in st.chunks[c]:
        if i not in shown:
            continue
        moments.append(_moment(f"forward.layer.{i}", f"micro-batch {run.fwd[c]}, layer {i}: down projection's "
                               "output", _common(st, run, c, False) + [("this micro-batch's saved tensors",
                                                                        st.kept(c, i)),
                                                                       ("layer output (residual stream)", st.resid),
                                                                       ("down projection output", st.d * t * h)]))
    run.fwd[c] += 1
    run.alive[c] += 1
    if st.last[c]:
        lp, head = st.lp, st.head
        cur = [("this micro-batch's saved tensors", st.full[c]), head[0]] + head[1:] + st.head_input + [st.logits]
        fwd_loss = (_common(st, run, c, True) + cur
                    + [(st.copy_name, _chunk(lp, 1)), (st.saved_name, _chunk(lp, 2))])  # fmt: skip
        if len(lp.names) > 4:  # eager loss_parallel, inside ``_log_softmax`` (timeline.py's moment)
            fwd_loss += inside_log_softmax(lp, t)
        moments.append(_moment("loss", f"micro-batch {run.fwd[c] - 1}: log-softmax done", fwd_loss))


def _backward(st: _Stage, run: _Run, c: int) -> None:
    """One micro-batch's backward through chunk c: the loss and head on the last stage, the layers last to first,
    the embedding on the first; the root unit's post-backward; the interleaved runtime's reduce after the chunk's
    last backward."""
    m = run.done[c]
    if st.last[c]:
        _loss_backward(st, run, c, m)
    _layers_backward(st, run, c, m)
    if st.first[c]:
        _embedding_backward(st, run, c, m)
    if run.root_new:  # the root unit's post-backward: the head's gradients upcast into (or added to) accumulators
        run.acc[c] += st.rw * st.he if m == 0 else 0
        run.root_new = 0
    run.alive[c] -= 1
    run.done[c] += 1
    if run.done[c] == st.n and st.v > 1:  # the interleaved runtime reduces each chunk after its own last backward
        run.moments.append(_reduce(c, _common(st, run, c, False), st.rw * st.world * st.lsh))
        run.gathered[c], run.reduced[c], run.acc[c] = False, True, 0


def _loss_backward(st: _Stage, run: _Run, c: int, m: int) -> None:
    """The last stage's loss and head backward of micro-batch m; the head's gradients kept for the root's
    post-backward (or, in the gradients' own dtype, the accumulators from the first)."""
    lp, head, x, d, g = st.lp, st.head, st.x, st.d, st.g
    grad = _chunk(lp, 3)
    saved = [("this micro-batch's saved tensors", st.full[c]), head[0]]
    run.moments.append(_moment("backward", f"micro-batch {m}: the loss's backward",
                               _common(st, run, c, True) + saved + head[1:] + st.head_input
                               + [st.logits, (st.saved_name, _chunk(lp, 2)), (st.grad_name, grad)]))
    run.moments.append(_moment("backward", f"micro-batch {m}: the head's backward",
                               _common(st, run, c, True) + saved + [st.logits] + st.head_input
                               + [("logits gradient", d * x.t * x.vocab),
                                  ("head weight gradient (unsharded)", g * x.vocab * x.h),
                                  ("head input gradient", d * x.t * x.h)]))
    if st.rw != g:
        run.root_new = g * st.he
    elif m == 0:  # the first backward's gradients are the accumulators
        run.acc[c] += st.rw * st.he


def _layers_backward(st: _Stage, run: _Run, c: int, m: int) -> None:
    """Micro-batch m's backward through chunk c's layers, last to first: each layer's transients, then its
    post-backward, which adds its new gradients to the accumulators (made by the first micro-batch's)."""
    ra, g, rw, resid, acc, moments = st.ra, st.g, st.rw, st.resid, run.acc, run.moments
    ids, shown, layers, norm2 = st.chunks[c], st.shown[c], st.layers, st.norm2
    out = resid if not st.last[c] else st.logits[1]  # the stage output, referenced until the backward returns
    # Accumulating in the gradients' own dtype (no reduce dtype of its own), a later micro-batch's gradient of
    # each weight is added in place to the .grad the first one left (AccumulateGrad) and freed at once: the down
    # projection's, which the layer's backward transient counts alive, and the layer's, at its post-backward
    in_place = m > 0 and rw == g
    down = g * ra.hidden * ra.ffn_size if in_place else 0
    mlp_grads = (3 if ra.gated_mlp else 2) * down  # the MLP's weight gradients norm_backward counts made
    layer_new = g * st.le  # one layer's new gradients, before its post-backward adds them
    for i in reversed(ids):
        ly = layers[i]
        if i not in shown:
            acc[c] += rw * st.le if m == 0 else 0  # the layer's first gradients, upcast or kept as they are
            continue
        twice = ly.residual if norm2 and checkpointed(st.policy, i) and st.act != "bf16" else 0
        # the gradient flowing in: the next stage's, in its receive buffer, at the stage's last layer
        incoming = 0 if i == ids[-1] and not st.last[c] else resid
        kept = st.kept(c, i)
        parts = _common(st, run, c, True) + [("this micro-batch's saved tensors (layers up to this one)", kept),
                                             ("this micro-batch's stage output", out),
                                             ("gradient of the residual stream", incoming),
                                             ("recomputed activations of this layer", ly.recomputed - twice)]
        moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: MLP gradients",
                               parts + [("layer backward transient (MLP gradients)", ly.backward_extra - down)]))
        if ly.down_grad_extra:  # its weight gradient made, not yet added in place
            moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: down projection's "
                                   "gradients", parts + [(DOWN_GRADS, ly.down_grad_extra)]))
        if norm2 > 0:
            moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: second RMSNorm's backward",
                                   parts + [("RMSNorm backward (fp32), net of the MLP's freed tensors",
                                             norm2 - mlp_grads)]))
        if ly.float8_extra:
            moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: float8 casts (eager)",
                                   parts + [("float8 backward casts (MLP projections)", ly.float8_extra)]))
        if ly.attention_extra:
            moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: softmax backward",
                                   parts + [("eager attention backward (score-sized gradients)",
                                             ly.attention_extra)]))
        if m == 0 and rw != g:  # the first post-backward upcasts the layer's gradients into its accumulators
            acc[c] += rw * st.le
        # the layer's post-backward: its new gradients beside the accumulators they are added to
        moments.append(_moment(f"backward.layer.{i}", f"micro-batch {m}, layer {i}: post-backward",
                               _common(st, run, c, True) + [("this micro-batch's saved tensors (layers up to this one)",
                                                             kept - ly.kept), ("this micro-batch's stage output", out),
                                                            ("gradient of the residual stream", resid),
                                                            ("layer's new gradients (before its post-backward)",
                                                             0 if in_place else layer_new)]))
        if m == 0 and rw == g:  # the first backward's gradients are the accumulators
            acc[c] += rw * st.le


def _embedding_backward(st: _Stage, run: _Run, c: int, m: int) -> None:
    """The first stage's embedding backward of micro-batch m; the first makes its accumulator, and the blocks too
    large for what the stage freed before them (``Timeline``'s fresh blocks)."""
    g, rw, eg, moments = st.g, st.rw, st.eg, run.moments
    moments.append(_moment("backward.layer.0", f"micro-batch {m}: the embedding's backward",
                           _common(st, run, c, True) + [("gradient of the residual stream", st.resid),
                                                        ("embedding weight gradient (unsharded)", g * eg)]))
    if m != 0:
        return
    run.acc[c] += rw * eg
    made_at = len(moments) - 1
    if rw != g:  # the post-backward upcasts it: the new accumulator beside the gradient it is made from
        moments.append(_moment("backward.layer.0", "micro-batch 0: the embedding's gradient upcast into "
                               "its accumulator", _common(st, run, c, True)
                               + [("embedding weight gradient (unsharded)", g * eg)]))
    # the step's first requests this large: those larger than every block freed before them (the forward's
    # tensors, the all-gather outputs, a layer weight's gradient and accumulator) take segments of their
    # own beside what the stage reserved (memcalc.memory.allocator.reserved, "the forward's blocks")
    freed = max(largest_tensor(st.x, st.d, st.d, st.sp, st.attention), g * st.world * max(st.lsh, st.esh),
                rw * _largest_layer_tensor(st.ra))
    run.fresh = sum(k for k in (g * eg, rw * eg if rw != g else 0) if k > freed)
    run.fresh_at = len(moments) - 1 if run.fresh else -1
    run.fresh_from = made_at if g * eg > freed else run.fresh_at  # the gradient's own block, or the accumulator's


def _step_end(st: _Stage, run: _Run) -> Timeline:
    """perform_reduce_grad of the chunks not yet reduced, the optimizer's step and the moment before zero_grad."""
    moments = run.moments
    for c in range(st.v):  # Schedule1F1B: perform_reduce_grad after every backward
        if not run.reduced[c]:
            moments.append(_reduce(c, _common(st, run, c, False), st.rw * st.world * st.lsh))
            run.gathered[c], run.acc[c] = False, 0
    run.returned = True
    grads = [("gradients (shards)", st.states.grads)]
    tail = _common(st, run, 0, False)
    moments.append(_moment("optimizer", "optimizer.step()", tail + grads + [("step temporaries",
                                                                              st.states.step_temporary)]))
    moments.append(_moment("zero_grad", "after the step, before zero_grad", tail + grads))
    if run.fresh_at < 0:
        return Timeline(tuple(moments))
    what = "the embedding's whole-vocabulary gradients" if st.sp > 1 else "the embedding's gradients"
    return Timeline(tuple(moments), run.fresh_at, 0, run.fresh,
                    f"the blocks reserved before them, too small for {what}", run.fresh_from)


def _action_state(backward: bool, c: int, alive: list[int], gathered: list[bool], acc: list[int], done: list[int],
                  n: int, sends: bool) -> tuple:  # fmt: skip
    """What the moments of one action of ``stage_timeline``'s schedule depend on, besides the constants of the stage:
    the action and its chunk, the micro-batches in flight, the units gathered, the accumulators alive, whether an
    input gradient is being sent (1F1B past its first backward), and for a backward whether it is its chunk's first
    (it makes the accumulators and the embedding's fresh blocks) or last (it reduces). The micro-batch's number enters
    their labels only. Two actions in the same state make the same moments and leave the same state but for
    ``done``/``fwd``; a backward neither first nor last changes nothing else (tests/test_pipeline_realistic.py
    holds the timelines' figures to every action's)."""
    return (backward, c, tuple(alive), tuple(gathered), tuple(acc), sends and done[0] > 0,
            backward and done[c] == 0, backward and done[c] + 1 == n)


def _reduce(c: int, parts: list[tuple[str, int]], reduce_input: int) -> Moment:
    """perform_reduce_grad's first unit: every accumulator still alive and one layer's flat reduce-scatter input
    (``foreach_reduce``: world x the padded shard in the reduce dtype)."""
    return _moment("backward", f"chunk {c}: perform_reduce_grad, the first unit's reduce-scatter input",
                   parts + [("reduce-scatter input (one unit)", reduce_input)])


__all__ = ["one_f_one_b", "stage_timeline"]
