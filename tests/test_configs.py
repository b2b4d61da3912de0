"""Reading DeepSpeed JSON, accelerate YAML and torchtitan TOML into estimate arguments.

The sample files are published configs (tests/data/configs/README.md names each source).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import memcalc
from memcalc.configs import deepspeed_keys as K
from memcalc.configs import reading
from memcalc.configs import merge_arguments, read_accelerate, read_deepspeed, read_torchtitan
from memcalc.errors import InputError

DATA = Path(__file__).parent / "data" / "configs"
DS_FILES = sorted((DATA / "deepspeed").glob("*.json")) + [DATA / "deepspeed_config_templates" / "zero_stage1_config.json"]
ACC_FILES = sorted((DATA / "accelerate").glob("*.yaml"))
TT_FILES = sorted((DATA / "torchtitan").glob("*.toml"))
REJECTED = sorted((DATA / "rejected").glob("*.json"))
# A tiny shape for configs that name no model (8 heads so that tp 8 divides them).
TINY = dict(layers=2, hidden=256, heads=8, kv_heads=8, vocab=512)


def _model_args(arguments: dict) -> dict:
    return {} if "model" in arguments else dict(TINY)


def _ds_config():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


def _deepspeed_accepts(data: dict) -> None:
    """DeepSpeed's own parser on the file, its batch keys reduced to one rank (it runs here without dist)."""
    DeepSpeedConfig = _ds_config()
    probe = {k: v for k, v in data.items() if k not in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                          "gradient_accumulation_steps")}  # fmt: skip
    probe.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    DeepSpeedConfig(probe)


# ---------------------------------------------------------------------------------------------
# Every published sample reads, and its arguments run through memcalc.estimate.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DS_FILES, ids=lambda p: p.name)
def test_deepspeed_samples_read_and_estimate(path: Path) -> None:
    r = read_deepspeed(path, world_size=8, seq_len=512, hidden=256)
    # every sample gives 8 per GPU, or "auto" (the Trainer's default per_device_train_batch_size, 8)
    assert r.framework == "deepspeed" and r.arguments["gpus"] == 8 and r.arguments["micro_batch"] == 8
    est = memcalc.estimate(**r.arguments, **_model_args(r.arguments))
    assert est.memory.per_gpu.total > 0


@pytest.mark.parametrize("path", DS_FILES, ids=lambda p: p.name)
def test_deepspeed_itself_accepts_what_the_reader_accepts(path: Path) -> None:
    _deepspeed_accepts(json.loads(path.read_text()))


@pytest.mark.parametrize("path", REJECTED, ids=lambda p: p.name)
def test_published_configs_deepspeed_refuses_are_refused(path: Path) -> None:
    DeepSpeedConfig = _ds_config()  # the bf16 file is refused where the installed DeepSpeed refuses it
    with pytest.raises(InputError, match=r"zero_optimization\.cpu_offload_params|bf16\.loss_scale|"
                                         r"compile\.disable|sequence_parallel: unknown key"):
        read_deepspeed(path, world_size=8)
    from pydantic import ValidationError

    with pytest.raises(ValidationError):  # DeepSpeed's own pydantic section models refuse the same key
        DeepSpeedConfig(json.loads(path.read_text()))


@pytest.mark.parametrize("release", [None, (0, 14), (0, 16)])
def test_bf16_with_fp16_loss_scaling_keys_reads_where_deepspeed_passes_over_them(monkeypatch, release) -> None:
    """DeepSpeedExamples' cifar config copies fp16's loss-scaling keys into its bf16 section. DeepSpeed before 0.17
    read only bf16.enabled; without DeepSpeed installed, or with such a release, the file reads as bf16, the keys
    ignored and named in a note."""
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    r = read_deepspeed(DATA / "rejected" / "dse_cifar_ds_config.json", world_size=8)
    assert r.arguments["precision"] == "bf16-mixed"
    legacy = [x for x in r.ignored if x.startswith("bf16.") and "before 0.17" in x]
    assert sorted(x.split(":")[0] for x in legacy) == ["bf16.hysteresis", "bf16.initial_scale_power",
                                                       "bf16.loss_scale", "bf16.loss_scale_window",
                                                       "bf16.min_loss_scale"]  # fmt: skip
    assert any(n.startswith("bf16.loss_scale, ") and "0.17 and later refuse" in n for n in r.notes)


@pytest.mark.parametrize("release", [(0, 17), (0, 19), (1, 0)])
def test_bf16_with_fp16_loss_scaling_keys_refused_where_the_installed_deepspeed_refuses_them(monkeypatch,
                                                                                            release) -> None:
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    with pytest.raises(InputError, match=rf"bf16\.loss_scale: .*installed DeepSpeed {release[0]}\.{release[1]} "
                                         r"refuses"):  # fmt: skip
        read_deepspeed(DATA / "rejected" / "dse_cifar_ds_config.json", world_size=8)
    # a misspelt bf16 key is refused whatever the release
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: None)
    with pytest.raises(InputError, match=r"bf16\.enabeld: unknown key \(did you mean 'enabled'\?\)"):
        read_deepspeed({"bf16": {"enabeld": True}}, world_size=8)


def test_auto_train_batch_without_the_other_batch_keys_reads_as_the_trainer_fills_it() -> None:
    """``train_batch_size: auto`` with the micro-batch or the accumulation left out (axolotl's ds_config.json, a bare
    ZeRO-2 file): the Trainer's world x per-device batch x accumulation, its defaults where nothing is given; this
    used to end in a traceback."""
    r = read_deepspeed({"train_batch_size": "auto", "zero_optimization": {"stage": 2}}, world_size=8, seq_len=512)
    assert (r.arguments["micro_batch"], r.arguments["grad_accum"], r.arguments["gpus"]) == (8, 1, 8)
    assert any("Trainer's default per-device batch 8" in n for n in r.notes)
    r = read_deepspeed({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}, world_size=8,
                       micro_batch=2, grad_accum=4, seq_len=512)  # fmt: skip
    assert (r.arguments["micro_batch"], r.arguments["grad_accum"]) == (2, 4)
    with pytest.raises(InputError, match=r"train_batch_size: 2 is below the data-parallel size 8 .*accepted: a "
                                         r"multiple of 8 or \"auto\""):  # fmt: skip
        read_deepspeed({"train_batch_size": 2, "zero_optimization": {"stage": 2}}, world_size=8, seq_len=512)


