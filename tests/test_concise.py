"""The first ten minutes: what a newcomer sees first (the concise estimate, notebook display, ``dir(memcalc)``)."""

from __future__ import annotations

import json
import re

import pytest

from typer.testing import CliRunner

import memcalc
from memcalc.cli import app


def test_dir_lists_the_public_api_and_nothing_else():
    memcalc.estimate  # noqa: B018 (a lazy import puts memcalc.api and others in the module's namespace)
    assert dir(memcalc) == sorted(memcalc.__all__)
    assert "estimate" in dir(memcalc) and "InputError" in dir(memcalc)
    assert not {"api", "TYPE_CHECKING", "Any", "annotations", "_EXPORTS"} & set(dir(memcalc))
    for name in memcalc.__all__:  # every name listed resolves
        assert getattr(memcalc, name) is not None


def test_notebook_html_is_a_fragment_no_wider_than_the_notebook():
    for result in (memcalc.estimate(model="llama-3-8b", seq_len=2048, precision="amp-bf16"),
                   memcalc.compare(params=7e9, gpus=8, strategies=["zero-2", "zero-3"])):
        page = result._repr_html_()
        assert page == result._repr_mimebundle_()["text/html"]
        assert not re.search(r"<(!DOCTYPE|html|head|body|style)\b", page, re.IGNORECASE), page[:200]
        outer = re.match(r'<div class="memcalc" style="([^"]*)">', page)
        assert outer is not None and "max-width:100%" in outer[1] and "overflow:auto" in outer[1]
        assert page.endswith("</div>")
        assert not re.search(r"width:\s*\d+(px|em|ch)", page)  # no fixed width anywhere
        assert not re.search(r"background", page)  # the notebook's own background, light or dark
        total = f"{result.estimates[0].memory.per_gpu.total / 2**30:,.2f}" if hasattr(result, "estimates") else \
            f"{result.memory.per_gpu.total / 2**30:,.2f}"
        assert total in re.sub(r"<[^>]+>", "", page)


# The default precision: each framework's own, said as assumed.

runner = CliRunner()
GIB = 2**30
NEWCOMER = ("estimate", "--model", "llama-3-8b", "--seq-len", "8192", "--gpus", "8", "--fsdp", "FULL_SHARD",
            "--framework", "torchtitan")  # a realistic 8B run: the default output is read at a glance


def run(*args, columns: int | None = 100):
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)} if columns else {"COLUMNS": None})


@pytest.mark.parametrize(("flags", "precision", "why"), [
    ({}, "amp-bf16", "Trainer(bf16=True)"),  # plain DDP, no framework: what a Hugging Face run does
    ({"framework": "hf", "gpus": 8}, "amp-bf16", "Trainer(bf16=True)"),
    ({"framework": "torchtitan", "fsdp": "FULL_SHARD", "gpus": 8}, "bf16-mixed", "torchtitan's FSDP2"),
    ({"fsdp": "FULL_SHARD", "gpus": 8}, "bf16-mixed", "FSDP's mixed precision"),
    ({"stage": 3, "gpus": 8}, "bf16-mixed", "DeepSpeed's bf16"),
    ({"framework": "deepspeed", "gpus": 8}, "bf16-mixed", "DeepSpeed's bf16"),
    ({"framework": "megatron", "tp": 2, "gpus": 8}, "bf16-mixed", "Megatron-LM's --bf16"),
    ({"framework": "torchtune"}, "bf16", "torchtune's dtype: bf16"),
])  # fmt: skip
def test_default_precision_is_the_frameworks_own(flags, precision, why):
    r = memcalc.estimate(model="llama-2-7b", seq_len=4096, **flags)
    assert r.input.precision.name == precision
    (said,) = r.assumed
    assert said.startswith(f"precision {precision}: ") and why in said and said.endswith("pass precision=")
    given = memcalc.estimate(model="llama-2-7b", seq_len=4096, precision=precision, **flags)
    assert given.assumed == [] and given.memory == r.memory  # the same answer as typing it


def test_torchtitan_fsdp2_reduces_gradients_in_fp32_by_default():
    r = memcalc.estimate(model="llama-3-8b", seq_len=2048, gpus=8, fsdp="FULL_SHARD", framework="torchtitan")
    assert r.input.framework.fsdp_version == 2
    grads = [c for c in r.communication.collectives if c.op == "reduce-scatter"]
    assert grads and {c.dtype for c in grads} == {"fp32"}  # MixedPrecisionPolicy(reduce_dtype=float32)


def test_the_default_7b_answer_is_the_realistic_one():
    r = memcalc.estimate(model="llama-2-7b", seq_len=4096)
    assert (r.accounting, r.input.precision.name) == ("realistic", "amp-bf16")
    psi = r.model.parameters
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    # autocast over fp32 weights: 4 + 4 + 2 x 4 bytes per parameter (DOMAIN §10), no master copy; AdamW keeps one
    # fp32 step count per parameter tensor (32 layers x 9 tensors + embedding, final norm, head)
    assert (rows["parameters"], rows["gradients"]) == (4 * psi, 4 * psi)
    assert rows["optimizer_moments"] == 8 * psi + 4 * (32 * 9 + 3)
    assert "master_weights" not in rows
    paper = memcalc.estimate(model="llama-2-7b", seq_len=4096, accounting="paper", precision="bf16-mixed")
    assert paper.accounting == "paper" and paper.memory.per_gpu.master_weights == 4 * psi  # the 16Ψ view on demand
    out = run("estimate", "--model", "llama-2-7b", "--seq-len", "4096")
    assert out.exit_code == 0, out.output
    assert "accounting: realistic" in out.stdout
    assert ("assumed: precision amp-bf16: a Hugging Face Trainer(bf16=True) or accelerate run (torch.autocast over "
            "fp32 weights); give --precision") in " ".join(out.stdout.split())


