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


NVIDIA_LIKE = """--use-mcore-models --num-layers 32 --hidden-size 4096 --seq-length 8192 --micro-batch-size 1
--global-batch-size 128 --bf16 --tensor-model-parallel-size 1 --use-distributed-optimizer
--rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0 --apply-layernorm-1p --init-method-std 0.0134
--lr 0.00015 --decoupled-lr 5.0e-4 --lr-decay-style cosine --train-samples 1953125000 --cross-entropy-loss-fusion
--calculate-per-token-loss --manual-gc --empty-unused-memory-level 1 --exit-duration-in-mins 235
--log-throughput --profile --profile-step-start 4 --ckpt-format torch_dist --distributed-timeout-minutes 60
--data-path a b --data-cache-path /tmp/c --tokenizer-type HuggingFaceTokenizer --num-workers 1
"""


def test_megatrons_own_options_are_read_past_with_why_and_others_are_one_line(tmp_path: Path) -> None:
    # Megatron-LM's vocabulary (core_v0.16.1 arguments.py): options of the logging, checkpointing, data, tokenizer,
    # learning-rate, profiling groups and the listed others change nothing a GPU holds; nothing is left unmodelled
    r = read_megatron(_file(tmp_path, NVIDIA_LIKE), world_size=8)
    assert not r.unmodelled and r.arguments.get("accounting") is None
    ignored = dict(x.split(": ", 1) for x in r.ignored)
    assert ignored["--log-throughput"] == "no effect on what a GPU holds (Megatron-LM's logging options)"
    assert ignored["--data-path"].endswith("(Megatron-LM's data and dataloader options)")
    assert "fp32 softmax saved" in ignored["--cross-entropy-loss-fusion"]
    assert ignored["--hidden-dropout"] == "no dropout, no mask saved"
    # a Megatron option that changes what a GPU holds and is not modelled: the paper accounting answers, and says it
    r = read_megatron(_file(tmp_path, NVIDIA_LIKE.replace("--bf16", "--bf16 --hidden-dropout 0.1")
                             .replace("--hidden-dropout 0.0", "")), world_size=8)
    assert r.arguments["accounting"] == "paper"
    assert [x.split(":")[0] for x in r.unmodelled] == ["--hidden-dropout"]
    # one that Megatron-LM does not have is a mistake
    with pytest.raises(InputError) as info:
        read_megatron(_file(tmp_path, NVIDIA_LIKE + "--log-throughput-please\n"), world_size=8)
    assert "--log-throughput-please: unknown option" in str(info.value) and "\n" not in str(info.value)


def test_the_vocabulary_is_megatrons_and_the_reader_knows_every_option_it_reads() -> None:
    from memcalc.configs.megatron import CHOICES, FLAGS, INT
    from memcalc.configs.megatron_unread import GROUP_OF, READ_PAST, ZERO_ONLY

    assert len(GROUP_OF) > 600
    read = {*INT, *FLAGS, *CHOICES, "--recompute-modules"}
    assert read <= set(GROUP_OF)  # memcalc reads no name Megatron-LM does not have
    assert set(READ_PAST) | set(ZERO_ONLY) <= set(GROUP_OF)


def test_grad_reduce_in_bf16_is_the_grad_buffers_dtype(tmp_path: Path) -> None:
    # megatron/training/arguments.py: --bf16 keeps main_grad in fp32 unless --grad-reduce-in-bf16; NVIDIA's example
    # sets it, and then reads whole with the realistic accounting
    r = read_megatron(_file(tmp_path, NVIDIA_LIKE.replace("--bf16", "--bf16 --grad-reduce-in-bf16")), world_size=8)
    assert r.arguments["grad_reduce_dtype"] == "bf16" and not r.unmodelled and "accounting" not in r.arguments
    e = memcalc.estimate(model="llama-3-8b", gpu="h100", **r.arguments)
    rows = {x.key: x for x in e.memory.per_gpu.rows}
    assert e.accounting == "realistic" and rows["gradients"].bytes == rows["parameters"].bytes  # 2 bytes each
    fp16 = read_megatron(_file(tmp_path, "--fp16 --grad-reduce-in-bf16 --seq-length 8\n"), world_size=8)
    assert "grad_reduce_dtype" not in fp16.arguments and any("--grad-reduce-in-bf16:" in x for x in fp16.ignored)


