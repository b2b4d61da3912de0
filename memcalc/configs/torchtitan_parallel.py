"""A torchtitan job's parallel layout, batch, recompute and pipeline as estimate arguments (read by
``memcalc.configs.torchtitan``; the sources are listed there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memcalc.configs.reading import Collector

DTYPES = {"bfloat16": "bf16", "float32": "fp32"}


def parallel(c: Collector, flat: Mapping[str, Any], world: int | None) -> tuple[int, int, int, int, int]:
    def degree(key: str) -> int:
        path = f"parallelism.{key}"
        value = flat.get(path, 1)
        if path in flat:
            c.used(path)
        if value < 1:
            raise c.fail(path, f"{value} is not accepted; accepted: a degree of 1 or more (1 means disabled)")
        return value

    replicate, tp, pp, cp = (degree(k) for k in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                                                 "pipeline_parallel_degree", "context_parallel_degree"))  # fmt: skip
    _async_tp(c, flat, tp)
    shard = flat.get("parallelism.data_parallel_shard_degree", -1)
    path = "parallelism.data_parallel_shard_degree"
    if path in flat:
        c.used(path)
    others = replicate * tp * pp * cp
    if shard == -1:
        if world is None:
            raise c.fail(path, "is -1 (the GPUs left over), so the world size must be given: pass world_size= "
                               "(NGPU x nodes)")  # fmt: skip
        if world % others:
            raise c.fail(path, f"-1 leaves world_size({world}) / (dp_replicate({replicate}) * tp({tp}) * pp({pp}) * "
                               f"cp({cp})) = {world / others:g} GPUs, not a whole number")  # fmt: skip
        shard = world // others
        c.note(f"data_parallel_shard_degree -1 = {shard} (world {world} / {others})")
    elif shard < 1:
        raise c.fail(path, f"{shard} is not accepted; accepted: -1 (the GPUs left over) or a degree of 1 or more")
    elif world is not None and world != shard * others:
        raise c.fail(path, f"dp_replicate({replicate}) * dp_shard({shard}) * tp({tp}) * pp({pp}) * cp({cp}) = "
                           f"{shard * others} != world_size({world})")  # fmt: skip
    return replicate, shard, tp, pp, cp


def _async_tp(c: Collector, flat: Mapping[str, Any], tp: int) -> None:
    """``parallelism.enable_async_tensor_parallel``: inductor's micro-pipeline pass turns each all-gather + matmul and
    matmul + reduce-scatter into fused symmetric-memory kernels, which hold the layer's tensors differently; torchtitan's
    Dec-2024 benchmark measured it (Llama 3.1 70B, FSDP 32 x TP 8, full AC, compile, float8: 71.9 GiB reserved with
    plain TP, 67.6 with async TP). Not modelled: counted as plain TP, and said so."""
    path = "parallelism.enable_async_tensor_parallel"
    if path not in flat:
        return
    if flat[path] is not True:
        c.ignore(path, "off")
    elif tp == 1:
        c.ignore(path, "no tensor parallelism (tensor_parallel_degree 1)")
    else:
        c.unmodelled(path, "async TP's fused all-gather/reduce-scatter matmuls (counted as plain TP; torchtitan "
                           "measured 71.9 GiB with plain TP and 67.6 with async TP on a Llama 3.1 70B 2D run)")


OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
"""``optimizer.implementation`` (torchtitan's OptimizerConfig; memcalc's ``optimizer_impl`` of the same names)."""


def optimizer_impl(c: Collector, flat: Mapping[str, Any], pp: int, ep: int) -> None:
    """``optimizer.implementation`` (default fused, torchtitan's and memcalc's torchtitan default) and
    ``early_step_in_backward`` (torchtitan's OptimizersInBackwardContainer: each parameter stepped in its gradient
    hook; refused by torchtitan with pipeline or expert parallelism: components/optimizer.py build_optimizers).
    Neither is passed on: ``optimizer_impl`` is the realistic accounting's, and a file cannot tell whether that
    accounting will answer (it refuses a value it cannot use), so a step other than fused is said, not counted."""
    impl = flat.get("optimizer.implementation", "fused")
    if impl not in OPTIMIZER_IMPLS:
        raise c.fail("optimizer.implementation", f"{impl!r} is not accepted; accepted: {', '.join(OPTIMIZER_IMPLS)}")
    in_backward = flat.get("optimizer.early_step_in_backward", False)
    if in_backward is True:
        if pp > 1 or ep > 1:
            raise c.fail("optimizer.early_step_in_backward", f"torchtitan refuses optimizers in backward with "
                                                             f"{'pipeline' if pp > 1 else 'expert'} parallelism; "
                                                             f"accepted: false")  # fmt: skip
        c.unmodelled("optimizer.early_step_in_backward", "each parameter stepped in its gradient hook, so gradients "
                                                         "do not accumulate (counted as the fused step after "
                                                         "backward; --optimizer-impl in-backward where the realistic "
                                                         "accounting applies)")  # fmt: skip
    elif "optimizer.early_step_in_backward" in flat:
        c.ignore("optimizer.early_step_in_backward", "off")
    if impl != "fused":
        c.unmodelled("optimizer.implementation", f"{impl}: its step temporaries (counted as fused, which allocates "
                                                 f"none; --optimizer-impl {impl} where the realistic accounting "
                                                 f"applies)")  # fmt: skip
    elif "optimizer.implementation" in flat:
        c.used("optimizer.implementation")


def parallel_extras(c: Collector, flat: Mapping[str, Any], tp: int, pp: int, cp: int) -> None:
    """Parallelism keys that change what a rank holds but have no memcalc argument: said, not passed over."""
    def given(key: str) -> Any:
        return flat.get(f"parallelism.{key}")

    if given("disable_loss_parallel") is True:
        if tp > 1:
            c.unmodelled("parallelism.disable_loss_parallel", "the head's output gathered whole on every tensor-"
                                                              "parallel rank (counted vocabulary-sharded, as under "
                                                              "loss_parallel)")  # fmt: skip
        else:
            c.ignore("parallelism.disable_loss_parallel", "no tensor parallelism")
    elif given("disable_loss_parallel") is not None:
        c.ignore("parallelism.disable_loss_parallel", "false: loss_parallel, as counted" if tp > 1 else
                 "no tensor parallelism")
    if given("pipeline_parallel_schedule_csv") and pp > 1:
        c.unmodelled("parallelism.pipeline_parallel_schedule_csv", "a schedule read from a file (counted as "
                                                                   "pipeline_parallel_schedule's)")  # fmt: skip
    if given("context_parallel_rotate_method") is not None:
        c.ignore("parallelism.context_parallel_rotate_method", "the ring attention's K, V chunks in flight are not "
                                                               "counted, whichever the method" if cp > 1 else
                                                               "no context parallelism")  # fmt: skip
    etp = given("expert_tensor_parallel_degree")
    if etp is not None and etp != 1 and tp > 1:
        c.unmodelled("parallelism.expert_tensor_parallel_degree", "experts sharded over tensor-parallel ranks "
                                                                  "(counted as expert parallelism alone)")  # fmt: skip


def precision(c: Collector, flat: Mapping[str, Any], fsdp_on: bool, tp_or_pp: bool) -> None:
    dtype = flat.get("training.dtype", "float32")
    param = flat.get("training.mixed_precision_param", "bfloat16")
    for key, value in (("training.dtype", dtype), ("training.mixed_precision_param", param)):
        if value not in DTYPES:
            raise c.fail(key, f"{value!r} is not accepted; accepted: bfloat16, float32")
        if key in flat:
            c.used(key)
    if dtype == "bfloat16":
        c.arguments["precision"] = "bf16"
        c.note("training.dtype bfloat16: parameters, gradients and AdamW states all in bf16")
    elif param == "float32" or (not fsdp_on and tp_or_pp):
        c.arguments["precision"] = "fp32"
        if param != "float32":
            c.note("no mixed precision: torchtitan applies it through FSDP, or autocast for DDP/one GPU, not TP/PP alone")
    elif fsdp_on:
        c.arguments["precision"] = "bf16-mixed"
    else:  # distributed/utils.py maybe_enable_amp: torch.autocast over fp32 weights when FSDP is off (DDP, one GPU)
        c.arguments["precision"] = "amp-bf16"
        c.note("mixed precision through torch.autocast (DDP or one GPU): fp32 weights, bf16 compute (amp-bf16)")
    if flat.get("training.mixed_precision_reduce", "float32") != "float32":
        c.unmodelled("training.mixed_precision_reduce", "gradient reduction dtype")


def batch(c: Collector, flat: Mapping[str, Any], dp: int, pp: int) -> None:
    local = flat.get("training.local_batch_size", 8)
    seq = flat.get("training.seq_len", 2048)
    glob = flat.get("training.global_batch_size", -1)
    for key in ("training.local_batch_size", "training.seq_len", "training.global_batch_size"):
        if key in flat:
            c.used(key)
    if local < 1 or seq < 1:
        raise c.fail("training.local_batch_size" if local < 1 else "training.seq_len", "must be 1 or more")
    accum = 1
    if glob not in (-1, 0):
        if glob < 1 or glob % (local * dp):
            raise c.fail("training.global_batch_size", f"{glob} is not local_batch_size({local}) x dp({dp}) x a whole "
                                                       "number of accumulation steps")  # fmt: skip
        accum = glob // (local * dp)
    micro = local
    if pp > 1:
        micro = flat.get("parallelism.pipeline_parallel_microbatch_size", 1)
        if micro < 1 or local % micro:
            raise c.fail("parallelism.pipeline_parallel_microbatch_size", f"{micro} does not divide local_batch_size({local})")
        c.used("parallelism.pipeline_parallel_microbatch_size")
        accum *= local // micro
        c.note(f"pipeline: local batch {local} runs as {local // micro} micro-batches of {micro}")
    c.arguments.update(seq_len=seq, micro_batch=micro)
    if accum > 1:
        c.arguments["grad_accum"] = accum


def recompute(c: Collector, flat: Mapping[str, Any]) -> None:
    mode = flat.get("activation_checkpoint.mode", "selective")
    option = str(flat.get("activation_checkpoint.selective_ac_option", "2"))
    for key in ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option"):
        if key in flat:
            c.used(key)
    if mode not in ("none", "selective", "full", "memory_budget"):
        raise c.fail("activation_checkpoint.mode", f"{mode!r} is not accepted; accepted: none, selective, full, memory_budget")
    if mode == "selective" and option != "op" and not (option.isdigit() and int(option) >= 1):
        raise c.fail("activation_checkpoint.selective_ac_option", f"{option!r} is not accepted; accepted: \"op\" or a "
                                                                  "layer interval such as \"2\"")  # fmt: skip
    if "activation_checkpoint.mode" not in flat:
        c.note("activation_checkpoint.mode not set: torchtitan's default, selective every 2nd layer")
    if mode == "full" or (mode == "selective" and option == "1"):
        c.arguments["recompute"] = "full"
    elif mode == "selective" and option == "op":
        c.arguments["recompute"] = "op-sac"  # per-op SAC: every second matmul output and the attention outputs
    elif mode == "selective":
        c.arguments["recompute"] = f"every:{int(option)}"  # apply_ac: layer_id % ac_freq == 0 fully checkpointed
    else:
        c.arguments["recompute"] = "none"
        if mode == "memory_budget":
            c.unmodelled("activation_checkpoint.mode", "memory-budget AC picks what to save at compile time")


def _split_points(c: Collector, points: Any, preset: str | None) -> tuple[int, ...] | None:
    """v0.1.0's ``pipeline_parallel_split_points``: the first layer of each stage after the first ("layers.4"); stage
    i keeps the layers from its start to the next stage's (models/llama3/infra/pipeline.py ``_build_stage``)."""
    from memcalc.inputs.presets import load_model

    path = "parallelism.pipeline_parallel_split_points"
    starts = []
    for point in points if isinstance(points, list) else [points]:
        name = str(point).strip()
        if not (name.startswith("layers.") and name[7:].isdigit()):
            raise c.fail(path, f"{point!r} is not accepted; accepted: decoder-layer names such as \"layers.16\", "
                               "in increasing order")  # fmt: skip
        starts.append(int(name[7:]))
    if preset is None:
        c.note("pipeline split points: the model has no memcalc preset, so the split is left to --stage-layers")
        return None
    layers = load_model(preset).layers
    if any(b < a for a, b in zip(starts, starts[1:])) or any(n >= layers for n in starts):
        raise c.fail(path, f"{points!r} does not split layers 0..{layers - 1} in order; accepted: non-decreasing layer "
                           f"names from layers.0 to layers.{layers - 1}")  # fmt: skip
    return tuple(b - a for a, b in zip([0] + starts, starts + [layers]))