def test_installed_release_reads_the_metadata() -> None:
    from memcalc.configs.reading import installed_release

    assert installed_release("no-such-distribution-memcalc") is None
    major, minor = installed_release("pydantic")
    assert major == 2 and minor >= 0
    from memcalc.configs.reading import installed_refuses

    assert installed_refuses("pydantic", (2, 0)) == f"{major}.{minor}"
    assert installed_refuses("pydantic", (99, 0)) is None and installed_refuses("no-such-distribution-memcalc", (0, 1)) is None
    assert installed_refuses("pydantic", (2, 0, 0)).count(".") == 2  # three parts where the boundary has three


@pytest.mark.parametrize("path", ACC_FILES, ids=lambda p: p.name)
def test_accelerate_samples_read_and_estimate(path: Path) -> None:
    # fp8.yaml is distributed_type NO: one process; trl's context-parallel file names a mesh of 2 (cp 2)
    world = {"fp8.yaml": 1, "trl_context_parallel_2gpu.yaml": 2}.get(path.name, 8)
    r = read_accelerate(path, cwd=DATA / "accelerate", world_size=world, micro_batch=1, seq_len=512)
    assert r.framework == "accelerate" and r.arguments["gpus"] == world
    est = memcalc.estimate(**r.arguments, **_model_args(r.arguments))
    assert est.memory.per_gpu.total > 0


def _yaml(folder: Path, data: dict) -> Path:
    path = folder / "config.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def test_accelerate_older_prefetch_key_is_read_as_current_accelerate_runs_it(tmp_path: Path) -> None:
    """transformers' Trainer docs give an FSDP config with fsdp_backward_prefetch_policy, which accelerate read up to
    0.26 and 0.27 stopped reading: FSDP1 then runs without backward prefetch, counted so, and a note says how to
    keep the prefetch. The numeric sharding strategy (1) is FULL_SHARD."""
    path = DATA / "accelerate" / "hf_trainer_docs_fsdp.yaml"
    r = read_accelerate(path, micro_batch=1, seq_len=512)
    assert r.arguments["fsdp"] == "FULL_SHARD" and r.arguments["gpus"] == 2
    assert r.arguments["backward_prefetch"] == "none"
    assert any(x.startswith("fsdp_config.fsdp_backward_prefetch_policy: ") and "0.27" in x for x in r.ignored)
    assert any("rename it fsdp_backward_prefetch" in n for n in r.notes)
    # with the current name as well, the current name decides
    data = {"distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "bf16",
            "fsdp_config": {"fsdp_backward_prefetch_policy": "BACKWARD_PRE", "fsdp_backward_prefetch": "BACKWARD_POST"}}
    both = read_accelerate(_yaml(tmp_path, data), micro_batch=1, seq_len=512)
    assert both.arguments["backward_prefetch"] == "post"
    bad = {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {"fsdp_backward_prefetch_policy": "EARLY"}}
    with pytest.raises(InputError, match=r"fsdp_config\.fsdp_backward_prefetch_policy: 'EARLY' is not accepted; "
                                         r"accepted: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH"):  # fmt: skip
        read_accelerate(_yaml(tmp_path, bad), micro_batch=1, seq_len=512)
    # the older top-level dynamo_backend key is read, not reported as dynamo_config
    old = read_accelerate(_yaml(tmp_path, {"distributed_type": "NO", "dynamo_backend": "NO"}), micro_batch=1, seq_len=512)
    assert any(x.startswith("dynamo_backend: torch.compile off") for x in old.ignored)


# What ``accelerate config`` wrote from 0.19 to 1.12 for a multi-GPU machine (its IPEX question answered no).
IPEX_FILE = {"compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_GPU",
             "downcast_bf16": "no", "gpu_ids": "all", "ipex_config": {"ipex": False}, "machine_rank": 0,
             "main_training_function": "main", "mixed_precision": "bf16", "num_machines": 1, "num_processes": 4,
             "rdzv_backend": "static", "same_network": True, "tpu_env": [], "tpu_use_cluster": False,
             "tpu_use_sudo": False, "use_cpu": False}  # fmt: skip


@pytest.mark.parametrize("release", [None, (0, 19), (1, 12)])
def test_accelerate_ipex_config_reads_where_accelerate_accepts_it(monkeypatch, tmp_path: Path, release) -> None:
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    r = read_accelerate(_yaml(tmp_path, IPEX_FILE), micro_batch=1, seq_len=512)
    assert r.arguments["gpus"] == 4 and r.arguments["precision"] == "amp-bf16"
    assert any(x.startswith("ipex_config: Intel's extension") for x in r.ignored)
    on = read_accelerate(_yaml(tmp_path, IPEX_FILE | {"ipex_config": {"ipex": True}}), micro_batch=1, seq_len=512)
    assert any(n.startswith("ipex_config.ipex: true optimises CPU training") for n in on.notes)


@pytest.mark.parametrize("release", [(1, 13), (1, 15), (2, 0)])
def test_accelerate_ipex_config_refused_where_the_installed_accelerate_refuses_it(monkeypatch, tmp_path: Path,
                                                                                  release) -> None:  # fmt: skip
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    with pytest.raises(InputError, match=rf"ipex_config: the installed accelerate {release[0]}\.{release[1]} refuses "
                                         r"this key \(removed in 1\.13"):  # fmt: skip
        read_accelerate(_yaml(tmp_path, IPEX_FILE), micro_batch=1, seq_len=512)


