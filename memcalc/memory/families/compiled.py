"""What a Hugging Face decoder layer saves for backward when it runs under ``torch.compile``.

torch.compile hands the traced forward and backward, as one joint graph, to AOTAutograd's partitioner
``min_cut_rematerialization_partition`` (pytorch torch/_functorch/partitioners.py; the ``inductor`` backend and
``aot_eager`` both use it: torch/_inductor/compile_fx.py, torch/_dynamo/backends/debugging.py). It chooses the
tensors to keep as a minimum cut of the graph between the forward's inputs and what the backward needs:

- every node costs its bytes (scaled by 1.1 per step of distance from the backward, and doubled when it could be
  fused into its users rather than materialized: ``get_node_weight``); graph inputs cost their bytes too, and
  parameters nothing (``treat_parameters_as_free_to_save``);
- some nodes may not be recomputed in the backward, so they are kept when the backward needs them
  (``should_ban_recomputation``): matmuls and attention kernels (``is_compute_intensive``), any op outside the
  recomputable list of pointwise, view and cheap ops (``ban_recompute_not_in_allowlist``), reductions whose output is
  4 times smaller than their input (``ban_recompute_reductions``: RMSNorm's rstd), and a pointwise op used after its
  input's first unfusible use (``ban_recompute_used_far_apart``: the residual sum ``h + o`` when ``h`` itself was
  made by a pointwise op in the same graph);
- everything else (casts, ``x.float()``, ``x * rstd``, ``weight * x``, SiLU, the residual sums, rotary's
  ``q·cos + rotate_half(q)·sin``) is recomputed in the backward from the cheapest set of kept tensors.

Census on CPU (torch 2.13, transformers 5.23; ``memcalc.validation.saved_compile``, tests/test_compile.py), llama,
mistral and qwen2 alike, per micro-batch, T = s·b tokens; d = compute-dtype bytes; r = residual-stream bytes
(``memcalc.memory.families.saved`` conventions):

    layer input (norm 1 input)              r·T·h        graph input: a compiled layer cannot recompute it
    norm 1 rstd (fp32)                      4·T          reduction: banned from recompute
    q/k/v input (norm 1 output)             d·T·h        one storage; under autocast ONE bf16 cast (eager: 3)
    SDPA: Q (rotated), K, V (cache copies)  d·T·(qw + 2·kvw), the output d·T·qw, log-sum-exp 4·heads·T
    eager attention: Q, Kᵀ, V full width    3·d·T·qw, softmax (fp32) 4·S², probabilities d·S² (the p=0
                                            dropout's output, its own storage even in fp32), output d·T·qw
    o_proj output                           d·T·h        per-layer compile: h + o is recomputed from it
      (whole-model compile: the sum h + o   r·T·h        banned as used far apart, in every layer but the first)
    norm 2 rstd (fp32)                      4·T
    gate/up input (norm 2 output)           d·T·h        one storage (autocast: one cast; eager: 2)
    gate output, up output, down input      3·d·T·ffn    SiLU's output is recomputed (eager keeps it: 4·d·T·ffn)
    amp-bf16: bf16 weight casts             as eager     (``memcalc.memory.families.saved._weight_casts``)

torchtitan's Llama 3 block (``code="torchtitan"``, fp32 or bf16 = FSDP2 param_dtype, so r = d; census with its
own modules, SDPA): the same list (one fused ``wqkv`` input; ``F.rms_norm`` decomposes to the same pointwise ops
and reduction, so rstd is kept and the normalized tensor recomputed), plus the rotary table it gathers per layer
(complex64, 4·T·hd, kept for the complex multiply's backward), as in eager (``memcalc.memory.families.saved._torchtitan_layer``).
Flex attention (torchtitan's default) keeps q, k, v, the output and the log-sum-exp like SDPA once compiled (the
eager census's note, ``memcalc.validation.saved_torchtitan``): the SDPA figures, derived, not measured (no CPU
backward).

Per token, SDPA, per-layer compile: r·h + 3·d·h + 2·d·qw + 2·d·kvw + 4·heads + 8 + 3·d·ffn. Against eager
(``memcalc.memory.families.saved.layer_saved``): the RMSNorms' fp32 input copies and normalized tensors, autocast's
per-projection casts and SiLU's output are gone: eager − compiled = 8·T·h + d·T·ffn in fp32 and bf16,
16·T·h + 2·T·ffn under amp-bf16 (whole-model compile: 14·T·h + 2·T·ffn), less 4·S² with eager attention in fp32.
Device: measured on CPU; on CUDA the graph and the partitioner's rules are the same for these families
(the norms upcast explicitly, the softmax asks for fp32), so ``device="cuda"`` gives the same figures (derived, not
measured; flash attention's two int64 RNG scalars are not counted, as in ``memcalc.memory.families.saved``).
"""

from __future__ import annotations

from typing import Literal

