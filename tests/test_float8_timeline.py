"""torchao float8 in the realistic timeline, against the tracer running torchao's own ``Float8Linear``.

- FSDP2 with the fp8 all-gather (``--float8-all-gather``): torchao's ``WeightWithDynamicFloat8CastTensor
  .fsdp_pre_all_gather`` casts each converted weight's shard to fp8 before the all-gather, so the gathered layer holds
  its projection weights as 1-byte data (``FsdpOverlay.make(..., fp8_gather=True)``).
- Eager float8 layers: the down projection's backward casts (``memcalc.model.float8.eager_backward``) set the layer's
  backward peak; the timeline lands on the traced peak to within torchao's fp32 scales (a few bytes per weight).

The tracer runs as rank 0 of the fake process group for FSDP2; its casts are eager (compiled layers fuse them).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchao")

import memcalc
from memcalc.errors import InputError
from memcalc.memory.engine.timeline import timeline
from memcalc.memory.overlays.fsdp_overlay import FsdpOverlay
from memcalc.model.float8 import eager_backward, layer_weights
from memcalc.model.hf_config import architecture_from_config
from memcalc.validation.trace import trace_step

LLAMA = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False)
S, B = 256, 2
SCALES = 1024  # torchao's fp32 scales and amaxes of the gathered weights: bytes, not modelled
SMALL = dict(LLAMA, hidden_size=256, intermediate_size=1024, num_hidden_layers=2, vocab_size=512)


@pytest.mark.parametrize("world, recompute", [(4, "none"), (8, "full")])
def test_fp8_all_gather_peak_against_torchao_under_fsdp2(world: int, recompute: str) -> None:
    arch = architecture_from_config(LLAMA)
    traced, model = {}, {}
    for ag in (False, True):
        traced[ag] = trace_step(LLAMA, seq_len=S, micro_batch=B, precision="fp32", world=world, fsdp=True,
                                fsdp_param_dtype="bf16", recompute=recompute, float8="tensorwise",
                                float8_all_gather=ag)  # fmt: skip
        model[ag] = timeline(arch, family="llama", regime="fp32", attention="sdpa", s=S, b=B, world=world, fsdp=True,
                             fsdp_param_dtype="bf16", recompute=recompute, float8="tensorwise",
                             float8_all_gather=ag).peak  # fmt: skip
    assert model[False].live_bytes == traced[False].peak  # float8 without the fp8 gather: exact
    assert 0 <= traced[True].peak - model[True].live_bytes <= SCALES
    assert model[True].phase == traced[True].peak_phase == "backward"
    # what the fp8 gather saves at the peak: one layer's converted weights gathered (the last layer's all-gather
    # output, alive through the loss), one byte less per element, to within the scales
    saved = traced[False].peak - traced[True].peak
    assert model[False].live_bytes - model[True].live_bytes == pytest.approx(saved, abs=SCALES)
    assert saved == pytest.approx(layer_weights(arch), rel=0.01)


def test_fp8_gather_shrinks_the_layer_all_gather_not_the_reduce_scatter() -> None:
    arch = architecture_from_config(LLAMA)
    plain = FsdpOverlay.make(arch, "llama", "amp-bf16", 8, "bf16", "foreach", "adamw")
    fp8 = FsdpOverlay.make(arch, "llama", "amp-bf16", 8, "bf16", "foreach", "adamw", fp8_gather=True)
    assert plain.layer_flat - fp8.layer_flat == layer_weights(arch)  # 2 bytes -> 1 per converted weight element
    assert fp8.layer == fp8.layer_flat and fp8.layer_reduce == plain.layer_flat and fp8.root == plain.root
    assert fp8.states == plain.states


def test_fp8_gather_is_answered_by_the_realistic_accounting() -> None:
    """Llama 3 8B, torchtitan's FSDP2 on 8 ranks with the embedding and head in the root (its v0.1 units, under which
    the last layer's all-gather output is alive at this step's peak, the loss's backward): the realistic accounting
    answers, and its peak falls by the converted weights of the gathered layer copies alive at the peak, one byte
    per element each (one to three copies: this layer, the prefetched next one, the previous all-gather output).
    Under v0.2's units nothing of a layer is gathered at that peak, and the fp8 gather leaves it as it is."""
    from memcalc.inputs.presets import load_model

    kw = dict(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, precision="bf16-mixed", seq_len=8192,
              micro_batch=1, recompute="full", attention="sdpa", gpu="h100", framework="torchtitan",
              float8="tensorwise", fsdp_wrap="root")
    plain, fp8 = memcalc.estimate(**kw), memcalc.estimate(**kw, float8_all_gather=True)
    assert plain.accounting == fp8.accounting == "realistic"
    kw["fsdp_wrap"] = "separate"
    assert memcalc.estimate(**kw).memory.per_gpu.peak_allocated == memcalc.estimate(
        **kw, float8_all_gather=True).memory.per_gpu.peak_allocated
    n8 = layer_weights(load_model("llama-3-8b"))
    assert n8 == 218_103_808
    assert n8 <= plain.memory.per_gpu.peak_allocated - fp8.memory.per_gpu.peak_allocated <= 3 * n8


