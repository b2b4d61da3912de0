"""The DeepSpeed JSON memcalc writes, parsed by DeepSpeed's own config classes (skipped without DeepSpeed; CI installs
it in its DeepSpeed step, which runs the tests named deepspeed)."""

from __future__ import annotations

import json

import pytest

import memcalc

CASES = {
    "zero1": dict(stage=1, micro_batch=2, grad_accum=4),
    "zero2-fp16": dict(stage=2, overlap_comm=True, reduce_bucket_size=5 * 10**8, precision="fp16-mixed"),
    "zero3-knobs": dict(stage=3, offload_optimizer="cpu", max_live_parameters=10**9, prefetch_bucket_size=5 * 10**7,
                        persistence_threshold=10**5, max_reuse_distance=10**9, sub_group_size=10**9,
                        accounting="realistic"),
    "zero3-nvme": dict(stage=3, offload_optimizer="nvme", offload_params="nvme", precision="fp32"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepspeed_parses_the_written_config(case: str) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    e = memcalc.estimate(model="llama-3-8b", seq_len=4096, gpus=16, gpu="h100", **CASES[case])
    data = json.loads(memcalc.config_text(e)["ds_config.json"])
    zero = DeepSpeedZeroConfig(**data["zero_optimization"])  # extra="forbid": no key DeepSpeed does not have
    assert int(zero.stage) == CASES[case]["stage"]
    if "max_live_parameters" in CASES[case]:
        assert zero.max_live_parameters == 10**9 and zero.prefetch_bucket_size == 5 * 10**7
    # One rank here (no process group): the train batch reduced to micro-batch x accumulation.
    one_rank = {**data, "train_batch_size": data["train_micro_batch_size_per_gpu"] * data["gradient_accumulation_steps"]}
    config = DeepSpeedConfig(one_rank)
    assert config.zero_optimization_stage == CASES[case]["stage"]
    assert config.gradient_accumulation_steps == data["gradient_accumulation_steps"]
    assert _enabled(config, "bfloat16") == (e.input.precision.name == "bf16-mixed")
    assert _enabled(config, "float16", "fp16") == (e.input.precision.name == "fp16-mixed")


def _enabled(config: object, section: str, old: str | None = None) -> bool:
    """``<section>_config.enabled`` (DeepSpeed 0.17 and later), else the older ``<name>_enabled`` attribute."""
    new = getattr(config, f"{section}_config", None)
    return bool(new.enabled if new is not None else getattr(config, f"{old or section}_enabled"))


def test_accelerate_deepspeed_plugin_reads_the_written_config(tmp_path) -> None:
    pytest.importorskip("deepspeed")
    utils = pytest.importorskip("accelerate.utils")
    e = memcalc.estimate(model="llama-3-8b", seq_len=4096, gpus=16, gpu="h100", **CASES["zero3-knobs"])
    memcalc.write_config(e, directory=tmp_path / "run")
    plugin = utils.DeepSpeedPlugin(hf_ds_config=str(tmp_path / "run" / "ds_config.json"))
    assert plugin.zero_stage == 3
    assert plugin.deepspeed_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
