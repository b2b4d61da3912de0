"""The realistic peak of a Megatron-Core rank (``--framework megatron``): its model states as Megatron-Core's DDP and
distributed optimizer hold them, what its layers save per micro-batch (``memcalc.memory.families.megatron_saved``), the
micro-batches its pipeline schedule keeps in flight, the loss, then the allocator, CUDA context and NCCL buffers as
for the other frameworks (``memcalc.memory.allocator.allocator``).

Sources (megatron-core 0.16.1, paths under ``megatron/core/``):

- ``distributed/param_and_grad_buffer.py`` ``_ParamAndGradBuffer``: every bf16 parameter of a model chunk lives in one
  contiguous param buffer (under the distributed optimizer) and its gradient in one contiguous grad buffer, fp32
  (``grad_reduce_in_fp32``: Megatron-LM's ``--bf16`` default, ``megatron/training/arguments.py``) or bf16 with
  ``--grad-reduce-in-bf16``; each parameter starts 64 elements aligned and, under the distributed optimizer, each
  bucket ends padded to a multiple of lcm(dp·cp, 128) (``_pad_end_of_bucket_if_needed``). Buckets hold at least
  ``bucket_size`` = max(40,000,000, 1,000,000 · dp·cp) elements (``distributed_data_parallel.py``).
- ``optimizer/distrib_optimizer.py`` ``DistributedOptimizer``: each rank's 1/(dp·cp) shard of the buffer gets an fp32
  master copy (``shard_fp32_from_float16_groups``) and Adam's exp_avg and exp_avg_sq (fp32): 12 bytes per element of
  the shard; the master's grad is a view of the fp32 grad buffer. The updated shards are all-gathered into the param
  buffer in place (``--overlap-param-gather`` gathers bucket by bucket into the same buffer: no second copy).
  Without ``--use-distributed-optimizer`` (``optimizer/optimizer.py`` ``Float16OptimizerWithFloat16Params``) every
  rank keeps the fp32 master and both moments whole: 12 bytes per parameter.
- ``pipeline_parallel/schedules.py`` ``get_pp_rank_microbatches``: pipeline rank r of p runs p - r - 1 warm-up
  forwards (1F1B) or 2(p - r - 1) + (v - 1)·g (interleaved, v chunks, g = microbatch_group_size_per_vp_stage = p by
  default), then one more forward before its first backward: that many chunk micro-batches in flight, at most all of
  them (v·m). ``deallocate_output_tensor`` frees each sent stage output, so a chunk's in-flight bytes are what its
  layers saved (the received input is the first layer's saved input).
- Transformer Engine (``transformer_engine/pytorch/module/base.py`` ``get_weight_workspace``, called with
  ``is_first_microbatch`` by ``extensions/transformer_engine.py``): under FP8 each linear's weight is cast once per
  step and cached for the micro-batches, row-wise and (Hopper's GEMMs take no transposed FP8 operand) column-wise:
  2 bytes per linear weight element. The amax histories and scales are a few KiB per layer (not counted).
"""

from __future__ import annotations

import math
from typing import Any

from memcalc.errors import InputError
from memcalc.layout.plan import Plan
from memcalc.memory.families import megatron_saved as ms
from memcalc.memory.accountings.rows import Row

BUCKET_MIN = 40_000_000
"""``DistributedDataParallelConfig.bucket_size`` default: max(40,000,000, 1,000,000 x data-parallel size)."""
def recompute_of(text: str) -> tuple[tuple[str, ...], str | None, int]:
    """memcalc's --recompute as Megatron-Core's settings: (selective modules, full method, layers per checkpoint).
    selective is ``--recompute-granularity selective`` with its default modules (core_attn), selective:A+B names
    them; full is ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``,
    full:uniform:N and full:block:N give the method and the layers."""
    if text in ("none", ""):
        return (), None, 0
    if text == "selective":
        return ("core_attn",), None, 0
    if text == "full":
        return (), "uniform", 1
    head, _, rest = text.partition(":")
    if head == "selective":
        return tuple(rest.split("+")), None, 0
    method, _, n = rest.partition(":")
    return (), method, int(n)


