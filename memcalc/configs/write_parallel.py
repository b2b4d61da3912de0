"""The model-parallel frameworks' files: a torchtitan job TOML and torchtitan 0.3's run arguments, and a Megatron-LM
argument list.

torchtitan: the v0.2 key names (config/job_config.py: ``[compile] enable``, ``[quantize.linear.float8]``, converters
``quantize.linear.float8``), which memcalc's reader checks against the releases it knows
(``memcalc.configs.torchtitan_keys``). Megatron-LM: megatron/training/arguments.py option names.
"""

from __future__ import annotations

from typing import Any

from memcalc.configs.write_frameworks import _common, _nodes, _refuse, script_flags
from memcalc.configs.written import Written

TORCHRUN = "torchrun --nnodes {nodes} --nproc_per_node {per} --node_rank \"${{NODE_RANK:-0}}\" " \
           "--master_addr \"${{MASTER_ADDR:-localhost}}\" --master_port 29500"


def _torchrun(inp: Any) -> str:
    return TORCHRUN.format(nodes=_nodes(inp), per=min(inp.cluster.gpus, inp.cluster.gpus_per_node))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def _toml(sections: dict[str, dict[str, Any]]) -> str:
    out = ["# torchtitan job config written by memcalc (torchtitan v0.2 keys)"]
    for name, body in sections.items():
        out += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# torchtitan
# --------------------------------------------------------------------------------------------


def torchtitan(e: Any) -> Written:
    from memcalc.configs.torchtitan import PRESETS

    inp, par, w, dp, mb, ga = _common(e)
    script_flags(inp, "torchtitan")
    flavour = {v: k for k, v in PRESETS.items()}.get(inp.model.name or "")
    if flavour is None:
        raise _refuse("torchtitan", f"the model {inp.model.name or '(given by its shape)'} (torchtitan trains its own "
                                    f"flavors: {', '.join(sorted(PRESETS.values()))})")  # fmt: skip
    s = inp.strategy
    if s.offload_optimizer != "none":
        raise _refuse("torchtitan", "ZeRO optimizer offload (torchtitan offloads through FSDP: parameters, "
                                    "gradients and optimizer states together)", "write it for deepspeed")  # fmt: skip
    replicate, shard, reshard = _mesh(e, s, dp, par.cp)
    parallelism: dict[str, Any] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                                   "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": par.tp,
                                   "pipeline_parallel_degree": par.pp, "context_parallel_degree": par.cp}  # fmt: skip
    if par.ep > 1:
        parallelism["expert_parallel_degree"] = par.ep
    training: dict[str, Any] = {"local_batch_size": mb, "global_batch_size": mb * ga * dp, "seq_len": w.seq_len,
                                "steps": 1000, "max_norm": 1.0}  # fmt: skip
    if par.pp > 1:
        parallelism.update(_schedule(par), pipeline_parallel_microbatch_size=mb)
        training["local_batch_size"] = mb * ga
    training.update(_precision(inp.precision.name, s.name))
    if s.offload_params != "none":
        training["enable_cpu_offload"] = True
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"{inp.model.name}, written by memcalc"},
        "model": {"name": flavour[0], "flavor": flavour[1], "hf_assets_path": "./assets/hf/FILL_IN"},
        "optimizer": {"name": "AdamW", "lr": 3e-4},
        "training": training, "parallelism": parallelism,
        "activation_checkpoint": _checkpoint(w.recompute),
        "compile": {"enable": w.compile, "components": ["model", "loss"] if w.compile_loss is not False else ["model"]},
        "checkpoint": {"enable": False, "folder": "checkpoint"},
    }  # fmt: skip
    _float8(inp, sections, shard * par.cp > 1)
    if inp.optimizer.name != "adamw":
        raise _refuse("torchtitan's file", f"the optimizer {inp.optimizer.name} (written: AdamW)", "give --optimizer adamw")
    files = {"torchtitan.toml": _toml(sections)}
    read_back: tuple[tuple[str, str], ...] = (("--torchtitan-config", "torchtitan.toml"),)
    v02 = f"{_torchrun(inp)} -m torchtitan.train --job.config_file torchtitan.toml"
    fill_in = ["[model] hf_assets_path: the tokenizer (and weights) torchtitan's download_hf_assets.py fetched",
               "[training] dataset and steps; [checkpoint] enable and folder to save or resume",
               "[optimizer] lr and [lr_scheduler] as your recipe has them"]  # fmt: skip
    args, why = _args_03(inp, w, sections)
    if args is None:
        return Written(framework="torchtitan", files=files, read_back=read_back, flags={}, launch=v02, fill_in=fill_in,
                       notes=[f"torchtitan_args.txt (torchtitan 0.3) is not written: {why}; torchtitan.toml runs "
                              "under v0.1/v0.2"])  # fmt: skip
    files["torchtitan_args.txt"] = args
    return Written(
        framework="torchtitan", files=files,
        read_back=(*read_back, ("--torchtitan-config", "torchtitan_args.txt")), flags={},
        launch=f"# torchtitan 0.3: a registered config and its overrides. For v0.1/v0.2 run instead:\n#   {v02}\n"
               f"{_torchrun(inp)} -m torchtitan.train $(grep -v '^#' torchtitan_args.txt)",
        fill_in=[*fill_in, "torchtitan 0.3 (torchtitan_args.txt): --hf_assets_path; the dataset, steps, checkpoint, "
                           "lr and schedule as overrides before the activation_checkpoint line (--dataloader.dataset, "
                           "--training.steps, --checkpoint.enable, ...)"],
    )  # fmt: skip


