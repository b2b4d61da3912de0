"""An accelerate config YAML (``accelerate config`` / ``accelerate launch --config_file``) as estimate arguments.

Sources (accelerate 1.15): commands/config/config_args.py (``ClusterConfig`` fields; unknown top-level keys are
refused; missing ``mixed_precision`` is None, launched as "no"), commands/launch.py (``fsdp_config`` keys become
``--fsdp_*`` launch arguments, a key without the prefix gets it; ``parallelism_config`` needs FSDP2),
utils/dataclasses.py (``FullyShardedDataParallelPlugin``: ``sharding_strategy`` as a name or 1-5, also as a
string; ``reshard_after_forward`` a name under FSDP1 and a boolean under FSDP2; ``DeepSpeedPlugin``: zero_stage
default 2, a ``deepspeed_config_file`` excludes the plugin's own keys), utils/constants.py
(``FSDP_SHARDING_STRATEGY``), parallelism_config.py (sizes default 1; FSDP shards over dp_shard x cp).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memcalc.configs.deepspeed import read_deepspeed
from memcalc.configs.reading import (
    Collector,
    ConfigReading,
    as_int,
    as_mapping,
    as_str,
    load_yaml,
    near,
    near_miss,
)
from memcalc.configs.accelerate_fsdp import _fsdp, _ipex, _parallelism_key

TOP_KEYS = (
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type",
    "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids", "machine_rank",
    "main_process_ip", "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision",
    "mpirun_config", "num_machines", "num_processes", "parallelism_config", "rdzv_backend", "same_network",
    "tpu_env", "tpu_name", "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu",
    # SageMakerConfig, and the legacy keys process_config converts (fp16, dynamo_backend)
    "additional_args", "base_job_name", "ec2_instance_type", "iam_role_name", "image_uri", "profile", "py_version",
    "pytorch_version", "region", "sagemaker_inputs_file", "sagemaker_metrics_file", "transformers_version",
    "fp16", "dynamo_backend", "ipex_config",
)  # fmt: skip
DEEPSPEED_KEYS = (
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher", "deepspeed_hostfile",
    "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names", "mixed_precision",
)  # fmt: skip
# DeepSpeedPlugin._deepspeed_config_checks: these cannot be combined with deepspeed_config_file.
WITH_FILE_REFUSED = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                     "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                     "zero3_save_16bit_model", "mixed_precision")  # fmt: skip
DDP_TYPES = ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON")
DISTRIBUTED_TYPES = ("NO", *DDP_TYPES, "DEEPSPEED", "FSDP", "MULTI_CPU", "XLA", "MEGATRON_LM")
PRECISIONS = {"no": "fp32", "fp16": "fp16-mixed", "bf16": "bf16-mixed", "fp8": "bf16-mixed"}
AUTOCAST = {"no": "fp32", "fp16": "amp-fp16", "bf16": "amp-bf16", "fp8": "amp-bf16"}
"""One process or DDP: accelerate keeps the model's fp32 weights and runs the forward under ``torch.autocast``
(accelerator.py ``native_amp``, ``get_mixed_precision_context_manager``); FSDP casts through its mixed-precision
policy over fp32 shards (``PRECISIONS``' bf16-mixed)."""
LAUNCH_ONLY = "launch setting"


def read_accelerate(
    path: str | os.PathLike[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    world_size: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    hidden: int | None = None,
    seq_len: int | None = None,
    accounting: str = "paper",
) -> ConfigReading:
    """Read an accelerate config YAML into ``memcalc.estimate`` arguments.

    ``cwd``: the directory the job is launched from (a ``deepspeed_config_file`` is relative to it; default:
    the current directory); ``world_size``: overrides ``num_processes`` as ``accelerate launch
    --num_processes`` does; the rest as in ``read_deepspeed``.
    """
    data, name = load_yaml(path)
    c = Collector(name, "accelerate")
    for key in data:
        if key not in TOP_KEYS:
            raise c.fail(key, f"unknown key{near(key, TOP_KEYS)}; accelerate refuses unknown top-level keys")
    kind = _distributed_type(c, data)
    world = _world(c, data, kind, world_size)
    precision = _precision(c, data, kind)
    for key in data:
        if key not in ("distributed_type", "num_processes", "num_machines", "mixed_precision", "fp16",
                       "deepspeed_config", "fsdp_config", "parallelism_config", "dynamo_config", "dynamo_backend",
                       "fp8_config", "use_cpu", "ipex_config"):  # fmt: skip
            c.ignore(key, LAUNCH_ONLY)
    _dynamo(c, data)
    if "ipex_config" in data:
        _ipex(c, data["ipex_config"])
    if data.get("use_cpu") is True:
        c.note("use_cpu: true trains on the CPU; memcalc estimates GPU memory")
    elif "use_cpu" in data:
        c.ignore("use_cpu", "false")
    if precision == "fp8":
        c.unmodelled("mixed_precision", "fp8 linears (Transformer Engine / torchao / MS-AMP); counted as bf16 mixed precision")
    if "fp8_config" in data:
        if precision == "fp8":
            c.unmodelled("fp8_config", "fp8 recipe")
        else:
            c.ignore("fp8_config", "mixed_precision is not fp8")
    for section, owners in (("deepspeed_config", ("DEEPSPEED",)), ("fsdp_config", ("FSDP",)),
                            ("parallelism_config", ("FSDP", "DEEPSPEED"))):  # fmt: skip
        if section in data and kind not in owners and data[section]:
            c.ignore(section, f"distributed_type {kind} does not use it")
    if kind == "DEEPSPEED" and data.get("parallelism_config"):
        _deepspeed_sequence_parallel(c, as_mapping(c, "parallelism_config", data["parallelism_config"]))
    if grad_accum is not None and kind != "DEEPSPEED":
        c.arguments["grad_accum"] = grad_accum
    if seq_len is not None and kind != "DEEPSPEED":
        c.arguments["seq_len"] = seq_len
        if micro_batch is not None:
            c.arguments["micro_batch"] = micro_batch
        else:
            c.assume("micro-batch 1, memcalc's default: the script's dataloader batch size is not in the file; "
                     "pass micro_batch=")  # fmt: skip
    if kind == "DEEPSPEED":
        launch_dir = Path(cwd) if cwd is not None else Path.cwd()
        ds = as_mapping(c, "deepspeed_config", data.get("deepspeed_config") or {})
        _deepspeed(c, ds, world, precision, launch_dir, micro_batch, grad_accum, hidden, seq_len, accounting)
    elif kind == "FSDP":
        _fsdp(c, data, world, accounting)
    else:
        c.arguments["ddp"] = True
    if "precision" not in c.arguments or kind != "DEEPSPEED":
        c.arguments["precision"] = (PRECISIONS if kind in ("FSDP", "DEEPSPEED") else AUTOCAST)[precision or "no"]
    if world is not None:
        c.arguments["gpus"] = world
    return c.freeze()


def _distributed_type(c: Collector, data: Mapping[str, Any]) -> str:
    if "distributed_type" not in data:
        raise c.fail("distributed_type", f"is missing; accelerate needs it: one of {', '.join(DISTRIBUTED_TYPES)}")
    value = data["distributed_type"]
    c.used("distributed_type")
    if value is False:  # YAML 1.1 reads a bare NO as false
        c.note("distributed_type: a bare NO is read by YAML as false; taken as 'NO' (quote it: 'NO')")
        return "NO"
    kind = as_str(c, "distributed_type", value, DISTRIBUTED_TYPES)
    if kind in ("MULTI_CPU", "XLA", "MEGATRON_LM"):
        raise c.fail("distributed_type", f"{kind} is not modelled; accepted: NO, MULTI_GPU (and other MULTI_* "
                                         "accelerators), DEEPSPEED, FSDP")  # fmt: skip
    if kind in DDP_TYPES[1:]:
        c.note(f"distributed_type {kind}: data parallelism as on GPUs (DDP)")
    return kind


def _world(c: Collector, data: Mapping[str, Any], kind: str, world_size: int | None) -> int | None:
    machines = as_int(c, "num_machines", data.get("num_machines", 1), minimum=1)
    if "num_machines" in data:
        c.used("num_machines")
    if "num_processes" in data:
        c.used("num_processes")
        world: int | None = as_int(c, "num_processes", data["num_processes"], minimum=-1)
        if world in (-1, 0):
            world = None
    else:
        world = 1 if kind == "NO" else None
    if world_size is not None:
        if world is not None and world != world_size:
            c.note(f"world_size {world_size} overrides num_processes {world} (as accelerate launch --num_processes)")
        world = world_size
    if world is None:
        c.note("num_processes is not set (accelerate launch takes it from the command line): pass world_size=")
        return None
    if kind == "NO" and world != 1:
        # accelerate launch (commands/launch.py _validate_launch_command): "More than one GPU was found, enabling
        # multi-GPU training" sets multi_gpu when num_processes > 1 and the machine has several GPUs
        c.note(f"distributed_type NO with num_processes {world}: accelerate launch turns on multi-GPU training when "
               f"the machine has more than one GPU, so this is DDP over {world} GPUs (pass world_size=1 for one)")
    if world % machines:
        raise c.fail("num_processes", f"{world} is the total over num_machines {machines} and must divide by it")
    if machines > 1:
        c.arguments["gpus_per_node"] = world // machines
        c.note(f"{world // machines} GPUs per node = num_processes {world} / num_machines {machines}")
    return world


def _precision(c: Collector, data: Mapping[str, Any], kind: str) -> str | None:
    if "mixed_precision" in data:
        value = data["mixed_precision"]
        c.used("mixed_precision")
        if value is False:  # YAML 1.1: a bare no
            return "no"
        return as_str(c, "mixed_precision", value, tuple(PRECISIONS))
    if data.get("fp16") is True:  # the legacy key process_config converts
        c.used("fp16")
        return "fp16"
    if not (kind == "DEEPSPEED" and "deepspeed_config_file" in (data.get("deepspeed_config") or {})):
        c.assume("precision fp32, from mixed_precision not set: accelerate's default unless accelerate launch "
                 "--mixed_precision says otherwise; pass precision=")  # fmt: skip
    return None


def _dynamo(c: Collector, data: Mapping[str, Any]) -> None:
    backend = data.get("dynamo_backend")
    cfg = data.get("dynamo_config") or {}
    if isinstance(cfg, dict):
        backend = cfg.get("dynamo_backend", backend)
    for where in ("dynamo_config", "dynamo_backend"):  # dynamo_backend: the top-level key of older releases
        if where not in data:
            continue
        if backend not in (None, "NO", "no", False):
            c.unmodelled(where, f"torch.compile (backend {backend}) changes activation memory")
        else:
            c.ignore(where, "torch.compile off")


def _deepspeed(c: Collector, ds: Mapping[str, Any], world: int | None, precision: str | None, cwd: Path,
               micro: int | None, accum: int | None, hidden: int | None, seq_len: int | None,
               accounting: str) -> None:  # fmt: skip
    for key in ds:
        if key not in DEEPSPEED_KEYS:
            close = near_miss(key, DEEPSPEED_KEYS)
            if close is not None:
                raise c.fail(f"deepspeed_config.{key}", f"unknown key (did you mean {close!r}?)")
            c.ignore(f"deepspeed_config.{key}", "not a DeepSpeed plugin setting (accelerate passes it to nothing)")
    fp16 = None if precision is None else precision == "fp16"
    bf16 = None if precision is None else precision in ("bf16", "fp8")  # fp8 recipes compute the rest in bf16
    if "deepspeed_config_file" in ds:
        clash = [k for k in ds if k in WITH_FILE_REFUSED]
        if clash:
            raise c.fail(f"deepspeed_config.{clash[0]}", "cannot be combined with deepspeed_config_file (accelerate "
                                                         "refuses it); set it in the DeepSpeed JSON")  # fmt: skip
        file = as_str(c, "deepspeed_config.deepspeed_config_file", ds["deepspeed_config_file"])
        c.used("deepspeed_config.deepspeed_config_file")
        target = Path(file) if Path(file).is_absolute() else cwd / file
        c.note(f"deepspeed_config_file {file} read from {target} (relative to the launch directory)")
        inner = read_deepspeed(target, world_size=world, micro_batch=micro, grad_accum=accum, hidden=hidden,
                               fp16=fp16, bf16=bf16, seq_len=seq_len, accounting=accounting)  # fmt: skip
        c.merge(inner, f"{file}: ")
        c.arguments.pop("precision", None)
        c.arguments["precision"] = inner.arguments["precision"]
    else:
        stage = as_int(c, "deepspeed_config.zero_stage", ds.get("zero_stage", 2))
        if stage > 3:
            raise c.fail("deepspeed_config.zero_stage", f"{stage} is not a ZeRO stage; accepted: 0, 1, 2, 3")
        if "zero_stage" not in ds:
            c.note("deepspeed_config.zero_stage not set: accelerate's default, 2")
        zero: dict[str, Any] = {"stage": stage}
        for key, section in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
            if key in ds:
                zero[section] = {"device": as_str(c, f"deepspeed_config.{key}", ds[key], ("none", "cpu", "nvme"))}
                c.used(f"deepspeed_config.{key}")
        steps = as_int(c, "deepspeed_config.gradient_accumulation_steps", ds.get("gradient_accumulation_steps", accum or 1),
                       minimum=1)
        # The config DeepSpeedPlugin builds (utils/dataclasses.py): batch and precision "auto", filled at prepare().
        config: dict[str, Any] = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": steps, "train_batch_size": "auto",
                                  "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}  # fmt: skip
        inner = read_deepspeed(config, world_size=world, micro_batch=micro, grad_accum=None, hidden=hidden,
                               fp16=fp16, bf16=bf16, seq_len=seq_len, accounting=accounting)  # fmt: skip
        for key in ("zero_stage", "gradient_accumulation_steps"):
            if key in ds:
                c.used(f"deepspeed_config.{key}")
        c.arguments.update(inner.arguments)
        c.notes += [n for n in inner.notes if "micro" in n or "ZeRO" in n or "nvme" in n]
        c.assumed += [a for a in inner.assumed if "micro" in a]
    for key in ds:
        if key in ("zero3_init_flag", "zero3_save_16bit_model", "gradient_clipping", "offload_optimizer_nvme_path",
                   "offload_param_nvme_path") or key.startswith("deepspeed_") and key != "deepspeed_config_file":  # fmt: skip
            c.ignore(f"deepspeed_config.{key}", "loading, saving or launching")




def _deepspeed_sequence_parallel(c: Collector, section: Mapping[str, Any]) -> None:
    """parallelism_config under DeepSpeed: accelerate reads its sp sizes (Ulysses/ALST sequence parallelism, which
    DeepSpeed runs with its own groups: parallelism_config.py ``build_device_mesh`` skips the mesh); the mesh sizes
    are FSDP2's."""
    for key, value in section.items():
        short, path = _parallelism_key(c, key)
        if short == "sp_size" and as_int(c, path, value, minimum=1) > 1:
            c.unmodelled(path, "DeepSpeed Ulysses/ALST sequence parallelism (activations split over the sequence, "
                               "ZeRO over data x sequence ranks); counted without it")  # fmt: skip
        elif short.startswith("sp_"):
            c.ignore(path, "sequence parallelism off (sp_size 1)" if short == "sp_size" else "sequence parallelism setting")
        else:
            c.ignore(path, "FSDP2's device mesh; DeepSpeed does not build it")