def test_accelerate_ipex_config_as_the_installed_accelerate_reads_it(tmp_path: Path) -> None:
    """Whatever accelerate is installed, memcalc accepts the file exactly when accelerate's own config class does."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = _yaml(tmp_path, IPEX_FILE)
    try:
        config_args.ClusterConfig.from_yaml_file(path)
        accepted = True
    except ValueError:
        accepted = False
    if accepted:
        read_accelerate(path, micro_batch=1, seq_len=512)
    else:
        with pytest.raises(InputError, match=r"ipex_config: the installed accelerate"):
            read_accelerate(path, micro_batch=1, seq_len=512)


def test_accelerate_no_with_several_processes_is_multi_gpu() -> None:
    """trl's single_gpu.yaml says distributed_type NO with num_processes 8: accelerate launch turns multi-GPU
    training on when the machine has more than one GPU (commands/launch.py), so it runs DDP over 8 processes."""
    r = read_accelerate(DATA / "accelerate" / "trl_single_gpu.yaml", micro_batch=1, seq_len=512)
    assert r.arguments["gpus"] == 8 and r.arguments["ddp"] is True and r.arguments["precision"] == "amp-bf16"
    assert any("multi-GPU training" in n and "DDP over 8 GPUs" in n for n in r.notes)
    one = read_accelerate(DATA / "accelerate" / "trl_single_gpu.yaml", world_size=1, micro_batch=1, seq_len=512)
    assert one.arguments["gpus"] == 1 and not any("multi-GPU" in n for n in one.notes)


@pytest.mark.parametrize("path", TT_FILES, ids=lambda p: p.name)
def test_torchtitan_samples_read_and_estimate(path: Path) -> None:
    r = read_torchtitan(path, world_size=64)
    assert r.framework == "torchtitan" and r.arguments["gpus"] == 64
    gpu = {"gpu": "h100"} if r.arguments.get("float8", "none") != "none" else {}  # torchao's fp8 needs fp8 cores
    est = memcalc.estimate(**r.arguments, **_model_args(r.arguments), **gpu)
    assert est.memory.per_gpu.total > 0


def test_torchtitan_custom_config_module_keys_of_other_releases_are_ignored() -> None:
    """v0.2.1's llama3_ft debug config sets fault_tolerance.sync_steps, a v0.1.0 JobConfig key that v0.2's
    torchtitan.components.ft.config (its job.custom_config_module) defines again: read, not a mix of releases."""
    r = read_torchtitan(DATA / "torchtitan" / "v0.2.1_llama3_ft_debug_model.toml", world_size=8)
    why = next(x for x in r.ignored if x.startswith("fault_tolerance.sync_steps: "))
    assert "torchtitan.components.ft.config" in why and r.arguments["gpus"] == 8


def test_torchtitan_presets_named_exist() -> None:
    from memcalc.configs.torchtitan import PRESETS
    from memcalc.inputs.presets import load_model

    for (_, flavor), preset in PRESETS.items():
        assert load_model(preset).name is not None, flavor


# ---------------------------------------------------------------------------------------------
# Values, argument by argument.
# ---------------------------------------------------------------------------------------------


def test_hf_zero2_auto_filled_from_the_trainer() -> None:
    # transformers tests/deepspeed/ds_config_zero2.json: every batch key "auto"; --bf16; 16 GPUs.
    r = read_deepspeed(DATA / "deepspeed" / "hf_ds_config_zero2.json", world_size=16, micro_batch=4, grad_accum=2,
                       bf16=True, seq_len=2048)  # fmt: skip
    assert r.arguments == {"gpus": 16, "grad_accum": 2, "micro_batch": 4, "seq_len": 2048, "precision": "bf16-mixed",
                           "optimizer": "adamw", "stage": 2, "offload_optimizer": "cpu",
                           "reduce_bucket_size": 200_000_000, "overlap_comm": True}  # fmt: skip
    assert "zero_optimization.offload_optimizer.device" in r.read
    assert {"zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients"} <= set(r.read)
    assert "zero_optimization.reduce_bucket_size" in r.read  # the gradient bucket the realistic accounting holds
    assert any(i.startswith("scheduler:") for i in r.ignored)


def test_hf_zero3_auto_buckets_from_hidden_size() -> None:
    # transformers integrations/deepspeed.py: reduce_bucket_size h², prefetch int(0.9 h²), persistence 10 h.
    r = read_deepspeed(DATA / "deepspeed" / "accelerate_zero_stage3_config.json", world_size=8, hidden=4096,
                       accounting="implementation")  # fmt: skip
    a = r.arguments
    assert a["stage"] == 3 and a["precision"] == "fp16-mixed" and a["accounting"] == "implementation"
    assert a["prefetch_bucket_size"] == 15_099_494 == int(0.9 * 4096 * 4096)
    assert a["persistence_threshold"] == 40_960
    assert a["max_live_parameters"] == 1_000_000_000 and a["max_reuse_distance"] == 1_000_000_000
    assert a["reduce_bucket_size"] == 16_777_216  # 4096²: ZeRO-3's gradient bucket, held all step
    est = memcalc.estimate(**a, layers=2, hidden=256, heads=8, vocab=512)
    assert est.memory.per_gpu.total > 0


def test_alpaca_zero3_offload_and_knobs_outside_implementation() -> None:
    r = read_deepspeed(DATA / "deepspeed" / "dse_alpaca_lora_zero3.json", world_size=4)
    assert r.arguments == {"gpus": 4, "grad_accum": 1, "precision": "fp16-mixed", "optimizer": "adamw", "stage": 3,
                           "offload_optimizer": "cpu", "offload_params": "cpu",
                           "reduce_bucket_size": 10_000_000}  # fmt: skip
    assert "zero_optimization.stage3_max_live_parameters" in r.read
    assert any("accounting 'realistic', 'implementation' or 'auto'" in n for n in r.notes)


def test_zero3_knobs_reach_the_default_accounting() -> None:
    # estimate's default accounting is auto: the file's coordinator settings count where the answer is realistic
    # (axolotl's zero3_bf16.json sets stage3_max_live_parameters and stage3_max_reuse_distance to 0)
    ds = {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0},
          "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}  # fmt: skip
    kw = dict(model="llama-3-8b", gpu="h100")
    auto = read_deepspeed(ds, world_size=8, hidden=4096, accounting="auto", seq_len=2048).arguments
    assert auto["max_live_parameters"] == 0 == auto["max_reuse_distance"] and auto["accounting"] == "auto"
    told = read_deepspeed(ds, world_size=8, hidden=4096, accounting="realistic", seq_len=2048).arguments
    got, want = memcalc.estimate(**auto, **kw), memcalc.estimate(**told, **kw)
    assert got.accounting == "realistic" and got.memory.per_gpu.total == want.memory.per_gpu.total
    defaults = read_deepspeed(ds, world_size=8, seq_len=2048).arguments  # paper: the settings left out
    assert got.memory.per_gpu.total < memcalc.estimate(**defaults, accounting="auto", **kw).memory.per_gpu.total
    # where auto answers with the paper's accounting (no shape) the settings are kept and said to be unused
    bare = {k: v for k, v in auto.items() if k not in ("seq_len", "micro_batch")}
    paper = memcalc.estimate(params=8e9, gpu="h100", **bare)
    assert paper.accounting == "paper" and any("coordinator settings given" in n for n in paper.notes)


def test_zero3_parameter_offload_alone_is_answered_realistically() -> None:
    # DeepSpeed runs offload_param without offload_optimizer (axolotl's zero3_bf16_cpuoffload_params.json): the bf16
    # partitions on the host, the optimizer's states and step on the GPU
    path = DATA / "deepspeed" / "axolotl_zero3_bf16_cpuoffload_params.json"
    a = read_deepspeed(str(path), world_size=8, seq_len=2048, micro_batch=1, accounting="auto").arguments
    assert a["offload_params"] == "cpu" and a.get("offload_optimizer", "none") == "none"
    assert a["sub_group_size"] == 0  # every parameter a sub-group of its own (read by the realistic accounting)
    kw = {"model": "llama-3-8b", "gpu": "h100"}
    r = memcalc.estimate(**kw, **a)
    assert r.accounting == "realistic" and r.input.strategy.offload_params == "cpu"
    assert any("offload_param without offload_optimizer" in n for n in r.notes)
    plain = memcalc.estimate(**kw, **(a | {"offload_params": "none"}))
    rows = {x.key: x.bytes for x in plain.memory.per_gpu.rows}
    bf16 = next(v for k, v in rows.items() if k.startswith("parameters"))
    # the same step less the bf16 partitions (2 bytes per element of rank 0's partitions), which the host keeps
    assert plain.memory.per_gpu.peak_allocated - r.memory.per_gpu.peak_allocated == bf16
    assert r.memory.per_node.cpu == 8 * bf16


@pytest.mark.parametrize("kind, precision", [("MULTI_GPU", "amp-bf16"), ("NO", "amp-bf16"), ("FSDP", "bf16-mixed")])
def test_accelerate_bf16_is_autocast_outside_fsdp_and_deepspeed(tmp_path, kind, precision) -> None:
    # accelerate keeps fp32 weights and runs the forward under torch.autocast (native_amp); FSDP casts through
    # its mixed-precision policy over fp32 shards
    path = tmp_path / "config.yaml"
    path.write_text(f"distributed_type: {kind}\nmixed_precision: bf16\nnum_processes: {1 if kind == 'NO' else 2}\n")
    assert read_accelerate(path).arguments["precision"] == precision


def test_accelerate_sequence_parallel_under_deepspeed_is_named_not_ignored(tmp_path) -> None:
    # accelerate reads parallelism_config's sp sizes under DEEPSPEED (Ulysses/ALST): a memory change memcalc does
    # not model, said as such; its mesh sizes are FSDP2's; an unknown key is refused as under FSDP
    path = tmp_path / "config.yaml"
    body = ("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  zero_stage: 3\n"
            "parallelism_config:\n  parallelism_config_sp_size: 4\n  parallelism_config_sp_backend: deepspeed\n")
    path.write_text(body)
    r = read_accelerate(path)
    assert [u.partition(":")[0] for u in r.unmodelled] == ["parallelism_config.parallelism_config_sp_size"]
    assert "parallelism_config.parallelism_config_sp_backend: sequence parallelism setting" in r.ignored
    assert r.arguments["stage"] == 3
    path.write_text(body + "  parallelism_config_sp_sise: 2\n")
    with pytest.raises(InputError, match=r"parallelism_config\.parallelism_config_sp_sise: unknown key"):
        read_accelerate(path)


@pytest.mark.parametrize("version", [1, 2])
def test_accelerate_wrap_policy_other_than_per_layer_is_named(tmp_path, version) -> None:
    # TRANSFORMER_BASED_WRAP is one unit per decoder layer (read); NO_WRAP makes none, and it is accelerate's default
    # when the key is absent (FullyShardedDataParallelPlugin): --fsdp-auto-wrap none, read, but named as not modelled
    # under the implementation accounting; SIZE_BASED_WRAP makes units by parameter count: named as not modelled;
    # another value is refused as accelerate refuses it
    path = tmp_path / "config.yaml"
    head = f"distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: {version}\n"
    path.write_text(head + "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    r = read_accelerate(path)
    assert "fsdp_config.fsdp_auto_wrap_policy" in r.read and not r.unmodelled
    assert "fsdp_auto_wrap" not in r.arguments
    for line, named in (("  fsdp_auto_wrap_policy: no_wrap\n", "fsdp_config.fsdp_auto_wrap_policy"),
                        ("", "fsdp_config.fsdp_auto_wrap_policy (not set")):
        path.write_text(head + line)
        r = read_accelerate(path)
        assert any(x.startswith(named) for x in r.read) and not r.unmodelled, line
        assert r.arguments["fsdp_auto_wrap"] == "none"
        r = read_accelerate(path, accounting="implementation")
        assert len(r.unmodelled) == 1 and r.unmodelled[0].startswith(named) and "NO_WRAP" in r.unmodelled[0]
        assert "fsdp_auto_wrap" not in r.arguments
    path.write_text(head + "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n")
    r = read_accelerate(path)
    assert len(r.unmodelled) == 1 and r.unmodelled[0].startswith("fsdp_config.fsdp_auto_wrap_policy")
    assert "SIZE_BASED_WRAP" in r.unmodelled[0]
    path.write_text(head + "  fsdp_auto_wrap_policy: LAYER_WRAP\n")
    with pytest.raises(InputError, match=r"fsdp_auto_wrap_policy: 'LAYER_WRAP' is not accepted; accepted: "
                                         r"TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP$"):
        read_accelerate(path)


def test_accelerate_no_wrap_config_answers_realistically(tmp_path) -> None:
    """An accelerate FSDP file without fsdp_auto_wrap_policy (NO_WRAP, accelerate's default) through the estimate:
    the realistic accounting follows it. Both steps peak at the loss (Llama 3 8B, 8 ranks, 2,048 tokens, no
    recompute), where NO_WRAP holds every decoder layer gathered in bf16 (32 x 218,112,000 elements x 2 bytes) and
    one unit per layer holds none of them."""
    path = tmp_path / "config.yaml"
    body = ("distributed_type: FSDP\nnum_processes: 8\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n"
            "  fsdp_reshard_after_forward: true\n")
    path.write_text(body)
    kw = {"model": "llama-3-8b", "seq_len": 2048, "gpu": "h100"}
    none = memcalc.estimate(**read_accelerate(path, accounting="auto").arguments, **kw)
    path.write_text(body + "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    layer = memcalc.estimate(**read_accelerate(path, accounting="auto").arguments, **kw)
    assert none.accounting == layer.accounting == "realistic"
    assert any("as accelerate 1.15 wraps a model under NO_WRAP" in n for n in none.notes)
    assert none.memory.timeline.peak_phase == layer.memory.timeline.peak_phase == "loss"
    assert none.memory.per_gpu.peak_allocated - layer.memory.per_gpu.peak_allocated == 32 * 218_112_000 * 2


def test_accelerate_deepspeed_file_relative_to_launch_directory() -> None:
    r = read_accelerate(DATA / "accelerate" / "deepspeed.yaml", cwd=DATA / "accelerate")
    assert r.arguments == {"gpus": 2, "grad_accum": 1, "optimizer": "adamw", "stage": 1, "precision": "fp16-mixed",
                           "overlap_comm": True}
    assert "../deepspeed_config_templates/zero_stage1_config.json: zero_optimization.stage" in r.read
    with pytest.raises(InputError, match="cannot read"):
        read_accelerate(DATA / "accelerate" / "deepspeed.yaml", cwd=DATA)


def test_accelerate_fsdp_samples() -> None:
    r = read_accelerate(DATA / "accelerate" / "fsdp.yaml")
    assert r.arguments == {"fsdp_version": 1, "fsdp": "FULL_SHARD", "precision": "bf16-mixed", "gpus": 2,
                           "backward_prefetch": "pre"}  # fmt: skip  # fsdp_backward_prefetch: BACKWARD_PRE
    assert "fsdp_config.fsdp_backward_prefetch" in r.read and not r.unmodelled
    r = read_accelerate(DATA / "accelerate" / "tp_hsdp.yaml")
    assert r.arguments == {"fsdp_version": 2, "shard_group": 2, "fsdp": "HYBRID_SHARD", "tp": 2,
                           "precision": "bf16-mixed", "gpus": 8, "framework": "hf"}  # fmt: skip
    # accelerate 1.15's FSDP2 gives the embedding and [norm, head] units of their own: --framework hf's wrap
    assert any("--fsdp-wrap separate" in n for n in r.notes)
    r = read_accelerate(DATA / "accelerate" / "nd.yaml")
    assert r.arguments["cp"] == 4 and r.arguments["fsdp"] == "FULL_SHARD"
    # FSDP2 shards over accelerate's dp_shard_cp dimension, which memcalc now models (memcalc.layout.compose).
    assert r.arguments["framework"] == "hf" and any("dp_shard x cp = 8" in u for u in r.notes)
    r = read_accelerate(DATA / "accelerate" / "multi_node.yaml")
    assert r.arguments == {"gpus_per_node": 4, "ddp": True, "precision": "fp32", "gpus": 8}


def test_torchtitan_llama3_samples() -> None:
    r = read_torchtitan(DATA / "torchtitan" / "v0.2.2_llama3_70b.toml", world_size=64)
    assert r.arguments == {"model": "llama-3-70b", "gpus": 64, "fsdp": "FULL_SHARD", "fsdp_version": 2, "tp": 8,
                           "sequence_parallel": True, "precision": "bf16-mixed", "seq_len": 8192, "micro_batch": 8,
                           "recompute": "full", "optimizer": "adamw", "attention": "sdpa",
                           "framework": "torchtitan"}  # fmt: skip  # its composition rules (memcalc.layout.compose)
    r = read_torchtitan(DATA / "torchtitan" / "v0.1.0_llama3_8b.toml", world_size=64)
    assert r.arguments["recompute"] == "op-sac" and r.arguments["micro_batch"] == 1
    assert not any("float8" in u for u in r.unmodelled)  # [float8] present, converter commented out
    assert any(i.startswith("float8.enable_fsdp_float8_all_gather") for i in r.ignored)
    r = read_torchtitan(DATA / "torchtitan" / "v0.2.2_llama3_405b.toml", world_size=512)
    assert r.arguments["model"] == "llama-3-405b" and r.arguments["tp"] == 8
    # converters ["float8"] with enable_fsdp_float8_all_gather under FSDP: tensorwise (recipe_name unset), fp8 gathers
    assert (r.arguments["float8"], r.arguments["float8_all_gather"]) == ("tensorwise", True)
    # its async TP is listed as not modelled (answered as plain TP), nothing else
    assert [x.split(":")[0] for x in r.unmodelled] == ["parallelism.enable_async_tensor_parallel"]
    assert "quantize.linear.float8.enable_fsdp_float8_all_gather" in r.read
    assert any(i.startswith("quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp") for i in r.ignored)
    with pytest.raises(InputError, match="--float8 needs fp8 tensor cores, which a100-sxm-80gb lacks"):
        memcalc.estimate(**r.arguments)
    assert memcalc.estimate(**r.arguments, gpu="h100").accounting == "realistic"
    # [compile] enable with the default components (model and loss): both compiled
    assert (r.arguments["compile"], r.arguments["compile_loss"]) == (True, True) and "compile.enable" in r.read
    r = read_torchtitan(DATA / "torchtitan" / "v0.2.0_debug_model.toml", world_size=8)
    assert r.arguments["recompute"] == "every:2"  # selective_ac_option '2': every 2nd layer fully checkpointed
    assert not any(u.startswith("activation_checkpoint") for u in r.unmodelled)


# ---------------------------------------------------------------------------------------------
# DeepSpeed rules.
# ---------------------------------------------------------------------------------------------


def test_plain_deepspeed_derives_the_third_batch_number() -> None:
    base = {"zero_optimization": {"stage": 1}}
    assert read_deepspeed({**base, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2},
                          world_size=8).arguments["grad_accum"] == 4  # fmt: skip
    r = read_deepspeed({**base, "train_batch_size": 64, "gradient_accumulation_steps": 2}, world_size=8, seq_len=128)
    assert r.arguments["micro_batch"] == 4
    # dp = world / (tp x pp) = 16 / (2 x 2) = 4
    r = read_deepspeed({**base, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}, world_size=16, tp=2, pp=2)
    assert r.arguments["grad_accum"] == 4 and r.arguments["tp"] == 2 and r.arguments["pp"] == 2
    r = read_deepspeed({**base, "train_batch_size": 48, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": 3})  # fmt: skip
    assert r.arguments["gpus"] == 8  # world inferred: 48 / (2 x 3)


def test_batch_contradictions_are_refused() -> None:
    bad = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    with pytest.raises(InputError, match=r"<dict>: train_batch_size: 64 != micro-batch 2 x accumulation 2 x "
                                         r"data-parallel size 8"):  # fmt: skip
        read_deepspeed(bad, world_size=8)
    with pytest.raises(InputError, match=r"train_micro_batch_size_per_gpu: 2 disagrees with micro_batch=4"):
        read_deepspeed({"train_micro_batch_size_per_gpu": 2}, micro_batch=4)
    with pytest.raises(InputError, match=r"train_batch_size: 64 needs the world size"):
        read_deepspeed({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})


def test_zero_spellings_deprecated_keys_and_numbers() -> None:
    a = read_deepspeed({"zero_optimization": {"stage": 3, "max_live_parameters": 3e8, "stage3_prefetch_bucket_size": 1e7}},
                       accounting="implementation").arguments  # fmt: skip
    assert a["max_live_parameters"] == 300_000_000 and a["prefetch_bucket_size"] == 10_000_000
    with pytest.raises(InputError, match=r"zero_optimization\.max_live_parameters: is given twice"):
        read_deepspeed({"zero_optimization": {"stage": 3, "max_live_parameters": 1, "stage3_max_live_parameters": 2}})
    a = read_deepspeed({"zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True}}).arguments
    assert a["offload_optimizer"] == "cpu" and a["offload_params"] == "cpu"
    a = read_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}).arguments
    assert a["offload_optimizer"] == "cpu"  # stage_1_and_2.py keeps nvme-offloaded states in host memory
    r = read_deepspeed({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    assert "offload_params" not in r.arguments and any(i.startswith("zero_optimization.offload_param") for i in r.ignored)
    assert read_deepspeed({"zero_optimization": True}).arguments["stage"] == 1
    assert read_deepspeed({"zero_optimization": {"stage": "3"}}).arguments["stage"] == 3  # DeepSpeed parses "3" too


def test_types_are_strict() -> None:
    with pytest.raises(InputError, match=r"zero_optimization\.stage: True is a boolean"):
        read_deepspeed({"zero_optimization": {"stage": True}})
    with pytest.raises(InputError, match=r"zero_optimization\.overlap_comm: 'true' is a string.*accepted: true or false"):
        read_deepspeed({"zero_optimization": {"stage": 2, "overlap_comm": "true"}})
    with pytest.raises(InputError, match=r"fp16\.enabled: 1 is a number"):
        read_deepspeed({"fp16": {"enabled": 1}})
    with pytest.raises(InputError, match=r"zero_optimization\.stage: 4 is not a ZeRO stage"):
        read_deepspeed({"zero_optimization": {"stage": 4}})
    with pytest.raises(InputError, match=r"sub_group_size: 5\.5 is a number"):
        read_deepspeed({"zero_optimization": {"stage": 3, "sub_group_size": 5.5}})


def test_unknown_keys() -> None:
    with pytest.raises(InputError, match=r"<dict>: zero_optimisation: unknown key \(did you mean 'zero_optimization'\?\)"):
        read_deepspeed({"zero_optimisation": {"stage": 3}})
    r = read_deepspeed({"my_notes": "anything", "zero_optimization": {"stage": 1}})
    assert "my_notes: not a DeepSpeed key (DeepSpeed ignores unknown top-level keys)" in r.ignored
    with pytest.raises(InputError, match=r"zero_optimization\.offload_optimizer\.devise: unknown key "
                                         r"\(did you mean 'device'\?\)"):  # fmt: skip
        read_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {"devise": "cpu"}}})
    with pytest.raises(InputError, match=r"zero_optimization\.cpu_offload: and zero_optimization\.offload_optimizer both given"):
        read_deepspeed({"zero_optimization": {"stage": 3, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}})
    with pytest.raises(InputError, match=r"offload_optimizer\.ratio: 0\.5 \(partial offload\) needs ZeRO stage 3"):
        read_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})
    with pytest.raises(InputError, match=r"fp16\.enabled: fp16 and bf16 are both enabled"):
        read_deepspeed({"fp16": {"enabled": True}, "bf16": {"enabled": True}})


@pytest.mark.parametrize("release", [(0, 19, 7), (0, 19, 8), (0, 20, 0)])
def test_removed_blocks_refused_where_the_installed_deepspeed_refuses_them(monkeypatch, release) -> None:
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    name = r"\.".join(map(str, release))
    with pytest.raises(InputError, match=rf"^<dict>: amp: was removed from DeepSpeed 0\.19\.7 \(the installed "
                                         rf"{name} refuses the file\); delete it$"):  # fmt: skip
        read_deepspeed({"amp": {"enabled": True}})
    with pytest.raises(InputError, match=r"zero_optimization\.mics_shard_size: was removed from DeepSpeed 0\.19\.7"):
        read_deepspeed({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})


@pytest.mark.parametrize("release", [None, (0, 16, 4), (0, 19, 6)])
def test_removed_blocks_read_as_deepspeed_before_0_19_7_read_them(monkeypatch, release) -> None:
    """DeepSpeedExamples' files carry "amp", "curriculum_learning" or "elasticity" blocks, most disabled; DeepSpeed up to
    0.19.6 read them. Disabled ones are passed over, enabled ones that change memory are listed as not modelled."""
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    r = read_deepspeed({"train_micro_batch_size_per_gpu": 2, "amp": {"enabled": False},
                        "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen"},
                        "nebula": {"enabled": True},
                        "zero_optimization": {"stage": 3, "mics_shard_size": 8}}, world_size=8, seq_len=512)  # fmt: skip
    assert r.arguments["stage"] == 3 and r.arguments["micro_batch"] == 2
    assert "amp: disabled" in r.ignored and "nebula: no effect on the memory held" in r.ignored
    assert sorted(x.split(":")[0] for x in r.unmodelled) == ["curriculum_learning", "zero_optimization.mics_shard_size"]
    assert sum("0.19.7 and later refuse the file" in n for n in r.notes) == 4


def test_deepspeed_key_sets_match_the_installed_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import (
        _REMOVED_TOP_LEVEL_CONFIG_KEYS,
        _REMOVED_ZERO_CONFIG_KEYS,
    )
    from deepspeed.runtime.precision_config import (
        DeepSpeedBF16Config,
        DeepSpeedFP16Config,
    )
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    fields = DeepSpeedZeroConfig.model_fields
    assert set(K.ZERO_FIELDS) == set(fields)
    assert {a: f for a, f in K.ZERO_ALIASES.items()} == {f.alias: n for n, f in fields.items() if f.alias}
    assert set(K.OFFLOAD_OPTIMIZER_KEYS) == set(DeepSpeedZeroOffloadOptimizerConfig.model_fields)
    assert set(K.OFFLOAD_PARAM_KEYS) == set(DeepSpeedZeroOffloadParamConfig.model_fields)
    assert set(K.FP16_KEYS) == set(DeepSpeedFP16Config.model_fields)
    assert set(K.BF16_KEYS) == set(DeepSpeedBF16Config.model_fields)
    assert set(K.TOP_REMOVED) == set(_REMOVED_TOP_LEVEL_CONFIG_KEYS)
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig

    tp_fields = TPTrainingConfig.model_fields
    assert set(K.TENSOR_PARALLEL_KEYS) == set(tp_fields) | {f.alias for f in tp_fields.values() if f.alias}
    assert set(K.ACTIVATION_CHECKPOINTING_KEYS) == set(ACT_CHKPT_DEFAULT)
    assert set(K.ZERO_REMOVED) == set(_REMOVED_ZERO_CONFIG_KEYS)
    from deepspeed.compile.config import CompileConfig

    assert set(K.COMPILE_KEYS) == set(CompileConfig.model_fields)


def test_compile_section_keys_deepspeed_refuses_are_refused(monkeypatch) -> None:
    # DeepSpeed 0.16.6 on builds CompileConfig(**section) (extra="forbid"): "backend" is torch.compile's argument.
    # A file that uses a current key is for those releases, whatever is installed.
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: None)
    with pytest.raises(InputError, match=r"compile\.backend: unknown key"):
        read_deepspeed({"train_micro_batch_size_per_gpu": 1, "compile": {"deepcompile": True, "backend": "inductor"}})
    with pytest.raises(InputError, match=r"compile\.deepcompil: unknown key \(did you mean 'deepcompile'\?\)"):
        read_deepspeed({"train_micro_batch_size_per_gpu": 1, "compile": {"deepcompil": True}})
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: (0, 19, 8))
    with pytest.raises(InputError, match=r"compile\.disable: unknown key, which the installed DeepSpeed 0\.19\.8 "
                                         r"refuses \(accepted: deepcompile, "):  # fmt: skip
        read_deepspeed({"train_micro_batch_size_per_gpu": 1, "compile": {"disable": False}})
    r = read_deepspeed({"train_micro_batch_size_per_gpu": 1, "compile": {"deepcompile": True}})
    assert any(entry.startswith("compile:") for entry in r.unmodelled)
    if importlib.util.find_spec("deepspeed") is not None:  # and DeepSpeed itself refuses the file
        with pytest.raises(Exception, match="backend"):
            _deepspeed_accepts({"compile": {"deepcompile": True, "backend": "inductor"}})


@pytest.mark.parametrize("release", [None, (0, 12, 6), (0, 14, 4), (0, 15, 1), (0, 16, 5)])
def test_older_compile_keys_pass_where_deepspeed_passed_over_the_section(monkeypatch, release) -> None:
    """axolotl's zero*_torch_compile.json files carry compile.disable and compile.backend: DeepSpeed 0.14.4 to 0.16.5
    passed over the whole compile section (and releases before 0.13.2 had none), so those files ran; read with a
    note where no DeepSpeed or such a release is installed."""
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    r = read_deepspeed(DATA / "rejected" / "axolotl_zero1_torch_compile.json", world_size=8, micro_batch=2,
                       seq_len=512)  # fmt: skip
    assert r.arguments["stage"] == 1 and r.arguments["micro_batch"] == 2
    assert any(n.startswith("compile.disable, backend: passed over, as DeepSpeed 0.14.4 to 0.16.5") for n in r.notes)


@pytest.mark.parametrize("release", [(0, 13, 2), (0, 14, 3), (0, 16, 6), (0, 19, 8)])
def test_older_compile_keys_refused_where_the_installed_deepspeed_refuses_them(monkeypatch, release) -> None:
    """0.13.2 to 0.14.3 parsed enabled, backend and kwargs (so "disable" failed the file); 0.16.6 on parse
    DeepCompile's keys."""
    monkeypatch.setattr(reading, "installed_release", lambda name, patch=False: release)
    name = r"\.".join(map(str, release))
    with pytest.raises(InputError, match=rf"compile\.disable: unknown key, which the installed DeepSpeed {name} "
                                         r"refuses"):  # fmt: skip
        read_deepspeed(DATA / "rejected" / "axolotl_zero1_torch_compile.json", world_size=8)
    if release < (0, 14, 4):  # that release's own keys read
        read_deepspeed({"train_micro_batch_size_per_gpu": 1, "compile": {"enabled": True, "backend": "inductor"}})


@pytest.mark.parametrize("config", [
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "max_live_parameters": 3e8}},
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "cpu_offload": True}},
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}},
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": "3"}, "bf16": {"enabled": True}},
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": True, "my_notes": 1},
    {"train_micro_batch_size_per_gpu": 2, "compile": {"deepcompile": True, "free_activation": True}},
])  # fmt: skip
def test_deepspeed_accepts_inline_configs_the_reader_accepts(config: dict) -> None:
    read_deepspeed(config, world_size=1)
    _deepspeed_accepts(config)


