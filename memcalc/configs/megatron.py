"""A Megatron-LM argument list (``pretrain_gpt.py`` options in a file, one or more a line), or Megatron-Bridge recipe
overrides (``model.tensor_model_parallel_size=4``, ``mixed_precision=bf16_with_fp8_current_scaling_mixed``), as
estimate arguments.

    >>> from memcalc.configs.megatron import read_megatron
    >>> r = read_megatron("megatron_args.txt", world_size=16, layers=32)
    >>> memcalc.estimate(**r.arguments, model="llama-3-8b")

Source: Megatron-LM megatron/training/arguments.py (``_add_distributed_args``, ``_add_training_args``,
``_add_mixed_precision_args``, ``_add_transformer_engine_args``; ``validate_args``: the data-parallel size is
world / (tp x pp x cp), the global batch micro-batch x accumulation x dp, ``--num-layers-per-virtual-pipeline-stage``
gives layers / (pp x it) model chunks per rank). The world size is the launcher's (torchrun), so it is passed in.
``#`` starts a comment; an option the table does not know is refused, naming the nearest.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from memcalc.configs import megatron_unread as unread
from memcalc.configs.megatron_bridge import overrides
from memcalc.configs.reading import Collector, ConfigReading, near, read_text

INT = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
       "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "--expert-model-parallel-size",
       "--micro-batch-size", "--global-batch-size", "--seq-length", "--recompute-num-layers",
       "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")  # fmt: skip
FLAGS = ("--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16", "--fp8-param-gather",
         "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--tp-comm-overlap",
         "--grad-reduce-in-bf16", "--defer-embedding-wgrad-compute")
CHOICES = {"--recompute-granularity": ("full", "selective"), "--recompute-method": ("uniform", "block"),
           "--fp8-format": ("e4m3", "hybrid"), "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),
           "--optimizer": ("adam", "sgd")}  # fmt: skip
IGNORED = {
    # no effect on what a GPU holds
    "--train-iters": 1, "--train-samples": 1, "--lr": 1, "--min-lr": 1, "--lr-decay-style": 1, "--lr-decay-iters": 1,
    "--lr-warmup-iters": 1, "--lr-warmup-fraction": 1, "--weight-decay": 1, "--clip-grad": 1, "--adam-beta1": 1,
    "--adam-beta2": 1, "--adam-eps": 1, "--init-method-std": 1, "--seed": 1, "--log-interval": 1, "--save-interval": 1,
    "--eval-interval": 1, "--eval-iters": 1, "--save": 1, "--load": 1, "--split": 1,
    "--tokenizer-type": 1, "--tokenizer-model": 1, "--vocab-file": 1, "--merge-file": 1, "--tensorboard-dir": 1,
    "--wandb-project": 1, "--distributed-backend": 1, "--overlap-grad-reduce": 0, "--overlap-param-gather": 0,
    "--use-mcore-models": 0, "--transformer-impl": 1, "--attention-backend": 1, "--use-flash-attn": 0,
    # the model's shape: memcalc takes it from --model
    "--num-layers": 1, "--hidden-size": 1, "--ffn-hidden-size": 1, "--num-attention-heads": 1,
    "--group-query-attention": 0, "--num-query-groups": 1, "--max-position-embeddings": 1,
    "--position-embedding-type": 1, "--normalization": 1, "--swiglu": 0, "--untie-embeddings-and-output-weights": 0,
    "--disable-bias-linear": 0, "--rotary-base": 1, "--make-vocab-size-divisible-by": 1, "--kv-channels": 1,
    "--add-qkv-bias": 0, "--qk-layernorm": 0, "--num-experts": 1, "--moe-router-topk": 1, "--moe-ffn-hidden-size": 1,
}  # fmt: skip
"""Options read past (1: takes a value, 0: a bare flag)."""
COUNTS = ("--wgrad-deferral-limit",)
"""Options taking a whole number of 0 or more (``--wgrad-deferral-limit`` 0: every micro-batch)."""
KNOWN = (*INT, *COUNTS, *FLAGS, *CHOICES, *IGNORED, "--recompute-modules")


def _tp_comm_overlap(c: Collector, values: dict[str, Any], tp: int) -> None:
    """``--tp-comm-overlap``: Transformer Engine's userbuffers overlap the tensor-parallel all-gathers and
    reduce-scatters with the GEMMs, as memcalc's step time for Megatron-Core counts them (``memcalc.time.kernels``);
    Megatron-LM refuses it without sequence parallelism (megatron/training/arguments.py: "Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is enabled")."""
    if not values.get("--tp-comm-overlap"):
        return
    if tp == 1:
        c.ignore("--tp-comm-overlap", "no tensor parallelism (--tensor-model-parallel-size 1)")
    elif not values.get("--sequence-parallel"):
        raise c.fail("--tp-comm-overlap", "needs --sequence-parallel (Megatron-LM: the overlap runs on the sequence-"
                                          "parallel all-gathers and reduce-scatters)")
    else:
        c.note("--tp-comm-overlap: the step time overlaps the tensor-parallel collectives with the GEMMs; the "
               "userbuffers' communication buffers Transformer Engine allocates outside PyTorch's caching allocator "
               "(one per overlapped GEMM, sequence x micro-batch x hidden each) are not counted in the GPU's memory")


def _defer_wgrad(c: Collector, values: dict[str, Any], pp: int) -> None:
    """``--defer-embedding-wgrad-compute`` with ``--wgrad-deferral-limit`` (0, the default: every micro-batch): the last
    stage keeps the output layer's inputs and output gradients to the pipeline flush. Megatron-Core refuses it
    without pipeline parallelism or without gradient-accumulation fusion (model_parallel_config.py)."""
    limit = values.get("--wgrad-deferral-limit")
    if not values.get("--defer-embedding-wgrad-compute"):
        if limit is not None:
            c.ignore("--wgrad-deferral-limit", "read with --defer-embedding-wgrad-compute only")
        return
    if pp == 1:
        raise c.fail("--defer-embedding-wgrad-compute", "needs pipeline parallelism (Megatron-Core: \"Cannot defer "
                                                        "embedding wgrad compute when pipeline model parallel is not "
                                                        "used\")")
    if "--no-gradient-accumulation-fusion" in c.mentioned():
        raise c.fail("--defer-embedding-wgrad-compute", "with --no-gradient-accumulation-fusion: Megatron-Core refuses "
                                                        "it without gradient-accumulation fusion")
    c.arguments["defer_embedding_wgrad"] = limit or 0


def read_megatron(path: str | os.PathLike[str], *, world_size: int | None = None,
                  layers: int | None = None) -> ConfigReading:  # fmt: skip
    """Read a Megatron-LM argument list into ``memcalc.estimate`` arguments. ``world_size``: GPUs in the job (the
    launcher's); ``layers``: the model's decoder layers (for ``--num-layers-per-virtual-pipeline-stage``)."""
    text, name = read_text(path, "Megatron-LM arguments")
    c = Collector(name, "megatron")
    values = _parse(c, text)
    get = values.get
    tp, pp, cp, ep = (get(k, 1) for k in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                           "--context-parallel-size", "--expert-model-parallel-size"))  # fmt: skip
    c.arguments.update(framework="megatron", stage=1 if get("--use-distributed-optimizer") else 0)
    for value, arg in ((tp, "tp"), (pp, "pp"), (cp, "cp"), (ep, "ep")):
        if value > 1:
            c.arguments[arg] = value
    if get("--sequence-parallel"):
        c.arguments["sequence_parallel"] = True
    _tp_comm_overlap(c, values, tp)
    _defer_wgrad(c, values, pp)
    _virtual(c, values, pp, layers)
    _split(c, values, pp, c.arguments.get("virtual_stages", 1), layers)
    c.arguments["precision"] = "bf16-mixed" if get("--bf16") else "fp16-mixed" if get("--fp16") else "fp32"
    if get("--bf16") and get("--fp16"):
        raise c.fail("--fp16", "and --bf16 both given; Megatron-LM accepts one")
    if get("--grad-reduce-in-bf16"):
        # megatron/training/arguments.py: --bf16 turns accumulate_allreduce_grads_in_fp32 on unless this is given
        if get("--bf16"):
            c.arguments["grad_reduce_dtype"] = "bf16"
        else:
            c.ignore("--grad-reduce-in-bf16", "without --bf16 the gradient buffer is already the parameters' dtype")
    _fp8(c, values)
    _recompute(c, values)
    if get("--optimizer") == "sgd":
        c.arguments["optimizer"] = "sgd-momentum"
    _batch(c, values, world_size, tp * pp * cp)
    if c.any_unmodelled:  # what the realistic accounting would count wrong: the paper's answers, and says why
        c.arguments["accounting"] = "paper"
        c.note("the paper accounting answers: the realistic accounting (memory/accountings/megatron.py) does not model the "
               "options listed as not modelled; give --accounting realistic to count them as it says")
    return c.freeze()


def _parse(c: Collector, text: str) -> dict[str, Any]:
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    try:
        tokens = shlex.split(" ".join(lines))
    except ValueError as e:
        raise c.fail("", f"cannot split into options ({e})") from None
    tokens = overrides(c, tokens, FLAGS)
    values: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        opt = tokens[i]
        if not opt.startswith("--"):
            raise c.fail(opt, "is not an option; each option starts with --")
        opt, _, inline = opt.partition("=")
        if opt not in KNOWN:
            i = _unread(c, opt, inline, tokens, i)
            continue
        if opt == "--recompute-modules":  # nargs="*": the words up to the next option
            words = []
            while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                words.append(tokens[i + 1])
                i += 1
            words += [w for w in inline.split(",") if w] if inline else []
            if opt in values:
                raise c.fail(opt, "is given twice; give each option once")
            c.used(opt)
            values[opt] = tuple(words)
            i += 1
            continue
        takes = opt in INT or opt in COUNTS or opt in CHOICES or IGNORED.get(opt) == 1
        value: Any = True
        if takes:
            value = inline or (tokens[i + 1] if i + 1 < len(tokens) else None)
            if value is None or (not inline and str(value).startswith("--")):
                raise c.fail(opt, "needs a value")
            i += 0 if inline else 1
        if opt in values:
            raise c.fail(opt, "is given twice; give each option once")
        values[opt] = _value(c, opt, value)
        i += 1
    return values


def _unread(c: Collector, opt: str, inline: str, tokens: list[str], i: int) -> int:
    """An option memcalc does not read at ``tokens[i]``: Megatron-LM's (``memcalc.configs.megatron_unread``) is read
    past, its words taken as argparse takes them, and listed as ignored or as not modelled; any other is one line.
    Returns the index of the next option."""
    words = unread.arity(opt)
    got: list[str] = [inline] if inline else []
    if words and not inline:
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--") and (words < 0 or len(got) < words):
            got.append(tokens[i + 1])
            i += 1
    kind = unread.classify(opt, got[0] if got else None)
    if kind is None:
        from memcalc.configs.megatron_vocabulary import GROUPS

        every = (*KNOWN, *(o for names in GROUPS.values() for o in names))
        raise c.fail(opt, f"unknown option{near(opt, every) or ' (not a Megatron-LM option)'}")
    if words > 0 and not got:
        raise c.fail(opt, "needs a value")
    if opt in c.mentioned():
        raise c.fail(opt, "is given twice; give each option once")
    (c.ignore if kind[0] == "ignored" else c.unmodelled)(opt, kind[1])
    return i + 1


def _value(c: Collector, opt: str, value: Any) -> Any:
    if opt in INT or opt in COUNTS:
        least = 0 if opt in COUNTS else 1
        if not str(value).isdigit() or int(value) < least:
            raise c.fail(opt, f"{value!r} is not accepted; accepted: a whole number of {least} or more")
        c.used(opt)
        return int(value)
    if opt in CHOICES:
        if value not in CHOICES[opt]:
            raise c.fail(opt, f"{value!r} is not accepted{near(value, CHOICES[opt])}; accepted: "
                              f"{', '.join(CHOICES[opt])}")
        c.used(opt)
        return value
    if opt in FLAGS:
        c.used(opt)
        return True
    c.ignore(opt, "the model's shape comes from --model" if opt in _SHAPE else "no effect on the memory held")
    return value


_SHAPE = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
          "--num-query-groups", "--max-position-embeddings", "--position-embedding-type", "--normalization",
          "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--rotary-base",
          "--make-vocab-size-divisible-by", "--kv-channels", "--add-qkv-bias", "--qk-layernorm", "--num-experts",
          "--moe-router-topk", "--moe-ffn-hidden-size")  # fmt: skip


def _virtual(c: Collector, values: dict[str, Any], pp: int, layers: int | None) -> None:
    per = values.get("--num-layers-per-virtual-pipeline-stage")
    chunks = values.get("--num-virtual-stages-per-pipeline-rank")
    if per is not None and chunks is not None:
        raise c.fail("--num-virtual-stages-per-pipeline-rank", "and --num-layers-per-virtual-pipeline-stage both "
                                                               "given; Megatron-LM accepts one")  # fmt: skip
    if per is not None:
        if layers is None:
            raise c.fail("--num-layers-per-virtual-pipeline-stage", "needs the model's layers: give --model")
        if layers % (pp * per):
            raise c.fail("--num-layers-per-virtual-pipeline-stage", f"{per}: layers({layers}) is not a multiple of "
                                                                    f"pp({pp}) x {per}")  # fmt: skip
        chunks = layers // (pp * per)
    if chunks is not None and chunks > 1:
        if pp == 1:
            raise c.fail("--pipeline-model-parallel-size", "is 1; an interleaved schedule needs 2 or more")
        c.arguments["virtual_stages"] = chunks


def _split(c: Collector, values: dict[str, Any], pp: int, v: int, layers: int | None) -> None:
    """An uneven pipeline split as memcalc's --stage-layers (one entry per global stage, chunk c of rank r at
    c·pp + r), as megatron/core/transformer/transformer_block.py ``get_num_layers_to_build`` builds it: the first
    (last) rank's layers given, the others' even, each rank's split over its v chunks; or the embedding (loss)
    counted as one layer of the first (last) chunk."""
    get = values.get
    first, last = get("--decoder-first-pipeline-num-layers"), get("--decoder-last-pipeline-num-layers")
    emb = bool(get("--account-for-embedding-in-pipeline-split"))
    loss = bool(get("--account-for-loss-in-pipeline-split"))
    if first is None and last is None and not emb and not loss:
        return
    opt = next(o for o, on in (("--decoder-first-pipeline-num-layers", first is not None),
                               ("--decoder-last-pipeline-num-layers", last is not None),
                               ("--account-for-embedding-in-pipeline-split", emb),
                               ("--account-for-loss-in-pipeline-split", loss)) if on)
    if layers is None:
        raise c.fail(opt, "needs the model's layers: give --model")
    if (first is not None or last is not None) and (emb or loss):
        raise c.fail(opt, "with --account-for-embedding/loss-in-pipeline-split: Megatron-Core refuses both")
    if first is not None or last is not None:
        left = pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        if rest < 0 or (left > 0 and rest % left) or (left == 0 and rest):
            raise c.fail(opt, f"leaves {rest} layers for {left} middle stages; Megatron-Core needs them to divide")
        ranks = [rest // left if left else 0] * pp
        if first is not None:
            ranks[0] = first
        if last is not None:
            ranks[-1] = last
    else:
        units = layers + emb + loss
        if units % pp:
            raise c.fail(opt, f"layers({layers}) + {emb + loss} is not a multiple of pp({pp})")
        ranks = [units // pp] * pp
    if any(n % v for n in ranks):
        raise c.fail(opt, f"a rank's {next(n for n in ranks if n % v)} layers do not split over {v} virtual stages")
    split = [ranks[g % pp] // v for g in range(pp * v)]
    split[0] -= emb
    split[-1] -= loss
    if min(split) < 0:
        raise c.fail(opt, "leaves a chunk with fewer than no layers")
    c.arguments["stage_layers"] = split


def _fp8(c: Collector, values: dict[str, Any]) -> None:
    if "--fp8-format" not in values:
        if "--fp8-recipe" in values:
            c.ignore("--fp8-recipe", "no --fp8-format: fp8 is off")
        if "--fp8-param-gather" in values:
            c.ignore("--fp8-param-gather", "no --fp8-format: fp8 is off")
        return
    recipe = values.get("--fp8-recipe", "delayed")
    if recipe == "delayed":
        c.note("--fp8-recipe delayed: per-tensor FP8 as tensorwise (current scaling) holds it, the same one-byte "
               "copies and cached weights; its amax histories (1024 fp32 per quantizer) are a few KiB a layer")
    elif recipe != "tensorwise":
        c.unmodelled("--fp8-recipe", f"{recipe} scaling (its scale tensors and Hopper's layouts are not modelled: "
                                     "counted as tensorwise)")
    c.arguments["float8"] = "tensorwise"
    if values.get("--fp8-param-gather"):
        c.arguments["float8_all_gather"] = True


def _recompute(c: Collector, values: dict[str, Any]) -> None:
    """megatron/training/arguments.py: ``--recompute-granularity selective`` with ``--recompute-modules`` (default
    core_attn), or ``full`` with ``--recompute-method uniform|block`` and ``--recompute-num-layers`` (default 1)."""
    from memcalc.memory.families.megatron_saved import MODULES as MEGATRON_MODULES

    granularity = values.get("--recompute-granularity")
    method, n = values.get("--recompute-method"), values.get("--recompute-num-layers")
    modules = values.get("--recompute-modules")
    if granularity is None:
        for opt in ("--recompute-method", "--recompute-num-layers"):
            if opt in values:
                raise c.fail(opt, "needs --recompute-granularity full (Megatron-LM refuses it alone)")
        c.arguments["recompute"] = "none"
    elif granularity == "selective":
        mods = modules or ("core_attn",)
        unknown = [m for m in mods if m not in MEGATRON_MODULES]
        if unknown:
            c.unmodelled("--recompute-modules", f"{' '.join(unknown)} (recomputed modules memcalc does not model: "
                                                "counted as kept)")
        kept = [m for m in mods if m in MEGATRON_MODULES]
        c.arguments["recompute"] = ("selective" if kept == ["core_attn"] else
                                    "selective:" + "+".join(kept) if kept else "none")
    elif method is None:
        raise c.fail("--recompute-granularity", "full needs --recompute-method uniform or block")
    else:
        k = 1 if n is None else n
        c.arguments["recompute"] = "full" if (method, k) == ("uniform", 1) else f"full:{method}:{k}"
        if modules:
            c.ignore("--recompute-modules", "read with --recompute-granularity selective only")


def _batch(c: Collector, values: dict[str, Any], world: int | None, mp: int) -> None:
    micro = values.get("--micro-batch-size", 1)
    seq = values.get("--seq-length")
    if seq is None:
        raise c.fail("--seq-length", "is missing; Megatron-LM needs it")
    c.arguments.update(micro_batch=micro, seq_len=seq)
    glob = values.get("--global-batch-size")
    if world is None:
        c.note("the world size is the launcher's: give --gpus")
        return
    if world % mp:
        raise c.fail("--tensor-model-parallel-size", f"tp x pp x cp = {mp} does not divide the world size {world}")
    dp = world // mp
    c.arguments["gpus"] = world
    if glob is None:
        return
    if glob % (micro * dp):
        raise c.fail("--global-batch-size", f"{glob} is not micro-batch({micro}) x dp({dp}) x a whole number of "
                                            "accumulation steps")  # fmt: skip
    if glob > micro * dp:
        c.arguments["grad_accum"] = glob // (micro * dp)
