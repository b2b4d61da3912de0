"""The options commands share, each declared once (``Annotated`` types typer reads)."""

from __future__ import annotations

from typing import Annotated

import typer

Params = Annotated[str | None, typer.Option("--params", "-p", help="Parameter count: 175e9, 175B, 7b, 1.3e9, 350M (or give --model).")]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model preset (llama-2-7b, gpt3-175b; see `memcalc models`) or a .toml path.")]
HfConfig = Annotated[str | None, typer.Option("--hf-config", help="A Hugging Face config.json, or a Hub id (org/name[@revision]: the local Hugging Face cache, else one download of config.json alone) (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, phi3, granite, smollm3, gemma, gemma2, gemma3_text, olmo2, gpt2, gpt_neox, bloom, opt, falcon).")]
Layers = Annotated[int | None, typer.Option("--layers", help="Decoder layers (overrides the preset).")]
Hidden = Annotated[int | None, typer.Option("--hidden", help="Hidden size.")]
Heads = Annotated[int | None, typer.Option("--heads", help="Attention heads.")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", help="Key/value heads (GQA).")]
Ffn = Annotated[int | None, typer.Option("--ffn", help="MLP inner size.")]
Vocab = Annotated[int | None, typer.Option("--vocab", help="Vocabulary size.")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", help="Sequence length: counts activations (needs the model's shape).")]
MicroBatch = Annotated[str | None, typer.Option("--micro-batch", help="Sequences per micro-batch, or auto: the largest that fits (compare: each strategy its own; when none fits, the estimate at 1 says so).")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile on each decoder layer: the partitioner's saved set and fused element-wise kernels (realistic accounting on Llama-style layers; the paper accounting counts the eager layer).")]
CompileLoss = Annotated[bool | None, typer.Option("--compile-loss/--no-compile-loss", help="With --compile: the loss compiled too (inductor's fused cross-entropy). Default: as the --framework does (Hugging Face and torchtitan's releases yes, torchtune for a chunked loss only; torchtitan before v0.1.0 no).", show_default=False)]
Recompute = Annotated[str, typer.Option("--recompute", help="Activation recomputation: none, selective, full, every:K (every K-th layer), op-sac (torchtitan's per-op policy; realistic accounting).")]
Loss = Annotated[str, typer.Option("--loss", help="standard (the framework's own: fp32 upcast of the logits), chunked:N (torchtune, N chunks) or fused (the logits never exist). Realistic accounting.")]
OptimizerImpl = Annotated[str | None, typer.Option("--optimizer-impl", help="AdamW's implementation: foreach (torch's default on CUDA), fused (torchtitan's, torchtune's, Megatron's and DeepSpeed's default), for-loop, in-backward (torchtune's optimizer in backward). Default: the --framework's. Realistic accounting; step time.")]
AttentionOpt = Annotated[str | None, typer.Option("--attention", help="eager (keeps a·s² scores, as the paper), flash, or sdpa. Default: what the model code runs (sdpa; eager for BLOOM and Gemma 2, which have no SDPA path, and under --accounting paper).", show_default=False)]
Dropout = Annotated[float | None, typer.Option("--dropout", help="Dropout probability (default: the preset's or config's, else 0).")]
Device = Annotated[str, typer.Option("--device", help="cuda (1-byte dropout masks) or cpu (masks in the activation dtype).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline stages.")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")]
Sp = Annotated[bool, typer.Option("--sequence-parallel", help="Megatron sequence parallelism (with --tp).")]
Vp = Annotated[int, typer.Option("--virtual-stages", help="Model chunks per pipeline rank (interleaved 1F1B).")]
FrameworkOpt = Annotated[str | None, typer.Option("--framework", help="The framework whose composition applies: hf, torchtitan, torchtune, megatron, deepspeed (what it can run, the group it shards over, its pipeline split).")]
ShardOver = Annotated[str | None, typer.Option("--shard-over", help="Override: shard model states over dp-cp (data x context ranks, every CP framework's default) or dp (data-parallel ranks only).")]
StageLayers = Annotated[str | None, typer.Option("--stage-layers", help="Decoder layers per pipeline stage, pp x virtual-stages entries adding up to the layers, e.g. 15,16,16,16,16,16,16,15.")]
AccountingOpt = Annotated[str, typer.Option("--accounting", help="auto (default: realistic where it applies, else paper), realistic (the peak of a real step over its timeline, with the allocator), paper (ZeRO §5, Korthikanti), implementation (what DDP/FSDP/DeepSpeed really allocate and send) or deepspeed-estimator (DeepSpeed's own functions).")]
FsdpVersion = Annotated[int | None, typer.Option("--fsdp-version", help="realistic and implementation accounting: 1 (FullyShardedDataParallel) or 2 (fully_shard). Default: 2 under --framework torchtitan (it has no FSDP1), else 1.", show_default=False)]
FsdpWrap = Annotated[str | None, typer.Option("--fsdp-wrap", help="realistic accounting, FSDP2: where its units put the embedding and the head: root (with the final norm, gathered all step: accelerate), separate (each its own unit, the head kept gathered after forward: torchtitan since v0.2) or separate-reshard (each its own unit, resharded after forward: torchtune's custom_sharded_layers). Default: the framework's, else root; root for tied embeddings.")]
FsdpAutoWrap = Annotated[str | None, typer.Option("--fsdp-auto-wrap", help="FSDP: its units over the decoder layers, as accelerate's fsdp_auto_wrap_policy: transformer (TRANSFORMER_BASED_WRAP: one unit per decoder layer, as torchtitan and torchtune wrap) or none (NO_WRAP: the layers in the root unit, gathered all step, their gradients unsharded until the root's post-backward). Default: transformer.")]
BackwardPrefetch = Annotated[str | None, typer.Option("--backward-prefetch", help="realistic accounting, FSDP1 (--fsdp-version 1): its BackwardPrefetch, pre (BACKWARD_PRE: the next layer gathered at each pre-backward), post or none (the same peaks). Default: none under --framework hf (accelerate's and the Trainer's default), else pre (torch's).")]
MinNumParams = Annotated[str | None, typer.Option("--min-num-params", help="implementation accounting, FSDP: size_based_auto_wrap_policy threshold (default: one unit per decoder layer).")]
ReuseDistance = Annotated[str | None, typer.Option("--max-reuse-distance", help="realistic and implementation accounting, ZeRO-3: stage3_max_reuse_distance in elements (default 1e9).")]
MaxLive = Annotated[str | None, typer.Option("--max-live-parameters", help="realistic and implementation accounting, ZeRO-3: stage3_max_live_parameters in elements (default 1e9).")]
ReduceBucket = Annotated[str | None, typer.Option("--reduce-bucket-size", help="realistic accounting, ZeRO-1/2/3: reduce_bucket_size in elements (default 5e8; the Hugging Face Trainer's auto: hidden²; 0: every gradient reduced alone).")]
OverlapComm = Annotated[bool | None, typer.Option("--overlap-comm/--no-overlap-comm", help="realistic accounting, ZeRO-1/2: DeepSpeed's overlap_comm (default off for stages 1-2): a second gradient bucket.", show_default=False)]
PrefetchBucket = Annotated[str | None, typer.Option("--prefetch-bucket-size", help="realistic and implementation accounting, ZeRO-3: stage3_prefetch_bucket_size in elements (default 5e7).")]
Persistence = Annotated[str | None, typer.Option("--persistence-threshold", help="realistic and implementation accounting, ZeRO-3: stage3_param_persistence_threshold in elements (default 1e5).")]
SubGroup = Annotated[str | None, typer.Option("--sub-group-size", help="realistic accounting, ZeRO-3: DeepSpeed's sub_group_size in elements, the optimizer steps the partitions this many at a time (default 1e9; 0: one parameter each).")]
Zero3Step = Annotated[str, typer.Option("--zero3-step", help="implementation accounting, ZeRO-3: steady (every step after the first; default) or first (DeepSpeed records its trace and gathers every parameter on each use).")]
GradReduceDtype = Annotated[str | None, typer.Option("--grad-reduce-dtype", help="--framework megatron: the gradient buffer's dtype, in which gradients accumulate and are reduced: fp32 (main_grad, Megatron-LM's default under --bf16) or bf16 (--grad-reduce-in-bf16; Megatron-Bridge's Llama 3 performance recipes).")]
DeferWgrad = Annotated[int | None, typer.Option("--defer-embedding-wgrad", help="--framework megatron with --pp > 1: Megatron-Core's deferred output-layer wgrad (--defer-embedding-wgrad-compute --wgrad-deferral-limit N; 0: every micro-batch): the last stage keeps each deferred micro-batch's input and output gradient to the pipeline flush.", show_default=False)]
BucketView = Annotated[bool, typer.Option("--bucket-view", help="implementation accounting, DDP: gradient_as_bucket_view=True.")]
ZeroInit = Annotated[bool, typer.Option("--zero-init/--no-zero-init", help="deepspeed-estimator, ZeRO-3: built under deepspeed.zero.Init.")]
BufferFactor = Annotated[float, typer.Option("--buffer-factor", help="deepspeed-estimator: additional_buffer_factor on host RAM.")]
LargestLayer = Annotated[str | None, typer.Option("--largest-layer-params", help="deepspeed-estimator, ZeRO-3 with --params: the largest module's parameters.")]
MicroBatches = Annotated[int | None, typer.Option("--micro-batches", help="Micro-batches per optimizer step (same as --grad-accum).")]
Gpus = Annotated[int, typer.Option("--gpus", "-n", help="World size: GPUs in the job.")]
GpusPerNode = Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")]
Gpu = Annotated[str, typer.Option("--gpu", help="GPU preset name or alias (a100-80g, h100), or a path to a .toml file.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16-mixed (bf16 params + fp32 master: DeepSpeed, Megatron, FSDP's policy), fp16-mixed, amp-bf16 / amp-fp16 (fp32 weights under torch.autocast: Trainer(bf16=True)), bf16 (pure), fp32. Default: the framework's own (amp-bf16 for DDP and Hugging Face, bf16-mixed under ZeRO, FSDP, Megatron).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw (adam), sgd, sgd-momentum, adam-8bit, adafactor, lion.")]
ShardGroup = Annotated[int | None, typer.Option("--shard-group", help="Hybrid strategies: GPUs per shard group (default: one node).")]
GradAccum = Annotated[int | None, typer.Option("--grad-accum", help="Micro-batches per optimizer step (gradient accumulation).")]
CudaContext = Annotated[float | None, typer.Option("--cuda-context-gib", help="CUDA context per GPU, GiB (default 0.5).")]
Reserve = Annotated[float | None, typer.Option("--reserve-gib", help="Allocator headroom per GPU, GiB (default 0).")]
Units = Annotated[str, typer.Option("--units", help="Memory units: gib (2^30, as CUDA reports) or gb (10^9, as papers print).")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Every memory row with its formula, the saved tensors, each collective, the step time's table and every note (the default shows the largest rows, the verdict, the step time and the communication total).")]
Json = Annotated[bool, typer.Option("--json", help="Print the whole result as JSON (integer bytes); same as --format json.")]
Format = Annotated[str, typer.Option("--format", "-f", help="table (default), json (integer bytes), csv or markdown.")]
EstimateFormat = Annotated[str, typer.Option("--format", "-f", help="table (default), json (integer bytes), csv, markdown or timeline-csv (one row per moment of the step: index, phase, label, bytes of each kind, total; realistic accounting).")]
Timeline = Annotated[bool, typer.Option("--timeline", help="With --json: add memory.timeline.moments, every moment of the step by kind (realistic accounting). Off by default: it replays every decoder layer beside the estimate's own replay and makes the JSON about ten times longer.")]
MemorySnapshot = Annotated[str | None, typer.Option("--memory-snapshot", help="Write the predicted step as a PyTorch memory snapshot (a pickle, as torch.cuda.memory._dump_snapshot writes) that pytorch.org/memory_viz opens (realistic accounting).")]
Check = Annotated[bool, typer.Option("--check", help="The exit status is the verdict: 0 when it fits, 1 when at risk or out of memory (the output is printed as usual), so `memcalc estimate ... --check && torchrun ...` launches only what fits.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="Cluster preset that times the step: dgx-a100, dgx-h100, hgx-h200, p4d-a100, p5-h100, or a .toml path (default: the first built from --gpu, else a generic node of 8 built from the GPU's datasheet).")]
Tokens = Annotated[str | None, typer.Option("--tokens", help="Tokens to train on (2e12, 15T): adds the time to train.")]
Price = Annotated[float | None, typer.Option("--price-per-gpu-hour", help="With --tokens: the cost, in the price's currency.")]
IntraGbps = Annotated[float | None, typer.Option("--intra-node-gbps", help="Override: GPU-to-GPU bandwidth inside a node, GB/s per GPU per direction.")]
NetGbits = Annotated[float | None, typer.Option("--network-gbits", help="Override: network bandwidth per GPU, Gb/s.")]
IntraEff = Annotated[float | None, typer.Option("--intra-node-efficiency", help="Override: fraction (0, 1] of the intra-node bandwidth large collectives reach.")]
NetEff = Annotated[float | None, typer.Option("--network-efficiency", help="Override: fraction (0, 1] of the network bandwidth large collectives reach.")]
PcieGbps = Annotated[float | None, typer.Option("--pcie-gbps", help="Override: PCIe bandwidth per GPU per direction, GB/s (offload copies).")]
HostGbps = Annotated[float | None, typer.Option("--host-memory-gbps", help="Override: achievable host memory bandwidth per node, GB/s (CPU Adam).")]
DeepSpeedConfig = Annotated[str | None, typer.Option("--deepspeed", help="A DeepSpeed JSON (ds_config.json): ZeRO stage, offload, precision, batch, ZeRO-3 knobs; flags you type win.")]
AccelerateConfig = Annotated[str | None, typer.Option("--accelerate-config", help="An accelerate config YAML (distributed_type, num_processes, fsdp_config or deepspeed_config).")]
TorchtitanConfig = Annotated[str | None, typer.Option("--torchtitan-config", help="A torchtitan job TOML (v0.1/v0.2), or torchtitan 0.3's run arguments (--module llama3 --config llama3_8b --parallelism.tensor_parallel_degree 2 ...), told apart by content.")]
MegatronArgs = Annotated[str | None, typer.Option("--megatron-args", help="A Megatron-LM argument list (megatron_args.txt) or Megatron-Bridge overrides (model.tensor_model_parallel_size=4 ...): parallel sizes, distributed optimizer, recompute, batch, precision; give --gpus.")]
WriteConfig = Annotated[str | None, typer.Option("--write-config", help="Write the framework's files (DeepSpeed JSON, accelerate YAML, torchtitan TOML or Megatron-LM arguments, launch.sh, README.txt) into this directory.")]
Force = Annotated[bool, typer.Option("--force", help="With --write-config: overwrite files that exist.")]
LoraRank = Annotated[int | None, typer.Option("--lora-rank", help="LoRA: train rank-R adapters (A: R x in, B: out x R) on a frozen base; needs the model's shape.")]
LoraTargets = Annotated[str | None, typer.Option("--lora-targets", help="LoRA: projections that get adapters, comma-separated from q,k,v,o,gate,up,down or peft's target_modules (q_proj,v_proj; all-linear) (default: all of the family's, as peft's all-linear minus the head).")]
Float8 = Annotated[str, typer.Option("--float8", help="torchao float8 training of the decoder layers' linears: none, tensorwise or rowwise (GEMMs at the fp8 rate; saved tensors unchanged); needs the model's shape.")]
Float8AllGather = Annotated[bool, typer.Option("--float8-all-gather", help="With --float8 tensorwise under FSDP: gather the converted weights in fp8 (torchao enable_fsdp_float8_all_gather).")]
Quantize = Annotated[str, typer.Option("--quantize", help="QLoRA: none or nf4 (the frozen base's linear weights in bitsandbytes NF4 with double quantization); needs --lora-rank.")]

# --help groups the options by topic (plain text: no rich formatting to import for help).
PANELS: dict[str, tuple[str, ...]] = {
    "Model": ("params", "model", "hf_config", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab"),
    "Batch and activations": ("seq_len", "micro_batch", "micro_batches", "grad_accum", "recompute", "attention",
                              "dropout", "device", "loss", "compile", "compile_loss"),
    "Layout": ("gpus", "gpus_per_node", "tp", "pp", "cp", "ep", "sequence_parallel", "virtual_stages", "framework",
               "shard_over", "stage_layers", "pp_rank"),
    "Strategy": ("stage", "fsdp", "ddp", "strategy", "strategies", "offload_optimizer", "offload_params",
                 "shard_group"),
    "Precision and optimizer": ("precision", "optimizer", "optimizer_impl", "float8", "float8_all_gather"),
    "Fine-tuning": ("lora_rank", "lora_targets", "quantize"),
    "Hardware": ("gpu", "cluster", "cuda_context_gib", "reserve_gib"),
    "Accounting": ("accounting", "fsdp_version", "fsdp_wrap", "fsdp_auto_wrap", "backward_prefetch", "bucket_view", "min_num_params",
                   "max_reuse_distance",
                   "max_live_parameters", "prefetch_bucket_size", "reduce_bucket_size", "overlap_comm", "grad_reduce_dtype", "defer_embedding_wgrad", "persistence_threshold", "sub_group_size", "zero3_step", "zero_init",
                   "buffer_factor", "largest_layer_params"),
    "Step time": ("tokens", "price_per_gpu_hour", "intra_node_gbps", "network_gbits_per_gpu",
                  "intra_node_efficiency", "network_efficiency", "pcie_gbps", "host_memory_gbps"),
    "Config files": ("deepspeed", "accelerate_config", "torchtitan_config"),
    "Output": ("units", "verbose", "json", "fmt", "check", "out"),
}
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}
