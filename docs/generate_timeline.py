"""Regenerate the H100 comparison table of docs/timeline.md: ``python docs/generate_timeline.py``.

For every single-GPU training step measured on an H100 80GB (torch 2.11, transformers 5.17; Hugging Face models
from config, the loss inside the model, AdamW foreach; transcribed below with its configuration, the configs in
tests/data/h100/), what ``memcalc estimate --hf-config ... --gpus 1 --gpu h100 --json`` answers: the realistic
accounting's ``memory.per_gpu.peak_allocated`` against the measured ``max_memory_allocated``, and
``memory.fit.verdict`` against the run's status (OOM rows must be oom or at-risk).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import memcalc
from memcalc.memory.allocator.allocator import CONTEXT_HIGH
from memcalc.units import GiB

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100"
PRECISION = {"A": "amp-bf16", "P": "bf16"}
"""A: fp32 weights under torch.autocast(bfloat16), as Trainer(bf16=True) runs; P: pure bf16 weights."""


@dataclass(frozen=True)
class Row:
    model: str
    regime: str
    attention: str
    ckpt: bool
    seq: int
    batch: int
    status: str
    peak_gib: float | None
    """Measured peak allocated (GiB); for OOM rows, the 'needed ≥' figure."""
    reserved_gib: float | None = None
    """Measured ``max_memory_reserved`` (GiB) of ok rows."""
    step_ms: float | None = None
    """Measured wall time of the step (ms) of ok rows."""


ROWS = (
    Row("llama-3.2-1b", "A", "sdpa", False, 4096, 4, "ok", 71.51, 74.14, 416),
    Row("llama-3.2-1b", "A", "sdpa", False, 2048, 4, "ok", 43.84, 44.49, 224),
    Row("llama-3.2-1b", "A", "sdpa", True, 4096, 8, "OOM in backward", 65.96),
    Row("llama-3.2-1b", "P", "sdpa", False, 4096, 8, "OOM in forward", 79.42),
    Row("llama-3.2-1b", "A", "eager", False, 1024, 4, "ok", 42.38, 43.73, 199),
    Row("tinyllama-1.1b", "A", "eager", False, 2048, 4, "OOM in forward", 77.94),
    Row("tinyllama-1.1b", "A", "sdpa", False, 2048, 8, "ok", 56.60, 62.29, 389),
    Row("tinyllama-1.1b", "A", "sdpa", False, 2048, 4, "ok", 35.44, 37.34, 218),
    Row("tinyllama-1.1b", "A", "sdpa", True, 4096, 8, "ok", 30.43, 35.13, 969),
    Row("tinyllama-1.1b", "A", "eager", True, 2048, 4, "ok", 24.64, 26.60, 795),
    Row("tinyllama-1.1b", "P", "sdpa", False, 4096, 4, "ok", 41.59, 46.14, 358),
    Row("tinyllama-1.1b", "P", "sdpa", True, 4096, 8, "ok", 21.18, 25.12, 864),
    Row("tinyllama-1.1b", "A", "sdpa", False, 1024, 1, "ok", 20.56, 22.40, 89),
)  # fmt: skip


@dataclass(frozen=True)
class Result:
    row: Row
    predicted: int
    phase: str
    verdict: str

    @property
    def error(self) -> float | None:
        if self.row.status != "ok":
            return None
        return (self.predicted / GiB - self.row.peak_gib) / self.row.peak_gib


def estimate(row: Row) -> memcalc.Estimate:
    return memcalc.estimate(hf_config=str(CONFIGS / row.model / "config.json"), gpus=1, gpu="h100",
                            precision=PRECISION[row.regime], optimizer_impl="foreach",
                            attention="flash" if row.attention == "sdpa" else "eager",
                            recompute="full" if row.ckpt else "none", seq_len=row.seq, micro_batch=row.batch)


def predict(row: Row) -> Result:
    r = estimate(row)
    assert r.accounting == "realistic" and r.memory.timeline is not None
    return Result(row, r.memory.per_gpu.peak_allocated, r.memory.timeline.peak_phase, r.memory.fit.verdict)


def predict_step_s(row: Row) -> float:
    """memcalc's step time for the row (``time.step_s``), configured as ``predict`` configures its memory."""
    r = memcalc.estimate(hf_config=str(CONFIGS / row.model / "config.json"), gpus=1, gpu="h100",
                         precision=PRECISION[row.regime], optimizer_impl="foreach", attention=row.attention,
                         recompute="full" if row.ckpt else "none", seq_len=row.seq, micro_batch=row.batch)
    assert r.time is not None
    return r.time.step_s


