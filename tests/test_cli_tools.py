"""The commands beside estimate and compare, output formats, and the step time in results."""

import csv
import io
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.comm.collectives import bus_factor
from memcalc.report.collectives import CollectiveTimes, parse_size
from memcalc.report.results import Comparison, Estimate

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_memcalc_alone_prints_the_help_not_an_error():
    p = subprocess.run([sys.executable, "-m", "memcalc"], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stderr == ""
    assert "Usage: memcalc" in p.stdout and "estimate" in p.stdout and "collectives" in p.stdout


def test_collectives_json_carries_every_primitive_with_time_and_bus_bandwidth():
    r = run("collectives", "--size", "1GiB", "--group", "8", "--gpu", "h100", "--json")
    assert r.exit_code == 0, r.output
    c = CollectiveTimes.model_validate_json(r.stdout)
    assert c.size_bytes == 2**30 and c.group == 8 and c.cluster == "dgx-h100" and c.nodes == 1
    names = [p.name for p in c.primitives]
    assert names == ["broadcast", "scatter", "gather", "reduce", "all-reduce", "all-gather", "reduce-scatter",
                     "all-to-all", "send/recv"]
    for p in c.primitives:
        assert p.time_s > 0
        # nccl-tests doc/PERFORMANCE.md: busbw = S / t x factor
        f = bus_factor(p.name, 8) if p.name in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                                 "broadcast", "reduce") else None
        if f is not None:
            assert p.bus_bandwidth == pytest.approx(2**30 / p.time_s * f.numerator / f.denominator, rel=1e-9)
    ring = {p.name: p for p in c.primitives}
    assert ring["all-gather"].sent_bytes == 2**30 * 7 // 8  # (n-1)/n S per rank


def test_collectives_across_nodes_is_slower_than_inside_one():
    inside = memcalc.collectives("256MiB", 8, gpu="h100")
    across = memcalc.collectives("256MiB", 8, gpu="h100", across_nodes=True)
    t = {p.name: p.time_s for p in inside.primitives}
    u = {p.name: p.time_s for p in across.primitives}
    assert across.ranks_per_node == 1 and across.nodes == 8
    assert u["all-gather"] > 4 * t["all-gather"]  # 50 GB/s NICs against 900 GB/s NVLink


@pytest.mark.parametrize(("text", "n"), [("1GiB", 2**30), ("512MiB", 512 * 2**20), ("64KB", 64_000), ("1e9", 10**9),
                                         (4096, 4096)])
def test_sizes_parse_in_the_unit_written(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["0", "-1GiB", "1PB0", "inf", "nan", "1YiB", "", "2e20"])
def test_bad_sizes_are_one_line_exit_2(bad):
    r = run("collectives", "--size", bad, "--group", "8")
    assert r.exit_code == 2 and "--size" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_estimate_formats_csv_and_markdown_carry_the_same_integers():
    args = ["estimate", "--params", "7e9", "--stage", "3", "--gpus", "8"]
    as_json = Estimate.model_validate_json(run(*args, "--json").stdout)
    rows = list(csv.DictReader(io.StringIO(run(*args, "--format", "csv").stdout)))
    gpu = {r["key"]: int(r["bytes"]) for r in rows if r["section"] == "per_gpu"}
    assert gpu["parameters"] == as_json.memory.per_gpu.parameters == 2 * 7_000_000_000 // 8
    md = run(*args, "-f", "markdown").stdout
    assert md.startswith("#") or "|" in md
    assert f"{as_json.memory.per_gpu.total / 2**30:,.2f}" in md
    bad = run(*args, "--format", "yaml")
    assert bad.exit_code == 2 and "accepted: table, json, csv, markdown" in bad.stderr


def test_catalogues_in_every_format():
    rows = json.loads(run("gpus", "--format", "json").stdout)
    assert any(r["name"] == "h100-sxm" and r["memory GB"] == 80 for r in rows)
    assert run("models", "--format", "csv").stdout.startswith("name,parameters,")
    assert "| zero-3 |" in run("strategies", "--format", "markdown").stdout


