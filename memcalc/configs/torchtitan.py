"""A torchtitan job TOML (``--job.config_file``) as estimate arguments.

Sources (pytorch/torchtitan, releases v0.1.0 and v0.2.0-v0.2.2): config_manager.py / config/job_config.py (keys
and defaults: local_batch_size 8, seq_len 2048, data_parallel_shard_degree -1, activation_checkpoint.mode
"selective" with selective_ac_option "2", optimizer AdamW fused); distributed/parallel_dims.py
(dp_replicate x dp_shard x cp x tp x pp = world, -1 = the GPUs left over); distributed/utils.py
``maybe_enable_amp`` (mixed precision through FSDP's MixedPrecisionPolicy when FSDP is on, autocast for DDP or a
single GPU, none with TP/PP but no FSDP); models/llama3/infra/parallelize.py (FSDP over dp_shard x cp,
reshard_after_forward "default" = not under pipeline parallelism; TP with sequence parallelism); components/
quantization (converters "float8" in v0.1, "quantize.linear.float8" in v0.2; [float8] moved to
[quantize.linear.float8], training.compile to [compile] enable, checkpoint.enable_checkpoint to checkpoint.enable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memcalc.configs.reading import Collector, ConfigReading, load_toml, near, read_text
from memcalc.configs.torchtitan_keys import KEYS

RELEASES = ("0.1.0", "0.2.0", "0.2.1", "0.2.2")
# (model.name, model.flavor) -> memcalc preset (presets/models/*.toml); torchtitan models/llama3/__init__.py and
# models/qwen3/__init__.py flavors.
PRESETS = {("llama3", "8B"): "llama-3-8b", ("llama3", "70B"): "llama-3-70b", ("llama3", "405B"): "llama-3-405b",
           **{("qwen3", f): f"qwen3-{f.lower()}" for f in ("0.6B", "1.7B", "4B", "8B", "14B", "32B")}}
FLOAT8 = ("float8", "quantize.linear.float8", "quantize.grouped_mm.float8")
MX = ("mx", "quantize.linear.mx", "quantize.grouped_mm.mx")
DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
IGNORED_SECTIONS = {
    "job": "job bookkeeping", "profiling": "profiler output", "metrics": "logging", "lr_scheduler": "learning rate",
    "checkpoint": "checkpoint files", "comm": "timeouts and tracing", "memory_estimation": "torchtitan's own estimator",
    "fault_tolerance": "torchft replica groups", "experimental": "custom modules", "validation": "evaluation runs",
    "debug": "determinism and seeds",
}  # fmt: skip


def read_torchtitan(path: str | os.PathLike[str], *, world_size: int | None = None) -> ConfigReading:
    """Read a torchtitan job TOML (v0.1, v0.2), or torchtitan 0.3's run arguments (``--module llama3 --config
    llama3_8b --parallelism.tensor_parallel_degree 2 ...``: told apart by content), into ``memcalc.estimate``
    arguments.

    ``world_size``: GPUs in the job (NGPU x nodes); needed when ``data_parallel_shard_degree`` is -1.
    """
    from memcalc.configs.torchtitan_args import RELEASE, is_args_file, read_args

    text, name = read_text(path, "torchtitan config")
    if is_args_file(text):
        c = Collector(name, "torchtitan")
        flat = read_args(c, text)
        releases: tuple[str, ...] = (RELEASE,)
    else:
        data, name = load_toml(path)
        c = Collector(name, "torchtitan")
        flat = _flatten(data)
        releases = _check_keys(c, flat)
    get = flat.get
    dims = _parallel(c, flat, world_size)
    replicate, shard, tp, pp, cp = dims
    fsdp_on = shard > 1 or cp > 1
    _model(c, flat, releases, shard > 1)
    c.arguments["gpus"] = replicate * shard * tp * pp * cp
    # Strategy: FSDP2 over dp_shard (x cp), HSDP with dp_replicate, DDP with dp_replicate alone.
    if fsdp_on:
        reshard = get("parallelism.fsdp_reshard_after_forward", "default")
        if reshard not in ("default", "always", "never"):
            raise c.fail("parallelism.fsdp_reshard_after_forward",
                         f"{reshard!r} is not accepted; accepted: default, always, never")
        if "parallelism.fsdp_reshard_after_forward" in flat:
            c.used("parallelism.fsdp_reshard_after_forward")
        keep = reshard == "never" or (reshard == "default" and pp > 1)
        strategy = "SHARD_GRAD_OP" if keep else "FULL_SHARD"
        if replicate > 1:
            strategy = "_HYBRID_SHARD_ZERO2" if keep else "HYBRID_SHARD"
            c.arguments["shard_group"] = shard * cp  # fully_shard on (dp_replicate, dp_shard_cp)
        c.arguments.update(fsdp=strategy, fsdp_version=2)
        if releases == ("0.1.0",):  # apply_fsdp wrapped the embedding and the head in the root until v0.2.0
            c.arguments["fsdp_wrap"] = "root"
            c.note("torchtitan v0.1.0 keeps the embedding, final norm and head in FSDP's root unit (v0.2 shards them "
                   "as units of their own)")
        elif reshard == "always":  # [norm, output] resharded after forward too
            c.arguments["fsdp_wrap"] = "separate-reshard"
            c.note("fsdp_reshard_after_forward 'always' reshards the head's unit after its forward as well (its "
                   "final norm, a vector, counted in the root)")
        if keep and reshard == "default":
            c.note("fsdp_reshard_after_forward 'default' keeps parameters gathered after forward under pipeline parallelism")
    else:
        c.arguments["ddp"] = True
    for value, arg in ((tp, "tp"), (pp, "pp"), (cp, "cp")):
        if value > 1:
            c.arguments[arg] = value
    if tp > 1 and get("parallelism.enable_sequence_parallel") is False:  # 0.3's switch
        c.arguments["sequence_parallel"] = False
        c.used("parallelism.enable_sequence_parallel")
    elif tp > 1:
        c.arguments["sequence_parallel"] = True
        c.note("torchtitan's tensor parallelism shards norms and dropouts over the sequence (sequence parallel)")
    if cp > 1:
        c.note(f"FSDP shards over dp_shard x cp = {shard * cp} ranks (torchtitan's dp_shard_cp mesh dimension)")
    c.arguments["framework"] = "torchtitan"
    _pipeline(c, flat, pp)
    ep = get("parallelism.expert_parallel_degree", 1)
    if ep > 1:
        c.arguments["ep"] = ep
        c.used("parallelism.expert_parallel_degree")
    _parallel_extras(c, flat, tp, pp, cp)
    _precision(c, flat, fsdp_on, tp > 1 or pp > 1)
    _batch(c, flat, replicate * shard, pp)
    _recompute(c, flat)
    if get("training.enable_cpu_offload") is True:
        if fsdp_on:
            c.arguments["offload_params"] = "cpu"
            c.used("training.enable_cpu_offload")
        else:
            c.ignore("training.enable_cpu_offload", "torchtitan offloads through FSDP only, which is off")
    if get("training.compile") is True:  # 0.1.0: the blocks and the loss (components/loss.py build_cross_entropy_loss)
        c.arguments["compile"], c.arguments["compile_loss"] = True, True
        c.used("training.compile")
    if get("compile.enable") is True:
        parts = get("compile.components", ["model", "loss"])  # torchtitan config/configs.py CompileConfig default
        if "compile.components" in flat:
            c.used("compile.components")
        if isinstance(parts, list) and "model" in parts:
            c.arguments["compile"], c.arguments["compile_loss"] = True, "loss" in parts
            c.used("compile.enable")
        else:
            c.unmodelled("compile.components", "torch.compile of the loss alone is not modelled")
        backend = get("compile.backend", "inductor")
        if backend != "inductor":  # aot_eager and the like: no inductor fusion, AOTAutograd's default partition
            c.unmodelled("compile.backend", f"{backend!r}: what it saves is not inductor's (counted as inductor's)")
        elif "compile.backend" in flat:
            c.used("compile.backend")
    opt = str(get("optimizer.name", "AdamW"))
    if "optimizer.name" in flat:
        c.used("optimizer.name")
    if opt.lower() in ("adamw", "adam"):
        c.arguments["optimizer"] = "adamw"
    else:
        c.unmodelled("optimizer.name", f"optimizer {opt!r} is not one memcalc models")
    _optimizer_impl(c, flat, pp, ep)
    c.arguments["attention"] = "sdpa"
    c.note("attention: torchtitan's llama calls scaled_dot_product_attention (flash kernel on GPU)")
    _leftovers(c, flat)
    return c.freeze()


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and (path not in KEYS):
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _check_keys(c: Collector, flat: Mapping[str, Any]) -> tuple[str, ...]:
    custom = flat.get("job.custom_config_module") or flat.get("experimental.custom_args_module")
    compatible = set(RELEASES)
    narrowing: dict[str, set[str]] = {}  # keys that exist in some releases only
    for path, value in flat.items():
        if path not in KEYS:
            if custom:
                c.ignore(path, f"defined by the custom config module {custom}")
                continue
            raise c.fail(path, f"unknown key{near(path, KEYS)}; torchtitan refuses keys its JobConfig does not define")
        kind, rel = KEYS[path]
        _check_type(c, path, value, kind)
        releases = set(RELEASES) if rel == "all" else set(rel.split(","))
        if not compatible & releases:
            if custom:  # the custom module's dataclasses extend JobConfig (v0.2's ft module re-adds sync_steps)
                c.ignore(path, f"not a key of this file's release; defined by the custom config module {custom}")
                continue
            other = next(p for p, r in narrowing.items() if not r & releases)
            raise c.fail(path, f"is a torchtitan v{'/v'.join(sorted(releases))} key but {other} is "
                               f"v{'/v'.join(sorted(narrowing[other]))}'s: the file mixes releases; "
                               "use one release's names")  # fmt: skip
        compatible &= releases
        if rel != "all":
            narrowing[path] = releases
    chosen = tuple(sorted(compatible))
    if len(chosen) < len(RELEASES):
        c.note(f"keys of torchtitan v{', v'.join(chosen)}")
    return chosen


def _check_type(c: Collector, path: str, value: object, kind: str) -> None:
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, list),
    }.get(kind, True)
    if not ok:
        word = {"bool": "true or false", "int": "a whole number", "float": "a number", "number": "a number",
                "str": "a string", "list": "a list such as [\"a\", \"b\"]"}[kind]  # fmt: skip
        raise c.fail(path, f"{value!r} is not accepted; accepted: {word}")


def _model(c: Collector, flat: Mapping[str, Any], releases: tuple[str, ...], dp_shard: bool) -> None:
    name, flavor = flat.get("model.name", "llama3"), flat.get("model.flavor", "debugmodel")
    for key in ("model.name", "model.flavor"):
        if key in flat:
            c.used(key)
    preset = PRESETS.get((name, flavor))
    if preset is not None:
        c.arguments["model"] = preset
    else:
        c.note(f"model {name} {flavor}: no memcalc preset; pass model= or hf_config= with its shape")
    converters = flat.get("model.converters", [])
    if "model.converters" in flat:
        c.used("model.converters")
    float8 = any(x in FLOAT8 for x in converters)
    mx = any(x in MX for x in converters)
    if "float8" in converters and "0.1.0" not in releases:
        c.note("model.converters 'float8' is v0.1's name; v0.2 registers 'quantize.linear.float8' and raises "
               "KeyError on 'float8' (read as float8 on)")  # fmt: skip
    linear8 = any(x in ("float8", "quantize.linear.float8") for x in converters)
    if linear8:
        _float8(c, flat, dp_shard)
    if "quantize.grouped_mm.float8" in converters:
        c.unmodelled("model.converters", "float8 grouped GEMMs of MoE experts")
    if mx:
        c.unmodelled("model.converters", "MX (microscaling) linears")
    for path in flat:
        section = path.split(".")[0]
        if section in ("float8", "mx", "quantize") and path not in c.mentioned():
            on = mx if ".mx." in f".{path}" else float8
            (c.unmodelled if on else c.ignore)(path, "converter setting" if on else "its converter is not in model.converters")


def _float8(c: Collector, flat: Mapping[str, Any], dp_shard: bool) -> None:
    """torchao float8 linears (components/quantization/float8.py, v0.1's [float8] = v0.2's [quantize.linear.float8]):
    ``recipe_name`` unset is tensorwise scaling (``Float8LinearConfig()``), with the fp8 all-gather where
    ``dp_shard_enabled and enable_fsdp_float8_all_gather``; a ``recipe_name`` ("tensorwise", "rowwise",
    "rowwise_with_gw_hp") is ``Float8LinearConfig.from_recipe_name``, which torchtitan asserts is not combined with
    the fp8 all-gather; ``filter_fqns`` (default ``["output"]``) leaves the head in bf16, as memcalc converts the
    decoder layers' linears only."""
    prefix = next((p for p in ("quantize.linear.float8.", "float8.") if any(k.startswith(p) for k in flat)),
                  "quantize.linear.float8.")
    get = flat.get
    named = get(prefix + "recipe_name")
    recipe = named or "tensorwise"
    if recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        raise c.fail(prefix + "recipe_name", f"{recipe!r} is not accepted; accepted: tensorwise, rowwise, "
                                             "rowwise_with_gw_hp (or unset: tensorwise)")
    gather = prefix + "enable_fsdp_float8_all_gather"
    if named and get(gather) is True:
        raise c.fail(gather, f"true with recipe_name {named!r}: torchtitan asserts they are not combined; accepted: "
                             "recipe_name unset (tensorwise) with the fp8 all-gather, or enable_fsdp_float8_all_gather "
                             "false")  # fmt: skip
    c.arguments["float8"] = "tensorwise" if recipe == "tensorwise" else "rowwise"
    if recipe == "rowwise_with_gw_hp":
        c.unmodelled(prefix + "recipe_name", "the weight gradient's GEMM in high precision (answered as rowwise)")
    elif named:
        c.used(prefix + "recipe_name")
    if get(gather) is True:
        if dp_shard:
            c.arguments["float8_all_gather"] = True
            c.used(gather)
        else:
            c.ignore(gather, "torchtitan gathers in fp8 only where dp_shard shards (dp_shard_enabled)")
    filt = get(prefix + "filter_fqns", ["output"])
    if prefix + "filter_fqns" in flat:
        if set(filt) <= {"output", "lm_head"}:
            c.used(prefix + "filter_fqns")
        else:
            c.unmodelled(prefix + "filter_fqns", "filters beyond the head (memcalc converts every decoder-layer linear)")
    recompute_w = prefix + "force_recompute_fp8_weight_in_bwd"
    if get(recompute_w) is True and not c.arguments.get("float8_all_gather"):
        c.unmodelled(recompute_w, "the fp8 weight recast in backward instead of saved (counted saved)")
    for key, why in (("precompute_float8_dynamic_scale_for_fsdp", "one all-reduce of the amax per step: time only"),
                     ("emulate", "emulated fp8 matmuls hold the same casts"),
                     ("force_recompute_fp8_weight_in_bwd", "the weights are gathered in fp8 already"
                      if c.arguments.get("float8_all_gather") else "off: the fp8 weight is saved for backward, as "
                      "counted")):
        if prefix + key in flat and prefix + key not in c.mentioned():
            c.ignore(prefix + key, why)


def _parallel(c: Collector, flat: Mapping[str, Any], world: int | None) -> tuple[int, int, int, int, int]:
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


def _optimizer_impl(c: Collector, flat: Mapping[str, Any], pp: int, ep: int) -> None:
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


def _parallel_extras(c: Collector, flat: Mapping[str, Any], tp: int, pp: int, cp: int) -> None:
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


def _precision(c: Collector, flat: Mapping[str, Any], fsdp_on: bool, tp_or_pp: bool) -> None:
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


def _batch(c: Collector, flat: Mapping[str, Any], dp: int, pp: int) -> None:
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


def _recompute(c: Collector, flat: Mapping[str, Any]) -> None:
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


def _pipeline(c: Collector, flat: Mapping[str, Any], pp: int) -> None:
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


def _leftovers(c: Collector, flat: Mapping[str, Any]) -> None:
    read = c.mentioned()
    for path in flat:
        if path in read:
            continue
        section = path.split(".")[0]
        reason = IGNORED_SECTIONS.get(section) or ("no effect on the memory held" if section in ("training", "parallelism",
                                                   "model", "optimizer", "activation_checkpoint", "compile") else "")  # fmt: skip
        c.ignore(path, reason or "not memory-relevant")
