"""The public Python API. The CLI is one more client of these two functions.

    >>> import memcalc
    >>> r = memcalc.estimate(params=175e9, stage=3, gpus=128)
    >>> r.memory.per_gpu.total            # bytes
    >>> memcalc.compare(params=7e9, gpus=64)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memcalc.errors import InputError, shown
from memcalc.inputs import EstimateInput, Model, Strategy
from memcalc.inputs.arguments import keywords as _keywords
from memcalc.inputs.build import (
    DEFAULT_COMPARE,
    DEFAULT_GPU,
    MAX_COMPARE,
    _build_input_names,
    build_input,
    parse_strategy,
    resolve_architecture,
)
from memcalc.report.results import Comparison, Estimate

__all__ = ["DEFAULT_COMPARE", "DEFAULT_GPU", "MAX_COMPARE", "build_input", "compare", "estimate",
           "estimate_from_input", "largest_micro_batch", "parse_strategy", "resolve_architecture"]


def estimate_from_input(inp: EstimateInput, micro_batch_auto: bool = False, timeline: bool = False) -> Estimate:
    """The estimate of one validated input: to the core's plain plan, evaluated, built into the result once;
    ``timeline``: with every moment of the step (``memory.timeline.moments``, realistic accounting)."""
    from memcalc.evaluate import evaluate
    from memcalc.inputs.plan import to_plan
    from memcalc.report import build

    if type(timeline) is not bool:
        raise InputError(f"timeline {shown(timeline)} is not accepted; accepted: True or False")
    return build.estimate(inp, evaluate(to_plan(inp)), micro_batch_auto, timeline=timeline)


@_keywords(lambda: [*_build_input_names(), "timeline"], values=False)
def estimate(params: int | float | str | Model | EstimateInput | None = None, timeline: bool = False,
             **kwargs: object) -> Estimate:
    """Per-GPU memory and per-step communication of one strategy.

    ``memcalc.estimate(params=175e9, stage=3, gpus=128)``; ``fsdp="FULL_SHARD"``, ``ddp=True`` or
    ``strategy="zero-3+opt-cpu"`` pick other strategies; ``model="llama-2-7b", seq_len=4096`` adds
    activations; ``micro_batch="auto"`` finds the largest micro-batch that fits. An ``EstimateInput`` is
    taken as it is. ``timeline=True``: every moment of the step by kind in ``memory.timeline.moments`` (realistic
    accounting; a replay of every decoder layer beside the estimate's own).
    """
    if isinstance(params, EstimateInput):
        if kwargs:
            raise InputError("pass either an EstimateInput or keyword arguments, not both")
        return estimate_from_input(params, timeline=timeline)
    if kwargs.get("micro_batch") == "auto":
        best = largest_micro_batch(params, **{k: v for k, v in kwargs.items() if k != "micro_batch"})
        return _with_timeline(best) if timeline is True else best
    return estimate_from_input(build_input(params, **kwargs), timeline=timeline)  # type: ignore[arg-type]


def _with_timeline(r: Estimate) -> Estimate:
    """``r`` with every moment of its step (``memory.timeline.moments``)."""
    from memcalc.evaluate import evaluate
    from memcalc.inputs.plan import to_plan
    from memcalc.report.build import step_timeline

    tl = step_timeline(evaluate(to_plan(r.input)), moments=True)
    return r.model_copy(update={"memory": r.memory.model_copy(update={"timeline": tl})})


def largest_micro_batch(params: object = None, limit: int = 1 << 16, **kwargs: object) -> Estimate:
    """The estimate at the largest micro-batch whose per-GPU total fits (``--micro-batch auto``).

    Activations grow with the micro-batch and nothing else does, so the fitting sizes are 1..b*: double
    until it no longer fits, then bisect. When even 1 does not fit, the estimate at 1 says so (``Training.
    micro_batch_none_fits`` and a note), rather than passing for the largest that fits.
    """
    if kwargs.get("seq_len") is None:
        raise InputError("--micro-batch auto needs --seq-len (and the model's shape)")

    def at(b: int) -> Estimate:
        return estimate_from_input(build_input(params, micro_batch=b, **kwargs), micro_batch_auto=True)  # type: ignore[arg-type]

    best = at(1)
    if not best.memory.fit.fits:
        return _none_fits(best)
    lo, hi = 1, 2
    while hi <= limit:
        r = at(hi)
        if not r.memory.fit.fits:
            break
        best, lo, hi = r, hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = at(mid)
        if r.memory.fit.fits:
            best, lo = r, mid
        else:
            hi = mid
    return best


def _none_fits(r: Estimate) -> Estimate:
    """Micro-batch 1's estimate, marked and noted as what ``--micro-batch auto`` found: no micro-batch fits."""
    from memcalc.units import format_memory

    fit = r.memory.fit
    risk = " (at risk: the margin is within the allocator's variability)" if fit.verdict == "at-risk" else ""
    note = (f"--micro-batch auto: no micro-batch fits; micro-batch 1 needs {format_memory(r.memory.per_gpu.total)} "
            f"of {format_memory(fit.usable_bytes)} usable{risk}")
    return r.model_copy(update={"training": r.training.model_copy(update={"micro_batch_none_fits": True}),
                                 "notes": [note, *r.notes]})


@_keywords(lambda: [*_build_input_names(), "strategies"], values=False)
def compare(
    params: int | float | str | Model | None = None,
    *,
    strategies: Iterable[str | Strategy] | None = None,
    shard_group: int | None = None,
    **kwargs: object,
) -> Comparison:
    """Several strategies side by side for one model and cluster (default: ``DEFAULT_COMPARE``);
    ``micro_batch="auto"``: each at its own largest micro-batch that fits."""
    for key in ("stage", "fsdp", "ddp", "strategy", "offload_optimizer", "offload_params"):  # one strategy's flags
        if kwargs.get(key) not in (None, False, "none"):
            raise InputError(f"compare takes strategies=[...], not {key}")
    if strategies is not None and (isinstance(strategies, (str, bytes, dict)) or not isinstance(strategies, Iterable)):
        raise InputError(f"--strategies {shown(strategies)} is not accepted; accepted: a list of strategy names "
                         "such as ['zero-2', 'zero-3', 'FULL_SHARD'] or Strategy records")
    chosen: Sequence[str | Strategy] = []
    for s in strategies if strategies is not None else DEFAULT_COMPARE:
        if len(chosen) == MAX_COMPARE:
            raise InputError(f"--strategies has more than {MAX_COMPARE} entries; accepted: at most {MAX_COMPARE} "
                             "(4x every distinct strategy and offload pairing)")
        if not isinstance(s, (str, Strategy)):
            raise InputError(f"--strategies entry {shown(s)} is not accepted; accepted: a strategy name such as "
                             "'zero-3+opt-cpu', or a Strategy")
        chosen.append(s)  # type: ignore[attr-defined]
    if not chosen:
        raise InputError("--strategies is empty; name at least one, e.g. zero-2,zero-3,FULL_SHARD")
    strategies_ = [s if isinstance(s, Strategy) else parse_strategy(s, shard_group) for s in chosen]
    if kwargs.get("micro_batch") == "auto":  # each row at its own largest micro-batch that fits
        rest = {k: v for k, v in kwargs.items() if k != "micro_batch"}
        return Comparison(estimates=[largest_micro_batch(params, strategy=s, **rest) for s in strategies_])
    inputs = None
    if kwargs.get("accounting", "auto") == "auto":
        # Each row in the accounting its own estimate takes: the realistic one where it applies (each row's input
        # says: memcalc.memory.accountings.scope.why_not), else the paper's; the renderers mark the rows of a second accounting.
        inputs = [build_input(params, strategy=s, **kwargs) for s in strategies_]  # type: ignore[arg-type]
    if inputs is None:  # one accounting: the rows differ in the strategy alone (the input's checks run again for each)
        first = build_input(params, strategy=strategies_[0], **kwargs)  # type: ignore[arg-type]
        inputs = [first, *(first.replace(strategy=s) for s in strategies_[1:])]
    rows = [estimate_from_input(inp) for inp in inputs]
    return Comparison(estimates=rows)
