"""LoRA and QLoRA: which projections get adapters, how many parameters train, and what a frozen 4-bit base stores.

Sources:
- Hu et al. 2021, "LoRA", arXiv 2106.09685 §4: W0 x + B A x with A (r x in) and B (out x r) trainable and W0 frozen;
  peft ``tuners/lora/layer.py`` (``LoraLayer.update_layer``: ``nn.Linear(in_features, r, bias=False)`` and
  ``nn.Linear(r, out_features, bias=False)``; ``lora_dropout=0`` is ``nn.Identity``).
- peft ``target_modules="all-linear"`` (``tuners/tuners_utils.py``): every ``nn.Linear``/``Conv1D`` but the output
  head; transformers' bitsandbytes integration likewise quantizes every ``nn.Linear`` but the head
  (``integrations/bitsandbytes.py`` ``get_keys_to_not_convert``); embeddings and norms stay in the compute dtype.
- Dettmers et al. 2023, "QLoRA", arXiv 2305.14314 §3 (NF4, blocks of 64; double quantization: 8-bit absmax in
  blocks of 256 with fp32 second-level constants, 8/64 + 32/(64·256) = 0.127 bits per parameter) and bitsandbytes
  0.50 ``functional.py`` ``quantize_4bit`` / ``quantize_blockwise``, measured on CPU (tests/test_lora.py).
"""

from __future__ import annotations


from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import PROJECTIONS as TARGETS
from memcalc.model.architecture import Architecture

QUANTIZE = ("none", "nf4")
"""``--quantize``: int8 (LLM.int8) keeps outlier columns in fp16 at a data-dependent count: not exact, refused."""

NF4_BLOCK = 64
"""bitsandbytes ``quantize_4bit`` blocksize default (QLoRA §3: blocks of 64)."""
NF4_ABSMAX_BLOCK = 256
"""Double quantization: ``quantize_blockwise(absmax - offset, blocksize=256)``."""
NF4_CONSTANT_BYTES = 4 + 16 * 4 + 256 * 4
"""Per quantized weight, whatever its size: the fp32 ``offset`` (absmax mean, 4), the NF4 code table
(``get_4bit_type``: 16 fp32 values, a new tensor per call, 64) and the second-level 8-bit dynamic map
(``QuantState(code=code.to(device, copy=True))``: 256 fp32 values copied per weight, 1,024)."""

# Hugging Face module names per family: (q, k, v, o, gate, up, down); a fused projection is named once for q, k, v.
_NAMES = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "gpt2": ("c_attn",) * 3 + ("attn.c_proj", None, "mlp.c_fc", "mlp.c_proj"),
    "gpt_neox": ("query_key_value",) * 3 + ("dense", None, "dense_h_to_4h", "dense_4h_to_h"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj", None, "fc1", "fc2"),
}
_NAMES.update(mistral=_NAMES["llama"], qwen2=_NAMES["llama"], qwen3=_NAMES["llama"], granite=_NAMES["llama"],
              smollm3=_NAMES["llama"], gemma=_NAMES["llama"], gemma2=_NAMES["llama"], gemma3_text=_NAMES["llama"],
              olmo2=_NAMES["llama"], bloom=_NAMES["gpt_neox"], falcon=_NAMES["gpt_neox"],
              phi3=("qkv_proj",) * 3 + ("o_proj",) + ("gate_up_proj",) * 2 + ("down_proj",))
ALL_LINEAR = "all-linear"
"""peft's ``target_modules="all-linear"``: every projection of the layers (the head excluded)."""
MODULE_NAMES = frozenset(n.rsplit(".", 1)[-1] for names in _NAMES.values() for n in names if n)
"""The layer projections' Hugging Face module names, as peft's ``target_modules`` lists them (``q_proj``, ...)."""


