"""Reading accelerate YAML and torchtitan TOML: their rules, and files refused before or while parsing.

Companion of tests/test_configs.py (published samples, DeepSpeed rules).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memcalc.configs import read_accelerate, read_deepspeed, read_torchtitan
from memcalc.errors import InputError

DATA = Path(__file__).parent / "data" / "configs"


# ---------------------------------------------------------------------------------------------
# accelerate rules.
# ---------------------------------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_accelerate_rules(tmp_path: Path) -> None:
    r = read_accelerate(_yaml(tmp_path, "distributed_type: NO\nmixed_precision: bf16\n"))  # bare NO is false
    assert r.arguments == {"ddp": True, "precision": "amp-bf16", "gpus": 1}  # one process: autocast over fp32
    assert any("bare NO" in n for n in r.notes)
    r = read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n"
                                        "  fsdp_sharding_strategy: '2'\n"))  # fmt: skip
    assert r.arguments["fsdp"] == "SHARD_GRAD_OP" and r.arguments["precision"] == "fp32"
    r = read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  sharding_strategy: 5\n"
                                        "  offload_params: true\n  activation_checkpointing: true\n"))  # fmt: skip
    assert r.arguments["fsdp"] == "_HYBRID_SHARD_ZERO2" and r.arguments["offload_params"] == "cpu"
    assert r.arguments["recompute"] == "full"
    r = read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
                                        "  fsdp_reshard_after_forward: false\n"))  # fmt: skip
    assert r.arguments["fsdp"] == "SHARD_GRAD_OP" and r.arguments["fsdp_version"] == 2
    r = read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n"
                                        "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"))  # fmt: skip
    assert r.arguments["fsdp"] == "SHARD_GRAD_OP" and r.arguments["fsdp_version"] == 1
    r = read_accelerate(_yaml(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n"))
    assert r.arguments == {"ddp": True, "precision": "fp32", "gpus": 4}
    assert "fsdp_config: distributed_type MULTI_GPU does not use it" in r.ignored
    r = read_accelerate(_yaml(tmp_path, "distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: bf16\n"
                                        "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n"
                                        "  gradient_accumulation_steps: 4\n"))  # fmt: skip
    assert r.arguments == {"gpus": 4, "grad_accum": 4, "precision": "bf16-mixed", "stage": 3, "offload_optimizer": "cpu"}


def test_accelerate_refusals(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"config\.yaml: mixed_precison: unknown key \(did you mean 'mixed_precision'\?\)"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nmixed_precison: bf16\n"))
    with pytest.raises(InputError, match=r"num_processes: 6 is the total over num_machines 4"):
        read_accelerate(_yaml(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 6\nnum_machines: 4\n"))
    with pytest.raises(InputError, match=r"fsdp_config\.fsdp_reshard_after_forward: True is FSDP2's form"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: true\n"))
    with pytest.raises(InputError, match=r"fsdp_config\.fsdp_reshard_after_forward: 'FULL_SHARD' is a string"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
                                        "  fsdp_reshard_after_forward: FULL_SHARD\n"))  # fmt: skip
    with pytest.raises(InputError, match=r"fsdp_sharding_strategy: 6 is not accepted"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 6\n"))
    with pytest.raises(InputError, match=r"parallelism_config: needs fsdp_config\.fsdp_version 2"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_tp_size: 2\n"))
    with pytest.raises(InputError, match=r"dp_replicate\(1\) \* dp_shard\(2\) \* tp\(2\) \* cp\(1\) = 4 != num_processes\(8\)"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
                                        "parallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
                                        "  parallelism_config_tp_size: 2\n"))  # fmt: skip
    with pytest.raises(InputError, match=r"deepspeed_config\.zero_stage: cannot be combined with deepspeed_config_file"):
        read_accelerate(_yaml(tmp_path, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: x.json\n"
                                        "  zero_stage: 2\n"))  # fmt: skip
    with pytest.raises(InputError, match=r"distributed_type: is missing"):
        read_accelerate(_yaml(tmp_path, "num_processes: 2\n"))


def test_accelerate_key_set_matches_the_installed_accelerate() -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig

    from memcalc.configs.accelerate import TOP_KEYS

    assert set(ClusterConfig.__dataclass_fields__) | set(SageMakerConfig.__dataclass_fields__) <= set(TOP_KEYS)


def test_yaml_needs_pyyaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(InputError, match=r"reading YAML needs PyYAML; install it with: pip install pyyaml"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\n"))


# ---------------------------------------------------------------------------------------------
# torchtitan rules.
# ---------------------------------------------------------------------------------------------


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_torchtitan_rules(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"data_parallel_shard_degree: is -1 \(the GPUs left over\), "
                                         r"so the world size must be given"):  # fmt: skip
        read_torchtitan(DATA / "torchtitan" / "v0.2.2_llama3_70b.toml")
    r = read_torchtitan(_toml(tmp_path, "[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n"
                                        "pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 2\n"
                                        "[training]\nlocal_batch_size = 8\nglobal_batch_size = 128\n"))  # fmt: skip
    # 2 x 4 x 2 = 16 GPUs; global 128 = local 8 x dp 8 x 2 steps; pipeline: 8 / 2 = 4 micro-batches of 2.
    a = r.arguments
    assert a["gpus"] == 16 and a["fsdp"] == "_HYBRID_SHARD_ZERO2" and a["shard_group"] == 4
    assert a["micro_batch"] == 2 and a["grad_accum"] == 8 and a["pp"] == 2
    r = read_torchtitan(_toml(tmp_path, "[model]\nconverters = [\"float8\"]\n[float8]\nenable_fsdp_float8_all_gather = true\n"
                                        "[training]\ncompile = true\n"), world_size=8)  # fmt: skip
    assert (r.arguments["float8"], r.arguments["float8_all_gather"]) == ("tensorwise", True) and not r.unmodelled
    # a recipe_name: no fp8 all-gather (torchtitan asserts the two are not combined); a filter beyond the head is named
    r8 = read_torchtitan(_toml(tmp_path, "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rowwise\"\n"
                                         "filter_fqns = [\"output\", \"w1\"]\n"), world_size=8)  # fmt: skip
    assert r8.arguments["float8"] == "rowwise" and "float8_all_gather" not in r8.arguments
    assert any(u.startswith("float8.filter_fqns: filters beyond the head") for u in r8.unmodelled)
    with pytest.raises(InputError, match=r"float8.enable_fsdp_float8_all_gather: true with recipe_name 'rowwise': "
                                         r"torchtitan asserts they are not combined"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rowwise\"\n"
                                        "enable_fsdp_float8_all_gather = true\n"), world_size=8)  # fmt: skip
    # no dp_shard (DDP over 8): the fp8 all-gather is off, as torchtitan's dp_shard_enabled says
    r8 = read_torchtitan(_toml(tmp_path, "[model]\nconverters = [\"float8\"]\n[float8]\nenable_fsdp_float8_all_gather = true\n"
                                         "[parallelism]\ndata_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n"),
                         world_size=8)  # fmt: skip
    assert "float8_all_gather" not in r8.arguments
    assert any(i.startswith("float8.enable_fsdp_float8_all_gather: torchtitan gathers in fp8 only") for i in r8.ignored)
    with pytest.raises(InputError, match=r"float8.recipe_name: 'fp4' is not accepted; accepted: tensorwise, rowwise"):
        read_torchtitan(_toml(tmp_path, "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"fp4\"\n"),
                        world_size=8)
    # v0.1.0 compiles the blocks and the loss (components/loss.py build_cross_entropy_loss)
    assert (r.arguments["compile"], r.arguments["compile_loss"]) == (True, True)
    r = read_torchtitan(_toml(tmp_path, "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"1\"\n"
                                        "[training]\ndtype = \"bfloat16\"\n"), world_size=1)  # fmt: skip
    assert r.arguments["recompute"] == "full" and r.arguments["precision"] == "bf16" and r.arguments["ddp"] is True


def test_torchtitan_async_tp_is_said_to_be_unmodelled(tmp_path: Path) -> None:
    """torchtitan measured async TP holding less than plain TP (71.9 -> 67.6 GiB on its 70B 2D run), so the key is
    listed as not modelled (answered as plain TP), not as a key without effect; off, or without TP, it is ignored."""
    base = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n'
    on = read_torchtitan(_toml(tmp_path, base + "tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"),
                         world_size=8)  # fmt: skip
    assert on.arguments["tp"] == 2
    assert [x for x in on.unmodelled if x.startswith("parallelism.enable_async_tensor_parallel: async TP's fused")]
    off = read_torchtitan(_toml(tmp_path, base + "tensor_parallel_degree = 2\nenable_async_tensor_parallel = false\n"),
                          world_size=8)  # fmt: skip
    assert "parallelism.enable_async_tensor_parallel: off" in off.ignored
    alone = read_torchtitan(_toml(tmp_path, base + "enable_async_tensor_parallel = true\n"), world_size=8)
    assert any(x.startswith("parallelism.enable_async_tensor_parallel: no tensor parallelism") for x in alone.ignored)
    assert not [x for x in alone.unmodelled if "async" in x]


def test_torchtitan_keys_that_change_memory_are_read_or_said(tmp_path: Path) -> None:
    """Keys that change what a rank holds are read (v0.1.0's pipeline split points) or listed as not modelled (a step
    other than fused, optimizer-in-backward, loss parallel off under TP, a schedule from a CSV, a compile backend
    other than inductor); none is passed over as a key without effect."""
    base = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\nlocal_batch_size = 8\n'
    # the step's implementation and optimizer-in-backward: said (a file cannot tell whether the realistic accounting,
    # whose --optimizer-impl it is, will answer), with the flag that counts them
    for key, value in (("implementation", '"foreach"'), ("early_step_in_backward", "true")):
        r = read_torchtitan(_toml(tmp_path, base + f"[optimizer]\n{key} = {value}\n"), world_size=8)
        assert "optimizer_impl" not in r.arguments
        assert [x for x in r.unmodelled if x.startswith(f"optimizer.{key}: ") and "--optimizer-impl" in x]
    r = read_torchtitan(_toml(tmp_path, base + '[optimizer]\nimplementation = "fused"\n'), world_size=8)
    assert "optimizer.implementation" in r.read and not r.unmodelled
    with pytest.raises(InputError, match=r"optimizer\.early_step_in_backward: torchtitan refuses optimizers in "
                                         r"backward with pipeline parallelism; accepted: false"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, base + "[optimizer]\nearly_step_in_backward = true\n[parallelism]\n"
                                                "pipeline_parallel_degree = 2\n"), world_size=8)  # fmt: skip
    with pytest.raises(InputError, match=r"optimizer\.implementation: 'apex' is not accepted; accepted: for-loop, "
                                         r"foreach, fused"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, base + '[optimizer]\nimplementation = "apex"\n'), world_size=8)
    # v0.1.0's split points: the first layer of each later stage
    split = base + '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_split_points = ["layers.14"]\n'
    r = read_torchtitan(_toml(tmp_path, split), world_size=8)
    assert r.arguments["stage_layers"] == "14,18" and "parallelism.pipeline_parallel_split_points" in r.read
    bad = base + '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_split_points = ["layers.40"]\n'
    with pytest.raises(InputError, match=r"pipeline_parallel_split_points: .* accepted: non-decreasing layer names "
                                         r"from layers\.0 to layers\.31"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, bad), world_size=8)
    said = base + ('[parallelism]\ntensor_parallel_degree = 2\ndisable_loss_parallel = true\n[compile]\nenable = true\n'
                   'backend = "aot_eager"\n')
    r = read_torchtitan(_toml(tmp_path, said), world_size=8)
    assert sorted(x.split(":")[0] for x in r.unmodelled) == ["compile.backend", "parallelism.disable_loss_parallel"]


def test_torchtitan_refusals(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"compile\.enable: is a torchtitan v0\.2\.0/v0\.2\.1/v0\.2\.2 key but "
                                         r"float8\.emulate is v0\.1\.0's"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, "[float8]\nemulate = true\n[compile]\nenable = true\n"), world_size=8)
    with pytest.raises(InputError, match=r"training\.local_batch_sise: unknown key "
                                         r"\(did you mean 'training\.local_batch_size'\?\)"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, "[training]\nlocal_batch_sise = 2\n"), world_size=8)
    with pytest.raises(InputError, match=r"training\.compile: 'yes' is not accepted; accepted: true or false"):
        read_torchtitan(_toml(tmp_path, "[training]\ncompile = \"yes\"\n"), world_size=8)
    with pytest.raises(InputError, match=r"selective_ac_option: 'every' is not accepted"):
        read_torchtitan(_toml(tmp_path, "[activation_checkpoint]\nselective_ac_option = \"every\"\n"), world_size=8)
    with pytest.raises(InputError, match=r"dp_replicate\(1\) \* dp_shard\(4\) \* tp\(1\) \* pp\(1\) \* cp\(1\) "
                                         r"= 4 != world_size\(8\)"):  # fmt: skip
        read_torchtitan(_toml(tmp_path, "[parallelism]\ndata_parallel_shard_degree = 4\n"), world_size=8)


# ---------------------------------------------------------------------------------------------
# Files: size, nesting, encoding, syntax.
# ---------------------------------------------------------------------------------------------


def test_bad_files(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text('{"x": "' + "a" * (1 << 20) + '"}')
    with pytest.raises(InputError, match=r"big\.json: 1,048,585 bytes is larger than the 1,048,576 bytes"):
        read_deepspeed(big)
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' * 65 + "1" + "}" * 65)
    with pytest.raises(InputError, match=r"deep\.json: nested deeper than 64 levels"):
        read_deepspeed(deep)
    deep.write_text('{"a": ' * 20000 + "1" + "}" * 20000)
    with pytest.raises(InputError, match=r"nested deeper than 64 levels"):
        read_deepspeed(deep)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"x": "caf\xe9"}')
    with pytest.raises(InputError, match=r"latin\.json: byte 10 is not UTF-8"):
        read_deepspeed(latin)
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(InputError, match=r"broken\.json: invalid JSON at line 1 column 35"):
        read_deepspeed(broken)
    broken.write_text('{"a": 1, "a": 2}')
    with pytest.raises(InputError, match=r"key 'a' appears twice"):
        read_deepspeed(broken)
    broken.write_text('{"a": NaN}')
    with pytest.raises(InputError, match=r"NaN is not a JSON number"):
        read_deepspeed(broken)
    with pytest.raises(InputError, match=r"config\.yaml: invalid YAML at line 2"):
        read_accelerate(_yaml(tmp_path, "distributed_type: FSDP\n  bad: [\n"))
    with pytest.raises(InputError, match=r"config\.yaml: nested deeper than 64 levels"):
        read_accelerate(_yaml(tmp_path, "a: " + "[" * 70 + "]" * 70 + "\n"))
    with pytest.raises(InputError, match=r"job\.toml: invalid TOML"):
        read_torchtitan(_toml(tmp_path, "[training\nseq_len = 1\n"))
    with pytest.raises(InputError, match=r"missing\.json: cannot read the JSON file"):
        read_deepspeed(tmp_path / "missing.json")
