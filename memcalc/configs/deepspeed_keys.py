"""The keys DeepSpeed 0.19 knows, and what each means for per-GPU memory.

Sources (DeepSpeed 0.19): runtime/config.py (``DeepSpeedConfig._initialize_params``, the top-level keys it reads,
``_REMOVED_TOP_LEVEL_CONFIG_KEYS``), runtime/zero/config.py (``DeepSpeedZeroConfig``, ``extra="forbid"``, each
``stage3_*`` knob also accepted under its field name), runtime/zero/offload_config.py, runtime/precision_config.py,
runtime/activation_checkpointing/config.py, runtime/tensor_parallel/config.py. tests/test_configs.py checks these
sets against the installed DeepSpeed's own models.
"""

from __future__ import annotations

# Top-level keys DeepSpeed reads, with the reason each does not change what a GPU holds.
TOP_IGNORED: dict[str, str] = {
    "gradient_clipping": "clipping reads the gradients already held",
    "steps_per_print": "logging", "wall_clock_breakdown": "timers", "memory_breakdown": "logging",
    "dump_state": "logging", "log_level": "logging", "timers": "timers", "comms_logger": "logging",
    "tensorboard": "monitoring", "wandb": "monitoring", "csv_monitor": "monitoring", "comet": "monitoring",
    "flops_profiler": "profiling", "autotuning": "autotuning runs, not training memory",
    "scheduler": "learning-rate schedule", "prescale_gradients": "scaling, not storage",
    "gradient_predivide_factor": "scaling, not storage", "gradient_allreduce_op": "sum or mean, not storage",
    "disable_allgather": "collective choice", "disable_python_gc": "host garbage collection",
    "checkpoint": "checkpoint files", "datastates_ckpt": "checkpoint files", "aio": "NVMe I/O tuning (host side)",
    "dataloader_drop_last": "data loading", "vocabulary_size": "alignment warning only",
    "zero_allow_untested_optimizer": "permission flag", "zero_force_ds_cpu_optimizer": "permission flag",
    "use_data_before_expert_parallelism": "rank ordering", "managed_gradient_accumulation": "bookkeeping",
    "seq_parallel_communication_data_type": "collective dtype of Ulysses all-to-alls",
    "hybrid_engine": "RLHF generation engine (inference)", "data_efficiency": "data sampling",
}  # fmt: skip

# Top-level keys that change memory in ways memcalc does not model.
TOP_UNMODELLED: dict[str, str] = {
    "communication_data_type": "dtype of gradient collectives (bucket sizes follow it)",
    "data_types": "grad_accum_dtype / param_dtype change gradient and parameter bytes",
    "torch_autocast": "DeepSpeed's torch.autocast mode keeps fp32 parameters and casts per op",
    "compile": "torch.compile / DeepCompile change activation memory",
    "pipeline": "DeepSpeed pipeline engine settings (give pp=)",
    "expert_parallel": "expert parallelism layout",
    "weight_quantization": "quantized weights",
    "sequence_parallel_size": "Ulysses sequence parallelism (activations split over the sequence)",
}

# Read by the reader (precision, batch, ZeRO, optimizer, tensor parallelism, activation checkpointing).
TOP_READ = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16",
    "bfloat16", "zero_optimization", "optimizer", "tensor_parallel", "activation_checkpointing",
)  # fmt: skip

# DeepSpeed 0.19 raises DeepSpeedConfigError on these (runtime/config.py _REMOVED_TOP_LEVEL_CONFIG_KEYS).
TOP_REMOVED = (
    "nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop",
)  # fmt: skip
ZERO_REMOVED = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")
REMOVED_FROM = (0, 19, 7)
"""The first DeepSpeed release that refuses ``TOP_REMOVED`` and ``ZERO_REMOVED`` (``_reject_removed_config_keys``);
0.19.6 and earlier read them, so files of that time (DeepSpeedExamples' ``"amp"``, ``"curriculum_learning"``,
``"elasticity"`` blocks) ran."""
REMOVED_EFFECT: dict[str, str] = {
    "nebula": "", "compression_training": "compressed (quantized, pruned) layers",
    "amp": "NVIDIA Apex AMP's mixed precision (its opt level decides the weights' and gradients' dtypes)",
    "quantize_training": "quantized weights (MoQ)", "sparse_gradients": "", "eigenvalue": "",
    "sparse_attention": "block-sparse attention (what attention saves)",
    "elasticity": "the batch elasticity picks (the file's batch keys counted)",
    "graph_harvesting": "", "curriculum_learning": "a shorter sequence early in training (the full one counted)",
    "progressive_layer_drop": "", "mics_shard_size": "MiCS: ZeRO-3 sharded within groups of this size",
    "mics_hierarchical_params_gather": "", "zeropp_loco_param": "",
}
"""What an enabled removed block did to a GPU's memory ("": nothing memcalc counts)."""