def test_flags_given_win_over_the_file() -> None:
    r = read_deepspeed(DATA / "deepspeed" / "dse_alpaca_lora_zero3.json", world_size=8)
    merged = merge_arguments(r.arguments, {"fsdp": "FULL_SHARD", "gpus": 16, "params": "7B"})
    assert merged == {"gpus": 16, "grad_accum": 1, "precision": "fp16-mixed", "optimizer": "adamw",
                      "fsdp": "FULL_SHARD", "params": "7B", "reduce_bucket_size": 10_000_000}  # fmt: skip
    t = read_torchtitan(DATA / "torchtitan" / "v0.2.2_llama3_70b.toml", world_size=64)
    merged = merge_arguments(t.arguments, {"hf_config": "config.json", "seq_len": 4096})
    assert "model" not in merged and merged["seq_len"] == 4096 and merged["fsdp"] == "FULL_SHARD"


def test_overlap_comm_is_read_where_it_holds_a_bucket() -> None:
    # ZeRO-1/2: a second gradient bucket (the realistic accounting counts it); ZeRO-3: one bucket either way
    for stage in (1, 2):
        for value in (True, False):
            r = read_deepspeed({"zero_optimization": {"stage": stage, "overlap_comm": value}})
            assert r.arguments["overlap_comm"] is value and "zero_optimization.overlap_comm" in r.read
    r = read_deepspeed({"zero_optimization": {"stage": 3, "overlap_comm": True}})
    assert "overlap_comm" not in r.arguments
    assert any(i.startswith("zero_optimization.overlap_comm: stage 3: one gradient bucket") for i in r.ignored)