from memcalc.errors import InputError
from memcalc.memory.families.saved import LLAMA_LIKE, REGIMES, SavedTensor, _dtypes, _weight_casts, check_code, shape
from memcalc.model.architecture import Architecture

Scope = Literal["layer", "model"]
SCOPES = ("layer", "model")
"""``layer``: each decoder layer compiled on its own (torchtitan ``apply_compile``, torchtune ``compile_model``);
``model``: the whole model in one graph (``torch.compile(model)``)."""


def _check(family: str, regime: str, attention: str, scope: str, device: str, code: str = "hf") -> None:
    if code == "torchtitan":
        check_code(code, family, regime, "sdpa" if attention == "flex" else attention)
        attention = "sdpa" if attention == "flex" else attention
    elif code != "hf":
        check_code(code, family, regime, attention)
    if family not in LLAMA_LIKE:
        raise InputError(f"family {family!r} has no compiled saved-tensor profile; known: {', '.join(LLAMA_LIKE)}")
    if regime not in REGIMES:
        raise InputError(f"precision regime {regime!r} is not one of {', '.join(REGIMES)}")
    if attention not in ("sdpa", "eager"):
        raise InputError(f"attention {attention!r} under torch.compile is not profiled; use sdpa or eager")
    if scope not in SCOPES:
        raise InputError(f"compile scope {scope!r} is not one of {', '.join(SCOPES)}")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device {device!r} is not one of cpu, cuda")


def compiled_layer_saved(arch: Architecture, *, family: str, regime: str, attention: str, s: int, b: int,
                         device: str = "cpu", scope: Scope = "layer", code: str = "hf") -> list[SavedTensor]:  # fmt: skip
    """Every storage one decoder layer saves for backward under ``torch.compile``, per micro-batch, without
    activation checkpointing (the rule and its sources: this module's docstring). ``scope="model"`` gives a layer
    after the first of a whole-model graph (the first layer's input is the embedding's output: it saves the
    o_proj output instead of the residual sum, as under ``scope="layer"``). ``code="torchtitan"``: torchtitan's
    Llama 3 block (fp32 or bf16, sdpa or flex)."""
    _check(family, regime, attention, scope, device, code)
    if code == "torchtitan":
        attention = "sdpa"  # flex keeps what SDPA keeps once compiled
    d, r, amp = _dtypes(regime)
    x = shape(arch, s, b)
    t, h = x.t, x.h
    cast = " (one bf16 cast)" if amp else ""
    out = [SavedTensor("layer input (norm 1 input)", r * t * h), SavedTensor("norm 1 rstd (fp32)", 4 * t),
           SavedTensor(f"q/k/v input (norm 1 output){cast}", d * t * h)]  # fmt: skip
    if attention == "sdpa":
        out += [SavedTensor("Q (rotated)", d * t * x.qw), SavedTensor("K, V (cache copies)", 2 * d * t * x.kvw),
                SavedTensor("attention output (o_proj input)", d * t * x.qw),
                SavedTensor("log-sum-exp (fp32)", 4 * x.heads * t)]  # fmt: skip
    else:
        out += [SavedTensor("Q, Kᵀ, V (copies, full width)", 3 * d * t * x.qw),
                SavedTensor("softmax (fp32)", 4 * x.scores),
                SavedTensor("probabilities (dropout p=0 output, own storage)", d * x.scores),
                SavedTensor("attention output (o_proj input)", d * t * x.qw)]  # fmt: skip
    if scope == "layer":
        out.append(SavedTensor("o_proj output (h + o recomputed)", d * t * h))
    else:
        out.append(SavedTensor("residual h + o (norm 2 input; used far apart)", r * t * h))
    out += [SavedTensor("norm 2 rstd (fp32)", 4 * t), SavedTensor(f"gate/up input (norm 2 output){cast}", d * t * h),
            SavedTensor("gate output, up output, down input (SiLU recomputed)", 3 * d * t * x.ffn)]  # fmt: skip
    if code == "torchtitan":
        out.append(SavedTensor("rotary table (complex64, gathered per layer)", 4 * t * x.hd))
    if amp:
        out += _weight_casts(x, family)
    return out


def compile_saving(arch: Architecture, *, regime: str, attention: str, s: int, b: int,
                   scope: Scope = "layer") -> int:  # fmt: skip
    """Activation bytes per layer that compiling saves against eager (``memcalc.memory.families.saved.layer_saved`` minus
    ``compiled_layer_saved``), in closed form: 8·T·h + d·T·ffn (fp32, bf16), 16·T·h + 2·T·ffn (amp-bf16; 14·T·h
    under whole-model compile), less 4·S² for eager attention in fp32 (compile keeps the probabilities apart)."""
    _check("llama", regime, attention, scope, "cpu")
    d, r, amp = _dtypes(regime)
    x = shape(arch, s, b)
    per_h = (16 if amp else 8) - (r - d if scope == "model" else 0)
    extra = 4 * x.scores if attention == "eager" and d == 4 else 0
    return per_h * x.t * x.h + d * x.t * x.ffn - extra
