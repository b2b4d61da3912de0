"""An accelerate config's ``fsdp_config`` (FSDP1 and FSDP2: sharding strategy, wrap policy, prefetch, offload,
activation checkpointing) as estimate arguments; read by ``memcalc.configs.accelerate``, whose sources apply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memcalc.configs.reading import Collector, as_bool, as_int, as_mapping, as_str, installed_refuses, near, near_miss

IPEX_REMOVED_IN = (1, 13)
"""accelerate 0.19 to 1.12 accepted a top-level ``ipex_config`` (Intel's extension for PyTorch on the CPU; ``accelerate
config`` wrote ``ipex_config: {ipex: false}`` into GPU configs too); 1.13 removed the field, so its config class
refuses the key (commands/config/config_args.py ``from_yaml_file``: unknown keys)."""
FSDP_KEYS = (
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload", "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch", "fsdp_cpu_ram_efficient_loading", "fsdp_forward_prefetch", "fsdp_min_num_params",
    "fsdp_offload_params", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_state_dict_type",
    "fsdp_sync_module_states", "fsdp_transformer_layer_cls_to_wrap", "fsdp_use_orig_params", "fsdp_version",
)  # fmt: skip
PARALLELISM_KEYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy",
                    "sp_size", "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")  # fmt: skip
# utils/constants.py FSDP_SHARDING_STRATEGY: 1-based; memcalc's names for the same strategies.
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
SHARDING_NAMES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def _fsdp(c: Collector, data: Mapping[str, Any], world: int | None, accounting: str) -> None:
    raw = as_mapping(c, "fsdp_config", data.get("fsdp_config") or {})
    fsdp: dict[str, Any] = {}
    for key, value in raw.items():  # launch.py: a key without the prefix gets "fsdp_"
        full = key if key.startswith("fsdp") else f"fsdp_{key}"
        if full == "fsdp_backward_prefetch_policy":
            _legacy_prefetch(c, f"fsdp_config.{key}", value)
            continue
        if full not in FSDP_KEYS:
            close = near_miss(full, FSDP_KEYS)
            if close is not None:
                raise c.fail(f"fsdp_config.{key}", f"unknown key (did you mean {close!r}?)")
            c.ignore(f"fsdp_config.{key}", "not an FSDP plugin setting (accelerate passes it to nothing)")
            continue
        fsdp[full] = (key, value)
    version = as_int(c, "fsdp_config.fsdp_version", fsdp.get("fsdp_version", ("", 1))[1], minimum=1)
    if version not in (1, 2):
        raise c.fail("fsdp_config.fsdp_version", f"{version} is not accepted; accepted: 1, 2")
    c.arguments["fsdp_version"] = version
    strategy = _sharding(c, fsdp, version)
    replicate, shard, tp, cp = _mesh(c, data, version, world)
    # accelerate's FSDP2 mesh is (dp_replicate, dp_shard_cp): the shard group spans dp_shard x cp ranks
    # (src/accelerate/parallelism_config.py, dp_shard_cp_dim_names), which memcalc's --shard-group counts.
    if replicate > 1 and shard * cp > 1:
        strategy = "HYBRID_SHARD" if strategy in ("FULL_SHARD", "HYBRID_SHARD") else "_HYBRID_SHARD_ZERO2"
        c.arguments["shard_group"] = shard * cp
        within = f"dp_shard {shard}" + (f" x cp {cp}" if cp > 1 else "")
        c.note(f"dp_replicate {replicate} x {within}: hybrid sharding, shard group {shard * cp}")
    elif replicate > 1:
        strategy = "NO_SHARD"
    c.arguments["fsdp"] = strategy
    if tp > 1:
        c.arguments["tp"] = tp
    if cp > 1:
        c.arguments.update(cp=cp, framework="hf")
        c.note(f"FSDP2 shards over dp_shard x cp = {shard * cp} ranks (accelerate's dp_shard_cp mesh dimension)")
    if version == 2:  # accelerate 1.15's fsdp2_prepare_model: the embedding and [norm, head] units of their own
        c.arguments["framework"] = "hf"
        c.note("FSDP2 units as accelerate makes them: each decoder layer (TRANSFORMER_BASED_WRAP), the input "
               "embedding, and the final norm with the output embedding (--fsdp-wrap separate; root with tied "
               "embeddings)")
    if version == 1 and "fsdp_backward_prefetch" not in fsdp:
        c.arguments["backward_prefetch"] = "none"
        c.note("fsdp_backward_prefetch is not set: accelerate's default NO_PREFETCH (each layer gathered at its own "
               "pre-backward)")
    if "fsdp_auto_wrap_policy" not in fsdp:  # FullyShardedDataParallelPlugin: FSDP_AUTO_WRAP_POLICY, else NO_WRAP
        _wrap_policy(c, "fsdp_config.fsdp_auto_wrap_policy (not set: accelerate's default)", "NO_WRAP", version,
                     accounting)
    for full, (key, value) in fsdp.items():
        path = f"fsdp_config.{key}"
        if full in ("fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
            continue
        if full == "fsdp_offload_params":
            if as_bool(c, path, value):
                c.arguments["offload_params"] = "cpu"
            c.used(path)
        elif full == "fsdp_activation_checkpointing":
            if as_bool(c, path, value):
                c.arguments["recompute"] = "full"
            c.used(path)
        elif full == "fsdp_min_num_params":
            n = as_int(c, path, value)
            wrap = fsdp.get("fsdp_auto_wrap_policy", ("", None))[1]
            if wrap == "SIZE_BASED_WRAP" and version == 1 and accounting == "implementation" and n > 0:
                c.arguments["min_num_params"] = n
                c.used(path)
            else:
                c.note(f"{path} {n} is used with SIZE_BASED_WRAP, FSDP1 and accounting='implementation' only")
        elif full == "fsdp_backward_prefetch" and version == 2:
            c.ignore(path, "FSDP2 prefetches the next unit in backward by itself (counted); accelerate passes no "
                           "backward_prefetch to fully_shard")
        elif full == "fsdp_backward_prefetch":
            c.arguments["backward_prefetch"] = _prefetch_mode(c, path, value)
            c.used(path)
        elif full == "fsdp_forward_prefetch" and value not in (False, None):
            c.unmodelled(path, "forward prefetching keeps the next unit gathered during each forward")
        elif full == "fsdp_activation_checkpointing_offload" and value is True:
            c.unmodelled(path, "checkpointed activations kept on the CPU")
        elif full == "fsdp_auto_wrap_policy":
            _wrap_policy(c, path, value, version, accounting)
        else:
            c.ignore(path, "loading, saving or bookkeeping")


def _ipex(c: Collector, value: Any) -> None:
    """``ipex_config``: refused where the installed accelerate refuses it (1.13 and later), else passed over with a
    note (IPEX optimises CPU training; it holds nothing on a GPU)."""
    name = installed_refuses("accelerate", IPEX_REMOVED_IN)
    if name is not None:
        raise c.fail("ipex_config", f"the installed accelerate {name} refuses this key (removed in 1.13; 0.19 to 1.12 "
                                    f"read it); remove it: IPEX applies to CPU training only")
    body = as_mapping(c, "ipex_config", value) if value is not None else {}
    c.ignore("ipex_config", "Intel's extension for PyTorch on the CPU; nothing on the GPU")
    if body.get("ipex") is True:
        c.note("ipex_config.ipex: true optimises CPU training (accelerate 0.19 to 1.12; 1.13 removed the key); "
               "memcalc estimates GPU memory")


BACKWARD_PREFETCH = {"BACKWARD_PRE": "pre", "BACKWARD_POST": "post", "NO_PREFETCH": "none", "1": "pre", "2": "post"}
"""accelerate's ``FSDP_BACKWARD_PREFETCH`` names (and the 1-based numbers older configs wrote) -> memcalc's
``backward_prefetch``."""


def _prefetch_mode(c: Collector, path: str, value: Any) -> str:
    mode = BACKWARD_PREFETCH.get(str(value).upper())
    if mode is None:
        raise c.fail(path, f"{value!r} is not accepted; accepted: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH")
    return mode


def _legacy_prefetch(c: Collector, path: str, value: Any) -> None:
    """``fsdp_backward_prefetch_policy``, the older name ``accelerate config`` wrote: accelerate up to 0.26 read it
    as ``fsdp_backward_prefetch`` (with a FutureWarning); 0.27 removed that, and the launcher now sets it on its
    arguments without reading it (commands/launch.py, utils/launch.py), so FSDP1 runs with no backward prefetch
    unless ``fsdp_backward_prefetch`` is set too. Counted as accelerate 0.27 and later run it, and said."""
    mode = _prefetch_mode(c, path, value)
    c.ignore(path, "the name accelerate before 0.27 read as fsdp_backward_prefetch; 0.27 and later pass it to nothing")
    if mode != "none":
        c.note(f"{path} {value}: accelerate 0.27 and later ignore this older name, so FSDP runs without backward "
               f"prefetch (counted; accelerate up to 0.26 prefetched {value}); rename it fsdp_backward_prefetch to "
               f"keep the prefetch")  # fmt: skip


WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
"""accelerate's ``FSDP_AUTO_WRAP_POLICY`` (utils/constants.py), matched upper-cased as its plugin does."""


