"""The paper accounting's verdict: the allocator's band, widened by the buffers a real step holds beyond its rows."""

import pytest

import memcalc
from memcalc.memory.allocator.allocator import GAP_FRACTION, GAP_HIGH, GAP_LOW
from memcalc.units import GiB

DDP_7B = {"model": "llama-2-7b", "ddp": True, "gpus": 2, "precision": "bf16", "seq_len": 2048, "micro_batch": 1,
          "gpu": "a100-80g"}
# fp16-mixed: MoE under DeepSpeed's fp16 has no traced step, so the default answers with the paper's accounting
MIXTRAL_Z3 = {"model": "mixtral", "stage": 3, "gpus": 32, "seq_len": 4096, "micro_batch": 1, "precision": "fp16-mixed",
              "attention": "flash", "gpu": "h100-sxm"}


def _band(r, uncounted: int) -> int:
    """The allocator's band for the rows but the overheads, plus what the paper's rows leave out."""
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    allocated = r.memory.per_gpu.total - rows["cuda_context"] - rows["allocator_reserve"]
    return min(GAP_HIGH, int(GAP_FRACTION * allocated)) + uncounted


def test_ddp_buckets_make_a_paper_fit_at_risk_as_the_realistic_accounting_finds():
    """Llama 2 7B in bf16 under DDP on two 80 GB cards: the paper's rows leave 10.67 GiB, less than DDP's gradient
    buckets (a second copy of the gradients, 12.55 GiB) alone; the realistic accounting, which counts them, finds
    the step at risk too. The buckets the band counts are the realistic accounting's row, byte for byte."""
    paper = memcalc.estimate(**DDP_7B, accounting="paper")
    real = memcalc.estimate(**DDP_7B)
    buckets = next(x.bytes for x in real.memory.per_gpu.rows if x.key == "gradient_buckets")
    assert buckets == 2 * real.model.parameters  # bf16 gradients
    fit = paper.memory.fit
    assert 0 < fit.headroom_bytes < buckets
    assert fit.verdict == "at-risk" and not fit.fits
    assert real.memory.fit.verdict != "fits"
    note = next(n for n in paper.notes if n.startswith("verdict (paper accounting)"))
    assert f"DDP gradient buckets {buckets / GiB:.2f} GiB" in note
    assert f"under {_band(paper, buckets) / GiB:.2f} GiB" in note


def test_sharded_parameters_count_the_gathered_layer_and_the_prefetched_one():
    """ZeRO-3 gathers a unit (a decoder layer) at a time and prefetches the next: two of Mixtral's largest layers
    in bf16 (its eight experts' weights included) sit beside the sharded states; the verdict moves from fits to
    at-risk exactly where the margin falls under the band, and to oom under the least measured gap."""
    r = memcalc.estimate(**MIXTRAL_Z3, accounting="paper")
    gathered = 2 * 2 * r.model.breakdown.largest_layer
    band = _band(r, gathered)
    margin = r.memory.fit.headroom_bytes
    assert r.memory.fit.verdict == "fits" and margin > band
    note = next(n for n in r.notes if n.startswith("verdict (paper accounting)"))
    assert f"gathered units: the layer computed and the next, prefetched {gathered / GiB:.2f} GiB" in note

    def at(reserve_bytes: int) -> str:
        got = memcalc.estimate(**MIXTRAL_Z3, accounting="paper", reserve_gib=reserve_bytes / GiB)
        assert got.memory.fit.headroom_bytes == pytest.approx(margin - reserve_bytes, abs=2)
        return got.memory.fit.verdict

    assert at(margin - band - 2**20) == "fits"
    assert at(margin - band + 2**20) == "at-risk"
    assert at(margin - GAP_LOW + 2**20) == "oom"


def test_default_fallback_and_named_paper_accounting_share_the_verdict():
    """Mixtral under DeepSpeed's fp16 has no traced step: the default answers with the paper's accounting, and its
    verdict is the same as under --accounting paper."""
    kw = dict(MIXTRAL_Z3, gpus=16)
    default, named = memcalc.estimate(**kw), memcalc.estimate(**kw, accounting="paper")
    assert default.accounting == "paper"
    assert default.memory.fit == named.memory.fit


