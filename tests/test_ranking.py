"""Ranking: published runs of the same job that differ in one choice come out in the order they were measured.

The planner ranks plans by step time, so the order matters more than the level. Runs: pytorch/torchtitan
benchmarks/llama3_h100_202412_torchtitan.md (Tables 1-6, the published tokens/s per GPU in
docs/generate_performance.py ``TITAN_TPS``), configured as docs/generate_published.py and generate_performance.py
configure them. Nothing is tuned to these figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import memcalc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import generate_performance as perf  # noqa: E402

RUNS = dict(perf.titan_runs())

PAIRS = perf.PAIRS


def _tps(name: str) -> float:
    t = memcalc.estimate(**RUNS[name]).time
    assert t is not None
    return t.tokens_per_s_per_gpu


@pytest.mark.parametrize("what, slower, faster", PAIRS, ids=[p[0] for p in PAIRS])
def test_published_pairs_come_out_in_the_measured_order(what, slower, faster):
    assert perf.TITAN_TPS[slower] < perf.TITAN_TPS[faster]  # the published order
    assert _tps(slower) < _tps(faster)


def test_the_ratio_of_each_pair_is_within_a_factor_of_the_published_one():
    """Beyond the order: the predicted speed-up of each pair against the published one. The context-parallel pairs
    are the widest (the published steps slow down faster with the CP degree than the model says; see
    docs/performance-model.md), so the bound is loose: a ranking that holds by luck would fail it."""
    for _, slower, faster in PAIRS:
        published = perf.TITAN_TPS[faster] / perf.TITAN_TPS[slower]
        predicted = _tps(faster) / _tps(slower)
        assert 1 / 1.5 < predicted / published < 1.5, (slower, faster, published, predicted)


def test_nvidias_megatron_core_throughput_replays_within_10_percent_median_and_30_each():
    """NeMo 24.12's published FP8 throughput on DGX-H100 (docs/generate_performance.py ``NEMO``), replayed as
    ``nemo()`` configures it: within 10 % at the median and 30 % each. Added after the model was built; a change that
    moves Megatron-Core's step time off NVIDIA's figures fails here."""
    import statistics

    start = len(perf.REPLAYS)
    perf.nemo()
    predicted = {name: pred for _, name, _, _, pred in perf.REPLAYS[start:]}
    errors = {name: pred / pub - 1 for _, name, _, pub, pred in perf.REPLAYS[start:]}
    del perf.REPLAYS[start:]
    assert len(errors) == len(perf.NEMO)
    assert statistics.median(abs(e) for e in errors.values()) < 0.10, errors
    assert max(abs(e) for e in errors.values()) < 0.30, errors
    # the same job on 4x the GPUs and 8x the batch (GPT3-175B): NVIDIA's per-GPU throughput rises, so does memcalc's
    assert predicted["GPT3-175B, 512 GPUs"] > predicted["GPT3-175B, 128 GPUs"]
