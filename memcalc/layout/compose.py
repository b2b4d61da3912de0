"""How each training framework composes data, context and pipeline parallelism: the ranks that shard the model
states, and how decoder layers are split over pipeline stages.

Shard group (the ranks one copy of the model states is sharded over), read in each framework's source:
- torchtitan: FSDP2 over the flattened ``dp_shard_cp`` mesh dimension, which "includes ``cp`` even if ``cp`` is 1"
  (torchtitan/distributed/parallel_dims.py ``build_mesh``; torchtitan/models/llama3/infra/parallelize.py applies
  ``fully_shard`` on ``("dp_replicate", "dp_shard_cp")`` for HSDP, ``("dp_shard_cp",)`` otherwise).
- Megatron-LM: the distributed optimizer shards over ``get_data_parallel_group(with_context_parallel=True)``
  (megatron/core/optimizer/__init__.py ``get_megatron_optimizer``), and DDP reduces gradients over the same group
  (megatron/core/distributed/distributed_data_parallel.py).
- DeepSpeed (Ulysses sequence parallelism): ZeRO partitions over ``seq_data_parallel_group`` = dp x sp
  (deepspeed/runtime/engine.py ``_configure_zero_optimizer``: ``dp_process_group=self.seq_data_parallel_group``).
- Hugging Face (Trainer through accelerate): ``ParallelismConfig`` builds the FSDP2 mesh ``dp_shard_cp`` from
  dp_shard x cp (src/accelerate/parallelism_config.py ``dp_shard_cp_dim_names``, ``build_device_mesh``);
  context parallelism there needs FSDP2.
- torchtune: ``ParallelDims(dp_replicate, dp_shard, tp)`` has no context or pipeline dimension
  (torchtune/training/_distributed.py): it shards over dp only, and cannot run --cp or --pp.
Every framework that runs context parallelism shards over dp x cp, so ``dp-cp`` is memcalc's default too; ``dp``
remains as an override (``--shard-over dp``) for a layout that replicates states across the context ranks.

Pipeline split (decoder layers per stage, embedding on the first, final norm + head on the last):
- torchtitan: ``generate_llm_fqn_per_model_part`` (torchtitan/distributed/pipeline_parallel.py) weighs the input
  and output modules as ``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers`` layers
  (default 1 each), splits L + 2 evenly, extra units to the first stages, and takes the weights off the first and
  last stage; stage ids go to ranks in ``loop`` style (rank k runs stages k, k + pp, ...; ``stage_ids_this_rank``).
- Megatron-LM: an even split; uneven only with ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers`` (megatron/core/transformer/transformer_block.py
  ``get_num_layers_to_build``), which memcalc takes as an explicit ``--stage-layers``.
- DeepSpeed: ``PipelineModule(partition_method="parameters")`` balances parameter counts of the user's layer specs
  (deepspeed/runtime/pipe/module.py); memcalc splits evenly and asks for ``--stage-layers`` otherwise.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

from memcalc.errors import InputError, did_you_mean, shown
from memcalc.frozen import frozen

FSDP_WRAPS = ("root", "separate", "separate-reshard")
"""Where FSDP2's units put the embedding and the head (every decoder layer is a unit of its own in all three):
root: in the root, with the final norm, gathered from the forward's start to the root's post-backward (``fully_shard``
per layer, then on the model; accelerate before April 2026; torchtitan up to v0.1.0 ``apply_fsdp``); separate: the
embedding a unit resharded after its forward, the final norm and the head one unit kept gathered from its forward to
its post-backward (torchtitan since July 2025, v0.2.0 on: ``fully_shard([model.norm, model.output],
reshard_after_forward=False)``; accelerate 1.15's FSDP2); separate-reshard:
the embedding and the head each a unit resharded after its forward, the final norm in the root (torchtune's
``custom_sharded_layers: ['tok_embeddings', 'output']``, ``training.shard_model``). A tied embedding and head share
one weight, which FSDP2 cannot put in two units: root only."""
SHARD_OVER = ("dp", "dp-cp")
"""dp: the data-parallel ranks only; dp-cp: the data x context ranks, as one flattened group."""
DEFAULT_SHARD_OVER = "dp-cp"
MAX_STAGES = 100_000
"""Entries of --stage-layers at most: 10x memcalc.model.architecture.MAX_LAYERS (stages may hold no layer)."""


@frozen
class Framework:
    """What one framework's composition decides."""

    name: str
    shard_over: str
    """The group model states are sharded over (and gradients reduced over): dp or dp-cp."""
    context_parallel: bool
    """Whether it runs context (sequence) parallelism at all."""
    pipeline: str
    """none (no pipeline parallelism), weighted (torchtitan's split), even (Megatron, DeepSpeed)."""
    uneven: str
    """What it does when the layers do not divide the stages (for the one-line refusal), or "" when it splits."""
    model_code: str = "hf"
    """Whose model code runs the layers: hf (Hugging Face's modeling files, which the Trainer, accelerate and
    DeepSpeed users run), torchtitan (its Llama 3: ``memcalc.memory.families.saved._torchtitan_layer``) or megatron (fused
    kernels); it decides the saved tensors and the element-wise bytes of the step time."""
    dtensor_tp: bool = False
    """Tensor parallelism as DTensor runs it: under sequence parallelism the gathered q/k/v and MLP inputs are saved
    whole (``memcalc.memory.accountings.activations.DTENSOR_GATHERED``); False: Megatron's 1/t shard."""
    fsdp_reduce_fp32: bool = False
    """FSDP reduces gradients in fp32 under a master copy (torchtitan's ``mixed_precision_reduce = "float32"``,
    torchtitan config/configs.py)."""
    fsdp_in_pipeline: bool = False
    """FSDP2 inside torch.distributed.pipelining stages (``memcalc.memory.accountings.paper.pipeline_fsdp_rows``)."""
    compiles_plain_loss: bool = True
    """Under --compile the loss is compiled too (a compiled Hugging Face model has its loss in the graph).
    torchtune's recipes call ``training.compile_loss(loss_fn)`` and drop what it returns
    (recipes/full_finetune_single_device.py), which compiles a chunked cross-entropy in place but leaves a plain loss
    eager. Every torchtitan release compiles the loss with the model: v0.1.0 under ``training.compile``
    (components/loss.py ``build_cross_entropy_loss``, since commit bbb1b616e of 2025-04-02), v0.2.0-v0.2.2 when
    ``compile.components`` lists it, which it does by default; the commits before, the Dec-2024 published
    benchmark's (9dec370) among them, compiled the model only (--no-compile-loss)."""
    compiles_chunked_loss: bool = True
    """The same for a chunked cross-entropy (torchtune compiles it in place; torchtitan as above)."""
    fsdp_wrap: str = "root"
    """Where its FSDP2 units put the embedding and the head (``FSDP_WRAPS``): torchtitan's ``apply_fsdp`` since
    v0.2.0 separate; torchtune's distributed recipes with ``custom_sharded_layers: ['tok_embeddings', 'output']``
    (recipes/configs/llama3_1/70B_full.yaml, 8B_full.yaml) separate-reshard; accelerate's FSDP2 (1.15,
    ``fsdp_utils.fsdp2_prepare_model``, its PR #4015 of April 2026) carves the embedding (resharded after forward)
    and [final norm, head] (kept gathered) into units of their own after the decoder layers: separate (with tied
    embeddings one [norm, embedding, head] unit kept gathered: root)."""
    main_grads_fp32: bool = False
    """Gradients accumulated and reduced in an fp32 buffer under bf16 parameters: Megatron-LM's ``--bf16`` sets
    ``accumulate_allreduce_grads_in_fp32`` unless ``--grad-reduce-in-bf16`` (megatron/training/arguments.py), and its
    DDP then makes the grad buffer ``torch.float`` (megatron/core/distributed/param_and_grad_buffer.py): 4 bytes per
    parameter, whole even under the distributed optimizer (docs/source/api-guide/dist_optimizer.md: 6 + 12/d bytes
    per parameter with bf16 parameters and fp32 gradients, 18 without)."""
    fsdp_versions: tuple[int, ...] = (1, 2)
    """The FSDP versions it can wrap with under --fsdp, its default first: torchtitan has FSDP2 alone
    (``fully_shard`` in torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``; no FullyShardedDataParallel)."""
    optimizer_impl: str = "foreach"
    """The AdamW its configs run when --optimizer-impl is not given: torch's foreach (the default on CUDA, what the
    Hugging Face Trainer's ``adamw_torch`` gets); torchtitan ``implementation = "fused"``
    (components/optimizer/optimizer.py); torchtune's recipes ``torch.optim.AdamW(fused=True)``
    (recipes/configs/llama3_2/3B_full.yaml); Megatron's and DeepSpeed's fused Adam kernels (apex/TE ``FusedAdam``,
    ``deepspeed.ops.adam.FusedAdam``): no parameter-sized temporaries."""


FRAMEWORKS: dict[str, Framework] = {
    "hf": Framework("hf", "dp-cp", True, "none", "", dtensor_tp=True, fsdp_wrap="separate"),
    "torchtitan": Framework("torchtitan", "dp-cp", True, "weighted", "", model_code="torchtitan", dtensor_tp=True,
                            fsdp_reduce_fp32=True, fsdp_in_pipeline=True, optimizer_impl="fused", fsdp_wrap="separate",
                            fsdp_versions=(2,)),
    "torchtune": Framework("torchtune", "dp", False, "none", "", optimizer_impl="fused", compiles_plain_loss=False,
                           fsdp_wrap="separate-reshard"),
    "megatron": Framework("megatron", "dp-cp", True, "even",
                          "Megatron-LM splits layers evenly unless the first and last stages are given "
                          "(--decoder-first/last-pipeline-num-layers)", model_code="megatron", optimizer_impl="fused",
                          main_grads_fp32=True),
    "deepspeed": Framework("deepspeed", "dp-cp", True, "even",
                           "DeepSpeed's PipelineModule balances the parameters of your layer specs "
                           "(partition_method='parameters'), which memcalc does not replay", optimizer_impl="fused"),
}  # fmt: skip
UNNAMED = Framework("", "dp-cp", True, "even", "", fsdp_in_pipeline=True)
"""No --framework: Hugging Face's model code, Korthikanti's (Megatron's) tensor-parallel activations, FSDP as
torch's pipelining runs it."""


def composition(name: str | None) -> Framework:
    """What the plan's framework (a name the inputs checked, or None) decides."""
    return UNNAMED if name is None else FRAMEWORKS[name]


def framework(name: str | None) -> Framework | None:
    """The framework named ``name`` (None: none given), or one InputError line listing the known ones."""
    if name is None:
        return None
    key = name.strip().lower() if isinstance(name, str) and len(name) < 100 else ""
    if key not in FRAMEWORKS:
        raise InputError(f"--framework {shown(name)} is not known{did_you_mean(key, FRAMEWORKS)}; accepted: "
                         f"{', '.join(FRAMEWORKS)}")  # fmt: skip
    return FRAMEWORKS[key]


def check_framework(fw: Framework | None, cp: int, pp: int) -> None:
    """Refuse a layout the framework cannot run, naming the frameworks that can."""
    if fw is None:
        return
    if cp > 1 and not fw.context_parallel:
        can = ", ".join(n for n, f in FRAMEWORKS.items() if f.context_parallel)
        raise InputError(f"--framework {fw.name} has no context parallelism (--cp {cp}); use --cp 1, or one of: {can}")
    if pp > 1 and fw.pipeline == "none":
        can = ", ".join(n for n, f in FRAMEWORKS.items() if f.pipeline != "none")
        raise InputError(f"--framework {fw.name} has no pipeline parallelism for training (--pp {pp}); use --pp 1, "
                         f"or one of: {can}")  # fmt: skip


def shard_over(given: str | None, fw: Framework | None) -> str:
    """The group that shards: the override, else the framework's, else dp x cp (what every CP framework does)."""
    if given is not None:
        if given not in SHARD_OVER:
            raise InputError(f"--shard-over {shown(given)} is not accepted; accepted: {', '.join(SHARD_OVER)}")
        return given
    return fw.shard_over if fw is not None else DEFAULT_SHARD_OVER


def fsdp_version(given: int | None, fw: Framework | None, fsdp: bool) -> int:
    """--fsdp-version: the one given, else the framework's default under --fsdp (torchtitan: 2), else 1; one line
    when the framework has no such FSDP."""
    runs = (1, 2) if fw is None else fw.fsdp_versions
    if given is None:
        return runs[0] if fsdp else 1
    if fsdp and given not in runs:
        raise InputError(f"--fsdp-version {given}: --framework {fw.name} has no FSDP{given} (it wraps with "  # type: ignore[union-attr]
                         f"{' or '.join(f'FSDP{v}' for v in runs)}); accepted: {', '.join(map(str, runs))}, or leave "
                         "--fsdp-version out")
    return given


def check_wrap(given: object) -> str:
    """``--fsdp-wrap``: one of ``FSDP_WRAPS``, or one InputError line naming them."""
    if given not in FSDP_WRAPS:
        raise InputError(f"--fsdp-wrap {shown(given)} is not accepted{did_you_mean(str(given), FSDP_WRAPS)}; "
                         f"accepted: {', '.join(FSDP_WRAPS)}")
    return given  # type: ignore[return-value]


def fsdp_wrap(given: str | None, fw: Framework | None, tied: bool) -> str:
    """Where FSDP2's units put the embedding and the head: the override, else the framework's, else root; a tied
    embedding stays in the root (the override cannot move it: one line)."""
    if given is not None:
        check_wrap(given)
        if tied and given != "root":
            raise InputError(f"--fsdp-wrap {given}: this model ties its embedding and head (one weight), which FSDP2 "
                             "cannot put in two units; accepted for tied embeddings: root")
        return given
    return "root" if fw is None or tied else fw.fsdp_wrap


def torchtitan_split(stages: int, layers: int, input_weight: int = 1, output_weight: int = 1) -> tuple[int, ...]:
    """Decoder layers per stage as torchtitan's ``generate_llm_fqn_per_model_part`` assigns them
    (torchtitan/distributed/pipeline_parallel.py): the embedding counts as ``input_weight`` layers on the first
    stage, norm + output as ``output_weight`` on the last; L + weights split evenly, the remainder to the first
    stages. 126 layers over 8 stages: 128 units, 16 each: 15, 16 x 6, 15."""
    if stages == 1:
        return (layers,)
    units = layers + input_weight + output_weight
    per, extra = divmod(units, stages)
    if per == 0 or input_weight > per or output_weight > per:
        raise InputError(f"torchtitan cannot split {layers} layers (+{input_weight} input, +{output_weight} output) "
                         f"over {stages} stages: each stage needs at least one unit and more than the input/output "
                         f"weight; give fewer stages or --stage-layers")  # fmt: skip
    out, left = [], layers
    for k in range(stages):
        n = per + (1 if k < extra else 0)
        n -= input_weight if k == 0 else output_weight if k == stages - 1 else 0
        n = min(n, left)
        out.append(n)
        left -= n
    return tuple(out)


def check_stage_layers(stage_layers: tuple[int, ...], layers: int, pp: int, virtual: int) -> None:
    """``--stage-layers``: pp x virtual_stages entries, each >= 0, adding up to the model's layers."""
    want = pp * virtual
    if len(stage_layers) != want:
        raise InputError(f"--stage-layers has {len(stage_layers)} entries; accepted: pp({pp}) x virtual_stages("
                         f"{virtual}) = {want} entries adding up to layers({layers})")  # fmt: skip
    if any(n < 0 or n > layers for n in stage_layers):
        raise InputError(f"--stage-layers {shown(stage_layers)} has an entry below 0 or above layers({layers}); "
                         f"accepted: {want} counts >= 0 adding up to {layers}")  # fmt: skip
    if sum(stage_layers) != layers:
        raise InputError(f"--stage-layers adds up to {sum(stage_layers)}, not layers({layers}); accepted: {want} "
                         f"counts >= 0 adding up to {layers}")  # fmt: skip


def default_split(fw: Framework | None, layers: int, pp: int, virtual: int) -> tuple[int, ...] | None:
    """Layers per stage (pp x virtual entries) as the framework splits them, or None for the even split
    (layers divisible by the stages); one InputError line when the framework would not split them."""
    stages = pp * virtual
    if pp == 1 and virtual == 1:
        return None
    if fw is not None and fw.pipeline == "weighted":
        return torchtitan_split(stages, layers)
    if layers % stages == 0:
        return None
    why = fw.uneven if fw is not None else "memcalc splits evenly unless told"
    alt = " or --framework torchtitan" if fw is None else ""
    raise InputError(f"layers({layers}) is not divisible by pp({pp}) * virtual_stages({virtual}): {why}; give "
                     f"--stage-layers (e.g. {','.join(map(str, _example(layers, stages)))}){alt}")


def _example(layers: int, stages: int) -> tuple[int, ...]:
    per, extra = divmod(layers, stages)
    return tuple(per + (1 if k < extra else 0) for k in range(stages))


def parse_stage_layers(text: str | tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    """``15,16,16`` (or a sequence of whole numbers) -> a tuple; one InputError line otherwise."""
    if text is None:
        return None
    bad = InputError(f"--stage-layers {shown(text)} is not accepted; accepted: decoder layers per stage as whole "
                     "numbers, e.g. 15,16,16,15")  # fmt: skip
    if not isinstance(text, (str, tuple, list)) or len(text) > MAX_STAGES * 8:
        raise bad
    items = text.split(",") if isinstance(text, str) else list(text)
    if len(items) > MAX_STAGES:
        raise bad
    out = []
    for x in items:
        s = x.strip() if isinstance(x, str) else x
        if isinstance(s, str) and s.lstrip("-").isdigit() and len(s) < 10:
            s = int(s)
        if not isinstance(s, int) or isinstance(s, bool):
            raise bad
        out.append(s)
    if not out:
        raise InputError("--stage-layers is empty; accepted: decoder layers per stage, e.g. 15,16,16,15")
    return tuple(out)


def chunk_starts(stage_layers: tuple[int, ...]) -> tuple[int, ...]:
    """The first decoder layer of each model chunk."""
    return (0, *accumulate(stage_layers))[:-1]


@lru_cache(maxsize=4096)
def rank_layers(stage_layers: tuple[int, ...], pp: int, rank: int) -> tuple[range, ...]:
    """The decoder layers pipeline rank ``rank`` runs, one range per model chunk: chunks rank, rank + pp, ...
    (torchtitan's ``stage_ids_this_rank`` loop style; Megatron's interleaved schedule places chunks the same way)."""
    starts = chunk_starts(stage_layers)
    return tuple(range(starts[c], starts[c] + stage_layers[c]) for c in range(rank, len(stage_layers), pp))


def default_precision(fw: Framework | None, sharding: str, model_parallel: bool) -> tuple[str, str]:
    """The training precision a run gets when none is given: the framework's own, with the reason in a few words.

    ``sharding`` is the strategy's framework (``ddp``, ``deepspeed`` for ZeRO, ``fsdp``); ``model_parallel``: tp or
    pp above 1. Read in each framework's source:
    - Hugging Face Trainer and accelerate, plain DDP or one GPU: ``bf16=True`` / ``mixed_precision="bf16"`` keeps
      the fp32 weights and runs the forward under ``torch.autocast`` (accelerate accelerator.py ``native_amp``):
      amp-bf16. Under FSDP accelerate's MixedPrecision policy casts the fp32 shards to bf16 (utils/dataclasses.py
      ``FullyShardedDataParallelPlugin``): bf16-mixed.
    - torchtitan: FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 shards
      (``mixed_precision_param = "bfloat16"``, ``mixed_precision_reduce = "float32"``): bf16-mixed with fp32
      reduction (``Framework.fsdp_reduce_fp32``); without FSDP ``maybe_enable_amp`` autocasts over fp32 weights on
      DDP or one GPU (amp-bf16) and runs tensor or pipeline parallelism alone in fp32 (distributed/utils.py).
    - DeepSpeed (``"bf16": {"enabled": true}``, any ZeRO stage) and Megatron-LM (``--bf16``): bf16 parameters and
      gradients, an fp32 master copy in the optimizer: bf16-mixed.
    - torchtune: ``dtype: bf16`` in its recipes' configs, parameters and AdamW states all bf16, no master: bf16.
    """
    name = fw.name if fw is not None else None
    if name == "torchtune":
        return "bf16", "torchtune's dtype: bf16 (parameters, gradients and AdamW states in bf16)"
    if name == "megatron":
        return "bf16-mixed", "Megatron-LM's --bf16 (bf16 parameters and gradients, fp32 master)"
    if name == "deepspeed" or sharding == "deepspeed":
        return "bf16-mixed", "DeepSpeed's bf16 (bf16 parameters and gradients, fp32 master)"
    if sharding == "fsdp":
        if name == "torchtitan":
            return "bf16-mixed", "torchtitan's FSDP2 (bf16 parameters over fp32 shards, fp32 reduction)"
        return "bf16-mixed", "FSDP's mixed precision (bf16 parameters over fp32 shards)"
    if name == "torchtitan":
        if model_parallel:
            return "fp32", "torchtitan without FSDP runs tensor and pipeline parallelism in fp32"
        return "amp-bf16", "torchtitan without FSDP (torch.autocast over fp32 weights)"
    return "amp-bf16", "a Hugging Face Trainer(bf16=True) or accelerate run (torch.autocast over fp32 weights)"
