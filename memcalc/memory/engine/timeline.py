"""The live bytes of one optimizer step on one GPU, moment by moment: a plain function of numbers.

The step is the one Hugging Face ``Trainer`` (and ``memcalc.validation.trace``) runs: ``zero_grad(set_to_none=True)``
left no gradients; forward layer by layer with the model's own loss (transformers ``loss/loss_utils.py``
``ForCausalLMLoss``: ``logits.float()``, labels padded by one and shifted, ``cross_entropy``), backward, the
optimizer step, ``zero_grad``. What each layer saves is ``memcalc.memory.families.saved`` (exact against a census of the
modules); this module orders those sizes in time and adds what lives only for a moment (the model's output while
the loss runs, autocast's cast cache, the loss's gradients, recomputed layers, the optimizer's temporaries).
Phase names are the tracer's (``memcalc.validation.trace_step.mark_phases``) so that the two compare directly.
Allocator rounding, reserved memory, the CUDA context and NCCL buffers are ``memcalc.memory.allocator.allocator``'s.

``timeline`` reads as the step runs: its options become one ``Step`` (``memcalc.memory.engine.timeline_step``: validated,
the widths, the model states, the FSDP overlay, the layers' sizes, the family's prologue from
``memcalc.memory.families.prologue``), then each phase, a function of that ``Step``, appends its moments: the baseline and
the batch, the decoder layers, the final norm and the head, the loss (``memcalc.memory.engine.timeline_forward``); the
loss's gradients, the head's unit, the decoder layers backward, the embedding's and FSDP root's end of the backward,
the optimizer (``memcalc.memory.engine.timeline_backward``).
"""

from __future__ import annotations

from memcalc.memory.families.saved import FAMILIES, REGIMES
from memcalc.memory.engine.timeline_backward import backward_layers, head_backward, loss_backward, optimizer, tail
from memcalc.memory.engine.timeline_forward import forward_layers, head_forward, loss_forward, start
from memcalc.memory.engine.timeline_loss import inside_log_softmax, largest_tensor
from memcalc.memory.engine.timeline_step import (CUBLAS_WORKSPACE, EMB_MINE, EMB_WHOLE, LOSS_HELP, MLP_FRAME,  # noqa: F401
                                                 O_PROJ_FRAME, Moment, Timeline, _moment, step, with_loss)
from memcalc.model.architecture import Architecture


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
    over ``world`` data-parallel ranks (``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay``); fsdp_param_dtype: None or "bf16"
    (``MixedPrecisionPolicy(param_dtype=)``); fsdp_wrap: the embedding and the head in the root or in units of
    their own (``memcalc.layout.compose.FSDP_WRAPS``); fsdp_keep: no reshard after forward (SHARD_GRAD_OP);
    fsdp_hsdp: the shards replicated over groups of ``world`` ranks (HSDP); fsdp_reduce_fp32: gradients reduced in fp32
    under the bf16 policy; fsdp_flat: FSDP1's FlatParameter units, fsdp_prefetch its BACKWARD_PRE; fsdp_whole: no
    unit per decoder layer, accelerate's NO_WRAP (``FsdpOverlay.make``). lora: a ``memcalc.model.lora.LoraPlan`` (peft adapters on a frozen
    base, one GPU or DDP): adapter states only, the layers' LoRA saved tensors, a frozen head and final norm that
    keep no input; the layer backward transients stay the full model's (an upper bound).
    code: whose model code runs the layers, ``hf`` or ``torchtitan`` (its Llama 3: ``memcalc.memory.families.saved``'s
    ``_torchtitan_layer``; the rotary table is gathered per layer, the final norm is its ``nn.RMSNorm``; the loss
    stays Hugging Face's, whose logits outlive the forward where torchtitan deletes them: a bound of d·T·V).
    tp: DTensor tensor parallelism as rank 0 of ``tp`` ranks (``memcalc.memory.overlays.timeline_tp``: the layers' shapes
    per rank, the row-parallel all-reduce, no sequence parallelism, no loss_parallel); with ``world`` above 1 the
    FSDP2 ranks are the data-parallel ones (world = data-parallel degree, the mesh's "dp" dimension).
    compiled: torch.compile per layer (``memcalc.memory.families.compiled``); loss_compiled: the loss compiled too
    (``memcalc.memory.families.saved.loss_transient``; None: as ``compiled``).
    sequence_parallel: with tp, torchtitan's sequence-parallel plan with ``loss_parallel`` (``memcalc.memory.
    timeline_tp``: norms, residual stream and embedding output ÷ tp along the sequence, the projections' gathered
    inputs whole, the row-parallel outputs reduce-scattered, embedding, head and logits ÷ tp over the vocabulary).
    float8: torchao's float8 projections (``tensorwise``, ``rowwise``): eager layers add their backward casts
    (``memcalc.memory.engine.timeline_layers.layer_sizes``); float8_all_gather: under FSDP2, torchao's fp8 all-gather of the
    layers' projection weights (``FsdpOverlay.make``'s ``fp8_gather``).
    every_layer: False makes the moments of the layers that end a run of alike ones only (``memcalc.memory.engine.stack``):
    the same peak moment, phase peaks (layers folded) and reserved peak, from a few layers' moments.
    """
    c = step(arch, family=family, regime=regime, attention=attention, s=s, b=b, recompute=recompute,
             optimizer_impl=optimizer_impl, optimizer_states=optimizer_states, loss=loss, device=device,
             position_ids=position_ids, use_cache=use_cache, rotary_dims=rotary_dims, world=world, fsdp=fsdp,
             fsdp_param_dtype=fsdp_param_dtype, lora=lora, code=code, tp=tp, compiled=compiled,
             loss_compiled=loss_compiled, sequence_parallel=sequence_parallel, float8=float8,
             float8_all_gather=float8_all_gather, cache_promotes_values=cache_promotes_values,
             hooked_grads=hooked_grads, every_layer=every_layer,
             fsdp_options=dict(wrap=fsdp_wrap, keep=fsdp_keep, hsdp=fsdp_hsdp, reduce_fp32=fsdp_reduce_fp32,
                               flat=fsdp_flat, prefetch=fsdp_prefetch, whole=fsdp_whole))  # fmt: skip
    moments: list[Moment] = []
    start(c, moments)  # the model states, the batch
    kept, cache = forward_layers(c, moments)  # the decoder layers
    after_norm, head, layers_kept = head_forward(c, moments, kept, cache)  # the final norm, the head
    fwd = loss_forward(c, moments, kept, after_norm, head, layers_kept)  # the loss
    loss_moment, loss_cache, loss_blocks = loss_backward(c, moments, fwd)  # the loss's gradients
    head_backward(c, moments, fwd)  # the head in a unit of its own
    held_grads = backward_layers(c, moments, fwd)  # the final norm, the decoder layers
    tail(c, moments, held_grads)  # the embedding, FSDP's root
    optimizer(c, moments)  # optimizer.step(), zero_grad
    return Timeline(tuple(moments), loss_moment, loss_cache, loss_blocks)


__all__ = ["FAMILIES", "MLP_FRAME", "O_PROJ_FRAME", "REGIMES", "Moment", "Timeline", "inside_log_softmax",
           "largest_tensor", "timeline", "with_loss"]
