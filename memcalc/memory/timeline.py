"""The live bytes of one optimizer step on one GPU, moment by moment: a plain function of numbers.

The step is the one Hugging Face ``Trainer`` (and ``memcalc.validation.trace``) runs: ``zero_grad(set_to_none=True)``
left no gradients; forward layer by layer with the model's own loss (transformers ``loss/loss_utils.py``
``ForCausalLMLoss``: ``logits.float()``, labels padded by one and shifted, ``cross_entropy``), backward, the
optimizer step, ``zero_grad``. What each layer saves is ``memcalc.memory.saved`` (exact against a census of the
modules); this module orders those sizes in time and adds what lives only for a moment (the model's output while
the loss runs, autocast's cast cache, the loss's gradients, recomputed layers, the optimizer's temporaries).
Phase names are the tracer's (``memcalc.validation.trace_step.mark_phases``) so that the two compare directly.
Allocator rounding, reserved memory, the CUDA context and NCCL buffers are ``memcalc.memory.allocator``'s.
"""

from __future__ import annotations

import dataclasses

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.memory.fsdp_overlay import FsdpOverlay
from memcalc.memory.reserved import loss_blocks_at_peak
from memcalc.memory.saved import (FAMILIES, LAYER_NORM_FAMILIES, LLAMA_STYLE, OTHER_NORMS, REGIMES, _check,
                                  check_code, embedding_norm, loss_transient, shape)
from memcalc.memory.saved_gemma import GEMMAS, rope_types, sliding_sdpa_masked
from memcalc.memory.stack import affine, layer_stack, tensor_groups
from memcalc.memory.timeline_layers import DOWN_GRADS, checkpointed, parse_recompute
from memcalc.memory.timeline_loss import _chunk, _head, inside_log_softmax, largest_tensor, loss_rows
from memcalc.memory.timeline_states import lora_states, states
from memcalc.memory.timeline_tp import (norm_backward, rank_arch, reduce_scatter, rmsnorm_backward,
                                       row_parallel_reduce, sp_rank_arch, step_temporary)
from memcalc.model.architecture import Architecture

LOSS_HELP = "standard, chunked:N, fused"
CUBLAS_WORKSPACE = 32 * 1024 * 1024
"""cuBLAS workspace on sm90 (aten/src/ATen/cuda/CublasHandlePool.cpp: ``CUBLAS_WORKSPACE_CONFIG`` default
``:4096:8`` = 8 × 4096 KiB), one per (handle, stream), allocated through the caching allocator: the forward's
thread and autograd's backward thread each hold one, so 2 × 32 MiB of allocated memory on an H100."""


@frozen
class Moment:
    """The bytes alive at one point of the step."""

    phase: str
    label: str
    live_bytes: int
    parts: tuple[tuple[str, int], ...]
    """What the live bytes consist of (sums to ``live_bytes``)."""


O_PROJ_FRAME = "the o projection's output (no grad)"
MLP_FRAME = "the MLP's product (no grad: recomputed later)"
"""A checkpointed layer's forward moments between its submodules (their labels follow "layer i: ")."""


