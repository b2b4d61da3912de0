"""3D parallelism: invariants, per-rank parameters, per-stage peaks, and model-parallel traffic by hand."""

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.model.params import Shard, stage_params
from memcalc.inputs.presets import load_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="llama-2-7b", gpus=128, tp=8, pp=3), r"tp\(8\) \* pp\(3\) \* cp\(1\) = 24 does not divide gpus\(128\)"),
        (dict(model="llama-2-7b", gpus=96, tp=8, pp=3), r"layers\(32\) is not divisible by pp\(3\)"),
        (dict(model="gpt2", gpus=16, tp=8), "tp 8 does not divide heads 12"),
        (dict(model="llama-2-7b", gpus=8, ep=2), r"ep\(2\) needs an MoE model"),
        (dict(model="mixtral-8x7b", gpus=8, ep=3), r"ep\(3\) does not divide dp\(8\)"),
        (dict(model="llama-2-7b", gpus=8, virtual_stages=2), "needs pipeline parallelism"),
        (dict(params=7e9, gpus=8, seq_len=2048), "needs the model's shape"),
        (dict(model="llama-2-7b", gpus=8, cp=8, seq_len=100), r"cp\(8\) does not divide seq_len\(100\)"),
        (dict(model="llama-2-7b", gpus=8, micro_batch=2), "need --seq-len"),
    ],
)
def test_invariants_name_every_factor(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memcalc.estimate(**kwargs)


def test_dp_is_world_over_model_parallel_and_zero_shards_over_dp():
    r = memcalc.estimate(model="llama-2-70b", stage=3, gpus=64, tp=8, pp=2)
    assert r.training.dp == 4 and r.strategy.shard_group_size == 4
    held = stage_params(load_model("llama-2-70b"), r.memory.most_loaded_stage, 2, Shard(tp=8)).total
    assert r.memory.stages[r.memory.most_loaded_stage].parameters == held
    assert r.memory.per_gpu.parameters == 2 * -(-held // 4)


def test_bare_count_with_model_parallelism_needs_the_shape():
    # A bare count has no hidden size to size tensor-parallel traffic with, nor layers to split over stages:
    # rather than an even split with no traffic, the shape is asked for.
    with pytest.raises(InputError, match="--tp, --pp needs the model's shape"):
        memcalc.estimate(params=175e9, stage=1, gpus=64, tp=8, pp=2)


def test_expert_parameters_shard_over_the_expert_data_parallel_group():
    r = memcalc.estimate(model="mixtral-8x7b", stage=3, gpus=8, ep=8)
    a = load_model("mixtral-8x7b")
    held = stage_params(a, 0, 1, Shard(ep=8))
    routed = sum(x.routed for x in held.layers)
    dense = held.total - routed
    # dense parameters over dp = 8, each rank's single expert per layer over dp/ep = 1 (not sharded further)
    assert r.memory.per_gpu.parameters == 2 * -(-dense // 8) + 2 * routed


def test_most_loaded_stage_is_named():
    r = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=4, pp=4, seq_len=4096, grad_accum=8)
    assert r.memory.most_loaded_stage == 0
    assert [s.micro_batches_in_flight for s in r.memory.stages] == [4, 3, 2, 1]
    assert r.memory.per_gpu.total == max(s.total for s in r.memory.stages)
    # Without activations the last stage (head + final norm) can be the heaviest.
    bare = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=4, pp=4)
    assert bare.memory.per_gpu.total == max(s.total for s in bare.memory.stages)


def ops(r, group):
    return [(c.op, c.phase, c.calls_per_step, c.payload_bytes_per_call, c.sent_bytes_per_gpu)
            for c in r.communication.collectives if c.group == group]  # fmt: skip


def test_tensor_parallel_traffic_by_hand():
    s, b, h, t, L, m = 2048, 1, 4096, 4, 32, 2
    r = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=4, tp=t, seq_len=s, micro_batch=b, grad_accum=m)
    act = s * b * h * 2
    # 2 all-reduces per layer forward and 2 backward, per micro-batch; ring: 2(t-1)/t x payload.
    assert ops(r, "tensor-parallel") == [
        ("all-reduce", "forward", 2 * L * m, act, 2 * L * m * (2 * (t - 1) * act // t)),
        ("all-reduce", "backward", 2 * L * m, act, 2 * L * m * (2 * (t - 1) * act // t)),
    ]
    sp = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=4, tp=t, seq_len=s, micro_batch=b, grad_accum=m,
                          sequence_parallel=True)  # fmt: skip
    tp_sent = lambda x: sum(c.sent_bytes_per_gpu for c in x.communication.collectives if c.group == "tensor-parallel")  # noqa: E731
    assert tp_sent(sp) == tp_sent(r)  # all-gather + reduce-scatter pairs move the same volume
    full = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=4, tp=t, seq_len=s, micro_batch=b, grad_accum=m,
                            recompute="full")  # fmt: skip
    assert ops(full, "tensor-parallel")[0][2] == 4 * L * m  # the forward runs again in backward


def test_pipeline_point_to_point_by_hand():
    s, b, h, m = 4096, 2, 4096, 8
    r = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=16, pp=4, seq_len=s, micro_batch=b, grad_accum=m)
    assert r.memory.most_loaded_stage == 0
    act = s * b * h * 2
    # The first stage sends each micro-batch's activations forward and receives gradients (sends none back).
    assert ops(r, "pipeline") == [("send", "forward", m, act, m * act)]
    # Stages stand dp = 4 ranks apart: stages 0 and 1 share node 0, stage 2 starts node 1.
    assert [c.crosses_nodes for c in r.communication.collectives if c.group == "pipeline"] == [False]
    middle = memcalc.estimate(model="llama-2-7b", ddp=True, gpus=16, pp=4, grad_accum=m, seq_len=s, micro_batch=b)
    assert middle.memory.most_loaded_stage == 0


def test_expert_parallel_all_to_all_by_hand():
    s, b, h, m, ep = 4096, 1, 4096, 1, 8
    r = memcalc.estimate(model="mixtral-8x7b", stage=3, gpus=8, ep=ep, seq_len=s, micro_batch=b, attention="flash")
    tokens = 2 * s * b * h * 2  # top_k = 2
    assert ops(r, "expert-parallel") == [
        ("all-to-all", "forward", 2 * 32 * m, tokens, 2 * 32 * m * (tokens * (ep - 1) // ep)),
        ("all-to-all", "backward", 2 * 32 * m, tokens, 2 * 32 * m * (tokens * (ep - 1) // ep)),
    ]


def test_context_parallel_kv_all_gather_by_hand():
    s, b, cp = 8192, 1, 4
    r = memcalc.estimate(model="llama-3-8b", stage=3, gpus=8, cp=cp, seq_len=s, micro_batch=b, attention="flash")
    kv = 2 * s * b * 1024 * 2  # K and V of the whole sequence at KV width 8 x 128, bf16
    rows = ops(r, "context-parallel")
    assert rows[0] == ("all-gather", "forward", 32, kv, 32 * (kv * (cp - 1) // cp))
    assert [x[:2] for x in rows] == [("all-gather", "forward"), ("all-gather", "backward"), ("reduce-scatter", "backward")]


def test_layout_places_tp_inside_a_node():
    r = memcalc.estimate(model="llama-2-70b", stage=1, gpus=64, tp=8, seq_len=4096, gpus_per_node=8)
    by_group = {c.group: c for c in r.communication.collectives}
    assert not by_group["tensor-parallel"].crosses_nodes and by_group["tensor-parallel"].link == "nvlink3"
    assert by_group["data-parallel"].crosses_nodes  # dp ranks stand 8 apart: one per node
    wide = memcalc.estimate(model="llama-2-70b", stage=1, gpus=32, tp=16, gpus_per_node=8, seq_len=4096)
    assert {c.group: c for c in wide.communication.collectives}["tensor-parallel"].crosses_nodes


def test_hybrid_shard_with_tensor_parallelism_shards_inside_the_node():
    r = memcalc.estimate(model="llama-2-7b", fsdp="HYBRID_SHARD", gpus=32, tp=2)
    assert r.training.dp == 16 and r.strategy.shard_group_size == 4 and r.strategy.replicas == 4
