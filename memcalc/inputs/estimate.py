"""Everything one estimate needs, with the invariants that tie the parts together."""

from typing import Literal

from pydantic import field_validator


from memcalc.errors import InputError
from memcalc.validated import Validated, bounded
from memcalc.inputs.hardware import GPU, Cluster, Overheads, check_precision
from memcalc.inputs.finetune import Lora
from memcalc.inputs.model import Model
from memcalc.inputs.strategy import EstimatorOptions, FrameworkOptions, Parallelism, Strategy, Timing
from memcalc.inputs.dtypes import OPTIMIZERS, PRECISIONS, Optimizer, Precision, from_core
from memcalc.memory.families.megatron_saved import megatron_recompute
from memcalc.inputs.workload import MAX_MICRO_BATCHES, Workload


Accounting = Literal["realistic", "paper", "implementation", "deepspeed-estimator"]


class EstimateInput(Validated):
    """Everything one estimate needs."""

    model: Model
    """The model being trained: a parameter count or an architecture."""
    precision: Precision = PRECISIONS["bf16-mixed"]
    """Bytes per element of parameters, gradients and master copy (memcalc.PRECISIONS)."""
    optimizer: Optimizer = OPTIMIZERS["adamw"]
    """The optimizer's state per parameter (memcalc.OPTIMIZERS)."""
    gpu: GPU
    """The accelerator, as its datasheet describes it."""
    cluster: Cluster
    """The world size and the GPUs per node."""
    strategy: Strategy = Strategy()
    """The data-parallel strategy and where it offloads."""
    parallelism: Parallelism = Parallelism()
    """Tensor, pipeline, context and expert parallelism, and the framework that composes them."""
    workload: Workload | None = None
    """None: model states only (no activations)."""
    overheads: Overheads = Overheads()
    """GPU memory that is not model state (CUDA context, allocator headroom)."""
    grad_accum: int = bounded(default=1, gt=0, le=MAX_MICRO_BATCHES, why="680x GPT-3's whole batch")
    """Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches)."""
    accounting: Accounting = "paper"
    """Which accounting: ``paper`` is the ZeRO paper's (§5) and Korthikanti et al.'s; ``deepspeed-estimator``
    is DeepSpeed's own estimate_zero2/3_model_states_mem_needs."""
    estimator: EstimatorOptions = EstimatorOptions()
    """Arguments of DeepSpeed's estimator (accounting deepspeed-estimator)."""
    framework: FrameworkOptions = FrameworkOptions()
    """How the framework is configured (FSDP version, prefetch, DeepSpeed's ZeRO-3 knobs, buckets)."""
    timing: Timing = Timing()
    """How the step is timed: cluster, link overrides, tokens and price (``memcalc.time``)."""
    lora: Lora | None = None
    """LoRA/QLoRA fine-tuning of a frozen base (``memcalc.model.lora``); None: every parameter trains."""
    float8: Literal["none", "tensorwise", "rowwise"] = "none"
    """torchao float8 training of the decoder layers' linears (``memcalc.model.float8``): none, tensorwise or rowwise
    dynamic scaling; every GEMM of a converted linear (forward, input and weight gradients) runs in fp8."""
    float8_all_gather: bool = False
    """FSDP2 all-gathers the converted weights in fp8 (torchao ``enable_fsdp_float8_all_gather``; tensorwise only)."""
    assumed: tuple[str, ...] = ()
    """Values ``build_input`` chose where none was given and that change the answer (the precision: the framework's
    own), each ending with the argument that gives yours (``pass precision=``): the output's header shows them."""

    @field_validator("precision", "optimizer", mode="before")
    @classmethod
    def _row(cls, v: object) -> object:
        """The core's own table row (``memcalc.layout.dtypes.PRECISIONS[...]``) is taken as the same row."""
        return from_core(v)

    def _check(self) -> None:
        if self.workload is not None and self.workload.attention is None:  # a Workload made without one
            from memcalc.memory.accountings.scope import default_attention

            chosen = default_attention(self.model.architecture, self.accounting)
            self._set("workload", self.workload.model_copy(update={"attention": chosen}))
        par, w, g = self.parallelism, self.cluster.gpus, self.cluster.gpus_per_node
        mp = par.model_parallel
        if w % mp:
            raise InputError(
                f"tp({par.tp}) * pp({par.pp}) * cp({par.cp}) = {mp} does not divide gpus({w}); "
                f"dp = gpus / (tp * pp * cp) must be a whole number"
            )
        dp = w // mp
        # Megatron-Core carves the expert groups out of the data x context ranks (parallel_state.py: expert data
        # parallel = world / (ep x etp x pp), etp = tp here); the other frameworks out of the data-parallel ones
        ranks, which = ((dp * par.cp, f"dp({dp}) x cp({par.cp}), the ranks Megatron-Core forms expert groups from")
                        if par.framework == "megatron" else
                        (dp, f"dp({dp}) = gpus({w}) / (tp({par.tp}) * pp({par.pp}) * cp({par.cp}))"))
        if par.ep > 1 and ranks % par.ep:
            raise InputError(f"ep({par.ep}) does not divide {which}")
        if par.virtual_stages > 1 and par.pp == 1:
            raise InputError(f"--virtual-stages {par.virtual_stages} needs pipeline parallelism (--pp > 1)")
        arch = self.model.architecture
        if self.lora is not None:
            self._lora_applies(arch)
        if self.float8 != "none" or self.float8_all_gather:
            self._float8_applies(arch)
        if self.framework.grad_reduce_dtype is not None:
            self._grad_reduce_applies()
        if self.framework.defer_embedding_wgrad is not None:
            n = self.framework.defer_embedding_wgrad
            if par.framework != "megatron":
                raise InputError(f"--defer-embedding-wgrad {n} is Megatron-Core's deferred output-layer wgrad: it "
                                 f"needs --framework megatron (got {par.framework or 'none'})")
            if par.pp == 1:  # model_parallel_config.py: "Cannot defer embedding wgrad compute when pipeline model
                # parallel is not used"
                raise InputError(f"--defer-embedding-wgrad {n} needs pipeline parallelism (--pp > 1): Megatron-Core "
                                 "defers the output layer's wgrad to the pipeline flush")
        check_precision(self.gpu, self.precision.name, self.precision.compute_dtype)
        self._accounting_applies(arch, dp)
        # A bare count has no layers to place on pipeline stages and no activations for tensor parallelism to
        # exchange: its tp/pp traffic cannot be counted, so a shape is needed rather than a split without traffic.
        needs_shape = [flag for flag, on in (("--seq-len", self.workload is not None), ("--tp", par.tp > 1),
                                             ("--pp", par.pp > 1), ("--cp", par.cp > 1),
                                             ("--ep", par.ep > 1), ("--virtual-stages", par.virtual_stages > 1)) if on]  # fmt: skip
        if arch is None and needs_shape:
            raise InputError(f"{', '.join(needs_shape)} needs the model's shape: give --model, --hf-config or --layers/--hidden/--heads/--vocab")
        if arch is not None:
            from memcalc.model.params import check_tp

            check_tp(arch, par.tp)
            _ = self.stage_layers  # a split that does not add up, or one the framework would not make: one line
            if par.ep > 1 and (not arch.moe or arch.experts % par.ep):
                raise InputError(f"ep({par.ep}) needs an MoE model whose experts ({arch.experts}) it divides")
            if self.workload is not None and arch.position == "learned" and self.workload.seq_len > arch.max_positions:
                raise InputError(
                    f"--seq-len {self.workload.seq_len} is longer than {arch.name or 'the model'}'s learned position "
                    f"table; accepted: at most {arch.max_positions:,} (max_positions)"
                )
            if self.workload is not None and self.workload.seq_len % par.cp:
                raise InputError(f"cp({par.cp}) does not divide seq_len({self.workload.seq_len})")
        spec = self.strategy.spec
        if self.accounting == "deepspeed-estimator":
            if spec.name not in ("zero-1", "zero-2", "zero-3"):
                raise InputError(f"--accounting deepspeed-estimator covers DeepSpeed ZeRO stages 1-3 (--stage 1|2|3), not {spec.label}")
            if self.workload is not None or mp > 1:
                raise InputError("--accounting deepspeed-estimator counts model states on plain data parallelism only, "
                                 "as DeepSpeed's functions do; drop --seq-len, --tp, --pp and --cp")  # fmt: skip
            if spec.name == "zero-3" and arch is None and self.estimator.largest_layer_params is None:
                raise InputError("DeepSpeed's ZeRO-3 estimator needs the largest layer: give --model/--hf-config or "
                                 "--largest-layer-params")  # fmt: skip
            self.estimator.check_largest(self.model.parameters if arch is None else None, arch)
        if self.accounting == "implementation":
            if spec.framework == "deepspeed" and self.optimizer.name not in ("adamw", "sgd", "sgd-momentum"):
                raise InputError(f"--accounting implementation models DeepSpeed with a torch.optim client optimizer; "
                                 f"{self.optimizer.name} is not one")  # fmt: skip
            if arch is None:
                raise InputError("--accounting implementation follows the framework unit by unit: give the model's shape "
                                 "(--model, --hf-config or --layers/--hidden/--heads/--vocab)")  # fmt: skip
            if mp > 1 or par.ep > 1:
                raise InputError("--accounting implementation covers data parallelism (DDP, FSDP) only so far; drop --tp, --pp, --cp, --ep")
            if self.strategy.offload_params != "none" or self.strategy.offload_optimizer != "none":
                raise InputError("--accounting implementation does not model CPU offload yet; use --accounting paper")
        mnp = self.framework.min_num_params
        if mnp is not None and (spec.framework != "fsdp" or self.framework.fsdp_version != 1 or self.accounting != "implementation"):
            raise InputError("--min-num-params is FSDP1's size_based_auto_wrap_policy: it needs --fsdp with --fsdp-version 1 "
                             f"and --accounting implementation (got {spec.label}"
                             f"{', --fsdp-version 2' if spec.framework == 'fsdp' and self.framework.fsdp_version == 2 else ''}, "
                             f"--accounting {self.accounting})")  # fmt: skip
        # Framework settings that no accounting of this set-up reads would be ignored: refuse them, naming the use.
        fw, est = self.framework, self.estimator
        if fw.fsdp_version == 2 and spec.framework != "fsdp":
            raise InputError(f"--fsdp-version 2 describes FSDP (fully_shard); it needs --fsdp (got {spec.label})")
        if fw.backward_prefetch is not None and (spec.framework != "fsdp" or fw.fsdp_version != 1):
            raise InputError(f"--backward-prefetch is FSDP1's BackwardPrefetch; it needs --fsdp with --fsdp-version 1 "
                             f"(got {spec.label}{', --fsdp-version 2' if spec.framework == 'fsdp' else ''}; FSDP2 "
                             "prefetches the next unit by itself)")
        if fw.fsdp_wrap is not None and (spec.framework != "fsdp" or fw.fsdp_version != 2):
            raise InputError(f"--fsdp-wrap places the embedding and the head among FSDP2's units; it needs --fsdp with "
                             f"--fsdp-version 2 (got {spec.label}{', --fsdp-version 1' if spec.framework == 'fsdp' else ''})")
        if fw.fsdp_auto_wrap is not None and spec.framework != "fsdp":
            raise InputError(f"--fsdp-auto-wrap chooses FSDP's units over the decoder layers; it needs --fsdp (got "
                             f"{spec.label})")
        if fw.fsdp_auto_wrap == "none" and self.accounting == "implementation":
            raise InputError("--fsdp-auto-wrap none with --accounting implementation: it counts FSDP's states and "
                             "gathered units, not the whole model's unsharded gradients NO_WRAP holds to the end of "
                             "the backward; use --accounting realistic (or paper)")
        if fw.fsdp_auto_wrap == "none" and self.parallelism.framework in ("torchtitan", "torchtune", "megatron"):
            raise InputError(f"--fsdp-auto-wrap none with --framework {self.parallelism.framework}: it wraps every "
                             "decoder layer itself; NO_WRAP is accelerate's (--framework hf, or none)")
        if fw.bucket_view and spec.framework != "ddp":
            raise InputError(f"--bucket-view is DDP's gradient_as_bucket_view; it needs --ddp (got {spec.label})")
        if (est.buffer_factor != 1.5 or not est.zero_init or est.largest_layer_params is not None) \
                and self.accounting != "deepspeed-estimator":
            raise InputError("--buffer-factor, --no-zero-init, --largest-layer-params: arguments of DeepSpeed's "
                             f"estimator, used only with --accounting deepspeed-estimator (got {self.accounting})")
        if fw.overlap_comm is not None and spec.name not in ("zero-1", "zero-2"):
            raise InputError(f"--overlap-comm: DeepSpeed ZeRO-1/2's second gradient bucket; it needs --stage 1 or 2 "
                             f"(got {spec.label}; ZeRO-3 holds one bucket either way)")
        if fw.reduce_bucket_size is not None and spec.framework != "deepspeed":
            raise InputError(f"--reduce-bucket-size: DeepSpeed's gradient bucket; it needs --stage (got {spec.label})")
        z3 = self.framework.zero3_flags
        if fw.sub_group_size is not None and self.accounting == "implementation":
            raise InputError("--sub-group-size: the optimizer's sub-groups, which the realistic accounting's step "
                             "holds; the implementation accounting counts the states alone (give --accounting "
                             "realistic)")  # fmt: skip
        # under the paper's accounting they are kept and a note says they are not used (a config file's settings,
        # read for --accounting auto, stay with a step that auto answers with the paper's accounting)
        if z3 and (spec.name != "zero-3" or self.accounting == "deepspeed-estimator"):
            raise InputError(f"{', '.join(z3)}: DeepSpeed ZeRO-3 settings, used only with --stage 3 and "
                             f"--accounting realistic or implementation (--sub-group-size: realistic) (got "
                             f"{spec.label}, --accounting {self.accounting})")  # fmt: skip
        if self.framework.zero3_step != "steady" and self.accounting != "implementation":
            raise InputError(f"--zero3-step {self.framework.zero3_step}: the first step's gathers are replayed by "
                             f"--accounting implementation only (got --accounting {self.accounting}); the realistic "
                             "accounting models every step after the first")  # fmt: skip
        if par.stage_layers is not None and arch is None:
            raise InputError("--stage-layers needs the model's shape: give --model, --hf-config or --layers/--hidden/...")
        if self.strategy.shard_group is not None and not spec.hybrid:
            raise InputError(
                f"--shard-group applies to HYBRID_SHARD and _HYBRID_SHARD_ZERO2 only, not {spec.label}"
            )
        if spec.hybrid:
            f, domain = self.shard_group_size, self.shard_domain
            if f > domain or domain % f:
                what = f"dp({dp}) x cp({par.cp})" if self.shard_over == "dp-cp" and par.cp > 1 else f"{dp}"
                raise InputError(f"--shard-group {f} must divide the data-parallel size {what}")
            span = f * self.domain_stride
            if span > g and span % g:
                raise InputError(f"--shard-group {f} spans nodes, so it must fill whole nodes of --gpus-per-node {g}")

    def _float8_applies(self, arch: object) -> None:
        """Float8 converts the decoder layers' linears (torchao ``convert_to_float8_training``): it needs their shapes;
        the fp8 all-gather is FSDP2's and tensorwise scaling's (torchao fsdp_utils.py ``WeightWithDynamicFloat8CastTensor``)."""
        if arch is None:
            raise InputError("--float8 converts the decoder layers' linears: give the model's shape (--model, --hf-config)")
        megatron = self.parallelism.framework == "megatron"
        if getattr(arch, "moe", False) and not megatron:
            raise InputError("--float8 with a mixture of experts: torchao's grouped expert GEMMs are not modelled; use a "
                             "dense model or --float8 none")
        if megatron and self.float8_all_gather:
            if self.float8 != "tensorwise" or self.strategy.spec.name != "zero-1":
                raise InputError("--float8-all-gather under --framework megatron is --fp8-param-gather: it needs "
                                 f"--float8 tensorwise and the distributed optimizer (--stage 1); got --float8 "
                                 f"{self.float8} with {self.strategy.spec.label}")
        elif self.float8_all_gather and (self.float8 != "tensorwise" or self.strategy.spec.framework != "fsdp"
                                         or not self.strategy.spec.shards_params):
            raise InputError(f"--float8-all-gather needs --float8 tensorwise and FSDP parameter sharding (--fsdp "
                             f"FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD); got --float8 {self.float8} with "
                             f"{self.strategy.spec.label}")
        if not self.gpu.fp8:  # GPU.fp8: no fp8 tensor cores for torchao's float8 matmuls
            from memcalc.inputs.presets import gpu_names, load_gpu

            have = ", ".join(n for n in gpu_names() if load_gpu(n).fp8)
            raise InputError(f"--float8 needs fp8 tensor cores, which {self.gpu.key} lacks; give a --gpu with them "
                             f"({have}) or leave --float8 out")

    def _grad_reduce_applies(self) -> None:
        """The gradient buffer's dtype is Megatron-Core's, beside bf16 parameters (megatron/training/arguments.py:
        ``--bf16`` turns ``accumulate_allreduce_grads_in_fp32`` on unless ``--grad-reduce-in-bf16``)."""
        dtype = self.framework.grad_reduce_dtype
        if self.parallelism.framework != "megatron":
            raise InputError(f"--grad-reduce-dtype {dtype} is Megatron-Core's gradient buffer dtype: it needs "
                             f"--framework megatron (got {self.parallelism.framework or 'none'})")
        if self.precision.name != "bf16-mixed":
            raise InputError(f"--grad-reduce-dtype {dtype} applies beside bf16 parameters: it needs --precision "
                             f"bf16-mixed (got {self.precision.name})")

    def _lora_applies(self, arch: object) -> None:
        """LoRA needs the shape (its targets are the model's projections) and the layouts its counts cover."""
        from memcalc.model.lora import resolve_targets

        assert self.lora is not None
        resolve_targets(arch, self.lora.targets)  # type: ignore[arg-type]
        par = self.parallelism
        if par.tp > 1 or par.pp > 1 or par.ep > 1:
            raise InputError(f"--lora-rank with --tp {par.tp} --pp {par.pp} --ep {par.ep}: adapters under tensor, "
                             "pipeline or expert parallelism are not modelled; accepted: --tp 1 --pp 1 --ep 1")
        if self.accounting in ("implementation", "deepspeed-estimator"):
            raise InputError(f"--lora-rank: --accounting {self.accounting} replays full fine-tuning; accepted with "
                             "LoRA: --accounting paper or realistic")

    @property
    def lora_plan(self) -> object:
        """The core's ``LoraPlan`` (targets resolved against the shape), or None."""
        if self.lora is None:
            return None
        from memcalc.model.lora import resolve_targets

        return self.lora.plan(resolve_targets(self.model.architecture, self.lora.targets))

    def _accounting_applies(self, arch: object, dp: int) -> None:
        """The realistic accounting's inputs go with it; its set-ups are the ones it models."""
        w, par = self.workload, self.parallelism
        if self.accounting == "realistic":
            from memcalc.memory.accountings.scope import why_not

            why = why_not(arch, self.precision.name, self.optimizer.name, self.strategy.spec.name, w, par.tp,
                          par.pp, par.cp, par.ep, self.framework.fsdp_version, lora=self.lora,
                          framework=par.framework,
                          sequence_parallel=par.sequence_parallel,
                          offload=self.strategy.offload,
                          overlap_comm=bool(self.framework.overlap_comm), fsdp_wrap=self.framework.fsdp_wrap,
                          fsdp_auto_wrap=self.framework.fsdp_auto_wrap, float8=self.float8)
            if why is not None:
                raise InputError(f"--accounting realistic: {why}; use --accounting paper")
            from memcalc.layout.compose import composition

            impl = composition(par.framework).optimizer_impl
            if w is not None and self.strategy.offload_optimizer != "none" and w.optimizer_impl != impl:
                raise InputError(f"--optimizer-impl {w.optimizer_impl}: with the optimizer offloaded DeepSpeed steps "
                                 "with DeepSpeedCPUAdam on the host; leave --optimizer-impl out")
        elif w is not None:
            from memcalc.layout.compose import composition

            impl = composition(par.framework).optimizer_impl
            extra = [f"{flag} {v}" for flag, v, default in (("--loss", w.loss, "standard"),
                                                          ("--optimizer-impl", w.optimizer_impl, impl))
                     if v != default]
            # the paper accounting counts torchtitan's policies and torch.compile (as the eager layer) on a known shape
            paper_too = self.accounting == "paper" and arch is not None
            if megatron_recompute(w.recompute) or ((w.recompute.startswith("every:") or w.recompute == "op-sac")
                                                   and not paper_too):
                extra.append(f"--recompute {w.recompute}")
            if w.compile and not paper_too:
                extra.append("--compile")
            if extra:
                from memcalc.memory.accountings.scope import why_not

                why = why_not(arch, self.precision.name, self.optimizer.name, self.strategy.spec.name, w, par.tp,
                              par.pp, par.cp, par.ep, self.framework.fsdp_version, lora=self.lora,
                              framework=par.framework,
                              sequence_parallel=par.sequence_parallel,
                              offload=self.strategy.offload,
                              overlap_comm=bool(self.framework.overlap_comm),
                              fsdp_wrap=self.framework.fsdp_wrap,
                              fsdp_auto_wrap=self.framework.fsdp_auto_wrap, float8=self.float8)  # fmt: skip
                raise InputError(f"{', '.join(extra)}: what the step holds moment by moment, modelled by the realistic "
                                 f"accounting, which does not apply here ({why or 'not chosen'}); --accounting "
                                 f"{self.accounting} does not use it")

    @property
    def dp(self) -> int:
        """Data-parallel degree: gpus / (tp x pp x cp)."""
        return self.cluster.gpus // self.parallelism.model_parallel

    @property
    def dp_per_node(self) -> int:
        """Data-parallel ranks inside one node (tensor and context parallelism fill a node first)."""
        return max(1, min(self.dp, self.cluster.gpus_per_node // (self.parallelism.tp * self.parallelism.cp)))

    @property
    def shard_over(self) -> str:
        """dp-cp or dp: the override, else the framework's, else dp-cp (memcalc.layout.compose)."""
        from memcalc.layout.compose import framework, shard_over

        return shard_over(self.parallelism.shard_over, framework(self.parallelism.framework))

    @property
    def fsdp_wrap(self) -> str:
        """Where FSDP2's units put the embedding and the head: the override, else the framework's, else root; root
        for a tied embedding (memcalc.layout.compose.fsdp_wrap) and for every strategy but FSDP2."""
        from memcalc.layout.compose import framework, fsdp_wrap

        if self.strategy.spec.framework != "fsdp" or self.framework.fsdp_version != 2:
            return "root"
        arch = self.model.architecture
        tied = arch is not None and arch.tied_embeddings
        if self.framework.fsdp_auto_wrap == "none" and self.framework.fsdp_wrap is None:
            # NO_WRAP is accelerate's: 1.15 carves the embedding and [final norm, head] all the same
            return "root" if tied else "separate"
        return fsdp_wrap(self.framework.fsdp_wrap, framework(self.parallelism.framework), tied)

    @property
    def fsdp_prefetch(self) -> bool:
        """FSDP1 prefetches the next unit at each pre-backward (BACKWARD_PRE): the override, else none under
        ``--framework hf`` (accelerate's default, which the Hugging Face Trainer takes), else torch's own default."""
        given = self.framework.backward_prefetch
        if given is None:
            return self.parallelism.framework != "hf"
        return given == "pre"

    @property
    def shard_domain(self) -> int:
        """Ranks holding (shards of) one copy of the model states: dp x cp, or dp under ``shard_over`` dp."""
        return self.dp * self.parallelism.cp if self.shard_over == "dp-cp" else self.dp

    @property
    def domain_stride(self) -> int:
        """Ranks between neighbouring members of the shard domain (Megatron-LM's order tp, cp, dp, pp)."""
        par = self.parallelism
        return par.tp if self.shard_over == "dp-cp" else par.tp * par.cp

    @property
    def stage_layers(self) -> tuple[int, ...] | None:
        """Decoder layers per model chunk: the explicit split, else the framework's (None: even); one line when
        the split does not add up or the framework would not make it."""
        from memcalc.layout.compose import check_stage_layers, default_split, framework

        par, arch = self.parallelism, self.model.architecture
        if arch is None:
            return None
        if par.stage_layers is not None:
            check_stage_layers(par.stage_layers, arch.layers, par.pp, par.virtual_stages)
            return par.stage_layers
        return default_split(framework(par.framework), arch.layers, par.pp, par.virtual_stages)

    @property
    def shard_group_size(self) -> int:
        """N in the ZeRO formulas: the ranks one copy of the model states is sharded over."""
        spec = self.strategy.spec
        if not (spec.shards_params or spec.shards_grads or spec.shards_optimizer):
            return 1
        if spec.hybrid:
            return self.strategy.shard_group or max(1, min(self.shard_domain,
                                                           self.cluster.gpus_per_node // self.domain_stride))
        return self.shard_domain

    @property
    def replicas(self) -> int:
        """Copies of the sharded model states: domain / shard group for hybrids, 1 for plain sharding."""
        spec = self.strategy.spec
        if spec.hybrid:
            return self.shard_domain // self.shard_group_size
        return self.shard_domain if self.shard_group_size == 1 else 1

    @property
    def dropout(self) -> float:
        wl, arch = self.workload, self.model.architecture
        if wl is not None and wl.dropout is not None:
            return wl.dropout
        return arch.dropout if arch is not None else 0.0
