"""The backward phases of a step (``memcalc.memory.engine.timeline``): the loss's gradients, the head's and the final
norm's backward, the decoder layers' backward, what the embedding and FSDP's root do at its end (``TAIL``: overlay
steps, each with its condition, applied in order), the optimizer and zero_grad. Each is a function of the
``memcalc.memory.engine.timeline_step.Step`` and of what the forward left (``memcalc.memory.engine.timeline_forward.Forward``)."""

from __future__ import annotations

from memcalc.memory.overlays.fsdp_overlay import FsdpOverlay
from memcalc.memory.allocator.reserved import loss_blocks_at_peak
from memcalc.memory.families.saved import LAYER_NORM_FAMILIES, LLAMA_STYLE
from memcalc.memory.engine.timeline_forward import Forward
from memcalc.memory.engine.timeline_layers import DOWN_GRADS, checkpointed
from memcalc.memory.engine.timeline_loss import _chunk, largest_tensor
from memcalc.memory.engine.timeline_step import EMB_MINE, EMB_WHOLE, Moment, Step, _moment
from memcalc.memory.overlays.timeline_tp import norm_backward, rmsnorm_backward

LOSS = ("loss and its gradient", 8)


def loss_backward(c: Step, moments: list[Moment], f: Forward) -> tuple[int, int, int]:
    """The start of the backward, the loss's fp32 gradients; (the moment's index, the bytes the loss leaves cached,
    its own blocks alive there: ``memcalc.memory.engine.timeline_step.Timeline``'s loss fields)."""
    t, h, d, n = c.t, c.h, c.d, c.n
    saved_end = c.base + c.bwd_shared + [("layer activations", f.layers_kept)] + f.head
    saved_end += [] if c.amp or c.lora is not None else [("head input (the last hidden state)", d * t * h)]
    # eager loss_parallel: its fp32 gradient and, inside DTensor, zeros_like, exp(x) and their sum (saved.parallel_loss)
    grad_bytes = _chunk(f.lp, 3)
    saved_end += [(f.saved_name, _chunk(f.lp, 2)), LOSS] + f.softcap
    saved_end += [("logits (saved by the compiled loss)", d * n)] if f.compiled_loss and c.sp == 1 else []
    saved_end += FsdpOverlay.after_layers(c.fs, "loss-backward", c.arch.layers)
    loss_moment = len(moments)
    moments.append(_moment("backward", "log_softmax backward: its output gradient and its input gradient",
                           saved_end + [(f.grad_name, grad_bytes)]))  # fmt: skip
    loss_live, loss_cache = loss_blocks_at_peak(t, c.v, d, c.loss, f.compiled_loss, c.sp > 1)
    # where the logits (the loss's first and smallest request) are larger than the forward's largest tensor, no block
    # the forward freed can serve the loss (memcalc.memory.allocator.reserved, "the forward's blocks")
    loss_blocks = loss_live if d * n > largest_tensor(c.x, d, c.r, c.sp, c.attention) else 0
    return loss_moment, loss_cache, loss_blocks


def head_backward(c: Step, moments: list[Moment], f: Forward) -> None:
    """The head's backward, its own FSDP unit gathered (the head in a unit of its own)."""
    if not (c.fs is not None and c.fs.wrap != "root" and c.sp == 1 and c.loss != "fused"):
        return
    t, h, d = c.t, c.h, c.d
    # the head's backward, its unit gathered: the logits' gradient, the head weight's unsharded gradient and the
    # gradient of its input (both in the matmul's dtype; under autocast their fp32 casts come once the bf16 casts
    # the head saved are freed), beside what the final norm and the head saved. LoRA's frozen head saved no
    # input and makes its input's gradient only; the root, with no parameters, prefetched nothing before it
    frozen = c.lora is not None
    moments.append(_moment("backward", "the head's backward" + (" (frozen: its input's gradient only)" if frozen
                                                                else ""), c.base + c.bwd_shared + [
        LOSS, ("layer activations", f.layers_kept)] + f.head
        + ([] if c.amp or frozen else [("head input (the last hidden state)", d * t * h)])
        + [("logits gradient", d * c.n), ("head weight gradient (unsharded)", 0 if frozen else d * c.v * h),
           ("head input gradient", d * t * h)] + FsdpOverlay.head_backward(c.fs, c.arch.layers)))