TOP_KNOWN = (*TOP_READ, *TOP_IGNORED, *TOP_UNMODELLED)

# zero_optimization: the stage3_* alias and the field name are the same setting (pydantic alias).
ZERO_ALIASES: dict[str, str] = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}

# zero_optimization fields by type; "int" fields are pydantic ints (5e8 as a number is accepted).
ZERO_INT = ("reduce_bucket_size", "allgather_bucket_size", "sub_group_size", "prefetch_bucket_size",
            "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters",
            "max_reuse_distance", "module_granularity_threshold", "zero_hpz_partition_size")  # fmt: skip
ZERO_BOOL = (
    "contiguous_gradients", "reduce_scatter", "use_multi_rank_bucket_allreduce", "allgather_partitions",
    "overlap_comm", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "gather_16bit_weights_on_model_save",
    "use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients", "parameter_alignment",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "enable_sanity_checks", "save_muon_momentum_buffer_in_memory",
)  # fmt: skip
ZERO_OTHER = ("stage", "offload_param", "offload_optimizer", "zenflow", "leaf_module")
ZERO_FIELDS = (*ZERO_INT, *ZERO_BOOL, *ZERO_OTHER)
ZERO_KNOWN = (*ZERO_FIELDS, *ZERO_ALIASES)

# What each zero_optimization setting does to memory, when it is not read into the arguments.
ZERO_UNMODELLED: dict[str, str] = {
    "reduce_bucket_size": "gradient reduce bucket (elements), held during backward",
    "allgather_bucket_size": "parameter all-gather bucket (elements) after the step (stages 1-2)",
    "contiguous_gradients": "contiguous gradient buffer (stages 2-3)",
    "sub_group_size": "optimizer sub-group flat buffers (ZeRO-3; read by the realistic accounting)",
    "model_persistence_threshold": "cap on persistent (unpartitioned) parameters",
    "module_granularity_threshold": "fetch granularity of small modules (ZeRO-3)",
    "allgather_sequential": "per-parameter gathers without flattening buffers (ZeRO-3)",
    "zero_hpz_partition_size": "ZeRO++ hpZ: a secondary copy of the parameters within a node",
    "zero_quantized_weights": "ZeRO++ qwZ quantized gathers", "zero_quantized_gradients": "ZeRO++ qgZ",
    "zero_quantized_nontrainable_weights": "frozen weights kept quantized",
    "parameter_alignment": "16-byte padding of flat buffers", "leaf_module": "ZeRO-3 leaf modules fetched whole",
    "zenflow": "ZenFlow stall-free offload", "memory_efficient_linear": "ZeRO-3 linear that saves less",
    "round_robin_gradients": "gradient copy order under offload", "legacy_stage1": "old ZeRO-1 implementation",
}  # fmt: skip
ZERO3_KNOBS = {  # zero_optimization field -> memcalc.estimate argument
    "max_reuse_distance": "max_reuse_distance", "max_live_parameters": "max_live_parameters",
    "prefetch_bucket_size": "prefetch_bucket_size", "param_persistence_threshold": "persistence_threshold",
}  # fmt: skip
ZERO3_ONLY = (*ZERO3_KNOBS.values(), "sub_group_size")
"""The memcalc.estimate arguments a ZeRO-3 config sets that apply to stage 3 alone (the coordinator's settings and
the optimizer's sub-groups)."""

