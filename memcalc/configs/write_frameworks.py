"""Each framework's files for one estimate: DeepSpeed JSON, accelerate YAML, torchtitan TOML, Megatron-LM arguments.

Key names and values as the frameworks read them (the same sources as memcalc's readers):
DeepSpeed 0.19 runtime/config.py and runtime/zero/config.py; accelerate 1.15 commands/config/config_args.py and
utils/dataclasses.py (``FullyShardedDataParallelPlugin``); transformers ``TrainingArguments``; torchtitan v0.2
config/job_config.py; Megatron-LM megatron/training/arguments.py. What a framework cannot express is one
``InputError`` line; everything written is checked again by reading it back (``memcalc.configs.writing``).
"""

from __future__ import annotations

import json
from typing import Any

from memcalc.configs.written import Written
from memcalc.errors import InputError

FSDP = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
SCRIPT = "train.py"


def _refuse(framework: str, what: str, instead: str = "") -> InputError:
    return InputError(f"{framework} cannot run this estimate: {what}{f'; {instead}' if instead else ''}")


def _common(e: Any) -> tuple[Any, Any, Any, int, int, int]:
    """(input, parallelism, workload, dp, micro-batch, accumulation)."""
    inp = e.input
    if inp.workload is None:
        raise InputError("the estimate has no --seq-len, so there is no batch to write; give --seq-len (and the "
                         "model's shape)")  # fmt: skip
    return inp, inp.parallelism, inp.workload, e.training.dp, inp.workload.micro_batch, inp.grad_accum


def script_flags(inp: Any, framework: str) -> dict[str, Any]:
    """The training script's own settings memcalc counted that no config key holds: LoRA adapters (peft, under the
    Trainer), refused where the framework's files would have to say them."""
    lora = inp.lora
    if lora is None:
        return {}
    if framework in ("torchtitan", "Megatron-LM"):
        raise _refuse(framework, f"LoRA adapters ({framework}'s config has no adapters)",
                      "write it for accelerate or deepspeed")
    out: dict[str, Any] = {"lora_rank": lora.rank}
    if lora.targets is not None:
        out["lora_targets"] = ",".join(lora.targets)
    if lora.quantize != "none":
        out["quantize"] = lora.quantize
    return out


def _no_model_parallel(name: str, par: Any, allowed: tuple[str, ...] = ()) -> None:
    what = {"pp": "pipeline", "tp": "tensor", "cp": "context", "ep": "expert"}
    for dim in ("pp", "tp", "cp", "ep"):
        if getattr(par, dim) > 1 and dim not in allowed:
            carried = "data parallelism only" if not allowed else "data, tensor and context parallelism (FSDP2)"
            raise _refuse(name, f"--{dim} {getattr(par, dim)} ({name} has no {what[dim]} parallelism here: its files "
                                f"carry {carried})", "write it for torchtitan or megatron")


