"""--accounting deepspeed-estimator: exactly DeepSpeed's estimate_zero2/3_model_states_mem_needs."""

import itertools

import pytest

import memcalc
from memcalc.memory.accountings.deepspeed_estimator import zero2, zero3
from memcalc.model.params import largest_module
from memcalc.inputs.presets import load_model


def test_zero2_by_hand():
    # 7B on 8 GPUs of one node, no offload: gpu 2P + int(18P/8); cpu P x 4 x 8 x 1.5.
    e = zero2(7_000_000_000, 8, 1, cpu_offload=False)
    assert (e.gpu, e.cpu) == (14_000_000_000 + 15_750_000_000, 336_000_000_000)
    off = zero2(7_000_000_000, 8, 2, cpu_offload=True)
    assert (off.gpu, off.cpu) == (14_000_000_000, int(7_000_000_000 * max(4 * 16, 16) * 1.5))


def test_zero3_by_hand():
    p, largest = 6_738_415_616, 131_072_000
    e = zero3(p, largest, 8, 1, cpu_offload=False, cpu_offload_params=False)
    assert e.gpu == 4 * largest + int(18 * p / 8) and e.cpu == int(largest * 4 * 8 * 1.5)
    e = zero3(p, largest, 8, 2, cpu_offload=True, cpu_offload_params=True, zero_init=False)
    assert e.gpu == 4 * largest and e.cpu == int(p * max(4 * 8, 18 / 2) * 1.5)


def test_cli_path_uses_the_architectures_largest_module():
    r = memcalc.estimate(model="llama-2-7b", stage=3, gpus=16, accounting="deepspeed-estimator", offload_optimizer="cpu")
    a = load_model("llama-2-7b")
    want = zero3(6_738_415_616, largest_module(a)[1], 8, 2, True, False)
    assert (r.memory.per_gpu.total, r.memory.per_node.cpu) == (want.gpu, want.cpu)
    assert r.memory.per_gpu.total == sum(x.bytes for x in r.memory.per_gpu.rows)
    assert any("GiB labelled 'GB'" in n for n in r.notes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(params=7e9, stage=3, gpus=8), "needs the largest layer"),
        (dict(params=7e9, fsdp="FULL_SHARD", gpus=8), "covers DeepSpeed ZeRO stages 1-3"),
        (dict(params=7e9, stage=0, gpus=8), "covers DeepSpeed ZeRO stages 1-3"),
        (dict(model="llama-2-7b", stage=2, gpus=8, seq_len=2048), "model states on plain data parallelism only"),
    ],
)
def test_refuses_what_deepspeeds_functions_cannot_answer(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memcalc.estimate(accounting="deepspeed-estimator", **kwargs)


PARAMS = [124_439_808, 6_738_415_616, 7_000_000_000, 175_000_000_000, 999_999_937]
LAYOUTS = [(1, 1), (8, 1), (8, 2), (4, 16), (2, 3)]


@pytest.mark.parametrize("total, layout", list(itertools.product(PARAMS, LAYOUTS)))
def test_equals_deepspeeds_functions(total, layout):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    g, nodes = layout
    gpus = g * nodes
    for off in (False, True):
        ours = memcalc.estimate(params=total, stage=2, gpus=gpus, gpus_per_node=g, accounting="deepspeed-estimator",
                                offload_optimizer="cpu" if off else "none")  # fmt: skip
        cpu, gpu = estimate_zero2_model_states_mem_needs(total, g, nodes, off, 1.5)
        assert (ours.memory.per_node.cpu, ours.memory.per_gpu.total) == (cpu, gpu)
        for off_p, zi, largest in itertools.product((False, True), (False, True), (total // 7 + 1, 1_000)):
            if off_p and not off:
                continue  # DeepSpeed's function ignores param offload without optimizer offload
            ours = memcalc.estimate(params=total, stage=3, gpus=gpus, gpus_per_node=g, accounting="deepspeed-estimator",
                                    offload_optimizer="cpu" if off else "none", offload_params="cpu" if off_p else "none",
                                    zero_init=zi, largest_layer_params=largest)  # fmt: skip
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, g, nodes, off, off_p, zi, 1.5)
            assert (ours.memory.per_node.cpu, ours.memory.per_gpu.total) == (cpu, gpu)
