"""--megatron-args: a Megatron-LM argument list read into estimate arguments (megatron/training/arguments.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.configs.megatron import read_megatron
from memcalc.errors import InputError

runner = CliRunner()
ARGS = """# a comment
--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4
--num-layers-per-virtual-pipeline-stage 5
--context-parallel-size 1
--sequence-parallel
--use-distributed-optimizer
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--micro-batch-size 1
--global-batch-size 64
--seq-length 4096
--bf16
--lr 3e-4  # no effect on memory
--num-layers 80
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "megatron_args.txt"
    path.write_text(text)
    return path


def test_the_layout_batch_precision_and_recompute_are_read(tmp_path: Path) -> None:
    r = read_megatron(_file(tmp_path, ARGS), world_size=64, layers=80)
    assert r.arguments == dict(framework="megatron", stage=1, tp=4, pp=4, sequence_parallel=True, virtual_stages=4,
                               precision="bf16-mixed", recompute="full", micro_batch=1, seq_len=4096, gpus=64,
                               grad_accum=16)  # fmt: skip
    assert any(x.startswith("--lr:") for x in r.ignored) and any(x.startswith("--num-layers:") for x in r.ignored)


def test_the_cli_estimate_equals_the_flags(tmp_path: Path) -> None:
    path = _file(tmp_path, ARGS)
    by_file = memcalc.estimate(model="llama-3-70b", **read_megatron(path, world_size=64, layers=80).arguments)
    by_flags = memcalc.estimate(model="llama-3-70b", gpus=64, stage=1, tp=4, pp=4, virtual_stages=4,
                                sequence_parallel=True, framework="megatron", recompute="full", micro_batch=1,
                                grad_accum=16, seq_len=4096)  # fmt: skip
    assert by_file.memory.per_gpu.total == by_flags.memory.per_gpu.total
    r = runner.invoke(app, ["estimate", "--model", "llama-3-70b", "--gpus", "64", "--megatron-args", str(path), "--json"])
    assert r.exit_code == 0, r.output
    assert memcalc.Estimate.model_validate_json(r.stdout).memory.per_gpu.total == by_flags.memory.per_gpu.total


@pytest.mark.parametrize("text, message", [
    ("--tensor-model-paralel-size 2 --seq-length 8", "--tensor-model-paralel-size: unknown option (did you mean "
                                                     "'--tensor-model-parallel-size'?)"),
    ("--zero-stage 3 --seq-length 8", "--zero-stage: unknown option"),
    ("--micro-batch-size two --seq-length 8", "'two' is not accepted"),
    ("--micro-batch-size", "--micro-batch-size: needs a value"),
    ("--recompute-method uniform --seq-length 8", "needs --recompute-granularity full"),
    ("--bf16 --fp16 --seq-length 8", "both given"),
    ("--micro-batch-size 1", "--seq-length: is missing"),
    ("--seq-length 8 --seq-length 16", "is given twice"),
    ("--tensor-model-parallel-size 2 --tp-comm-overlap --seq-length 8", "--tp-comm-overlap: needs --sequence-parallel"),
    ("--micro-batch-size 3 --global-batch-size 16 --seq-length 8", "is not micro-batch(3) x dp(8)"),
])  # fmt: skip
def test_bad_lists_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        read_megatron(_file(tmp_path, text), world_size=8)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_cli_refuses_an_unknown_option_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = _file(tmp_path, "--zero-stage 3\n--seq-length 8\n")
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--megatron-args", str(path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--zero-stage: unknown option" in r.stderr
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--megatron-args", str(path), "--deepspeed", "x.json"])
    assert r.exit_code == 2 and "cannot be combined" in r.stderr


def test_tp_comm_overlap_is_read_as_the_step_time_counts_it(tmp_path: Path) -> None:
    # Transformer Engine's userbuffers: the step time overlaps the TP collectives (memcalc.time.kernels); the
    # buffers it allocates outside PyTorch's allocator are said, not counted
    r = read_megatron(_file(tmp_path, ARGS + "--tp-comm-overlap\n"), world_size=64, layers=80)
    plain = read_megatron(_file(tmp_path, ARGS), world_size=64, layers=80)
    assert r.arguments == plain.arguments
    assert [n for n in r.notes if n.startswith("--tp-comm-overlap:") and "not counted" in n]
    one = read_megatron(_file(tmp_path, "--tp-comm-overlap --seq-length 8 --micro-batch-size 1\n"), world_size=8)
    assert any(x.startswith("--tp-comm-overlap: no tensor parallelism") for x in one.ignored)
