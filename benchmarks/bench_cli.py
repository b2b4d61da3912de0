"""Wall time of memcalc's commands as ratios to the import floor measured in the same run.

    python benchmarks/bench_cli.py [--runs 15] [--memcalc PATH]

The floor is ``python -c "import typer, rich.table, pydantic"``: what any typer + rich + pydantic command pays
before it does anything. Each command is started as a separate process, the way a user starts it, interleaved
with the floor so that a noisy machine slows both alike; the figure is the ratio of medians. Target: estimate
(tables and --json, a bare count and an 8B Hugging Face config with activations), compare and --help within 1.5x
the floor. ``import pydantic`` alone is lazy: what any command pays to validate one pydantic model on top of the
floor (importing ``BaseModel``, building its first validator: pydantic's schema machinery and its plugin lookup,
which imports importlib.metadata) is shown beside it. Figures only: it never fails on timing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "tests" / "data" / "llama-3-8b-config.json"


def once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    dt = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.decode().strip()}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--memcalc", default=shutil.which("memcalc") or "memcalc", help="the memcalc executable")
    args = ap.parse_args()
    floor = [sys.executable, "-c", "import typer, rich.table, pydantic"]
    models = [sys.executable, "-c", "import typer, rich.table, pydantic\nfrom pydantic import BaseModel\n"
                                    "class M(BaseModel):\n    x: int = 0\nM(x=1)"]
    mission = [args.memcalc, "estimate", "--params", "175e9", "--stage", "3", "--gpus", "128"]
    # The realistic accounting (the step's timeline): FSDP2 FULL_SHARD on 8 GPUs.
    hf = [args.memcalc, "estimate", "--hf-config", str(CONFIG), "--fsdp", "FULL_SHARD", "--fsdp-version", "2",
          "--gpus", "8", "--gpu", "h100", "--seq-len", "8192", "--micro-batch", "1"]
    cases = [
        ("memcalc estimate --params 175e9 --stage 3 --gpus 128", mission, 1.5),
        ("memcalc estimate ... --json", [*mission, "--json"], 1.5),
        ("memcalc compare --params 7e9 --gpus 64", [args.memcalc, "compare", "--params", "7e9", "--gpus", "64"], 1.5),
        ("memcalc estimate --hf-config <Llama-3-8B> ... (tables)", hf, 1.5),
        ("memcalc estimate --hf-config <Llama-3-8B> ... --json", [*hf, "--json"], 1.5),
        ("memcalc --help", [args.memcalc, "--help"], 1.5),
    ]
    env_note = ""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        env_note = " (PYTHONDONTWRITEBYTECODE is set: a module without a .pyc from the install compiles on every run)"
    for _, cmd, _ in cases:  # warm the page cache and the bytecode cache
        once(cmd)
    floor_t: list[float] = []
    models_t: list[float] = []
    times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for _ in range(args.runs):
        floor_t.append(once(floor))
        models_t.append(once(models))
        for label, cmd, _ in cases:
            times[label].append(once(cmd))
    f = statistics.median(floor_t)
    print(f"floor: python -c \"import typer, rich.table, pydantic\": {f:.1f} ms median of {args.runs}{env_note}")
    m = statistics.median(models_t)
    print(f"{'floor + one pydantic model validated (reference)':58s} {m:7.1f}ms {m / f:5.2f}x")
    print(f"{'command':58s} {'median':>8s} {'ratio':>6s} {'target':>7s}")
    for label, _, target in cases:
        m = statistics.median(times[label])
        verdict = "met" if m / f <= target else "NOT met"
        print(f"{label:58s} {m:7.1f}ms {m / f:5.2f}x {target:5.1f}x  {verdict}")


if __name__ == "__main__":
    main()
