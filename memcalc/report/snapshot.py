"""The predicted step as a PyTorch memory snapshot: the dict ``torch.cuda.memory._snapshot()`` returns (pickled, as
``torch.cuda.memory._dump_snapshot`` writes it), which https://pytorch.org/memory_viz and ``torch.cuda._memory_viz``
read.

Its format is torch's own (``torch/cuda/memory.py`` ``_snapshot``'s docstring): ``segments`` (each cudaMalloc'd
segment and its blocks at the end) and ``device_traces`` (per device, the allocator's actions in order: ``alloc``,
``free_requested``, ``free_completed``, ``segment_alloc``, each with ``addr``, ``size``, ``stream`` and ``frames``).
The trace is made from consecutive moments of the every-layer replay (``memcalc.memory.engine.moments.step_moments``):
where a part grows, an allocation of the difference; where it shrinks, its latest allocations are freed (and what
remains of the last of them allocated again); a moment's frees come before its allocations, so the most bytes
allocated at once over the trace is the largest moment, the realistic ``peak_allocated``. Parts are matched from
moment to moment by their name with the numbers taken out ("layer activations (layers 0..12)" grows into
"... 0..13"); a part written as negative (a correction) is taken from the largest parts of its kind. Addresses are made up: one segment, first fit, no rounding to the allocator's 512-byte blocks; what the
caching allocator reserves beyond the live bytes is not in it. Each allocation's frames name the part (innermost)
and the moment that made it.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

from memcalc.errors import InputError
from memcalc.memory.engine.moments import StepMoment, kind_of

BASE = 0x7F0000000000
"""The made-up address of the one segment (a CUDA-like virtual address)."""
_NUMBER = re.compile(r"\d+")


class _Heap:
    """First-fit placement of blocks in one growing segment, free neighbours merged."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted, never adjacent
        self.end = 0

    def alloc(self, size: int) -> int:
        for i, (off, n) in enumerate(self.free):
            if n >= size:
                self.free[i:i + 1] = [(off + size, n - size)] if n > size else []
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.end:  # the free tail grows into the segment
            off = self.free.pop()[0]
        else:
            off = self.end
        self.end = off + size
        return off

    def release(self, off: int, size: int) -> None:
        i = next((k for k, (o, _) in enumerate(self.free) if o > off), len(self.free))
        self.free.insert(i, (off, size))
        if i + 1 < len(self.free) and off + size == self.free[i + 1][0]:
            self.free[i:i + 2] = [(off, size + self.free[i + 1][1])]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            self.free[i - 1:i + 1] = [(self.free[i - 1][0], self.free[i - 1][1] + self.free[i][1])]


def _frames(part: str, index: int, m: StepMoment) -> list[dict[str, Any]]:
    return [{"filename": "memcalc/memory/engine/timeline.py", "line": index, "name": part},
            {"filename": "memcalc/memory/engine/timeline.py", "line": index, "name": f"{m.phase}: {m.label}"}]


def _keyed(m: StepMoment) -> dict[str, tuple[str, int]]:
    """The moment's parts by their name without numbers: (a name as written, bytes). A part some timelines write as
    negative (a pipeline's correction of what another part counts) is taken from the largest parts of its kind."""
    out: dict[str, tuple[str, int]] = {}
    owed: list[tuple[str, int]] = []
    for name, b in m.parts:
        key = _NUMBER.sub("#", name)
        first, before = out.get(key, (name, 0))
        out[key] = (first, before + b)
    for key, (name, b) in list(out.items()):
        if b < 0:
            owed.append((name, -b))
            del out[key]
    for name, debt in owed:
        kind = kind_of(name)
        for key in sorted(out, key=lambda k: (kind_of(out[k][0]) != kind, -out[k][1])):
            take = min(debt, out[key][1])
            out[key] = (out[key][0], out[key][1] - take)
            debt -= take
            if not debt:
                break
    return {k: v for k, v in out.items() if v[1]}


def _events(moments: list[StepMoment]) -> tuple[list[tuple[str, int, int, list]], dict[str, list], int]:
    """(action, offset, size, frames) in order, the blocks alive at the end per part, the segment's size."""
    heap, held, sizes = _Heap(), {}, {}  # held: part key -> [(offset, size, frames)]
    out: list[tuple[str, int, int, list]] = []
    for i, m in enumerate(moments):
        now = _keyed(m)
        grow: list[tuple[str, str, int]] = []
        for key in list(dict.fromkeys([*sizes, *now])):  # in order: the same trace every run
            name, after = now.get(key, ("", 0))
            change = after - sizes.get(key, 0)
            while change < 0:  # free the latest blocks; what the last one held beyond the shrink comes back below
                off, n, frames = held[key].pop()
                heap.release(off, n)
                out += [("free_requested", off, n, frames), ("free_completed", off, n, frames)]
                change += n
            if change > 0:
                grow.append((key, name, change))
            sizes[key] = after
        for key, name, n in grow:
            off, frames = heap.alloc(n), _frames(name, i, m)
            held.setdefault(key, []).append((off, n, frames))
            out.append(("alloc", off, n, frames))
    return out, held, heap.end


def snapshot(moments: list[StepMoment]) -> dict[str, Any]:
    """The step's moments as ``torch.cuda.memory._snapshot()``'s dict: one device, one segment."""
    if not moments:
        raise InputError("a memory snapshot needs the step's moments; none were given")
    events, held, size = _events(moments)
    trace: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": BASE, "size": size, "stream": 0,
                                    "time_us": 0, "frames": []}]
    for k, (action, off, n, frames) in enumerate(events):
        trace.append({"action": action, "addr": BASE + off, "size": n, "stream": 0, "time_us": k + 1,
                      "frames": frames})
    live = sorted((off, n, frames) for blocks in held.values() for off, n, frames in blocks)
    blocks, at = [], 0
    for off, n, frames in live:
        if off > at:
            blocks.append({"address": BASE + at, "size": off - at, "requested_size": 0, "state": "inactive",
                           "frames": []})
        blocks.append({"address": BASE + off, "size": n, "requested_size": n, "state": "active_allocated",
                       "frames": frames})
        at = off + n
    if at < size:
        blocks.append({"address": BASE + at, "size": size - at, "requested_size": 0, "state": "inactive",
                       "frames": []})
    allocated = sum(n for _, n, _ in live)
    segment = {"device": 0, "address": BASE, "total_size": size, "allocated_size": allocated,
               "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace]}


def trace_peak(snap: dict[str, Any], device: int = 0) -> int:
    """The most bytes allocated at once over a snapshot's trace (allocations less completed frees)."""
    live = peak = 0
    for e in snap["device_traces"][device]:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    return peak


def write_snapshot(r: Any, path: str | os.PathLike[str]) -> Path:
    """Write the step of estimate ``r`` (realistic accounting; its most loaded GPU) as a pickled snapshot."""
    from memcalc.inputs.plan import to_plan
    from memcalc.memory.engine.moments import step_moments
    from memcalc.report.timeline import why_no_timeline

    why = why_no_timeline(r)
    if why is not None:
        raise InputError(why)
    snap = snapshot(step_moments(to_plan(r.input), r.memory.most_loaded_stage))
    p = Path(path)
    try:
        with p.open("wb") as f:
            pickle.dump(snap, f)
    except OSError as e:
        raise InputError(f"memory snapshot {str(path)!r} cannot be written ({' '.join(str(e).split())})") from None
    return p


__all__ = ["BASE", "snapshot", "trace_peak", "write_snapshot"]
