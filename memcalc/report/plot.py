"""Plots of results, with matplotlib as an optional dependency (``pip install '.[plot]'`` from this checkout, or matplotlib).

Each function returns a ``matplotlib.figure.Figure`` built without pyplot (no global figure registry, no GUI):
notebooks display it, ``save(fig, "memory.png")`` writes it.
    >>> fig = plot_memory(memcalc.compare(params=7e9, gpus=8))
    >>> save(fig, "memory.svg")
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcalc.errors import InputError
from memcalc.report.formats import row_label
from memcalc.report.results import Comparison, Estimate
from memcalc.units import MEMORY_UNITS, MemoryUnit, memory_label, to_memory_unit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SEGMENTS = ("parameters", "gradients", "optimizer states", "activations", "overheads")
"""The stacked parts of one bar, bottom to top; overheads = total - the other four (CUDA context, reserve, ...)."""
SCALING_STRATEGIES = ("ddp", "zero-1", "zero-2", "zero-3")
SCALING_GPUS = (8, 16, 32, 64, 128, 256)
FORMATS = {".png": "png", ".svg": "svg"}


def _figure() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install matplotlib (or '.[plot]' from this checkout)") from None
    headless = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if headless and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")  # no display: render to files only
    return _inline_figure()(figsize=(9, 5), layout="constrained")


@cache
def _inline_figure() -> Any:
    """A matplotlib Figure that notebooks show inline as PNG, without pyplot's figure registry."""
    from matplotlib.figure import Figure

    class InlineFigure(Figure):
        def _repr_png_(self) -> bytes:
            import io

            from matplotlib.backends.backend_agg import FigureCanvasAgg

            buf = io.BytesIO()
            FigureCanvasAgg(self).print_png(buf)
            return buf.getvalue()

    return InlineFigure


def _unit(unit: str) -> MemoryUnit:
    if unit not in MEMORY_UNITS:
        raise InputError(f"unit {unit!r} is not accepted; accepted: {', '.join(MEMORY_UNITS)}")
    return unit  # type: ignore[return-value]


def memory_parts(r: Estimate) -> dict[str, int]:
    """Per-GPU bytes of each stacked segment (``SEGMENTS``); they sum to ``r.memory.per_gpu.total``."""
    g = r.memory.per_gpu
    parts = {"parameters": g.parameters, "gradients": g.gradients, "optimizer states": g.optimizer_states,
             "activations": g.activations}  # fmt: skip
    return parts | {"overheads": g.total - sum(parts.values())}


def _estimates(obj: Comparison | Estimate | Iterable[Estimate]) -> list[Estimate]:
    if isinstance(obj, Comparison):
        out = list(obj.estimates)
    elif isinstance(obj, Estimate):
        out = [obj]
    else:
        out = list(obj) if isinstance(obj, Iterable) else []
    if not out or not all(isinstance(r, Estimate) for r in out):
        raise InputError(f"cannot plot {type(obj).__name__}; accepted: a Comparison, an Estimate or a list of Estimates")
    return out


def plot_memory(comparison_or_estimates: Comparison | Estimate | Iterable[Estimate], unit: str = "gib") -> Figure:
    """Stacked bars of per-GPU memory by strategy, with each GPU's usable memory as a dashed line."""
    u = _unit(unit)
    estimates = _estimates(comparison_or_estimates)
    fig = _figure()
    ax = fig.add_subplot()
    x = list(range(len(estimates)))
    bottom = [0.0] * len(estimates)
    for segment in SEGMENTS:
        heights = [to_memory_unit(memory_parts(r)[segment], u) for r in estimates]
        ax.bar(x, heights, bottom=bottom, label=segment)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for usable, gpu in sorted({(r.memory.fit.usable_bytes, r.input.gpu.name) for r in estimates}):
        level = to_memory_unit(usable, u)
        ax.axhline(level, color="black", linestyle="--", linewidth=1,
                   label=f"usable on {gpu}: {level:,.1f} {memory_label(u)}")
    ax.set_xticks(x, [row_label(estimates, r) for r in estimates], rotation=30 if len(estimates) > 4 else 0, ha="right"
                  if len(estimates) > 4 else "center")  # fmt: skip
    ax.set_ylabel(f"memory per GPU ({memory_label(u)})")
    first = estimates[0]
    ax.set_title(f"{first.model.name or 'model'} ({first.model.parameters:,} parameters) on "
                 f"{first.input.cluster.gpus} x {first.input.gpu.name}")  # fmt: skip
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # outside: never over a bar
    return fig


