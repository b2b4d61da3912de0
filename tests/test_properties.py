"""Laws that hold for every input (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

import memcalc
from memcalc.inputs.model import MIN_PARAMS
from memcalc.report.results import Comparison, Estimate

psis = st.integers(min_value=MIN_PARAMS, max_value=10**13)  # below MIN_PARAMS a bare count is refused
worlds = st.sampled_from([1, 2, 4, 8, 16, 64, 128, 512, 1024])
precisions = st.sampled_from(["fp32", "fp16-mixed", "bf16-mixed", "bf16"])
optimizers = st.sampled_from(["adamw", "sgd", "sgd-momentum", "adam-8bit", "adafactor", "lion"])
strategy_names = st.sampled_from(list(memcalc.DEFAULT_COMPARE))


def model_states(r):
    g = r.memory.per_gpu
    return g.parameters + g.gradients + g.optimizer_states


@settings(max_examples=150, deadline=None)
@given(psi=psis, n=worlds, precision=precisions, optimizer=optimizers)
def test_more_sharding_never_costs_more_model_state_memory(psi, n, precision, optimizer):
    chain = [("stage", 0), ("stage", 1), ("stage", 2), ("stage", 3)]
    mem = [model_states(memcalc.estimate(params=psi, gpus=n, precision=precision, optimizer=optimizer, **{k: v}))
           for k, v in chain]  # fmt: skip
    assert mem == sorted(mem, reverse=True)
    fsdp = [model_states(memcalc.estimate(params=psi, gpus=n, precision=precision, optimizer=optimizer, fsdp=f))
            for f in ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")]  # fmt: skip
    assert fsdp == sorted(fsdp, reverse=True)


@settings(max_examples=150, deadline=None)
@given(psi=psis, stage=st.sampled_from([1, 2, 3]), pair=st.sampled_from([(8, 16), (16, 64), (64, 1024), (1, 2), (2, 8)]))
def test_more_gpus_never_cost_more_per_gpu_for_sharded_states(psi, stage, pair):
    small, large = (memcalc.estimate(params=psi, stage=stage, gpus=w) for w in pair)
    assert model_states(large) <= model_states(small)
    assert large.memory.per_gpu.optimizer_states <= small.memory.per_gpu.optimizer_states


@settings(max_examples=150, deadline=None)
@given(psi=psis, n=worlds, name=strategy_names, k=st.integers(1, 8), precision=precisions)
def test_rows_sum_to_totals(psi, n, name, k, precision):
    r = memcalc.estimate(params=psi, gpus=n, strategy=name, grad_accum=k, precision=precision)
    g = r.memory.per_gpu
    assert g.total == sum(row.bytes for row in g.rows)
    assert g.optimizer_states == g.master_weights + g.optimizer_moments
    node = r.memory.per_node
    assert node.cpu == sum(x.bytes for x in node.rows if x.location == "cpu")
    assert node.nvme == sum(x.bytes for x in node.rows if x.location == "nvme")
    c = r.communication
    assert c.payload_bytes == sum(x.payload_bytes for x in c.collectives)
    assert c.sent_bytes_per_gpu == sum(x.sent_bytes_per_gpu for x in c.collectives)
    assert c.sent_bytes_per_gpu == c.intra_node_sent_bytes_per_gpu + c.inter_node_sent_bytes_per_gpu
    assert c.host_transfer_bytes == sum(h.bytes for h in c.host_transfers)
    for x in c.collectives:
        assert x.payload_bytes == x.payload_bytes_per_call * x.calls_per_step
        assert 0 <= x.sent_bytes_per_gpu <= 2 * x.payload_bytes


@settings(max_examples=60, deadline=None)
@given(psi=psis, n=worlds, name=strategy_names)
def test_state_is_conserved_across_gpu_host_and_nvme(psi, n, name):
    # Offload moves bytes, it does not create or lose them: the optimizer states on GPU + host + NVMe of a
    # node equal the same states without offload.
    r = memcalc.estimate(params=psi, gpus=n, strategy=name)
    base = memcalc.estimate(params=psi, gpus=n, strategy=name.split("+")[0])
    ranks = r.memory.per_node.ranks
    opt_off = sum(x.bytes for x in r.memory.per_node.rows if x.key in ("master_weights", "optimizer_moments"))
    assert r.memory.per_gpu.optimizer_states * ranks + opt_off == base.memory.per_gpu.optimizer_states * ranks


@settings(max_examples=60, deadline=None)
@given(psi=psis, n=worlds, name=strategy_names, k=st.integers(1, 4))
def test_json_round_trip_gives_the_same_result(psi, n, name, k):
    r = memcalc.estimate(params=psi, gpus=n, strategy=name, grad_accum=k)
    assert Estimate.model_validate_json(r.model_dump_json()) == r
    assert Estimate.model_validate(r.model_dump()) == r


def test_comparison_round_trip():
    c = memcalc.compare(params=7e9, gpus=64)
    assert Comparison.model_validate_json(c.model_dump_json()) == c
