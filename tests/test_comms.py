"""Per-step communication against ZeRO §7 and the FSDP paper (arXiv 2304.11277) §3."""

import pytest

from memcalc.comm.collectives import bus_factor, sent_bytes_per_rank
from memcalc.memory.accountings.states import shard_numel


def ops(r):
    return [(c.op, c.phase, c.tensor, c.group, c.group_size) for c in r.communication.collectives]


@pytest.mark.parametrize("n", [2, 8, 64, 128, 1000])
def test_nccl_tests_bus_factors(n):
    # nccl-tests doc/PERFORMANCE.md
    assert bus_factor("all-reduce", n) * n == 2 * (n - 1)
    assert bus_factor("all-gather", n) * n == n - 1
    assert bus_factor("reduce-scatter", n) * n == n - 1
    assert bus_factor("all-to-all", n) * n == n - 1
    assert bus_factor("broadcast", n) == 1
    assert sent_bytes_per_rank("all-reduce", 1000 * n, n) == 2000 * (n - 1)


@pytest.mark.parametrize("psi", [7_500_000_000, 175_000_000_000])
@pytest.mark.parametrize("n", [8, 64, 128])
def test_section_7_volumes(est, psi, n):
    # ZeRO §7.2: 2Ψ elements per step for stages 0-2, 3Ψ for stage 3 (x (N-1)/N under a ring), 2 bytes each.
    s = shard_numel(psi, n)
    ddp = est(params=psi, stage=0, gpus=n).communication
    assert ops(est(params=psi, stage=0, gpus=n)) == [("all-reduce", "backward", "gradients", "data-parallel", n)]
    assert ddp.payload_bytes == 2 * psi
    assert ddp.sent_bytes_per_gpu == -(-2 * (n - 1) * 2 * psi // n)
    for stage in (1, 2):
        r = est(params=psi, stage=stage, gpus=n)
        assert ops(r) == [
            ("reduce-scatter", "backward", "gradients", "data-parallel", n),
            ("all-gather", "optimizer step", "parameters", "data-parallel", n),
        ]
        assert r.communication.payload_bytes == 2 * (2 * s * n)
        assert r.communication.sent_bytes_per_gpu == 2 * (n - 1) * s * 2
    z3 = est(params=psi, stage=3, gpus=n)
    assert ops(z3) == [
        ("all-gather", "forward", "parameters", "data-parallel", n),
        ("all-gather", "backward", "parameters", "data-parallel", n),
        ("reduce-scatter", "backward", "gradients", "data-parallel", n),
    ]
    assert z3.communication.sent_bytes_per_gpu == 3 * (n - 1) * s * 2
    # "1.5x" of ZeRO §7.2.2 and of the FSDP paper (3M(W-1)/W vs 2M(W-1)/W)
    z2 = est(params=psi, stage=2, gpus=n).communication.sent_bytes_per_gpu
    assert z3.communication.sent_bytes_per_gpu * 2 == z2 * 3


def test_payload_is_nccl_tests_s(est):
    psi, n = 1_000_000_000, 8
    for c in est(params=psi, stage=3, gpus=n).communication.collectives:
        assert c.payload_bytes_per_call == 2 * psi  # gathered output / unreduced input: the whole tensor
        assert c.sent_bytes_per_gpu == c.payload_bytes * (n - 1) // n
        assert c.dtype == "bf16" and not c.crosses_nodes and c.link == "nvlink3"


def test_fp32_collectives_carry_four_bytes(est):
    r = est(params=1e9, stage=2, gpus=8, precision="fp32")
    assert {c.dtype for c in r.communication.collectives} == {"fp32"}
    assert r.communication.payload_bytes == 2 * 4 * 1_000_000_000


@pytest.mark.parametrize(
    "fsdp, zero", [("FULL_SHARD", 3), ("SHARD_GRAD_OP", 2), ("NO_SHARD", 0)]
)
@pytest.mark.parametrize("n", [8, 64])
def test_fsdp_equals_zero_in_memory_and_volume(est, fsdp, zero, n):
    psi = 13_000_000_000
    f, z = est(params=psi, fsdp=fsdp, gpus=n), est(params=psi, stage=zero, gpus=n)
    assert f.memory.per_gpu.model_dump(exclude={"rows"}) == z.memory.per_gpu.model_dump(exclude={"rows"})
    assert f.communication.sent_bytes_per_gpu == z.communication.sent_bytes_per_gpu
    assert f.communication.payload_bytes == z.communication.payload_bytes


def test_ddp_zero0_and_no_shard_are_one_thing(est):
    rs = [est(params=3e9, gpus=16, precision="bf16-mixed", **kw)  # one precision (each framework's own differs)
          for kw in ({"ddp": True}, {"stage": 0}, {"fsdp": "NO_SHARD"})]
    assert len({r.memory.per_gpu.total for r in rs}) == 1
    assert len({r.communication.sent_bytes_per_gpu for r in rs}) == 1


def test_shard_grad_op_gathers_in_forward_not_after_the_step(est):
    r = est(params=1e9, fsdp="SHARD_GRAD_OP", gpus=8)
    assert [(c.op, c.phase) for c in r.communication.collectives] == [
        ("all-gather", "forward"),
        ("reduce-scatter", "backward"),
    ]


def test_hybrid_shard_splits_intra_and_inter_node(est):
    psi, w, g = 7_000_000_000, 64, 8
    r = est(params=psi, fsdp="HYBRID_SHARD", gpus=w, gpus_per_node=g)
    s = shard_numel(psi, g)
    assert r.strategy.shard_group_size == 8 and r.strategy.replicas == 8
    assert r.memory.per_gpu.total == 16 * s  # FULL_SHARD inside the node
    rows = r.communication.collectives
    assert ops(r) == [
        ("all-gather", "forward", "parameters", "shard group", 8),
        ("all-gather", "backward", "parameters", "shard group", 8),
        ("reduce-scatter", "backward", "gradients", "shard group", 8),
        ("all-reduce", "backward", "gradients", "replica group", 8),
    ]
    assert [c.crosses_nodes for c in rows] == [False, False, False, True]
    # Intra: 3 x (F-1)/F x 2Ψ. Inter: ring all-reduce of the 2Ψ/F shard over R replicas: 2 (R-1)/R x 2Ψ/F.
    assert r.communication.intra_node_sent_bytes_per_gpu == 3 * 7 * s * 2
    assert r.communication.inter_node_sent_bytes_per_gpu == 2 * 7 * (2 * s) // 8
    assert rows[3].payload_bytes == 2 * s


def test_hybrid_zero2_memory_and_traffic(est):
    psi, w = 7_000_000_000, 32
    r = est(params=psi, fsdp="_HYBRID_SHARD_ZERO2", gpus=w)
    s = shard_numel(psi, 8)
    assert r.memory.per_gpu.total == 2 * psi + 14 * s
    assert ops(r) == [
        ("all-gather", "forward", "parameters", "shard group", 8),
        ("reduce-scatter", "backward", "gradients", "shard group", 8),
        ("all-reduce", "backward", "gradients", "replica group", 4),
    ]
    assert r.communication.inter_node_sent_bytes_per_gpu == 2 * 3 * (2 * s) // 4


def test_hybrid_shard_group_spanning_two_nodes(est):
    r = est(params=7e9, fsdp="HYBRID_SHARD", gpus=64, shard_group=16)
    assert r.strategy.shard_group_size == 16 and r.strategy.replicas == 4
    assert all(c.crosses_nodes for c in r.communication.collectives)


def test_hybrid_on_one_node_is_full_shard(est):
    h, f = est(params=7e9, fsdp="HYBRID_SHARD", gpus=8), est(params=7e9, fsdp="FULL_SHARD", gpus=8)
    assert h.memory.per_gpu.total == f.memory.per_gpu.total
    assert h.communication.sent_bytes_per_gpu == f.communication.sent_bytes_per_gpu
    assert h.communication.inter_node_sent_bytes_per_gpu == 0


def test_multi_node_groups_use_the_network(est):
    r = est(params=7e9, stage=3, gpus=16)
    assert all(c.crosses_nodes and c.link == "network" for c in r.communication.collectives)
    assert r.communication.intra_node_sent_bytes_per_gpu == 0


def test_gradient_accumulation_changes_only_what_is_reissued(est):
    psi, n, k = 1_000_000_000, 8, 4
    calls = lambda r: [(c.op, c.phase, c.calls_per_step) for c in r.communication.collectives]  # noqa: E731
    assert calls(est(params=psi, stage=0, gpus=n, grad_accum=k)) == [("all-reduce", "backward", 1)]
    assert calls(est(params=psi, stage=1, gpus=n, grad_accum=k)) == [
        ("reduce-scatter", "backward", 1), ("all-gather", "optimizer step", 1)]  # fmt: skip
    assert calls(est(params=psi, stage=2, gpus=n, grad_accum=k)) == [
        ("reduce-scatter", "backward", 4), ("all-gather", "optimizer step", 1)]  # fmt: skip
    z3 = est(params=psi, stage=3, gpus=n, grad_accum=k)
    assert calls(z3) == [("all-gather", "forward", 4), ("all-gather", "backward", 4), ("reduce-scatter", "backward", 4)]
    assert z3.communication.sent_bytes_per_gpu == 4 * est(params=psi, stage=3, gpus=n).communication.sent_bytes_per_gpu


def test_one_gpu_sends_nothing(est):
    for kw in ({"stage": 3}, {"ddp": True}, {"fsdp": "HYBRID_SHARD"}):
        r = est(params=1e9, gpus=1, **kw)
        assert r.communication.collectives == [] and r.communication.sent_bytes_per_gpu == 0


def test_offload_adds_pcie_rows(est):
    psi, n, k = 7_000_000_000, 8, 2
    r = est(params=psi, stage=2, gpus=n, offload_optimizer="cpu", grad_accum=k)
    s = shard_numel(psi, n)
    rows = [(h.op, h.tensor, h.link, h.calls_per_step, h.bytes) for h in r.communication.host_transfers]
    # ZeRO-Offload §4.1: fp16 gradient partition down (per micro-batch in ZeRO-2), updated fp16 partition up.
    assert rows == [("device-to-host", "gradients", "pcie", 2, 2 * 2 * s), ("host-to-device", "parameters", "pcie", 1, 2 * s)]
    # One GPU: the minimum 4Ψ bytes per step.
    one = est(params=psi, stage=2, gpus=1, offload_optimizer="cpu")
    assert one.communication.host_transfer_bytes == 4 * psi
    # Collectives are unchanged by offload.
    assert r.communication.sent_bytes_per_gpu == est(params=psi, stage=2, gpus=n, grad_accum=k).communication.sent_bytes_per_gpu


def test_param_offload_fetches_for_every_gather(est):
    psi, n = 7_000_000_000, 8
    s = shard_numel(psi, n)
    r = est(params=psi, stage=3, gpus=n, offload_optimizer="nvme", offload_params="nvme")
    rows = [(h.op, h.phase, h.tensor, h.bytes) for h in r.communication.host_transfers]
    assert rows == [
        ("nvme-read", "forward", "parameters", 2 * s),
        ("host-to-device", "forward", "parameters", 2 * s),
        ("nvme-read", "backward", "parameters", 2 * s),
        ("host-to-device", "backward", "parameters", 2 * s),
        ("device-to-host", "backward", "gradients", 2 * s),
        ("nvme-read", "optimizer step", "optimizer states", 12 * s),
        ("nvme-write", "optimizer step", "optimizer states", 12 * s),
        ("nvme-write", "optimizer step", "parameters", 2 * s),
    ]
