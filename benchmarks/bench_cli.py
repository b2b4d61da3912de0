"""Wall time of a plain `memcalc estimate`, beside the floor of the libraries it stands on.

    python benchmarks/bench_cli.py [--runs 21] [--memcalc PATH]

Prints the median (and min/max) wall time of each command over --runs runs, started as separate
processes the way a user starts them. Target: a plain estimate in 150 ms or less (median).
Figures only: it never fails on timing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

TARGET_MS = 150.0


def measure(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)  # warm the page cache
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        times.append((time.perf_counter() - t0) * 1000)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.decode().strip()}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--memcalc", default=shutil.which("memcalc") or "memcalc", help="the memcalc executable")
    args = ap.parse_args()
    py = sys.executable
    mission = [args.memcalc, "estimate", "--params", "175e9", "--stage", "3", "--gpus", "128"]
    cases = [
        ("python -c pass", [py, "-c", "pass"]),
        ('python -c "import typer, rich, pydantic"', [py, "-c", "import typer, rich, pydantic"]),
        ("python -c: typer + rich tables + pydantic.BaseModel",
         [py, "-c", "import typer, rich.console, rich.table; from pydantic import BaseModel"]),  # fmt: skip
        ("memcalc estimate --params 175e9 --stage 3 --gpus 128", mission),
        ("memcalc estimate ... --json", [*mission, "--json"]),
    ]
    print(f"{'command':58s} {'median':>8s} {'min':>8s} {'max':>8s}   ({args.runs} runs)")
    medians = {}
    for label, cmd in cases:
        t = measure(cmd, args.runs)
        medians[label] = statistics.median(t)
        print(f"{label:58s} {statistics.median(t):7.1f}ms {min(t):7.1f}ms {max(t):7.1f}ms")
    est = medians["memcalc estimate --params 175e9 --stage 3 --gpus 128"]
    floor = medians["python -c: typer + rich tables + pydantic.BaseModel"]
    verdict = "met" if est <= TARGET_MS else "NOT met"
    print(f"target: plain estimate <= {TARGET_MS:.0f} ms median: {verdict} ({est:.1f} ms); "
          f"memcalc's own share above importing its libraries: {est - floor:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
