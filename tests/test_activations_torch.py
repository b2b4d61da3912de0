"""Activation estimates against the bytes a real PyTorch block saves for backward on this CPU.

Measured with torch.autograd.graph.saved_tensors_hooks, one count per storage, parameters excluded
(memcalc.validation.blocks). The estimate runs with --device cpu (dropout masks in the activation dtype)
and the implementation accounting (norm statistics, RMSNorm's fp32 copies, SDPA's CPU math fallback).
"""

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint  # noqa: E402

from memcalc.memory.accountings.activations import Setting, layer_activations, rotary_saved  # noqa: E402
from memcalc.model.architecture import Architecture  # noqa: E402
from memcalc.validation.blocks import GPTBlock, LlamaBlock, saved_bytes  # noqa: E402

B, S = 2, 128
SHAPES = {
    # name: (architecture kwargs, block factory)
    "gpt": (dict(hidden=256, heads=8), lambda p, attn: GPTBlock(256, 8, dropout=p, attention=attn)),
    "gpt-ffn-3h": (dict(hidden=192, heads=6, ffn=576),
                   lambda p, attn: GPTBlock(192, 6, ffn=576, dropout=p, attention=attn)),
    "llama-gqa": (dict(hidden=256, heads=8, kv_heads=2, ffn=688, gated_mlp=True, position="rotary", norm="rmsnorm",
                       norm_bias=False, qkv_bias=False, out_bias=False, mlp_bias=False),
                  lambda p, attn: LlamaBlock(256, 8, 2, 688, dropout=p, attention=attn)),
    "llama-mha": (dict(hidden=128, heads=4, ffn=352, gated_mlp=True, position="rotary", norm="rmsnorm",
                       norm_bias=False, qkv_bias=False, out_bias=False, mlp_bias=False),
                  lambda p, attn: LlamaBlock(128, 4, 4, 352, dropout=p, attention=attn)),
}  # fmt: skip
CASES = list(itertools.product(SHAPES, ["eager", "sdpa"], [0.0, 0.1], ["fp32", "bf16"], ["none", "full"]))


def measure(block, dtype, recompute):
    torch.manual_seed(0)
    block = block.to(dtype).train()
    x = torch.randn(B, S, block.h, dtype=dtype, requires_grad=True)
    with saved_bytes(block) as m:
        y = checkpoint(block, x, use_reentrant=True) if recompute == "full" else block(x)
    y.float().sum().backward()  # the saved tensors really were enough for backward
    return m["bytes"]


@pytest.mark.parametrize("shape, attention, dropout, dtype, recompute", CASES)
def test_layer_activations_match_pytorch_within_2_percent(shape, attention, dropout, dtype, recompute):
    kwargs, make = SHAPES[shape]
    arch = Architecture(layers=1, vocab=100, max_positions=S, dropout=dropout, **kwargs)
    d = {"fp32": 4, "bf16": 2}[dtype]
    measured = measure(make(dropout, attention), {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype], recompute)
    st = Setting(s=S, b=B, dtype_bytes=d, dropout=dropout > 0, device="cpu", attention=attention, paper=False)
    predicted = layer_activations(arch, st, recompute=recompute).total
    if recompute == "none":
        predicted += sum(x.bytes for x in rotary_saved(arch, st))  # this block builds its own cos/sin tables
    assert predicted == pytest.approx(measured, rel=0.02), (predicted, measured)


def test_the_full_validation_suite_lists_every_framework():
    from memcalc.validation.suite import DEEPSPEED, FULL, HF_FSDP, HF_ZERO3, ZERO3, ZERO3_FIRST, deepspeed_available, full
    from memcalc.validation.suite import transformers_available

    assert {c.framework for c in FULL} == {"ddp", "fsdp1", "fsdp2"}
    assert {c.strategy for c in DEEPSPEED} == {"zero-0", "zero-1", "zero-2", "zero-3"}
    assert {c.strategy for c in ZERO3} == {"zero-3"}
    # ZeRO-3 is measured after the step that records its trace.
    assert {c.steps for c in DEEPSPEED + ZERO3 if c.strategy == "zero-3"} == {3}
    assert {c.steps for c in ZERO3_FIRST} == {1}
    hf, ds = transformers_available(), deepspeed_available()
    ds_all = DEEPSPEED + ZERO3 + ZERO3_FIRST
    assert full() == FULL + (HF_FSDP if hf else ()) + (ds_all if ds else ()) + (HF_ZERO3 if hf and ds else ())
    assert {c.model for c in HF_FSDP + HF_ZERO3} == {"hf-gpt2", "hf-llama", "hf-gpt_neox", "hf-bloom", "hf-opt", "hf-falcon"}