def test_fp8_gather_without_fsdp_is_refused() -> None:
    with pytest.raises(InputError, match="float8_all_gather"):
        timeline(architecture_from_config(LLAMA), family="llama", regime="bf16", attention="sdpa", s=S, b=B,
                 float8_all_gather=True)
    with pytest.raises(InputError, match="float8_all_gather needs float8 'tensorwise' and fsdp"):
        trace_step(LLAMA, seq_len=S, micro_batch=B, float8="rowwise", float8_all_gather=True, world=4, fsdp=True)


EAGER = [  # (name, config, precision, recompute, trace/timeline keywords): the peak is layer 1's float8 casts
    ("bf16", SMALL, "bf16", "none", {}),
    ("fp32", SMALL, "fp32", "none", {}),
    ("ffn 2048", dict(SMALL, intermediate_size=2048), "bf16", "none", {}),
    ("full recompute", SMALL, "bf16", "full", {}),
    ("fsdp2 bf16 params", SMALL, "fp32", "none", dict(world=4, fsdp=True, fsdp_param_dtype="bf16")),
    ("fsdp2 fp8 gather", SMALL, "fp32", "none", dict(world=4, fsdp=True, fsdp_param_dtype="bf16",
                                                     float8_all_gather=True)),
]


@pytest.mark.parametrize("name, cfg, precision, recompute, kw", EAGER, ids=[e[0] for e in EAGER])
def test_eager_float8_backward_casts_against_torchao(name, cfg, precision, recompute, kw) -> None:
    traced = trace_step(cfg, seq_len=512, micro_batch=4, precision=precision, recompute=recompute, float8="tensorwise",
                        **kw)  # fmt: skip
    model = timeline(architecture_from_config(cfg), family="llama", regime=precision, attention="sdpa", s=512, b=4,
                     recompute=recompute, float8="tensorwise", **kw).peak  # fmt: skip
    assert "float8 casts" in model.label and traced.peak_phase == model.phase
    assert 0 <= traced.peak - model.live_bytes <= SCALES
    plain = timeline(architecture_from_config(cfg), family="llama", regime=precision, attention="sdpa", s=512, b=4,
                     recompute=recompute, **kw).peak  # fmt: skip
    assert plain.live_bytes < model.live_bytes  # without the casts the timeline would be short of the trace


def test_eager_backward_moments() -> None:
    # T tokens, in i, out o, activation bytes d: the second output-gradient cast (9·T·o beside the first fp8 copy)
    # or the input cast (9·T·i beside both fp8 copies of the output gradient), each with the input gradient
    t, i, o = 2048, 1024, 256
    assert eager_backward(t, i, o, 2) == 2 * t * o + 11 * t * i + i * o
    assert eager_backward(t, o, i, 2) == 10 * t * i + 2 * t * o + i * o
    assert eager_backward(t, i, o, 2, weight_cast=False) == 2 * t * o + 11 * t * i


def test_float8_under_autocast_is_an_upper_bound() -> None:
    """Under autocast torchao's Float8Linear casts its input itself and autocast makes no bf16 weight copies for it,
    which the autocast timeline counts: the estimate stays above the trace, within 5 %."""
    traced = trace_step(SMALL, seq_len=512, micro_batch=4, precision="amp-bf16", float8="tensorwise")
    model = timeline(architecture_from_config(SMALL), family="llama", regime="amp-bf16", attention="sdpa", s=512, b=4,
                     float8="tensorwise").peak  # fmt: skip
    assert traced.peak < model.live_bytes < 1.05 * traced.peak
