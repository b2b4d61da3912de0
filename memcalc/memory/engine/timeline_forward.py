"""The forward phases of a step (``memcalc.memory.engine.timeline``): the baseline and the batch, the decoder layers, the
final norm, the head and the loss. Each is a function of the ``memcalc.memory.engine.timeline_step.Step`` that appends its
moments; the FSDP overlay's parts come from ``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay`` (None: no FSDP)."""

from __future__ import annotations

from memcalc.frozen import frozen
from memcalc.memory.families.prologue import FUSED_GATE_UP, PARALLEL_RESIDUAL, layer_cache
from memcalc.memory.overlays.fsdp_overlay import FsdpOverlay
from memcalc.memory.families.saved import LLAMA_STYLE, OTHER_NORMS, loss_transient
from memcalc.memory.families.saved_gemma import GEMMAS
from memcalc.memory.engine.timeline_layers import checkpointed
from memcalc.memory.engine.timeline_loss import _chunk, _head, inside_log_softmax, loss_rows
from memcalc.memory.engine.timeline_step import MLP_FRAME, O_PROJ_FRAME, Moment, Step, _moment
from memcalc.memory.overlays.timeline_tp import reduce_scatter, row_parallel_reduce


@frozen
class Forward:
    """What the forward leaves for the backward."""

    kept: int
    """Bytes the decoder layers keep for their backward."""
    layers_kept: int
    """Those and the last layer's output, where the final norm keeps it."""
    head: list
    """What the final norm and the head save (``memcalc.memory.engine.timeline_loss._head``, this step's)."""
    lp: object
    """The loss's tensors (``memcalc.memory.families.saved.loss_transient``)."""
    compiled_loss: bool
    saved_name: str
    grad_name: str
    softcap: list


def start(c: Step, moments: list[Moment]) -> None:
    """The model states before the step (no gradients after zero_grad), the batch, FSDP's root gathered."""
    moments.append(_moment("baseline", "before the step (no gradients after zero_grad)", c.model_states))
    moments.append(_moment("input", "the batch", c.base))
    if c.fs is not None and c.fs.whole:
        moments.append(_moment("forward", "the root gathered at the forward's start",
                               c.base + FsdpOverlay.whole_gather(c.fs)))


def forward_layers(c: Step, moments: list[Moment]) -> tuple[int, int]:
    """The decoder layers' forward; (bytes they keep, autocast's cast cache beyond what the matmuls save: bf16 copies
    of recomputed layers' weights)."""
    kept = 0
    cache = 0
    fs, base, shared, shown, arch, x = c.fs, c.base, c.fwd_shared, c.shown, c.arch, c.x
    cached = layer_cache(arch, x, family=c.family, amp=c.amp, d=c.d, code=c.code, lora=c.lora, use_cache=c.use_cache,
                         policy=c.policy, attention=c.attention, promotes=c.cache_promotes_values)  # fmt: skip
    for i, ly in enumerate(c.layers):
        show = i in shown
        if show and ly.attention_forward:
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: eager attention's softmax",
                                   base + shared + [(f"activations kept (layers 0..{i - 1})", kept),
                                                    ("autocast cast cache", cache),
                                                    ("attention forward: the layer so far", ly.attention_forward)]
                                   + FsdpOverlay.forward(fs, i)))  # fmt: skip
        if show and fs is not None and not fs.whole:
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: parameters gathered",
                                   base + shared + [(f"activations kept (layers 0..{i - 1})", kept),
                                   ("layer input", ly.residual), ("autocast cast cache", cache)]
                                   + FsdpOverlay.gather(fs, i)))  # fmt: skip
        kept += ly.kept + ly.kept_casts  # each layer's kept tensors include its input (the previous output)
        cache += cached(i, ly)
        if show:
            _layer(c, moments, i, ly, kept, cache)
    return kept, cache


def _layer(c: Step, moments: list[Moment], i: int, ly, kept: int, cache: int) -> None:
    """Layer ``i``'s forward moments from its down projection's output on (``kept``: with its own kept tensors)."""
    t, h, d = c.t, c.h, c.d
    acts = [(f"activations kept (layers 0..{i})", kept), ("layer output (residual stream)", ly.residual),
            ("autocast cast cache (recomputed layers' weights)", cache)] + FsdpOverlay.forward(c.fs, i)
    # GPT-NeoX's parallel residual (``mlp_output + attn_output + residual``): the attention's output and the
    # first sum are alive at the second add
    parallel = 2 * d * t * h if c.family in PARALLEL_RESIDUAL and c.arch.parallel_block and c.code == "hf" else 0
    moments.append(_moment(f"forward.layer.{i}", f"layer {i}: down projection's output before the residual add",
                           c.base + c.fwd_shared + acts + [("down projection output", d * t * h),
                                                           ("attention output and the first sum", parallel)]))
    if ly.forward_extra:
        moments.append(_moment(f"forward.layer.{i}", f"layer {i}: the activation's forward temporaries",
                               c.base + c.fwd_shared + acts[:1] + acts[2:]
                               + [("activation forward temporaries, less the down input", ly.forward_extra)]))
    frame = _frames(c, moments, i, acts)
    if c.tp > 1:
        sp, r, amp = c.sp, c.r, c.amp
        reduce = reduce_scatter(d, r, t, h, sp, amp) if sp > 1 else row_parallel_reduce(d, r, t, h, amp)
        if frame:  # (``reduce`` has the norm's local output and, under autocast, the MLP's fp32 input)
            reduce += [p for p in frame if p[0] == "residual (the attention's output sum)" or p[0].startswith(
                "MLP input") and not amp] + [("down projection input", d * t * c.x.ffn)]
        moments.append(_moment(f"forward.layer.{i}", f"layer {i}: the MLP's row-parallel "
                               + ("reduce-scatter" if sp > 1 else "all-reduce"),
                               c.base + c.fwd_shared + acts[:1] + acts[2:] + reduce))