OFFLOAD_OPTIMIZER_KEYS = ("device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
                          "fast_init", "ratio", "super_offload", "cpuadam_cores_perc")  # fmt: skip
OFFLOAD_PARAM_KEYS = ("device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")

FP16_KEYS = ("enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads")  # fmt: skip
BF16_KEYS = ("enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
             "bf16_optimizer_states")  # fmt: skip
BF16_LEGACY_KEYS = ("auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                    "consecutive_hysteresis", "min_loss_scale")  # fmt: skip
"""fp16's loss-scaling keys in a bf16 section: DeepSpeed before 0.17 read bf16's ``enabled`` alone and passed
over them (runtime/config.py ``get_bfloat16_enabled``); 0.17 made the section a pydantic model with
``extra="forbid"`` (runtime/precision_config.py ``DeepSpeedBF16Config``), which refuses them. Many published
bf16 configs carry them, copied from an fp16 block."""
BF16_STRICT_FROM = (0, 17)
"""The first DeepSpeed release whose bf16 section refuses ``BF16_LEGACY_KEYS``."""
ACTIVATION_CHECKPOINTING_KEYS = ("partition_activations", "number_checkpoints", "contiguous_memory_optimization",
                                 "synchronize_checkpoint_boundary", "profile", "cpu_checkpointing")  # fmt: skip
TENSOR_PARALLEL_KEYS = ("autotp_size", "tp_overlap_comm", "vocab_parallel_lm_head", "vocab_parallel_ce_backend",
                        "tp", "tensor_parallel", "dtype", "injection_policy_tuple", "partition_config", "preset_model",
                        "keep_module_on_host", "replace_with_kernel_inject", "kernel_inject")  # fmt: skip

# compile (DeepSpeed 0.19 compile/config.py ``CompileConfig``, ``extra="forbid"``): DeepCompile's options. Whether
# the model is compiled is the training script's call (``engine.compile()``), not a key of this section.
COMPILE_KEYS = ("deepcompile", "autoep_non_moe", "free_activation", "free_activation_threshold", "offload_activation",
                "offload_activation_pin_memory", "offload_opt_states", "double_buffer", "symmetric_memory",
                "debug_log", "offload_parameters", "sync_before_reduce", "sync_after_reduce", "sync_before_allgather",
                "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors", "passes")  # fmt: skip

COMPILE_RELEASES = (((0, 13, 2), ("enabled", "backend", "kwargs")), ((0, 14, 4), None), ((0, 16, 6), COMPILE_KEYS))
"""How DeepSpeed read the compile section from each release on (None: passed over). 0.13.2 built its first
``CompileConfig(enabled, backend, kwargs)`` (extra="forbid"); 0.14.4 removed it, and DeepSpeed ignores unknown
top-level keys, so files of that time ran (axolotl's ``disable``, ``backend``); 0.16.6 (DeepCompile) parses
``COMPILE_KEYS``. Before 0.13.2 the section was passed over too."""

# optimizer.type (case-insensitive) -> memcalc optimizer, and what the mapping leaves out.
# DeepSpeed's own optimizers (runtime/config.py DEEPSPEED_OPTIMIZERS); other names are torch.optim classes.
OPTIMIZERS: dict[str, tuple[str | None, str | None]] = {
    "adam": ("adamw", None), "adamw": ("adamw", None),
    "lamb": ("adamw", "Lamb keeps Adam's m and v; counted as AdamW"),
    "onebitadam": ("adamw", "1-bit Adam's error-feedback buffers are not counted"),
    "zerooneadam": ("adamw", "0/1 Adam's error-feedback buffers are not counted"),
    "onebitlamb": ("adamw", "1-bit Lamb's error-feedback buffers are not counted"),
    "muadam": ("adamw", None), "muadamw": ("adamw", None),
    "musgd": ("sgd-momentum", None), "lion": ("lion", None), "sgd": ("sgd", None),
    "adagrad": ("sgd-momentum", "Adagrad keeps one full-size state (sum of squares); counted as momentum SGD"),
    "muon": (None, "Muon's momentum and orthogonalisation buffers are not modelled"),
}  # fmt: skip
