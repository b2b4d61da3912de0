"""A census of what a real Hugging Face causal LM saves for backward, module by module, on this CPU.

Builds ``AutoModelForCausalLM.from_config`` from a tiny config of one family, runs one forward with the
model's own loss (``labels=input_ids``, as ``Trainer`` does) and records every tensor autograd packs
(``torch.autograd.graph.saved_tensors_hooks``), with the module that saved it (forward pre/post hooks keep
a module stack). Bytes count once per storage (the same storage saved twice, or two views of one
storage, count once: what the allocator really holds); parameters count zero; bf16 casts of weights made
by autocast are counted apart (``kind="weight_cast"``): they scale with parameters, not tokens.

Parts: ``layer.i`` (saved first by decoder layer i and by no other layer), ``shared`` (saved first by a
layer and by other layers too: rotary tables, the eager attention mask), and outside the layers the
dotted path of the module that saved it
(``model.embed_tokens``, ``model.norm``, ``lm_head``, ...); ``loss`` is what the causal-LM module saves
itself after the head (Hugging Face ``ForCausalLMLoss``: ``logits.float()`` then ``cross_entropy``).

Under full recompute (``gradient_checkpointing_enable(use_reentrant=False)``) torch's checkpoint
installs its own saved-tensor hooks inside each layer and keeps only the layer's arguments (it closes over
them to replay the forward, torch/utils/checkpoint.py ``_checkpoint_without_reentrant_generator``); the
census wraps the layer's checkpoint function and records those arguments as the layer's saved tensors.
The checkpoint's stashed RNG states are host tensors (``torch.get_rng_state``) and are not counted.
The model is called as the H100 runs call it (``model(input_ids=ids, labels=ids)``, ``use_cache`` left at
its default): without checkpointing a ``DynamicCache`` is filled, and SDPA then saves its K, V copies.

Regimes: ``fp32``; ``bf16`` (weights in bf16); ``amp-bf16`` (fp32 weights, forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)``). CPU autocast's lists differ from CUDA's
(aten/src/ATen/autocast_mode.cpp: ``AutocastCPU`` vs ``AT_FORALL_FP32``/``AT_FORALL_FP32_SET_OPT_DTYPE``
used by ``AutocastCUDA``): both run matmul/linear/addmm/bmm/SDPA in bf16, but only CUDA runs ``pow``,
``softmax``, ``log_softmax``, ``layer_norm``, ``exp``, ``sum`` ... in fp32. For the models here the ops
that meet bf16 inputs and differ are GPT-2's ``gelu_new`` (``torch.pow(x, 3.0)``: fp32 on CUDA, so the
rest of the formula promotes to fp32) and a ``softmax`` without ``dtype=`` on bf16 scores (fp32 on
CUDA); everything else these models run under autocast either meets fp32 inputs already (the residual
stream, norms, the loss after ``logits.float()``) or casts explicitly. ``memcalc.memory.families.saved`` models
both devices; this census can only run the CPU one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Regime = Literal["fp32", "bf16", "amp-bf16"]
Kind = Literal["activation", "weight_cast", "parameter"]
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3", "gemma", "gemma2", "gemma3_text",
            "olmo2", "gpt2", "gpt_neox", "opt", "bloom", "falcon")

# Tiny configs: widths chosen distinct (h 64, head_dim 16, ffn 96 or 4h, vocab 120) so that a formula with
# the wrong symbol gives a different number.
_H, _HEADS, _KV, _FFN, _VOCAB, _LAYERS = 64, 4, 2, 96, 120, 2
_ALTERNATING = ["sliding_attention", "full_attention"] * 2
TINY: dict[str, dict] = {
    "llama": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN),
    "mistral": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                    sliding_window=None),
    "qwen2": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                  use_sliding_window=False),
    "qwen3": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                  head_dim=_H // _HEADS, use_sliding_window=False),
    "phi3": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                 resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "granite": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                    embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                    logits_scaling=8.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # both layers rotate (SmolLM3-3B skips the rotary embedding in every fourth layer: tests/test_saved.py)
    "smollm3": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                    no_rope_layers=[1, 1], pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # Gemma: head_dim 16 (default 256), tied by default (untied here: the same saved bytes); Gemma 2 and 3: four
    # layers alternating sliding, full, so that each rotary table and mask is shared by two layers (the census
    # checks layers 0, sliding, and 1, full); sliding_window stays 4096 (tests/test_saved.py lowers it)
    "gemma": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                  head_dim=_H // _HEADS, attention_dropout=0.0),
    "gemma2": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                   head_dim=_H // _HEADS, attention_dropout=0.0, num_hidden_layers=4, layer_types=_ALTERNATING),
    "gemma3_text": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                        head_dim=_H // _HEADS, attention_dropout=0.0, num_hidden_layers=4, layer_types=_ALTERNATING),
    "olmo2": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                  attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "gpt2": dict(n_embd=_H, n_head=_HEADS, n_positions=128, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
    "gpt_neox": dict(hidden_size=_H, num_attention_heads=_HEADS, intermediate_size=4 * _H, rotary_pct=0.25,
                     hidden_dropout=0.0, attention_dropout=0.0),
    "opt": dict(hidden_size=_H, num_attention_heads=_HEADS, ffn_dim=4 * _H, word_embed_proj_dim=_H,
                max_position_embeddings=128, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
    "bloom": dict(hidden_size=_H, n_head=_HEADS, hidden_dropout=0.0, attention_dropout=0.0),
    "falcon": dict(hidden_size=_H, num_attention_heads=_HEADS, new_decoder_architecture=False, multi_query=True,
                   parallel_attn=True, alibi=False, bias=False, hidden_dropout=0.0, attention_dropout=0.0),
    # Mixtral, Qwen3-MoE: 4 experts, top 2, each expert ffn wide; grouped_mm runs bf16 only, and on the CPU wants
    # rows of a multiple of 16 bytes (h and ffn multiples of 8): censused in bf16 (tests/test_moe.py), not in FAMILIES
    "mixtral": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, intermediate_size=_FFN,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen3_moe": dict(hidden_size=_H, num_attention_heads=_HEADS, num_key_value_heads=_KV, head_dim=_H // _HEADS,
                      intermediate_size=_FFN, moe_intermediate_size=_FFN, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True),
}  # fmt: skip
_LAYER_KEYS = {"gpt2": "n_layer", "bloom": "n_layer"}


def tiny_config(family: str) -> dict:
    """The config.json dict of the tiny model of ``family`` (memcalc.model.hf_config reads it too)."""
    if family not in TINY:
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")
    return {"model_type": family, "vocab_size": _VOCAB, _LAYER_KEYS.get(family, "num_hidden_layers"): _LAYERS,
            "tie_word_embeddings": family in ("gpt2", "opt", "bloom", "falcon", "smollm3"), **TINY[family]}  # fmt: skip


@dataclass(frozen=True)
class SavedRecord:
    """One tensor autograd packed for backward."""

    part: str
    """``layer.i``, ``shared``, or the dotted path of the module outside the layers (``loss`` for the head's loss)."""
    module: str
    """Dotted path of the innermost module running when it was saved."""
    dtype: str
    shape: tuple[int, ...]
    kind: Kind
    bytes: int
    """Its storage's bytes the first time that storage is saved, 0 after (and always 0 for parameters)."""


@dataclass(frozen=True)
class Census:
    records: tuple[SavedRecord, ...]
    layers: int

    def part_bytes(self, part: str, kind: Kind = "activation") -> int:
        return sum(r.bytes for r in self.records if r.part == part and r.kind == kind)

    def layer_bytes(self, kind: Kind = "activation") -> int:
        """One decoder layer's bytes; every layer must save the same."""
        per = {self.part_bytes(f"layer.{i}", kind) for i in range(self.layers)}
        if len(per) != 1:
            raise AssertionError(f"layers save different bytes: {sorted(per)}")
        return per.pop()

    def outside_bytes(self, kind: Kind = "activation") -> dict[str, int]:
        """Bytes per part outside the layers (``shared`` included)."""
        out: dict[str, int] = {}
        for r in self.records:
            if not r.part.startswith("layer.") and r.kind == kind:
                out[r.part] = out.get(r.part, 0) + r.bytes
        return out


def build(family: str, regime: Regime, attention: str, recompute: bool, use_cache: bool | None = None,
          overrides: dict | None = None) -> nn.Module:
    """The tiny ``family`` model; ``use_cache``: the config's (None: the family's default, on); ``overrides``: config
    keys replacing the tiny config's (another variant of the family, e.g. Falcon's new decoder architecture)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_config(family) | (overrides or {})
    if use_cache is not None:
        cfg["use_cache"] = use_cache
    config = AutoConfig.for_model(**cfg)
    dtype = torch.bfloat16 if regime == "bf16" else torch.float32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype)
    model.train()
    if recompute:
        from memcalc.validation.trace_step import enable_checkpointing

        enable_checkpointing(model)
    return model


def _layer_index(name: str) -> int | None:
    m = re.search(r"\.(?:layers|h|layer)\.(\d+)(?:\.|$)", name)
    return int(m.group(1)) if m else None


@contextmanager
def _module_stack(model: nn.Module) -> Iterator[list[str]]:
    stack: list[str] = []
    handles = []
    for name, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: stack.append(n)))
        handles.append(mod.register_forward_hook(lambda m, a, o: stack.pop() and None, always_call=True))
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


_CAST_OR_VIEW = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0", "PermuteBackward0",
                 "AliasBackward0"}


def _kind(t: torch.Tensor, params: set[int]) -> Kind:
    if t.untyped_storage().data_ptr() in params:
        return "parameter"
    # An autocast cast of a weight (or of a view of one, ``weight.T`` in Falcon): ToCopy, then only
    # single-input view nodes, down to the parameter's AccumulateGrad.
    fn, cast = t.grad_fn, False
    while fn is not None and type(fn).__name__ in _CAST_OR_VIEW:
        cast = cast or type(fn).__name__ == "ToCopyBackward0"
        fn = fn.next_functions[0][0]
    if cast and isinstance(getattr(fn, "variable", None), nn.Parameter):
        return "weight_cast"
    return "activation"


def census(family: str, regime: Regime, attention: str, s: int, b: int, recompute: bool = False,
           model: nn.Module | None = None) -> Census:
    """Run one forward + loss of the tiny ``family`` model (or ``model``, built by ``build`` with the same
    arguments) and record what it saves for backward."""
    model = model if model is not None else build(family, regime, attention, recompute)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    events: list[tuple[int, str, torch.Tensor]] = []  # (storage pointer, module path, tensor); tensors kept alive

    with _module_stack(model) as stack:

        def pack(t: torch.Tensor) -> torch.Tensor:
            events.append((t.untyped_storage().data_ptr(), stack[-1] if stack else "", t))
            return t

        if recompute:
            _record_checkpoint_args(model, events)
        ids = torch.randint(0, _VOCAB, (b, s), generator=torch.Generator().manual_seed(0))
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if regime == "amp-bf16" else nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
            out = model(input_ids=ids, labels=ids)
    records = _attribute(events, params)
    del out
    return Census(records, _LAYERS)  # layers 0 and 1 (a family's TINY entry may build more)


def _record_checkpoint_args(model: nn.Module, events: list) -> None:
    """Wrap each layer's checkpoint function: the arguments it keeps (positional, and the keywords bound in the
    ``partial`` Hugging Face passes, modeling_layers.py ``GradientCheckpointingLayer``) are what the layer saves."""
    for name, mod in model.named_modules():
        fn = getattr(mod, "_gradient_checkpointing_func", None)
        if fn is None or _layer_index(name) is None:
            continue

        def wrapped(f, *args, _fn=fn, _name=name, **kw):
            kept = list(args) + list(getattr(f, "keywords", {}).values()) + list(kw.values())
            for t in _tensors(kept):
                events.append((t.untyped_storage().data_ptr(), _name, t))
            return _fn(f, *args, **kw)

        mod._gradient_checkpointing_func = functools.update_wrapper(functools.partial(wrapped), fn)


def _tensors(xs) -> Iterator[torch.Tensor]:
    for x in xs:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (tuple, list)):
            yield from _tensors(x)


def _attribute(events: list, params: set[int]) -> tuple[SavedRecord, ...]:
    layers_of: dict[int, set[int]] = {}
    for ptr, mod, _ in events:
        i = _layer_index(mod)
        if i is not None:
            layers_of.setdefault(ptr, set()).add(i)
    out, seen, owner = [], set(), {}
    for ptr, mod, t in events:
        if t.untyped_storage().nbytes() == 0:
            continue
        kind = _kind(t, params)
        i = _layer_index(mod)
        if ptr in owner:
            part = owner[ptr]
        elif i is None:  # first saved outside the layers: that module owns it
            part = mod or "loss"
        else:
            part = "shared" if len(layers_of[ptr]) > 1 else f"layer.{i}"
        owner.setdefault(ptr, part)
        first = ptr not in seen and kind != "parameter"
        seen.add(ptr)
        out.append(SavedRecord(part, mod or "<root>", str(t.dtype).removeprefix("torch."), tuple(t.shape), kind,
                               t.untyped_storage().nbytes() if first else 0))  # fmt: skip
    return tuple(out)


def describe(c: Census) -> str:
    """A readable listing, one line per saved tensor."""
    return "\n".join(
        f"{r.part:24} {r.module:40} {r.kind:11} {r.dtype:9} {str(r.shape):22} {r.bytes}" for r in c.records
    )