@frozen
class Timeline:
    moments: tuple[Moment, ...]
    loss_moment: int = -1
    """The index of the loss's peak moment (-1: none marked)."""
    loss_cache: int = 0
    """Bytes the loss leaves cached and free at that moment (``memcalc.memory.reserved.loss_cached``)."""
    loss_blocks: int = 0
    """The loss's own blocks alive at that moment (``memcalc.memory.reserved.loss_events``) where each is larger than
    any tensor the forward made, so that none of the forward's freed blocks serves them; else 0."""
    fresh_detail: str = "the forward's blocks, too small for the loss's"
    """What stays cached beside those fresh blocks, as the detail row names it (a pipeline's first stage: the blocks
    reserved before the embedding's gradients)."""
    fresh_from: int = -1
    """The first moment that holds one of them (-1: the first with logits)."""

    @property
    def peak(self) -> Moment:
        """The first moment with the most live bytes."""
        return max(self.moments, key=lambda m: m.live_bytes)

    @property
    def phase_peaks(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.moments:
            out[m.phase] = max(out.get(m.phase, 0), m.live_bytes)
        return out

    def at(self, phase: str) -> int:
        return self.phase_peaks[phase]


def _moment(phase: str, label: str, parts: list[tuple[str, int]]) -> Moment:
    kept = tuple([p for p in parts if p[1]])
    return Moment(phase, label, sum([p[1] for p in kept]), kept)


EMB_WHOLE = "embedding gradient, the whole vocabulary (Replicate, sequence parallel)"
EMB_MINE = "its copy of this rank's rows (Shard(0)), or the all-gathered output gradient before it"


def timeline(arch: Architecture, *, family: str, regime: str, attention: str, s: int, b: int,
             recompute: str = "none", optimizer_impl: str = "foreach", optimizer_states: str = "adamw",
             loss: str = "standard", device: str = "cpu", position_ids: bool = True, use_cache: bool = True,
             rotary_dims: int | None = None, world: int = 1, fsdp: bool | None = None,
             fsdp_param_dtype: str | None = None, lora=None, code: str = "hf", tp: int = 1,
             compiled: bool = False, loss_compiled: bool | None = None,
             sequence_parallel: bool = False, float8: str = "none",
             float8_all_gather: bool = False, fsdp_wrap: str = "root", fsdp_keep: bool = False,
             fsdp_hsdp: bool = False, fsdp_reduce_fp32: bool = False, fsdp_flat: bool = False,
             fsdp_prefetch: bool = True, fsdp_whole: bool = False,
             cache_promotes_values: bool = False, hooked_grads: bool = False,
             every_layer: bool = True) -> Timeline:  # fmt: skip
    """Moments of one training step of a Hugging Face ``family`` model on one GPU.

    regime: fp32 | bf16 (pure: weights, gradients, AdamW moments bf16) | amp-bf16 (fp32 weights, autocast).
    recompute: none | full | every:K | selective | op-sac.  optimizer_impl: foreach | fused | for-loop |
    in-backward.  optimizer_states: adamw | adamw-8bit | paged-adamw-8bit.  loss: standard | chunked:N | fused.
    device: cpu (what the tracer runs) | cuda (adds the cuBLAS workspaces; CUDA kernel differences in saved.py).
    use_cache: the config's ``use_cache`` (Hugging Face turns it off under checkpointing). Under autocast the
    rotary product promotes K to fp32, so the cache keeps an fp32 copy of K (4·T·kv width per layer) while SDPA
    saves a bf16 cast; the cached V (transformers 5.24 on: ``DynamicLayer.lazy_initialization`` gives the empty
    values tensor V's own dtype) is a bf16 copy, the very tensor SDPA saves (where repeat_kv's copies are saved
    instead, eager attention under GQA and Gemma 3's masked sliding layers: 2·T·kv width more). They live until the
    forward returns. cache_promotes_values: transformers 5.x before 5.24, whose empty values tensor took K's dtype,
    so ``torch.cat`` promoted the cached V to fp32 too (2·4·T·kv width per layer, SDPA saving its bf16 cast;
    ``memcalc.validation.trace_step.cache_promotes_values`` probes the installed release).
    position_ids: the batch passes b × s position ids (the tracer does; a plain ``model(input_ids)`` call makes
    1 × s ones, so the rotary tables are b times smaller).
    world: above 1 (or ``fsdp=True``: FSDP2 on one rank), FSDP2 ``fully_shard`` per decoder layer and on the root
    over ``world`` data-parallel ranks (``memcalc.memory.fsdp_overlay.FsdpOverlay``); fsdp_param_dtype: None or "bf16"
    (``MixedPrecisionPolicy(param_dtype=)``); fsdp_wrap: the embedding and the head in the root or in units of
    their own (``memcalc.layout.compose.FSDP_WRAPS``); fsdp_keep: no reshard after forward (SHARD_GRAD_OP);
    fsdp_hsdp: the shards replicated over groups of ``world`` ranks (HSDP); fsdp_reduce_fp32: gradients reduced in fp32
    under the bf16 policy; fsdp_flat: FSDP1's FlatParameter units, fsdp_prefetch its BACKWARD_PRE; fsdp_whole: no
    unit per decoder layer, accelerate's NO_WRAP (``FsdpOverlay.make``). lora: a ``memcalc.model.lora.LoraPlan`` (peft adapters on a frozen
    base, one GPU or DDP): adapter states only, the layers' LoRA saved tensors, a frozen head and final norm that
    keep no input; the layer backward transients stay the full model's (an upper bound).
    code: whose model code runs the layers, ``hf`` or ``torchtitan`` (its Llama 3: ``memcalc.memory.saved``'s
    ``_torchtitan_layer``; the rotary table is gathered per layer, the final norm is its ``nn.RMSNorm``; the loss
    stays Hugging Face's, whose logits outlive the forward where torchtitan deletes them: a bound of d·T·V).
    tp: DTensor tensor parallelism as rank 0 of ``tp`` ranks (``memcalc.memory.timeline_tp``: the layers' shapes
    per rank, the row-parallel all-reduce, no sequence parallelism, no loss_parallel); with ``world`` above 1 the
    FSDP2 ranks are the data-parallel ones (world = data-parallel degree, the mesh's "dp" dimension).
    compiled: torch.compile per layer (``memcalc.memory.compiled``); loss_compiled: the loss compiled too
    (``memcalc.memory.saved.loss_transient``; None: as ``compiled``).
    sequence_parallel: with tp, torchtitan's sequence-parallel plan with ``loss_parallel`` (``memcalc.memory.
    timeline_tp``: norms, residual stream and embedding output ÷ tp along the sequence, the projections' gathered
    inputs whole, the row-parallel outputs reduce-scattered, embedding, head and logits ÷ tp over the vocabulary).
    float8: torchao's float8 projections (``tensorwise``, ``rowwise``): eager layers add their backward casts
    (``memcalc.memory.timeline_layers.layer_sizes``); float8_all_gather: under FSDP2, torchao's fp8 all-gather of the
    layers' projection weights (``FsdpOverlay.make``'s ``fp8_gather``).
    every_layer: False makes the moments of the layers that end a run of alike ones only (``memcalc.memory.stack``):
    the same peak moment, phase peaks (layers folded) and reserved peak, from a few layers' moments.
    """
    _check(family, regime, attention)
    check_code(code, family, "bf16" if fsdp_param_dtype == "bf16" else regime, attention)
    if device not in ("cpu", "cuda"):
        raise InputError(f"device {device!r} is not one of cpu, cuda")
    if s < 1 or b < 1:
        raise InputError(f"seq_len {s} and micro_batch {b} must be at least 1")
    policy = parse_recompute(recompute)
    vocab_rows = arch.padded_vocab
    if tp > 1:
        if code != "hf" or lora is not None or policy.kind not in ("none", "full"):
            raise InputError(f"tp {tp}: tensor parallelism is modelled for Hugging Face layers without LoRA, "
                             f"recompute none or full; got code {code}, recompute {recompute}")  # fmt: skip
        arch = rank_arch(arch, tp, family) if not sequence_parallel else sp_rank_arch(arch, tp, family)
    # under full recompute a compiled layer keeps its checkpoint too (its recomputed backward counted as eager's)
    if sequence_parallel and (tp < 2 or family not in LLAMA_STYLE or attention != "sdpa" or s % tp or loss != "standard"
                              or (compiled and policy.kind != "full")):  # fmt: skip
        raise InputError(f"sequence_parallel is modelled for tp above 1 dividing seq_len, {', '.join(LLAMA_STYLE)} "
                         f"layers, sdpa, the standard loss, layers eager or compiled under full recompute; got "
                         f"tp {tp}, {family}, {attention}, s {s}, loss {loss}, recompute {recompute}")  # fmt: skip
    sp = tp if sequence_parallel else 1
    loss_transient(1, 1, regime, loss)  # validates the loss option
    x = shape(arch, s, b, rotary_dims)
    t, h, v, n = x.t, x.h, x.vocab, x.t * x.vocab
    w = 2 if regime == "bf16" else 4
    # FSDP2's MixedPrecisionPolicy(param_dtype=bf16) gathers bf16 weights (under autocast nothing is cast) and the
    # embedding's bf16 output makes every activation what pure bf16 saves (the sharded states stay fp32)
    act = "bf16" if fsdp_param_dtype == "bf16" else regime
    d, r, amp = {"fp32": (4, 4, False), "bf16": (2, 2, False), "amp-bf16": (2, 4, True)}[act]
    st = full_st = (states(arch, family, w, optimizer_impl, optimizer_states) if lora is None
                    else lora_states(arch, family, w, optimizer_impl, optimizer_states, lora))
    sharded = (world > 1 or fsdp_param_dtype is not None) if fsdp is None else fsdp
    if float8 not in ("none", "tensorwise", "rowwise"):
        raise InputError(f"float8 {float8!r} is not one of none, tensorwise, rowwise")
    if float8_all_gather and not sharded:
        raise InputError("float8_all_gather is FSDP2's (torchao enable_fsdp_float8_all_gather): give world above 1 "
                         "or fsdp=True")
    fs = (FsdpOverlay.make(arch, family, regime, world, fsdp_param_dtype, optimizer_impl, optimizer_states,
                           fp8_gather=float8_all_gather, wrap=fsdp_wrap, keep=fsdp_keep, hsdp=fsdp_hsdp,
                           reduce_fp32=fsdp_reduce_fp32, flat=fsdp_flat, prefetch=fsdp_prefetch, lora=lora,
                           whole=fsdp_whole)
          if sharded else None)  # fmt: skip
    if fs is not None:
        st = fs.states
        if fs.frozen_layers and fs.gathered_width != fs.width:  # FSDP1's bf16 MixedPrecision: peft re-casts
            lora = dataclasses.replace(lora, inputs_recast=True)
    elif tp > 1 and not sequence_parallel and (temp := step_temporary(arch, w, optimizer_impl)) is not None:
        st = full_st = dataclasses.replace(st, step_temporary=temp)
    # Sequence parallelism: the embedding's RowwiseParallel backward (``embedding_dense_backward`` under DTensor's
    # sharding propagation, torch ``distributed/tensor/_ops/_embedding_ops.py``) leaves a Replicate gradient, the
    # whole vocabulary on every rank (traced: tests/test_timeline_tp.py), made at the end of the backward
    emb_grad_extra = w * (vocab_rows - arch.padded_vocab) * h if sp > 1 else 0
    if emb_grad_extra and fs is None:
        st = full_st = dataclasses.replace(st, grads=st.grads + emb_grad_extra)
    model_states = [("parameters", st.params), ("optimizer states", st.optimizer), ("buffers", st.buffers)]
    if lora is not None:  # the frozen base and the adapters, apart (adapter parameters are as large as their grads)
        base = "frozen base, nf4" if lora.quantize == "nf4" else "frozen base"
        model_states[:1] = [(f"parameters ({base})", st.params - st.grads), ("parameters (LoRA adapters)", st.grads)]
    if device == "cuda":
        model_states.append(("cuBLAS workspaces (forward, backward threads)", 2 * CUBLAS_WORKSPACE))
    moments = [_moment("baseline", "before the step (no gradients after zero_grad)", model_states)]
    inputs = [("input ids (int64)", 8 * t), ("position ids (int64)", 8 * s)]
    base = model_states + inputs
    moments.append(_moment("input", "the batch", base))
    if fs is not None and fs.whole:
        moments.append(_moment("forward", "the root gathered at the forward's start",
                               base + FsdpOverlay.whole_gather(fs)))

    # ---- forward ---------------------------------------------------------------------------------------------
    prologue = [("embedding output", r * t * h // sp)]
    if arch.position == "rotary" and code == "hf":  # torchtitan gathers its table inside each layer
        rows = b if position_ids else 1
        # Gemma 3: one table per layer type in use; OLMo 2's rotary returns fp32 cos, sin in every regime
        tables = rope_types(arch) * (4 if family == "olmo2" else r)
        prologue.append(("rotary cos, sin", 2 * rows * s * x.rot * tables))
    if family == "gpt2" and arch.dropout > 0 and code == "hf":  # GPT2Model's drop(wte + wpe): its mask to the end
        prologue.append(("embedding dropout mask", (1 if device == "cuda" else r) * t * h // sp))
    if family == "opt" and code == "hf":  # OPTLearnedPositionalEmbedding's b x s indices, saved for its backward
        prologue.append(("learned position indices (int64)", 8 * t))
    if family == "bloom":  # word_embeddings_layernorm keeps its input and statistics until the backward's last op
        prologue += [(k.name, k.bytes) for k in embedding_norm(x, r, amp, device == "cuda")]
    # Eager attention: the model's 4-D causal mask (b × s × s in the embedding output's dtype; transformers
    # ``masking_utils.create_causal_mask``) lives until the model's forward returns; the attention's add saves
    # nothing, but each checkpointed layer keeps it as an argument until its backward (tests/test_timeline_tp.py)
    eager_mask = (attention == "eager" and family in (*LLAMA_STYLE, *OTHER_NORMS, "bloom") and code == "hf"
                  and lora is None)
    mask = [("eager attention mask", r * b * s * s * _mask_kinds(arch))] if eager_mask else []
    if family == "falcon" and code == "hf" and lora is None:
        # FalconModel builds its causal mask even for SDPA (``allow_is_causal_skip=False``): a boolean s x s broadcast
        # over the batch (SDPA), or b x s x s in the embedding's dtype (eager), alive through the forward and kept by
        # checkpointed layers as an argument
        mask = [("causal mask (bool)", s * s)] if attention == "sdpa" else [("eager attention mask", r * b * s * s)]
    slopes = []
    if family == "bloom" and lora is None:  # build_alibi_tensor: (b·heads, 1, s) in the embedding's dtype
        mask.append(("ALiBi biases", r * b * x.heads * s))
        slopes = [("ALiBi slopes (fp32, until the forward returns)", 4 * x.heads)]
    if attention == "sdpa" and family == "gemma3_text" and arch.sliding_layers and s >= (arch.sliding_window or s + 1):
        mask = [("sliding-window attention mask (bool)", b * s * s)]  # masking_utils: built once s >= the window
    kept_mask = mask if checkpointed(policy, 0) else []
    fwd_shared, bwd_shared = prologue[1:] + mask + slopes, prologue[1:] + kept_mask  # the rotary tables, the mask
    layers, ends = layer_stack(arch, family, act, attention, s, b, policy, device, rotary_dims, lora, code, compiled,
                               sp, float8, not float8_all_gather, use_cache, hooked_grads)
    layer_elements, embedding_elements = tensor_groups(arch)
    per_layer = layer_elements * w
    if lora is not None:  # only the adapters have gradients, made layer by layer
        per_layer = full_st.grads // arch.layers
    # the layers whose moments are made: every one, or the ends of the runs of alike layers (memcalc.memory.stack)
    shown = ends if not every_layer and affine(per_layer, fs) else range(arch.layers)
    kept = 0
    cache = 0  # autocast's cast cache beyond what the matmuls save: bf16 copies of recomputed layers' weights
    for i, ly in enumerate(layers):
        show = i in shown
        if show and ly.attention_forward:
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: eager attention's softmax",
                                   base + fwd_shared + [(f"activations kept (layers 0..{i - 1})", kept),
                                                        ("autocast cast cache", cache),
                                                        ("attention forward: the layer so far", ly.attention_forward)]
                                   + FsdpOverlay.forward(fs, i)))  # fmt: skip
        if show and fs is not None and not fs.whole:
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: parameters gathered",
                                   base + fwd_shared + [(f"activations kept (layers 0..{i - 1})", kept),
                                   ("layer input", ly.residual), ("autocast cast cache", cache)]
                                   + FsdpOverlay.gather(fs, i)))  # fmt: skip
        kept += ly.kept + ly.kept_casts  # each layer's kept tensors include its input (the previous output)
        cache += _cached(arch, x, i, ly, family=family, amp=amp, d=d, code=code, lora=lora, use_cache=use_cache,
                         policy=policy, attention=attention, promotes=cache_promotes_values)
        if not show:
            continue
        acts = [(f"activations kept (layers 0..{i})", kept), ("layer output (residual stream)", ly.residual),
                ("autocast cast cache (recomputed layers' weights)", cache)] + FsdpOverlay.forward(fs, i)
        # GPT-NeoX's parallel residual (``mlp_output + attn_output + residual``): the attention's output and the
        # first sum are alive at the second add
        parallel = 2 * d * t * h if family == "gpt_neox" and arch.parallel_block and code == "hf" else 0
        moments.append(_moment(f"forward.layer.{i}", f"layer {i}: down projection's output before the residual add",
                               base + fwd_shared + acts + [("down projection output", d * t * h),
                                                           ("attention output and the first sum", parallel)]))
        if ly.forward_extra:
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: the activation's forward temporaries",
                                   base + fwd_shared + acts[:1] + acts[2:]
                                   + [("activation forward temporaries, less the down input", ly.forward_extra)]))
        # a checkpointed eager layer's forward saves nothing, but the frames still hold what the MLP works on: the
        # decoder layer its residual (the attention's output sum), the MLP its input (the post-attention norm's
        # output; under SP the norm's local output and the gathered tensor PrepareModuleInput makes, fp32 under
        # autocast), down_proj its input until its output (and under TP its output hook's collective) is done
        frame = []
        if (checkpointed(policy, i) and family in LLAMA_STYLE and code == "hf" and lora is None and not compiled
                and not arch.experts and float8 == "none"):
            if not amp and family != "phi3" and attention == "sdpa":
                # the o projection's output (under TP its collective): the attention's frame holds its input (the
                # norm's output; under SP its local output and the gathered tensor), the rotated q and k, v and the
                # attention's output, o_proj's input (traced: tests/test_timeline_tp.py)
                attn_in = ([("norm 1 output (local)", r * t * h // sp), ("attention input (all-gathered)", d * t * h)]
                           if sp > 1 else [("attention input (the norm's output)", r * t * h)])
                o_out = (reduce_scatter(d, r, t, h, sp, amp)[:3] if sp > 1 else
                         row_parallel_reduce(d, r, t, h, amp) if tp > 1 else [("o projection output", d * t * h)])
                moments.append(_moment(f"forward.layer.{i}", f"layer {i}: {O_PROJ_FRAME}",
                                       base + fwd_shared + acts[:1] + acts[2:] + attn_in
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
                                   base + fwd_shared + acts[:1] + cache_now + frame
                                   # Phi-3's fused gate_up output (2f) stays beside the activation and the product
                                   + [("activation of gate, up and their product",
                                       (4 if family == "phi3" else 3) * d * t * x.ffn)]))
        if tp > 1:
            reduce = reduce_scatter(d, r, t, h, sp, amp) if sp > 1 else row_parallel_reduce(d, r, t, h, amp)
            if frame:  # (``reduce`` has the norm's local output and, under autocast, the MLP's fp32 input)
                reduce += [p for p in frame if p[0] == "residual (the attention's output sum)" or p[0].startswith(
                    "MLP input") and not amp] + [("down projection input", d * t * x.ffn)]
            moments.append(_moment(f"forward.layer.{i}", f"layer {i}: the MLP's row-parallel "
                                   + ("reduce-scatter" if sp > 1 else "all-reduce"),
                                   base + fwd_shared + acts[:1] + acts[2:] + reduce))
    resid = layers[-1].residual
    L = arch.layers
    # Pure bf16 activations, Hugging Face's RMSNorm: the final norm saves an fp32 copy of the last layer's output and
    # nothing keeps the bf16 original once the norm returned; while it runs, its fp32 normalized tensor (not saved:
    # the backward of ``to(bf16)`` needs nothing) is alive as well (traced: tests/test_timeline_tp.py)
    # (Gemma's and OLMo 2's norms: their fp32 product with the weight, before the cast back to bf16)
    upcast = act == "bf16" and family in (*LLAMA_STYLE, *OTHER_NORMS) and code == "hf" and lora is None
    # LoRA in bf16: the final norm keeps an fp32 copy of the last output, not the output; the resid counted is the
    # embedding output, a leaf that requires grad (enable_input_require_grads) held by the graph, which a checkpointed
    # layer 0 already keeps as its input (traced: tests/validation/test_deepspeed_timeline.py)
    leaf_kept = lora is not None and act == "bf16" and checkpointed(policy, 0)
    layers_kept = kept + (0 if upcast or leaf_kept else resid)
    head = _head(x, family, act, loss, code, device)
    if sp > 1:  # the final norm (SequenceParallel) runs on the rank's 1/sp of the sequence
        head[0] = (head[0][0], head[0][1] // sp)
    if lora is not None:  # frozen final norm weight and head: no normalized tensor (Gemma's is fp32), no head input
        normalized = (4 if act != "bf16" or family in GEMMAS else 2) * t * h
        head = [(n, b - normalized if n == "final norm saved" else b) for n, b in head if n != "head input (bf16 cast)"]
    last = len(layers) - 1
    after_norm = base + bwd_shared + [("layer activations", layers_kept), ("autocast cast cache", cache)]
    if fs is not None and fs.wrap == "separate":  # the final norm's pre-forward gathers the head's unit
        moments.append(_moment(f"forward.layer.{last}", "the final norm and the head gathered",
                               base + fwd_shared + [(f"activations kept (layers 0..{last})", kept),
                                                    ("layer output (residual stream)", resid),
                                                    ("autocast cast cache", cache)]
                               + FsdpOverlay.after_layers(fs, "gather", L)))  # fmt: skip
    after_norm += [head[0], ("last hidden state (model output)", r * t * h // sp)]
    moments.append(_moment(f"forward.layer.{last}", "the final norm, its variance not yet freed",
                           after_norm + FsdpOverlay.after_layers(fs, "norm", L) + ([] if kept_mask else mask)
                           + [("norm variance (fp32)", 4 * t // sp if family in LLAMA_STYLE else 0)]
                           + ([("last layer output (until the norm returns)", resid),
                               ("normalized (fp32, until the norm returns)", 4 * t * h // sp)] if upcast else [])))
    if sp > 1 and not amp:  # the head's ColwiseParallel(input_layouts=Shard(1)) all-gathers its input, saved whole
        after_norm.append(("head input (all-gathered)", d * t * h))
    logits = [("logits", 0 if loss == "fused" else d * n)]
    if fs is not None and fs.wrap == "separate-reshard":  # the head's pre-forward gathers its unit
        moments.append(_moment("forward.head", "the head gathered", after_norm + ([] if kept_mask else mask)
                               + FsdpOverlay.after_layers(fs, "gather", L)))
    # under autocast the head's all-gathered input is fp32, referenced until the head returns (its bf16 cast saved)
    gathered_fp32 = [("head input (all-gathered, fp32, until the head returns)", r * t * h)] if sp > 1 and amp else []
    moments.append(_moment("forward.head", "the head's logits",
                           after_norm + FsdpOverlay.after_layers(fs, "head", L) + head[1:] + gathered_fp32 + logits))
    labels = [("labels padded (int64)", 8 * b * (s + 1)), ("shift labels (int64)", 8 * t)]
    # inductor's fused cross-entropy saves the logits instead of the fp32 log-softmax
    compiled_loss = (compiled if loss_compiled is None else loss_compiled) and loss != "fused"
    lp = loss_transient(t, v, act, loss, compiled=compiled_loss, parallel=sp > 1)
    copy_name, saved_name, grad_name = loss_rows(lp, compiled_loss)
    # Gemma 2's final logit softcap (``logits / cap``, ``tanh``, ``* cap``, Gemma2ForCausalLM.forward): tanh's output
    # (d·T·V) is saved until the backward reaches it; the capped logits are the loss's input
    softcap = [("logit softcap tanh output", d * n if arch.logit_softcap and loss != "fused" else 0)]
    fwd_loss = after_norm + FsdpOverlay.after_layers(fs, "loss", L) + head[1:] + logits + labels + softcap
    fwd_loss += [(copy_name, _chunk(lp, 1)), (saved_name, _chunk(lp, 2))]
    if len(lp.names) > 4:  # eager loss_parallel: its moment is inside ``_log_softmax`` (the loss not made yet)
        fwd_loss += inside_log_softmax(lp, t)
    else:
        fwd_loss += [("loss, total weight", 8)]
    moments.append(_moment("loss", "log-softmax done, logits and their fp32 copy alive" if not compiled_loss else
                           "the compiled loss's forward kernels done, the logits alive", fwd_loss))

    # ---- start of backward: the loss's fp32 gradients ----------------------------------------------------------
    saved_end = base + bwd_shared + [("layer activations", layers_kept)] + head
    saved_end += [] if amp or lora is not None else [("head input (the last hidden state)", d * t * h)]
    # eager loss_parallel: its fp32 gradient and, inside DTensor, zeros_like, exp(x) and their sum (saved.parallel_loss)
    grad_bytes = _chunk(lp, 3)
    saved_end += [(saved_name, _chunk(lp, 2)), ("loss and its gradient", 8)] + softcap
    saved_end += [("logits (saved by the compiled loss)", d * n)] if compiled_loss and sp == 1 else []
    saved_end += FsdpOverlay.after_layers(fs, "loss-backward", L)
    loss_moment = len(moments)
    moments.append(_moment("backward", "log_softmax backward: its output gradient and its input gradient",
                           saved_end + [(grad_name, grad_bytes)]))  # fmt: skip
    loss_live, loss_cache = loss_blocks_at_peak(t, v, d, loss, compiled_loss, sp > 1)
    # where the logits (the loss's first and smallest request) are larger than the forward's largest tensor, no block
    # the forward freed can serve the loss (memcalc.memory.reserved, "the forward's blocks")
    loss_blocks = loss_live if d * n > largest_tensor(x, d, r, sp, attention) else 0
    if fs is not None and fs.wrap != "root" and sp == 1 and loss != "fused":
        # the head's backward, its unit gathered: the logits' gradient, the head weight's unsharded gradient and the
        # gradient of its input (both in the matmul's dtype; under autocast their fp32 casts come once the bf16 casts
        # the head saved are freed), beside what the final norm and the head saved. LoRA's frozen head saved no
        # input and makes its input's gradient only; the root, with no parameters, prefetched nothing before it
        frozen = lora is not None
        moments.append(_moment("backward", "the head's backward" + (" (frozen: its input's gradient only)" if frozen
                                                                    else ""), base + bwd_shared + [
            ("loss and its gradient", 8), ("layer activations", layers_kept)] + head
            + ([] if amp or frozen else [("head input (the last hidden state)", d * t * h)])
            + [("logits gradient", d * n), ("head weight gradient (unsharded)", 0 if frozen else d * v * h),
               ("head input gradient", d * t * h)] + FsdpOverlay.head_backward(fs, L)))

    # ---- backward layer by layer -------------------------------------------------------------------------------
    late = embedding_elements
    if arch.tied_embeddings:  # the head's gradient is the embedding's, made by the head's backward
        late -= arch.padded_vocab * h
    late += emb_grad_extra // w if fs is None else 0  # FSDP2 reduce-scatters the root's gradients at the end
    if lora is not None:  # only the adapters have gradients, made layer by layer (per_layer: the adapters')
        late = 0
    before_layers = full_st.grads - per_layer * arch.layers - late * w
    held_grads = 0 if optimizer_impl == "in-backward" else before_layers
    if family in LLAMA_STYLE and code == "hf":
        # the final RMSNorm's backward (``memcalc.memory.timeline_tp.rmsnorm_backward``): the loss's and the head's
        # tensors are gone, the head's (and the norm's) gradients made; its normalized tensor freed. LoRA: the frozen
        # norm and head make no gradients and the norm never kept its normalized tensor (the head list has it out
        # already), the same fp32 transient (traced: tests/test_fsdp_layouts.py)
        root = 0 if lora is not None else held_grads if fs is None else held_grads // w * fs.gathered_width
        normalized = 0 if lora is not None else (2 if act == "bf16" else 4) * t * h // sp
        moments.append(_moment("backward", "the final RMSNorm's backward" + (" (frozen weight)" if lora else ""),
                               base + bwd_shared + [("loss and its gradient", 8), ("layer activations", layers_kept),
                                                    ("final norm saved, less its normalized tensor",
                                                     head[0][1] - normalized),
                                                    ("RMSNorm backward (fp32)", rmsnorm_backward(t // sp, h))]
                               + FsdpOverlay.norm_backward(fs, root, L)))  # fmt: skip
    remaining = kept
    norm2 = (norm_backward(arch, family=family, regime=act, attention=attention, s=s, b=b, device=device,
                           rotary_dims=rotary_dims, grad_width=fs.gathered_width if fs is not None else w, sp=sp)
             if family in LLAMA_STYLE and code == "hf" and lora is None else None)  # fmt: skip
    for i in reversed(range(arch.layers)):
        ly = layers[i]
        if i not in shown:
            remaining -= ly.kept + ly.kept_casts
            held_grads += 0 if optimizer_impl == "in-backward" else per_layer
            continue
        # Llama-style, fp32 or autocast: the recomputed norm-1 input (fp32) is the checkpointed layer input itself
        # (``to(float32)`` of an fp32 tensor is a no-op): counted once, in the checkpoint (tests/test_timeline_tp.py)
        # LayerNorm families (GPT-2, OPT, GPT-NeoX, BLOOM, Falcon): the first norm saves its input as it is, in every
        # regime, so the recomputed input is the checkpoint too
        twice = (ly.residual if checkpointed(policy, i) and code == "hf" and lora is None
                 and ((norm2 is not None and act != "bf16") or family in LAYER_NORM_FAMILIES) else 0)
        entry = base + bwd_shared + [("loss and its gradient", 8), (f"layer activations (layers 0..{i})", remaining),
                                       ("gradient of the residual stream", resid)]  # fmt: skip
        if fs is not None and not fs.whole:
            moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: parameters gathered",
                                   entry + FsdpOverlay.backward(fs, i, held_grads, before_layers, gather=True)))
        parts = base + bwd_shared + [("loss and its gradient", 8),
                                       ("layer activations (layers 0..%d)" % i, remaining),
                                       ("gradient of the residual stream", resid),
                                       ] + FsdpOverlay.backward(fs, i, held_grads, before_layers) + [
                                       ("recomputed activations of this layer", ly.recomputed - twice),
                                       ("recomputed weight casts", ly.casts - ly.kept_casts),
                                       ("layer backward transient (MLP gradients)", ly.backward_extra)]  # fmt: skip
        if ly.recompute_attention:
            moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: the recomputed eager attention",
                                   parts[:-3] + [("recomputed forward at eager attention's softmax",
                                                  ly.recompute_attention)]))
        if optimizer_impl == "in-backward":
            parts.append(("one gradient and its step temporaries", st.largest_grad + st.step_temporary))
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
        remaining -= ly.kept + ly.kept_casts
        if fs is not None and optimizer_impl != "in-backward" and not fs.whole:
            moments.append(_moment(f"backward.layer.{i}", f"backward of layer {i}: reduce-scatter copy-in",
                                   base + bwd_shared + [("loss and its gradient", 8),
                                                        (f"layer activations (layers 0..{i - 1})", remaining),
                                                        ("gradient of the residual stream", resid)]
                                   + FsdpOverlay.copy_in(fs, i, held_grads, before_layers)
                                   # FSDP1's hook fires on the FlatParameter's last gradient, the input norm's weight,
                                   # inside that norm's backward: its input-side gradient is alive too
                                   + [("input norm's backward, in flight (FSDP1)", resid if fs.flat else 0)]))
        held_grads += 0 if optimizer_impl == "in-backward" else per_layer
    if arch.tied_embeddings and lora is None and optimizer_impl != "in-backward" and (
            fs is None or (fs.wrap == "root" and not fs.keep and not fs.held_reduce)):
        # the embedding's backward makes its weight's gradient while the head's is held: the autograd engine adds
        # them out of place (InputBuffer::accumulate), three vocabulary-sized tensors at once, the residual stream's
        # gradient freed by then (traced)
        gw = w if fs is None else fs.gathered_width
        moments.append(_moment("backward.layer.0", "the embedding's backward, its gradient added to the head's",
                               base + [("loss and its gradient", 8)]
                               + FsdpOverlay.tied_embedding_backward(fs, held_grads, before_layers, arch.layers)
                               + [("embedding gradient and its sum with the head's (tied)",
                                   2 * gw * arch.padded_vocab * h)]))
    if (sp > 1 and fs is not None and fs.wrap in ("root", "separate") and not fs.flat and not fs.whole
            and lora is None and optimizer_impl != "in-backward"):
        # Sequence parallelism under FSDP2: the embedding's backward all-gathers its output gradient over the sequence
        # and makes the whole vocabulary's gradient (a Replicate DTensor), which the post-backward of its unit
        # redistributes to the parameter's Shard(0), a copy of this rank's rows (``FSDPParam._get_grad_inner_tensor``),
        # before the whole one is freed; layer 0's reduce-scatter is done, the rotary tables and the residual stream's
        # gradient gone (traced at Llama 3 8B's widths, 4 layers, tp 8: tests/test_timeline_tp.py; torchtune's
        # separate-reshard wrap, which it runs without sequence parallelism, keeps the embedding's unit as before)
        whole, mine, gathered = r * vocab_rows * h, r * arch.padded_vocab * h, r * t * h
        if fs.wrap == "root":
            gone = ("this layer's unsharded gradients", "gradient of the residual stream", "rotary cos, sin")
            copy_in = next(m for m in reversed(moments) if m.label == "backward of layer 0: reduce-scatter copy-in")
            held = [p for p in copy_in.parts if p[0] not in gone]
            held.append(("gradient shard of layer 0", fs.layer_grad_shard))
        else:
            held = base + [("loss and its gradient", 8)] + [
                p for p in FsdpOverlay.embedding_backward(fs, arch.layers) if p[0] != "embedding gradients (unsharded)"]
            held = [p for p in held if p[0] != "rotary cos, sin"]
        moments.append(_moment("backward.layer.0", "the embedding's backward: the whole vocabulary's gradient",
                               held + [(EMB_WHOLE, whole), (EMB_MINE, max(gathered, mine))]))
    if fs is not None and fs.flat and not fs.frozen_layers:
        moments.append(_moment("backward.layer.0", "the root's reduce-scatter copy-in (FSDP1)",
                               base + [("loss and its gradient", 8)] + FsdpOverlay.root_copy_in(fs, arch.layers)))
    if fs is not None and fs.wrap != "root":
        moments.append(_moment("backward.layer.0", "the embedding's backward",
                               base + [("loss and its gradient", 8), ("gradient of the residual stream", resid)]
                               + FsdpOverlay.embedding_backward(fs, 0 if fs.whole else arch.layers)))
    if fs is not None and fs.whole and not fs.flat:  # FSDP2's root post-backward (the final callback)
        moments.append(_moment("backward.layer.0", "the root's reduce-scatter copy-in",
                               base + [("loss and its gradient", 8)] + FsdpOverlay.whole_copy_in(
                                   fs, held_grads + (late * w if fs.wrap == "root" else 0), before_layers)))
    if fs is not None and fs.whole and not fs.flat and fs.wrap == "root":  # then the tied [norm, embedding, head]
        moments.append(_moment("backward.layer.0", "the [norm, embedding, head] unit's reduce-scatter copy-in",
                               base + [("loss and its gradient", 8)] + FsdpOverlay.tail_copy_in(
                                   fs, before_layers + late * w)))
    if fs is not None and fs.wrap != "root":
        moments.append(_moment("backward.layer.0", "the embedding's reduce-scatter copy-in",
                               base + [("loss and its gradient", 8)] + FsdpOverlay.embedding_copy_in(fs, arch.layers)))

    # ---- optimizer and zero_grad -------------------------------------------------------------------------------
    grads = 0 if optimizer_impl == "in-backward" else st.grads
    with_grads = base + [("gradients (shards)" if fs else "gradients", grads)]
    moments.append(_moment("optimizer", "optimizer.step()", with_grads + [("step temporaries", st.step_temporary)]))
    moments.append(_moment("zero_grad", "after the step, before zero_grad", with_grads))
    return Timeline(tuple(moments), loss_moment, loss_cache, loss_blocks)


def _cached(arch: Architecture, x, i: int, ly, *, family: str, amp: bool, d: int, code: str, lora, use_cache: bool,
            policy, attention: str, promotes: bool) -> int:
    """What layer ``i``'s forward adds to the bytes cached until the forward returns (``x``: its shape, ``ly``: its
    ``LayerSizes``, ``d``: the compute dtype's bytes): autocast's bf16 casts of recomputed layers' weights and of the
    biases, DynamicCache's K, V where nothing saves them, a sliding layer's window tensor; ``promotes``: the cache
    promotes V to fp32 (``timeline``'s ``cache_promotes_values``)."""
    t, h, s = x.t, x.h, x.s
    # (FalconLinear multiplies by ``self.weight.T``, a view: autocast casts it on every call and caches nothing)
    out = ly.casts - ly.kept_casts if family != "falcon" else 0
    if amp and arch.qkv_bias and family in (*LLAMA_STYLE, *OTHER_NORMS) and code == "hf" and lora is None:
        # bf16 casts of the q, k, v biases (Qwen2): cached by autocast (trainable leaves), saved by no op (addmm's
        # bias gradient is a sum of the output gradient), alive until the autocast block exits
        out += 2 * (x.qw + 2 * x.kvw)
    if amp and family in ("bloom", "gpt_neox", "opt") and lora is None:
        # the linears' biases (all of BLOOM's and OPT's; NeoX's attention ones as attention_bias says): autocast
        # caches the bf16 cast of each, alive until the autocast block exits
        attn_bias = x.qw + 2 * x.kvw + h if arch.qkv_bias else 0
        out += 2 * (attn_bias + (h + x.ffn if arch.mlp_bias else 0))
    if amp and use_cache and policy.kind == "none" and family in (*LLAMA_STYLE, *GEMMAS) and i not in arch.nope_layers:
        # (a layer without rotary, SmolLM3's, caches the bf16 K, V that SDPA saves anyway: nothing beyond them)
        # V beyond what SDPA saves only where repeat_kv's copies are saved instead (GQA under eager, Gemma 3's
        # masked sliding SDPA), or where the cache promoted it to fp32
        copied = (attention == "eager" and x.kv < x.heads) or sliding_sdpa_masked(arch, attention, s, i)
        value = 4 if promotes else 2 if copied else 0
        out += (4 + value) * t * x.kvw
    elif (attention == "eager" and x.kv < x.heads and use_cache and policy.kind == "none"
          and (lora is not None or (family in (*LLAMA_STYLE, *OTHER_NORMS) and code == "hf"))):  # fmt: skip
        # DynamicCache keeps this layer's K, V (kv width) until the forward returns; eager attention saves their
        # repeat_kv copies instead (traced with peft: memcalc.validation.lora.trace_lora_step; without:
        # tests/test_timeline_tp.py)
        out += 2 * d * t * x.kvw
    if use_cache and policy.kind == "none" and i in arch.sliding_layers and family in OTHER_NORMS:
        # DynamicSlidingWindowLayer (transformers cache_utils.py): an int64 ``_sliding_window_tensor`` per sliding
        # layer, alive with the cache until the causal LM's forward returns
        out += 8
    return out


def with_loss(tl: Timeline, moments) -> Timeline:
    """A timeline of ``moments`` made from ``tl``'s, with ``tl``'s loss peak marked on the moment of the same phase
    and label (the ZeRO timelines, FSDP's offload)."""
    if tl.loss_moment < 0:
        return Timeline(tuple(moments))
    key = tl.moments[tl.loss_moment].phase, tl.moments[tl.loss_moment].label
    i = next((i for i, m in enumerate(moments) if (m.phase, m.label) == key), -1)
    return Timeline(tuple(moments), i, tl.loss_cache if i >= 0 else 0, tl.loss_blocks if i >= 0 else 0,
                    tl.fresh_detail)


def _mask_kinds(arch: Architecture) -> int:
    """Eager 4-D masks the model builds: Gemma 2 and 3 one causal and one sliding-window mask when both kinds of layer
    are present (``create_causal_mask``, ``create_sliding_window_causal_mask``), the others one."""
    return 2 if arch.sliding_layers and len(arch.sliding_layers) < arch.layers else 1


__all__ = ["FAMILIES", "MLP_FRAME", "O_PROJ_FRAME", "REGIMES", "Moment", "Timeline", "inside_log_softmax",
           "largest_tensor", "timeline", "with_loss"]