def _wrap_policy(c: Collector, path: str, value: Any, version: int, accounting: str) -> None:
    """``fsdp_auto_wrap_policy``: TRANSFORMER_BASED_WRAP is one unit per decoder layer; with NO_WRAP accelerate makes
    none (FSDP1: the model is one unit; FSDP2: ``fsdp2_prepare_auto_wrap_policy`` returns None, so the root holds the
    layers, gathered from forward to backward): ``--fsdp-auto-wrap none``, which the realistic and the paper
    accountings read. SIZE_BASED_WRAP makes units by parameter count (the implementation accounting follows it
    under FSDP1, through fsdp_min_num_params)."""
    name = as_str(c, path, value).upper()
    if name not in WRAP_POLICIES:
        raise c.fail(path, f"{value!r} is not accepted; accepted: {', '.join(WRAP_POLICIES)}")
    if name == "NO_WRAP" and accounting == "implementation":
        c.unmodelled(path, "NO_WRAP: no unit per decoder layer, so the whole model stays gathered from forward to "
                           "backward with its gradients unsharded; the implementation accounting counts one unit per "
                           "decoder layer (the realistic accounting follows NO_WRAP)")
    elif name == "NO_WRAP":
        c.arguments["fsdp_auto_wrap"] = "none"
        c.used(path)
    elif name == "SIZE_BASED_WRAP" and not (version == 1 and accounting == "implementation"):
        c.unmodelled(path, "SIZE_BASED_WRAP: units by parameter count; memcalc counts one unit per decoder layer "
                           "(the implementation accounting follows it under FSDP1)")
    elif name == "SIZE_BASED_WRAP":
        c.ignore(path, "size-based wrapping, see fsdp_min_num_params")
    else:
        c.used(path)