def table() -> str:
    out = ["| model | regime | attention | ckpt | seq | batch | status | measured GiB | predicted GiB | error | "
           "peak phase | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    results = [predict(r) for r in ROWS]
    for x in results:
        r = x.row
        err = "" if x.error is None else f"{100 * x.error:+.1f} %"
        meas = f"{r.peak_gib:.2f}" if r.status == "ok" else f"(needed ≥ {r.peak_gib:.2f})"
        out.append(f"| {r.model} | {r.regime} | {r.attention} | {'on' if r.ckpt else 'off'} | {r.seq} | {r.batch} | "
                   f"{r.status} | {meas} | {x.predicted / GiB:.2f} | {err} | {x.phase} | {x.verdict} |")
    errs = [abs(x.error) for x in results if x.error is not None]
    out.append("")
    out.append(f"Median |error| over the {len(errs)} ok rows: {100 * statistics.median(errs):.1f} %; "
               f"largest: {100 * max(errs):.1f} %.")
    return "\n".join(out)


def reserved_table() -> str:
    """The estimate's ``peak_reserved`` (no trace: the allocated peak, the least gap and the cached blocks the peak
    cannot use, ``memcalc.memory.allocator.reserved``) against each ok row's measured ``max_memory_reserved``."""
    out = ["| model | regime | attention | ckpt | seq | batch | measured reserved GiB | memcalc peak_reserved GiB | "
           "error |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    errs = []
    for r in ROWS:
        if r.reserved_gib is None:
            continue
        got = estimate(r).memory.per_gpu.peak_reserved / GiB
        errs.append(abs(got - r.reserved_gib) / r.reserved_gib)
        out.append(f"| {r.model} | {r.regime} | {r.attention} | {'on' if r.ckpt else 'off'} | {r.seq} | {r.batch} | "
                   f"{r.reserved_gib:.2f} | {got:.2f} | {100 * (got - r.reserved_gib) / r.reserved_gib:+.1f} % |")
    out.append("")
    out.append(f"Median |error| over the {len(errs)} rows: {100 * statistics.median(errs):.1f} %; "
               f"largest: {100 * max(errs):.1f} %.")
    return "\n".join(out)


CAPACITY = 85_017_493_504 - CONTEXT_HIGH
"""The measured card's ``torch.cuda.get_device_properties().total_memory`` (bytes, as recorded with the runs) less
the widest CUDA context measured (``memcalc.memory.allocator.allocator.CONTEXT_HIGH``, 0.75 GiB)."""


def replay_table() -> str:
    """Every row traced on fake tensors (two steps, ``memcalc.validation.trace``) and its allocations replayed
    through the caching allocator (``memcalc.memory.allocator.caching``) into the card's memory: the reserved peak against
    the measured one, and whether a request failed. Needs torch and transformers."""
    import json

    from memcalc.validation.trace import trace_step

    out = ["| model | regime | attention | ckpt | seq | batch | status | measured reserved GiB | replayed reserved GiB "
           "| error | replayed verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    errs = []
    for r in ROWS:
        cfg = json.loads((CONFIGS / r.model / "config.json").read_text())
        t = trace_step(cfg, seq_len=r.seq, micro_batch=r.batch, precision=PRECISION[r.regime],
                       recompute="full" if r.ckpt else "none", attention=r.attention, capacity=CAPACITY)
        verdict = (f"oom: a {t.oom_request / GiB:.2f} GiB segment, {t.oom_free / GiB:.2f} GiB left"
                   if t.oom_request else "fits")
        meas, err = "", ""
        if r.reserved_gib is not None:
            e = (t.peak_reserved / GiB - r.reserved_gib) / r.reserved_gib
            errs.append(abs(e))
            meas, err = f"{r.reserved_gib:.2f}", f"{100 * e:+.1f} %"
        got = "" if t.oom_request else f"{t.peak_reserved / GiB:.2f}"
        out.append(f"| {r.model} | {r.regime} | {r.attention} | {'on' if r.ckpt else 'off'} | {r.seq} | {r.batch} | "
                   f"{r.status} | {meas} | {got} | {err} | {verdict} |")
    out.append("")
    out.append(f"Median |error| over the {len(errs)} ok rows: {100 * statistics.median(errs):.1f} %; "
               f"largest: {100 * max(errs):.1f} %.")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
    sys.stdout.write("\n" + reserved_table() + "\n")
    if "--replay" in sys.argv:
        sys.stdout.write("\n" + replay_table() + "\n")