def test_the_command_names_the_ignored_keys_of_a_file_the_yaml_points_at(monkeypatch) -> None:
    # accelerate/deepspeed.yaml names ../deepspeed_config_templates/zero_stage1_config.json: its ignored keys are
    # listed as file:key, not as the bare file name once per key
    from typer.testing import CliRunner

    from memcalc.cli import app

    monkeypatch.chdir(DATA / "accelerate")
    res = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--accelerate-config", "deepspeed.yaml"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stderr.splitlines() if "are ignored:" in x)
    assert "zero_stage1_config.json:fp16.loss_scale_window" in line
    assert ", ../deepspeed_config_templates/zero_stage1_config.json," not in line + ","


def test_a_failing_estimate_prints_its_error_line_alone(tmp_path) -> None:
    """The file's notes are printed once the estimate stands; when it fails, the error line is all of stderr."""
    from typer.testing import CliRunner

    from memcalc.cli import app

    toml = DATA / "torchtitan" / "v0.2.0_debug_model.toml"  # a debug model: no preset, no shape
    res = CliRunner().invoke(app, ["estimate", "--torchtitan-config", str(toml), "--gpus", "8"])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [next(x for x in res.stderr.splitlines() if "error:" in x)]
    ok = CliRunner().invoke(app, ["estimate", "--torchtitan-config", str(toml), "--gpus", "8", "--model", "llama-3-8b"])
    assert ok.exit_code == 0 and "keys do not change memory" in ok.stderr