@frozen
class LoraPlan:
    """LoRA as the core reads it."""

    rank: int
    """r: the adapters' inner width."""
    targets: tuple[str, ...]
    """Family-neutral projections that get adapters (``TARGETS``), in layer order."""
    quantize: str = "none"
    """none (frozen base in the compute dtype) or nf4 (QLoRA: the base's linear weights in 4 bits)."""
    inputs_saved: bool = False
    """True where every linear saves its input whether or not its weight trains: DeepSpeed ZeRO-3's
    ``LinearFunctionForZeroStage3`` (runtime/zero/linear.py, ``ctx.save_for_backward(input, weight, bias)``), which
    ``zero.Init`` installs as ``F.linear``; a projection without an adapter then keeps what a targeted one keeps."""
    inputs_recast: bool = False
    """True where each lora_A saves a bf16 re-cast of its input of its own, as under autocast, in a bf16 step: FSDP1
    under a bf16 ``MixedPrecision`` with ``use_orig_params=True`` (each adapter a unit of its own under peft's wrap
    policy). peft's ``Linear.forward`` casts the input to ``lora_A.weight.dtype`` (``_cast_input_dtype``) before
    lora_A's unit gathers its bf16 parameter, when the weight is still the fp32 shard's view; autocast then casts
    that fp32 copy back to bf16 for the matmul, and lora_A saves the new copy (traced: tests/test_fsdp_layouts.py)."""


@frozen
class Projection:
    """One linear module of a decoder layer."""

    names: tuple[str, ...]
    """The neutral names it stands for (q, k, v for a fused projection)."""
    module: str
    """Its Hugging Face name."""
    fan_in: int
    fan_out: int


def projections(arch: Architecture) -> tuple[Projection, ...]:
    """The linear modules of one decoder layer, in call order (memcalc.model.params counts the same matrices)."""
    h, q, kv, f = arch.hidden, arch.q_width, arch.kv_width, arch.ffn_size
    gated = arch.gated_mlp
    names = _NAMES.get(arch.family or "")
    if names is None:  # a shape without a family: the neutral names are the module names
        names = (("qkv",) * 3 if arch.fused_qkv else ("q", "k", "v")) + ("o", "gate" if gated else None, "up", "down")
    out = [Projection(("q", "k", "v"), names[0], h, q + 2 * kv)] if arch.fused_qkv else [
        Projection(("q",), names[0], h, q), Projection(("k",), names[1], h, kv), Projection(("v",), names[2], h, kv)]
    out.append(Projection(("o",), names[3], q, h))
    if gated and arch.fused_gate_up:  # one module for gate and up, named once
        out.append(Projection(("gate", "up"), names[4] or "gate_up", h, 2 * f))
    elif gated:
        out.append(Projection(("gate",), names[4] or "gate", h, f))
    if not (gated and arch.fused_gate_up):
        out.append(Projection(("up",), names[5] or "up", h, f))
    out.append(Projection(("down",), names[6] or "down", f, h))
    return tuple(out)


def _matches(module: str, given: str) -> bool:
    """peft's match of a ``target_modules`` string against a module's name (``tuners_utils.check_target_module_exists``:
    the name, or its tail after a dot); ``module`` is the name inside the layer, ``given`` may carry a longer path."""
    return module == given or module.endswith("." + given) or given.endswith("." + module)