def test_step_time_in_the_estimate_and_its_json():
    r = memcalc.estimate(model="llama-3-8b", fsdp="FULL_SHARD", gpus=64, gpu="h100", seq_len=8192)
    t = r.time
    assert t is not None and t.cluster == "dgx-h100"
    b = t.breakdown
    parts = (b.compute_s + b.memory_bound_s + b.recompute_s + sum(b.communication_s.values()) + b.bubble_s
             + b.optimizer_s + b.offload_s + b.host_s)
    assert parts == pytest.approx(t.step_s, rel=1e-9)
    assert t.tokens_per_step == 64 * 8192
    assert t.tokens_per_s == pytest.approx(t.tokens_per_step / t.step_s)
    assert t.tokens_per_s_per_gpu == pytest.approx(t.tokens_per_s / 64)
    assert 0 < t.mfu <= t.hfu < 1
    d = json.loads(r.model_dump_json())
    assert d["time"]["step_s"] == t.step_s and d["time"]["mfu"] == t.mfu
    assert Estimate.model_validate_json(r.model_dump_json()) == r


def test_no_step_time_without_a_shape_says_why():
    r = memcalc.estimate(params=7e9, stage=3, gpus=8)
    assert r.time is None
    assert any(n.startswith("step time: a bare parameter count has no FLOPs") for n in r.notes)


