"""The layouts a framework can run for one job: what ``memcalc plan`` searches, as plain ``estimate`` keywords.

Each framework's space is a row of ``SPACES`` (data, not code): the sharding strategies it offers, whether it runs
tensor, pipeline and context parallelism and how (sequence parallelism with TP, virtual pipeline stages), its
recompute policies and its default precision. ``settings`` walks every dp x tp x pp x cp (x ep) factorisation of a
GPU count against that row; ``micro_batches`` gives the micro-batch / accumulation pairs that make the global batch.
What a framework's own code refuses is not proposed; what memcalc's inputs refuse (a head count tp does not divide,
say) is left to ``memcalc.build_input``, whose one-line reason the search counts.

Sources, per framework:
- torchtitan (torchtitan/models/llama3/infra/parallelize.py, torchtitan/distributed/parallel_dims.py): FSDP2 over
  ``dp_shard_cp`` (FULL_SHARD) or ``dp_replicate x dp_shard_cp`` (HSDP); DDP only as the one parallelism (``apply_ddp``
  raises "DDP has not supported > 1D parallelism"); tensor parallelism always with its sequence-parallel plan; pipeline
  schedules 1F1B and Interleaved1F1B (two stages per rank); context parallelism; activation checkpointing
  ``none``, ``selective`` per op (op-sac) and ``full``; bf16 parameters with fp32 reduction.
- Megatron-LM (megatron/training/arguments.py): DDP or the distributed optimizer (``--use-distributed-optimizer``,
  memcalc's ``--stage 1`` under ``--framework megatron``), ``--sequence-parallel`` with TP, interleaved pipelines
  (``--num-layers-per-virtual-pipeline-stage``), context parallelism, ``--recompute-granularity selective`` with
  its default modules (core_attn) or ``--recompute-modules core_attn mlp``, and ``full`` (uniform, one layer), and
  expert parallelism (``--expert-model-parallel-size``) for MoE models.
- DeepSpeed (deepspeed/runtime/zero/config.py): ZeRO stages 0-3 over the data-parallel ranks,
  ``activation_checkpointing`` (full); its pipeline engine needs a ``PipelineModule`` and its tensor parallelism
  another library, so neither is searched.
- Hugging Face Trainer through accelerate (accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin,
  accelerate/parallelism_config.py): DDP, FSDP1 FULL_SHARD / SHARD_GRAD_OP, FSDP2 FULL_SHARD / HYBRID_SHARD, DTensor
  tensor parallelism (``tp_size``) and context parallelism under FSDP2, ``gradient_checkpointing`` (full); no pipeline
  for training; ``Trainer(bf16=True)`` is autocast over fp32 weights (amp-bf16).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

PLAN_FRAMEWORKS = ("torchtitan", "megatron", "deepspeed", "hf")
"""The frameworks ``--framework any`` searches, in this order."""


@dataclass(frozen=True)
class Space:
    """What one framework can run (the estimate keywords of each choice)."""

    strategies: tuple[tuple[tuple[str, object], ...], ...]
    """The sharding strategies, each as estimate keywords (``(("fsdp", "FULL_SHARD"), ("fsdp_version", 2))``)."""
    recompute: tuple[str, ...]
    precision: str
    tp: bool = False
    sequence_parallel: bool = False
    """Sequence parallelism whenever tp > 1 (torchtitan's plan, Megatron's recommended setting)."""
    pp: bool = False
    virtual: tuple[int, ...] = (1,)
    """Model chunks per pipeline rank it runs (interleaved 1F1B: 2)."""
    cp: bool = False
    ep: bool = False
    model_parallel_strategies: tuple[int, ...] | None = None
    """Indices into ``strategies`` allowed with tp, pp or cp > 1 (None: all)."""
    offload: tuple[tuple[tuple[str, object], ...], ...] = ()
    """Strategies with offload, tried only when nothing else fits."""


_FSDP2 = (("fsdp_version", 2),)
_FSDP_MP = ("precision", "bf16-mixed")
"""accelerate's mixed_precision bf16 under FSDP: its MixedPrecision policy casts fp32 shards to bf16 (accelerate
utils/dataclasses.py FullyShardedDataParallelPlugin; memcalc.configs.accelerate.PRECISIONS), where DDP runs autocast
over fp32 weights (amp-bf16, the space's precision)."""
SPACES: dict[str, Space] = {
    "torchtitan": Space(
        strategies=((("fsdp", "FULL_SHARD"), *_FSDP2), (("fsdp", "HYBRID_SHARD"), *_FSDP2), (("ddp", True),)),
        recompute=("none", "op-sac", "full"), precision="bf16-mixed", tp=True, sequence_parallel=True, pp=True,
        virtual=(1, 2), cp=True, model_parallel_strategies=(0, 1),
        offload=((("fsdp", "FULL_SHARD"), *_FSDP2, ("offload_params", "cpu")),)),
    "megatron": Space(
        strategies=((("stage", "1"),), (("stage", "0"),)),
        recompute=("none", "selective", "selective:core_attn+mlp", "full"),
        precision="bf16-mixed", tp=True, sequence_parallel=True, pp=True, virtual=(1, 2), cp=True, ep=True),
    "deepspeed": Space(
        strategies=tuple(((("stage", str(k)),)) for k in range(4)), recompute=("none", "full"),
        precision="bf16-mixed",
        offload=((("stage", "3"), ("offload_optimizer", "cpu")), (("stage", "2"), ("offload_optimizer", "cpu")),
                 (("stage", "3"), ("offload_optimizer", "cpu"), ("offload_params", "cpu")))),
    "hf": Space(
        strategies=((("ddp", True),), (("fsdp", "FULL_SHARD"), _FSDP_MP), (("fsdp", "SHARD_GRAD_OP"), _FSDP_MP),
                    (("fsdp", "FULL_SHARD"), *_FSDP2, _FSDP_MP), (("fsdp", "HYBRID_SHARD"), *_FSDP2, _FSDP_MP)),
        recompute=("none", "full"), precision="amp-bf16", tp=True, cp=True, model_parallel_strategies=(0, 3, 4),
        offload=((("fsdp", "FULL_SHARD"), *_FSDP2, _FSDP_MP, ("offload_params", "cpu")),)),
}  # fmt: skip
"""Each framework's search space (the module docstring gives the sources)."""

SEARCHED = ("stage", "fsdp", "ddp", "strategy", "fsdp_version", "tp", "pp", "cp", "ep", "sequence_parallel",
            "virtual_stages", "recompute", "micro_batch", "grad_accum", "offload_optimizer", "offload_params")
"""The estimate keywords the search chooses; any of them given by the user holds it fixed."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Shape:
    """The few numbers of the model the layout rules read."""

    layers: int
    experts: int = 0


def _dims(gpus: int, per_node: int, shape: Shape, space: Space, fixed: dict) -> Iterator[tuple[int, int, int, int]]:
    """(tp, cp, pp, dp) for ``gpus``: tp and cp within a node unless held, pp at most the layers."""
    tps = [fixed["tp"]] if "tp" in fixed else [t for t in divisors(gpus) if t <= per_node] if space.tp else [1]
    cps = [fixed["cp"]] if "cp" in fixed else divisors(gpus) if space.cp else [1]
    pps = [fixed["pp"]] if "pp" in fixed else divisors(gpus) if space.pp else [1]
    for tp in tps:
        for cp in cps:
            if "cp" not in fixed and "tp" not in fixed and tp * cp > per_node:
                continue
            for pp in pps:
                if gpus % (tp * cp * pp) or pp > shape.layers:
                    continue
                yield tp, cp, pp, gpus // (tp * cp * pp)


def settings(framework: str, gpus: int, per_node: int, shape: Shape, fixed: dict, *,
             offload: bool = False) -> Iterator[dict]:  # fmt: skip
    """Every layout, strategy and recompute policy ``framework`` runs on ``gpus`` GPUs, as estimate keywords (without
    the micro-batch), the user's ``fixed`` keywords holding their dimension."""
    space = SPACES[framework]
    strategies = space.offload if offload else space.strategies
    strategy_keys = ("stage", "fsdp", "ddp", "strategy")
    if any(k in fixed for k in strategy_keys):  # the user's strategy, as given (FSDP2 where the framework has no other)
        given = tuple((k, fixed[k]) for k in (*strategy_keys, "fsdp_version", "offload_optimizer", "offload_params")
                      if k in fixed)
        if "fsdp" in fixed and "fsdp_version" not in fixed and framework == "torchtitan":
            given += (("fsdp_version", 2),)
        strategies = (given,)
    recomputes = [fixed["recompute"]] if "recompute" in fixed else list(space.recompute)
    for tp, cp, pp, dp in _dims(gpus, per_node, shape, space, fixed):
        parallel = tp * cp * pp > 1
        virtuals = [fixed["virtual_stages"]] if "virtual_stages" in fixed else space.virtual if pp > 1 else (1,)
        eps = [fixed["ep"]] if "ep" in fixed else [e for e in (1, 2, 4, 8) if shape.experts % e == 0
                                                      and e <= dp] if shape.experts and space.ep else [1]  # fmt: skip
        for i, strategy in enumerate(strategies):
            if parallel and space.model_parallel_strategies is not None and not offload \
                    and not any(k in fixed for k in strategy_keys) and i not in space.model_parallel_strategies:
                continue
            if _pointless(dict(strategy), dp, cp, tp, per_node):
                continue
            for vp in virtuals:
                if vp > 1 and framework != "torchtitan" and shape.layers % (pp * vp):
                    continue  # Megatron's interleaving needs the layers divisible by the chunks
                if framework in ("megatron", "deepspeed") and shape.layers % pp and "stage_layers" not in fixed:
                    continue  # an even split only (memcalc.layout.compose.default_split)
                for ep in eps:
                    for rc in recomputes:
                        kw = dict(strategy, tp=tp, pp=pp, cp=cp, virtual_stages=vp, recompute=rc)
                        if ep > 1:
                            kw["ep"] = ep
                        sp = fixed.get("sequence_parallel", space.sequence_parallel and tp > 1)
                        if sp:
                            kw["sequence_parallel"] = True
                        yield {k: v for k, v in kw.items() if not (k in ("pp", "cp", "virtual_stages") and v == 1
                                                                    and k not in fixed) and not (k == "tp" and v == 1
                                                                    and k not in fixed)}  # fmt: skip


def _pointless(strategy: dict, dp: int, cp: int, tp: int, per_node: int) -> bool:
    """A hybrid whose shard group already spans every data-parallel rank is FULL_SHARD again: not proposed twice; an
    offloaded shard of a single data-parallel rank is the whole model (torchtitan applies no FSDP there)."""
    if strategy.get("fsdp") == "HYBRID_SHARD":
        return dp * cp <= max(1, per_node // tp)
    return "offload_params" in strategy and dp * cp == 1


def micro_batches(global_batch: int, dp: int, pp: int, virtual: int, fixed: dict) -> list[tuple[int, int]]:
    """The (micro-batch, accumulation) pairs with micro-batch x accumulation x dp = the global batch. A pipeline needs
    at least pp micro-batches in flight to fill it (1F1B), and the interleaved schedule a multiple of pp (Megatron-LM
    ``--num-layers-per-virtual-pipeline-stage``: "number of microbatches must be divisible by pipeline-model-parallel
    size"; torch's ScheduleInterleaved1F1B likewise)."""
    if global_batch % dp:
        return []
    per_replica = global_batch // dp
    out = []
    for mb in divisors(per_replica):
        ga = per_replica // mb
        if "micro_batch" in fixed and mb != fixed["micro_batch"]:
            continue
        if "grad_accum" in fixed and ga != fixed["grad_accum"]:
            continue
        if pp > 1 and (ga < pp or (virtual > 1 and ga % pp)):
            continue
        out.append((mb, ga))
    return out