def _final_norm_backward(c: Step, moments: list[Moment], f: Forward, held_grads: int) -> None:
    # the final RMSNorm's backward (``memcalc.memory.overlays.timeline_tp.rmsnorm_backward``): the loss's and the head's
    # tensors are gone, the head's (and the norm's) gradients made; its normalized tensor freed. LoRA: the frozen
    # norm and head make no gradients and the norm never kept its normalized tensor (the head list has it out
    # already), the same fp32 transient (traced: tests/test_fsdp_layouts.py)
    fs, lora, t, h, sp = c.fs, c.lora, c.t, c.h, c.sp
    root = 0 if lora is not None else held_grads if fs is None else held_grads // c.w * fs.gathered_width
    normalized = 0 if lora is not None else (2 if c.act == "bf16" else 4) * t * h // sp
    moments.append(_moment("backward", "the final RMSNorm's backward" + (" (frozen weight)" if lora else ""),
                           c.base + c.bwd_shared + [LOSS, ("layer activations", f.layers_kept),
                                                    ("final norm saved, less its normalized tensor",
                                                     f.head[0][1] - normalized),
                                                    ("RMSNorm backward (fp32)", rmsnorm_backward(t // sp, h))]
                           + FsdpOverlay.norm_backward(fs, root, c.arch.layers)))  # fmt: skip


def backward_layers(c: Step, moments: list[Moment], f: Forward) -> int:
    """The final norm's and the decoder layers' backward; the gradients held at its end (bytes)."""
    in_backward = c.optimizer_impl == "in-backward"
    held_grads = 0 if in_backward else c.before_layers
    if c.family in LLAMA_STYLE and c.code == "hf":
        _final_norm_backward(c, moments, f, held_grads)
    remaining = f.kept
    norm2 = (norm_backward(c.arch, family=c.family, regime=c.act, attention=c.attention, s=c.s, b=c.b,
                           device=c.device, rotary_dims=c.rotary_dims,
                           grad_width=c.fs.gathered_width if c.fs is not None else c.w, sp=c.sp)
             if c.family in LLAMA_STYLE and c.code == "hf" and c.lora is None else None)  # fmt: skip
    layers, shown, per_layer = c.layers, c.shown, 0 if in_backward else c.per_layer
    for i in reversed(range(c.arch.layers)):
        ly = layers[i]
        if i in shown:
            _backward_layer(c, moments, i, ly, remaining, held_grads, norm2)
        remaining -= ly.kept + ly.kept_casts
        held_grads += per_layer
    return held_grads


def _backward_layer(c: Step, moments: list[Moment], i: int, ly, remaining: int, held_grads: int,
                    norm2: int | None) -> None:
    """Layer ``i``'s backward moments (``remaining``: the activations kept by layers 0..i, ``held_grads``: the
    gradients made before it, ``norm2``: its second RMSNorm's backward where the family has one)."""
    fs, resid, shared = c.fs, c.layers[-1].residual, c.base + c.bwd_shared
    # Llama-style, fp32 or autocast: the recomputed norm-1 input (fp32) is the checkpointed layer input itself
    # (``to(float32)`` of an fp32 tensor is a no-op): counted once, in the checkpoint (tests/test_timeline_tp.py)
    # LayerNorm families (GPT-2, OPT, GPT-NeoX, BLOOM, Falcon): the first norm saves its input as it is, in every
    # regime, so the recomputed input is the checkpoint too
    twice = (ly.residual if checkpointed(c.policy, i) and c.code == "hf" and c.lora is None
             and ((norm2 is not None and c.act != "bf16") or c.family in LAYER_NORM_FAMILIES) else 0)
    entry = shared + [LOSS, (f"layer activations (layers 0..{i})", remaining),
                      ("gradient of the residual stream", resid)]
    before = c.before_layers
    if fs is not None and not fs.whole:
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: parameters gathered",
                               entry + FsdpOverlay.backward(fs, i, held_grads, before, gather=True)))
    parts = shared + [LOSS, ("layer activations (layers 0..%d)" % i, remaining),
                      ("gradient of the residual stream", resid),
                      ] + FsdpOverlay.backward(fs, i, held_grads, before) + [
                      ("recomputed activations of this layer", ly.recomputed - twice),
                      ("recomputed weight casts", ly.casts - ly.kept_casts),
                      ("layer backward transient (MLP gradients)", ly.backward_extra)]  # fmt: skip
    if ly.recompute_attention:
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: the recomputed eager attention",
                               parts[:-3] + [("recomputed forward at eager attention's softmax",
                                              ly.recompute_attention)]))
    if c.optimizer_impl == "in-backward":
        parts.append(("one gradient and its step temporaries", c.st.largest_grad + c.st.step_temporary))
    moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: MLP gradients", parts))
    if ly.down_grad_extra:
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: down projection's gradients",
                               [p for p in parts if p[0] != "layer backward transient (MLP gradients)"]
                               + [(DOWN_GRADS, ly.down_grad_extra)]))
    if norm2 is not None and norm2 > 0:  # Llama-style RMSNorm: its backward can top the MLP's once it is ÷ tp
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: second RMSNorm's backward",
                               [p for p in parts if p[0] != "layer backward transient (MLP gradients)"]
                               + [("RMSNorm backward (fp32), net of the MLP's freed tensors", norm2)]))
    if ly.float8_extra:
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: float8 casts (eager)",
                               parts[:-1] + [("float8 backward casts (MLP projections)", ly.float8_extra)]))
    if ly.attention_extra:
        attn = parts[:-1] + [("eager attention backward (score-sized gradients)", ly.attention_extra)]
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: softmax backward", attn))
    if fs is not None and c.optimizer_impl != "in-backward" and not fs.whole:
        moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: reduce-scatter copy-in",
                               shared + [LOSS, (f"layer activations (layers 0..{i - 1})",
                                                remaining - ly.kept - ly.kept_casts),
                                         ("gradient of the residual stream", resid)]
                               + FsdpOverlay.copy_in(fs, i, held_grads, before)
                               # FSDP1's hook fires on the FlatParameter's last gradient, the input norm's weight,
                               # inside that norm's backward: its input-side gradient is alive too
                               + [("input norm's backward, in flight (FSDP1)", resid if fs.flat else 0)]))


