"""Every user mistake in the Python API is one InputError line naming the field, the value and what is accepted."""

from __future__ import annotations

import pytest

import memcalc
from memcalc import InputError
from memcalc.api import build_input, compare, estimate


def _refused(call, fragment: str) -> str:
    with pytest.raises(InputError) as e:
        call()
    message = str(e.value)
    assert type(e.value) is InputError and len(message.splitlines()) == 1 and fragment in message, message
    return message


@pytest.mark.parametrize(("kwargs", "fragment"), [
    (dict(params=7e9, gpus=12), "--gpus 12 is not a multiple of --gpus-per-node 8"),
    (dict(params=7e9, tp=3, gpus=8), "tp(3) * pp(1) * cp(1) = 3 does not divide gpus(8)"),
    (dict(params=7e9, ddp=True, offload_optimizer="cpu"), "--offload-optimizer cpu with DDP: DDP has no offload"),
    (dict(params=7e9, reserve_gib="2"), "--reserve-gib '2' is not accepted; accepted: a finite number from 0 to"),
    (dict(hf_config=123), "--hf-config 123 is an integer, not a path; accepted: the path of a config.json file"),
    (dict(params=7e9, buffer_factor=float("inf")), "--buffer-factor inf is not accepted; accepted: a finite number"),
    (dict(model="gpt2", seq_len=128, micro_batch=0), "--micro-batch 0 is not accepted; accepted: a whole number from 1"),
    (dict(params=7e9, grad_accum=0), "--grad-accum 0 is not accepted; accepted: a whole number from 1"),
    (dict(params=7e9, micro_batches=0), "--micro-batches 0 is not accepted"),
    (dict(params=7e9, gpus=True), "--gpus True is not accepted; accepted: a whole number from 1 to 1,048,576"),
    (dict(params=7e9, gpus=1_000_000, pp=1_000_000), "--pp 1000000 is not accepted; accepted: a whole number from 1 to 10,000 (a pipeline stage holds at least one layer)"),
    (dict(params=7e9, gpus=2**21), "--gpus 2097152 is not accepted"),
    (dict(params=1000, gpus=4096, pp=4096), "--params 1000 means 1000 parameters, fewer than 1,000,000: did you mean 1000B or 1000M?"),
    (dict(params=7e9, gpus=4096, pp=4096), "--pp needs the model's shape"),
    (dict(params=7e9, tp=64, gpus=64), "--tp needs the model's shape: give --model, --hf-config"),
    (dict(model="gpt2", seq_len=100_000), "--seq-len 100000 is longer than gpt2's learned position table; accepted: at most 1,024"),
    (dict(params=7e9, recompute="full"), "--recompute full needs --seq-len"),
    (dict(model="gpt2", attention="flash"), "--attention flash needs --seq-len"),
    (dict(params=7e9, strategy="zero-3+opt-cpu", offload_params="nvme"), "--offload-params nvme cannot be combined with --strategy 'zero-3+opt-cpu'"),
    (dict(params=7e9, strategy="zero-3+opt-cpu+opt-nvme"), "places the optimizer twice"),
    (dict(params=10**15), "--params 1000000000000000 is out of bounds"),
    (dict(params=[7e9]), "--params [7000000000.0] is not accepted"),
    (dict(params=7e9, stage=10**5000), "--stage <a 16610-bit integer> is not accepted"),
    (dict(params=7e9, gpu=b"h100"), "--gpu b'h100' is not accepted"),
    (dict(params=7e9, fsdp_version=True), "--fsdp-version True is not accepted; accepted: 1, 2"),
    (dict(params=7e9, max_live_parameters=float("nan")), "--max-live-parameters nan is not accepted"),
    (dict(params=7e9, parallelism=memcalc.inputs.Parallelism(), tp=2), "--tp 2 cannot be combined with parallelism="),
])
def test_named_cases_are_one_input_error(kwargs, fragment):
    _refused(lambda: estimate(**kwargs), fragment)