def _nodes(inp: Any) -> int:
    return max(1, -(-inp.cluster.gpus // inp.cluster.gpus_per_node))


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def _yaml(data: dict[str, Any], indent: str = "") -> str:
    """A flat YAML mapping (one nesting level), as ``accelerate config`` writes it."""
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.append(f"{indent}{key}:\n{_yaml(value, indent + '  ')}")
        elif isinstance(value, bool):
            out.append(f"{indent}{key}: {'true' if value else 'false'}")
        elif isinstance(value, str) and value in ("NO", "no"):
            out.append(f"{indent}{key}: '{value}'")  # YAML 1.1 reads a bare NO as false
        else:
            out.append(f"{indent}{key}: {value}")
    return "\n".join(out) + ("\n" if not indent else "")


def _accelerate_launch(inp: Any) -> str:
    nodes = _nodes(inp)
    if nodes == 1:
        return f"accelerate launch --config_file accelerate_config.yaml {SCRIPT} training_args.json"
    return ("accelerate launch --config_file accelerate_config.yaml --machine_rank \"${NODE_RANK:?}\" "
            f"--main_process_ip \"${{MASTER_ADDR:?}}\" --main_process_port 29500 {SCRIPT} training_args.json")


def _training_args(inp: Any, mb: int, ga: int, recompute: bool, **extra: Any) -> str:
    """transformers TrainingArguments as JSON (``HfArgumentParser.parse_json_file``)."""
    name = inp.precision.name
    args = {"output_dir": "OUTPUT_DIR", "per_device_train_batch_size": mb, "gradient_accumulation_steps": ga,
            "bf16": name in ("bf16-mixed", "amp-bf16"), "fp16": name in ("fp16-mixed", "amp-fp16"),
            "gradient_checkpointing": recompute, **extra}  # fmt: skip
    if inp.workload is not None and inp.workload.compile:
        args["torch_compile"] = True
    impl = {"fused": "adamw_torch_fused", "foreach": "adamw_torch"}  # torch.optim.AdamW(fused=True) / its foreach
    if inp.optimizer.name == "adamw" and inp.workload is not None and inp.workload.optimizer_impl in impl:
        args["optim"] = impl[inp.workload.optimizer_impl]
    return _json(args)


def _recompute_full_or_none(name: str, w: Any) -> bool:
    if w.recompute not in ("none", "full"):
        raise _refuse(name, f"recompute {w.recompute!r} (the Trainer's gradient_checkpointing recomputes every "
                            "layer: full or none)", "give --recompute full or none, or write it for torchtitan")
    return w.recompute == "full"


# --------------------------------------------------------------------------------------------
# DeepSpeed (and the accelerate YAML that launches it)
# --------------------------------------------------------------------------------------------


def deepspeed(e: Any) -> Written:
    inp, par, w, dp, mb, ga = _common(e)
    _no_model_parallel("DeepSpeed", par)
    s = inp.strategy
    if s.name not in ("zero-0", "zero-1", "zero-2", "zero-3", "ddp"):
        raise _refuse("DeepSpeed", f"the strategy {s.name} (DeepSpeed runs ZeRO stages 0-3)",
                      "give --stage, or write it for accelerate")
    stage = 0 if s.name == "ddp" else int(s.name[-1])
    zero: dict[str, Any] = {"stage": stage}
    if s.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": s.offload_optimizer, "pin_memory": True}
    if s.offload_params != "none":
        zero["offload_param"] = {"device": s.offload_params, "pin_memory": True}
    zero.update(_zero_knobs(inp.framework, stage))
    precision = _ds_precision(inp.precision.name)
    if inp.optimizer.name != "adamw":
        raise _refuse("DeepSpeed's file", f"the optimizer {inp.optimizer.name} (written: the client's AdamW)",
                      "give --optimizer adamw")
    config: dict[str, Any] = {"train_batch_size": mb * ga * dp, "train_micro_batch_size_per_gpu": mb,
                              "gradient_accumulation_steps": ga, **precision, "zero_optimization": zero,
                              "gradient_clipping": 1.0, "steps_per_print": 100}  # fmt: skip
    recompute = _recompute_full_or_none("DeepSpeed", w)
    mixed = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(inp.precision.name, "no")
    ds_section: dict[str, Any] = {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": stage == 3}
    yaml = _yaml({"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
                  "deepspeed_config": ds_section, "machine_rank": 0, "mixed_precision": mixed,
                  "num_machines": _nodes(inp), "num_processes": inp.cluster.gpus, "rdzv_backend": "static",
                  "same_network": True, "use_cpu": False})  # fmt: skip
    flags: dict[str, Any] = {"seq_len": w.seq_len, "framework": "deepspeed", **script_flags(inp, "DeepSpeed")}
    if recompute:
        flags["recompute"] = "full"
    if inp.parallelism.framework is None:
        flags.pop("framework")
    return Written(
        framework="deepspeed",
        files={"ds_config.json": _json(config), "accelerate_config.yaml": yaml,
               "training_args.json": _training_args(inp, mb, ga, recompute, deepspeed="ds_config.json")},
        read_back=(("--deepspeed", "ds_config.json"), ("--accelerate-config", "accelerate_config.yaml")),
        flags=flags, launch=_accelerate_launch(inp) + f"\n# or, without accelerate: deepspeed "
        f"{'--hostfile hostfile ' if _nodes(inp) > 1 else ''}--num_nodes {_nodes(inp)} --num_gpus "
        f"{min(inp.cluster.gpus, inp.cluster.gpus_per_node)} {SCRIPT} --deepspeed ds_config.json",
        fill_in=[f"{SCRIPT}: your training script (the Hugging Face Trainer reads training_args.json; its "
                 "gradient_checkpointing is the recompute memcalc counted)",
                 "training_args.json: output_dir, the data set and the model checkpoint in your script",
                 "the optimizer's learning rate (the script's; ds_config.json leaves the optimizer to it)"],
        notes=["the sequence length is the script's (memcalc counted it as --seq-len "
               f"{w.seq_len}); activation_checkpointing is not written: the Trainer's gradient_checkpointing "
               "recomputes, DeepSpeed's own checkpointing API is not used"],
    )  # fmt: skip


def _ds_precision(name: str) -> dict[str, Any]:
    if name == "bf16-mixed":
        return {"bf16": {"enabled": True}}
    if name == "fp16-mixed":
        return {"fp16": {"enabled": True}}
    if name == "fp32":
        return {}
    raise _refuse("DeepSpeed", f"precision {name} (DeepSpeed keeps fp32 master weights under bf16/fp16, or trains in "
                               "fp32)", "give --precision bf16-mixed, fp16-mixed or fp32")


def _zero_knobs(opts: Any, stage: int) -> dict[str, Any]:
    """The ZeRO settings the estimate was given (None: DeepSpeed's defaults, left out)."""
    out: dict[str, Any] = {}
    if opts.reduce_bucket_size is not None and stage >= 1:
        out["reduce_bucket_size"] = opts.reduce_bucket_size
    if opts.overlap_comm is not None and stage in (1, 2):
        out["overlap_comm"] = opts.overlap_comm
    if stage == 3:
        for attr, key in (("max_live_parameters", "stage3_max_live_parameters"),
                          ("max_reuse_distance", "stage3_max_reuse_distance"),
                          ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
                          ("persistence_threshold", "stage3_param_persistence_threshold"),
                          ("sub_group_size", "sub_group_size")):  # fmt: skip
            if getattr(opts, attr) is not None:
                out[key] = getattr(opts, attr)
    return out


# --------------------------------------------------------------------------------------------
# accelerate / the Hugging Face Trainer: FSDP or DDP
# --------------------------------------------------------------------------------------------


def accelerate(e: Any) -> Written:
    inp, par, w, dp, mb, ga = _common(e)
    s, opts = inp.strategy, inp.framework
    fsdp2 = s.name in FSDP and opts.fsdp_version == 2
    _no_model_parallel("accelerate", par, ("tp", "cp") if fsdp2 else ())
    name = inp.precision.name
    if name not in ("bf16-mixed", "amp-bf16", "fp16-mixed", "amp-fp16", "fp32"):
        raise _refuse("accelerate", f"precision {name} (accelerate trains fp32 weights in mixed precision, or fp32)",
                      "give --precision bf16-mixed, amp-bf16 or fp32")
    mixed = "bf16" if "bf16" in name else "fp16" if "fp16" in name else "no"
    if s.offload_optimizer != "none":
        raise _refuse("accelerate", "optimizer offload (FSDP offloads parameters, gradients and optimizer states "
                                    "together)", "write it for deepspeed")  # fmt: skip
    recompute = _recompute_full_or_none("accelerate", w)
    top: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    flags: dict[str, Any] = {"micro_batch": mb, "grad_accum": ga, "seq_len": w.seq_len, **script_flags(inp, "accelerate")}
    if s.name in FSDP:
        top["distributed_type"] = "FSDP"
        top["fsdp_config"] = _fsdp_config(s, opts, recompute, par.framework)
        if fsdp2:
            top.update(_parallelism_config(e, s, dp))
    elif s.name in ("ddp", "zero-0"):
        if name in ("bf16-mixed", "fp16-mixed"):  # accelerator.py native_amp: autocast over the model's fp32 weights
            raise _refuse("accelerate's DDP", f"precision {name} (accelerate trains DDP under autocast over fp32 "
                                              f"weights: amp-{name[:4]})", f"give --precision amp-{name[:4]}")
        top["distributed_type"] = "MULTI_GPU"
        if recompute:
            flags["recompute"] = "full"
    else:
        raise _refuse("accelerate's FSDP or DDP", f"the strategy {s.name}", "write it for deepspeed")
    top.update(machine_rank=0, main_training_function="main", mixed_precision=mixed, num_machines=_nodes(inp),
               num_processes=inp.cluster.gpus, rdzv_backend="static", same_network=True, use_cpu=False)
    if inp.parallelism.framework is not None:
        flags["framework"] = inp.parallelism.framework
    notes = []
    if name.startswith("amp-") and s.name in FSDP:
        flags["precision"] = name  # memcalc's accelerate reader counts FSDP's bf16 as FSDP's mixed-precision policy
        notes.append(f"mixed_precision {mixed} under FSDP: memcalc counted the Trainer's autocast over fp32 shards "
                     f"({name}); memcalc's accelerate reader alone counts FSDP's cast policy (bf16-mixed), so the "
                     f"check below names --precision {name}")
    return Written(
        framework="accelerate",
        files={"accelerate_config.yaml": _yaml(top), "training_args.json": _training_args(inp, mb, ga, recompute and
                                                                                          s.name not in FSDP)},
        read_back=(("--accelerate-config", "accelerate_config.yaml"),), flags=flags, launch=_accelerate_launch(inp),
        fill_in=[f"{SCRIPT}: your training script (the Hugging Face Trainer reads training_args.json)",
                 "training_args.json: output_dir; the data set and the model checkpoint in your script",
                 f"the sequence length: the script's (memcalc counted {w.seq_len} tokens)"],
        notes=notes,
    )  # fmt: skip


def _parallelism_config(e: Any, s: Any, dp: int) -> dict[str, Any]:
    """accelerate's ParallelismConfig (FSDP2; parallelism_config.py): the FSDP mesh spans dp_shard x cp, hybrid
    sharding replicates over dp_replicate. Left out where it would say what FSDP2 does without it."""
    par = e.input.parallelism
    replicate, shard = 1, dp
    if s.name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        group = s.shard_group or e.input.cluster.gpus_per_node
        if group % par.cp or dp % (group // par.cp) or group // par.cp == dp:
            raise _refuse("accelerate", f"a shard group of {group} over dp {dp} x cp {par.cp} (FSDP2's mesh: "
                                        "dp_replicate x dp_shard x cp)")  # fmt: skip
        shard = group // par.cp
        replicate = dp // shard
    if replicate == 1 and par.tp == 1 and par.cp == 1:
        return {}
    sizes = {"dp_replicate_size": replicate, "dp_shard_size": shard, "tp_size": par.tp, "cp_size": par.cp}
    return {"parallelism_config": {f"parallelism_config_{k}": v for k, v in sizes.items()}}


def _fsdp_config(s: Any, opts: Any, recompute: bool, framework: str | None) -> dict[str, Any]:
    version = opts.fsdp_version
    if opts.fsdp_auto_wrap == "none" or (version == 1 and opts.fsdp_wrap is not None):
        # FSDP2's --fsdp-wrap is checked by reading back (accelerate wraps the embedding and the head its own way)
        raise _refuse("accelerate", "the FSDP wrapping asked for (written: TRANSFORMER_BASED_WRAP, one unit per "
                                    "decoder layer)")
    cfg: dict[str, Any] = {"fsdp_activation_checkpointing": recompute,
                           "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}  # fmt: skip
    if version == 1:
        # memcalc's default (None) is accelerate's NO_PREFETCH under --framework hf, PyTorch's BACKWARD_PRE otherwise
        prefetch = {"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": "NO_PREFETCH"}
        chosen = opts.backward_prefetch or ("none" if framework == "hf" else "pre")
        cfg["fsdp_backward_prefetch"] = prefetch[chosen]
        cfg["fsdp_sharding_strategy"] = s.name
    else:
        if s.name == "NO_SHARD":
            raise _refuse("accelerate", "FSDP2 with NO_SHARD", "give --fsdp-version 1, or --ddp")
        cfg["fsdp_reshard_after_forward"] = s.name in ("FULL_SHARD", "HYBRID_SHARD")
    cfg.update(fsdp_cpu_ram_efficient_loading=True, fsdp_offload_params=s.offload_params != "none",
               fsdp_state_dict_type="SHARDED_STATE_DICT", fsdp_sync_module_states=True,
               fsdp_use_orig_params=True, fsdp_version=version)  # fmt: skip
    if version == 2:
        del cfg["fsdp_use_orig_params"], cfg["fsdp_sync_module_states"]
    return dict(sorted(cfg.items()))
