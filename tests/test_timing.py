"""Collective primitives: volumes against nccl-tests' formulas, the alpha-beta time, and the measured anchors."""

from __future__ import annotations

import pytest

from memcalc.comm.timing import PRIMITIVES, Group, Link, primitive_time, primitives, volumes
from memcalc.errors import InputError
from memcalc.inputs.presets import presets_dir
from memcalc.time.hardware import cluster_for_gpu, load_calibration, load_cluster, load_machine

GiB = 2**30


def test_volumes_follow_nccl_tests_factors():
    # nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, reduce-scatter/all-gather/all-to-all (n-1)/n, broadcast 1.
    S, n = 8 * 2**20, 8
    assert volumes("all-reduce", S, n) == (2 * 7 * S // 8, 2 * 7 * S // 8)
    for op in ("all-gather", "reduce-scatter", "all-to-all"):
        assert volumes(op, S, n) == (7 * S // 8, 7 * S // 8)
    assert volumes("broadcast", S, n) == (S, S)
    assert volumes("gather", S, n) == (7 * S // 8, 7 * S // 8)  # src/gather.cu: the root receives (n-1)/n S
    assert volumes("all-reduce", S, 1) == (0, 0)


def test_every_primitive_is_timed():
    m = load_machine("dgx-h100")
    rows = primitives(GiB, Group(8, 8), m.intra, m.inter)
    assert [r.name for r in rows] == list(PRIMITIVES)
    assert all(r.time_s > 0 and r.bus_bandwidth > 0 for r in rows)


def test_large_all_reduce_on_8_h100_matches_measured_busbw():
    # DOMAIN.md §11: NVLink all-reduce bus bandwidth ~476 GB/s on 8 x H100.
    m = load_machine("dgx-h100")
    r = primitive_time("all-reduce", 8 * GiB, Group(8, 8), m.intra, m.inter)
    assert r.bus_bandwidth / 1e9 == pytest.approx(476, rel=0.01)
    assert r.algorithm == "nvls"


def test_large_all_reduce_on_8_a100_within_measured_range():
    m = load_machine("dgx-a100")
    r = primitive_time("all-reduce", 8 * GiB, Group(8, 8), m.intra, m.inter)
    assert 230 <= r.bus_bandwidth / 1e9 <= 250  # DOMAIN.md §11: 230-250 GB/s
    assert r.algorithm == "ring"


def test_small_message_latency_anchors():
    m = load_machine("dgx-h100")
    intra = primitive_time("all-reduce", 8, Group(8, 8), m.intra, m.inter)
    inter = primitive_time("all-reduce", 8, Group(16, 8), m.intra, m.inter)
    assert intra.time_s * 1e6 == pytest.approx(12, rel=0.01)  # 12 us on 8 GPUs in a node
    assert inter.time_s * 1e6 == pytest.approx(25, rel=0.01)  # 25 us across nodes
    assert inter.algorithm == "hierarchical"


def test_one_rank_per_node_runs_at_nic_speed():
    m = load_machine("dgx-h100")
    r = primitive_time("all-gather", 4 * GiB, Group(4, 1), m.intra, m.inter)
    assert r.bus_bandwidth / 1e9 == pytest.approx(47, rel=0.01)  # NDR 46-48 GB/s per NIC


def test_time_grows_with_size_and_bus_bandwidth_saturates():
    link = Link("x", 100e9, 1e-6)
    t = [primitive_time("all-gather", s, Group(8, 8), link).time_s for s in (2**10, 2**20, 2**30)]
    assert t[0] < t[1] < t[2]
    bw = [primitive_time("all-gather", s, Group(8, 8), link).bus_bandwidth for s in (2**20, 2**30)]
    assert bw[0] < bw[1] < 100e9


def test_bad_inputs():
    link = Link("x", 100e9, 1e-6)
    with pytest.raises(InputError, match="did you mean 'all-gather'"):
        primitive_time("all-gahter", 1, Group(2, 2), link)
    with pytest.raises(InputError, match="per node"):
        primitive_time("all-reduce", 1, Group(2, 4), link)
    with pytest.raises(InputError, match="negative"):
        primitive_time("all-reduce", -1, Group(2, 2), link)


def test_presets_load_and_resolve_aliases():
    assert load_cluster("hgx-h100").key == "dgx-h100"
    assert load_calibration("h100").gpu == "h100-sxm"
    h200 = load_calibration("h200")  # extends h100-sxm: same compute, its own HBM
    assert h200.gemm_efficiency == load_calibration("h100-sxm").gemm_efficiency
    assert h200.hbm_peak_bytes_per_s == 4800e9
    b200 = load_calibration("b200")  # extends h100-sxm: the H100's fractions of the B200's own peaks
    assert b200.gemm_efficiency == h200.gemm_efficiency and b200.hbm_peak_bytes_per_s == 8000e9
    assert cluster_for_gpu("b200") == "hgx-b200" and load_cluster("b200").intra_node.bandwidth == 900e9
    assert cluster_for_gpu("a100-80g") == "dgx-a100"
    assert load_cluster("p5-h100").network.bandwidth == 50e9  # 3200 Gb/s / 8 GPUs
    assert load_cluster("p4d-a100").network.bandwidth == 6.25e9  # 400 Gb/s / 8 GPUs


def test_bad_presets(tmp_path):
    with pytest.raises(InputError, match="did you mean 'dgx-h100'"):
        load_cluster("dgx-h10")
    bad = tmp_path / "bad.toml"
    good = (presets_dir() / "clusters" / "dgx-h100.toml").read_text()
    bad.write_text(good.replace("intra_node_gbps = 450", "intra_node_gbps = -1"))
    with pytest.raises(InputError, match="intra_node_gbps = -1 must be a positive"):
        load_cluster(str(bad))
    bad.write_text(good.replace("host_memory_efficiency = 0.7", "host_memory_efficiency = 1.5"))
    with pytest.raises(InputError, match="above 1"):
        load_cluster(str(bad))
    bad.write_text(good.replace('gpu = "h100-sxm"', 'gpu = "h100-sx"'))
    with pytest.raises(InputError, match="did you mean"):
        load_cluster(str(bad))
    bad.write_text(good + "\nnvlink_gbps = 3\n")
    with pytest.raises(InputError, match="unknown key 'nvlink_gbps'"):
        load_cluster(str(bad))
