"""Microseconds per step-time evaluation once the architecture-dependent parts are cached.

    python benchmarks/bench_time.py [--runs 2000]

Times ``memcalc.time.step.step_time`` for a 3D-parallel Megatron-175B plan with its tensor, pipeline and data-parallel
collectives, the way a planner calls it many times over. Target: 20 us or less per evaluation. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time

from memcalc.comm.traffic import model_parallel_collectives
from memcalc.inputs.presets import load_model
from memcalc.time.hardware import load_machine
from memcalc.time.step import Plan, step_time

TARGET_US = 20.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    arch, machine = load_model("megatron-175b"), load_machine("dgx-a100")
    plan = Plan(gpus=1024, seq=2048, micro_batch=1, micro_batches=64, tp=8, pp=8, sp=True, recompute="selective",
                attention="eager", dtype="fp16", dropout=True)  # fmt: skip
    rows = model_parallel_collectives(
        tp=8, pp=8, cp=1, ep=1, dp=16, sp=True, stage=3, virtual=1, layers=12, moe_layers=0, tokens=2048,
        hidden=12288, kv_width=12288, top_k=1, act_bytes=2, dtype="fp16", micro_batches=64, full_recompute=False,
        gpus_per_node=8, intra_link="nvlink3",
    )
    t0 = time.perf_counter()
    step_time(arch, plan, machine, rows)
    cold = (time.perf_counter() - t0) * 1e6
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(args.runs):
            step_time(arch, plan, machine, rows)
        samples.append((time.perf_counter() - t0) / args.runs * 1e6)
    med = statistics.median(samples)
    print(f"first evaluation (fills the caches): {cold:,.0f} us")
    print(f"step_time, cached: median {med:.1f} us (min {min(samples):.1f}, max {max(samples):.1f}) over "
          f"{len(rows)} collectives; target {TARGET_US:.0f} us")


if __name__ == "__main__":
    main()
