"""Speed of the planner: whole `memcalc plan` processes and one realistic evaluation, against floors measured in the
same run.

    python benchmarks/bench_plan.py [--memcalc PATH] [--quick]

Prints, for each job, the wall time of the whole `memcalc plan ... --json` process, its ratio to one
`memcalc estimate` process of the same model (the floor: interpreter start, imports, one realistic estimate), the
candidates timed and checked, the replays run and the candidates per second; then the median of one realistic
evaluation (`memcalc.evaluate.evaluate` of a plain plan, Llama-3-70B under FSDP2 x TP 8 with sequence parallelism on
64 H100s) against the paper accounting's evaluation of the same plan. Targets: the 70B job ≤ 2 s and the 405B job
over 512, 1024 and 2048 GPUs ≤ 10 s, wall, one core; ≤ 1 ms per realistic evaluation. Figures only: it never
fails on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace

JOBS = {
    "llama-3-70b, 64 x h100, all frameworks": (["--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100",
                                                "--seq-len", "8192", "--global-batch", "128"], 2.0),
    "llama-3.1-405b, 512/1024/2048 x h100": (["--model", "llama-3-405b", "--gpus", "512,1024,2048", "--gpu", "h100",
                                              "--seq-len", "8192", "--global-batch", "2048"], 10.0),
}
QUICK = {"llama-3-8b, 8 x h100, all frameworks": (["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100",
                                                   "--seq-len", "8192", "--global-batch", "16"], 2.0)}
FLOOR = ["estimate", "--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100", "--seq-len", "8192", "--fsdp",
         "FULL_SHARD", "--tp", "8", "--sequence-parallel", "--framework", "torchtitan", "--recompute", "full", "--json"]


def wall(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out


def realistic_us(repeat: int = 30) -> tuple[float, float]:
    """Median microseconds of one realistic and one paper evaluation of the same plain plan."""
    from memcalc.api import build_input
    from memcalc.evaluate import evaluate
    from memcalc.inputs.plan import to_plan

    plan = to_plan(build_input(model="llama-3-70b", gpus=64, gpu="h100", seq_len=8192, fsdp="FULL_SHARD", tp=8,
                               sequence_parallel=True, framework="torchtitan", recompute="full"))
    assert plan.accounting == "realistic", plan.accounting
    out = []
    for p in (plan, replace(plan, accounting="paper")):
        evaluate(replace(p))
        times = []
        for _ in range(repeat):
            q = replace(p)
            t0 = time.perf_counter()
            evaluate(q)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) * 1e6)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memcalc", default=shutil.which("memcalc") or "memcalc")
    ap.add_argument("--quick", action="store_true", help="the 8B job only (a few seconds)")
    args = ap.parse_args()
    exe = [args.memcalc] if args.memcalc.endswith("memcalc") else [sys.executable, "-m", "memcalc"]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs "
          "(wall times scale with it; the ratios to the floor less so)")
    floor = min(wall(exe + FLOOR)[0] for _ in range(3))
    print(f"floor: one `memcalc estimate` process (70B, FSDP2 x TP 8, realistic): {floor:.3f} s")
    for name, (flags, target) in (QUICK if args.quick else {**QUICK, **JOBS}).items():
        seconds, out = wall(exe + ["plan", *flags, "--top", "10", "--json"])
        d = json.loads(out)
        print(f"{name}: {seconds:.2f} s wall ({seconds / floor:.1f}x the floor; target {target:g} s), "
              f"{d['evaluated']:,} candidates timed, {d['checked']:,} checked, {d['replays']:,} replays, "
              f"{d['candidates_per_s']:,.0f} candidates/s in the search, {len(d['plans'])} plans")
    real, paper = realistic_us()
    print(f"one realistic evaluation (70B, FSDP2 x TP 8 + SP, 64 GPUs): {real:,.0f} µs median "
          f"({real / paper:.1f}x the paper evaluation's {paper:,.0f} µs; target 1,000 µs)")


if __name__ == "__main__":
    main()
