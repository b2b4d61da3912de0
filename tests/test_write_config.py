"""--write-config / memcalc.write_config: the frameworks' files for an estimate or a plan, read back by memcalc's own
readers with the flags README.txt lists, give the same peak (byte for byte) and step time."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError

runner = CliRunner()
BASE = dict(model="llama-3-8b", seq_len=4096, gpus=16, gpu="h100")

CASES = {
    "fsdp1-hf": dict(fsdp="FULL_SHARD", framework="hf", precision="amp-bf16", micro_batch=1, grad_accum=2),
    "fsdp2-cp": dict(fsdp="FULL_SHARD", fsdp_version=2, cp=2, framework="hf", precision="amp-bf16", micro_batch=2),
    "fsdp-recompute": dict(fsdp="SHARD_GRAD_OP", recompute="full", micro_batch=2),
    "fsdp-offload": dict(fsdp="FULL_SHARD", offload_params="cpu", recompute="full", micro_batch=2),
    "ddp": dict(ddp=True, gpus=8, recompute="full", precision="amp-bf16"),
    "hsdp": dict(fsdp="HYBRID_SHARD", gpus=8, gpus_per_node=4),
    "zero3-knobs": dict(stage=3, offload_optimizer="cpu", recompute="full", micro_batch=4, grad_accum=2,
                        max_live_parameters=10**9, prefetch_bucket_size=5 * 10**7, accounting="realistic"),
    "zero2-fp16": dict(stage=2, overlap_comm=True, reduce_bucket_size=5 * 10**8, micro_batch=2, precision="fp16-mixed"),
    "zero3-nvme": dict(stage=3, offload_optimizer="nvme", offload_params="nvme", micro_batch=2),
    "titan-3d": dict(model="llama-3-70b", seq_len=8192, gpus=64, fsdp="FULL_SHARD", fsdp_version=2, tp=8, pp=2,
                     framework="torchtitan", recompute="full", grad_accum=8, sequence_parallel=True),
    "titan-interleaved": dict(model="llama-3-70b", seq_len=8192, gpus=64, fsdp="FULL_SHARD", fsdp_version=2, tp=8,
                              pp=4, virtual_stages=2, framework="torchtitan", recompute="op-sac", grad_accum=8,
                              sequence_parallel=True),
    "titan-hsdp-float8": dict(seq_len=8192, fsdp="HYBRID_SHARD", fsdp_version=2, shard_group=8,
                              framework="torchtitan", recompute="every:2", compile=True, float8="tensorwise",
                              float8_all_gather=True),
    "titan-ddp": dict(ddp=True, framework="torchtitan", recompute="full", precision="amp-bf16"),
    "megatron-vp": dict(model="llama-3-70b", gpus=64, stage=1, tp=4, pp=4, virtual_stages=2, framework="megatron",
                        recompute="selective", sequence_parallel=True, grad_accum=16),
    "fsdp-compile-fused": dict(fsdp="FULL_SHARD", compile=True, compile_loss=False, optimizer_impl="fused",
                               accounting="realistic"),
    "zero3-eager-dropout": dict(stage=3, attention="eager", dropout=0.1),
    "zero3-paper": dict(stage=3, accounting="paper"),
    "hsdp-fsdp2-cp": dict(fsdp="HYBRID_SHARD", fsdp_version=2, framework="hf", precision="amp-bf16", cp=2),
    "lora-fsdp": dict(fsdp="FULL_SHARD", lora_rank=16, lora_targets="q,v"),
    "qlora-zero3": dict(stage=3, lora_rank=16, quantize="nf4"),
    "titan-bf16": dict(fsdp="FULL_SHARD", fsdp_version=2, precision="bf16", framework="torchtitan"),
    "titan-pp-zero2": dict(fsdp="SHARD_GRAD_OP", fsdp_version=2, framework="torchtitan", pp=2, grad_accum=4),
    "titan-rowwise": dict(fsdp="FULL_SHARD", fsdp_version=2, framework="torchtitan", float8="rowwise", compile=True,
                          compile_loss=False),
    "titan-405b-rowwise": dict(model="llama-3-405b", seq_len=8192, gpus=256, fsdp="FULL_SHARD", fsdp_version=2, tp=8,
                               framework="torchtitan", recompute="full", float8="rowwise", compile=True,
                               sequence_parallel=True, grad_accum=2),
    "megatron-fp8": dict(stage=1, tp=2, framework="megatron", float8="tensorwise", sequence_parallel=True),
    "megatron-fp16": dict(stage=1, framework="megatron", precision="fp16-mixed", recompute="full"),
    "megatron-cp": dict(model="llama-3-70b", gpus=64, ddp=True, tp=8, pp=2, cp=2, framework="megatron",
                        recompute="full", sequence_parallel=True, grad_accum=4),
}
UNWRITABLE = {  # estimates no framework's files hold as they are
    "titan-fsdp-one-rank": dict(model="llama-3-70b", gpus=8, fsdp="FULL_SHARD", fsdp_version=2, tp=8,
                                offload_params="cpu", framework="torchtitan", recompute="full"),
}
FILES = {"deepspeed": {"ds_config.json", "accelerate_config.yaml", "training_args.json"},
         "accelerate": {"accelerate_config.yaml", "training_args.json"}, "torchtitan": {"torchtitan.toml"},
         "megatron": {"megatron_args.txt"}}  # fmt: skip

TITAN_03 = {"torchtitan_args.txt"}  # beside torchtitan.toml where torchtitan 0.3's registered configs hold the run
WRITES_03 = {"titan-3d", "titan-interleaved", "titan-ddp", "titan-bf16", "titan-pp-zero2", "titan-405b-rowwise"}


def _estimate(case: str) -> memcalc.Estimate:
    return memcalc.estimate(**{**BASE, **(CASES.get(case) or UNWRITABLE[case])})


def _read_back(folder: Path, line: int = 0) -> dict:
    """The README's check command (its ``line``-th), run in the folder."""
    readme = (folder / "README.txt").read_text()
    command = readme.split("Read back by memcalc (the same peak and step time):\n", 1)[1].strip().splitlines()[line]
    args = shlex.split(command)[2:]
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        r = runner.invoke(app, ["estimate", *args, "--json"])
    finally:
        os.chdir(cwd)
    assert r.exit_code == 0, (command, r.output)
    return json.loads(r.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_written_files_read_back_give_the_same_peak_and_step_time(case: str, tmp_path: Path) -> None:
    e = _estimate(case)
    paths = memcalc.write_config(e, directory=tmp_path / "run")
    names = {p.name for p in paths}
    framework = next(f for f, files in FILES.items() if files <= names and len(files) == len(names - TITAN_03) - 2)
    assert names - TITAN_03 == FILES[framework] | {"launch.sh", "README.txt"}
    assert (case in WRITES_03) == ("torchtitan_args.txt" in names)
    d = _read_back(tmp_path / "run")
    assert d["memory"]["per_gpu"]["peak_reserved"] == e.memory.per_gpu.peak_reserved
    assert d["memory"]["per_gpu"]["peak_allocated"] == e.memory.per_gpu.peak_allocated
    assert d["time"]["step_s"] == e.time.step_s
    assert os.access(tmp_path / "run" / "launch.sh", os.X_OK)
    assert subprocess.run(["bash", "-n", str(tmp_path / "run" / "launch.sh")]).returncode == 0  # it parses
    if "torchtitan_args.txt" in names:  # torchtitan 0.3's arguments, read back by the README's second line
        d = _read_back(tmp_path / "run", 1)
        assert d["memory"]["per_gpu"]["peak_reserved"] == e.memory.per_gpu.peak_reserved
        assert d["memory"]["per_gpu"]["peak_allocated"] == e.memory.per_gpu.peak_allocated
        assert d["time"]["step_s"] == e.time.step_s
        # the file's words are all torchrun passes (tyro takes nothing after the activation_checkpoint subcommand)
        assert (tmp_path / "run" / "launch.sh").read_text().endswith(" -m torchtitan.train $(grep -v '^#' "
                                                                      "torchtitan_args.txt)\n")


@pytest.mark.parametrize("framework", ["hf", "deepspeed", "torchtitan", "megatron"])
def test_a_plans_best_is_written_and_read_back_through_the_cli(framework: str, tmp_path: Path) -> None:
    args = ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--global-batch", "32", "--gpus", "16", "--gpu",
            "h100", "--framework", framework, "--top", "1", "--json", "--write-config", str(tmp_path / "out")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    best = memcalc.PlanResult.model_validate_json(r.stdout).plans[0]
    d = _read_back(tmp_path / "out")
    assert d["memory"]["per_gpu"]["peak_reserved"] == best.memory.peak_reserved
    assert d["time"]["step_s"] == best.time.step_s


def test_config_text_matches_the_written_files(tmp_path: Path) -> None:
    e = _estimate("zero3-knobs")
    text = memcalc.config_text(e)
    memcalc.write_config(e, directory=tmp_path)
    assert {n: (tmp_path / n).read_text() for n in text} == text
    ds = json.loads(text["ds_config.json"])
    assert ds["train_batch_size"] == 4 * 2 * 16
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                       "stage3_max_live_parameters": 10**9,
                                       "stage3_prefetch_bucket_size": 5 * 10**7}
    acc = yaml.safe_load(text["accelerate_config.yaml"])
    assert acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 16 and acc["num_machines"] == 2
    assert json.loads(text["training_args.json"])["gradient_checkpointing"] is True
    args = json.loads(memcalc.config_text(_estimate("fsdp-compile-fused"))["training_args.json"])
    assert args["torch_compile"] is True and args["optim"] == "adamw_torch_fused"


