"""The constants of one pipeline stage for ``memcalc.memory.overlays.timeline_pp.stage_timeline``: its dtypes, its FSDP2 units'
sizes (unsharded, rank 0's shard, gathered), its layers, its model states and receive buffers, and the last stage's head
and loss, made once per call (``_stage``) and read by every action of the schedule."""

from __future__ import annotations

import itertools
from typing import NamedTuple

from memcalc.errors import InputError
from memcalc.memory.overlays.pipeline import receive_buffers
from memcalc.memory.families.saved import LLAMA_STYLE, loss_transient, shape
from memcalc.memory.engine.stack import layer_stack
from memcalc.memory.engine.timeline import CUBLAS_WORKSPACE
from memcalc.memory.engine.timeline_layers import Policy, checkpointed, parse_recompute
from memcalc.memory.engine.timeline_loss import _head, loss_rows
from memcalc.memory.engine.timeline_states import fp8_gathered, param_tensors, shard_elements, shard_states
from memcalc.memory.overlays.timeline_tp import norm_backward, rank_arch, sp_rank_arch
from memcalc.model.memo import per_architecture


@per_architecture
def _units(arch, world: int, fp8_gather: bool):
    """For one decoder layer, the embedding side and the head side (final norm and head): unsharded elements, rank
    0's shard elements (``shard_elements``: padded rows), the elements gathered as fp8 under torchao's fp8 all-gather
    (``memcalc.memory.engine.timeline_states.fp8_gathered``) and the parameter tensors."""
    tensors = param_tensors(arch)
    out = {}
    for part, pred in (("layer", lambda nm: nm.startswith("layer 0 ")),
                       ("embed", lambda nm: nm == "embedding" or nm.startswith(("position embedding", "embedding norm"))),
                       ("head", lambda nm: nm == "head" or nm.startswith("final norm"))):
        sel = [(nm, n) for nm, n in tensors if pred(nm)]
        shard = sum(shard_elements(arch, nm, n, world) for nm, n in sel)
        fp8 = fp8_gathered(arch, world) if fp8_gather and part == "layer" else 0
        out[part] = (sum(n for _, n in sel), shard, fp8, len(sel))
    return out


@per_architecture
def _largest_layer_tensor(arch) -> int:
    """Elements of the largest parameter tensor of a decoder layer."""
    return max(k for name, k in param_tensors(arch) if name.startswith("layer "))


def _chunk_sizes(u, chunks: tuple[range, ...], first: list[bool], last: list[bool], g: int,
                 world: int) -> tuple[int, int, list[int]]:  # fmt: skip
    """The rank's shard elements and parameter tensors over its chunks, and each chunk's bytes gathered (``u``:
    ``_units``; ``first``, ``last``: each chunk holds the embedding, the head; ``g``: the gathered bytes per element)."""
    (_, lsh, lfp8, lten), (_, esh, _, eten), (_, hsh, _, hten) = u["layer"], u["embed"], u["head"]
    shard = tensors = 0
    gathered = []
    for c, ids in enumerate(chunks):
        k = len(ids)
        sh = k * lsh + esh * first[c] + hsh * last[c]
        shard += sh
        tensors += k * lten + eten * first[c] + hten * last[c]
        gathered.append(g * world * sh - k * (g - 1) * lfp8)
    return shard, tensors, gathered


