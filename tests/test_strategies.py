import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.layout.strategies import STRATEGIES, resolve_fsdp, resolve_stage, resolve_strategy


@pytest.mark.parametrize(
    "text, name",
    [("FULL_SHARD", "FULL_SHARD"), ("full-shard", "FULL_SHARD"), ("Full_Shard", "FULL_SHARD"), ("1", "FULL_SHARD"),
     ("shard_grad_op", "SHARD_GRAD_OP"), ("2", "SHARD_GRAD_OP"), ("no-shard", "NO_SHARD"), ("3", "NO_SHARD"),
     ("HYBRID_SHARD", "HYBRID_SHARD"), ("4", "HYBRID_SHARD"), ("_HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2"),
     ("hybrid-shard-zero2", "_HYBRID_SHARD_ZERO2"), ("5", "_HYBRID_SHARD_ZERO2")],
)  # fmt: skip
def test_fsdp_names_as_torch_and_accelerate_spell_them(text, name):
    assert resolve_fsdp(text) == name


@pytest.mark.parametrize("bad", ["FULL_SHRD", "6", "0", "zero-3", ""])
def test_unknown_fsdp_strategy_lists_the_accepted(bad):
    with pytest.raises(InputError, match="accepted: FULL_SHARD, SHARD_GRAD_OP"):
        resolve_fsdp(bad)


def test_did_you_mean():
    with pytest.raises(InputError, match="did you mean 'FULL_SHARD'"):
        resolve_fsdp("FULL_SHRD")


def test_stages():
    assert [resolve_stage(s) for s in (0, 1, "2", " 3")] == ["zero-0", "zero-1", "zero-2", "zero-3"]
    for bad in (5, -1, "x", "1.5"):
        with pytest.raises(InputError, match="accepted: 0, 1, 2, 3"):
            resolve_stage(bad)


def test_strategy_names():
    assert resolve_strategy("ZeRO-3") == "zero-3"
    assert resolve_strategy("DDP") == "ddp"
    assert resolve_strategy("hybrid_shard") == "HYBRID_SHARD"
    with pytest.raises(InputError, match="did you mean 'zero-3'"):
        resolve_strategy("zero-4")


def test_table_says_what_each_shards():
    t = {name: (s.shards_params, s.shards_grads, s.shards_optimizer) for name, s in STRATEGIES.items()}
    assert t["zero-1"] == (False, False, True)
    assert t["zero-2"] == t["SHARD_GRAD_OP"] == t["_HYBRID_SHARD_ZERO2"] == (False, True, True)
    assert t["zero-3"] == t["FULL_SHARD"] == t["HYBRID_SHARD"] == (True, True, True)
    assert t["ddp"] == t["zero-0"] == t["NO_SHARD"] == (False, False, False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stage": 0, "offload_optimizer": "cpu"}, "stage 1 up"),
        ({"stage": 1, "offload_optimizer": "nvme"}, "NVMe needs --stage 3"),
        ({"stage": 2, "offload_optimizer": "nvme"}, "NVMe needs --stage 3"),
        ({"stage": 2, "offload_params": "cpu"}, "ZeRO-3 only"),
        ({"ddp": True, "offload_optimizer": "cpu"}, "DDP has no offload"),
        ({"fsdp": "FULL_SHARD", "offload_optimizer": "cpu"}, "only together with the parameters"),
        ({"fsdp": "FULL_SHARD", "offload_params": "nvme"}, "accepted: none, cpu"),
        ({"stage": 3, "offload_params": "disk"}, "accepted: none, cpu, nvme"),
        ({"stage": 3, "fsdp": "FULL_SHARD"}, "cannot be combined"),
        ({"ddp": True, "stage": 1}, "cannot be combined"),
        ({"stage": 3, "shard_group": 4}, "HYBRID_SHARD and _HYBRID_SHARD_ZERO2 only"),
        ({"fsdp": "HYBRID_SHARD", "shard_group": 3}, "must divide the data-parallel size 16"),
        ({"fsdp": "HYBRID_SHARD", "shard_group": 12, "gpus": 48}, "whole nodes of --gpus-per-node 8"),
    ],
)
def test_framework_rules_are_enforced(kwargs, message):
    kwargs.setdefault("gpus", 16)
    with pytest.raises(ValueError, match=message):
        memcalc.estimate(params=1e9, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stage": 1, "offload_optimizer": "cpu"},
        {"stage": 2, "offload_optimizer": "cpu"},
        {"stage": 3, "offload_optimizer": "nvme"},
        {"stage": 3, "offload_params": "cpu"},
        {"stage": 3, "offload_optimizer": "cpu", "offload_params": "nvme"},
        {"fsdp": "NO_SHARD", "offload_params": "cpu"},
        {"fsdp": "HYBRID_SHARD", "offload_params": "cpu", "offload_optimizer": "cpu"},
    ],
)
def test_allowed_offloads(kwargs):
    assert memcalc.estimate(params=1e9, gpus=16, **kwargs).memory.per_node.cpu + 1 > 0


def test_strategy_modifiers():
    s = memcalc.parse_strategy("zero-3+opt-cpu+param-nvme")
    assert (s.name, s.offload_optimizer, s.offload_params) == ("zero-3", "cpu", "nvme")
    f = memcalc.parse_strategy("full_shard+offload")
    assert (f.name, f.offload_params) == ("FULL_SHARD", "cpu")
    z = memcalc.parse_strategy("zero-2+offload")
    assert (z.name, z.offload_optimizer) == ("zero-2", "cpu")
    with pytest.raises(InputError, match="unknown strategy modifier"):
        memcalc.parse_strategy("zero-3+gpu-cpu")