def _frames(c: Step, moments: list[Moment], i: int, acts: list) -> list[tuple[str, int]]:
    """A checkpointed eager Llama-style layer's moments inside its submodules; the MLP's frame (empty elsewhere)."""
    # a checkpointed eager layer's forward saves nothing, but the frames still hold what the MLP works on: the
    # decoder layer its residual (the attention's output sum), the MLP its input (the post-attention norm's
    # output; under SP the norm's local output and the gathered tensor PrepareModuleInput makes, fp32 under
    # autocast), down_proj its input until its output (and under TP its output hook's collective) is done
    if not (checkpointed(c.policy, i) and c.family in LLAMA_STYLE and c.code == "hf" and c.lora is None
            and not c.compiled and not c.arch.experts and c.float8 == "none"):
        return []
    t, h, d, r, amp, sp, x = c.t, c.h, c.d, c.r, c.amp, c.sp, c.x
    if not amp and c.family not in FUSED_GATE_UP and c.attention == "sdpa":
        # the o projection's output (under TP its collective): the attention's frame holds its input (the
        # norm's output; under SP its local output and the gathered tensor), the rotated q and k, v and the
        # attention's output, o_proj's input (traced: tests/test_timeline_tp.py)
        attn_in = ([("norm 1 output (local)", r * t * h // sp), ("attention input (all-gathered)", d * t * h)]
                   if sp > 1 else [("attention input (the norm's output)", r * t * h)])
        o_out = (reduce_scatter(d, r, t, h, sp, amp)[:3] if sp > 1 else
                 row_parallel_reduce(d, r, t, h, amp) if c.tp > 1 else [("o projection output", d * t * h)])
        moments.append(_moment(f"forward.layer.{i}", f"layer {i}: {O_PROJ_FRAME}",
                               c.base + c.fwd_shared + acts[:1] + acts[2:] + attn_in
                               + [("q, k, v (rotated)", d * t * (x.qw + 2 * x.kvw)),
                                  ("attention output", d * t * x.qw)] + o_out))
    frame = [("residual (the attention's output sum)", r * t * h // sp)]
    frame += ([("norm 2 output (local)", r * t * h // sp), ("MLP input (all-gathered)", (r if amp else d) * t * h)]
              if sp > 1 else [("MLP input (the norm's output)", r * t * h)])
    # the MLP's product: the activation of gate's output, up's output and their product; under autocast the
    # down projection's weight not cast yet (traced: tests/test_timeline_tp.py)
    cache_now = [(n, b - 2 * h * x.ffn) if n.startswith("autocast cast cache") and amp else (n, b)
                 for n, b in acts[2:]]
    moments.append(_moment(f"forward.layer.{i}", f"layer {i}: {MLP_FRAME}",
                           c.base + c.fwd_shared + acts[:1] + cache_now + frame
                           # Phi-3's fused gate_up output (2f) stays beside the activation and the product
                           + [("activation of gate, up and their product",
                               (4 if c.family in FUSED_GATE_UP else 3) * d * t * x.ffn)]))
    return frame


def head_forward(c: Step, moments: list[Moment], kept: int, cache: int) -> tuple[list, list, int]:
    """The final norm and the head; (what is alive after the norm, what the norm and head save, the layers' kept
    bytes with the last output where the norm keeps it)."""
    t, h, d, r, sp, act, fs, family = c.t, c.h, c.d, c.r, c.sp, c.act, c.fs, c.family
    resid = c.layers[-1].residual
    L = c.arch.layers
    # Pure bf16 activations, Hugging Face's RMSNorm: the final norm saves an fp32 copy of the last layer's output and
    # nothing keeps the bf16 original once the norm returned; while it runs, its fp32 normalized tensor (not saved:
    # the backward of ``to(bf16)`` needs nothing) is alive as well (traced: tests/test_timeline_tp.py)
    # (Gemma's and OLMo 2's norms: their fp32 product with the weight, before the cast back to bf16)
    upcast = act == "bf16" and family in (*LLAMA_STYLE, *OTHER_NORMS) and c.code == "hf" and c.lora is None
    # LoRA in bf16: the final norm keeps an fp32 copy of the last output, not the output; the resid counted is the
    # embedding output, a leaf that requires grad (enable_input_require_grads) held by the graph, which a checkpointed
    # layer 0 already keeps as its input (traced: tests/validation/test_deepspeed_timeline.py)
    leaf_kept = c.lora is not None and act == "bf16" and checkpointed(c.policy, 0)
    layers_kept = kept + (0 if upcast or leaf_kept else resid)
    head = _head(c.x, family, act, c.loss, c.code, c.device)
    if sp > 1:  # the final norm (SequenceParallel) runs on the rank's 1/sp of the sequence
        head[0] = (head[0][0], head[0][1] // sp)
    if c.lora is not None:  # frozen final norm weight and head: no normalized tensor (Gemma's is fp32), no head input
        normalized = (4 if act != "bf16" or family in GEMMAS else 2) * t * h
        head = [(n, b - normalized if n == "final norm saved" else b) for n, b in head if n != "head input (bf16 cast)"]
    last = len(c.layers) - 1
    after_norm = c.base + c.bwd_shared + [("layer activations", layers_kept), ("autocast cast cache", cache)]
    if fs is not None and fs.wrap == "separate":  # the final norm's pre-forward gathers the head's unit
        moments.append(_moment(f"forward.layer.{last}", "the final norm and the head gathered",
                               c.base + c.fwd_shared + [(f"activations kept (layers 0..{last})", kept),
                                                        ("layer output (residual stream)", resid),
                                                        ("autocast cast cache", cache)]
                               + FsdpOverlay.after_layers(fs, "gather", L)))  # fmt: skip
    after_norm += [head[0], ("last hidden state (model output)", r * t * h // sp)]
    moments.append(_moment(f"forward.layer.{last}", "the final norm, its variance not yet freed",
                           after_norm + FsdpOverlay.after_layers(fs, "norm", L) + ([] if c.kept_mask else c.mask)
                           + [("norm variance (fp32)", 4 * t // sp if family in LLAMA_STYLE else 0)]
                           + ([("last layer output (until the norm returns)", resid),
                               ("normalized (fp32, until the norm returns)", 4 * t * h // sp)] if upcast else [])))
    if sp > 1 and not c.amp:  # the head's ColwiseParallel(input_layouts=Shard(1)) all-gathers its input, saved whole
        after_norm.append(("head input (all-gathered)", d * t * h))
    logits = [("logits", 0 if c.loss == "fused" else d * c.n)]
    if fs is not None and fs.wrap == "separate-reshard":  # the head's pre-forward gathers its unit
        moments.append(_moment("forward.head", "the head gathered", after_norm + ([] if c.kept_mask else c.mask)
                               + FsdpOverlay.after_layers(fs, "gather", L)))
    # under autocast the head's all-gathered input is fp32, referenced until the head returns (its bf16 cast saved)
    gathered_fp32 = [("head input (all-gathered, fp32, until the head returns)", r * t * h)] if sp > 1 and c.amp else []
    moments.append(_moment("forward.head", "the head's logits",
                           after_norm + FsdpOverlay.after_layers(fs, "head", L) + head[1:] + gathered_fp32 + logits))
    return after_norm, head, layers_kept


def loss_forward(c: Step, moments: list[Moment], kept: int, after_norm: list, head: list,
                 layers_kept: int) -> Forward:
    """The loss's forward (transformers ``ForCausalLMLoss``): the labels, the logits' fp32 copy, the log-softmax."""
    t, b, s, d, n = c.t, c.b, c.s, c.d, c.n
    logits = [("logits", 0 if c.loss == "fused" else d * n)]
    labels = [("labels padded (int64)", 8 * b * (s + 1)), ("shift labels (int64)", 8 * t)]
    # inductor's fused cross-entropy saves the logits instead of the fp32 log-softmax
    compiled_loss = (c.compiled if c.loss_compiled is None else c.loss_compiled) and c.loss != "fused"
    lp = loss_transient(t, c.v, c.act, c.loss, compiled=compiled_loss, parallel=c.sp > 1)
    copy_name, saved_name, grad_name = loss_rows(lp, compiled_loss)
    # Gemma 2's final logit softcap (``logits / cap``, ``tanh``, ``* cap``, Gemma2ForCausalLM.forward): tanh's output
    # (d·T·V) is saved until the backward reaches it; the capped logits are the loss's input
    softcap = [("logit softcap tanh output", d * n if c.arch.logit_softcap and c.loss != "fused" else 0)]
    fwd_loss = after_norm + FsdpOverlay.after_layers(c.fs, "loss", c.arch.layers) + head[1:] + logits + labels + softcap
    fwd_loss += [(copy_name, _chunk(lp, 1)), (saved_name, _chunk(lp, 2))]
    if len(lp.names) > 4:  # eager loss_parallel: its moment is inside ``_log_softmax`` (the loss not made yet)
        fwd_loss += inside_log_softmax(lp, t)
    else:
        fwd_loss += [("loss, total weight", 8)]
    moments.append(_moment("loss", "log-softmax done, logits and their fp32 copy alive" if not compiled_loss else
                           "the compiled loss's forward kernels done, the logits alive", fwd_loss))
    return Forward(kept, layers_kept, head, lp, compiled_loss, saved_name, grad_name, softcap)
