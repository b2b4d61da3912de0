"""Host and launch time (memcalc/time/kernels.py): a floor under the GPU's time, visible as the breakdown's host row."""

from __future__ import annotations

from pathlib import Path

import pytest

import memcalc
from memcalc.time.kernels import HOST_PER_LAUNCH_S, host_launches

TINY = str(Path(__file__).parent / "data" / "h100" / "tinyllama-1.1b" / "config.json")


def _time(**kw):
    args = dict(hf_config=TINY, gpus=1, gpu="h100", precision="amp-bf16", optimizer_impl="foreach", attention="sdpa",
                recompute="none", seq_len=1024, micro_batch=1) | kw  # fmt: skip
    r = memcalc.estimate(**args)
    assert r.time is not None
    return r.time


def test_a_small_eager_step_waits_for_the_host_and_a_large_one_does_not():
    # 22 layers x (50 + 98) launches x 13.3 us = 43 ms of host against 38 ms of GPU work at 1,024 tokens
    f, b = host_launches("hf", False, True, False)
    first_layer = f * HOST_PER_LAUNCH_S
    small = _time()
    gpu = small.breakdown.compute_s + small.breakdown.memory_bound_s
    assert small.breakdown.host_s == pytest.approx(22 * (f + b) * HOST_PER_LAUNCH_S - gpu + first_layer, rel=1e-6)
    assert small.breakdown.host_s > 5 * first_layer
    # 16,384 tokens: the GPU works far longer than the host launches; only the first layer's launches show
    large = _time(seq_len=4096, micro_batch=4)
    assert large.breakdown.host_s == pytest.approx(first_layer, rel=1e-9)


def test_compiled_layers_launch_fewer_kernels_and_hide_the_host():
    eager, compiled = _time(), _time(compile=True)
    assert compiled.breakdown.host_s < eager.breakdown.host_s / 5
    assert host_launches("hf", True, True, False) == host_launches("megatron", False, False, False)


def test_eager_attention_and_autocast_launch_more():
    plain = sum(host_launches("hf", False, False, False))
    assert sum(host_launches("hf", False, True, False)) > plain
    assert sum(host_launches("hf", False, False, True)) > plain
    assert sum(host_launches("megatron", False, False, False)) < plain / 3


def test_eager_dtensor_tensor_parallelism_is_host_bound_at_small_work():
    # measurements/h100-kernels.md: eager DTensor TP spends ~15 ms of host per block; 8 GPUs on 4,096 tokens of
    # Llama-3-8B give each rank far less GPU work than that
    kw = dict(model="llama-3-8b", gpus=8, tp=8, sequence_parallel=True, precision="bf16-mixed", seq_len=4096,
              micro_batch=1, gpu="h100", framework="torchtitan", ddp=True)  # fmt: skip
    eager = memcalc.estimate(**kw).time
    compiled = memcalc.estimate(**kw, compile=True).time
    assert eager is not None and compiled is not None
    assert eager.breakdown.host_s > 0.2 * eager.step_s
    assert compiled.breakdown.host_s < eager.breakdown.host_s / 10
    assert compiled.step_s < eager.step_s


def test_fsdp2_hooks_add_host_time():
    kw = dict(model="qwen3-0.6b", gpus=8, precision="bf16-mixed", seq_len=512, micro_batch=1, gpu="h100")
    ddp = memcalc.estimate(**kw, ddp=True).time
    fsdp2 = memcalc.estimate(**kw, fsdp="FULL_SHARD", fsdp_version=2).time
    assert ddp is not None and fsdp2 is not None
    assert fsdp2.breakdown.host_s > ddp.breakdown.host_s


def test_the_breakdown_still_adds_up_to_the_step():
    t = _time()
    b = t.breakdown
    parts = (b.compute_s + b.memory_bound_s + b.recompute_s + sum(b.communication_s.values()) + b.bubble_s
             + b.optimizer_s + b.offload_s + b.host_s)  # fmt: skip
    assert parts == pytest.approx(t.step_s, rel=1e-12)


def test_the_table_counts_are_what_hugging_face_llama_launches():
    """Ground truth: count the aten ops that do work in a Llama layer's forward and backward on the CPU, as
    benchmarks/bench_host.py does (8 layers minus 4), and compare with the table."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_host

    ids = torch.randint(0, 128, (1, 16))
    for dtype, autocast in ((torch.bfloat16, False), (torch.float32, True)):
        (f4, b4) = bench_host._count(bench_host._model(4, "sdpa", dtype), ids, autocast)
        (f8, b8) = bench_host._count(bench_host._model(8, "sdpa", dtype), ids, autocast)
        assert ((f8 - f4) // 4, (b8 - b4) // 4) == host_launches("hf", False, autocast, False)
