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
from memcalc.configs.torchtitan_parallel import (batch, optimizer_impl, parallel, parallel_extras, pipeline,
                                                 precision, recompute)

RELEASES = ("0.1.0", "0.2.0", "0.2.1", "0.2.2")
# (model.name, model.flavor) -> memcalc preset (presets/models/*.toml); torchtitan models/llama3/__init__.py and
# models/qwen3/__init__.py flavors.
PRESETS = {("llama3", "8B"): "llama-3-8b", ("llama3", "70B"): "llama-3-70b", ("llama3", "405B"): "llama-3-405b",
           **{("qwen3", f): f"qwen3-{f.lower()}" for f in ("0.6B", "1.7B", "4B", "8B", "14B", "32B")}}
FLOAT8 = ("float8", "quantize.linear.float8", "quantize.grouped_mm.float8")
MX = ("mx", "quantize.linear.mx", "quantize.grouped_mm.mx")
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
    dims = parallel(c, flat, world_size)
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
    pipeline(c, flat, pp)
    ep = get("parallelism.expert_parallel_degree", 1)
    if ep > 1:
        c.arguments["ep"] = ep
        c.used("parallelism.expert_parallel_degree")
    parallel_extras(c, flat, tp, pp, cp)
    precision(c, flat, fsdp_on, tp > 1 or pp > 1)
    batch(c, flat, replicate * shard, pp)
    recompute(c, flat)
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
    optimizer_impl(c, flat, pp, ep)
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


def _leftovers(c: Collector, flat: Mapping[str, Any]) -> None:
    read = c.mentioned()
    for path in flat:
        if path in read:
            continue
        section = path.split(".")[0]
        reason = IGNORED_SECTIONS.get(section) or ("no effect on the memory held" if section in ("training", "parallelism",
                                                   "model", "optimizer", "activation_checkpoint", "compile") else "")  # fmt: skip
        c.ignore(path, reason or "not memory-relevant")