def _sharding(c: Collector, fsdp: Mapping[str, tuple[str, Any]], version: int) -> str:
    """FSDP1: fsdp_sharding_strategy / fsdp_reshard_after_forward as a name or 1-5; FSDP2: a boolean."""
    found: dict[str, str] = {}
    for full in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
        if full not in fsdp:
            continue
        key, value = fsdp[full]
        path = f"fsdp_config.{key}"
        c.used(path)
        if version == 2:
            if full == "fsdp_sharding_strategy":
                raise c.fail(path, "is FSDP1's; under fsdp_version 2 give fsdp_reshard_after_forward: true or false")
            found[full] = "FULL_SHARD" if as_bool(c, path, value) else "SHARD_GRAD_OP"
            continue
        if isinstance(value, bool):
            raise c.fail(path, f"{value} is FSDP2's form; under fsdp_version 1 accepted: a name "
                               f"({', '.join(SHARDING_NAMES)}) or 1-5")  # fmt: skip
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            number = int(value)
            if not 1 <= number <= 5:
                raise c.fail(path, f"{number} is not accepted; accepted: 1-5 or {', '.join(SHARDING_NAMES)}")
            found[full] = SHARDING[number - 1]
        else:
            name = as_str(c, path, value).upper()
            if name.lstrip("_") not in SHARDING_NAMES:
                raise c.fail(path, f"{value!r} is not accepted{near(name, SHARDING_NAMES)}; accepted: "
                                   f"{', '.join(SHARDING_NAMES)} or 1-5")  # fmt: skip
            found[full] = SHARDING[SHARDING_NAMES.index(name.lstrip("_"))]
    if len(set(found.values())) > 1:
        raise c.fail("fsdp_config.fsdp_reshard_after_forward",
                     f"{found['fsdp_reshard_after_forward']} disagrees with fsdp_sharding_strategy "
                     f"{found['fsdp_sharding_strategy']}; give one")  # fmt: skip
    if not found:
        c.note("no sharding strategy given: accelerate's default, FULL_SHARD")
    return next(iter(found.values()), "FULL_SHARD")


def _parallelism_key(c: Collector, key: str) -> tuple[str, str]:
    """(the size's name, the key's path) of a parallelism_config key; an unknown one refused."""
    short = key.removeprefix("parallelism_config_")
    path = f"parallelism_config.{key}"
    if short not in PARALLELISM_KEYS:
        raise c.fail(path, f"unknown key{near(short, PARALLELISM_KEYS)}; accepted: parallelism_config_ + "
                           f"{', '.join(PARALLELISM_KEYS)}")  # fmt: skip
    return short, path


def _mesh(c: Collector, data: Mapping[str, Any], version: int, world: int | None) -> tuple[int, int, int, int]:
    """parallelism_config sizes (dp_replicate, dp_shard, tp, cp), FSDP2 only; without it dp_shard = world."""
    raw = data.get("parallelism_config") or {}
    if not raw:
        return 1, world or 1, 1, 1
    section = as_mapping(c, "parallelism_config", raw)
    if version != 2:
        raise c.fail("parallelism_config", "needs fsdp_config.fsdp_version 2 (accelerate refuses it under FSDP1)")
    sizes: dict[str, int] = {}
    for key, value in section.items():
        short, path = _parallelism_key(c, key)
        if short in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"):
            sizes[short] = as_int(c, path, value, minimum=1)
            c.used(path)
        elif short == "sp_size" and as_int(c, path, value, minimum=1) > 1:
            c.unmodelled(path, "sequence parallelism (Ulysses/ALST)")
        else:
            c.ignore(path, "communication backend choice")
    r, s, t, p = (sizes.get(k, 1) for k in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"))
    if world is not None and r * s * t * p != world:
        raise c.fail("parallelism_config", f"dp_replicate({r}) * dp_shard({s}) * tp({t}) * cp({p}) = {r * s * t * p} "
                                           f"!= num_processes({world})")  # fmt: skip
    return r, s, t, p