def test_the_framework_can_be_chosen_and_other_names_are_refused() -> None:
    e = _estimate("fsdp-recompute")
    assert "accelerate_config.yaml" in memcalc.config_text(e)
    assert "torchtitan.toml" not in memcalc.config_text(e)
    with pytest.raises(InputError, match="torchtitan cannot run this estimate: the strategy SHARD_GRAD_OP under FSDP1"):
        memcalc.config_text(e, framework="torchtitan")
    with pytest.raises(InputError, match="accepted: deepspeed, accelerate"):
        memcalc.config_text(e, framework="jax")


@pytest.mark.parametrize("case, framework, message", [
    ("zero3-nvme", "torchtitan", "torchtitan cannot run this estimate: ZeRO optimizer offload"),
    ("titan-3d", "accelerate", "accelerate cannot run this estimate: --pp 2 \\(accelerate has no pipeline parallelism"),
    ("titan-interleaved", "megatron", "Megatron-LM cannot run this estimate: the strategy FULL_SHARD"),
    ("megatron-vp", "torchtitan", "torchtitan cannot run this estimate: the strategy zero-1"),
    ("zero2-fp16", "accelerate", "accelerate's FSDP or DDP cannot run this estimate: the strategy zero-2"),
    ("fsdp-recompute", "deepspeed", "DeepSpeed cannot run this estimate: the strategy SHARD_GRAD_OP"),
    ("lora-fsdp", "torchtitan", "torchtitan cannot run this estimate: LoRA adapters"),
    ("titan-fsdp-one-rank", "torchtitan", "torchtitan cannot run this estimate: FULL_SHARD over one data-parallel rank"),
    ("zero3-eager-dropout", "megatron", "Megatron-LM cannot run this estimate: the strategy zero-3"),
])  # fmt: skip
def test_what_a_framework_cannot_express_is_one_line_and_nothing_is_written(case: str, framework: str, message: str,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    with pytest.raises(InputError, match=message) as info:
        memcalc.write_config(_estimate(case), directory=tmp_path / "run", framework=framework)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_what_torchtitans_own_code_decides_is_refused_when_the_estimate_differs() -> None:
    e = memcalc.estimate(**{**BASE, **CASES["titan-bf16"], "attention": "eager"})
    with pytest.raises(InputError, match=r"torchtitan.toml read back gives a peak of .* \(attention: eager -> sdpa\)"):
        memcalc.config_text(e)


def test_a_setting_the_files_cannot_hold_is_found_by_reading_them_back() -> None:
    # accelerate's DDP runs under autocast over fp32 weights; bf16-mixed (fp32 masters beside bf16 weights) is not it
    e = memcalc.estimate(**{**BASE, "ddp": True, "gpus": 8, "precision": "bf16-mixed"})
    with pytest.raises(InputError, match=r"accelerate's DDP cannot run this estimate: precision bf16-mixed .*; give "
                                         r"--precision amp-bf16"):
        memcalc.config_text(e)
    # what no writer knows is found by reading back: accelerate's FSDP2 units are its own (framework hf)
    e = memcalc.estimate(**{**BASE, "fsdp": "_HYBRID_SHARD_ZERO2", "fsdp_version": 2, "shard_group": 4})
    with pytest.raises(InputError, match=r"accelerate_config.yaml read back gives an allocated peak of [\d,]+ bytes "
                                         r"instead of [\d,]+ bytes \(framework: None -> hf\)"):
        memcalc.config_text(e)


def test_cli_refuses_an_existing_file_unless_forced(tmp_path: Path) -> None:
    args = ["estimate", "--model", "llama-3-8b", "--seq-len", "4096", "--gpus", "16", "--gpu", "h100", "--stage", "3",
            "--write-config", str(tmp_path)]
    (tmp_path / "ds_config.json").write_text("{}")
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and "ds_config.json exists; pass --force" in r.stderr
    assert (tmp_path / "ds_config.json").read_text() == "{}" and not (tmp_path / "README.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds_config.json"]
    r = runner.invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    assert "wrote ds_config.json, accelerate_config.yaml, training_args.json, launch.sh, README.txt" in r.stderr


def test_cli_refuses_an_unwritable_directory(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")  # a directory cannot be made under a file, whoever runs the test
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--seq-len", "4096", "--gpus", "16", "--stage", "3",
                            "--write-config", str(tmp_path / "a-file" / "run")])
    assert r.exit_code == 2 and "cannot write there" in r.stderr and r.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_file_in_the_way_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        memcalc.write_config(_estimate("ddp"), directory=tmp_path / "run")
    assert (tmp_path / "run").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_cli_refuses_a_framework_that_cannot_run_the_plan(tmp_path: Path) -> None:
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--seq-len", "4096", "--gpus", "16", "--fsdp",
                            "FULL_SHARD", "--offload-optimizer", "cpu", "--write-config", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_an_estimate_without_a_sequence_has_no_batch_to_write() -> None:
    with pytest.raises(InputError, match="no --seq-len"):
        memcalc.config_text(memcalc.estimate(params=7e9, stage=3, gpus=8))


