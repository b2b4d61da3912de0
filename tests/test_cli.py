"""The CLI through typer's CliRunner, and as a real process."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memcalc.cli import app
from memcalc.report.results import Comparison, Estimate

runner = CliRunner()
README = Path(__file__).resolve().parent.parent / "README.md"


def run(*args):
    return runner.invoke(app, list(args))


def test_mission_command_prints_tables_and_verdict():
    r = run("estimate", "--params", "175e9", "--stage", "3", "--gpus", "128", "--verbose")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for text in ("Memory per GPU", "master weights (fp32)", "fits", "Communication per optimizer step", "all-gather",
                 "reduce-scatter", "GiB", "ZeRO-3"):  # fmt: skip
        assert text in out
    # 16 x 175e9 / 128 = 21.875e9 bytes = 20.37 GiB of model states + 0.50 GiB CUDA context.
    assert "20.87" in out


def test_json_has_the_documented_keys_and_parses_back():
    r = run("estimate", "--params", "7.5B", "--stage", "2", "--gpus", "64", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    per_gpu = data["memory"]["per_gpu"]
    for key in ("parameters", "gradients", "optimizer_states", "total"):
        assert isinstance(per_gpu[key], int)
    assert isinstance(data["memory"]["per_node"]["cpu"], int) and isinstance(data["memory"]["per_node"]["nvme"], int)
    assert per_gpu["parameters"] + per_gpu["gradients"] + per_gpu["optimizer_states"] == 2 * 7_500_000_000 + 14 * 117_187_500
    comm = data["communication"]
    assert {"op", "phase", "group_size", "payload_bytes", "sent_bytes_per_gpu"} <= set(comm["collectives"][0])
    assert comm["payload_bytes"] == sum(c["payload_bytes"] for c in comm["collectives"])
    assert comm["sent_bytes_per_gpu"] == sum(c["sent_bytes_per_gpu"] for c in comm["collectives"])
    assert data["model"]["parameters"] == 7_500_000_000
    assert Estimate.model_validate_json(r.stdout).memory.per_gpu.total == per_gpu["total"]


def test_units_gb_reproduces_the_papers_figures():
    r = run("estimate", "--params", "7.5e9", "--stage", "0", "--gpus", "64", "--units", "gb", "--cuda-context-gib", "0")
    assert r.exit_code == 0
    assert "120.00" in r.stdout and "GB" in r.stdout and "GiB" not in r.stdout.split("links:")[0]


@pytest.mark.parametrize(
    "args",
    [
        ["--fsdp", "full_shard"], ["--fsdp", "1"], ["--fsdp", "HYBRID-SHARD"], ["--fsdp", "_hybrid_shard_zero2"],
        ["--ddp"], ["--strategy", "zero-3+opt-cpu+param-cpu"], ["--stage", "3", "--offload-optimizer", "nvme"],
        ["--stage", "2", "--offload-optimizer", "cpu", "--grad-accum", "4"], ["--gpu", "h100"], ["--gpu", "mi300x"],
        ["--precision", "fp16-mixed", "--optimizer", "adam-8bit"], ["--fsdp", "4", "--shard-group", "16"],
    ],
)  # fmt: skip
def test_estimate_accepts(args):
    r = run("estimate", "--params", "13B", "--gpus", "64", *args)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--params", "0"], "--params '0' must be positive"),
        (["--params", "-7e9"], "must be positive"),
        (["--params", "nan"], "--params 'nan'"),
        (["--params", "seven"], "--params 'seven' is not a number"),
        (["--params", "7b", "--stage", "5"], "--stage '5' is not a DeepSpeed ZeRO stage; accepted: 0, 1, 2, 3"),
        (["--params", "7b", "--fsdp", "FULL_SHRD"], "did you mean 'FULL_SHARD'"),
        (["--params", "7b", "--gpu", "a100-81g"], "did you mean 'a100-80g'"),
        (["--params", "7b", "--gpus", "12"], "--gpus 12 is not a multiple of --gpus-per-node 8"),
        (["--params", "7b", "--gpus", "0"], "--gpus 0 must be a whole number of 1 or more"),
        (["--params", "7b", "--stage", "2", "--offload-optimizer", "nvme"], "NVMe needs --stage 3"),
        (["--params", "7b", "--stage", "1", "--offload-params", "cpu"], "parameter offload is ZeRO-3 only"),
        (["--params", "7b", "--stage", "3", "--fsdp", "FULL_SHARD"], "--stage and --fsdp cannot be combined"),
        (["--params", "7b", "--precision", "fp8"], "unknown precision 'fp8'"),
        (["--params", "7b", "--optimizer", "adamm"], "did you mean 'adamw'"),
        (["--params", "7b", "--units", "mb"], "accepted: gib, gb"),
        (["--params", "7b", "--offload-optimizer", "disk", "--stage", "3"], "accepted: none, cpu, nvme"),
        (["--params", "7b", "--bogus"], "No such option: --bogus"),
        (["--params"], "requires an argument"),
        (["--gpus", "8"], "give the model size (--params 7B) or its shape"),
        (["--params", "7b", "--gpus", "x"], "--gpus"),
        (["--model", "gpt2", "--stage", "3", "--accounting", "implementation", "--max-reuse-distance", "far"],
         "--max-reuse-distance 'far' is not accepted; give a count of elements, 0 or more"),
        (["--model", "gpt2", "--stage", "2", "--accounting", "implementation", "--prefetch-bucket-size", "0"],
         "--prefetch-bucket-size: DeepSpeed ZeRO-3 settings, used only with --stage 3"),
        (["--model", "gpt2", "--stage", "3", "--accounting", "implementation", "--zero3-step", "2"],
         "--zero3-step '2' is not accepted; accepted: steady, first"),
        (["--model", "gpt2", "--fsdp", "1", "--min-num-params", "1e6"], "--min-num-params is FSDP1's"),
        # an input model's field is named as the flag that sets it
        (["--params", "7b", "--price-per-gpu-hour", "-3"], "--price-per-gpu-hour -3.0 is out of bounds; accepted: "
                                                           "at least 0"),
        (["--params", "7b", "--network-efficiency", "5"], "--network-efficiency 5.0 is out of bounds"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expected):
    r = run("estimate", *args)
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memcalc: error: ")
    assert expected in lines[0]
    assert "Traceback" not in r.output


def test_compare_shows_every_strategy():
    r = run("compare", "--params", "7e9", "--gpus", "64")
    assert r.exit_code == 0, r.output
    for label in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-2 + opt→cpu", "ZeRO-3 + opt→cpu", "FSDP FULL_SHARD",
                  "FSDP SHARD_GRAD_OP", "FSDP NO_SHARD", "FSDP HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):  # fmt: skip
        assert label in r.stdout
    assert "host RAM/node" in r.stdout and "sent/step" in r.stdout


def test_compare_subset_and_json():
    r = run("compare", "--params", "7e9", "--gpus", "64", "--strategies", "zero-2,zero-3,FULL_SHARD+offload", "--json")
    assert r.exit_code == 0, r.output
    c = Comparison.model_validate_json(r.stdout)
    assert [e.strategy.name for e in c.estimates] == ["zero-2", "zero-3", "FULL_SHARD"]
    assert c.estimates[2].strategy.offload_params == "cpu"
    assert c.estimates[1].memory.per_gpu.total - c.estimates[1].memory.per_gpu.cuda_context == 16 * 7_000_000_000 // 64


def test_compare_bad_strategy_is_one_line():
    r = run("compare", "--params", "7e9", "--gpus", "64", "--strategies", "zero-2,zero4")
    assert r.exit_code == 2 and "unknown strategy 'zero4'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_listing_commands():
    g = run("gpus")
    assert g.exit_code == 0 and "a100-sxm-80gb" in g.stdout and "mi300x" in g.stdout
    s = run("strategies")
    assert s.exit_code == 0 and "_HYBRID_SHARD_ZERO2" in s.stdout and "zero-3" in s.stdout


def test_help_has_examples():
    for cmd in ("estimate", "compare"):
        r = run(cmd, "--help")
        assert r.exit_code == 0 and f"memcalc {cmd} --params" in r.stdout


def test_python_dash_m():
    p = subprocess.run([sys.executable, "-m", "memcalc", "estimate", "--params", "7e9", "--stage", "3", "--gpus", "8",
                        "--json"], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["memory"]["per_gpu"]["parameters"] == 2 * 7_000_000_000 // 8
    bad = subprocess.run([sys.executable, "-m", "memcalc", "estimate", "--params", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def _readme_block(marker):
    text = README.read_text()
    block = text[text.index(f"<!-- {marker} -->"):]
    return block.split("```bash\n", 1)[1].split("\n```", 1)[0].strip()


def test_readme_main_command_runs():
    main = _readme_block("main-command")
    assert main.endswith("&& memcalc estimate --params 175e9 --stage 3 --gpus 128")
    mission = main.rsplit("&& ", 1)[1].split()
    r = run(*mission[1:], "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["memory"]["per_gpu"]["optimizer_states"] == 12 * 175_000_000_000 // 128
    assert data["memory"]["per_gpu"]["total"] == 16 * 175_000_000_000 // 128 + 2**29  # + CUDA context row


def test_every_readme_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    examples = [line.split("  #")[0].strip() for line in lines if line.startswith("memcalc ")]
    assert len(examples) >= 8
    monkeypatch.chdir(tmp_path)  # pictures the examples write land here; the checkout's sample files are resolved
    for command in examples:
        if command.startswith("memcalc trace") and not _has("torch", "transformers"):
            continue
        if command.startswith("memcalc plot") and not _has("matplotlib"):
            continue
        if "--accelerate-config" in command and not _has("yaml"):
            continue
        args = [str(README.parent / a) if a.startswith("tests/") else a for a in command.split()[1:]]
        r = run(*args)
        assert r.exit_code == 0, (command, r.output)


def _has(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def test_readme_test_command_is_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert _readme_block("test-command") in ci or "test-command" in ci


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "10"], "--heads 3 does not divide --hidden 100"),
        (["--model", "gpt2", "--gpus", "8", "--tp", "8"], "--tp 8 does not divide --heads 12"),
        (["--model", "llama-2-7b", "--kv-heads", "5"], "--kv-heads 5 does not divide --heads 32"),
        (["--model", "llama-2-7b", "--gpus", "128", "--tp", "8", "--pp", "3"], "tp(8) * pp(3) * cp(1) = 24 does not divide gpus(128)"),
        (["--model", "lama-2-7b"], "did you mean 'llama-2-7b'"),
        (["--model", "llama-2-7b", "--params", "7b"], "not both"),
        (["--layers", "32"], "a model shape needs --hidden, --heads, --vocab too"),
        (["--params", "7b", "--seq-len", "2048"], "--seq-len needs the model's shape"),
        (["--model", "llama-2-7b", "--seq-len", "2048", "--recompute", "some"], "accepted: none, selective, full"),
        (["--model", "llama-2-7b", "--seq-len", "2048", "--micro-batch", "0"], "--micro-batch 0 must be a whole number"),
        (["--hf-config", "/nonexistent/config.json"], "does not exist"),
    ],
)  # fmt: skip
def test_bad_shapes_and_layouts_are_one_line_and_exit_2(args, expected):
    r = run("estimate", *args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in r.output


def test_model_flags_and_json_per_stage():
    r = run("estimate", "--model", "llama-2-7b", "--gpus", "16", "--pp", "2", "--tp", "2", "--seq-len", "4096",
            "--micro-batch", "2", "--grad-accum", "4", "--stage", "1", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["model"]["parameters"] == 6_738_415_616 and d["model"]["breakdown"]["per_layer"] == 202_383_360
    assert isinstance(d["memory"]["per_gpu"]["activations"], int) and d["memory"]["per_gpu"]["activations"] > 0
    assert [s["stage"] for s in d["memory"]["stages"]] == [0, 1]
    t = d["training"]
    assert (t["dp"], t["tp"], t["pp"], t["global_batch"], t["tokens_per_step"]) == (4, 2, 2, 32, 32 * 4096)
    groups = {c["group"] for c in d["communication"]["collectives"]}
    assert {"data-parallel", "tensor-parallel", "pipeline"} <= groups


def test_models_command_lists_exact_counts():
    r = run("models")
    assert r.exit_code == 0 and "6,738,415,616" in r.stdout and "mixtral-8x7b" in r.stdout


def test_validate_without_torch_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    r = run("validate")
    assert r.exit_code == 2
    assert r.stderr.strip() == ("memcalc: error: memcalc validate needs torch: pip install torch==2.13.0 '.[validate]' "
                                "(from this checkout)")  # never the unrelated package named memcalc on PyPI


def test_trace_refuses_a_bad_config_value_in_one_line(tmp_path) -> None:
    # trace hands the config to transformers; a bad value is caught first, as estimate catches it (was a traceback)
    pytest.importorskip("transformers")
    cfg = json.loads((Path(__file__).parent / "data" / "small-llama-config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg | {"num_attention_heads": 0}))
    res = CliRunner().invoke(app, ["trace", "--hf-config", str(path), "--seq-len", "16"])
    assert res.exit_code == 2 and "num_attention_heads 0 is out of range" in res.stderr, res.output


def test_testing_page_names_every_test_file_that_skips_without_deepspeed_torchtitan_or_bitsandbytes():
    root = README.parent
    marks = ('importorskip("deepspeed")', "skipif(not suite.deepspeed_available()", 'skip("torchtitan is not installed")',
             'importorskip("bitsandbytes')  # fmt: skip
    files = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py")
                   if any(m in p.read_text() for m in marks) and p.name != "test_cli.py")  # fmt: skip
    text = (root / "docs" / "testing.md").read_text()  # the README links to it for what the tests need and skip
    assert "docs/testing.md" in README.read_text()
    assert files == ["tests/test_compile.py", "tests/test_configs.py", "tests/test_deepspeed_estimator.py",
                     "tests/test_lora.py", "tests/test_torchtitan_code.py", "tests/validation/test_deepspeed_timeline.py",
                     "tests/validation/test_frameworks.py", "tests/validation/test_write_deepspeed.py"]  # fmt: skip
    assert all(f"`{f}" in text for f in files), [f for f in files if f"`{f}" not in text]
    assert 'addopts = "-ra --durations=15"' in (root / "pyproject.toml").read_text()
