"""Where the realistic accounting applies (``why_not``): the families, regimes, optimizers and layouts whose step
``memcalc.memory.accountings.realistic`` models, and for the rest one line saying why the paper's accounting answers instead.
Loaded without the timelines, so that checking an input costs no more than these rules."""

from __future__ import annotations

from typing import Any

REGIME = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "amp-bf16", "amp-fp16": "amp-bf16"}
"""memcalc's precision -> the saved-tensor profile's regime. amp-fp16 saves what amp-bf16 does (both 2-byte casts;
the GradScaler's scale and found-inf flags are a few bytes)."""
OPTIMIZER_STATES = {"adamw": "adamw", "adam-8bit": "adamw-8bit", "paged-adam-8bit": "paged-adamw-8bit"}
ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash": "sdpa"}
"""flash: SDPA's flash kernel, which saves what CPU's SDPA saves (output and log-sum-exp; DOMAIN §13)."""
FSDP_SHARDED = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
"""FSDP's sharded layouts, under FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``): resharding after
forward or not (SHARD_GRAD_OP), over one mesh dimension or over a (replicate, shard) mesh (HSDP); each exact against
the tracer's rank 0 (tests/test_timeline_fsdp.py, tests/test_fsdp_layouts.py)."""
STRATEGIES = ("ddp", *FSDP_SHARDED)
"""Replicated model states (one GPU, DDP) and FSDP's sharded layouts; the other sharded and model-parallel layouts
take the paper's."""
SHARDED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3", "gemma", "gemma2", "gemma3_text",
                    "olmo2", "gpt2", "bloom", "gpt_neox", "falcon", "opt", "mixtral", "qwen3_moe")
"""Families whose FSDP2 step was checked against the tracer (tests/test_timeline_fsdp.py): exact for the Llama-style
decoder layers, Gemma, BLOOM, GPT-NeoX and Falcon (Falcon-7B's block and the new decoder's; FSDP1 too, within its
padding); OPT within 0.05 %; Gemma 2, Gemma 3 and OLMo 2 (post-norms) exact in fp32 and 1.9-3.2 % below the trace in
2-byte regimes; GPT-2 (FSDP2 and FSDP1) from 0.01 % below to 2.9 % above once its dropout masks are counted (traced
with attn_pdrop 0: on CPU SDPA's dropout takes the math kernel, which CUDA's fused kernels do not); Mixtral's and
Qwen3-MoE's MoE layers exact under FSDP2 and FSDP1 (tests/test_moe.py)."""
POST_NORM_FSDP = ("gemma2", "gemma3_text", "olmo2")
SDPA_ONLY = ("gpt_neox", "falcon")
"""Families whose step is ordered op by op under SDPA, their default (tests/test_timeline.py), and not under eager
attention, whose score-sized forward transients (the scores, the masked scores, the softmax, and the fused qkv output
in a local) make the peak at long sequences: 2-17 % below a trace at 256 tokens."""
SDPA_ONLY_WHY = ("--attention eager with {family}: the realistic accounting follows its SDPA step (the model's "
                 "default) op by op, not eager attention's score-sized transients (up to 17 % below a trace at 256 "
                 "tokens); give --attention sdpa, or the paper accounting counts this one")


def default_attention(arch: Any, accounting: str) -> str:
    """The attention a step runs when ``--attention`` is not given: what the model code picks. transformers loads
    every model with ``attn_implementation="sdpa"`` where the model class supports it (``_supports_sdpa``), and
    torchtitan, torchtune and Megatron-LM call SDPA or a flash kernel; BLOOM and Gemma 2 have no SDPA path, so
    they run eager. ``--accounting paper`` asked for by name counts the papers' eager attention (Korthikanti et al.
    2022 §4: the a·s² scores and their softmax are kept)."""
    if accounting == "paper" or arch is None:
        return "eager"
    from memcalc.memory.families.saved import EAGER_ONLY

    return "eager" if arch.family in EAGER_ONLY else "sdpa"