class _Stage(NamedTuple):
    """What every action of a pipeline rank's schedule reads, made once per stage (``_stage``): the chunks and the
    bytes of their units, layers, micro-batches, head and loss. Immutable; a named tuple, made in a fraction of a
    frozen dataclass's time (a planner makes one per stage and shape)."""

    chunks: tuple[range, ...]
    v: int  # the rank's chunks
    sends: bool  # Schedule1F1B past the first stage: a backward's input gradient is sent
    first: list[bool]  # each chunk holds the embedding
    last: list[bool]  # each chunk holds the head and the loss
    n: int  # micro-batches per step
    world: int
    policy: Policy
    act: str  # the activations' regime
    d: int  # activation bytes per element
    g: int  # gathered (and computed) parameter bytes per element
    rw: int  # the accumulators' bytes per element
    ra: object  # rank 0's architecture under tensor parallelism
    x: object  # the shapes (``memcalc.memory.families.saved.shape``)
    sp: int  # sequence-parallel ranks
    lsh: int  # one layer's shard elements
    esh: int  # the embedding's shard elements
    le: int  # one layer's elements
    eg: int  # the embedding gradient's elements
    he: int  # the head side's elements
    gathered_c: list[int]  # each chunk's bytes gathered
    layers: tuple  # every layer's ``LayerSizes``
    shown: list  # of each chunk's layers, those whose moments are made
    upto: dict[int, int]
    resid: int
    rotary: int
    full: list[int]  # one micro-batch's saved tensors of each chunk, with its stage output
    states: object  # ``shard_states`` of the rank's chunks
    base: list[tuple[str, int]]
    head: list[tuple[str, int]]
    head_input: list[tuple[str, int]]
    logits: tuple[str, int]
    lp: object  # the loss's transients (``loss_transient``)
    copy_name: str
    saved_name: str
    grad_name: str
    norm2: int
    batch_ids: tuple[str, int]
    attention: str

    def kept(self, c: int, until: int | None = None) -> int:
        """One micro-batch's saved tensors of chunk c: its layers up to ``until`` (one of them) with the rotary tables,
        or all its layers with the stage output ``fwd_cache`` keeps (not on the last stage: the logits; the tables are
        added by the caller), net of the first layer's input where it is the receive buffer."""
        ids = self.chunks[c]
        own = self.upto[ids[-1] if until is None else until] if ids else 0
        own -= self.resid if ids and not self.first[c] and checkpointed(self.policy, ids[0]) else 0
        own += self.rotary if until is not None else 0
        return own + (self.resid if until is None and not self.last[c] else 0)


