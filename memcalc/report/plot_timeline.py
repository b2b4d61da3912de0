"""The step's memory over time as a picture: every moment of the realistic accounting's replay, stacked by kind, the
phases shaded, the peak and the GPU's usable memory marked (``memcalc plot timeline``).

    >>> fig = plot_timeline(memcalc.estimate(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8,
    ...                                      seq_len=4096, timeline=True))
    >>> save(fig, "timeline.png")
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from memcalc.memory.engine.moments import phase_group
from memcalc.report.plot import _figure, _unit
from memcalc.report.results import Estimate, TimelineMoment
from memcalc.report.timeline import kinds, moments
from memcalc.units import memory_label, to_memory_unit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PHASE_COLOURS = {"baseline": "#bbbbbb", "input": "#999999", "forward": "#4c72b0", "loss": "#c44e52",
                 "backward": "#dd8452", "optimizer": "#55a868", "zero_grad": "#8172b3"}
"""The shade of each phase's span (a phase not named here: grey)."""
CACHED_NOTE = ("allocator cached: reserved - allocated in a steady step (the caching allocator keeps the previous "
               "step's segments)")
"""The band above the live memory: PyTorch's caching allocator returns no segment to the driver during training
(only ``torch.cuda.empty_cache()`` or a failed allocation releases them; c10/cuda/CUDACachingAllocator.cpp,
``release_cached_blocks``), so from the second step on the reserved memory stays at the step's reserved peak
(``memcalc.memory.allocator.reserved``) and every byte freed in between is cached, not given back. The first step's reserved
memory grows up to it instead."""


def phase_spans(listed: list[TimelineMoment]) -> list[tuple[str, int, int]]:
    """(phase, first moment, last moment) of each run of moments in one phase (layers folded: ``forward.layer.3``
    is forward), in order; a pipeline rank's forwards and backwards alternate."""
    out: list[tuple[str, int, int]] = []
    for i, m in enumerate(listed):
        g = phase_group(m.phase)
        if out and out[-1][0] == g:
            out[-1] = (g, out[-1][1], i)
        else:
            out.append((g, i, i))
    return out


def _stack(ax: Any, listed: list[TimelineMoment], u: str) -> list[float]:
    """Draw each kind's band over the moments, bottom to top; returns the top (the moment's total) per moment."""
    x = list(range(len(listed)))
    bottom = [0.0] * len(listed)
    for kind in kinds(listed):
        top = [b + to_memory_unit(m.bytes.get(kind, 0), u) for b, m in zip(bottom, listed)]
        if any(t != b for t, b in zip(top, bottom)):
            ax.fill_between(x, bottom, top, step="mid", linewidth=0, label=kind.replace("_", " "))
        bottom = top
    return bottom


def _phases(ax: Any, listed: list[TimelineMoment]) -> None:
    """Shade each phase's span and name it at the top (the first span of each phase only)."""
    from matplotlib.transforms import blended_transform_factory

    on_top = blended_transform_factory(ax.transData, ax.transAxes)
    named: set[str] = set()
    narrow_ones = 0
    for g, first, last in phase_spans(listed):
        colour = PHASE_COLOURS.get(g, "#cccccc")
        ax.axvspan(first - 0.5, last + 0.5, color=colour, alpha=0.12, linewidth=0)
        if g not in named:
            named.add(g)
            narrow = last - first < max(2, len(listed) // 25)
            y = 0.99 - 0.1 * (narrow_ones % 2) if narrow else 0.99  # neighbouring narrow names staggered
            narrow_ones += narrow
            ax.text((first + last) / 2, y, g, transform=on_top, ha="center", va="top",
                    rotation=90 if narrow else 0, fontsize="x-small", color=colour)


def plot_timeline(r: Estimate, unit: str = "gib") -> Figure:
    """Live memory over one step of ``r`` (an estimate made with ``timeline=True``), moment by moment, stacked by
    kind, with the allocator's cached bytes above it up to ``peak_reserved`` (``CACHED_NOTE``); the phases shaded; the
    peak, ``peak_reserved`` and the GPU's usable memory marked."""
    u = _unit(unit)
    listed = moments(r)
    fig = _figure()
    ax = fig.add_subplot()
    totals = _stack(ax, listed, u)
    g = r.memory.per_gpu
    reserved = to_memory_unit(g.peak_reserved, u)
    ax.fill_between(range(len(listed)), totals, [max(t, reserved) for t in totals], step="mid", linewidth=0,
                    facecolor="none", edgecolor="#999999", hatch="////", label="allocator cached")
    _phases(ax, listed)
    i = max(range(len(listed)), key=lambda k: (totals[k], -k))
    label = memory_label(u)
    ax.plot([i], [totals[i]], marker="v", color="black", linestyle="none", label=f"peak {totals[i]:,.2f} {label}")
    ax.annotate(textwrap.fill(listed[i].label, 40), (i, totals[i]), xytext=(0, 8), textcoords="offset points",
                ha="center" if 0.2 < i / len(listed) < 0.8 else ("left" if i < len(listed) / 2 else "right"),
                va="bottom", fontsize="x-small")
    ax.axhline(reserved, color="grey", linestyle=":", linewidth=1, label=f"peak reserved {reserved:,.2f} {label}")
    usable = to_memory_unit(r.memory.fit.usable_bytes, u)
    ax.axhline(usable, color="black", linestyle="--", linewidth=1,
               label=f"usable on {r.input.gpu.name}: {usable:,.1f} {label}")
    ax.set_xlim(-0.5, len(listed) - 0.5)
    ax.set_ylim(0, max(usable, reserved, totals[i]) * 1.08)
    ax.set_xlabel(f"moment of the step (every decoder layer replayed)\n{CACHED_NOTE}", fontsize="small")
    ax.set_ylabel(f"memory per GPU ({label})")
    stage = f", pipeline rank {r.memory.most_loaded_stage}" if r.training.pp > 1 else ""
    ax.set_title(f"{r.model.name} {r.strategy.label} on {r.input.cluster.gpus} x {r.input.gpu.name}{stage}: one "
                 "step", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.set_size_inches(11, 5.5)
    return fig


__all__ = ["CACHED_NOTE", "PHASE_COLOURS", "phase_spans", "plot_timeline"]