def test_compare_ranks_by_memory_and_by_time():
    c = memcalc.compare(model="llama-3-8b", gpus=64, gpu="h100", seq_len=4096,
                        strategies=["ddp", "zero-1", "zero-3", "FULL_SHARD"])
    totals = {e.strategy.label: e.memory.per_gpu.total for e in c.estimates}
    assert c.by_memory == sorted(totals, key=totals.get)
    steps = {e.strategy.label: e.time.step_s for e in c.estimates}
    assert c.by_time == sorted(steps, key=steps.get)
    fitting = [s for s in c.by_time if next(e for e in c.estimates if e.strategy.label == s).memory.fit.fits]
    assert c.fastest_that_fits == fitting[0]
    assert Comparison.model_validate_json(c.model_dump_json()) == c
    out = run("compare", "--model", "llama-3-8b", "--gpus", "64", "--gpu", "h100", "--seq-len", "4096",
              "--strategies", "ddp,zero-3").stdout
    assert "step ms" in out and "fastest that fits:" in out  # every step under a second: one unit, ms


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "m.png"
    r = run("plot", "memory", "--params", "7e9", "--gpus", "8", "--strategies", "ddp,zero-3", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run("plot", "pie", "--params", "7e9", "--out", str(tmp_path / "x.png"))
    assert bad.exit_code == 2 and "accepted: memory, scaling" in bad.stderr


CONFIGS = __import__("pathlib").Path(__file__).resolve().parent / "data" / "configs"


def test_deepspeed_config_sets_the_strategy_and_typed_flags_win():
    ds = str(CONFIGS / "deepspeed" / "hf_ds_config_zero3_bf16.json")
    r = run("estimate", "--model", "llama-2-7b", "--gpus", "8", "--deepspeed", ds, "--json")
    assert r.exit_code == 0, r.output
    e = Estimate.model_validate_json(r.stdout)
    assert e.strategy.name == "zero-3" and e.strategy.offload_optimizer == "cpu" and e.strategy.offload_params == "cpu"
    # said on stderr, stdout stays JSON; its sub_group_size (1e9) is read, the rest named as ignored
    assert "do not change memory and are ignored" in r.stderr and "sub_group_size" not in r.stderr
    assert e.input.framework.sub_group_size == 1_000_000_000
    typed = Estimate.model_validate_json(run("estimate", "--model", "llama-2-7b", "--gpus", "8", "--deepspeed", ds,
                                             "--stage", "2", "--json").stdout)
    assert typed.strategy.name == "zero-2" and typed.strategy.offload_optimizer == "none"


def test_torchtitan_config_sets_the_layout():
    tt = str(CONFIGS / "torchtitan" / "v0.2.2_llama3_70b.toml")
    e = Estimate.model_validate_json(run("estimate", "--torchtitan-config", tt, "--gpus", "64", "--json").stdout)
    assert e.model.name == "llama-3-70b" and e.training.tp == 8 and e.training.dp == 8
    assert e.training.seq_len == 8192 and e.strategy.name == "FULL_SHARD"


def test_a_rejected_config_is_one_line_exit_2():
    bad = str(CONFIGS / "rejected" / "dse_megatron_zero3_release.json")
    r = run("estimate", "--model", "gpt2", "--gpus", "8", "--deepspeed", bad)
    assert r.exit_code == 2 and "zero_optimization.cpu_offload_params: unknown key" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    two = run("estimate", "--model", "gpt2", "--deepspeed", bad, "--torchtitan-config", "x.toml")
    assert two.exit_code == 2 and "cannot be combined" in two.stderr


def test_time_to_train_and_cost_from_tokens_and_price():
    r = memcalc.estimate(model="llama-3-8b", fsdp="FULL_SHARD", gpus=64, gpu="h100", seq_len=8192, tokens="15T",
                         price_per_gpu_hour=2.5)
    t = r.time
    assert t.time_to_train_s == pytest.approx(15e12 / t.tokens_per_s)
    assert t.cost == pytest.approx(2.5 * 64 * t.time_to_train_s / 3600)
    assert r.input.timing.tokens == 15e12
    e = Estimate.model_validate_json(run("estimate", "--model", "llama-3-8b", "--fsdp", "FULL_SHARD", "--gpus", "64",
                                         "--gpu", "h100", "--seq-len", "8192", "--tokens", "15T", "--json").stdout)
    assert e.time.time_to_train_s == pytest.approx(t.time_to_train_s)


def test_a_slower_network_makes_zero3_slower_and_the_cluster_is_named():
    args = dict(model="llama-3-8b", fsdp="FULL_SHARD", gpus=64, gpu="h100", seq_len=2048)
    fast = memcalc.estimate(**args)
    slow = memcalc.estimate(**args, network_gbits_per_gpu=25)
    assert slow.time.step_s > fast.time.step_s and fast.time.cluster == "dgx-h100"
    assert memcalc.estimate(**args, cluster="p5-h100").time.cluster == "p5-h100"


@pytest.mark.parametrize(("args", "message"), [
    (["--tokens", "1T"], "--tokens needs a step time"),
    (["--cluster", "dgx-h100"], "--cluster needs a step time"),
    (["--model", "llama-3-8b", "--seq-len", "2048", "--price-per-gpu-hour", "2"], "needs --tokens"),
    (["--model", "llama-3-8b", "--seq-len", "2048", "--cluster", "dgx-h10"], "did you mean 'dgx-h100'"),
    (["--model", "llama-3-8b", "--seq-len", "2048", "--network-efficiency", "1.5"], "at most 1"),
    (["--model", "llama-3-8b", "--seq-len", "2048", "--intra-node-gbps", "0"], "more than 0"),
])
def test_bad_timing_inputs_are_one_line_exit_2(args, message):
    r = run("estimate", "--params", "7e9", *args) if "--model" not in args else run("estimate", *args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_shell_completion_completes_commands_and_options():
    import os

    # As the installed `memcalc` script runs (click names the completion variable after the program).
    script = [sys.executable, "-c", "import sys; sys.argv[0] = 'memcalc'; from memcalc.cli import main; main()"]
    env = {**os.environ, "_MEMCALC_COMPLETE": "complete_bash", "COMP_WORDS": "memcalc estimate --gp", "COMP_CWORD": "2"}
    p = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert p.stdout.split() == ["--gpus", "--gpus-per-node", "--gpu"]
    env |= {"COMP_WORDS": "memcalc col", "COMP_CWORD": "1"}
    p = subprocess.run(script, env=env, capture_output=True, text=True, check=False)
    assert p.stdout.split() == ["collectives"]
