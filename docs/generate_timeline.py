"""Regenerate the H100 comparison table of docs/timeline.md: ``python docs/generate_timeline.py``.

For every row of /work/shared/measurements/h100-single-gpu.md (transcribed below with its configuration), the
timeline's allocated peak (``memcalc.memory.timeline``, device="cuda", no explicit position ids, as the runs
called the model) against the measured ``max_memory_allocated``, and ``memcalc.memory.allocator.fit``'s verdict
against the run's status.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from memcalc.memory.allocator import fit
from memcalc.memory.timeline import timeline
from memcalc.model.hf_config import load_hf_config
from memcalc.units import GiB

CONFIGS = Path("/work/shared/measurements/configs")
CAPACITY = 85_017_493_504  # torch.cuda.get_device_properties().total_memory on the H100 measured
REGIME = {"A": "amp-bf16", "P": "bf16"}


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
    arch = load_hf_config(CONFIGS / row.model / "config.json")
    tl = timeline(arch, family="llama", regime=REGIME[row.regime], attention=row.attention, s=row.seq, b=row.batch,
                  recompute="full" if row.ckpt else "none", optimizer_impl="foreach", device="cuda",
                  position_ids=False, use_cache=False)  # the configs set use_cache: false
    peak = tl.peak
    largest = max(b for _, b in peak.parts if "gradient" in _ or "logit" in _ or "softmax" in _)
    f = fit(peak.live_bytes, CAPACITY, largest_request=largest)
    return Result(row, peak.live_bytes, peak.phase, f.verdict)


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
