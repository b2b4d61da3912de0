"""Time of one realistic evaluation: the peak of a training step over its timeline, as a layout planner calls it.

    python benchmarks/bench_realistic.py [--repeat 200]

For three layouts (Llama 3 8B under FSDP2 on 8 GPUs; Llama 3 70B under FSDP2 with TP 8 and sequence parallelism on
64 GPUs; Llama 3.1 405B over 8 pipeline stages of TP 8 on 512 GPUs, torchtitan, full recompute), prints the median
microseconds of ``memcalc.evaluate.evaluate(plan)`` over fresh but equal plans (``dataclasses.replace``), beside:

- floor: the paper accounting's ``evaluate`` of the same layout, measured in the same run (its ratio follows);
- new shape: each call on a sequence length no call before had (a multiple of 64 below the layout's), so that each
  layer's sizes are computed afresh (``memcalc.memory.engine.stack.layer_stack``, cached per model and shape), what a
  planner pays the first time it meets a shape; the model's states and FSDP units stay cached per model;
- every layer: the moment-by-moment reference (``memcalc.memory.accountings.realistic.evaluate(..., every_layer=True)`` over every
  pipeline stage), the replay the evaluation answers for without building one moment per decoder layer.

Target: ≤ 1 ms for the 70B layout. Figures only: it never fails on timing (medians on a shared machine move with its
load; the minimum is printed too).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from memcalc.api import build_input
from memcalc.evaluate import evaluate
from memcalc.inputs.plan import to_plan
from memcalc.memory.accountings import realistic

TITAN = dict(gpu="h100", framework="torchtitan", fsdp="FULL_SHARD", fsdp_version=2)
LAYOUTS = {
    "8B FSDP2, 8 GPUs": dict(model="llama-3-8b", gpus=8, seq_len=4096, **TITAN),
    "70B FSDP2 TP8 SP, 64 GPUs": dict(model="llama-3-70b", gpus=64, seq_len=8192, tp=8, sequence_parallel=True,
                                      recompute="full", **TITAN),
    "405B PP8 TP8 SP, 512 GPUs": dict(model="llama-3.1-405b", gpus=512, seq_len=8192, tp=8, pp=8,
                                      sequence_parallel=True, recompute="full", **TITAN),
}
TARGET_US = {"70B FSDP2 TP8 SP, 64 GPUs": 1000.0}


def times_us(fn, make, repeat: int) -> list[float]:
    """Microseconds of ``fn(make())`` per call, ``make`` outside the clock."""
    out = []
    for _ in range(repeat):
        x = make()
        t0 = time.perf_counter()
        fn(x)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def every_layer(plan) -> None:
    for stage in range(plan.pp):
        realistic.evaluate(plan, stage, every_layer=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    print(f"{'layout':28s} {'median µs':>10s} {'min µs':>8s} {'floor µs':>9s} {'x floor':>8s} {'new shape':>10s} "
          f"{'every layer':>12s}   (median of {args.repeat})")
    for label, kw in LAYOUTS.items():
        plan = to_plan(build_input(**kw, accounting="realistic"))
        floor_plan = to_plan(build_input(**kw, accounting="paper"))
        assert plan.accounting == "realistic" and evaluate(plan).realistic is not None, label
        evaluate(plan)  # the first call fills what is cached per model
        fast = times_us(evaluate, lambda: dataclasses.replace(plan), args.repeat)
        floor = statistics.median(times_us(evaluate, lambda: dataclasses.replace(floor_plan), args.repeat))
        shapes = iter(range(plan.work.seq_len - 64, 0, -64))
        cold = times_us(evaluate, lambda: dataclasses.replace(
            plan, work=dataclasses.replace(plan.work, seq_len=next(shapes))), max(1, args.repeat // 10))
        ref = times_us(every_layer, lambda: dataclasses.replace(plan), max(1, args.repeat // 10))
        med = statistics.median(fast)
        target = TARGET_US.get(label)
        verdict = "" if target is None else f"   target {target:.0f} µs {'met' if med <= target else 'NOT met'}"
        print(f"{label:28s} {med:10.0f} {min(fast):8.0f} {floor:9.0f} {med / floor:8.1f} "
              f"{statistics.median(cold):10.0f} {statistics.median(ref):12.0f}{verdict}")


if __name__ == "__main__":
    main()
