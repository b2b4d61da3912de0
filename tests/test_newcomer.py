"""What a newcomer meets in the first ten minutes: a verdict to script on, mistakes caught in one line, and defaults
that agree with each other."""

import json

import pytest

from typer.testing import CliRunner

from memcalc.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


# --check: the exit status is the verdict.


def test_check_exits_0_when_it_fits_and_prints_as_usual():
    r = run("estimate", "--params", "1b", "--check")
    assert r.exit_code == 0, r.output
    # 16 bytes a parameter (ZeRO §3.1) x 1e9 = 14.90 GiB + 0.50 GiB CUDA context
    assert "✓ fits: 15.40 GiB of 79.15 GiB usable" in r.stdout


def test_check_exits_1_when_at_risk():
    # 16 x 4.9e9 bytes = 73.02 GiB + 0.50: a margin of 5.63 GiB, within the allocator's variability (paper accounting)
    r = run("estimate", "--params", "4.9b", "--check")
    assert r.exit_code == 1, r.output
    assert "! at risk: 73.52 GiB of 79.15 GiB usable" in r.stdout
    assert r.stderr == ""


def test_check_exits_1_when_out_of_memory_and_still_prints_json():
    r = run("estimate", "--params", "70b", "--check", "--json")
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["memory"]["fit"]["verdict"] == "oom"


def test_without_check_an_out_of_memory_estimate_exits_0():
    assert run("estimate", "--params", "70b").exit_code == 0


def test_check_is_in_the_help():
    r = run("estimate", "--help")
    assert "--check" in r.stdout and "0 when it fits, 1 when at risk or out of memory" in " ".join(r.stdout.split())


# One default GPU for every command.


def test_collectives_and_estimate_default_to_the_same_gpu():
    est = json.loads(run("estimate", "--params", "1b", "--json").stdout)
    col = json.loads(run("collectives", "--size", "1GiB", "--group", "8", "--json").stdout)
    assert est["input"]["gpu"]["key"] == col["gpu"] == "a100-sxm-80gb"
    assert col["cluster"] == "dgx-a100" and col["intra_node_link"].startswith("nvlink")


# torchtitan has FSDP2 alone.

TITAN = ("estimate", "--model", "llama-3-8b", "--seq-len", "4096", "--framework", "torchtitan", "--fsdp", "FULL_SHARD",
         "--gpus", "8")