def test_unknown_keywords_name_the_accepted_ones_with_a_close_match():
    m = _refused(lambda: estimate(params=7e9, gpuz=8), "estimate() has no keyword 'gpuz' (did you mean 'gpu'?); accepted: params, gpus,")
    assert "zero3_step" in m
    _refused(lambda: compare(params=7e9, strategy_list=["zero-3"]), "compare() has no keyword 'strategy_list'")
    _refused(lambda: compare(params=7e9, strategie=["zero-3"]), "(did you mean 'strategies'?)")
    _refused(lambda: build_input(params=7e9, seqlen=8), "build_input() has no keyword 'seqlen' (did you mean 'seq_len'?)")
    _refused(lambda: estimate(7e9, 8), "estimate() takes the model size as its only positional argument")


def test_compare_strategies_are_a_bounded_list():
    _refused(lambda: compare(params=7e9, strategies="zero-3"), "--strategies 'zero-3' is not accepted; accepted: a list")
    _refused(lambda: compare(params=7e9, strategies=[3]), "--strategies entry 3 is not accepted")
    _refused(lambda: compare(params=7e9, strategies=["zero-3"] * 101), "more than 100 entries")


def test_zero_micro_batches_are_not_turned_into_one():
    assert estimate(params=7e9, grad_accum=2).training.micro_batches == 2
    _refused(lambda: build_input(params=7e9, grad_accum=0), "--grad-accum 0")


def test_gpu_presets_are_bounded_files(tmp_path):
    _refused(lambda: memcalc.load_gpu("/dev/zero"), "preset file '/dev/zero' is not a regular file")
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 << 20))
    _refused(lambda: memcalc.load_gpu(str(big)), "has 2,097,152 bytes; accepted: a .toml file of at most 1,048,576 bytes")
    bad = tmp_path / "latin.toml"
    bad.write_bytes(b'name = "caf\xe9"\n')
    _refused(lambda: memcalc.load_gpu(str(bad)), "is not UTF-8 text")
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    _refused(lambda: memcalc.load_gpu(str(deep)), "deep.toml")
    _refused(lambda: estimate(params=7e9, model=str(big)), "has 2,097,152 bytes")


def test_usable_memory_above_the_card_is_refused(tmp_path):
    text = (memcalc.inputs.presets.presets_dir() / "gpus" / "h100-sxm.toml").read_text()
    p = tmp_path / "odd.toml"
    p.write_text(text.replace("usable_memory_gib = 79.11", "usable_memory_gib = 90.0"))
    _refused(lambda: memcalc.load_gpu(str(p)), "usable_memory_gib 90.0 is more than its memory_gb 80")


def test_hf_config_files_deep_or_not_utf8(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 10_000 + "]" * 10_000)
    _refused(lambda: estimate(hf_config=str(deep)), "deep.json")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"model_type": "caf\xe9"}')
    _refused(lambda: estimate(hf_config=str(latin)), "latin.json")


def test_records_take_keywords_only_and_name_missing_fields():
    from memcalc.inputs import Cluster, Workload

    _refused(lambda: Cluster(8), "Cluster takes its fields by name")
    _refused(lambda: Workload(), "Workload needs seq_len")
    _refused(lambda: Cluster(gpu=8), "Cluster has no field 'gpu' (did you mean 'gpus'?)")
    _refused(lambda: memcalc.Estimate.model_validate_json(123), "Estimate JSON 123 is int")
    _refused(lambda: memcalc.Estimate.model_validate_json(b"\xff\xfe"), "Estimate")


def test_messages_are_one_line_even_when_a_cause_is_not():
    assert str(InputError("a\nb\r\nc")) == "a b c"


@pytest.mark.parametrize(("kw", "match"), [
    (dict(params=7e9, stage=3, fsdp_version=2), "--fsdp-version 2 describes FSDP"),
    (dict(params=7e9, stage=2, bucket_view=True), "--bucket-view is DDP's"),
    (dict(params=7e9, stage=3, buffer_factor=2.0), "used only with --accounting deepspeed-estimator"),
])
def test_framework_settings_that_nothing_reads_are_refused(kw, match):
    with pytest.raises(memcalc.InputError, match=match):
        memcalc.estimate(gpus=8, **kw)