def test_accelerate_loads_the_written_yaml(tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    for i, case in enumerate(("fsdp1-hf", "fsdp2-cp", "zero3-knobs", "ddp")):
        memcalc.write_config(_estimate(case), directory=tmp_path / str(i))
        cfg = config_args.load_config_from_file(str(tmp_path / str(i) / "accelerate_config.yaml"))
        assert cfg.num_processes == CASES[case].get("gpus", 16)
        assert str(cfg.distributed_type).split(".")[-1] in ("FSDP", "DEEPSPEED", "MULTI_GPU")


def test_no_key_is_written_that_the_framework_does_not_have(tmp_path: Path) -> None:
    from memcalc.configs import read_accelerate, read_deepspeed, read_torchtitan

    for case in ("zero3-knobs", "zero2-fp16", "fsdp1-hf", "fsdp2-cp", "ddp"):
        folder = tmp_path / case
        memcalc.write_config(_estimate(case), directory=folder)
        if (folder / "ds_config.json").exists():  # DeepSpeed passes over unknown top-level keys: none may be there
            r = read_deepspeed(folder / "ds_config.json", seq_len=4096)
            assert not [x for x in r.ignored if "not a DeepSpeed key" in x], r.ignored
        r = read_accelerate(folder / "accelerate_config.yaml", cwd=folder)  # refuses unknown top-level keys
        assert not [x for x in r.ignored if "accelerate passes it to nothing" in x], r.ignored
    for case in ("titan-3d", "titan-interleaved", "titan-hsdp-float8", "titan-ddp"):
        memcalc.write_config(_estimate(case), directory=tmp_path / case)
        r = read_torchtitan(tmp_path / case / "torchtitan.toml", world_size=_estimate(case).input.cluster.gpus)
        assert "keys of torchtitan v0.2.0, v0.2.1, v0.2.2" in r.notes  # unknown keys are refused by the reader


def test_accelerate_launch_has_every_plugin_key_written(tmp_path: Path) -> None:
    launch = pytest.importorskip("accelerate.commands.launch")
    dests = {a.dest for a in launch.launch_command_parser()._actions}
    for case in ("fsdp1-hf", "fsdp2-cp", "fsdp-offload", "zero3-knobs"):
        memcalc.write_config(_estimate(case), directory=tmp_path / case)
        data = yaml.safe_load((tmp_path / case / "accelerate_config.yaml").read_text())
        for section in ("fsdp_config", "deepspeed_config"):
            assert set(data.get(section, {})) <= dests, set(data.get(section, {})) - dests


def test_training_args_are_fields_of_the_trainers_arguments() -> None:
    transformers = pytest.importorskip("transformers")
    import dataclasses

    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    optimizers = {o.value for o in transformers.training_args.OptimizerNames}
    for case in ("zero3-knobs", "fsdp1-hf", "ddp", "fsdp-compile-fused"):
        data = json.loads(memcalc.config_text(_estimate(case))["training_args.json"])
        assert set(data) <= fields, set(data) - fields  # HfArgumentParser refuses keys it does not have
        assert data.get("optim", "adamw_torch") in optimizers


def test_a_plan_with_no_plan_that_fits_has_nothing_to_write(tmp_path: Path) -> None:
    r = memcalc.plan(model="llama-3-8b", seq_len=4096, global_batch=16, gpus=8, gpu="h100", framework="megatron", top=1)
    with pytest.raises(InputError, match="no plan fits, so there are no files to write"):
        memcalc.write_config(r.model_copy(update={"plans": []}), directory=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(InputError, match="accepted: an Estimate, a PlanResult or a PlannedRun"):
        memcalc.config_text({"model": "llama-3-8b"})
    assert memcalc.config_text(r.plans[0]) == memcalc.config_text(r)  # a PlannedRun: written as it is


def test_torchtitans_config_manager_parses_the_written_toml(tmp_path: Path) -> None:
    # torchtitan 0.2.2's own parser (its config/ imports MoE kernels that need triton: skipped where it cannot import)
    config = pytest.importorskip("torchtitan.config")
    for case in ("titan-interleaved", "titan-hsdp-float8"):
        memcalc.write_config(_estimate(case), directory=tmp_path / case)
        cfg = config.ConfigManager().parse_args(["--job.config_file", str(tmp_path / case / "torchtitan.toml")])
        e = _estimate(case)
        par = e.input.parallelism
        assert (cfg.parallelism.tensor_parallel_degree, cfg.parallelism.pipeline_parallel_degree) == (par.tp, par.pp)
        assert cfg.training.seq_len == e.input.workload.seq_len


@pytest.mark.parametrize(("case", "why"), [
    ("titan-hsdp-float8", "its llama3_8b has no float8, fixed by the registered config (this run: float8 tensorwise)"),
    ("titan-rowwise", "its llama3_8b has no float8, fixed by the registered config (this run: float8 rowwise)"),
])  # fmt: skip
def test_torchtitan_03_arguments_are_left_out_where_its_registered_configs_cannot_hold_the_run(case: str,
                                                                                                why: str) -> None:
    files = memcalc.config_text(_estimate(case))
    assert "torchtitan_args.txt" not in files and "--job.config_file torchtitan.toml" in files["launch.sh"]
    assert f"torchtitan_args.txt (torchtitan 0.3) is not written: {why}" in files["README.txt"]
    e = memcalc.estimate(**{**BASE, "fsdp": "FULL_SHARD", "fsdp_version": 2, "framework": "torchtitan",
                            "recompute": "every:2"})  # fmt: skip
    assert "its selective AC is per-op only (this run: recompute every:2)" in memcalc.config_text(e)["README.txt"]


def _args(tmp_path: Path, *words: str, name: str = "args.txt") -> Path:
    path = tmp_path / name
    path.write_text("# a comment\n" + "\n".join(words) + "\n")
    return path


def test_torchtitan_03_arguments_read_over_the_registered_configs_values(tmp_path: Path) -> None:
    from memcalc.configs import read_torchtitan

    r = read_torchtitan(_args(tmp_path, "--module llama3", "--config llama3_70b",
                              "--parallelism.data_parallel_shard_degree 4"))  # fmt: skip
    a = r.arguments
    assert (a["model"], a["tp"], a["gpus"], a["recompute"], a["seq_len"], a["micro_batch"]) == \
        ("llama-3-70b", 8, 32, "full", 8192, 8)  # llama3_70b's own: tp 8, full AC, local batch 8, seq_len 8192
    assert any("CUDA graphs capture forward + backward" in x for x in r.unmodelled)
    # told apart from a TOML by content, whatever the file's name; "-" and "_" alike; --key=value
    r = read_torchtitan(_args(tmp_path, "--module=llama3 --config=llama3_8b --training.local-batch-size=2",
                              "--parallelism.data_parallel_shard_degree 8 --training.disable_cuda_graphs",
                              "--parallelism.tensor_parallel_degree 2 --parallelism.no_enable_sequence_parallel",
                              name="job.toml"))  # fmt: skip
    a = r.arguments
    assert (a["model"], a["micro_batch"], a["recompute"], a["sequence_parallel"]) == ("llama-3-8b", 2, "op-sac", False)
    assert not r.unmodelled
    r = read_torchtitan(_args(tmp_path, "--module llama3 --config llama3_405b --parallelism.data_parallel_shard_degree 2"))
    assert (r.arguments["float8"], r.arguments["compile"]) == ("rowwise", True)
    assert any("async TP" in x for x in r.unmodelled)


@pytest.mark.parametrize(("words", "message"), [
    (["--module llama3 --config llama3_8b --parallelism.bogus 2"],
     "args.txt: parallelism.bogus: unknown option"),
    (["--module llama3 --config llama3_8b activation_checkpoint:full --training.seq_len 4096"],
     "--training.seq_len: follows the activation_checkpoint subcommand"),
    (["--module llama3 --config llama3_8b --compile.enable true"], "true: is not an option"),
    (["--module llama3 --config llama3_8b --compile.enable=true"], "compile.enable: is a switch and takes no value"),
    (["--module llama3 --config llama3_1b"], "--config: 'llama3_1b' is not one memcalc knows; accepted: llama3_8b"),
    (["--config llama3_8b"], "--module: is missing"),
    (["--module llama3 --config llama3_8b --training.seq_len"], "training.seq_len: needs a value"),
    (["--module llama3 --config llama3_8b activation_checkpoint:sometimes"], "'sometimes' is not accepted"),
    (["--module llama3 --config llama3_405b --compile.no_enable"], "off with async TP on (llama3_405b's)"),
    (["--module llama3 --config llama3_8b --training.seq_len 1 --training.seq_len 2"], "given twice"),
    (["--module llama3 --config llama3_8b --training.seq_len 4k"], "training.seq_len: '4k' is not accepted"),
    (["--module llama3 --config llama3_8b --parallelism.pipeline_parallel_degree 2"],
     "above 1 with CUDA graphs on: torchtitan refuses it"),
])  # fmt: skip
def test_torchtitan_03_arguments_it_would_refuse_are_one_line(tmp_path: Path, words: list[str], message: str) -> None:
    from memcalc.configs import read_torchtitan

    with pytest.raises(InputError) as info:
        read_torchtitan(_args(tmp_path, *words), world_size=8)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_megatron_args_carry_the_model_shape_megatron_builds():
    """Llama-like families get Megatron-LM's network-size options from the architecture; a family Megatron-Core's
    GPT layer does not build as it is (GPT-2: LayerNorm, learned positions, GELU) keeps the FILL_IN lines."""
    r = memcalc.estimate(model="llama-3-70b", seq_len=8192, gpus=64, gpu="h100", stage=1, tp=8, pp=2,
                         framework="megatron", precision="bf16-mixed", sequence_parallel=True, grad_accum=4)
    text = memcalc.config_text(r, framework="megatron")
    words = text["megatron_args.txt"].split()
    got = {words[i]: words[i + 1] for i in range(len(words) - 1) if not words[i + 1].startswith("--")}
    assert {k: got[k] for k in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                                "--num-query-groups", "--max-position-embeddings")} == {
        "--num-layers": "80", "--hidden-size": "8192", "--ffn-hidden-size": "28672", "--num-attention-heads": "64",
        "--num-query-groups": "8", "--max-position-embeddings": "8192"}
    assert {"--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
            "--disable-bias-linear"} <= set(words)
    assert "--add-qkv-bias" not in words and "--num-experts" not in words
    assert "FILL_IN --hidden-size" not in text["launch.sh"]
    # the step time overlaps the TP collectives as Transformer Engine does: the file turns that overlap on
    assert "--sequence-parallel\n--tp-comm-overlap\n" in text["megatron_args.txt"]
    moe = memcalc.config_text(memcalc.estimate(model="mixtral-8x7b", seq_len=4096, gpus=64, gpu="h100", tp=2, pp=4,
                                               ep=8, framework="megatron", stage=1, precision="bf16-mixed",
                                               grad_accum=8, recompute="full"), framework="megatron")
    assert "--num-experts 8\n--moe-router-topk 2\n" in moe["megatron_args.txt"]
    assert "--tp-comm-overlap" not in moe["megatron_args.txt"]  # no sequence parallelism: Megatron refuses it
    gpt2 = memcalc.config_text(memcalc.estimate(model="gpt2", seq_len=1024, gpus=8, gpu="h100", stage=1,
                                                framework="megatron", precision="bf16-mixed"), framework="megatron")
    assert "--num-layers" not in gpt2["megatron_args.txt"]
    assert "--num-layers FILL_IN --hidden-size FILL_IN" in gpt2["launch.sh"]
