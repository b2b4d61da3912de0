"""Model-state memory against the ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054)."""

import pytest

import memcalc
from memcalc.memory.accountings.states import shard_numel
from memcalc.units import GB

# §5, Figure 1: per-GPU model-state bytes with K = 12 (mixed-precision Adam), each shard ⌈Ψ/N⌉.
PAPER = {
    0: lambda psi, s: 16 * psi,  # baseline DP: 2Ψ + 2Ψ + 12Ψ
    1: lambda psi, s: 4 * psi + 12 * s,  # P_os: 4Ψ + 12Ψ/N
    2: lambda psi, s: 2 * psi + 14 * s,  # P_os+g: 2Ψ + 14Ψ/N
    3: lambda psi, s: 16 * s,  # P_os+g+p: 16Ψ/N
}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("psi", [7_500_000_000, 175_000_000_000, 1_000_000_000_000, 6_400_000_000])
@pytest.mark.parametrize("n", [1, 8, 64, 128, 1024])
def test_zero_stages_match_section_5_exactly(est, stage, psi, n):
    gpus_per_node = min(n, 8)
    r = est(params=psi, stage=stage, gpus=n, gpus_per_node=gpus_per_node)
    s = -(-psi // n)
    assert r.memory.per_gpu.total == PAPER[stage](psi, s)
    g = r.memory.per_gpu
    assert g.parameters + g.gradients + g.optimizer_states == PAPER[stage](psi, s)
    if psi % n == 0:  # the paper's own arithmetic, Ψ/N exact
        assert r.memory.per_gpu.total == {0: 16 * psi, 1: 4 * psi + 12 * psi // n, 2: 2 * psi + 14 * psi // n,
                                          3: 16 * psi // n}[stage]  # fmt: skip


def test_figure_1_example_7_5b_on_64_gpus(est):
    # ZeRO paper Figure 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    got = [est(params=7.5e9, stage=s, gpus=64).memory.per_gpu.total / GB for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)
    assert got[0] == 120.0  # exact: 16 x 7.5e9 bytes


def test_breakdown_stage_2_shows_master_and_moments_apart(est):
    psi, n = 7_000_000_000, 64
    g = est(params=psi, stage=2, gpus=n).memory.per_gpu
    assert g.parameters == 2 * psi
    assert g.gradients == 2 * shard_numel(psi, n)
    assert g.master_weights == 4 * shard_numel(psi, n)
    assert g.optimizer_moments == 8 * shard_numel(psi, n)
    assert g.optimizer_states == g.master_weights + g.optimizer_moments


def test_shards_round_up_never_down(est):
    psi, n = 1_000_000_007, 64  # not divisible by 64
    g = est(params=psi, stage=3, gpus=n).memory.per_gpu
    shard = -(-psi // n)
    assert shard * n > psi
    assert g.parameters == 2 * shard and g.gradients == 2 * shard and g.optimizer_states == 12 * shard


@pytest.mark.parametrize(
    "precision, optimizer, bytes_per_param",
    [
        ("bf16-mixed", "adamw", 16),  # ZeRO §3.1: 2 + 2 + 12
        ("fp16-mixed", "adam", 16),
        ("fp32", "adamw", 16),  # 4 + 4 + 8, no master copy
        ("bf16", "adamw", 8),  # pure bf16: 2 + 2 + bf16 m and v 2 + 2
        ("bf16-mixed", "adam-8bit", 10),  # 2 + 2 + (4 + 1 + 1)
        ("bf16-mixed", "sgd-momentum", 12),  # 2 + 2 + (4 + 4)
        ("bf16-mixed", "sgd", 8),  # 2 + 2 + master 4
        ("bf16-mixed", "lion", 12),  # 2 + 2 + (4 + 4)
        ("bf16-mixed", "adafactor", 8),  # 2 + 2 + master 4 (+ factored state, not counted)
        ("fp32", "sgd", 8),
    ],
)
def test_bytes_per_parameter_by_precision_and_optimizer(est, precision, optimizer, bytes_per_param):
    psi = 1_000_000_000
    r = est(params=psi, ddp=True, gpus=1, precision=precision, optimizer=optimizer)
    assert r.memory.per_gpu.total == bytes_per_param * psi


def test_optimizer_k_values_from_domain():
    # K (optimizer bytes per parameter, master copy included) with a master copy: AdamW 12; 8-bit Adam 6;
    # SGD momentum 8; plain SGD 4; Lion 8.
    p = memcalc.PRECISIONS["bf16-mixed"]
    k = {name: opt.state_bytes_per_param(p) for name, opt in memcalc.OPTIMIZERS.items()}
    assert k == {"adamw": 12, "adam-8bit": 6, "paged-adam-8bit": 6, "sgd-momentum": 8, "sgd": 4, "lion": 8, "adafactor": 4}


def test_offload_optimizer_moves_states_and_grad_partition_to_host(est):
    psi, n = 7_000_000_000, 16
    r = est(params=psi, stage=2, gpus=n, offload_optimizer="cpu")
    g, node = r.memory.per_gpu, r.memory.per_node
    shard = shard_numel(psi, n)
    assert (g.parameters, g.gradients, g.optimizer_states) == (2 * psi, 0, 0)
    # ZeRO-Offload §4.1: fp16 gradients + fp32 master, m, v on the CPU: (2 + 12) Ψ/N per rank, x 8 ranks per node.
    assert node.cpu == 8 * 14 * shard
    assert node.nvme == 0


def test_zero_1_offload_keeps_full_gradients_on_gpu(est):
    psi = 1_000_000_000
    g = est(params=psi, stage=1, gpus=8, offload_optimizer="cpu").memory.per_gpu
    assert (g.parameters, g.gradients, g.optimizer_states) == (2 * psi, 2 * psi, 0)


def test_zero_3_offload_params_and_optimizer_to_nvme(est):
    psi, n = 70_000_000_000, 32
    r = est(params=psi, stage=3, gpus=n, offload_optimizer="nvme", offload_params="nvme")
    shard = shard_numel(psi, n)
    assert r.memory.per_gpu.total == 0
    # Gradient partition stays in pinned host memory; params, master and moments go to NVMe.
    assert r.memory.per_node.cpu == 8 * 2 * shard
    assert r.memory.per_node.nvme == 8 * (2 + 12) * shard


def test_fsdp_cpu_offload_moves_everything_sharded(est):
    psi, n = 13_000_000_000, 16
    r = est(params=psi, fsdp="FULL_SHARD", gpus=n, offload_params="cpu")
    assert r.memory.per_gpu.total == 0
    assert r.memory.per_node.cpu == 8 * 16 * shard_numel(psi, n)


def test_shard_grad_op_offload_still_holds_gathered_params(est):
    psi = 1_000_000_000
    g = est(params=psi, fsdp="SHARD_GRAD_OP", gpus=8, offload_params="cpu").memory.per_gpu
    assert g.parameters == 2 * psi and g.gradients == 0 and g.optimizer_states == 0


def test_host_ram_is_per_node_below_one_node(est):
    psi = 1_000_000_000
    r = est(params=psi, stage=3, gpus=4, offload_optimizer="cpu")
    assert r.memory.per_node.ranks == 4
    assert r.memory.per_node.cpu == 4 * 14 * shard_numel(psi, 4)


def test_overheads_are_visible_rows_and_count_in_the_total():
    r = memcalc.estimate(params=1e9, stage=3, gpus=8, cuda_context_gib=0.5, reserve_gib=2)
    rows = {row.key: row.bytes for row in r.memory.per_gpu.rows}
    assert rows["cuda_context"] == 2**29 and rows["allocator_reserve"] == 2 * 2**30
    assert r.memory.per_gpu.total == sum(rows.values()) == 16 * 125_000_000 + 2**29 + 2 * 2**30


def test_fit_verdict_and_headroom(est):
    fits = est(params=7e9, stage=3, gpus=8, gpu="a100-80g")
    assert fits.memory.fit.fits
    assert fits.memory.fit.usable_bytes == round(79.15 * 2**30)
    assert fits.memory.fit.headroom_bytes == fits.memory.fit.usable_bytes - 16 * 7_000_000_000 // 8
    too_big = est(params=7e9, ddp=True, gpus=8, gpu="a100-80g")  # 112 GB of model states
    assert not too_big.memory.fit.fits and too_big.memory.fit.headroom_bytes < 0