def test_torchtitan_fsdp_means_fsdp2():
    r = run(*TITAN, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["input"]["framework"]["fsdp_version"] == 2 and d["accounting"] == "realistic"
    # the same estimate as naming FSDP2 outright
    assert d["memory"] == json.loads(run(*TITAN, "--fsdp-version", "2", "--json").stdout)["memory"]


def test_torchtitan_refuses_fsdp1_by_name():
    r = run(*TITAN, "--fsdp-version", "1")
    assert r.exit_code == 2
    assert r.stderr == ("memcalc: error: --fsdp-version 1: --framework torchtitan has no FSDP1 (it wraps with FSDP2); "
                        "accepted: 2, or leave --fsdp-version out\n")


def test_fsdp_version_defaults_stay_1_elsewhere():
    import memcalc

    kw = dict(model="llama-3-8b", seq_len=4096, gpus=8, fsdp="FULL_SHARD")
    assert memcalc.estimate(**kw).input.framework.fsdp_version == 1
    assert memcalc.estimate(framework="hf", **kw).input.framework.fsdp_version == 1
    assert memcalc.estimate(framework="torchtitan", **kw).input.framework.fsdp_version == 2
    # not under FSDP: ZeRO-3 with torchtitan named is not refused for an FSDP version it does not use
    assert memcalc.estimate(framework="torchtitan", model="llama-3-8b", seq_len=4096, gpus=8,
                            stage=3).input.framework.fsdp_version == 1


# Inputs that are surely mistakes.


def test_a_count_without_its_suffix_is_refused_with_a_guess():
    r = run("estimate", "--params", "7")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == ("memcalc: error: --params '7' means 7 parameters, fewer than 1,000,000: did you mean 7B? "
                        "accepted: a count of 1M or more, such as 7B, 7e9 or 350M\n")
    assert "did you mean 1.3B?" in run("estimate", "--params", "1.3").stderr
    assert "did you mean 350B or 350M?" in run("estimate", "--params", "350").stderr
    assert "7,000 parameters, fewer than 1,000,000; accepted" in run("estimate", "--params", "7k").stderr
    assert run("estimate", "--params", "1M").exit_code == 0


def test_the_api_refuses_a_count_below_the_minimum_too():
    import memcalc
    from memcalc.inputs import Model

    for bad in (7, 7.0, "7", 999_999):
        with pytest.raises(memcalc.InputError, match="fewer than 1,000,000"):
            memcalc.estimate(params=bad)
    with pytest.raises(memcalc.InputError, match="did you mean 7B"):
        Model(parameters=7)
    assert memcalc.estimate(params=10**6).model.parameters == 10**6
    # a shape is not bounded: a tiny model's count is derived, not typed
    tiny = memcalc.estimate(layers=2, hidden=64, heads=4, vocab=100)
    assert 0 < tiny.model.parameters < 10**6


@pytest.mark.parametrize("args, line", [
    (["--params", "7b", "--gpus", "1e12"],
     "--gpus '1e12' is not a whole number; accepted: a whole number from 1 to 1,048,576 (64x the largest published "
     "training run)"),
    (["--params", "7b", "-n", "8.0"], "--gpus '8.0' is not a whole number; accepted: a whole number from 1 to 1,048,576"),
    (["--model", "gpt2", "--seq-len", "1024.5"],
     "--seq-len '1024.5' is not a whole number; accepted: a whole number from 1 to 16,777,216"),
    (["--model", "gpt2", "--layers", "1e40"], "--layers '1e40' is not a whole number; accepted: a whole number from 1 "
                                              "to 10,000"),
    (["--params", "7b", "--fsdp", "1", "--fsdp-version", "two"], "--fsdp-version 'two' is not a whole number; "
                                                                 "accepted: 1, 2"),
    (["--params", "7b", "--cuda-context-gib", "nan"], "--cuda-context-gib 'nan' is not a finite number; accepted: a "
                                                      "finite number from 0 to 1,048,576 GiB (1 PiB)"),
])  # fmt: skip
def test_a_value_of_the_wrong_kind_gets_memcalcs_bounded_line(args, line):
    r = run("estimate", *args)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"memcalc: error: {line}") and r.stderr.count("\n") == 1, r.stderr


def test_collectives_options_get_the_same_line():
    r = run("collectives", "--group", "1e9")
    assert r.exit_code == 2
    assert r.stderr == "memcalc: error: --group '1e9' is not a whole number; accepted: a whole number such as 8\n"


def test_bf16_on_a_gpu_without_it_is_refused_naming_what_it_runs():
    r = run("estimate", "--params", "7b", "--gpu", "v100")  # the default precision, DDP's own, named as a default
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == ("memcalc: error: --precision amp-bf16 (the default: a Hugging Face Trainer(bf16=True) or "
                        "accelerate run (torch.autocast over fp32 weights)) computes in bf16, which NVIDIA Tesla "
                        "V100-SXM2-32GB (v100-32gb) does not run (its datasheet has no bf16); accepted on it: fp32, "
                        "fp16-mixed, amp-fp16\n")
    r = run("estimate", "--params", "7b", "--gpu", "v100", "--precision", "bf16-mixed")  # typed: named as typed
    assert r.exit_code == 2 and r.stderr.startswith("memcalc: error: --precision bf16-mixed computes in bf16, which")
    assert run("estimate", "--params", "7b", "--gpu", "v100", "--precision", "fp16-mixed").exit_code == 0


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16", "amp-bf16"])
def test_the_api_refuses_every_bf16_precision_on_a_v100(precision):
    import memcalc

    with pytest.raises(memcalc.InputError, match=r"v100-16gb\) does not run"):
        memcalc.estimate(params=7e9, gpu="v100-16gb", precision=precision)
    ok = memcalc.estimate(params=7e9, gpu="v100-16gb", precision=precision.replace("bf16", "fp16")
                          if precision != "bf16" else "fp32")
    assert ok.input.gpu.key == "v100-16gb"


def test_largest_layer_above_the_model_is_refused():
    ds = ("estimate", "--stage", "3", "--gpus", "8", "--accounting", "deepspeed-estimator")
    r = run(*ds, "--params", "7b", "--largest-layer-params", "8b")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == ("memcalc: error: --largest-layer-params 8,000,000,000 is more than the model's 7,000,000,000 "
                        "parameters; accepted: at most 7,000,000,000 (the largest module is one part of the model)\n")
    assert run(*ds, "--params", "7b", "--largest-layer-params", "7b").exit_code == 0  # a one-module model: the limit


