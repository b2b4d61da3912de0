"""--float8 (torchao float8 training): converted weights, fp8 all-gathers, fp8 GEMM time, unchanged saved tensors."""

from __future__ import annotations

import json

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.inputs.presets import load_model
from memcalc.model.float8 import cast_bytes, layer_weights
from memcalc.time.hardware import load_calibration
from memcalc.time.step import layer_time

LLAMA3_8B = load_model("llama-3-8b")
# One Llama-3-8B layer: q 4096x4096, k and v 4096x1024, o 4096x4096, gate and up 4096x14336, down 14336x4096.
N8 = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336
KW = dict(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, gpu="h100", seq_len=8192, attention="flash",
          recompute="full")


def test_converted_weights_per_layer() -> None:
    assert layer_weights(LLAMA3_8B) == N8 == 218_103_808
    assert layer_weights(LLAMA3_8B, tp=2) == N8 // 2  # column- and row-parallel halves
    # tp 16 > 8 KV heads: each rank keeps one whole KV head (replicated), as the step time's matmuls do
    assert layer_weights(LLAMA3_8B, tp=16) == 4096 * 256 + 2 * 4096 * 128 + 256 * 4096 + 3 * 4096 * 896
    from memcalc.time.flops import layer_gemms

    for tp in (1, 2, 8, 16):
        assert layer_weights(LLAMA3_8B, tp) == sum(g.k * g.n for g in layer_gemms(LLAMA3_8B, False, tp))


def test_fp8_all_gather_carries_one_byte_per_converted_weight() -> None:
    bf16 = {(c.op, c.phase): c.payload_bytes_per_call for c in memcalc.estimate(**KW).communication.collectives}
    fp8 = {(c.op, c.phase): c.payload_bytes_per_call
           for c in memcalc.estimate(float8="tensorwise", float8_all_gather=True, **KW).communication.collectives}
    assert bf16[("all-gather", "forward")] == 16_060_522_496  # 2Ψ, Ψ padded to a multiple of 8
    assert fp8[("all-gather", "forward")] == fp8[("all-gather", "backward")] == 16_060_522_496 - 32 * N8
    assert fp8[("reduce-scatter", "backward")] == bf16[("reduce-scatter", "backward")]  # gradients unchanged


def test_saved_tensors_and_memory_do_not_change() -> None:
    for accounting in ("paper", "realistic"):
        a = memcalc.estimate(accounting=accounting, **KW).memory.per_gpu
        b = memcalc.estimate(float8="rowwise", accounting=accounting, **KW).memory.per_gpu
        assert (a.total, a.peak_allocated) == (b.total, b.peak_allocated)


def test_projections_at_the_fp8_rate_plus_the_casts() -> None:
    cal = load_calibration("h100-sxm")
    bf16 = layer_time(LLAMA3_8B, False, cal, "bf16", 8192, 1)
    fp8 = layer_time(LLAMA3_8B, False, cal, "bf16", 8192, 1, float8="tensorwise")
    # Every GEMM of the layer is a converted projection: same FLOPs, same efficiency curve, 1979 / 989 the peak
    assert fp8.matmul_fwd == pytest.approx(bf16.matmul_fwd * 989 / 1979, rel=1e-12)
    assert fp8.attention_fwd == bf16.attention_fwd  # attention stays bf16
    # tensorwise casts: 6 bytes per input and grad_output element, 8 per weight element (torchao roofline_utils)
    t = 8192
    casts = sum(6 * t * (i + o) + 8 * i * o for i, o in [(4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096),
                                                          (4096, 14336), (4096, 14336), (14336, 4096)])
    assert cast_bytes(LLAMA3_8B, "tensorwise", t) == casts
    assert fp8.memory_fwd - bf16.memory_fwd == pytest.approx(casts / 3 / cal.hbm_bytes_per_s, rel=1e-12)
    step = memcalc.estimate(float8="tensorwise", **KW).time.step_s
    assert step < memcalc.estimate(**KW).time.step_s


def test_bad_float8_input_is_one_line() -> None:
    cases = [
        (dict(params=7e9, float8="rowwise"), "give the model's shape"),
        (dict(model="llama-3-8b", float8="fp8"), "accepted: none, tensorwise, rowwise"),
        (dict(model="mixtral-8x7b", float8="tensorwise"), "mixture of experts"),
        (dict(model="llama-3-8b", stage=3, gpus=8, float8="tensorwise", float8_all_gather=True), "FSDP"),
        (dict(model="llama-3-8b", fsdp="FULL_SHARD", gpus=8, float8="rowwise", float8_all_gather=True), "tensorwise"),
        ({"model": "llama-3-8b", "fsdp": "FULL_SHARD", "gpus": 8, "float8": "tensorwise"},
         "--float8 needs fp8 tensor cores, which a100-sxm-80gb lacks; give a --gpu with them"),
        ({"model": "llama-3-8b", "gpu": "v100", "float8": "rowwise"}, "which v100-32gb lacks"),
    ]
    for kw, words in cases:
        with pytest.raises(InputError, match=words):
            memcalc.estimate(**kw)


def test_json_carries_the_recipe() -> None:
    d = json.loads(memcalc.estimate(float8="tensorwise", float8_all_gather=True, **KW).model_dump_json())
    assert (d["input"]["float8"], d["input"]["float8_all_gather"]) == ("tensorwise", True)
    assert d["accounting"] == "realistic"  # the FSDP2 timeline gathers the converted weights in fp8


def test_tensorwise_speed_up_against_published_runs() -> None:
    # Published with torch.compile, which memcalc does not time, so the speed-up over bf16 is compared:
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1 (8 x H100, local batch 2, op AC): 6,667 -> 8,532
    # tokens/s/GPU (+28.0 %); torchao docs workflows/training.md (8 x H100, batch 1, op AC, fp8 all-gather): 6,150 ->
    # 7,689.5 (+25.0 %). Nothing is fitted to these rows (docs/performance-model.md, "Float8").
    from memcalc.evaluate import evaluate
    from memcalc.inputs.plan import to_plan
    from memcalc.time.estimate import time_evaluation

    def tps(b: int, **f8: object) -> float:
        inp = memcalc.build_input(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, seq_len=8192,
                                  micro_batch=b, recompute="selective", attention="sdpa", gpu="h100",
                                  framework="torchtitan", **f8)
        return time_evaluation(evaluate(to_plan(inp)), gpu=inp.gpu.key, recompute="op").tokens_per_s_per_gpu

    assert tps(2, float8="tensorwise") / tps(2) == pytest.approx(8532 / 6667, abs=0.03)
    assert tps(1, float8="tensorwise", float8_all_gather=True) / tps(1) == pytest.approx(7689.5 / 6150, abs=0.03)