def in_flight(rank: int, pp: int, micro_batches: int, virtual: int) -> int:
    """Chunk micro-batches pipeline rank ``rank`` holds at its first backward (``schedules.py``
    ``get_pp_rank_microbatches``: its warm-up forwards and the one that precedes the first backward)."""
    total = micro_batches * virtual
    if pp == 1:
        return 1
    if virtual == 1:
        warm = pp - rank - 1
    else:
        warm = (pp - rank - 1) * 2 + (virtual - 1) * pp
    return min(total, warm + 1)


def chunks_in_flight(rank: int, pp: int, micro_batches: int, virtual: int) -> list[int]:
    """The model chunk of each of the ``in_flight`` forwards rank ``rank`` holds at its first backward: the first
    entries of ``schedules.py`` ``get_schedule_table`` (groups of pp micro-batches through chunk 0, then chunk 1,
    ...)."""
    table = [c for start in range(0, micro_batches, pp) for c in range(virtual)
             for _ in range(start, min(start + pp, micro_batches))]
    return table[:in_flight(rank, pp, micro_batches, virtual)]


def buffer_elements(params: int, shard: int, distributed: bool, bucket: int | None = None) -> int:
    """The grad (and param) buffer's elements for ``params`` parameters (``param_and_grad_buffer.py``): under the
    distributed optimizer each bucket is padded up to a multiple of lcm(shard, 128), counted as a whole lcm a bucket
    (an upper bound: the CPU trace holds it) over ceil(params / bucket) buckets (a bucket closes once it holds
    ``bucket`` elements, so no more than that; default Megatron's max(40,000,000, 1,000,000 x shard)); each parameter
    starts 64 elements aligned, a few elements a tensor (not counted)."""
    if not distributed:
        return params
    size = bucket or max(BUCKET_MIN, 1_000_000 * shard)
    buckets = max(1, -(-params // size))
    return params + buckets * math.lcm(shard, 128)


def _linear_weights(plan: Plan, stage: int) -> int:
    """The decoder layers' linear weights on rank ``stage`` (what TE casts to FP8; the embedding, the output layer and
    the router run in bf16)."""
    from memcalc.model.params import Shard, layer_params

    arch = plan.arch
    assert arch is not None
    total = 0
    for i in rank_layers(plan, stage):
        one = layer_params(arch, arch.is_moe_layer(i), Shard(plan.tp, plan.ep))
        total += one.attention + one.mlp
    return total


def rank_chunks(plan: Plan, stage: int) -> list[list[int]]:
    """The decoder layers of each model chunk of pipeline rank ``stage`` (chunk c is global stage c·pp + stage): an
    even split over pp·v stages (``transformer/transformer_block.py`` ``get_num_layers_to_build``), else the plan's
    split (``--stage-layers``: Megatron's first/last-stage layers or embedding/loss accounting)."""
    from memcalc.memory.accountings.paper import stage_chunks

    arch = plan.arch
    assert arch is not None
    if plan.stage_layers is not None:
        return [list(r) for r in stage_chunks(plan, stage)]
    per = arch.layers // (plan.pp * plan.virtual_stages)
    return [list(range((c * plan.pp + stage) * per, (c * plan.pp + stage + 1) * per))
            for c in range(plan.virtual_stages)]


def rank_layers(plan: Plan, stage: int) -> list[int]:
    """The decoder layers of pipeline rank ``stage``, its chunks' in order."""
    return [i for chunk in rank_chunks(plan, stage) for i in chunk]


def state_rows(plan: Plan, stage: int) -> list[Row]:
    """Rank ``stage``'s model states: bf16 parameters, the grad buffer, the fp32 master and Adam's moments (the
    routed experts in buffers of their own, sharded over the expert data-parallel group)."""
    from memcalc.memory.accountings.paper import param_groups

    psi, groups = param_groups(plan, stage)
    distributed = plan.spec.name == "zero-1"
    sized = [(g.n, buffer_elements(g.psi, g.n, distributed)) for g in groups if g.psi]
    n = sum(e for _, e in sized)
    part = sum(e // k for k, e in sized)
    over = " and ".join(f"{e:,}/{k}" for k, e in sized)
    grad = 2 if plan.grad_bytes == 2 else 4
    where = "megatron/core/distributed/param_and_grad_buffer.py"
    rows = [
        Row("parameters", "parameters (bf16 param buffer)", 2 * n, "gpu", "model_state",
            f"2 bytes x {n:,} buffer elements ({psi:,} parameters + bucket padding; {where})"),
        Row("gradients", f"grad buffer ({'fp32 main_grad' if grad == 4 else 'bf16'})", grad * n, "gpu",
            "model_state", f"{grad} bytes per buffer element, whole on every rank ({where}"
            + (", grad_reduce_in_fp32" if grad == 4 else ", --grad-reduce-in-bf16") + ")"),
    ]
    if distributed:
        rows += [Row("master_weights", "fp32 master shard", 4 * part, "gpu", "model_state",
                     f"4 x {over} (optimizer/distrib_optimizer.py shard_fp32_from_float16_groups)"),
                 Row("optimizer_moments", "Adam moments (fp32 shard)", 8 * part, "gpu", "model_state",
                     f"2 x 4 x {over} (exp_avg, exp_avg_sq of the shard)")]
        if grad == 2:
            rows.append(Row("gradients_fp32", "fp32 copy of the grad shard (step)", 4 * part, "gpu", "model_state",
                            "bf16 grads: the master's .grad is a float copy of the shard at the optimizer step, "
                            "once the activations are freed (distrib_optimizer.py _copy_model_grads_to_main_grads)"))
    else:
        rows += [Row("master_weights", "fp32 master weights", 4 * psi, "gpu", "model_state",
                     "4 bytes per parameter (optimizer/optimizer.py Float16OptimizerWithFloat16Params)"),
                 Row("optimizer_moments", "Adam moments (fp32)", 8 * psi, "gpu", "model_state",
                     "exp_avg and exp_avg_sq, 4 bytes each per parameter")]
    if plan.float8 != "none" and plan.float8_all_gather:
        # --fp8-param-gather: the linears' weights are TE Float8Tensors (one byte in the param buffer, gathered in
        # FP8 by the distributed optimizer) with their column-wise (transposed) copy; no bf16 copy, no workspace
        w = _linear_weights(plan, stage)
        rows[0] = rows[0]._replace(label="parameters (param buffer: FP8 linears, bf16 rest)", bytes=2 * n - w,
                                   detail=f"1 byte x {w:,} FP8 linear weights + 2 bytes x the other {n - w:,} buffer "
                                          f"elements (--fp8-param-gather; {where})")
        rows.append(Row("fp8_weights", "FP8 weights' column-wise copies", w, "gpu", "model_state",
                        f"1 byte x {w:,}: the transposed FP8 data Hopper's wgrad and dgrad GEMMs read "
                        "(transformer_engine/pytorch/tensor/float8_tensor.py, columnwise usage)"))
    elif plan.float8 != "none":
        w = _linear_weights(plan, stage)
        rows.append(Row("fp8_weights", "FP8 weight copies (row- and column-wise)", 2 * w, "gpu", "model_state",
                        f"2 bytes x {w:,} linear weight elements, cast once per step and cached for the micro-batches "
                        "(transformer_engine/pytorch/module/base.py get_weight_workspace)"))
    return rows


def _shape(plan: Plan) -> ms.Shape:
    arch, w = plan.arch, plan.work
    assert arch is not None and w is not None
    return ms.shape_of(arch, w.seq_len // plan.cp, w.micro_batch, plan.tp, plan.sequence_parallel)


def layer_saved(plan: Plan, index: int) -> list[tuple[str, int]]:
    """What decoder layer ``index`` saves per micro-batch on one rank (dense, or attention + MoE)."""
    arch, w = plan.arch, plan.work
    assert arch is not None and w is not None
    x = _shape(plan)
    fp8 = plan.float8 != "none"
    modules = recompute_of(w.recompute)[0]
    if not arch.is_moe_layer(index):
        return ms.layer_saved(x, "te", fp8, modules)
    # the attention half: a dense layer's saved set up to its pre-MLP norm (the mlp module recomputes dense MLPs
    # only: transformer/transformer_layer.py sets recompute_mlp for a layer whose mlp is not a MoELayer)
    dense = ms.layer_saved(x, "te", fp8, tuple(m for m in modules if m != "mlp"))
    attention = dense[:next(i for i, (k, _) in enumerate(dense) if k.startswith("norm 2 input"))]
    shared = arch.shared_experts * arch.ffn_size
    return attention + ms.moe_saved(x, arch.experts, arch.top_k, arch.expert_ffn_size, shared, fp8, modules)


def activation_rows(plan: Plan, stage: int) -> tuple[list[Row], int]:
    """Rank ``stage``'s saved activations at its first backward, the backward's and the loss's transients; and the
    chunk micro-batches in flight."""
    arch, w = plan.arch, plan.work
    assert arch is not None and w is not None
    x = _shape(plan)
    chunks = rank_chunks(plan, stage)
    layers = [i for chunk in chunks for i in chunk]
    flight = chunks_in_flight(stage, plan.pp, plan.grad_accum, plan.virtual_stages)
    n = len(flight)
    rows: list[Row] = []
    saved = {i: sum(b for _, b in layer_saved(plan, i)) for i in layers}
    seq = x.s * x.b // x.tp if x.sp else x.s * x.b
    _, method, k = recompute_of(w.recompute)
    kept = 2 * arch.hidden * seq  # a checkpoint's input: the hidden states, sequence-sharded under SP
    where = f"{n} chunk micro-batches in flight (pipeline_parallel/schedules.py warm-up + 1, get_schedule_table)"
    if method is not None:
        # transformer/transformer_block.py _checkpointed_forward: uniform checkpoints each run of k layers of the
        # chunk (keeping its input), block the first k layers one by one and runs the rest whole
        def held(chunk: list[int]) -> int:
            if method == "uniform":
                return -(-len(chunk) // k) * kept
            return min(k, len(chunk)) * kept + sum(saved[i] for i in chunk[k:])

        runs = [chunk[j:j + k] for chunk in chunks for j in range(0, len(chunk), k)] if method == "uniform" \
            else [[i] for chunk in chunks for i in chunk[:k]]
        again = max(runs, key=lambda run: sum(saved[i] for i in run), default=[])  # the largest rebuilt at once
        rows.append(Row("activations", f"checkpointed inputs and whole layers: {len(layers)} layers, {n} chunk "
                        "micro-batches", sum(held(chunks[c]) for c in flight), "gpu", "activation",
                        f"full recompute ({method}, {k} layers): a checkpoint input of {kept / 2**20:.1f} MiB each "
                        f"(and block's unrecomputed layers whole); {where}"))
        if again:
            rows.append(Row("activations_recomputed", f"the recomputed checkpoint's saved tensors ({len(again)} "
                            "layers)", sum(saved[i] for i in again), "gpu", "activation",
                            "its layers' saved sets, rebuilt for its backward"))
    else:
        total = sum(saved[i] for c in flight for i in chunks[c])
        what = ", ".join(f"{name} {v / 2**20:.1f} MiB" for name, v in layer_saved(plan, layers[-1]))
        rows.append(Row("activations", f"activations: {len(layers)} layers, {n} chunk micro-batches", total, "gpu",
                        "activation", f"{saved[layers[-1]] / 2**20:.1f} MiB per layer and micro-batch (the last "
                        f"layer: {what}; memory/families/megatron_saved.py); {where}"))
    moe = any(arch.is_moe_layer(i) for i in layers)
    transient = ms.moe_transient(x, arch.top_k, arch.expert_ffn_size) if moe else ms.backward_transient(x)
    what = "the MLP's (the experts' over the dispatched tokens) output and input gradients, bf16"
    if stage == 0:
        # tensor_parallel/layers.py VocabParallelEmbedding: the embedding's backward makes a dense bf16 gradient of
        # the vocabulary shard before the DDP hook adds it into main_grad
        emb = 2 * -(-arch.padded_vocab // plan.tp) * arch.hidden
        if emb > transient:
            transient, what = emb, "the word embedding's dense bf16 gradient (V/tp x h), before it joins main_grad"
    rows.append(Row("backward_transient", "backward working set", transient, "gpu", "activation", what))
    if stage == plan.pp - 1:
        head = sum(b for _, b in ms.head_saved(arch, x))
        rows.append(Row("head", "final norm and output layer inputs", head, "gpu", "activation",
                        "models/gpt/gpt_model.py: the final norm's input and output, one micro-batch"))
        rows.append(Row("loss", "logits and loss (fp32 softmax)", ms.loss_transient(arch, x), "gpu", "activation",
                        "tensor_parallel/cross_entropy.py: bf16 logits and their fp32 copy, 6 bytes per logit of the "
                        "vocabulary shard"))
        if plan.defer_embedding_wgrad is not None:
            rows.append(_deferred_wgrad(plan, x, seq))
    return rows, n


def _deferred_wgrad(plan: Plan, x: ms.Shape, seq: int) -> Row:
    """``--defer-embedding-wgrad-compute``: the last stage's output layer keeps, for each deferred micro-batch (the
    first ``--wgrad-deferral-limit`` of the step, 0: all), its input (the sequence shard under SP) and its output
    gradient over the vocabulary shard, and runs their wgrad GEMMs at the pipeline flush (tensor_parallel/layers.py
    ``embedding_activation_buffer``, ``grad_output_buffer``; models/gpt/gpt_model.py). Counted whole beside the first
    backward's micro-batches in flight: the buffers fill over the step while the steady phase keeps that many in
    flight (1F1B's last stage one), so at most this."""
    arch = plan.arch
    assert arch is not None
    limit = plan.defer_embedding_wgrad
    n = plan.grad_accum if not limit else min(limit, plan.grad_accum)
    each = 2 * arch.hidden * seq + 2 * x.s * x.b * -(-arch.padded_vocab // plan.tp)
    return Row("deferred_wgrad", f"deferred output-layer wgrad: {n} micro-batches", n * each, "gpu", "activation",
               f"{n} x ({each / 2**20:.1f} MiB: the output layer's bf16 input and output gradient over the vocabulary "
               "shard), kept to the pipeline flush (tensor_parallel/layers.py embedding_activation_buffer, "
               "grad_output_buffer)")


def communicators(plan: Plan) -> int:
    """NCCL communicators a rank joins: data(-context), tensor, pipeline, context and expert groups of size > 1."""
    dpcp = plan.dp * plan.cp  # Megatron-Core reduces gradients over the data x context ranks, DDP or not
    return sum(int(g > 1) for g in (dpcp, plan.tp, plan.pp, plan.cp, plan.ep, dpcp // plan.ep if plan.ep > 1 else 1))


def evaluate(plan: Plan, stage: int = 0) -> Any:
    """The realistic peak of pipeline rank ``stage`` (``memcalc.memory.accountings.realistic.Realistic``)."""
    from memcalc.memory.allocator.allocator import fit, nccl_buffers
    from memcalc.memory.accountings.rows import Realistic

    arch = plan.arch
    assert arch is not None and plan.work is not None
    if arch.layers % (plan.pp * plan.virtual_stages) and plan.stage_layers is None:
        raise InputError(f"--virtual-stages {plan.virtual_stages}: layers({arch.layers}) is not a multiple of "
                         f"pp({plan.pp}) x {plan.virtual_stages}; Megatron-Core needs an explicit split")
    rows = state_rows(plan, stage)
    acts, _ = activation_rows(plan, stage)
    # bf16 grads: the optimizer step's fp32 copy of the grad shard exists only once the backward has freed the
    # activations, so the peak is the larger of the first backward and the step
    step = [r for r in rows if r.key == "gradients_fp32"]
    at_step = bool(step) and step[0].bytes > sum(r.bytes for r in acts)
    rows = [r for r in rows if r.key != "gradients_fp32" or at_step] + ([] if at_step else acts)
    allocated = sum(r.bytes for r in rows)
    x = _shape(plan)
    largest = ms.loss_transient(arch, x) * 4 // 6 if stage == plan.pp - 1 else 0
    comm = nccl_buffers(communicators(plan), 16, 2)
    f = fit(allocated, plan.usable_bytes, largest_request=largest, context=plan.cuda_context, communication=comm)
    rows += [Row("allocator_reserve", "allocator: reserved beyond allocated",
                 f.peak_reserved - allocated + plan.reserve, "gpu", "overhead",
                 "the least measured gap (0.3 GiB, H100) + --reserve-gib"),
             Row("cuda_context", "CUDA context", plan.cuda_context, "gpu", "overhead",
                 "context, cuBLAS/cuDNN handles and kernels outside the allocator (0.75 GiB measured: H100, "
                 "torch 2.11)")]
    if comm:
        rows.append(Row("nccl_buffers", "NCCL buffers", comm, "gpu", "overhead",
                        "NCCL_BUFFSIZE 4 MiB x 16 channels x 2 ring peers per communicator (data, tensor, pipeline, "
                        "context, expert and expert-data groups), outside the allocator"))
    phase = "backward" if plan.pp > 1 or plan.work.recompute == "full" else "forward"
    when = "the first backward, all warm-up micro-batches in flight"
    if at_step:
        phase, when = "optimizer step", "the optimizer step: the fp32 copy of the bf16 grad shard"
    return Realistic(rows, allocated, f.peak_reserved + plan.reserve, f.total + plan.reserve, f.verdict,
                     f.margin - plan.reserve, phase, when, {phase: allocated})


NOTE = ("accounting: realistic (Megatron-Core): the model states as Megatron-Core's DDP and distributed optimizer hold "
        "them (bf16 param buffer, {grad} grad buffer, fp32 master and Adam moments {sharded}), what a Transformer "
        "Engine GPT layer saves per micro-batch ({fp8}{recompute}), the micro-batches pipelining/schedules.py keeps "
        "in flight at the first backward, the loss's logits on the last stage (memory/accountings/megatron.py, "
        "memory/families/megatron_saved.py; the local spec's saved set is traced: memcalc/validation/trace_megatron.py)")


def notes(plan: Plan) -> list[str]:
    w = plan.work
    assert w is not None
    return [NOTE.format(grad="fp32" if plan.grad_bytes == 4 else "bf16",
                        sharded=f"sharded over {plan.shard_group_size} ranks" if plan.spec.name == "zero-1"
                        else "whole (DDP)",
                        fp8=("FP8: one-byte copies of the linears' inputs, weights cast once per step"
                             if plan.float8 != "none" else "bf16"),
                        recompute=_recompute_words(w.recompute))] + extra_notes(plan)


def extra_notes(plan: Plan) -> list[str]:
    """What the Megatron accounting assumes beyond the note above, for this plan."""
    arch = plan.arch
    assert arch is not None
    out = ["Transformer Engine's saved tensors are read from its code (layernorm_linear.py, linear.py, the fused "
           "attention), not traced: the trace runs Megatron-Core's local spec on CPU (tests/frameworks/"
           "test_megatron_core.py)"]
    if arch.moe:
        out.append(f"MoE: routing counted balanced, each expert-parallel rank's experts taking s·b·k tokens (k = "
                   f"{arch.top_k}; a dropless router's busiest rank holds more); expert tensor parallelism = tp")
    if plan.float8 != "none":
        out.append("FP8: every decoder layer counted in FP8 (recipes that keep the first and last layers in bf16 hold "
                   "a little more)" + ("" if plan.float8_all_gather else "; --float8-all-gather for "
                                       "--fp8-param-gather's FP8 weights"))
    if plan.cp > 1:
        out.append(f"cp {plan.cp}: each rank's s/cp tokens; the ring's K/V chunks in flight during attention are not "
                   "counted")
    return out


def _recompute_words(text: str) -> str:
    modules, method, k = recompute_of(text)
    if method is not None:
        return f", full recompute, {method}, {k} layer{'s' if k != 1 else ''} per checkpoint"
    return f", selective recompute of {', '.join(modules)}" if modules else ", no recompute"
