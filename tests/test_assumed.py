"""What a config file leaves to the training script is shown where the answer is read, with the flag that gives
yours; hints name flags; the output echoes what was asked (--attention, --units)."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memcalc.cli import app
from memcalc.cli.configs import as_flags
from memcalc.configs import read_accelerate, read_deepspeed, read_torchtitan
from memcalc.errors import InputError

DATA = Path(__file__).parent / "data" / "configs"
HF_ZERO3 = DATA / "deepspeed" / "hf_ds_config_zero3_bf16.json"  # micro-batch, accumulation and bf16 all "auto"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_readers_list_what_they_assumed():
    r = read_deepspeed(HF_ZERO3, world_size=8, seq_len=2048, hidden=4096)
    assert r.assumed == [
        "micro-batch 8, from train_micro_batch_size_per_gpu 'auto': the Trainer's default; pass micro_batch=",
        "gradient accumulation 1, from gradient_accumulation_steps 'auto': the Trainer's default; pass grad_accum=",
        "precision fp32, from bfloat16.enabled 'auto': the Trainer's default without its fp16/bf16 arguments; "
        "pass precision="]
    assert (r.arguments["micro_batch"], r.arguments["grad_accum"], r.arguments["precision"]) == (8, 1, "fp32")
    given = read_deepspeed(HF_ZERO3, world_size=8, seq_len=2048, micro_batch=2, grad_accum=4, bf16=True)
    assert given.assumed == [] and (given.arguments["micro_batch"], given.arguments["grad_accum"]) == (2, 4)
    # without --seq-len the micro-batch counts nothing: a note, not an assumption
    bare = read_deepspeed(HF_ZERO3, world_size=8)
    assert not any(a.startswith("micro-batch") for a in bare.assumed)
    assert any("'auto' taken as the Trainer's default 8" in n for n in bare.notes)


def test_accelerate_assumes_the_micro_batch_and_fp32(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    r = read_accelerate(path, seq_len=2048)
    assert r.assumed == [
        "precision fp32, from mixed_precision not set: accelerate's default unless accelerate launch "
        "--mixed_precision says otherwise; pass precision=",
        "micro-batch 1, memcalc's default: the script's dataloader batch size is not in the file; pass micro_batch="]
    assert r.arguments["precision"] == "fp32"


def test_the_header_shows_the_assumed_values_with_their_flags():
    res = run("estimate", "--model", "llama-2-7b", "--deepspeed", str(HF_ZERO3), "--seq-len", "2048", "--gpus", "8")
    assert res.exit_code == 0, res.output
    head = res.stdout.splitlines()[:8]
    assert "assumed: micro-batch 8, from train_micro_batch_size_per_gpu 'auto': the Trainer's default; give --micro-batch" in head
    assert ("assumed: gradient accumulation 1, from gradient_accumulation_steps 'auto': the Trainer's default; "
            "give --grad-accum") in head  # fmt: skip
    assert any(line.startswith("assumed: precision fp32, from bfloat16.enabled 'auto'") and
               line.endswith("give --precision") for line in head)  # fmt: skip
    assert "micro-batch 8 x 1 micro-batches" in res.stdout and " · fp32 · " in res.stdout
    assert "assumed" not in res.stderr  # said once, where the answer is read
    typed = run("estimate", "--model", "llama-2-7b", "--deepspeed", str(HF_ZERO3), "--seq-len", "2048", "--gpus", "8",
                "--micro-batch", "2", "--precision", "bf16-mixed")  # fmt: skip
    assert typed.exit_code == 0, typed.output
    assert [x for x in typed.stdout.splitlines() if x.startswith("assumed:")] == [
        "assumed: gradient accumulation 1, from gradient_accumulation_steps 'auto': the Trainer's default; give --grad-accum"]
    assert "micro-batch 2 x 1 micro-batches" in typed.stdout


def test_json_and_markdown_carry_the_assumed_values_csv_on_stderr():
    args = ["estimate", "--model", "llama-2-7b", "--deepspeed", str(HF_ZERO3), "--seq-len", "2048", "--gpus", "8"]
    d = json.loads(run(*args, "--json").stdout)
    assert d["assumed"][0].endswith("give --micro-batch") and len(d["assumed"]) == 3
    md = run(*args, "--format", "markdown").stdout.splitlines()
    assert md[2].startswith("layout: dp 8 · seq 2048 x micro-batch 8 x 1 micro-batches · sdpa attention · ")
    assert md[4] == "- assumed: micro-batch 8, from train_micro_batch_size_per_gpu 'auto': the Trainer's default; give --micro-batch"
    csv = run(*args, "--format", "csv")
    assert csv.exit_code == 0 and "assumed" not in csv.stdout.splitlines()[0]
    # CSV rows are figures, with no header lines: the assumptions are said on stderr with the file's notes
    assert "memcalc: assumed: micro-batch 8, from train_micro_batch_size_per_gpu 'auto'" in csv.stderr


def test_no_hint_names_an_api_keyword():
    keyword = re.compile(r"\b[a-z0-9_]+=")
    readers = [(read_deepspeed, sorted((DATA / "deepspeed").glob("*.json"))),
               (read_accelerate, sorted((DATA / "accelerate").glob("*.yaml")))]  # fmt: skip
    seen = 0
    for reader, files in readers:
        for f in files:
            for kw in ({}, {"seq_len": 2048}):
                try:
                    r = reader(f, **kw)
                except InputError:
                    continue
                for text in r.notes + r.assumed + r.unmodelled:
                    seen += 1
                    assert not keyword.search(as_flags(text)), (f.name, as_flags(text))
    for f in sorted((DATA / "torchtitan").glob("*.toml")):
        for text in read_torchtitan(f, world_size=8).notes:
            assert not keyword.search(as_flags(text)), (f.name, as_flags(text))
    assert seen > 100
    assert as_flags("DDP over 8 GPUs (pass world_size=1 for one)") == "DDP over 8 GPUs (give --gpus 1 for one)"
    assert as_flags("pass grad_accum= for yours") == "give --grad-accum for yours"


@pytest.mark.parametrize("args, line", [
    (["--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "10"], "--heads 3 does not divide --hidden 100"),
    (["--model", "llama-2-7b", "--kv-heads", "5"], "--kv-heads 5 does not divide --heads 32"),
])  # fmt: skip
def test_shape_errors_name_flags(args, line):
    res = run("estimate", *args)
    assert res.exit_code == 2 and line in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_flash_attention_is_reported_as_flash():
    res = run("estimate", "--model", "llama-2-7b", "--stage", "3", "--gpus", "8", "--seq-len", "2048",
              "--micro-batch", "1", "--attention", "flash", "--json")  # fmt: skip
    d = json.loads(res.stdout)
    assert d["accounting"] == "realistic"
    assert any("(bf16-mixed, flash (SDPA's flash kernel) attention, none recompute" in n for n in d["notes"])
    table = run("estimate", "--model", "llama-2-7b", "--stage", "3", "--gpus", "8", "--seq-len", "2048",
                "--micro-batch", "1", "--attention", "flash").stdout.splitlines()  # fmt: skip
    assert table[1] == ("layout: dp 8 · seq 2048 x micro-batch 1 x 1 micro-batches · flash attention · global batch 8 = "
                        "16,384 tokens per step")  # fmt: skip
    assert not any("sdpa attention" in n for n in d["notes"])


def test_units_gb_reach_the_notes_and_the_formulas():
    for accounting in ("realistic", "paper"):
        args = ["estimate", "--model", "llama-2-7b", "--stage", "3", "--gpus", "8", "--seq-len", "2048",
                "--micro-batch", "1", "--accounting", accounting, "--units", "gb"]  # fmt: skip
        for fmt in ("table", "markdown", "csv"):
            out = run(*args, "--format", fmt).stdout
            assert "GB" in out and not re.search(r"\d GiB\b", out), (accounting, fmt)
    paper = run(*args[:-4], "--accounting", "paper", "--units", "gb", "--json")
    margin = json.loads(paper.stdout)["memory"]["fit"]["headroom_bytes"]
    md = run(*args[:-4], "--accounting", "paper", "--units", "gb", "--format", "markdown").stdout
    assert f"margin {margin / 10**9:,.2f} GB" in md  # the verdict note's margin, in GB


def test_the_step_time_table_has_one_unit():
    out = run("estimate", "--model", "llama-2-7b", "--deepspeed", str(HF_ZERO3), "--seq-len", "2048",
              "--gpus", "8", "--verbose").stdout  # a 7 s step with a 9 ms exposed communication
    table = out[out.index("Step time on"):]
    table = table[:table.index("sum of the parts")]
    assert "Step time on dgx-a100 (seconds)" in table and " ms " not in table
    assert re.search(r"communication: data-parallel\s+│\s+0\.009 │", table)


def test_a_preset_files_error_names_its_key(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('name = "m"\nlayers = 0\nhidden = 512\nheads = 8\nvocab = 1000\n')
    res = run("estimate", "--model", str(path))
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"memcalc: error: model preset {str(path)!r}: layers 0 is out of bounds; accepted: "
                                  "more than 0 and at most 10,000")  # fmt: skip