def test_bridge_overrides_apply_in_order_with_the_recipes_own_settings(tmp_path: Path) -> None:
    # mixed_precision.py: the FP8 current-scaling recipe sets fp8_param_gather=True; the Llama 3 performance
    # recipes set ddp.grad_reduce_in_fp32=False and mixed_precision.grad_reduce_in_fp32=False (one flag, given twice)
    text = ("mixed_precision=bf16_with_fp8_current_scaling_mixed ddp.use_distributed_optimizer=true "
            "ddp.grad_reduce_in_fp32=false mixed_precision.grad_reduce_in_fp32=False model.seq_length=8192\n")
    a = read_megatron(_file(tmp_path, text), world_size=8).arguments
    assert (a["float8"], a["float8_all_gather"], a["grad_reduce_dtype"]) == ("tensorwise", True, "bf16")
    # a later false turns a recipe's flag off; true leaves fp32 gradients
    a = read_megatron(_file(tmp_path, text + "mixed_precision.fp8_param_gather=false ddp.grad_reduce_in_fp32=true\n"),
                      world_size=8).arguments  # fmt: skip
    assert "float8_all_gather" not in a and "grad_reduce_dtype" not in a
    with pytest.raises(InputError, match="ddp.grad_reduce_in_fp32: 'maybe' is not accepted"):
        read_megatron(_file(tmp_path, "ddp.grad_reduce_in_fp32=maybe model.seq_length=8\n"))


def test_the_grad_reduce_dtype_is_megatrons_and_bf16_parameters_only() -> None:
    base = dict(model="llama-3-8b", seq_len=1024, gpu="h100")
    for kw, words in ((dict(grad_reduce_dtype="bf16"), "needs --framework megatron (got none)"),
                      (dict(grad_reduce_dtype="bf16", framework="megatron", precision="fp32"), "needs --precision "
                       "bf16-mixed (got fp32)"),
                      (dict(grad_reduce_dtype="fp16", framework="megatron"), "'fp16' is not accepted; accepted: "
                       "fp32, bf16")):  # fmt: skip
        with pytest.raises(InputError) as info:
            memcalc.build_input(**base, **kw)
        assert words in str(info.value), str(info.value)
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--seq-len", "1024", "--grad-reduce-dtype", "bf16"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--framework megatron" in r.stderr


def test_the_planner_searches_megatron_with_a_bf16_gradient_buffer() -> None:
    # held for every candidate and written into the plan's files; refused when other frameworks are searched
    r = memcalc.plan(model="llama-3-8b", seq_len=8192, global_batch=64, gpus=8, gpu="h100", framework="megatron",
                     top=1, grad_reduce_dtype="bf16")
    args = r.plans[0].estimate_args
    assert args[args.index("--grad-reduce-dtype") + 1] == "bf16"
    assert "--grad-reduce-in-bf16" in memcalc.config_text(r)["megatron_args.txt"]
    best = r.plans[0]
    same = dict(model="llama-3-8b", seq_len=8192, gpus=8, gpu="h100", framework="megatron", stage=1,
                tp=best.layout.tp, cp=best.layout.cp, sequence_parallel=best.layout.tp > 1,
                micro_batch=best.micro_batch, grad_accum=best.grad_accum, recompute=best.recompute)
    bf16 = memcalc.estimate(**same, grad_reduce_dtype="bf16").memory.per_gpu
    assert bf16.peak_reserved == best.memory.peak_reserved
    assert memcalc.estimate(**same).memory.per_gpu.peak_reserved > bf16.peak_reserved
    res = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--seq-len", "8192", "--global-batch", "64", "--gpus",
                              "8", "--gpu", "h100", "--grad-reduce-dtype", "bf16"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "give --framework megatron" in res.stderr