# torchtitan/distributed/pipeline_parallel.py: schedules that run one stage per rank (the rest run two by default).
_SINGLE_STAGE_SCHEDULES = ("1f1b", "gpipe")


def pipeline(c: Collector, flat: Mapping[str, Any], pp: int) -> None:
    """The stage split torchtitan's ``pipeline_llm`` builds (torchtitan/distributed/pipeline_parallel.py): the
    modules listed per part (``module_fqns_per_model_part``), else ``generate_llm_fqn_per_model_part`` over
    pp x stages-per-rank stages (``pipeline_parallel_layers_per_stage``: ceil((L + first + last) / it) stages)."""
    keys = ("parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_first_stage_less_layers",
            "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.pipeline_parallel_layers_per_stage",
            "parallelism.module_fqns_per_model_part")  # fmt: skip
    if pp <= 1:
        return
    for key in keys:
        if key in flat:
            c.used(key)
    schedule = str(flat.get(keys[0], "1F1B"))
    first, last, per, parts = (flat.get(k) for k in keys[1:])
    first, last = (1 if first is None else first), (1 if last is None else last)
    if "zbv" in schedule.lower() or "dualpipe" in schedule.lower():
        c.unmodelled(keys[0], f"{schedule} places stages in a V (rank k runs stages k and 2pp-1-k); memcalc "
                              "places them in a loop")  # fmt: skip
    points = flat.get("parallelism.pipeline_parallel_split_points")
    if points:
        c.used("parallelism.pipeline_parallel_split_points")
    if parts:
        split = tuple(sum(1 for m in part if str(m).startswith("layers.")) for part in parts)
    elif points:
        split = _split_points(c, points, c.arguments.get("model"))
        if split is None:
            return
    else:
        from memcalc.inputs.presets import load_model
        from memcalc.layout.compose import torchtitan_split

        preset = c.arguments.get("model")
        if preset is None:
            c.note("pipeline split: torchtitan's default weights assumed (the model has no memcalc preset)")
            if per is None:
                stages = pp * (1 if schedule.lower() in _SINGLE_STAGE_SCHEDULES else 2)
                if stages > pp:
                    c.arguments["virtual_stages"] = stages // pp
            return
        layers = load_model(preset).layers
        if per is not None:
            stages = -(-(layers + first + last) // per)
        else:
            stages = pp * (1 if schedule.lower() in _SINGLE_STAGE_SCHEDULES else 2)
        if stages % pp:
            raise c.fail(keys[3], f"{stages} stages do not divide over pp({pp})")
        split = torchtitan_split(stages, layers, first, last)
    if len(split) % pp:
        raise c.fail(keys[4], f"{len(split)} model parts do not divide over pp({pp})")
    if len(split) > pp:
        c.arguments["virtual_stages"] = len(split) // pp
    c.arguments["stage_layers"] = ",".join(map(str, split))


