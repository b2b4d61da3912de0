"""A census of what a peft LoRA model saves for backward, on this CPU (``memcalc.validation.saved``'s machinery).

Wraps the tiny Hugging Face model of ``memcalc.validation.saved.build`` in ``peft.get_peft_model`` with
``LoraConfig(r, target_modules=<the family's module names>, lora_dropout=0, bias="none")`` and
``autocast_adapter_dtype=False`` (adapters in the regime's dtype: fp32, or bf16 under pure bf16), turns on
``enable_input_require_grads()`` (what ``prepare_model_for_kbit_training`` and gradient checkpointing do) and records
every tensor autograd packs. Under autocast the frozen weights' bf16 casts have no ``grad_fn`` (the weight does not
require grad): they are told apart by their shape, that of a frozen weight, and counted as ``weight_cast``.
"""

from __future__ import annotations

import dataclasses

from memcalc.model.lora import LoraPlan, projections
from memcalc.validation import saved as sv


def add_adapters(model, hf_config: dict, lora: LoraPlan):
    """peft's adapters on ``lora.targets`` of the Hugging Face ``model`` built from ``hf_config``, injected in place
    (``LoraConfig(r, lora_alpha=2r, lora_dropout=0, bias="none")``, ``autocast_adapter_dtype=False``), the rest frozen
    and the embedding's output made to require grad (``enable_input_require_grads``); returns the ``PeftModel``."""
    from peft import LoraConfig, get_peft_model

    from memcalc.model.hf_config import architecture_from_config

    arch = architecture_from_config(hf_config)
    # the module paths' tails as peft matches them (``attn.c_proj`` is GPT-2's o alone, ``c_proj`` would be o and down)
    modules = sorted({p.module for p in projections(arch) if p.names[0] in lora.targets})
    cfg = LoraConfig(r=lora.rank, lora_alpha=2 * lora.rank, target_modules=modules, lora_dropout=0.0, bias="none")
    peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=False)
    model.enable_input_require_grads()
    return peft_model


def build(family: str, regime: sv.Regime, attention: str, lora: LoraPlan, recompute: bool = False):
    """The tiny ``family`` model with peft LoRA adapters on ``lora.targets``."""
    return add_adapters(sv.build(family, regime, attention, recompute), sv.tiny_config(family), lora)


def census(family: str, regime: sv.Regime, attention: str, s: int, b: int, lora: LoraPlan) -> sv.Census:
    model = build(family, regime, attention, lora)
    frozen = {tuple(sorted(p.shape)) for p in model.parameters() if not p.requires_grad and p.dim() == 2}
    c = sv.census(family, regime, attention, s, b, model=model)
    records = tuple(
        dataclasses.replace(r, kind="weight_cast")
        if r.kind == "activation" and r.dtype == "bfloat16" and regime == "amp-bf16" and len(r.shape) == 2
        and tuple(sorted(r.shape)) in frozen and r.part.startswith("layer.") and "lora_" not in r.module
        else r for r in c.records)
    return sv.Census(records, c.layers)


def trainable(family: str, lora: LoraPlan) -> tuple[int, int]:
    """(trainable, all) parameters as peft counts them (``get_nb_trainable_parameters``)."""
    model = build(family, "fp32", "sdpa", lora)
    return model.get_nb_trainable_parameters()


def trace_lora_step(hf_config: dict, lora: LoraPlan, *, seq_len: int, micro_batch: int = 1, precision: str = "fp32",
                    optimizer_impl: str = "foreach", attention: str = "sdpa", recompute: str = "none",
                    steps: int = 2, fake: bool = True, world: int = 1,
                    fsdp_param_dtype: str | None = None, fsdp_wrap: str = "root",
                    fsdp_version: int = 2, backward_prefetch: str = "pre"):  # fmt: skip
    """The last of ``steps`` training steps of a peft LoRA model on one device, traced by
    ``memcalc.validation.trace_step`` (fake tensors, or real ones with ``fake=False``); AdamW over the trainable
    parameters only, as ``Trainer.create_optimizer`` builds it. ``world`` above 1: FSDP2 ``fully_shard`` on each
    decoder layer and the root of the peft model, as rank 0 of ``world`` under torch's fake process group
    (``trace_parallel.apply_layout``: accelerate's FSDP2 plugin), ``fsdp_param_dtype="bf16"`` its
    ``MixedPrecisionPolicy``; ``fsdp_wrap`` separate: the embedding and [final norm, head] in units of their own
    (accelerate 1.15's ``fsdp2_prepare_model``). ``fsdp_version`` 1: FSDP1 with peft's ``fsdp_auto_wrap_policy``
    instead, as the Hugging Face Trainer wraps a peft model there (every leaf module with a trainable weight, each
    ``lora_A`` and ``lora_B``, a unit of its own; ``fsdp_param_dtype`` its ``MixedPrecision``), ``backward_prefetch``
    pre or none."""
    import contextlib

    import torch
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memcalc.errors import InputError
    from memcalc.validation.trace_parallel import apply_layout, fake_process_group
    from memcalc.validation.trace_step import StepSpec, batch, build_model, traced_steps

    spec = StepSpec(seq_len, micro_batch, precision, optimizer_impl, recompute, attention)
    spec.check()
    if world < 1 or fsdp_param_dtype not in (None, "bf16") or (fsdp_param_dtype and world == 1):
        raise InputError(f"world {world} must be at least 1, fsdp_param_dtype None or 'bf16' (with world above 1)")
    if fsdp_version not in (1, 2) or backward_prefetch not in ("pre", "none") or (
            backward_prefetch != "pre" and fsdp_version != 1) or (fsdp_version == 1 and fsdp_wrap != "root"):
        raise InputError(f"fsdp_version {fsdp_version!r} must be 1 or 2, backward_prefetch {backward_prefetch!r} pre "
                         f"or none (none with fsdp_version 1), fsdp_wrap {fsdp_wrap!r} root with fsdp_version 1")
    torch.manual_seed(0)
    with fake_process_group(world, 1) as mesh, FakeTensorMode() if fake else contextlib.nullcontext():
        model = build_model(hf_config, spec)
        peft_model = add_adapters(model, hf_config, lora)
        if world > 1:
            # FSDP1: the Trainer delays the optimizer and swaps in peft's fsdp_auto_wrap_policy
            # (update_fsdp_plugin_peft): each lora_A and lora_B a unit of its own beside the decoder layers
            policy = fsdp_auto_wrap_policy(peft_model) if fsdp_version == 1 else None
            model = apply_layout(model, mesh, dp=world, tp=1, fsdp=True, mp_bf16=fsdp_param_dtype == "bf16",
                                 fsdp_wrap=fsdp_wrap, fsdp_version=fsdp_version, backward_prefetch=backward_prefetch,
                                 fsdp1_policy=policy)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=optimizer_impl == "foreach",
                                      fused=optimizer_impl == "fused")
        ids, pos = batch(hf_config, spec)
        tracker = traced_steps(model, optimizer, ids, pos, spec, steps)
    layout = (f" fsdp{fsdp_version} world={world}{' mp=bf16' if fsdp_param_dtype else ''} wrap={fsdp_wrap}"
              if world > 1 else "")
    result = tracker.result(f"lora r={lora.rank} {','.join(lora.targets)} {precision} {attention}{layout}",
                            tracker.seconds)
    del peft_model, model, optimizer
    return result