def resolve_targets(arch: Architecture | None, text: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--lora-targets``: comma-separated neutral names (q, k, v, o, gate, up, down), the model's Hugging Face module
    names as peft's ``target_modules`` gives them (``q_proj,v_proj``; GPT-2's ``c_proj`` is both attn.c_proj and
    mlp.c_proj, as peft matches it), or ``all-linear`` (the default: every projection, the head excluded); one line
    naming what would work when a target does not exist in ``arch``."""
    if arch is None:
        raise InputError("--lora-rank needs the model's shape (which projections get adapters): give --model, "
                         "--hf-config or --layers/--hidden/--heads/--vocab, not --params alone")
    if arch.moe:
        raise InputError(f"--lora-rank: LoRA on MoE experts is not modelled ({arch.name or 'the model'} has "
                         f"{arch.experts} experts); accepted: a dense model")
    projs = projections(arch)
    have = [n for p in projs for n in p.names]
    if text is None:
        return tuple(have)
    tokens = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if not tokens:
        raise InputError(f"--lora-targets is empty; accepted: a comma-separated subset of {','.join(have)}")
    modules = ",".join(dict.fromkeys(p.module for p in projs))
    given: list[str] = []
    for token in tokens:
        t = token.lower()
        if t == ALL_LINEAR:
            given += have
        elif t in TARGETS:
            if t not in have:
                raise InputError(f"--lora-targets {t!r} does not exist in {_who(arch)}; accepted: a comma-separated "
                                 f"subset of {','.join(have)} (or its modules {modules})")
            given.append(t)
        elif picked := [n for p in projs if _matches(p.module, token) for n in p.names]:
            given += picked
        else:
            raise InputError(f"--lora-targets {token!r} is not a projection of {_who(arch)}; accepted: a "
                             f"comma-separated subset of {','.join(have)}, its modules {modules}, or {ALL_LINEAR}")
    for p in projs:
        picked = [n for n in p.names if n in given]
        if picked and len(picked) < len(p.names):
            raise InputError(f"--lora-targets {','.join(picked)}: {_who(arch)} fuses {','.join(p.names)} into one "
                             f"module ({p.module}); accepted: all of {','.join(p.names)} or none")
    return tuple(n for n in have if n in given)


def _who(arch: Architecture) -> str:
    return arch.name or arch.family or "this model"


def adapter_params(rank: int, fan_in: int, fan_out: int) -> int:
    """A (r x in) + B (out x r): r·(in + out) trainable parameters (LoRA §4.1; peft: no bias)."""
    return rank * (fan_in + fan_out)


def nf4_bytes(numel: int) -> int:
    """Bytes bitsandbytes stores for one weight of ``numel`` elements quantized to NF4 with double quantization
    (``quantize_4bit(blocksize=64, compress_statistics=True, quant_type="nf4")``, quant_storage uint8):
    packed 4-bit pairs ⌈n/2⌉ (CUDA kernel: ``(n + 1) // 2``) + 8-bit absmax per block of 64, ⌈n/64⌉
    + fp32 absmax per 256 of those, 4·⌈⌈n/64⌉/256⌉ + ``NF4_CONSTANT_BYTES`` (offset, code table, dynamic map)."""
    blocks = -(-numel // NF4_BLOCK)
    return (numel + 1) // 2 + blocks + 4 * -(-blocks // NF4_ABSMAX_BLOCK) + NF4_CONSTANT_BYTES


@frozen
class LayerLora:
    """Per decoder layer: what trains and what the 4-bit base holds."""

    adapters: int
    """Trainable adapter parameters (A and B of every target)."""
    adapter_tensors: int
    """2 per target (A, B): AdamW keeps a step scalar per tensor."""
    linear: int
    """Elements of the layer's linear weights (what bitsandbytes quantizes; biases stay in the compute dtype)."""
    linear_tensors: int
    nf4: int
    """Bytes of those weights stored as NF4 (``nf4_bytes`` of each)."""
    largest_adapter: int
    """Elements of the largest adapter tensor (A or B)."""


def layer_lora(arch: Architecture, lora: LoraPlan) -> LayerLora:
    """Adapters and 4-bit storage of one decoder layer."""
    projs = projections(arch)
    targeted = [p for p in projs if p.names[0] in lora.targets]
    r = lora.rank
    return LayerLora(
        adapters=sum(adapter_params(r, p.fan_in, p.fan_out) for p in targeted),
        adapter_tensors=2 * len(targeted),
        linear=sum(p.fan_in * p.fan_out for p in projs),
        linear_tensors=len(projs),
        nf4=sum(nf4_bytes(p.fan_in * p.fan_out) for p in projs),
        largest_adapter=max((r * max(p.fan_in, p.fan_out) for p in targeted), default=0),
    )


def targeted(arch: Architecture, lora: LoraPlan) -> tuple[Projection, ...]:
    """The projections that carry adapters."""
    return tuple(p for p in projections(arch) if p.names[0] in lora.targets)


@frozen
class Split:
    """Parameters of ``layers`` decoder layers plus ``other`` parameters, split into frozen and trainable."""

    adapters: int
    frozen: int
    """Frozen elements (the whole base: quantized or not)."""
    frozen_bytes: int
    """Bytes of the frozen base at ``width`` bytes per unquantized element."""


def split(total: int, layers: int, layer: LayerLora, quantize: str, width: int) -> Split:
    """``total`` base parameters held, ``layers`` of them decoder layers: the frozen base's bytes (nf4: the layers'
    linear weights as ``nf4_bytes``, everything else at ``width``) and the adapters trained on top."""
    if quantize == "nf4":
        frozen_bytes = layers * layer.nf4 + (total - layers * layer.linear) * width
    else:
        frozen_bytes = total * width
    return Split(layers * layer.adapters, total, frozen_bytes)
