"""The realistic accounting from the layers that bound the rest (``memcalc.memory.engine.stack``) against the moment-by-moment
replay of every layer: the same rows, peaks, reserved peak, peak moment and phase peaks, to the byte."""

import pytest

from memcalc.api import build_input
from memcalc.inputs.plan import to_plan
from memcalc.memory.accountings import realistic
from memcalc.memory.engine.stack import distinct
from memcalc.memory.engine.timeline import timeline

TITAN = dict(framework="torchtitan", fsdp="FULL_SHARD", fsdp_version=2, gpu="h100")
PLANS = {
    "FSDP2, llama-3-8b": dict(model="llama-3-8b", gpus=8, seq_len=4096, **TITAN),
    "FSDP2, TP 8 + SP, full recompute": dict(model="llama-3-70b", gpus=64, seq_len=8192, tp=8, sequence_parallel=True,
                                           recompute="full", **TITAN),
    "FSDP2, TP 2, no SP": dict(model="llama-3-8b", gpus=8, seq_len=2048, tp=2, fsdp="FULL_SHARD", fsdp_version=2),
    "PP 4, 1F1B": dict(model="llama-3-8b", gpus=32, pp=4, seq_len=4096, grad_accum=8, recompute="full",
                       precision="bf16-mixed", **TITAN),
    "PP 4 x TP 2 + SP, interleaved": dict(model="llama-3-8b", gpus=64, pp=4, tp=2, sequence_parallel=True,
                                          virtual_stages=2, seq_len=4096, grad_accum=8, recompute="full",
                                          precision="bf16-mixed", **TITAN),
    "PP 8, TP 8, 405B": dict(model="llama-3-405b", gpus=512, pp=8, tp=8, sequence_parallel=True, seq_len=8192,
                             recompute="full", **TITAN),
    "ZeRO-3": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=3, recompute="full"),
    "ZeRO-2": dict(model="llama-3-8b", gpus=8, seq_len=2048, stage=2),
    "DDP": dict(model="qwen3-0.6b", gpus=8, seq_len=2048, ddp=True, precision="amp-bf16"),
    "one GPU, LoRA": dict(model="llama-2-7b", gpus=1, seq_len=2048, lora_rank=16, precision="amp-bf16"),
    "one GPU, pure bf16, full recompute": dict(model="qwen3-0.6b", gpus=1, seq_len=2048, precision="bf16",
                                               recompute="full"),
    "one GPU, every:2 recompute": dict(model="qwen3-0.6b", gpus=1, seq_len=2048, recompute="every:2",
                                       precision="amp-bf16"),
    "one GPU, selective recompute, eager": dict(model="qwen3-0.6b", gpus=1, seq_len=1024, recompute="selective",
                                                attention="eager", precision="amp-bf16"),
    "FSDP1": dict(model="llama-3-8b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=1),
    "FSDP2 SHARD_GRAD_OP": dict(model="llama-3-8b", gpus=8, seq_len=2048, fsdp="SHARD_GRAD_OP", fsdp_version=2),
    "HSDP": dict(model="llama-3-8b", gpus=16, seq_len=2048, fsdp="HYBRID_SHARD", fsdp_version=2, shard_group=8),
    "FSDP2, parameters offloaded": dict(model="llama-3-8b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=2,
                                        offload_params="cpu"),
    "FSDP2, no wrap": dict(model="qwen3-0.6b", gpus=8, seq_len=2048, fsdp="FULL_SHARD", fsdp_version=2,
                           fsdp_auto_wrap="none"),
    "FSDP2, MoE": dict(model="mixtral-8x7b", gpus=16, seq_len=4096, fsdp="FULL_SHARD", fsdp_version=2, gpu="h100"),
    "FSDP2, compiled, float8": dict(model="llama-3-8b", gpus=8, seq_len=4096, compile=True, float8="tensorwise",
                                    **TITAN),
    "GPT-2, autocast": dict(model="gpt2", gpus=1, seq_len=1024, precision="amp-bf16"),
    "BLOOM, full recompute": dict(model="bloom-176b", gpus=1, seq_len=512, layers=6, recompute="full",
                                  attention="eager", precision="fp32"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_the_bounding_layers_give_every_layer_s_answer(name):
    plan = to_plan(build_input(**PLANS[name]))
    assert plan.accounting == "realistic", name
    for stage in range(plan.pp):
        fast = realistic.evaluate(plan, stage)
        reference = realistic.evaluate(plan, stage, every_layer=True)
        assert (fast.peak_allocated, fast.peak_reserved, fast.peak_moment) == (
            reference.peak_allocated, reference.peak_reserved, reference.peak_moment)
        assert fast == reference


def test_a_stack_of_alike_layers_makes_four_layers_moments():
    """Llama 3 8B's 32 alike layers under FSDP2: the moments of layers 0, 1, 30 and 31 only, the same peak."""
    from memcalc.inputs.presets import load_model

    arch = load_model("llama-3-8b")
    kw = dict(family="llama", regime="amp-bf16", attention="sdpa", s=2048, b=1, world=8, fsdp_param_dtype="bf16",
              use_cache=False, position_ids=False)
    every, few = timeline(arch, **kw), timeline(arch, **kw, every_layer=False)
    layers = {m.phase for m in few.moments if ".layer." in m.phase}
    assert layers == {f"{p}.layer.{i}" for p in ("forward", "backward") for i in (0, 1, 30, 31)}
    assert few.peak == every.peak
    assert len(few.moments) < len(every.moments) / 4


def test_runs_are_cut_where_the_layers_differ():
    """The ends of each run of alike layers and the first and last two."""
    assert distinct(["a"] * 10) == {0, 1, 8, 9}
    assert distinct(["a"] * 4 + ["b"] * 6) == {0, 1, 3, 4, 8, 9}
    assert distinct(["a", "b"] * 3) == set(range(6))
    assert distinct(["a"]) == {0}


GEMMA3 = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=176, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, head_dim=16,
              layer_types=["sliding_attention"] * 5 + ["full_attention"] * 3, sliding_window=16)
SMOLLM3 = dict(model_type="smollm3", hidden_size=64, intermediate_size=176, num_hidden_layers=6, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, no_rope_layers=[1, 1, 0, 1, 1, 0])
SHAPES = [  # (model or config.json, timeline arguments)
    (GEMMA3, dict(family="gemma3_text", regime="amp-bf16", attention="sdpa", s=32, b=2)),
    (GEMMA3, dict(family="gemma3_text", regime="fp32", attention="eager", s=32, b=2, recompute="every:3")),
    (SMOLLM3, dict(family="smollm3", regime="amp-bf16", attention="sdpa", s=32, b=2)),
    ("llama-3-8b", dict(family="llama", regime="bf16", attention="sdpa", s=512, b=1, recompute="every:3", world=8)),
    ("llama-3-8b", dict(family="llama", regime="amp-bf16", attention="eager", s=256, b=1, recompute="selective")),
    ("bloom-176b", dict(family="bloom", regime="amp-bf16", attention="eager", s=64, b=1, recompute="every:2")),
    ("mixtral-8x7b", dict(family="mixtral", regime="bf16", attention="sdpa", s=256, b=1, recompute="full", world=4)),
]


def _arch(model):
    from memcalc.inputs.presets import load_model
    from memcalc.model.hf_config import architecture_from_config

    return load_model(model) if isinstance(model, str) else architecture_from_config(model)


@pytest.mark.parametrize("model, kw", SHAPES)
def test_each_kind_of_layer_is_sized_once_and_the_stack_replays_alike(model, kw):
    """``layer_stack`` sizes one layer per ``layer_kind`` and gives every layer those sizes: the same as sizing each
    layer; the timeline from the runs' ends has every layer's peak, phase peaks (layers folded) and reserved peak."""
    from memcalc.memory.allocator.reserved import reserved_peak
    from memcalc.memory.engine.stack import layer_stack
    from memcalc.memory.engine.timeline_layers import checkpointed, layer_sizes, parse_recompute

    arch = _arch(model)
    policy = parse_recompute(kw.get("recompute", "none"))
    args = (kw["family"], kw["regime"], kw["attention"], kw["s"], kw["b"], policy)
    layers, _ = layer_stack(arch, *args, "cpu", None, None, "hf", False, 1, "none", True, True, False)
    assert layers == tuple(layer_sizes(arch, family=kw["family"], regime=kw["regime"], attention=kw["attention"],
                                       s=kw["s"], b=kw["b"], policy=policy, index=i,
                                       use_cache=not checkpointed(policy, i)) for i in range(arch.layers))
    every, few = timeline(arch, **kw), timeline(arch, **kw, every_layer=False)

    def folded(tl):
        out: dict[str, int] = {}
        for phase, n in tl.phase_peaks.items():
            out[phase.split(".")[0]] = max(out.get(phase.split(".")[0], 0), n)
        return out

    assert few.peak == every.peak and folded(few) == folded(every)
    assert (reserved_peak(few.moments, few.loss_moment, few.loss_cache, True, few.loss_blocks)
            == reserved_peak(every.moments, every.loss_moment, every.loss_cache, True, every.loss_blocks))