# ---- the embedding's and FSDP's root's moments at the end of the backward: (condition, moment), applied in order --

def _tied_when(c: Step) -> bool:
    fs = c.fs
    return c.arch.tied_embeddings and c.lora is None and c.optimizer_impl != "in-backward" and (
        fs is None or (fs.wrap == "root" and not fs.keep and not fs.held_reduce))


def _tied(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    # the embedding's backward makes its weight's gradient while the head's is held: the autograd engine adds
    # them out of place (InputBuffer::accumulate), three vocabulary-sized tensors at once, the residual stream's
    # gradient freed by then (traced)
    gw = c.w if c.fs is None else c.fs.gathered_width
    return _moment("backward.layer.0", "the embedding's backward, its gradient added to the head's",
                   c.base + [LOSS] + FsdpOverlay.tied_embedding_backward(c.fs, held_grads, c.before_layers,
                                                                         c.arch.layers)
                   + [("embedding gradient and its sum with the head's (tied)", 2 * gw * c.arch.padded_vocab * c.h)])


def _sp_embedding_when(c: Step) -> bool:
    fs = c.fs
    return (c.sp > 1 and fs is not None and fs.wrap in ("root", "separate") and not fs.flat and not fs.whole
            and c.lora is None and c.optimizer_impl != "in-backward")


def _sp_embedding(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    # Sequence parallelism under FSDP2: the embedding's backward all-gathers its output gradient over the sequence
    # and makes the whole vocabulary's gradient (a Replicate DTensor), which the post-backward of its unit
    # redistributes to the parameter's Shard(0), a copy of this rank's rows (``FSDPParam._get_grad_inner_tensor``),
    # before the whole one is freed; layer 0's reduce-scatter is done, the rotary tables and the residual stream's
    # gradient gone (traced at Llama 3 8B's widths, 4 layers, tp 8: tests/test_timeline_tp.py; torchtune's
    # separate-reshard wrap, which it runs without sequence parallelism, keeps the embedding's unit as before)
    fs, r, h = c.fs, c.r, c.h
    whole, mine, gathered = r * c.vocab_rows * h, r * c.arch.padded_vocab * h, r * c.t * h
    if fs.wrap == "root":
        gone = ("this layer's unsharded gradients", "gradient of the residual stream", "rotary cos, sin")
        copy_in = next(m for m in reversed(moments) if m.label == "backward of layer 0: reduce-scatter copy-in")
        held = [p for p in copy_in.parts if p[0] not in gone]
        held.append(("gradient shard of layer 0", fs.layer_grad_shard))
    else:
        held = c.base + [LOSS] + [
            p for p in FsdpOverlay.embedding_backward(fs, c.arch.layers) if p[0] != "embedding gradients (unsharded)"]
        held = [p for p in held if p[0] != "rotary cos, sin"]
    return _moment("backward.layer.0", "the embedding's backward: the whole vocabulary's gradient",
                   held + [(EMB_WHOLE, whole), (EMB_MINE, max(gathered, mine))])


def _root_copy_in_fsdp1(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    return _moment("backward.layer.0", "the root's reduce-scatter copy-in (FSDP1)",
                   c.base + [LOSS] + FsdpOverlay.root_copy_in(c.fs, c.arch.layers))


def _embedding_backward(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    return _moment("backward.layer.0", "the embedding's backward",
                   c.base + [LOSS, ("gradient of the residual stream", c.layers[-1].residual)]
                   + FsdpOverlay.embedding_backward(c.fs, 0 if c.fs.whole else c.arch.layers))


def _whole_copy_in(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    # FSDP2's root post-backward (the final callback)
    fs = c.fs
    return _moment("backward.layer.0", "the root's reduce-scatter copy-in",
                   c.base + [LOSS] + FsdpOverlay.whole_copy_in(
                       fs, held_grads + (c.late * c.w if fs.wrap == "root" else 0), c.before_layers))


def _tail_copy_in(c: Step, moments: list[Moment], held_grads: int) -> Moment:  # then the tied [norm, embedding, head]
    return _moment("backward.layer.0", "the [norm, embedding, head] unit's reduce-scatter copy-in",
                   c.base + [LOSS] + FsdpOverlay.tail_copy_in(c.fs, c.before_layers + c.late * c.w))


def _embedding_copy_in(c: Step, moments: list[Moment], held_grads: int) -> Moment:
    return _moment("backward.layer.0", "the embedding's reduce-scatter copy-in",
                   c.base + [LOSS] + FsdpOverlay.embedding_copy_in(c.fs, c.arch.layers))


TAIL = (
    (_tied_when, _tied),
    (_sp_embedding_when, _sp_embedding),
    (lambda c: c.fs is not None and c.fs.flat and not c.fs.frozen_layers, _root_copy_in_fsdp1),
    (lambda c: c.fs is not None and c.fs.wrap != "root", _embedding_backward),
    (lambda c: c.fs is not None and c.fs.whole and not c.fs.flat, _whole_copy_in),
    (lambda c: c.fs is not None and c.fs.whole and not c.fs.flat and c.fs.wrap == "root", _tail_copy_in),
    (lambda c: c.fs is not None and c.fs.wrap != "root", _embedding_copy_in),
)
"""The end of the backward, in order: the tied embedding's gradient added to the head's, sequence parallelism's
whole-vocabulary gradient, FSDP1's root copy-in, the embedding's unit (backward), FSDP2's root post-backward under
NO_WRAP and its tied [norm, embedding, head] unit, the embedding's unit (copy-in)."""


def tail(c: Step, moments: list[Moment], held_grads: int) -> None:
    """The moments of ``TAIL`` whose condition holds, in order (``held_grads``: the gradients held after the
    decoder layers')."""
    for when, moment in TAIL:
        if when(c):
            moments.append(moment(c, moments, held_grads))


def optimizer(c: Step, moments: list[Moment]) -> None:
    """optimizer.step() and the moment before zero_grad (the in-backward optimizer stepped already)."""
    grads = 0 if c.optimizer_impl == "in-backward" else c.st.grads
    with_grads = c.base + [("gradients (shards)" if c.fs else "gradients", grads)]
    moments.append(_moment("optimizer", "optimizer.step()", with_grads + [("step temporaries", c.st.step_temporary)]))
    moments.append(_moment("zero_grad", "after the step, before zero_grad", with_grads))
