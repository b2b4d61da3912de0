"""Random values into every keyword of the public API: each call returns a result or raises one InputError line."""

from __future__ import annotations

import inspect
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memcalc
from memcalc import InputError
from memcalc.api import build_input, compare, estimate, parse_strategy
from memcalc.inputs import Cluster, EstimatorOptions, FrameworkOptions, Overheads, Parallelism, Strategy, Workload
from memcalc.inputs.presets import load_gpu
from memcalc.model.architecture import Architecture

FUZZ = settings(max_examples=130, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

SCALARS = st.one_of(
    st.integers(), st.integers(min_value=-3, max_value=10), st.sampled_from([0, -1, 2**31, 10**30, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.5]),
    st.booleans(), st.none(), st.text(max_size=12), st.binary(max_size=8),
    st.sampled_from(["", "0", "7b", "auto", "zero-3", "cpu", "nvme", "gpt2", "/dev/zero", "full", "1e9", "nan"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))


def _answers(call) -> None:
    try:
        call()
    except InputError as e:
        message = str(e)
        assert type(e) is InputError and message and len(message.splitlines()) == 1, repr(message)


BUILD_NAMES = [n for n in inspect.signature(build_input).parameters if n != "params"]
SHAPE = dict(layers=2, hidden=64, heads=4, vocab=128)


@pytest.mark.parametrize("name", BUILD_NAMES)
@FUZZ
@given(value=VALUES)
def test_build_input_any_value_for_each_keyword(name, value):
    base = {"params": 7e9} if name not in ("model", "hf_config", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                                          "seq_len", "micro_batch", "dropout") else dict(SHAPE)  # fmt: skip
    if name in SHAPE:
        base.pop(name)
    _answers(lambda: build_input(**base, **{name: value}))


@pytest.mark.parametrize("name", ["params", "gpus", "stage", "strategy", "seq_len", "micro_batch", "grad_accum", "tp",
                                  "pp", "reserve_gib", "accounting", "gpu", "precision", "optimizer"])
@FUZZ
@given(value=VALUES)
def test_estimate_any_value(name, value):
    base = dict(SHAPE, seq_len=16, gpus=2) if name != "params" else {}
    base.pop(name, None)
    _answers(lambda: estimate(**base, **{name: value}))


@pytest.mark.parametrize("name", ["strategies", "shard_group", "gpus", "params", "micro_batch"])
@FUZZ
@given(value=VALUES)
def test_compare_any_value(name, value):
    base = {"params": 1e9, "gpus": 8, "strategies": ["zero-2", "FULL_SHARD"]}
    base[name] = value
    _answers(lambda: compare(**base))


@FUZZ
@given(value=VALUES, group=VALUES)
def test_parse_strategy_any_value(value, group):
    _answers(lambda: parse_strategy(value, group))
    _answers(lambda: parse_strategy(value))


@settings(FUZZ, max_examples=300)
@given(value=st.one_of(VALUES, st.text(alphabet="+-_ZzEeRrOo0123CPUNVMEoptaramfulshd", max_size=24)))
def test_parse_strategy_any_text(value):
    _answers(lambda: parse_strategy(value))


@settings(FUZZ, max_examples=300)
@given(value=VALUES)
def test_load_gpu_any_value(value):
    _answers(lambda: load_gpu(value))


RECORDS = [Cluster, Workload, Overheads, Parallelism, Strategy, FrameworkOptions, EstimatorOptions, Architecture]


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_record_constructors_any_value(cls, data):
    names = cls.field_names()
    kwargs = {n: data.draw(VALUES) for n in data.draw(st.lists(st.sampled_from(names), max_size=4, unique=True))}
    _answers(lambda: cls(**kwargs))


@settings(FUZZ, max_examples=300)
@given(text=st.one_of(st.text(max_size=40), st.binary(max_size=40), VALUES,
                      st.recursive(SCALARS, lambda c: st.lists(c, max_size=2) | st.dictionaries(
                          st.sampled_from(["model", "memory", "input", "x"]), c, max_size=2), max_leaves=6)
                      .map(lambda v: __import__("json").dumps(v, default=str))))
def test_estimate_json_any_text(text):
    _answers(lambda: memcalc.Estimate.model_validate_json(text))


def test_estimate_json_round_trips():
    r = estimate(model="gpt2", seq_len=128, stage=2, gpus=8)
    assert memcalc.Estimate.model_validate_json(r.model_dump_json()).memory.per_gpu.total == r.memory.per_gpu.total


COMBO = {
    "gpus": st.sampled_from([1, 2, 8, 16, 0, True, 12]), "stage": st.sampled_from([None, 0, 1, 2, 3, 4, "3"]),
    "tp": st.sampled_from([1, 2, 4, 3]), "pp": st.sampled_from([1, 2, 3]), "seq_len": st.sampled_from([None, 16, 0]),
    "micro_batch": st.sampled_from([None, 1, 4, 0]), "grad_accum": st.sampled_from([None, 1, 3, 0]),
    "offload_optimizer": st.sampled_from(["none", "cpu", "nvme"]), "offload_params": st.sampled_from(["none", "cpu", "nvme"]),
    "recompute": st.sampled_from(["none", "selective", "full"]), "precision": st.sampled_from(["bf16-mixed", "fp32", "bf16"]),
    "accounting": st.sampled_from(["paper", "deepspeed-estimator", "implementation", "realistic"]),
    "cp": st.sampled_from([1, 2]),
}


@settings(FUZZ, max_examples=600)
@given(kwargs=st.fixed_dictionaries({}, optional=COMBO))
def test_estimate_combinations(kwargs):
    _answers(lambda: estimate(**SHAPE, **kwargs))
