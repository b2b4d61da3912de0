"""Measure what a real data-parallel training step holds and sends, per rank, with torch.distributed on CPU.

One configuration runs as ``world`` spawned processes with the gloo backend. Each rank builds the same small
GPT-like model (``TinyGPT``, or a real Hugging Face model of the same size), wraps it (DDP, FSDP1, FSDP2 or
DeepSpeed), runs forward, backward and an optimizer step (``steps`` times; the last is measured), and records:
- parameter, gradient and optimizer-state bytes it holds after the step (one count per storage);
- every collective it issued, by phase, with the payload the way nccl-tests counts it (a
  ``TorchDispatchMode`` sees every ``c10d`` op, DDP's own bucketed all-reduces included).
Results go to one JSON file per rank. gloo can abort in ``destroy_process_group``, so each rank writes,
meets the others at a barrier, and leaves with ``os._exit(0)``; a rank that fails reports it and leaves at once
(``memcalc.validation.ranks``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memcalc.validation.blocks import GPTBlock
from memcalc.validation.ranks import arm_watchdog, run_ranks


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    framework: str
    """ddp | fsdp1 | fsdp2 | deepspeed"""
    strategy: str
    """ddp; FSDP1 ShardingStrategy name; fsdp2: default | no-reshard | hsdp; deepspeed: zero-0..3"""
    world: int = 2
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    vocab: int = 100
    seq: int = 16
    batch: int = 2
    mixed_precision: bool = False
    """FSDP: MixedPrecision(param_dtype=bf16) / MixedPrecisionPolicy(param_dtype=bf16); DeepSpeed: bf16."""
    bucket_view: bool = False
    """DDP: gradient_as_bucket_view."""
    min_num_params: int = 0
    """FSDP1: size_based_auto_wrap_policy(min_num_params); 0 wraps one unit per block."""
    steps: int = 1
    """Training steps run; the last one is measured (ZeRO-3 records its module trace in the first)."""
    persistence_threshold: int = 0
    """DeepSpeed ZeRO-3: stage3_param_persistence_threshold (0 partitions every parameter)."""
    max_reuse_distance: int | None = None
    """DeepSpeed ZeRO-3: stage3_max_reuse_distance (None: DeepSpeed's default)."""
    max_live_parameters: int | None = None
    """DeepSpeed ZeRO-3: stage3_max_live_parameters (None: DeepSpeed's default)."""
    prefetch_bucket_size: int | None = None
    """DeepSpeed ZeRO-3: stage3_prefetch_bucket_size (None: DeepSpeed's default)."""
    model: str = "tiny"
    """tiny (TinyGPT below), or a real Hugging Face model of the same size (needs transformers): hf-gpt2,
    hf-llama (kv heads = heads / 2, intermediate 3h/2, untied head), hf-gpt_neox, hf-bloom, hf-opt, hf-falcon."""

    def hf_config(self) -> dict[str, Any]:
        """The Hugging Face config (with its model_type) of an hf-* model."""
        L, h, a, v, s = self.layers, self.hidden, self.heads, self.vocab, self.seq
        ids = dict(bos_token_id=0, eos_token_id=0)
        if self.model == "hf-gpt2":
            return dict(model_type="gpt2", n_layer=L, n_embd=h, n_head=a, vocab_size=v, n_positions=s, **ids)
        if self.model == "hf-llama":
            return dict(model_type="llama", num_hidden_layers=L, hidden_size=h, intermediate_size=3 * h // 2,
                        num_attention_heads=a, num_key_value_heads=a // 2, vocab_size=v, max_position_embeddings=s,
                        tie_word_embeddings=False)  # fmt: skip
        if self.model == "hf-gpt_neox":
            return dict(model_type="gpt_neox", num_hidden_layers=L, hidden_size=h, intermediate_size=4 * h,
                        num_attention_heads=a, vocab_size=v, max_position_embeddings=s, **ids)  # fmt: skip
        if self.model == "hf-bloom":
            return dict(model_type="bloom", n_layer=L, hidden_size=h, n_head=a, vocab_size=v, **ids)
        if self.model == "hf-opt":
            return dict(model_type="opt", num_hidden_layers=L, hidden_size=h, ffn_dim=4 * h, num_attention_heads=a,
                        vocab_size=v, max_position_embeddings=s, word_embed_proj_dim=h, pad_token_id=1, **ids)  # fmt: skip
        if self.model == "hf-falcon":
            return dict(model_type="falcon", num_hidden_layers=L, hidden_size=h, num_attention_heads=a, vocab_size=v,
                        new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False, **ids)  # fmt: skip
        raise ValueError(f"{self.model!r} is not a Hugging Face model")

    def zero3_config(self) -> dict[str, int]:
        """The stage3_* entries of DeepSpeed's zero_optimization section this configuration sets."""
        out = {"stage3_param_persistence_threshold": self.persistence_threshold}
        for key, v in (("stage3_max_reuse_distance", self.max_reuse_distance),
                       ("stage3_max_live_parameters", self.max_live_parameters),
                       ("stage3_prefetch_bucket_size", self.prefetch_bucket_size)):  # fmt: skip
            if v is not None:
                out[key] = v
        return out

    @property
    def name(self) -> str:
        mp_ = "-bf16" if self.mixed_precision else ""
        view = "-bucketview" if self.bucket_view else ""
        wrap = f"-min{self.min_num_params}" if self.min_num_params else ""
        z3 = ""
        if self.strategy == "zero-3":  # persistence 0 is this harness's default, so it goes unnamed
            named = (("persist", self.persistence_threshold or None), ("reuse", self.max_reuse_distance),
                     ("live", self.max_live_parameters), ("bucket", self.prefetch_bucket_size))  # fmt: skip
            z3 = "".join(f"-{k}{v}" for k, v in named if v is not None)
        steps = f"-step{self.steps}" if self.steps > 1 else ""
        model = "" if self.model == "tiny" else f"-{self.model}"
        return (f"{self.framework}-{self.strategy}{model}{mp_}{view}{wrap}{z3}{steps}"
                f"-w{self.world}-L{self.layers}-h{self.hidden}-v{self.vocab}")


class TinyGPT(nn.Module):
    """GPT-2 layout (memcalc family ``gpt2``): token + learned position embeddings, pre-norm blocks, final
    LayerNorm, head tied to the token embedding."""

    def __init__(self, c: Config):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.seq, c.hidden)
        self.blocks = nn.ModuleList(GPTBlock(c.hidden, c.heads) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _hf_model(c: Config) -> nn.Module:
    import transformers

    cfg = c.hf_config()
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


@dataclass
class Collective:
    op: str
    phase: str
    dtype: str
    payload_bytes: int
    group_size: int


@dataclass
class RankResult:
    rank: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    bucket_bytes: int = 0
    """DDP: gradient bucket buffers (a copy of the gradients unless gradient_as_bucket_view)."""
    master_bytes: int = 0
    """DeepSpeed: its fp32 copy of the parameters (the frameworks above use the parameters themselves)."""
    live_peak_elements: int = 0
    """DeepSpeed ZeRO-3: the most parameter elements its coordinator counted as gathered during the last step."""
    collectives: list[Collective] = field(default_factory=list)


_PAYLOAD_ARG = {
    # op name (c10d namespace) -> how its nccl-tests S is computed from the arguments
    "allreduce_": "first",
    "allgather_": "output",
    "_allgather_base_": "output",
    "allgather_into_tensor_coalesced_": "output",
    "reduce_scatter_": "input",
    "_reduce_scatter_base_": "input",
    "reduce_scatter_tensor_coalesced_": "input",
    "broadcast_": "first",
}


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


class CollectiveRecorder(TorchDispatchMode):
    """Records every c10d op issued inside it, tagged with the current phase."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "setup"
        self.calls: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            kind = _PAYLOAD_ARG.get(name)
            if kind is not None:
                first = _tensors(args[0])
                if kind == "first":
                    payload = sum(t.numel() * t.element_size() for t in first)
                elif kind == "output":  # the gathered output (allgather_ takes a list of lists of outputs)
                    payload = sum(t.numel() * t.element_size() for t in first)
                else:  # reduce-scatter: the unreduced input is the second argument
                    payload = sum(t.numel() * t.element_size() for t in _tensors(args[1]))
                dtype = str(first[0].dtype).replace("torch.", "") if first else "?"
                self.calls.append(Collective(name.strip("_"), self.phase, dtype, payload, _group_size(args)))
        return func(*args, **kwargs)


def _group_size(args: Any) -> int:
    """Size of the process group a c10d op runs on (its ProcessGroup argument)."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return int(dist.ProcessGroup.unbox(a).size())
            except RuntimeError:  # another script object (a ReduceOp)
                continue
    return dist.get_world_size()


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen.setdefault(st.data_ptr(), st.nbytes())
    return sum(v for k, v in seen.items() if k)


def _wrap(model: nn.Module, c: Config, rank: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    if c.framework == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, gradient_as_bucket_view=c.bucket_view)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    if c.framework == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

        kw: dict[str, Any] = {}
        if c.strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
            # Shard groups of world/2 consecutive ranks, replicated across the two halves.
            half = c.world // 2
            shard = [dist.new_group(list(range(i, i + half))) for i in range(0, c.world, half)]
            repl = [dist.new_group(list(range(i, c.world, half))) for i in range(half)]
            kw["process_group"] = (shard[rank // half], repl[rank % half])
        mp_ = MixedPrecision(param_dtype=torch.bfloat16) if c.mixed_precision else None
        policy: Any = ModuleWrapPolicy({GPTBlock})
        if c.min_num_params:
            import functools

            policy = functools.partial(size_based_auto_wrap_policy, min_num_params=c.min_num_params)
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy[c.strategy], auto_wrap_policy=policy,
                       mixed_precision=mp_, device_id=torch.device("cpu"), **kw)  # fmt: skip
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    if c.framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if c.strategy == "hsdp":  # 2 replicas x world/2 shards
            mesh = init_device_mesh("cpu", (2, c.world // 2), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (c.world,))
        kw: dict[str, Any] = {"mesh": mesh}
        if c.strategy == "no-reshard":
            kw["reshard_after_forward"] = False
        if c.mixed_precision:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for block in model.blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)  # the root: FSDP2 keeps its parameters gathered from forward to backward
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if c.framework == "deepspeed":
        import logging

        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        deepspeed.init_distributed(dist_backend="gloo")
        stage = int(c.strategy.split("-")[1])
        # Persistence threshold 0 by default here: ZeRO-3 partitions every parameter (DeepSpeed's own default keeps
        # those of up to 1e5 elements whole).
        cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": c.batch, "zero_allow_untested_optimizer": True,
                               "zero_optimization": {"stage": stage, **c.zero3_config()}}  # fmt: skip
        if c.mixed_precision:
            cfg["bf16"] = {"enabled": True}
        engine, zero_opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                                      config=cfg)  # fmt: skip
        return engine, zero_opt
    raise ValueError(f"unknown framework {c.framework!r}")


class LivePeak:
    """The most elements DeepSpeed ZeRO-3's parameter coordinator counts as gathered (``n_available_params``),
    read after each of its all-gathers (DeepSpeed 0.19's private names; 0 where they are absent)."""

    def __init__(self, zero_opt: Any) -> None:
        self.peak = 0
        offload = getattr(zero_opt, "parameter_offload", None)
        coord = offload.get_param_coordinator() if offload is not None else None
        name = "_PartitionedParameterCoordinator__all_gather_params_"
        if coord is None or not hasattr(coord, name):
            return
        inner = getattr(coord, name)

        def gather(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            self.peak = max(self.peak, coord._PartitionedParameterCoordinator__n_available_params)
            return out

        setattr(coord, name, gather)


def _deepspeed_held(engine: Any, zero_opt: Any) -> tuple[int, int, int, int]:
    """(parameters, fp32 master, gradients, optimizer states) bytes a DeepSpeed rank holds after a step."""

    def tensors(*names: str) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for name in names:
            v = getattr(zero_opt, name, None)
            stack = [v]
            while stack:
                x = stack.pop()
                if isinstance(x, torch.Tensor):
                    out.append(x)
                elif isinstance(x, (list, tuple)):
                    stack.extend(x)
        return out

    module = list(engine.module.parameters())
    params = _storage_bytes(module + tensors("bit16_groups_flat", "fp16_partitioned_groups_flat", "fp16_groups"))
    master = _storage_bytes(tensors("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups"))
    grads = _storage_bytes([p.grad for p in module if p.grad is not None] + tensors("grad_partitions_flat_buffer"))
    inner = getattr(zero_opt, "optimizer", zero_opt)
    states = _storage_bytes([v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
    return params, master, grads, states


def _rank_main(rank: int, c: Config, init_file: str, out_dir: str, timeout: float) -> None:
    import warnings

    warnings.filterwarnings("ignore")  # FSDP1's deprecation notice, once per rank
    arm_watchdog(out_dir, rank, timeout)
    failed = False
    try:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(c.world))  # DeepSpeed asks for them
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=c.world)
        torch.manual_seed(0)
        model = TinyGPT(c) if c.model == "tiny" else _hf_model(c)
        rec = CollectiveRecorder()
        with rec:
            wrapped, opt = _wrap(model, c, rank)
            live = LivePeak(opt) if c.strategy == "zero-3" else None
            g = torch.Generator().manual_seed(rank)
            for _ in range(c.steps):
                rec.calls = []  # only the last step is kept
                if live is not None:
                    live.peak = 0
                ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=g)
                rec.phase = "forward"
                logits = wrapped(ids) if c.model == "tiny" else wrapped(input_ids=ids).logits
                loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
                rec.phase = "backward"
                if c.framework == "deepspeed":
                    wrapped.backward(loss)
                    rec.phase = "optimizer step"
                    wrapped.step()
                else:
                    loss.backward()
                    rec.phase = "optimizer step"
                    opt.step()
                rec.phase = "after"
        params = list(wrapped.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        states = [v for s in getattr(opt, "state", {}).values() for v in s.values() if isinstance(v, torch.Tensor)]
        buckets = 0
        if c.framework == "ddp":
            # DDP's reducer reports its buckets' sizes in bytes; with gradient_as_bucket_view the grads are views of them.
            data = wrapped._get_ddp_logging_data()
            sizes = [int(x) for x in str(data.get("bucket_sizes", "")).split(",") if x.strip()]
            grad_ptrs = {g.untyped_storage().data_ptr() for g in grads}
            buckets = 0 if c.bucket_view and len(grad_ptrs) <= len(sizes) else sum(sizes)
        calls = [x for x in rec.calls if x.phase in ("forward", "backward", "optimizer step")]
        if c.framework == "deepspeed":
            p_, m_, g_, s_ = _deepspeed_held(wrapped, opt)
            result = RankResult(rank, p_, g_, s_, master_bytes=m_, live_peak_elements=live.peak if live else 0,
                                collectives=calls)  # fmt: skip
        else:
            result = RankResult(rank, _storage_bytes(params), _storage_bytes(grads), _storage_bytes(states), buckets,
                                collectives=calls)  # fmt: skip
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(asdict(result)))
    except BaseException:  # noqa: BLE001 - reported to the parent through the file system
        failed = True
        Path(out_dir, f"rank{rank}.error").write_text(traceback.format_exc())
    finally:
        try:
            if not failed:  # after an error the parent stops the others (run_ranks)
                dist.barrier()
        except Exception:  # noqa: BLE001
            pass
        sys.stdout.flush()
        os._exit(0)


def run(c: Config, timeout: float = 120) -> list[RankResult]:
    """Run one configuration on ``c.world`` CPU processes and return each rank's measurement."""
    with tempfile.TemporaryDirectory() as out:
        init_file = os.path.join(out, "init")
        run_ranks(_rank_main, [(r, c, init_file, out, timeout) for r in range(c.world)], out, timeout, c.name)
        results = []
        for r in range(c.world):
            path = Path(out, f"rank{r}.json")
            if not path.exists():
                raise RuntimeError(f"{c.name}: rank {r} wrote no result (it crashed)")
            d = json.loads(path.read_text())
            d["collectives"] = [Collective(**x) for x in d["collectives"]]
            results.append(RankResult(**d))
        return results
