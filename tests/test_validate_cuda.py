"""memcalc validate's CUDA check: a real step's peak against the realistic accounting's, what estimate answers with."""

import pytest

import memcalc
from memcalc.validation.cuda import MICRO_BATCH, SEQ_LEN, SMALL_LLAMA, CudaPeak, realistic_estimate


def test_the_check_compares_the_realistic_peak_memcalc_answers_with():
    est = realistic_estimate()
    # 2 x 8192 x 512 (embedding, head) + 4 x (786,432 attention + 3 x 512 x 1408 MLP + 2 x 512 norms) + 512
    assert est.accounting == "realistic" and est.model.parameters == 20_189_696
    # the same step through the command-line path's defaults (--accounting auto) gives the same peak
    auto = memcalc.estimate(model=est.input.model.architecture, ddp=True, gpus=1, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH,
                            dropout=0.0, precision="bf16", attention="sdpa", framework="hf")  # fmt: skip
    assert auto.accounting == "realistic"
    assert auto.memory.per_gpu.peak_allocated == est.memory.per_gpu.peak_allocated == 582_999_460
    g = est.memory.per_gpu
    assert g.peak_allocated < g.peak_reserved < g.total  # the CUDA context is outside the allocator: not compared
    rows = {r.key: r.bytes for r in g.rows}
    assert rows["parameters"] == 2 * 20_189_696  # pure bf16 weights
    assert rows["activations_log-softmax_output_(fp32)"] == 4 * MICRO_BATCH * SEQ_LEN * 8192  # the loss's fp32 copy


def test_the_step_runs_on_the_cpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memcalc.validation.cuda import two_steps

    tiny = dict(SMALL_LLAMA, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                num_hidden_layers=2, vocab_size=128)  # fmt: skip
    assert two_steps(tiny, seq_len=16, micro_batch=2, device="cpu") is None
    assert torch.get_default_dtype() == torch.float32


def test_the_line_names_both_peaks():
    line = CudaPeak(measured_allocated=600_000_000, estimated_allocated=582_999_460, measured_reserved=900_000_000,
                    estimated_reserved=944_976_079).line()  # fmt: skip
    assert "max_memory_allocated measured 600,000,000, estimated 582,999,460 (-2.8%)" in line
    assert "max_memory_reserved measured 900,000,000, estimated 944,976,079 (+5.0%)" in line
    assert "4 layers, hidden 512, 4 x 512 tokens" in line


def test_on_cuda_the_realistic_peak_is_close_to_the_measured_one():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from memcalc.validation.cuda import peak_vs_estimate

    p = peak_vs_estimate()
    assert abs(p.estimated_allocated - p.measured_allocated) <= 0.05 * p.measured_allocated, p.line()
