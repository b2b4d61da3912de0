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


ROWS = (
    Row("llama-3.2-1b", "A", "sdpa", False, 4096, 4, "ok", 71.51),
    Row("llama-3.2-1b", "A", "sdpa", False, 2048, 4, "ok", 43.84),
    Row("llama-3.2-1b", "A", "sdpa", True, 4096, 8, "OOM in backward", 65.96),
    Row("llama-3.2-1b", "P", "sdpa", False, 4096, 8, "OOM in forward", 79.42),
    Row("llama-3.2-1b", "A", "eager", False, 1024, 4, "ok", 42.38),
    Row("tinyllama-1.1b", "A", "eager", False, 2048, 4, "OOM in forward", 77.94),
    Row("tinyllama-1.1b", "A", "sdpa", False, 2048, 8, "ok", 56.60),
    Row("tinyllama-1.1b", "A", "sdpa", False, 2048, 4, "ok", 35.44),
    Row("tinyllama-1.1b", "A", "sdpa", True, 4096, 8, "ok", 30.43),
    Row("tinyllama-1.1b", "A", "eager", True, 2048, 4, "ok", 24.64),
    Row("tinyllama-1.1b", "P", "sdpa", False, 4096, 4, "ok", 41.59),
    Row("tinyllama-1.1b", "P", "sdpa", True, 4096, 8, "ok", 21.18),
    Row("tinyllama-1.1b", "A", "sdpa", False, 1024, 1, "ok", 20.56),
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


def predict(row: Row) -> Result:
    r = memcalc.estimate(hf_config=str(CONFIGS / row.model / "config.json"), gpus=1, gpu="h100",
                         precision=PRECISION[row.regime], optimizer_impl="foreach",
                         attention="flash" if row.attention == "sdpa" else "eager",
                         recompute="full" if row.ckpt else "none", seq_len=row.seq, micro_batch=row.batch)
    assert r.accounting == "realistic" and r.memory.timeline is not None
    return Result(row, r.memory.per_gpu.peak_allocated, r.memory.timeline.peak_phase, r.memory.fit.verdict)


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


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
