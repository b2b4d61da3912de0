"""Megatron-Core's own GPT model on a CPU rank: what each decoder layer saves for backward, tensor storage by storage.

The ground truth for ``memcalc.memory.families.megatron_saved``'s local spec: Megatron-Core (0.16.1) builds ``GPTModel`` from
``get_gpt_layer_local_spec`` (its own norms, column/row-parallel linears and unfused attention; the Transformer
Engine spec needs CUDA) in bf16, as rank 0 of ``tp`` ranks on torch's fake process group (collectives return at
once, every shape is rank 0's), and runs one forward under ``torch.autograd.graph.saved_tensors_hooks``: each
storage saved for backward is counted once, against the decoder layer whose forward saved it first; parameters
(which the linears save) are left out. Then the backward runs, so the step is known to complete.

Needs megatron-core (not a memcalc dependency): run it with an interpreter that has it,
``python -m memcalc.validation.trace_megatron --tp 2 --recompute-modules core_attn`` (a JSON line), or call
``trace`` from a test that skips where ``megatron.core`` is not importable. Imports nothing of memcalc.

CPU shims, none of which changes what a layer saves: ``torch.cuda.current_device`` answers "cpu" (the rotary
table's device), the model-parallel RNG tracker's ``fork`` is a no-op (no CUDA generator; dropouts are 0), an
explicit causal mask is passed (the default one is made on CUDA), and the checkpoint's CUDA RNG state calls read the
CPU generator.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

_READY: dict[str, Any] = {}


def _init(tp: int, world: int | None = None) -> None:
    """torch's fake process group as rank 0 of ``world`` ranks (default ``tp``: tensor parallelism alone; more:
    data parallelism over the rest), and Megatron's parallel state over it (once per layout)."""
    import torch
    import torch.distributed as dist

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]
    from megatron.core import parallel_state as ps

    world = world or tp
    if _READY.get("layout") == (tp, world):
        return
    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
    from megatron.core.tensor_parallel import random as rng

    tracker = rng.get_cuda_rng_tracker()
    tracker.fork = lambda *a, **k: contextlib.nullcontext()  # type: ignore[method-assign]
    rng._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()  # checkpoints' CUDA generator state: the CPU's
    rng._set_cuda_rng_state = lambda *a, **k: None
    _READY["layout"] = (tp, world)


def trace(*, layers: int = 3, hidden: int = 64, heads: int = 8, kv_heads: int = 2, ffn: int = 160, vocab: int = 256,
          s: int = 32, b: int = 2, tp: int = 1, modules: tuple[str, ...] = (),
          norm: str = "RMSNorm") -> dict[str, Any]:  # fmt: skip
    """Bytes each decoder layer of rank 0 saves for backward in one forward of a ``b`` x ``s`` micro-batch, and what
    the rest of the model (embedding, final norm, output layer, loss) saves, as a dict."""
    import torch

    _init(tp)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra: dict[str, Any] = {}
    if modules:
        extra = dict(recompute_granularity="selective", recompute_modules=list(modules))
    cfg = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=kv_heads,
                            ffn_hidden_size=ffn, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                            normalization=norm, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
                            bf16=True, params_dtype=torch.bfloat16, tensor_model_parallel_size=tp,
                            use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
                            persist_layer_norm=False, gradient_accumulation_fusion=False, **extra)  # fmt: skip
    torch.manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization=norm), vocab_size=vocab, max_sequence_length=s,
                     position_embedding_type="rope")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    where = ["outside"]
    per: dict[str, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in params and key not in seen:
            seen.add(key)
            per[where[0]] = per.get(where[0], 0) + st.nbytes()
        return t

    def enter(name: str) -> Any:
        def hook(*_: Any) -> None:
            where[0] = name
        return hook

    for i, layer in enumerate(model.decoder.layers):
        layer.register_forward_pre_hook(enter(f"layer {i}"))
        layer.register_forward_hook(enter("outside"))
    ids = torch.randint(0, vocab, (b, s))
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s), 1).bool()[None, None]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, pos, mask, labels=ids)
    loss.float().sum().backward()
    return {"layers": [per.get(f"layer {i}", 0) for i in range(layers)], "outside": per.get("outside", 0),
            "tp": tp, "s": s, "b": b, "modules": list(modules)}


def _cpu_mode() -> Any:
    """A torch function mode that runs Megatron-Core's CUDA-only optimizer code on the CPU: a ``device="cuda"``
    factory argument becomes the CPU, ``.cuda()`` is the tensor itself, and ``Tensor.type()`` answers the CUDA type
    name the distributed optimizer checks (``torch.cuda.BFloat16Tensor``). Nothing it changes is a size."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Cpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "cuda" in str(kwargs.get("device", "")):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                return func(*args).replace("torch.", "torch.cuda.", 1)
            if func is torch.Tensor.cuda:
                return args[0]
            return func(*args, **kwargs)

    return Cpu()


def states(*, dp: int = 4, overlap: bool = False, bucket_size: int | None = None, layers: int = 2, hidden: int = 64,
           heads: int = 8, kv_heads: int = 2, ffn: int = 160, vocab: int = 256) -> dict[str, Any]:  # fmt: skip
    """Megatron-Core's DDP buffers and distributed optimizer states on rank 0 of ``dp`` (fake process group, tp 1):
    per buffer its dtypes, elements (padded) and unpadded elements, its buckets' (unpadded, padded) elements; the
    optimizer's fp32 master shards and Adam's moments in bytes after one step."""
    import torch

    _init(1, world=dp)
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=kv_heads,
                            ffn_hidden_size=ffn, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                            normalization="RMSNorm", add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16,
                            use_cpu_initialization=True, gradient_accumulation_fusion=False)  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab,
                     max_sequence_length=32, position_embedding_type="rope")
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=True, overlap_grad_reduce=overlap,
        bucket_size=bucket_size), model)
    out: dict[str, Any] = {"parameters": sum(p.numel() for p in model.parameters()), "buffers": []}
    for buf in ddp.buffers:
        out["buffers"].append({"param_dtype": str(buf.param_dtype), "grad_dtype": str(buf.grad_dtype),
                               "numel": buf.numel, "unpadded": buf.numel_unpadded,
                               "buckets": [(bk.numel_unpadded, bk.grad_data.numel()) for bk in buf.buckets]})
    with _cpu_mode():
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True,
                                                     use_distributed_optimizer=True), [ddp],
                                     use_gloo_process_groups=False)
        for p in model.parameters():
            p.main_grad.zero_()
        opt.step()
    totals = {"master": 0, "exp_avg": 0, "exp_avg_sq": 0}
    for sub in getattr(opt, "chained_optimizers", [opt]):
        for group in (*sub.shard_fp32_from_float16_groups, *sub.shard_fp32_groups):
            totals["master"] += sum(p.numel() * p.element_size() for p in group)
        for st in sub.optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                totals[key] += st[key].numel() * st[key].element_size()
    out.update(totals)
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="trace_megatron")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--recompute-modules", default="")
    a = ap.parse_args(argv)
    mods = tuple(m for m in a.recompute_modules.split(",") if m)
    print(json.dumps(trace(tp=a.tp, s=a.seq_len, b=a.micro_batch, modules=mods)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