def _stage(arch, family: str, regime: str, attention: str, s: int, b: int, pp: int, rank: int, n: int,
           chunks: tuple[range, ...], recompute: str, optimizer_impl: str, loss: str, device: str, code: str,
           tp: int, sequence_parallel: bool, compiled: bool, loss_compiled: bool | None, float8: str,
           float8_all_gather: bool, world: int, fsdp_param_dtype: str | None, fsdp_reduce_fp32: bool,
           every_layer: bool) -> _Stage:  # fmt: skip
    """The stage's constants: its dtypes, units, layers, states and receive buffers, and the last stage's head and
    loss (``stage_timeline``'s arguments)."""
    v = len(chunks)
    policy = parse_recompute(recompute)
    sp = tp if sequence_parallel else 1
    ra = arch if tp == 1 else (sp_rank_arch(arch, tp, family) if sequence_parallel else rank_arch(arch, tp, family))
    if arch.tied_embeddings:
        raise InputError("pipeline stages are modelled for untied embeddings (the embedding and the head live on "
                         "different stages)")
    act = "bf16" if fsdp_param_dtype == "bf16" else regime
    d = r = 2 if act == "bf16" else 4
    width = 2 if regime == "bf16" else 4  # the sharded parameters' storage
    g = 2 if fsdp_param_dtype == "bf16" else width  # gathered and computed
    rw = 4 if fsdp_reduce_fp32 and g == 2 else g  # the accumulators'
    x = shape(ra, s, b)
    t, h = x.t, x.h
    stages = pp * v
    glob = [rank + c * pp for c in range(v)]
    first = [gs == 0 for gs in glob]
    last = [gs == stages - 1 for gs in glob]
    u = _units(ra, world, float8_all_gather)
    le, lsh, _, _ = u["layer"]
    ee, esh, _, _ = u["embed"]
    # Sequence parallelism: the row-parallel embedding's backward leaves a Replicate gradient, the whole vocabulary on
    # every tensor-parallel rank (DTensor's ``embedding_dense_backward`` strategies, torch
    # ``distributed/tensor/_ops/_embedding_ops.py``), which FSDP2 redistributes to the parameter's Shard(0) only in its
    # reduce (``FSDPParam._get_grad_inner_tensor``): accumulated whole over the step's micro-batches, in the reduce
    # dtype (traced: tests/test_pipeline_realistic.py)
    eg = ee + ((arch.padded_vocab - ra.padded_vocab) * arch.hidden if sp > 1 else 0)
    shard, tensors, gathered_c = _chunk_sizes(u, chunks, first, last, g, world)
    # every layer's sizes (a stage runs no cache), and of each chunk's layers those whose moments are made: the ends
    # of its runs of alike layers, and its last (the gradient flowing in is the next stage's) (memcalc.memory.engine.stack)
    layers, ends = layer_stack(ra, family, act, attention, s, b, policy, device, None, None, code, compiled, sp,
                               float8, not float8_all_gather, False, False)
    shown = [ends.intersection(ch).union((ch[0], ch[-2], ch[-1]) if len(ch) > 1 else ch) if not every_layer else ch
             for ch in chunks]
    # one micro-batch's saved tensors of each chunk's layers up to each one (``kept``)
    upto = {i: k for ch in chunks for i, k in zip(ch, itertools.accumulate(layers[i].kept for i in ch))}
    resid = r * t * h // sp  # a stage boundary: one micro-batch's residual stream (the rank's 1/sp of the sequence)
    # Hugging Face's rotary cos and sin, made once per stage forward (one row of positions) and referenced by every
    # layer's saved tensors (or checkpointed arguments) of that micro-batch; torchtitan slices a buffer instead
    rotary = 2 * s * x.rot * r if ra.position == "rotary" and code == "hf" else 0
    st = shard_states(ra, family, width, shard, tensors, optimizer_impl)  # the rank's chunks' shards
    states = [("parameters (fp32 shards)" if width == 4 else "parameters (shards)", st.params),
              ("optimizer states", st.optimizer), ("buffers", st.buffers)]
    if device == "cuda":
        states.append(("cuBLAS workspaces (forward, backward threads)", 2 * CUBLAS_WORKSPACE))
    recv = sum(receive_buffers(gs, stages, n) for gs in glob) * resid
    # the last stage's head and loss (timeline.py's parts; the logits are kept by fwd_cache through the loss's backward)
    head = _head(x, family, act, loss, code, device)
    if sp > 1:
        head[0] = (head[0][0], head[0][1] // sp)
    compiled_loss = (compiled if loss_compiled is None else loss_compiled) and loss != "fused"
    lp = loss_transient(t, x.vocab, act, loss, compiled=compiled_loss, parallel=sp > 1)
    copy_name, saved_name, grad_name = loss_rows(lp, compiled_loss)
    # under SP the head's ColwiseParallel(input_layouts=Shard(1)) all-gathers its input, saved whole for its weight's
    # gradient until the head's backward (timeline.py's part of the same name)
    head_input = [("head input (all-gathered)", d * t * h)] if sp > 1 else []
    norm2 = (norm_backward(ra, family=family, regime=act, attention=attention, s=s, b=b, device=device,
                           rotary_dims=None, grad_width=g, sp=sp)
             if family in LLAMA_STYLE and code == "hf" else 0)  # fmt: skip
    # the step's token ids (int64), every micro-batch's: the first stage's inputs and the last stage's labels, which
    # the schedule splits into micro-batches as views (torch pipelining ``microbatch.split_args_kwargs_into_chunks``)
    batch_ids = ("the step's input ids and labels (int64)", 8 * n * b * s * (any(first) + any(last)))
    base = states + [("pipeline receive buffers", recv)]
    logits = ("logits (kept by fwd_cache)", 0 if loss == "fused" else d * t * x.vocab)
    stage = _Stage(chunks, v, v == 1 and not first[0], first, last, n, world, policy, act, d, g, rw, ra, x, sp, lsh, esh, le, eg, u["head"][0],
                   gathered_c, layers, shown, upto, resid, rotary, [], st, base, head, head_input, logits, lp,
                   copy_name, saved_name, grad_name, norm2, batch_ids, attention)
    stage.full.extend(stage.kept(c) + rotary for c in range(v))
    return stage