def why_not(arch: Any, precision: str, optimizer: str, strategy: str, work: Any, tp: int = 1, pp: int = 1,
            cp: int = 1, ep: int = 1, fsdp_version: int = 2, lora: Any = None, framework: str | None = None,
            sequence_parallel: bool = False,
            offload: tuple[str, str] = ("none", "none"), overlap_comm: bool = False,
            fsdp_wrap: str | None = None, fsdp_auto_wrap: str | None = None,
            float8: str = "none") -> str | None:  # fmt: skip
    """Why the realistic accounting does not apply to this set-up (one line), or None when it does.

    offload: (optimizer, parameters) devices. fsdp_wrap: the --fsdp-wrap given (None: the framework's).
    fsdp_auto_wrap: the --fsdp-auto-wrap given (None: transformer)."""
    if work is not None and ":" in work.recompute and work.recompute.split(":")[0] in ("selective", "full") \
            and framework != "megatron":
        return (f"--recompute {work.recompute}: Megatron-Core's recompute modules and methods, modelled under "
                "--framework megatron")
    if framework == "megatron":
        if float8 not in ("none", "tensorwise"):
            return (f"--framework megatron with --float8 {float8}: the realistic accounting models Transformer "
                    "Engine's per-tensor FP8 (--float8 tensorwise: current or delayed scaling), not its block-scaled "
                    "recipes")
        return _why_not_megatron(arch, precision, optimizer, strategy, work, tp, sequence_parallel, lora, offload)
    if arch is not None and arch.moe:
        why = _why_not_moe(arch, precision, optimizer, strategy, work, max(tp, pp, cp, ep), lora, framework, offload,
                           fsdp_auto_wrap)
        if why is not None:
            return why
    if offload != ("none", "none") and strategy not in ("zero-1", "zero-2", "zero-3", "FULL_SHARD"):
        return ("offload: the realistic accounting models DeepSpeed ZeRO-1/2/3's CPU/NVMe offload and FULL_SHARD's "
                "parameter offload (FSDP2 CPUOffloadPolicy, FSDP1 CPUOffload); the paper accounting counts the others")
    if overlap_comm and strategy == "zero-1":
        return ("zero-1 with overlap_comm: its reduction in the gradient hooks is not modelled (the traced step holds "
                "more than without it); ZeRO-2, or ZeRO-1 without overlap_comm")
    if strategy == "zero-3" and work is not None and work.recompute not in ("none", "full"):
        return f"zero-3: the realistic accounting models recompute none or full (got {work.recompute})"
    if strategy in (*ZERO_STAGES, "zero-3"):
        if precision == "fp32" and offload != ("none", "none"):
            return (f"{strategy} offload with --precision fp32: the realistic accounting models DeepSpeed's fp32 "
                    "training (neither fp16 nor bf16 enabled) without offload; the paper accounting counts this one")
        return _why_not_zero(arch, precision, optimizer, strategy, work, max(tp, pp, cp, ep), lora)
    if getattr(work, "compile", False):
        from memcalc.memory.families.saved import LLAMA_LIKE

        if (arch is not None and arch.family not in LLAMA_LIKE) or lora is not None or work.recompute == "selective":
            return ("--compile: the compiled layers' saved set is measured for Llama-style layers without LoRA, "
                    "recompute none, full, every:K or op-sac")
    if framework == "torchtitan" and arch is not None and work is not None:
        from memcalc.memory.families.saved import LLAMA_LIKE

        if arch.family not in LLAMA_LIKE or precision.startswith("amp") or work.attention == "eager" or lora:
            return ("--framework torchtitan: its model code is profiled for Llama-style layers in fp32, bf16 or "
                    "bf16-mixed (FSDP2) with flash/sdpa attention and no LoRA")
    if lora is not None:
        why = _why_not_lora(arch, strategy, work, fsdp_version, framework, offload, fsdp_wrap, lora)
        if why is not None:
            return why
    if arch is None:
        return "the realistic accounting needs the model's shape"
    if work is None:
        return "the realistic accounting needs --seq-len"
    from memcalc.memory.families.saved import EAGER_ONLY, FAMILIES  # loaded only when there is a shape to profile

    if arch.family in EAGER_ONLY and work.attention != "eager":
        return (f"--attention {work.attention}: Hugging Face's {arch.family} has no SDPA path (its attention is "
                "profiled eager); give --attention eager")
    if arch.family in SDPA_ONLY and work.attention == "eager":
        return SDPA_ONLY_WHY.format(family=arch.family)
    if arch.family not in FAMILIES:
        return f"no saved-tensor profile for family {arch.family or 'unset'}; profiles: {', '.join(FAMILIES)}"
    if precision not in REGIME and not (strategy in FSDP_SHARDED and precision == "bf16-mixed"):
        return (f"--precision {precision} is a master-weight regime (DeepSpeed, Megatron); the realistic accounting "
                "models what Hugging Face runs: amp-bf16 (Trainer(bf16=True)), amp-fp16, bf16, fp32")
    if optimizer not in OPTIMIZER_STATES:
        return f"--optimizer {optimizer}: the realistic accounting models AdamW (torch, or bitsandbytes 8-bit)"
    if strategy not in STRATEGIES or ep > 1 or (max(pp, cp) > 1 and strategy not in FSDP_SHARDED):
        return ("the realistic accounting covers one GPU, DDP, FSDP1 and FSDP2 (FULL_SHARD, SHARD_GRAD_OP, "
                "HYBRID_SHARD, _HYBRID_SHARD_ZERO2), DDP and FSDP2 with DTensor tensor parallelism, and context "
                "and pipeline parallelism under FSDP2, so far; other sharded and model-parallel layouts (expert, "
                "pipeline or context without FSDP) take the paper's")
    if pp > 1:
        why = _why_not_pp(arch, precision, strategy, work, fsdp_version, lora, framework)
        if why is not None:
            return why
    compiled = getattr(work, "compile", False)
    if tp > 1 and sequence_parallel and (ATTENTION.get(work.attention) != "sdpa" or arch.tied_embeddings
                                         or getattr(work, "loss", "standard") != "standard"
                                         or (compiled and work.recompute != "full")
                                         or getattr(work, "seq_len", tp * cp) // cp % tp):  # fmt: skip
        return (f"--tp {tp} --sequence-parallel: the realistic accounting models torchtitan's sequence-parallel plan "
                "(with loss_parallel) for untied layers, sdpa, the standard loss (eager or compiled), layers eager (or "
                "compiled under full recompute), tp dividing the rank's seq_len / cp; the paper accounting counts the rest")
    if tp > 1:
        why = _why_not_tp(arch, optimizer, work, tp, lora, framework, sequence_parallel)
        if why is not None:
            return why
    if strategy in FSDP_SHARDED:
        if fsdp_version != 2 and (tp > 1 or cp > 1):
            return (f"{strategy} under FSDP1: the realistic accounting follows FSDP1's flat parameters (traced) "
                    "without tensor or context parallelism; give --fsdp-version 2 for the rest")
        if arch.family not in SHARDED_FAMILIES:
            return f"{strategy}: the realistic accounting models {', '.join(SHARDED_FAMILIES)} layers under FSDP2"
        if optimizer != "adamw" or getattr(work, "optimizer_impl", "foreach") not in ("foreach", "fused"):
            return f"{strategy}: the realistic accounting models torch AdamW, foreach or fused"
        if getattr(work, "recompute", "none") == "selective":
            return f"{strategy}: the realistic accounting models recompute none, full, every:K or op-sac"
    if fsdp_auto_wrap == "none" and strategy in FSDP_SHARDED:
        return _why_not_whole(arch, strategy, max(tp, cp, pp), offload, lora, fsdp_version, fsdp_wrap)
    return None


def _why_not_whole(arch: Any, strategy: str, parallel: int, offload: tuple[str, str], lora: Any, fsdp_version: int,
                   fsdp_wrap: str | None) -> str | None:  # fmt: skip
    """FSDP without a unit per decoder layer (accelerate's NO_WRAP, ``FsdpOverlay.whole``): traced for FSDP1's one
    FlatParameter (its four sharding strategies: the same step over the shard group) and FSDP2's FULL_SHARD as
    accelerate 1.15 carves the embedding and the head."""
    if (strategy != "FULL_SHARD" and fsdp_version == 2) or parallel > 1 or offload != ("none", "none") \
            or lora is not None:
        return ("--fsdp-auto-wrap none: the realistic accounting models FSDP1 (every sharding strategy) and FSDP2's "
                "FULL_SHARD, without offload, LoRA, tensor, context or pipeline parallelism (traced); the paper "
                "accounting counts the rest")
    if fsdp_version == 2 and fsdp_wrap not in (None, "separate" if not arch.tied_embeddings else "root"):
        return (f"--fsdp-auto-wrap none with --fsdp-wrap {fsdp_wrap}: the realistic accounting models FSDP2 as "
                "accelerate 1.15 wraps it (the embedding and [final norm, head] units of their own; one [norm, "
                "embedding, head] unit when tied), not one unit over the whole model")
    return None


def _why_not_moe(arch: Any, precision: str, optimizer: str, strategy: str, work: Any, parallel: int, lora: Any,
                 framework: str | None, offload: tuple[str, str], fsdp_auto_wrap: str | None) -> str | None:  # fmt: skip
    """Mixture-of-experts layers as Hugging Face's Mixtral and Qwen3-MoE run them (``memcalc.memory.families.saved_moe``: the
    router and the experts' grouped matmuls, bf16 only), traced on one GPU and under FSDP2 and FSDP1
    (tests/test_moe.py) and under DeepSpeed ZeRO-0 to 3 with a bf16 module (tests/validation/
    test_deepspeed_timeline.py)."""
    from memcalc.memory.families.saved_moe import MOE_FAMILIES

    if arch.family not in MOE_FAMILIES or arch.moe_every != 1 or arch.shared_experts or arch.router_bias:
        return (f"MoE family {arch.family or 'unset'}: the realistic accounting models Mixtral's and Qwen3-MoE's MoE "
                "layers (every layer sparse, no shared expert)")
    deepspeed = (*ZERO_STAGES, "zero-3")
    if (strategy not in ("ddp", *FSDP_SHARDED, *deepspeed) or parallel > 1 or offload != ("none", "none")
            or lora is not None):
        extra = [x for x, on in (("model parallelism", parallel > 1), ("offload", offload != ("none", "none")),
                                 ("LoRA", lora is not None)) if on]
        return (f"MoE with {', '.join([strategy, *extra])}: the realistic accounting models MoE layers on one GPU, "
                "DDP, FSDP and DeepSpeed ZeRO-0 to 3, without offload, model parallelism or LoRA")
    if strategy in deepspeed and precision != "bf16-mixed":
        return (f"MoE under DeepSpeed with --precision {precision}: the realistic accounting models DeepSpeed's bf16 "
                "training (bf16-mixed: a bf16 module, whose experts' grouped_mm runs, and fp32 master partitions)")
    if strategy not in deepspeed and not (precision == "bf16" or (precision == "bf16-mixed"
                                                                  and strategy in FSDP_SHARDED)):
        return (f"MoE with --precision {precision}: the experts' grouped_mm takes bf16 only; the realistic accounting "
                "models --precision bf16 (or bf16-mixed under FSDP and DeepSpeed)")
    if framework not in (None, "hf") or fsdp_auto_wrap == "none":
        what = f"--framework {framework}" if framework not in (None, "hf") else "--fsdp-auto-wrap none"
        return (f"MoE with {what}: the realistic accounting models Hugging Face's MoE layers, a unit per decoder "
                "layer under FSDP")
    if work is not None and (work.recompute not in ("none", "full") or work.attention not in ("sdpa", "flash")
                             or getattr(work, "compile", False) or getattr(work, "loss", "standard") != "standard"
                             or optimizer != "adamw"
                             or getattr(work, "optimizer_impl", "foreach") not in ("foreach", "fused", "for-loop")):
        return ("MoE: the realistic accounting models recompute none or full, sdpa attention, the standard loss, no "
                "--compile, torch AdamW")
    return None


ZERO_STAGES = ("zero-0", "zero-1", "zero-2")
"""DeepSpeed stages whose step is modelled by ``memcalc.memory.overlays.timeline_zero``; ZeRO-3's by
``memcalc.memory.overlays.timeline_zero3`` (both against traced DeepSpeed steps on CPU ranks)."""


def _why_not_pp(arch: Any, precision: str, strategy: str, work: Any, fsdp_version: int, lora: Any,
                framework: str | None) -> str | None:  # fmt: skip
    """Pipeline stages are modelled as torch.distributed.pipelining runs them with FSDP2 inside each stage
    (torchtitan: ``memcalc.memory.overlays.timeline_pp``)."""
    from memcalc.layout.compose import composition
    from memcalc.memory.families.saved import LLAMA_STYLE

    if not composition(framework).fsdp_in_pipeline or fsdp_version != 2 or strategy not in ("FULL_SHARD",
                                                                                          "SHARD_GRAD_OP"):
        return ("--pp: the realistic accounting models torch.distributed.pipelining with FSDP2 (FULL_SHARD or "
                "SHARD_GRAD_OP) inside each stage, as --framework torchtitan composes them")
    if arch.family not in LLAMA_STYLE or arch.tied_embeddings or lora is not None:
        return (f"--pp: the realistic pipeline stage models untied {', '.join(LLAMA_STYLE)} layers without LoRA "
                "(got " + (arch.family or "unset") + (", tied embeddings" if arch.tied_embeddings else "")
                + (", LoRA" if lora is not None else "") + ")")
    if precision not in ("bf16-mixed", "bf16", "fp32") or getattr(work, "loss", "standard") != "standard":
        return ("--pp: the realistic pipeline stage models bf16-mixed (FSDP2's bf16 policy), bf16 or fp32 and the "
                "standard loss")
    return None


def _why_not_zero(arch: Any, precision: str, optimizer: str, strategy: str, work: Any, parallel: int,
                  lora: Any) -> str | None:  # fmt: skip
    """DeepSpeed ZeRO-0/1/2 on Hugging Face layers: the bf16 module's timeline under DeepSpeed's states."""
    from memcalc.memory.families.saved import EAGER_ONLY, FAMILIES

    if arch is None or work is None:
        return "the realistic accounting needs the model's shape and --seq-len"
    if arch.family not in FAMILIES:  # (MoE families: checked by _why_not_moe before)
        return f"{strategy}: no saved-tensor profile for family {arch.family or 'unset'}; profiles: {', '.join(FAMILIES)}"
    if arch.family in EAGER_ONLY and work.attention != "eager":
        return f"--attention {work.attention}: Hugging Face's {arch.family} is profiled eager; give --attention eager"
    if arch.family in SDPA_ONLY and work.attention == "eager":
        return SDPA_ONLY_WHY.format(family=arch.family)
    if precision not in ("bf16-mixed", "fp16-mixed") and not (precision == "fp32" and lora is None):
        return (f"{strategy} with --precision {precision}: the realistic accounting models DeepSpeed's bf16/fp16 "
                "training (bf16-mixed, fp16-mixed: the module in 2 bytes, an fp32 master partition) and, without "
                "LoRA, fp32 (neither enabled)")
    if optimizer != "adamw" or getattr(work, "optimizer_impl", "fused") not in ("foreach", "fused", "for-loop"):
        return f"{strategy}: the realistic accounting models AdamW (DeepSpeed's FusedAdam, or torch's)"
    if parallel > 1 or (work.recompute not in ("none", "full") and not work.recompute.startswith("every:")):
        return (f"{strategy}: the realistic accounting models data parallelism alone, recompute none, full or every:K")
    if lora is not None:
        from memcalc.memory.families.saved import LORA_REALISTIC

        if lora.quantize != "none" or arch.family not in LORA_REALISTIC:
            return (f"LoRA under {strategy}: the realistic accounting models peft on {', '.join(LORA_REALISTIC)} "
                    "layers under DeepSpeed, the base in the training dtype (no 4-bit base); the paper accounting "
                    "counts this one")
        if work.recompute not in ("none", "full"):
            return "LoRA: the realistic accounting models recompute none or full"
    if getattr(work, "compile", False):
        return f"{strategy}: --compile under DeepSpeed is not modelled"
    return None


def _why_not_tp(arch: Any, optimizer: str, work: Any, tp: int, lora: Any, framework: str | None,
                sequence_parallel: bool = False) -> str | None:  # fmt: skip
    """Tensor parallelism is modelled as the tracer's DTensor plan runs it (``memcalc.memory.overlays.timeline_tp``)."""
    from memcalc.memory.overlays.timeline_tp import TP_FAMILIES

    if arch.family not in TP_FAMILIES or arch.moe or arch.fused_qkv or not arch.gated_mlp:
        return f"--tp {tp}: the realistic accounting models DTensor TP on dense {', '.join(TP_FAMILIES)} layers"
    if arch.heads % tp or arch.n_kv % tp:
        return f"--tp {tp}: it must divide heads ({arch.heads}) and kv heads ({arch.n_kv}); DTensor shards whole heads"
    # torchtitan's own layers under its sequence-parallel plan: with full recompute each keeps its checkpoint whatever
    # the code; the recomputed layer is counted as Hugging Face's (``_code``)
    titan_ok = sequence_parallel and getattr(work, "recompute", "none") == "full"
    if lora is not None or (framework == "torchtitan" and not titan_ok):
        return (f"--tp {tp}: the realistic accounting models Hugging Face layers under DTensor TP (no LoRA); "
                "torchtitan's own layers only under its sequence-parallel plan with full recompute")
    if optimizer != "adamw" or getattr(work, "optimizer_impl", "foreach") not in ("foreach", "fused"):
        return f"--tp {tp}: the realistic accounting models torch AdamW, foreach or fused"
    if getattr(work, "recompute", "none") not in ("none", "full"):
        return f"--tp {tp}: the realistic accounting models recompute none or full"
    return None


def _why_not_lora(arch: Any, strategy: str, work: Any, fsdp_version: int = 2, framework: str | None = None,
                  offload: tuple[str, str] = ("none", "none"), given_wrap: str | None = None,
                  lora: Any = None) -> str | None:  # fmt: skip
    """LoRA's step (peft on Hugging Face code) is modelled for Llama-style layers on one GPU, DDP, FSDP2's
    FULL_SHARD with the root or the separate wrap and FSDP1's FULL_SHARD under peft's wrap policy
    (``memcalc.memory.overlays.fsdp_overlay.lora_overlay``)."""
    from memcalc.layout.compose import framework as named
    from memcalc.layout.compose import fsdp_wrap
    from memcalc.memory.families.saved import LORA_FAMILIES, LORA_REALISTIC

    if arch is not None and arch.family not in LORA_REALISTIC:
        return (f"LoRA: the realistic accounting models peft on {', '.join(LORA_REALISTIC)} layers (Gemma 2 and 3: "
                "their post-norm layers' recomputed backward under LoRA is not ordered, up to 7 % below a trace)")
    fsdp2 = (strategy == "FULL_SHARD" and fsdp_version == 2 and offload == ("none", "none")
             and getattr(lora, "quantize", "none") == "none"
             and fsdp_wrap(given_wrap, named(framework), arch is not None and arch.tied_embeddings)
             in ("root", "separate"))
    # FSDP1 as the Hugging Face Trainer wraps a peft model: peft's wrap policy, the embedding and head in the root
    fsdp1 = (strategy == "FULL_SHARD" and fsdp_version == 1 and offload == ("none", "none")
             and getattr(lora, "quantize", "none") == "none" and (arch is None or arch.family in LORA_FAMILIES))
    if strategy != "ddp" and not fsdp2 and not fsdp1:
        return ("LoRA: the realistic accounting covers one GPU, DDP, FSDP2 FULL_SHARD (embedding and head in the "
                "root unit or in units of their own as accelerate carves them) and FSDP1 FULL_SHARD (peft's wrap "
                "policy, Llama-style layers), no offload, no 4-bit base, so far")
    if work is not None and getattr(work, "recompute", "none") not in ("none", "full"):
        return "LoRA: the realistic accounting models recompute none or full"
    return None


MEGATRON_RECOMPUTE = ("none", "selective", "full")


def _why_not_megatron(arch: Any, precision: str, optimizer: str, strategy: str, work: Any, tp: int,
                      sequence_parallel: bool, lora: Any, offload: tuple[str, str]) -> str | None:  # fmt: skip
    """Megatron-Core's GPT layers (Transformer Engine spec) under its DDP or distributed optimizer, bf16 with fp32
    main grads, Adam (``memcalc.memory.accountings.megatron``); the rest takes the paper accounting, with this line saying why."""
    if arch is None or work is None:
        return "the realistic accounting needs the model's shape and --seq-len"
    if arch.moe and (arch.router_bias or arch.family not in ("mixtral", "qwen3_moe", None)):
        return (f"--framework megatron with {arch.family}'s MoE layers: the realistic accounting models "
                "Megatron-Core's MoE layer as Mixtral and Qwen3-MoE run it (softmax top-k router, grouped experts, all-to-all "
                "dispatcher); the paper accounting counts the rest")
    if strategy not in ("ddp", "zero-0", "zero-1"):
        return (f"--framework megatron: the realistic accounting models DDP and the distributed optimizer (got "
                f"{strategy})")
    if precision != "bf16-mixed" or optimizer != "adamw":
        return (f"--framework megatron with --precision {precision} --optimizer {optimizer}: the realistic accounting "
                "models --bf16 (bf16-mixed: bf16 parameters, fp32 master) with Adam")
    if lora is not None or offload != ("none", "none") or getattr(work, "compile", False):
        return "--framework megatron: LoRA, offload and --compile are not modelled by the realistic accounting"
    from memcalc.memory.families.megatron_saved import megatron_recompute

    if work.recompute not in MEGATRON_RECOMPUTE and not megatron_recompute(work.recompute):
        return (f"--framework megatron with --recompute {work.recompute}: the realistic accounting models none, "
                "selective (core_attn), full (uniform, one layer per checkpoint), selective:MODULES, "
                "full:uniform:N and full:block:N")
    if work.attention == "eager" or getattr(work, "loss", "standard") != "standard":
        return ("--framework megatron: the realistic accounting models Transformer Engine's fused attention (flash, "
                "sdpa) and Megatron's vocab-parallel cross-entropy (--loss standard)")
    if arch.tied_embeddings or arch.norm_placement != "pre" or arch.parallel_block or arch.qk_norm_width != "head":
        return ("--framework megatron: the realistic accounting models pre-norm GPT layers (qk_layernorm per head or "
                "none) with an untied output layer (Llama-, Mixtral-, Qwen3-style)")
    if tp > 1 and (arch.heads % tp or arch.n_kv % tp):
        return f"--tp {tp} must divide heads ({arch.heads}) and kv heads ({arch.n_kv})"
    return None
