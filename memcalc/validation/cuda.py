"""On a CUDA machine: torch.cuda.max_memory_allocated of one training step against memcalc's estimate.

One GPU, plain AdamW, fp32, eager attention, no dropout. The second step is measured (the optimizer's states
exist by then). The estimate is the implementation accounting without the CUDA context (which the allocator
does not see) plus the activations at micro-batch ``batch``; the allocator also holds temporaries (the
backward's transient buffers), so the two agree closely but not to the byte.
"""

from __future__ import annotations

import torch
from torch import nn

import memcalc
from memcalc.validation.measure import Config, TinyGPT
from memcalc.validation.suite import architecture


def peak_vs_estimate(layers: int = 4, hidden: int = 512, heads: int = 8, vocab: int = 8192, seq: int = 512,
                     batch: int = 4) -> tuple[int, int]:  # fmt: skip
    """(measured peak bytes, estimated bytes) for one GPU."""
    c = Config("ddp", "ddp", world=1, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, batch=batch)
    torch.manual_seed(0)
    model = TinyGPT(c).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    for step in range(2):
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        loss = nn.functional.cross_entropy(model(ids).float().flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    est = memcalc.estimate(model=architecture(c), ddp=True, gpus=1, precision="fp32", accounting="implementation",
                           bucket_view=True, seq_len=seq, micro_batch=batch, attention="eager", dropout=0.0,
                           cuda_context_gib=0)  # fmt: skip
    return measured, est.memory.per_gpu.total