def _args_03(inp: Any, w: Any, sections: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """torchtitan 0.3's arguments for the same run (``memcalc.configs.torchtitan_args``), or None and why not:
    its llama3 configs fix float8 (405B's rowwise linears, the others none) and its selective AC is per-op only."""
    from memcalc.configs.torchtitan_args import CONFIG_OF, write_args

    config = CONFIG_OF.get(inp.model.name or "")
    if config is None:
        return None, f"torchtitan 0.3 registers no config memcalc reads for {inp.model.name}"
    if (inp.float8 != "none") != (config == "llama3_405b") or inp.float8 not in ("none", "rowwise"):
        return None, (f"its {config} has {'rowwise float8 linears' if config == 'llama3_405b' else 'no float8'}, "
                      f"fixed by the registered config (this run: float8 {inp.float8})")
    ac = sections["activation_checkpoint"]
    policy = {"none": "none", "full": "full"}.get(ac["mode"])
    if ac["mode"] == "selective":
        policy = {"op": "selective", "1": "full"}.get(str(ac.get("selective_ac_option")))
    if policy is None:
        return None, f"its selective AC is per-op only (this run: recompute {w.recompute})"
    t, par = sections["training"], sections["parallelism"]
    over: list[tuple[str, Any]] = [("hf_assets_path", "./assets/hf/FILL_IN")]
    over += [(f"parallelism.{k}", v) for k, v in par.items()]
    over += [(f"training.{k}", t[k]) for k in ("local_batch_size", "global_batch_size", "seq_len")]
    over += [(f"training.{k}", v) for k, v in t.items() if k in ("dtype", "mixed_precision_param", "enable_cpu_offload")]
    over += [("training.disable_cuda_graphs", True), ("compile.enable", sections["compile"]["enable"]),
             ("compile.components", sections["compile"]["components"])]  # fmt: skip
    if config == "llama3_405b":
        over.append(("compile.enable_async_tensor_parallel", False))  # counted as plain TP
    return write_args(config, over, policy), ""


def _mesh(e: Any, s: Any, dp: int, cp: int) -> tuple[int, int, str]:
    """(dp_replicate, dp_shard, fsdp_reshard_after_forward) for memcalc's strategy."""
    if s.name in ("ddp", "zero-0"):
        return dp, 1, "default"
    if e.input.framework.fsdp_version != 2 or s.name == "NO_SHARD" or s.name not in (
            "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        fsdp1 = e.input.framework.fsdp_version != 2 and not s.name.startswith("zero")
        raise _refuse("torchtitan", f"the strategy {s.name}{' under FSDP1' if fsdp1 else ''} "
                                    "(torchtitan runs FSDP2, HSDP or DDP)", "write it for deepspeed or accelerate")
    if dp * cp == 1:  # parallelize.py: fully_shard only where dp_shard or cp is enabled (a degree above 1)
        raise _refuse("torchtitan", f"{s.name} over one data-parallel rank (torchtitan applies FSDP only where "
                                    "data_parallel_shard_degree or context_parallel_degree is above 1)",
                      "give more GPUs to data parallelism, or --ddp")
    # torchtitan's "default" reshards after forward except under pipeline parallelism
    keep = s.name in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
    piped = e.input.parallelism.pp > 1
    reshard = ("default" if piped else "never") if keep else ("always" if piped else "default")
    if s.name in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return 1, dp, reshard
    group = (s.shard_group or e.input.cluster.gpus_per_node) // cp
    if group < 1 or dp % group:
        raise _refuse("torchtitan", f"a shard group of {s.shard_group} over dp {dp} x cp {cp}")
    return dp // group, group, reshard


def _schedule(par: Any) -> dict[str, Any]:
    if par.virtual_stages == 1:
        return {"pipeline_parallel_schedule": "1F1B"}
    if par.virtual_stages == 2:
        return {"pipeline_parallel_schedule": "Interleaved1F1B"}
    raise _refuse("torchtitan's file", f"{par.virtual_stages} model chunks per pipeline rank (written: 1F1B or "
                                       "Interleaved1F1B's two)", "give --virtual-stages 1 or 2")  # fmt: skip


def _precision(name: str, strategy: str) -> dict[str, Any]:
    if name == "bf16":
        return {"dtype": "bfloat16"}
    if name == "fp32":
        return {"mixed_precision_param": "float32"}
    if name in ("bf16-mixed", "amp-bf16"):
        return {"mixed_precision_param": "bfloat16"}
    raise _refuse("torchtitan", f"precision {name} (torchtitan trains in bf16 mixed precision, bf16 or fp32)",
                  "give --precision bf16-mixed")


def _checkpoint(recompute: str) -> dict[str, Any]:
    if recompute in ("none", "full"):
        return {"mode": recompute}
    if recompute == "op-sac":
        return {"mode": "selective", "selective_ac_option": "op"}
    if recompute.startswith("every:"):
        return {"mode": "selective", "selective_ac_option": recompute[6:]}
    raise _refuse("torchtitan", f"recompute {recompute!r} (torchtitan's modes: none, full, selective per op or every "
                                "k-th layer)", "give --recompute full, op-sac or every:K")  # fmt: skip


def _float8(inp: Any, sections: dict[str, dict[str, Any]], sharded: bool) -> None:
    if inp.float8 == "none":
        return
    sections["model"]["converters"] = ["quantize.linear.float8"]
    body: dict[str, Any] = {"filter_fqns": ["output"]}
    if inp.float8 == "rowwise":
        body["recipe_name"] = "rowwise"
    elif inp.float8_all_gather:
        body["enable_fsdp_float8_all_gather"] = True
        body["precompute_float8_dynamic_scale_for_fsdp"] = True
    sections["quantize.linear.float8"] = body


# --------------------------------------------------------------------------------------------
# Megatron-LM
# --------------------------------------------------------------------------------------------


def megatron(e: Any) -> Written:
    inp, par, w, dp, mb, ga = _common(e)
    script_flags(inp, "Megatron-LM")
    s = inp.strategy
    if s.name not in ("zero-0", "zero-1", "ddp") or s.offload_optimizer != "none" or s.offload_params != "none":
        raise _refuse("Megatron-LM", f"the strategy {s.name}{'+offload' if s.offload_optimizer != 'none' else ''} "
                                     "(Megatron-LM runs DDP or its distributed optimizer, ZeRO-1)",
                      "write it for deepspeed or torchtitan")  # fmt: skip
    args: list[tuple[str, Any]] = [("--tensor-model-parallel-size", par.tp), ("--pipeline-model-parallel-size", par.pp)]
    if par.virtual_stages > 1:
        layers = inp.model.architecture.layers if inp.model.architecture is not None else 0
        if not layers or layers % (par.pp * par.virtual_stages) or inp.parallelism.stage_layers is not None:
            raise _refuse("Megatron-LM's arguments", f"{layers or 'the'} layers over pp {par.pp} x {par.virtual_stages} "
                                                     "chunks unevenly (written: the same layers in every chunk)")
        args.append(("--num-layers-per-virtual-pipeline-stage", layers // (par.pp * par.virtual_stages)))
    args.append(("--context-parallel-size", par.cp))
    if par.ep > 1:
        args.append(("--expert-model-parallel-size", par.ep))
    if par.sequence_parallel:
        args.append(("--sequence-parallel", None))
        if par.tp > 1:  # the step time counts Transformer Engine's overlap of these collectives (time/kernels.py)
            args.append(("--tp-comm-overlap", None))
    if inp.framework.defer_embedding_wgrad is not None:  # the output layer's wgrad at the pipeline flush
        args += [("--defer-embedding-wgrad-compute", None), ("--wgrad-deferral-limit", inp.framework.defer_embedding_wgrad)]
    if s.name == "zero-1":
        args.append(("--use-distributed-optimizer", None))
    args += _megatron_recompute(w.recompute)
    args += [("--micro-batch-size", mb), ("--global-batch-size", mb * ga * dp), ("--seq-length", w.seq_len)]
    args += _megatron_precision(inp)
    shape = _megatron_shape(inp.model.architecture, w.seq_len)
    args += shape
    text = ("# Megatron-LM pretrain_gpt.py options written by memcalc (megatron/training/arguments.py names)\n"
            + "".join(f"{k}\n" if v is None else f"{k} {v}\n" for k, v in args))
    shape_fill = "" if shape else "    --num-layers FILL_IN --hidden-size FILL_IN --num-attention-heads FILL_IN \\\n"
    return Written(
        framework="megatron", files={"megatron_args.txt": text},
        read_back=(("--megatron-args", "megatron_args.txt"),), flags={"gpus": inp.cluster.gpus},
        launch=f"{_torchrun(inp)} pretrain_gpt.py $(grep -v '^#' megatron_args.txt) \\\n"
               f"{shape_fill}    --data-path FILL_IN --tokenizer-type FILL_IN --save FILL_IN --load FILL_IN",
        fill_in=[*([] if shape else ["the model's shape (--num-layers, --hidden-size, --num-attention-heads, ...) "
                                     "in launch.sh"]),
                 "--data-path, the tokenizer, --train-iters and the learning-rate schedule",
                 "--save / --load: the checkpoint folder"],
        notes=["the world size is torchrun's (nodes x GPUs per node); memcalc reads it from --gpus"],
    )  # fmt: skip


MEGATRON_SHAPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral")
"""Families whose decoder layer Megatron-Core's GPT layer builds as it is: pre-RMSNorm, rotary, SwiGLU (SiLU-gated)
MLP, optional QKV bias (qwen2) and per-head QK norm (qwen3), MoE with a top-k router (mixtral)."""


def _megatron_shape(arch: Any, seq_len: int) -> list[tuple[str, Any]]:
    """The model's shape as Megatron-LM's options (megatron/training/arguments.py ``_add_network_size_args``,
    ``_add_moe_args``), where its GPT layer builds this model as it is; else nothing (launch.sh asks for it)."""
    if (arch is None or arch.family not in MEGATRON_SHAPES or arch.norm != "rmsnorm" or arch.norm_placement != "pre"
            or arch.position != "rotary" or not arch.gated_mlp or arch.sliding_layers or arch.parallel_block
            or arch.attention_softcap or arch.logit_softcap or arch.out_bias or arch.mlp_bias or arch.nope_layers
            or arch.rotary_dims is not None or arch.embedding_norm or arch.shared_experts or arch.moe_every != 1):
        return []
    out: list[tuple[str, Any]] = [("--num-layers", arch.layers), ("--hidden-size", arch.hidden),
                                  ("--ffn-hidden-size", arch.ffn), ("--num-attention-heads", arch.heads)]
    if arch.kv_heads != arch.heads:
        out += [("--group-query-attention", None), ("--num-query-groups", arch.kv_heads)]
    if arch.head_dim is not None and arch.head_dim * arch.heads != arch.hidden:
        out.append(("--kv-channels", arch.head_dim))
    out += [("--max-position-embeddings", max(seq_len, arch.max_positions)), ("--position-embedding-type", "rope"),
            ("--normalization", "RMSNorm"), ("--swiglu", None)]
    if not arch.tied_embeddings:
        out.append(("--untie-embeddings-and-output-weights", None))
    out.append(("--disable-bias-linear", None))
    if arch.qkv_bias:
        out.append(("--add-qkv-bias", None))
    if arch.qk_norm:
        out.append(("--qk-layernorm", None))
    if arch.experts:
        out += [("--num-experts", arch.experts), ("--moe-router-topk", arch.top_k)]
        if arch.expert_ffn is not None and arch.expert_ffn != arch.ffn:
            out.append(("--moe-ffn-hidden-size", arch.expert_ffn))
    return out


def _megatron_recompute(recompute: str) -> list[tuple[str, Any]]:
    if recompute == "none":
        return []
    if recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    head, _, rest = recompute.partition(":")
    if head == "selective" and rest:  # selective:core_attn+mlp: --recompute-modules core_attn mlp
        return [("--recompute-granularity", "selective"), ("--recompute-modules", " ".join(rest.split("+")))]
    if head == "full" and rest:  # full:block:N, full:uniform:N
        method, _, n = rest.partition(":")
        return [("--recompute-granularity", "full"), ("--recompute-method", method), ("--recompute-num-layers", n)]
    raise _refuse("Megatron-LM", f"recompute {recompute!r} (Megatron-LM's: selective, selective:MODULES, full, "
                                 "full:uniform:N, full:block:N)",
                  "give one of those, or write it for torchtitan")  # fmt: skip


def _megatron_precision(inp: Any) -> list[tuple[str, Any]]:
    name = inp.precision.name
    out: list[tuple[str, Any]] = {"bf16-mixed": [("--bf16", None)], "fp16-mixed": [("--fp16", None)],
                                  "fp32": []}.get(name, None)  # type: ignore[assignment]
    if out is None:
        raise _refuse("Megatron-LM", f"precision {name} (Megatron-LM keeps fp32 main weights under --bf16/--fp16)",
                      "give --precision bf16-mixed")
    if inp.float8 == "tensorwise":
        out += [("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")]
        if inp.float8_all_gather:
            out.append(("--fp8-param-gather", None))
    elif inp.float8 != "none":
        raise _refuse("Megatron-LM", f"float8 {inp.float8} (Transformer Engine's recipes here: tensorwise)")
    if inp.framework.grad_reduce_dtype == "bf16":
        out.append(("--grad-reduce-in-bf16", None))
    return out
