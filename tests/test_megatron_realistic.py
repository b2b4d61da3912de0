"""The realistic accounting under --framework megatron (memcalc.memory.megatron): Megatron-Core's buffers and
optimizer shards, the TE layer's saved set, the schedule's micro-batches in flight; what it refuses."""

import pytest

import memcalc
from memcalc.evaluate import evaluate, notes
from memcalc.inputs.plan import to_plan
from memcalc.memory import megatron
from memcalc.memory.megatron_saved import Shape, layer_bytes, layer_saved

BASE = dict(model="llama-3-70b", gpus=64, tp=4, pp=4, sequence_parallel=True, framework="megatron", stage=1,
            seq_len=8192, micro_batch=1, grad_accum=32, gpu="h100")


def plan(**kw):
    return to_plan(memcalc.build_input(**{**BASE, **kw}))


def rows(p, stage=0):
    return {r.key: r.bytes for r in megatron.evaluate(p, stage).rows}


def test_applies_realistic():
    assert plan().accounting == "realistic"


def test_distributed_optimizer_states():
    """bf16 params + fp32 grad buffer whole, fp32 master and Adam moments over dp·cp: 6 + 12/d bytes a buffer element."""
    p = plan()
    r = rows(p)
    n = r["parameters"] // 2
    assert r["gradients"] == 4 * n
    assert r["master_weights"] + r["optimizer_moments"] == 12 * (n // p.shard_group_size)
    from memcalc.memory.paper import param_groups

    psi = param_groups(p, 0)[0]
    assert psi < n <= psi + 128 * (psi // megatron.BUCKET_MIN + 1)


def test_ddp_states_18_bytes():
    p = plan(stage=0)
    r = rows(p)
    from memcalc.memory.paper import param_groups

    psi = param_groups(p, 0)[0]
    assert r["parameters"] + r["gradients"] + r["master_weights"] + r["optimizer_moments"] == 18 * psi


def test_fp8_weight_copies_and_smaller_saved_set():
    bf, f8 = rows(plan()), rows(plan(float8="tensorwise"))
    assert "fp8_weights" not in bf
    assert f8["fp8_weights"] == 2 * megatron._linear_weights(plan(), 0)
    assert f8["activations"] < bf["activations"]


def test_te_layer_saved_set_llama70b():
    """Llama-3-70B at s 8192, tp 4 with SP: 12h + 4kv + 6f bytes a token / tp in bf16, plus the fp32 statistics."""
    x = Shape(8192, 8192, 1024, 28672, True, 64, "rmsnorm", 8192, 1, 4, True)
    t = 8192 // 4
    stats = 2 * 4 * t + 4 * 64 // 4 * 8192
    assert layer_bytes(x) == (12 * 8192 + 4 * 1024 + 6 * 28672) * t + stats
    names = [n for n, _ in layer_saved(x, fp8=True)]
    assert "proj input (fp8 copy)" in names
    assert layer_bytes(x, modules=("core_attn",)) == layer_bytes(x) - 4 * 64 // 4 * 8192


@pytest.mark.parametrize("pp,v,expect", [(4, 1, [4, 3, 2, 1]), (4, 5, [23, 21, 19, 17])])
def test_in_flight(pp, v, expect):
    assert [megatron.in_flight(r, pp, 32, v) for r in range(pp)] == expect
    assert megatron.in_flight(0, 4, 2, 1) == 2  # capped at the micro-batches


def test_interleaved_first_rank_most_loaded_and_below_paper():
    p = plan(virtual_stages=5, float8="tensorwise", cp=2, grad_accum=64)
    ev = evaluate(p)
    assert ev.top == 0 and ev.realistic is not None
    paper = evaluate(plan(virtual_stages=5, float8="tensorwise", cp=2, grad_accum=64, accounting="paper"))
    assert ev.total < paper.total
    assert any("Megatron-Core" in n for n in notes(p))


def test_full_recompute_keeps_inputs():
    full, none = rows(plan(recompute="full")), rows(plan())
    assert full["activations"] == 2 * 8192 * 8192 // 4 * 20 * 4


def test_moe_takes_paper_with_note():
    inp = memcalc.build_input(model="mixtral-8x7b", gpus=16, ep=8, framework="megatron", stage=1, seq_len=4096,
                              micro_batch=1, gpu="h100")
    assert inp.accounting == "paper"
    assert any("MoE layers" in n for n in notes(to_plan(inp)))


def test_virtual_stages_not_dividing_layers_refused():
    with pytest.raises(memcalc.InputError):
        evaluate(plan(virtual_stages=3))