def test_the_command_says_flags_where_the_reader_names_arguments(tmp_path) -> None:
    # the readers' notes name memcalc.estimate's arguments; a command-line user is told the flags
    from typer.testing import CliRunner

    from memcalc.cli import app

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 16, "gradient_accumulation_steps": 2,
                                "zero_optimization": {"stage": 2}}))  # fmt: skip
    res = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--deepspeed", str(path)])
    assert res.exit_code == 2 and "give --gpus" in res.stderr and "world_size=" not in res.stderr, res.output
    res = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--deepspeed", str(path), "--gpus", "8"])
    assert res.exit_code == 0, res.output
    assert "micro-batch 1 per GPU: give --seq-len to count activations" in res.stderr, res.stderr


def test_an_error_over_a_flag_the_file_gave_names_the_file(tmp_path) -> None:
    # tensor_parallel.autotp_size gives --tp; the error about --tp says where it came from
    from typer.testing import CliRunner

    from memcalc.cli import app

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 4}}))
    res = CliRunner().invoke(app, ["estimate", "--params", "7e9", "--gpus", "8", "--deepspeed", str(path)])
    assert res.exit_code == 2
    assert res.stderr.strip().endswith(f"(--tp 4 is read from {path})"), res.stderr
    assert "--tp needs the model's shape" in res.stderr
    # a typed --fsdp drops the file's ZeRO stage: the file is named for what reached the estimate, not for --stage
    zero3 = str(DATA / "deepspeed" / "hf_ds_config_zero3_bf16.json")
    res = CliRunner().invoke(app, ["estimate", "-m", "llama-3-70b", "--gpus", "64", "--deepspeed", zero3,
                                   "--fsdp", "FULL_SHARD"])  # fmt: skip
    assert res.exit_code == 2 and f"(--reduce-bucket-size 67108864 is read from {zero3})" in res.stderr, res.output
    assert "--stage None" not in res.stderr


