"""Host (CPU-side) cost of an eager training step, measured on the CPU: the figures ``memcalc.time.kernels`` cites.

    python benchmarks/bench_host.py

What it measures, on whatever CPU runs it (the PyTorch dispatcher, not a GPU):
1. Kernels per decoder layer: the aten ops that do work (views and other metadata-only ops left out), counted with a
   ``TorchDispatchMode`` over a Hugging Face Llama's forward and backward, as the difference between an 8-layer and a
   4-layer model (so the embedding, head and loss cancel), for SDPA and eager attention, fp32, pure bf16 and
   fp32 weights under ``torch.autocast(bfloat16)``. On a GPU each such op is one kernel launch (or more).
2. Host seconds per op: the wall time of the same 4 extra layers' forward + backward on tiny tensors (hidden 64,
   16 tokens: the arithmetic is negligible) divided by their op count. This is the CPU dispatcher, Python module
   code and autograd; a CUDA step adds ``cudaLaunchKernel`` and drops the CPU kernels' own (tiny) work.
3. FSDP2's hooks: the same 8-layer model with ``fully_shard`` on every layer and the root (gloo, one rank), minus
   the plain one, per unit.
Figures only; the median of 9 repetitions. On a shared machine the times vary by tens of per cent between runs.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# metadata-only ops (no kernel on a GPU)
_NO_KERNEL = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "expand", "unsqueeze", "squeeze", "permute", "slice",
    "select", "alias", "as_strided", "detach", "split", "split_with_sizes", "unbind", "_reshape_alias", "lift_fresh",
    "empty", "empty_like", "sym_size", "is_same_size", "new_empty_strided", "empty_strided", "view_as_real",
    "view_as_complex", "_to_copy_meta",
})  # fmt: skip


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ not in _NO_KERNEL:
            self.n += 1
        return func(*args, **(kwargs or {}))


def _model(layers: int, attention: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attention, torch_dtype=dtype)


def _step(model, ids, autocast: bool) -> None:  # noqa: ANN001
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


def _count(model, ids, autocast: bool) -> tuple[int, int]:  # noqa: ANN001
    _step(model, ids, autocast)
    with _Count() as c:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
    fwd = c.n
    with _Count() as c:
        loss.backward()
    return fwd, c.n


def _seconds(model, ids, autocast: bool, reps: int = 10) -> float:  # noqa: ANN001
    for _ in range(3):
        _step(model, ids, autocast)
    samples = []
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(reps):
            _step(model, ids, autocast)
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 16))
    print("| code | attention | weights | kernels per layer fwd | bwd | host us per op (CPU dispatcher) |")
    print("|---|---|---|---|---|---|")
    for attention in ("sdpa", "eager"):
        for label, dtype, autocast in (("fp32", torch.float32, False), ("bf16", torch.bfloat16, False),
                                       ("fp32 + autocast bf16", torch.float32, True)):  # fmt: skip
            small, large = _model(4, attention, dtype), _model(8, attention, dtype)
            (f4, b4), (f8, b8) = _count(small, ids, autocast), _count(large, ids, autocast)
            fwd, bwd = (f8 - f4) / 4, (b8 - b4) / 4
            per_op = (_seconds(large, ids, autocast) - _seconds(small, ids, autocast)) / 4 / (fwd + bwd)
            print(f"| Hugging Face Llama | {attention} | {label} | {fwd:.0f} | {bwd:.0f} | {per_op * 1e6:.1f} |")
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        plain = _model(8, "sdpa", torch.float32)
        base = _seconds(plain, ids, False)
        for layer in plain.model.layers:
            fully_shard(layer)
        fully_shard(plain)
        sharded = _seconds(plain, ids, False)
        print(f"\nFSDP2 (fully_shard per layer, gloo, one rank): {(sharded - base) / 8 * 1e6:.0f} us of host time per "
              f"unit per forward + backward ({base * 1e3:.1f} -> {sharded * 1e3:.1f} ms for 8 layers)")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