def test_config_files_keep_their_precision(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}')  # no bf16: fp32
    r = run("estimate", "--model", "llama-2-7b", "--seq-len", "2048", "--gpus", "8", "--deepspeed", str(ds), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["input"]["precision"]["name"] == "fp32" and not any("precision" in a for a in got["assumed"])


# Concise by default, everything under --verbose.


def test_the_default_output_is_concise():
    r = run(*NEWCOMER)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, r.stdout
    est = memcalc.estimate(model="llama-3-8b", seq_len=8192, gpus=8, fsdp="FULL_SHARD", framework="torchtitan")
    g = est.memory.per_gpu
    text = r.stdout
    assert f"{g.total / GIB:,.2f}" in text and "✓ fits" in text  # the verdict
    largest = max(g.rows, key=lambda x: x.bytes)
    assert re.search(rf"│ {re.escape(largest.label)} +│ +{largest.bytes / GIB:,.2f} │", text)
    assert f"{est.time.step_s:.3f} s" in text  # the step time
    assert f"{est.communication.sent_bytes_per_gpu / GIB:,.2f} GiB sent" in text  # the communication total
    assert "--verbose for all rows and notes" in text
    assert "formula · source" not in text and "Communication per optimizer step" not in text
    small = [x for x in g.rows if x.bytes < 0.02 * g.total]
    assert re.search(rf"│ {len(small)} smaller rows +│ +{sum(x.bytes for x in small) / GIB:,.2f} │", text)


def test_verbose_has_the_full_tables_and_every_note():
    r = run(*NEWCOMER, "--verbose")
    assert r.exit_code == 0, r.output
    est = memcalc.estimate(model="llama-3-8b", seq_len=8192, gpus=8, fsdp="FULL_SHARD", framework="torchtitan")
    text = " ".join(r.stdout.split())
    for title in ("Memory per GPU", "formula · source", "Communication per optimizer step, per GPU", "Step time on"):
        assert title in text
    for row in est.memory.per_gpu.rows:
        assert row.label.split(" (")[0] in text
    for note in est.notes:
        assert " ".join(f"note: {note}".split())[:60] in text
    assert "--verbose for all rows" not in text
    assert run(*NEWCOMER, "-v").stdout == r.stdout


def test_the_concise_view_keeps_the_notes_that_change_the_answer():
    r = run("estimate", "--params", "7e9", "--gpus", "64", "--stage", "3")
    text = " ".join(r.stdout.split())
    assert "note: activations are not counted" in text and "note: step time: a bare parameter count" in text
    assert "parameter sharding gathers one wrapped unit" not in text  # how it was modelled: --verbose


def test_compare_is_concise_too():
    args = ("compare", "--model", "llama-2-7b", "--seq-len", "4096", "--gpus", "8")
    r = run(*args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) <= 40 and "--verbose for all rows and notes" in r.stdout
    assert ("assumed: each strategy's own precision: amp-bf16 for DDP, bf16-mixed for the others; --precision sets "
            "one for all") in " ".join(r.stdout.split())
    full = run(*args, "--verbose")
    assert "optimizer" in full.stdout and "optimizer" not in r.stdout.split("least memory")[0]
    cmp = memcalc.compare(model="llama-2-7b", seq_len=4096, gpus=8)
    for e in cmp.estimates:  # every strategy's total is still there
        assert f"{e.memory.per_gpu.total / GIB:,.2f}" in r.stdout


@pytest.mark.parametrize("verbose", [(), ("--verbose",)])
def test_piped_output_breaks_no_word(verbose):
    # Piped (no terminal, no COLUMNS): lines break only between words; every word is one of the unwrapped output's.
    piped = run(*NEWCOMER, *verbose, columns=None)
    wide = run(*NEWCOMER, *verbose, columns=10_000)
    assert piped.exit_code == wide.exit_code == 0
    words = set(wide.stdout.split())
    broken = [w for w in piped.stdout.split() if w not in words and not re.fullmatch("[\u2500-\u257f]+", w)]
    assert not broken, broken
    assert len(piped.stdout.splitlines()) > 5  # not vacuous


def test_the_paper_accounting_keeps_the_papers_precision():
    r = memcalc.estimate(params=7.5e9, gpus=64, stage=3, accounting="paper")
    assert r.input.precision.name == "bf16-mixed" and "ZeRO paper" in r.assumed[0]
    g = r.memory.per_gpu  # ZeRO §5 Figure 1: (2 + 2 + 12) x 7.5e9 / 64 bytes of model states
    assert g.parameters + g.gradients + g.optimizer_states == 16 * 7_500_000_000 // 64
