"""--framework torchtitan: what torchtitan's own Llama 3 code saves for backward, against a census of its modules."""

from __future__ import annotations

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.memory.families.saved import layer_saved, total
from memcalc.memory.engine.timeline_layers import _op_sac
from memcalc.memory.families.saved import shape
from memcalc.model.architecture import Architecture

# The census model (memcalc.validation.saved_torchtitan): dim 256, 2 layers, 4 heads, 2 kv heads, ffn 704
# (compute_ffn_hidden_dim(256, multiple_of=64)), vocab 1000, s = 64, b = 2.
TINY = Architecture(name="tt-tiny", family="llama", layers=2, hidden=256, heads=4, kv_heads=2, ffn=704,
                    gated_mlp=True, vocab=1000, position="rotary", norm="rmsnorm")
T, H = 128, 256  # tokens, width
# Bytes one layer saves, measured with saved-tensor hooks on torchtitan 0.3.0's modules on CPU (re-run:
# python -m memcalc.validation.saved_torchtitan).
CENSUS = {("fp32", "none"): 2_657_280, ("bf16", "none"): 1_608_704,
          ("fp32", "selective"): 1_017_856, ("bf16", "selective"): 509_952}


def _layer(regime: str, device: str = "cpu") -> int:
    return total(layer_saved(TINY, family="llama", regime=regime, attention="sdpa", s=64, b=2, device=device,
                             code="torchtitan"))


@pytest.mark.parametrize("regime", ["fp32", "bf16"])
def test_layer_equals_the_torchtitan_census(regime: str) -> None:
    assert _layer(regime) == CENSUS[(regime, "none")]
    d = 4 if regime == "fp32" else 2
    sac = _op_sac(shape(TINY, 64, 2), d, d, "torchtitan")  # wqkv, w1, w2 outputs + attention output, lse + input
    assert total(sac) == CENSUS[(regime, "selective")]


def test_against_hugging_face_llama() -> None:
    hf = {r: total(layer_saved(TINY, family="llama", regime=r, attention="sdpa", s=64, b=2)) for r in ("fp32", "bf16")}
    rotary = 4 * T * 64  # complex64 table gathered per layer: 8 bytes per T x hd/2
    assert _layer("fp32") - hf["fp32"] == rotary
    assert _layer("bf16") - hf["bf16"] == rotary + 2 * 2 * T * H  # two norms keep an fp32 normalized tensor
    # CUDA's fused rms_norm keeps its input and rstd only: 8·T·h less in fp32, 12·T·h less in bf16, per layer
    assert _layer("fp32") - _layer("fp32", "cuda") == 8 * T * H
    assert _layer("bf16") - _layer("bf16", "cuda") == 12 * T * H


def test_census_when_torchtitan_is_installed() -> None:
    saved_torchtitan = pytest.importorskip("memcalc.validation.saved_torchtitan")
    if not saved_torchtitan.available():
        pytest.skip("torchtitan is not installed")
    for (regime, recompute), want in CENSUS.items():
        got = saved_torchtitan.layer_bytes(saved_torchtitan.torchtitan_layer_census(regime, recompute))
        assert got == want, (regime, recompute)


def test_estimate_follows_the_framework_code() -> None:
    kw = dict(hf_config="tests/data/llama-3-8b-config.json", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, gpu="h100",
              seq_len=8192, attention="flash")
    # the same FSDP2 units (torchtitan's own put the embedding and the head apart: tests/test_fsdp_layouts.py)
    hf, tt = memcalc.estimate(**kw), memcalc.estimate(framework="torchtitan", fsdp_wrap="root", **kw)
    assert hf.accounting == tt.accounting == "realistic"
    rows = {r.label: r.bytes for r in tt.memory.per_gpu.rows}
    assert "rotary cos, sin" not in rows  # gathered inside each layer instead
    # Llama-3-8B, s = 8192, b = 1, bf16 activations on CUDA (the peak is in the last layer's backward, every layer's
    # activations alive): each of the 32 layers saves 2 x 4·T·h less (a fused norm keeps its bf16 input and rstd,
    # LlamaRMSNorm an fp32 copy, rstd and the bf16 normalized tensor) and 4·T·hd more (its rotary table); the final
    # norm keeps rstd only (6·T·h less) but also keeps its bf16 input, the last layer's output (2·T·h), which
    # Hugging Face's frees; Hugging Face's shared cos, sin (2·s·hd in bf16) are not there.
    t, h, hd = 8192, 4096, 128
    assert hf.memory.per_gpu.peak_allocated - tt.memory.per_gpu.peak_allocated == (
        32 * (8 * t * h - 4 * t * hd) + 6 * t * h - 2 * t * h + 2 * t * hd * 2)
    with pytest.raises(InputError, match="torchtitan"):
        memcalc.estimate(framework="torchtitan", accounting="realistic", **{**kw, "attention": "eager"})