def time_parts(r: Estimate) -> dict[str, float]:
    """Seconds of each stacked part of one step (``memcalc.report.results_time.TimeBreakdown``); they sum to step_s."""
    if r.time is None:
        raise InputError(f"{r.strategy.label} has no step time: give the model's shape and --seq-len")
    b = r.time.breakdown
    parts = {"compute": b.compute_s, "memory-bound ops": b.memory_bound_s, "recompute": b.recompute_s}
    parts |= {f"communication: {g}": s for g, s in b.communication_s.items()}
    return parts | {"pipeline bubble": b.bubble_s, "optimizer step": b.optimizer_s, "offload copies": b.offload_s,
                     "host (launches)": b.host_s}


def plot_time(comparison_or_estimates: Comparison | Estimate | Iterable[Estimate]) -> Figure:
    """Stacked bars of one step's seconds by part (compute, exposed communication per group, bubble, optimizer,
    offload), per strategy, with tokens per second per GPU over each bar."""
    estimates = _estimates(comparison_or_estimates)
    parts = [time_parts(r) for r in estimates]
    names = list(dict.fromkeys(k for p in parts for k in p))
    fig = _figure()
    ax = fig.add_subplot()
    x = list(range(len(estimates)))
    bottom = [0.0] * len(estimates)
    for name in names:
        heights = [p.get(name, 0.0) for p in parts]
        if any(heights):
            ax.bar(x, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
    for i, r in enumerate(estimates):
        ax.annotate(f"{r.time.tokens_per_s_per_gpu:,.0f} tok/s/GPU", (i, bottom[i]), ha="center", va="bottom",  # type: ignore[union-attr]
                    fontsize="x-small")
    ax.set_xticks(x, [row_label(estimates, r) for r in estimates], rotation=30 if len(estimates) > 4 else 0, ha="right"
                  if len(estimates) > 4 else "center")  # fmt: skip
    ax.set_ylabel("seconds per optimizer step")
    first = estimates[0]
    ax.set_title(f"{first.model.name or 'model'} on {first.input.cluster.gpus} x {first.input.gpu.name}: step time "
                 f"({first.time.cluster})")  # type: ignore[union-attr]
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def _gpu_counts(gpus: Sequence[int]) -> list[int]:
    counts = list(gpus)
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        raise InputError(f"gpus {gpus!r} is not accepted; accepted: a list of whole numbers of 1 or more, such as 8, 16, 32")
    return sorted(set(counts))


def scaling_totals(params: Any = None, strategies: Sequence[str] = SCALING_STRATEGIES,
                   gpus: Sequence[int] = SCALING_GPUS, **kwargs: Any) -> tuple[list[int], dict[str, list[Estimate]]]:  # fmt: skip
    """The estimates behind ``plot_scaling``: for each strategy label, one estimate per GPU count."""
    import memcalc

    counts = _gpu_counts(gpus)
    by_strategy: dict[str, list[Estimate]] = {}
    for n in counts:
        cmp = memcalc.compare(params, strategies=list(strategies), gpus=n, **kwargs)
        for r in cmp.estimates:
            by_strategy.setdefault(r.strategy.label, []).append(r)
    return counts, by_strategy


def plot_scaling(params: Any = None, strategies: Sequence[str] = SCALING_STRATEGIES,
                 gpus: Sequence[int] = SCALING_GPUS, unit: str = "gib", **kwargs: Any) -> Figure:  # fmt: skip
    """Per-GPU memory against the number of GPUs, one line per strategy, with the usable-memory line.

    ``params`` and ``kwargs`` are ``memcalc.compare``'s (``model="llama-2-7b", seq_len=4096``, ...).
    """
    u = _unit(unit)
    counts, by_strategy = scaling_totals(params, strategies, gpus, **kwargs)
    fig = _figure()
    ax = fig.add_subplot()
    for label, estimates in by_strategy.items():
        ax.plot(counts, [to_memory_unit(r.memory.per_gpu.total, u) for r in estimates], marker="o", label=label)
    first = next(iter(by_strategy.values()))[0]
    level = to_memory_unit(first.memory.fit.usable_bytes, u)
    ax.axhline(level, color="black", linestyle="--", linewidth=1,
               label=f"usable on {first.input.gpu.name}: {level:,.1f} {memory_label(u)}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"memory per GPU ({memory_label(u)})")
    ax.set_title(f"{first.model.name or 'model'} ({first.model.parameters:,} parameters) on {first.input.gpu.name}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG or SVG, chosen by the file's suffix; returns the path written."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InputError(f"plot file {str(path)!r} has the suffix {p.suffix!r}; accepted: {', '.join(FORMATS)}")
    try:
        fig.savefig(p, format=fmt, dpi=150)
    except OSError as e:
        raise InputError(f"plot file {str(path)!r} cannot be written ({' '.join(str(e).split())})") from None
    return p