def test_largest_layer_above_a_shapes_count_is_refused_by_the_api():
    import memcalc

    kw = dict(stage=3, gpus=8, accounting="deepspeed-estimator")
    with pytest.raises(memcalc.InputError, match="more than the model's 124,439,808 parameters"):  # GPT-2 small
        memcalc.estimate(model="gpt2", largest_layer_params=2e8, **kw)
    # DeepSpeed's ZeRO-3 estimator: the largest module enters the GPU figure (4 x largest bytes, fp32 gathered)
    small, large = (memcalc.estimate(model="gpt2", largest_layer_params=n, **kw).memory.per_gpu.total
                    for n in (10**7, 10**8))
    assert large - small == 4 * (10**8 - 10**7)


# DeepSpeed's zeros: reduce_bucket_size and the ZeRO-3 knobs accept 0 (runtime/zero/config.py: ge=0).

ZEROS = {"stage": 3, "reduce_bucket_size": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
         "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0, "sub_group_size": 0}


def test_a_deepspeed_file_with_zeros_is_read(tmp_path):
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"zero_optimization": ZEROS, "bf16": {"enabled": True}}))
    r = run("estimate", "--model", "gpt2", "--gpus", "4", "--seq-len", "256", "--deepspeed", str(ds), "--json")
    assert r.exit_code == 0, r.output
    fw = json.loads(r.stdout)["input"]["framework"]
    assert (fw["reduce_bucket_size"], fw["prefetch_bucket_size"], fw["persistence_threshold"], fw["sub_group_size"],
            fw["max_live_parameters"], fw["max_reuse_distance"]) == (0, 0, 0, 0, 0, 0)
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}))
    r = run("estimate", "--model", "gpt2", "--gpus", "4", "--seq-len", "256", "--deepspeed", str(ds), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["input"]["framework"]["reduce_bucket_size"] == 0


@pytest.mark.parametrize("stage", [1, 3])
def test_an_empty_gradient_bucket_is_one_element_less_than_a_bucket_of_one(stage):
    import memcalc

    # no GPT-2 parameter has a single element: under a bucket of 1 (or 0) every gradient is reduced alone, so the two
    # steps differ by the bucket's one bf16 element (2 bytes); 0 is not read as DeepSpeed's default of 5e8
    total = {b: memcalc.estimate(model="gpt2", gpus=4, stage=stage, seq_len=256, reduce_bucket_size=b)
             .memory.per_gpu.total for b in (0, 1, "0", 10**6)}
    assert total[1] - total[0] == 2 and total["0"] == total[0]
    assert total[10**6] - total[0] == 2 * 10**6
    assert run("estimate", "--model", "gpt2", "--gpus", "4", "--stage", str(stage), "--seq-len", "256",
               "--reduce-bucket-size", "0").exit_code == 0


def test_transformers_own_zero3_test_config_is_read():
    from pathlib import Path

    import memcalc
    from memcalc.configs import read_deepspeed

    path = Path(__file__).parent / "data" / "configs" / "deepspeed_zeros" / "hf_ds_config_zero3.json"
    a = read_deepspeed(path, world_size=8, accounting="realistic").arguments  # (the ZeRO-3 knobs: not for the paper's)
    assert (a["stage"], a["reduce_bucket_size"], a["prefetch_bucket_size"], a["persistence_threshold"]) == (3, 0, 0, 0)
    a = read_deepspeed(path, world_size=8).arguments
    assert memcalc.estimate(**a, model="gpt2", seq_len=256).input.framework.reduce_bucket_size == 0


# --micro-batch auto: says when nothing fits; compare takes it too.

SEVENTY = ("--model", "llama-2-70b", "--seq-len", "4096", "--gpus", "8", "--stage", "2", "--micro-batch", "auto")


def test_auto_says_when_no_micro_batch_fits():
    r = run("estimate", *SEVENTY)
    assert r.exit_code == 0, r.output
    assert "micro-batch 1 (auto: none fits)" in r.stdout and "largest that fits" not in r.stdout
    # ZeRO-2 keeps 2Ψ bf16 parameters whole: 2 x 68,976,648,192 bytes = 128.5 GiB alone, beyond 79.15 GiB
    assert "note: --micro-batch auto: no micro-batch fits; micro-batch 1 needs 349.34 GiB of 79.15 GiB usable" in r.stdout
    d = json.loads(run("estimate", *SEVENTY, "--json").stdout)["training"]
    assert (d["micro_batch"], d["micro_batch_auto"], d["micro_batch_none_fits"]) == (1, True, True)
    assert run("estimate", *SEVENTY, "--check").exit_code == 1


def test_auto_that_fits_is_the_largest_and_says_so():
    import memcalc

    kw = dict(model="llama-2-7b", seq_len=4096, gpus=8, stage=3)
    best = memcalc.estimate(micro_batch="auto", **kw)
    b = best.training.micro_batch
    assert best.memory.fit.fits and not best.training.micro_batch_none_fits and b >= 1
    assert not memcalc.estimate(micro_batch=b + 1, **kw).memory.fit.fits
    assert f"micro-batch {b} (largest that fits)" in run("estimate", "--model", "llama-2-7b", "--seq-len", "4096",
                                                         "--gpus", "8", "--stage", "3", "--micro-batch", "auto").stdout


def test_compare_takes_auto_each_row_at_its_own_micro_batch():
    import memcalc

    kw = dict(model="llama-2-7b", seq_len=4096, gpus=8)
    strategies = ["zero-2", "zero-3", "FULL_SHARD", "ddp"]
    cmp = memcalc.compare(strategies=strategies, micro_batch="auto", **kw)
    for s, row in zip(strategies, cmp.estimates):
        alone = memcalc.estimate(strategy=s, micro_batch="auto", **kw)
        assert row.training.micro_batch == alone.training.micro_batch
        assert row.memory.per_gpu.total == alone.memory.per_gpu.total
    assert [r.training.micro_batch_none_fits for r in cmp.estimates] == [False, False, False, True]  # DDP: 120 GiB
    assert len({r.training.micro_batch for r in cmp.estimates}) > 1  # the rows' own, not one for all
    # rows at different micro-batches rank by throughput, not by the length of their steps
    best = max((r for r in cmp.estimates if r.memory.fit.fits), key=lambda r: r.time.tokens_per_s_per_gpu)
    assert cmp.fastest_that_fits == best.strategy.label


def test_compare_auto_on_the_command_line():
    r = run("compare", "--model", "llama-2-7b", "--seq-len", "4096", "--gpus", "8", "--strategies", "zero-3,ddp",
            "--micro-batch", "auto", "--format", "markdown")
    assert r.exit_code == 0, r.output
    # DDP's own precision (amp-bf16) is in the realistic accounting: 16 bytes per parameter, 100 GiB, fit no batch
    assert "| strategy | micro-batch |" in r.stdout and "| DDP | none |" in r.stdout
    assert "note: --micro-batch auto: each row at its own largest micro-batch that fits" in r.stdout
    csv = run("compare", "--model", "llama-2-7b", "--seq-len", "4096", "--gpus", "8", "--strategies", "zero-3,ddp",
              "--micro-batch", "auto", "--format", "csv").stdout.splitlines()
    column = csv[0].split(",").index("micro_batch")
    assert [line.split(",")[column] for line in csv[1:]] == ["2", ""]


@pytest.mark.parametrize("args, line", [
    (["--params", "7b", "--gpus", str(10**23)], "--gpus <a 77-bit integer> is not accepted; accepted: a whole number "
                                                "from 1 to 1,048,576 (64x the largest published training run)\n"),
    (["--model", "gpt2", "--lora-rank", str(10**23)], "--lora-rank <a 77-bit integer> is not accepted; accepted: a "
                                                      "whole number from 1 to 65,536 (LoRA's r; wider than any model's "
                                                      "hidden size)\n"),
    (["--model", "llama-2-7b", "--kv-heads", str(10**26)], "--kv-heads <a 87-bit integer> is out of bounds; accepted: "
                                                           "more than 0 and at most 65,536\n"),
])  # fmt: skip
def test_a_huge_whole_number_names_the_flag_and_its_bounds(args, line):
    r = run("estimate", *args)
    assert r.exit_code == 2 and r.stderr == "memcalc: error: " + line
