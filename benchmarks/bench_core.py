"""Time of the plain-number core: one plan evaluated, without pydantic, as a planner calls it.

    python benchmarks/bench_core.py [--repeat 2000]

Prints microseconds per ``memcalc.evaluate.evaluate(plan)`` (best of 5 rounds) for a bare parameter count and for
a Llama-3-8B shape with activations, each over a sweep of plans (strategies x micro-batches, made with
``dataclasses.replace``, so nothing is cached per plan), beside a floor measured in the same run: a loop that
builds one tuple per plan. Targets: ≤ 10 µs (bare count), ≤ 50 µs (shape and activations). Figures only: it never
fails on timing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import memcalc
from memcalc.evaluate import evaluate
from memcalc.inputs.plan import to_plan
from memcalc.layout.strategies import STRATEGIES

TARGETS_US = {"bare count": 10.0, "shape + activations": 50.0}


def per_call_us(fn, items: list, repeat: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(max(1, repeat // len(items))):
            for x in items:
                fn(x)
        n = max(1, repeat // len(items)) * len(items)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    specs = [STRATEGIES[n] for n in ("zero-1", "zero-2", "zero-3", "FULL_SHARD", "SHARD_GRAD_OP", "ddp")]
    bare = to_plan(memcalc.build_input(params=175e9, stage=3, gpus=128))
    # the paper accounting: the sweep swaps strategies under one plan, which only that accounting evaluates for all six
    shaped = to_plan(memcalc.build_input(model="llama-3-8b", stage=3, gpus=64, seq_len=4096, micro_batch=1,
                                         accounting="paper"))
    sweeps = {
        "bare count": [replace(bare, spec=s, grad_accum=k) for s in specs for k in (1, 2, 4, 8)],
        "shape + activations": [replace(shaped, spec=s, work=replace(shaped.work, micro_batch=b))
                                for s in specs for b in (1, 2, 4, 8)],
    }
    floor = per_call_us(lambda p: (p.psi, p.spec, p.gpus), sweeps["bare count"], args.repeat)
    print(f"{'plan':24s} {'µs/plan':>9s} {'target':>8s}   (best of 5 rounds; floor: {floor:.2f} µs per plan "
          "for a loop that only reads three fields)")
    for label, plans in sweeps.items():
        us = per_call_us(evaluate, plans, args.repeat)
        verdict = "met" if us <= TARGETS_US[label] else "NOT met"
        print(f"{label:24s} {us:8.1f}  {TARGETS_US[label]:7.0f}   {verdict} ({us / floor:.0f}x the floor)")


if __name__ == "__main__":
    main()