def test_a_bare_count_has_only_the_allocator_band():
    """Without the shape no layer is known: the band is the allocator's alone, and ZeRO-3 states that fill the card
    but for less than that band are at risk."""
    r = memcalc.estimate(params=10e9, stage=3, gpus=2, gpu="a100-80g")  # 16 x 10e9 / 2 bytes of states
    note = next(n for n in r.notes if n.startswith("verdict (paper accounting)"))
    assert "gathered" not in note and r.memory.fit.verdict == "at-risk"
    assert 0 < r.memory.fit.headroom_bytes < _band(r, 0) == GAP_HIGH
    assert memcalc.estimate(params=8e9, stage=3, gpus=2, gpu="a100-80g").memory.fit.verdict == "fits"


def test_auto_micro_batch_under_the_paper_accounting_stops_before_the_band():
    """--micro-batch auto takes the largest micro-batch whose verdict is fits: the next one is at risk or worse."""
    kw = {"model": "llama-2-7b", "stage": 3, "gpus": 8, "seq_len": 2048, "precision": "bf16-mixed", "gpu": "a100-80g",
          "accounting": "paper"}
    best = memcalc.estimate(**kw, micro_batch="auto")
    b = best.training.micro_batch
    assert best.memory.fit.verdict == "fits"
    assert memcalc.estimate(**kw, micro_batch=b + 1).memory.fit.verdict in ("at-risk", "oom")


def test_the_deepspeed_estimator_keeps_its_own_comparison():
    """DeepSpeed's estimator is reproduced as DeepSpeed prints it: fits when its states fit, within the band too."""
    r = memcalc.estimate(params=9e9, stage=3, gpus=2, gpu="a100-80g", largest_layer_params=5e8,
                         accounting="deepspeed-estimator")
    assert r.memory.fit.verdict == "fits" and r.memory.fit.fits and r.memory.fit.headroom_bytes < GAP_HIGH


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_compare_marks_a_paper_row_at_risk(fmt):
    """Mixtral on 16 GPUs at 3,072 tokens: ZeRO-3 leaves 5.7 GiB, less than its band (the paper answers every row:
    Mixtral under DeepSpeed's fp16 has no traced step), ZeRO-3 with the optimizer on the host fits, DDP does not."""
    from typer.testing import CliRunner

    from memcalc.cli import app

    args = ["compare", "--model", "mixtral", "--seq-len", "3072", "--gpus", "16", "--precision", "fp16-mixed", "--strategies",
            "ddp,zero-3,zero-3+opt-cpu", "--format", fmt, "--verbose"]  # fmt: skip
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    cells = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.strip("│|").replace("│", "|").split("|")]
        if parts and parts[0] in ("DDP", "ZeRO-3", "ZeRO-3 + opt→cpu"):
            cells[parts[0]] = parts[7]
    assert cells == {"DDP": "no", "ZeRO-3": "risk", "ZeRO-3 + opt→cpu": "yes"}


def test_lora_gathers_the_frozen_base_as_stored_with_its_adapters():
    """Under LoRA the gathered layer is the frozen base in its stored form and the adapters beside it: bf16 base plus
    bf16 adapters, or under QLoRA the NF4-packed linears (half a byte per weight, plus their absmax) with the rest of
    the layer (norms) in bf16: a little over a quarter of the bf16 unit."""
    from memcalc.model import lora as lr

    kw = {"model": "llama-3-70b", "fsdp": "FULL_SHARD", "gpus": 8, "seq_len": 2048, "micro_batch": 1, "lora_rank": 16,
          "precision": "bf16-mixed", "accounting": "paper"}

    def gathered(r) -> float:
        note = next(n for n in r.notes if n.startswith("verdict (paper accounting)"))
        return float(note.split("prefetched ")[1].split(" GiB")[0])

    plain, nf4 = memcalc.estimate(**kw), memcalc.estimate(**kw, quantize="nf4")
    arch = plain.input.model.architecture
    adapters = lr.layer_lora(arch, plain.input.lora_plan).adapters
    assert gathered(plain) == round(2 * 2 * (plain.model.breakdown.largest_layer + adapters) / GiB, 2)
    assert 0.25 < gathered(nf4) / gathered(plain) < 0.3


def test_the_at_risk_line_names_what_the_paper_rows_leave_out():
    from typer.testing import CliRunner

    from memcalc.cli import app

    args = ["estimate", "--model", "llama-2-7b", "--ddp", "--gpus", "2", "--precision", "bf16", "--seq-len", "2048",
            "--micro-batch", "1", "--gpu", "a100-80g", "--accounting", "paper", "--verbose"]  # fmt: skip
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "! at risk: 68.48 GiB of 79.15 GiB usable" in text
    assert "within the allocator's variability and the buffers the paper's rows leave out" in text
    assert "verdict (paper accounting): at-risk, margin 10.67 GiB; at-risk under 20.35 GiB" in text
