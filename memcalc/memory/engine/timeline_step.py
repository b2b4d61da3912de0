"""A training step's moments (``Moment``, ``Timeline``) and what its phases read (``Step``, built once by ``step``).

``memcalc.memory.engine.timeline`` composes the step from phases (``memcalc.memory.engine.timeline_forward``,
``memcalc.memory.engine.timeline_backward``), each a function of the ``Step`` that appends its moments; this module holds
the moments' types and turns the options of ``timeline`` into that ``Step``: validated, the widths derived, the model
states and the FSDP overlay chosen, the decoder layers' sizes and the family's forward prologue
(``memcalc.memory.families.prologue``) made.
"""

from __future__ import annotations

import dataclasses
from operator import itemgetter

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.memory.families.prologue import prologue
from memcalc.memory.overlays.fsdp_overlay import FsdpOverlay
from memcalc.memory.families.saved import LLAMA_STYLE, _check, check_code, loss_transient, shape
from memcalc.memory.engine.stack import affine, layer_stack, tensor_groups
from memcalc.memory.engine.timeline_layers import Policy, checkpointed, parse_recompute
from memcalc.memory.engine.timeline_states import lora_states, states
from memcalc.memory.overlays.timeline_tp import rank_arch, sp_rank_arch, step_temporary
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
    """Bytes the loss leaves cached and free at that moment (``memcalc.memory.allocator.reserved.loss_cached``)."""
    loss_blocks: int = 0
    """The loss's own blocks alive at that moment (``memcalc.memory.allocator.reserved.loss_events``) where each is larger than
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


_bytes = itemgetter(1)


def _moment(phase: str, label: str, parts: list[tuple[str, int]]) -> Moment:
    """The moment of ``parts`` (name, bytes), those of no bytes left out."""
    kept = tuple(filter(_bytes, parts))  # (C loops: a step makes a few dozen moments of a dozen parts each)
    return Moment(phase, label, sum(map(_bytes, kept)), kept)


EMB_WHOLE = "embedding gradient, the whole vocabulary (Replicate, sequence parallel)"
EMB_MINE = "its copy of this rank's rows (Shard(0)), or the all-gathered output gradient before it"


def with_loss(tl: Timeline, moments) -> Timeline:
    """A timeline of ``moments`` made from ``tl``'s, with ``tl``'s loss peak marked on the moment of the same phase
    and label (the ZeRO timelines, FSDP's offload)."""
    if tl.loss_moment < 0:
        return Timeline(tuple(moments))
    key = tl.moments[tl.loss_moment].phase, tl.moments[tl.loss_moment].label
    i = next((i for i, m in enumerate(moments) if (m.phase, m.label) == key), -1)
    return Timeline(tuple(moments), i, tl.loss_cache if i >= 0 else 0, tl.loss_blocks if i >= 0 else 0,
                    tl.fresh_detail)


@frozen
class Step:
    """One step's options, validated, and what follows from them: what every phase of ``timeline`` reads (its lists
    are shared by the phases, which never change them)."""

    arch: Architecture
    """The model as this rank holds it (under tensor parallelism per rank: ``memcalc.memory.overlays.timeline_tp``)."""
    x: object
    """Its shapes at this step's sequence and batch (``memcalc.memory.families.saved.shape``)."""
    family: str
    act: str
    """The activations' regime: ``regime``, or bf16 under FSDP2's bf16 ``param_dtype``."""
    attention: str
    s: int
    b: int
    policy: Policy
    optimizer_impl: str
    loss: str
    loss_compiled: bool | None
    device: str
    code: str
    tp: int
    sp: int
    """The sequence-parallel degree: ``tp`` under sequence parallelism, else 1."""
    compiled: bool
    float8: str
    rotary_dims: int | None
    use_cache: bool
    cache_promotes_values: bool
    lora: object
    fs: FsdpOverlay | None
    """The FSDP overlay (``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay``), None without FSDP."""
    st: object
    """The model states this rank holds (FSDP's shards)."""
    t: int
    h: int
    v: int
    n: int
    """Tokens × vocabulary: the logits' elements."""
    w: int
    """Bytes of a weight (and of its gradient)."""
    d: int
    """Bytes of the compute dtype."""
    r: int
    """Bytes of the residual stream."""
    amp: bool
    vocab_rows: int
    """The embedding's rows before tensor parallelism split them."""
    model_states: list
    """The baseline's parts: parameters, optimizer states, buffers (and cuBLAS's workspaces on CUDA)."""
    base: list
    """The model states and the batch: alive through the step."""
    mask: list
    """The attention masks (and ALiBi's biases) the model builds, alive until its forward returns."""
    kept_mask: list
    """``mask`` where a checkpointed first layer keeps it as an argument until its backward, else empty."""
    fwd_shared: list
    """The forward prologue (``memcalc.memory.families.prologue.prologue``), the masks and ALiBi's slopes."""
    bwd_shared: list
    """What of them the backward still holds: the prologue and the kept masks."""
    layers: tuple
    """Every decoder layer's ``LayerSizes`` (``memcalc.memory.engine.stack.layer_stack``)."""
    shown: object
    """The layers whose moments are made: every one, or the ends of the runs of alike layers."""
    per_layer: int
    """Bytes of one layer's gradients (LoRA: its adapters')."""
    late: int
    """Elements of the gradients made after the decoder layers' (the embedding's; FSDP2 reduce-scatters the root's
    at the end)."""
    before_layers: int
    """Bytes of the gradients made before the decoder layers' backward (the head's, the final norm's)."""


def _validated(arch: Architecture, *, family: str, regime: str, attention: str, s: int, b: int, recompute: str,
               loss: str, device: str, code: str, tp: int, lora, fsdp_param_dtype: str | None,
               sequence_parallel: bool, compiled: bool) -> tuple[Policy, Architecture]:
    """The recompute policy and the rank's model; one InputError line for options the step does not model."""
    _check(family, regime, attention)
    check_code(code, family, "bf16" if fsdp_param_dtype == "bf16" else regime, attention)
    if device not in ("cpu", "cuda"):
        raise InputError(f"device {device!r} is not one of cpu, cuda")
    if s < 1 or b < 1:
        raise InputError(f"seq_len {s} and micro_batch {b} must be at least 1")
    policy = parse_recompute(recompute)
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
    loss_transient(1, 1, regime, loss)  # validates the loss option
    return policy, arch


def _states(arch: Architecture, vocab_rows: int, *, family: str, regime: str, w: int, h: int, sp: int, tp: int,
            world: int, fsdp: bool | None, fsdp_param_dtype: str | None, optimizer_impl: str,
            optimizer_states: str, lora, float8: str, float8_all_gather: bool,
            fsdp_options: dict):  # fmt: skip
    """(st, full_st, fs, lora, emb_grad_extra): the model states, the FSDP overlay and what it changes."""
    st = full_st = (states(arch, family, w, optimizer_impl, optimizer_states) if lora is None
                    else lora_states(arch, family, w, optimizer_impl, optimizer_states, lora))
    sharded = (world > 1 or fsdp_param_dtype is not None) if fsdp is None else fsdp
    if float8 not in ("none", "tensorwise", "rowwise"):
        raise InputError(f"float8 {float8!r} is not one of none, tensorwise, rowwise")
    if float8_all_gather and not sharded:
        raise InputError("float8_all_gather is FSDP2's (torchao enable_fsdp_float8_all_gather): give world above 1 "
                         "or fsdp=True")
    fs = (FsdpOverlay.make(arch, family, regime, world, fsdp_param_dtype, optimizer_impl, optimizer_states,
                           fp8_gather=float8_all_gather, lora=lora, **fsdp_options)
          if sharded else None)  # fmt: skip
    if fs is not None:
        st = fs.states
        if fs.frozen_layers and fs.gathered_width != fs.width:  # FSDP1's bf16 MixedPrecision: peft re-casts
            lora = dataclasses.replace(lora, inputs_recast=True)
    elif tp > 1 and sp == 1 and (temp := step_temporary(arch, w, optimizer_impl)) is not None:
        st = full_st = dataclasses.replace(st, step_temporary=temp)
    # Sequence parallelism: the embedding's RowwiseParallel backward (``embedding_dense_backward`` under DTensor's
    # sharding propagation, torch ``distributed/tensor/_ops/_embedding_ops.py``) leaves a Replicate gradient, the
    # whole vocabulary on every rank (traced: tests/test_timeline_tp.py), made at the end of the backward
    emb_grad_extra = w * (vocab_rows - arch.padded_vocab) * h if sp > 1 else 0
    if emb_grad_extra and fs is None:
        st = full_st = dataclasses.replace(st, grads=st.grads + emb_grad_extra)
    return st, full_st, fs, lora, emb_grad_extra


def step(arch: Architecture, *, family: str, regime: str, attention: str, s: int, b: int, recompute: str,
         optimizer_impl: str, optimizer_states: str, loss: str, device: str, position_ids: bool, use_cache: bool,
         rotary_dims: int | None, world: int, fsdp: bool | None, fsdp_param_dtype: str | None, lora, code: str,
         tp: int, compiled: bool, loss_compiled: bool | None, sequence_parallel: bool, float8: str,
         float8_all_gather: bool, fsdp_options: dict, cache_promotes_values: bool, hooked_grads: bool,
         every_layer: bool) -> Step:  # fmt: skip
    """The ``Step`` of ``memcalc.memory.engine.timeline.timeline``'s options (its docstring says what each means)."""
    vocab_rows = arch.padded_vocab
    policy, arch = _validated(arch, family=family, regime=regime, attention=attention, s=s, b=b, recompute=recompute,
                              loss=loss, device=device, code=code, tp=tp, lora=lora, fsdp_param_dtype=fsdp_param_dtype,
                              sequence_parallel=sequence_parallel, compiled=compiled)  # fmt: skip
    sp = tp if sequence_parallel else 1
    x = shape(arch, s, b, rotary_dims)
    t, h, v, n = x.t, x.h, x.vocab, x.t * x.vocab
    w = 2 if regime == "bf16" else 4
    # FSDP2's MixedPrecisionPolicy(param_dtype=bf16) gathers bf16 weights (under autocast nothing is cast) and the
    # embedding's bf16 output makes every activation what pure bf16 saves (the sharded states stay fp32)
    act = "bf16" if fsdp_param_dtype == "bf16" else regime
    d, r, amp = {"fp32": (4, 4, False), "bf16": (2, 2, False), "amp-bf16": (2, 4, True)}[act]
    st, full_st, fs, lora, emb_grad_extra = _states(
        arch, vocab_rows, family=family, regime=regime, w=w, h=h, sp=sp, tp=tp, world=world, fsdp=fsdp,
        fsdp_param_dtype=fsdp_param_dtype, optimizer_impl=optimizer_impl, optimizer_states=optimizer_states, lora=lora,
        float8=float8, float8_all_gather=float8_all_gather, fsdp_options=fsdp_options)  # fmt: skip
    model_states = [("parameters", st.params), ("optimizer states", st.optimizer), ("buffers", st.buffers)]
    if lora is not None:  # the frozen base and the adapters, apart (adapter parameters are as large as their grads)
        frozen_base = "frozen base, nf4" if lora.quantize == "nf4" else "frozen base"
        model_states[:1] = [(f"parameters ({frozen_base})", st.params - st.grads),
                            ("parameters (LoRA adapters)", st.grads)]
    if device == "cuda":
        model_states.append(("cuBLAS workspaces (forward, backward threads)", 2 * CUBLAS_WORKSPACE))
    base = model_states + [("input ids (int64)", 8 * t), ("position ids (int64)", 8 * s)]
    shared, mask, slopes = prologue(arch, x, family=family, attention=attention, code=code, device=device, lora=lora,
                                    position_ids=position_ids, r=r, amp=amp, sp=sp)
    kept_mask = mask if checkpointed(policy, 0) else []
    layers, ends = layer_stack(arch, family, act, attention, s, b, policy, device, rotary_dims, lora, code, compiled,
                               sp, float8, not float8_all_gather, use_cache, hooked_grads)
    layer_elements, embedding_elements = tensor_groups(arch)
    per_layer = layer_elements * w
    if lora is not None:  # only the adapters have gradients, made layer by layer
        per_layer = full_st.grads // arch.layers
    late = embedding_elements
    if arch.tied_embeddings:  # the head's gradient is the embedding's, made by the head's backward
        late -= arch.padded_vocab * h
    late += emb_grad_extra // w if fs is None else 0  # FSDP2 reduce-scatters the root's gradients at the end
    if lora is not None:  # only the adapters have gradients, made layer by layer (per_layer: the adapters')
        late = 0
    # the layers whose moments are made: every one, or the ends of the runs of alike layers (memcalc.memory.engine.stack)
    shown = ends if not every_layer and affine(per_layer, fs) else range(arch.layers)
    before_layers = full_st.grads - per_layer * arch.layers - late * w
    # (Step's fields in order, every one given: the positional construction is the cheap one)
    return Step(arch, x, family, act, attention, s, b, policy, optimizer_impl, loss, loss_compiled, device, code, tp,
                sp, compiled, float8, rotary_dims, use_cache, cache_promotes_values, lora, fs, st, t, h, v, n, w, d, r,
                amp, vocab_rows, model_states, base, mask, kept_mask, shared + mask + slopes, shared + kept_mask,
                layers, shown, per_layer, late, before_layers)
