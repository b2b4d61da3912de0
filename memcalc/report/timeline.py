"""The step's memory over time as data: the moments of an estimate (``memory.timeline.moments``) as CSV, and why an
estimate has none (only the realistic accounting replays a step)."""

from __future__ import annotations

import csv
import io

from memcalc.errors import InputError
from memcalc.memory.engine.moments import KINDS, OTHER
from memcalc.report.results import Estimate, TimelineMoment


def why_no_timeline(r: Estimate) -> str | None:
    """Why ``r`` has no timeline to show (its accounting is not the realistic one), or None."""
    if r.memory.timeline is not None:
        return None
    from memcalc.evaluate import realistic_why_not
    from memcalc.inputs.plan import to_plan

    plan = to_plan(r.input)
    why = realistic_why_not(plan)
    if why is not None:
        return f"the timeline is the realistic accounting's replay of a step, which does not apply here: {why}"
    return (f"the timeline is the realistic accounting's replay of a step; --accounting {plan.accounting} was asked "
            "(leave it out, or give realistic)")


def moments(r: Estimate) -> list[TimelineMoment]:
    """The moments of ``r`` (an estimate made with ``timeline=True``), or one ``InputError`` line saying why none."""
    why = why_no_timeline(r)
    if why is not None:
        raise InputError(why)
    assert r.memory.timeline is not None
    if not r.memory.timeline.moments:
        raise InputError("this estimate was made without its moments: give timeline=True (--timeline)")
    return r.memory.timeline.moments


def kinds(listed: list[TimelineMoment]) -> list[str]:
    """The kinds the columns show: ``KINDS``, and ``other`` where a moment has some."""
    return [*KINDS, OTHER] if any(m.bytes.get(OTHER) for m in listed) else list(KINDS)


def timeline_csv(r: Estimate) -> str:
    """One row per moment: index, phase, label, bytes of each kind, total."""
    listed = moments(r)
    cols = kinds(listed)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["index", "phase", "label", *cols, "total"])
    for i, m in enumerate(listed):
        w.writerow([i, m.phase, m.label, *(m.bytes.get(k, 0) for k in cols), sum(m.bytes.values())])
    return buf.getvalue()


__all__ = ["kinds", "moments", "timeline_csv", "why_no_timeline"]