def test_a_strategy_given_over_a_zero3_file_keeps_its_settings_only_for_zero3() -> None:
    """merge_arguments (the CLI's and the API's): a typed strategy other than ZeRO-3 drops the file's ZeRO-3
    settings, which would otherwise be refused as set for another stage; ZeRO-3 named again keeps them."""
    path = DATA / "deepspeed" / "axolotl_zero3_bf16_cpuoffload_params.json"
    a = read_deepspeed(str(path), world_size=8, hidden=4096, seq_len=2048, micro_batch=1, accounting="auto").arguments
    assert a["sub_group_size"] == 0 and a["prefetch_bucket_size"] == int(0.9 * 4096 * 4096)
    kw = {"model": "llama-3-8b", "gpu": "h100"}
    for given in ({"stage": 2}, {"fsdp": "FULL_SHARD"}, {"strategy": "zero-2+opt-cpu"}):
        merged = merge_arguments(a, given)
        assert "sub_group_size" not in merged and "prefetch_bucket_size" not in merged
        if "fsdp" not in given:  # (FSDP refuses the file's DeepSpeed bucket, naming it: test above)
            memcalc.estimate(**kw, **merged)  # no ZeRO-3 setting left to refuse
    for given in ({"stage": 3}, {"stage": "3"}, {"strategy": "zero-3+opt-cpu"}):
        merged = merge_arguments(a, given)
        assert merged["sub_group_size"] == 0 and merged["max_reuse_distance"] == 0
    with pytest.raises(InputError, match="--sub-group-size"):  # typed with another stage: refused, not dropped
        memcalc.estimate(**kw, **merge_arguments(a, {"stage": 2, "sub_group_size": 0}))
