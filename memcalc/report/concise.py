"""The concise view of an estimate or a comparison: what a reader needs first, in about 40 lines at 100 columns.

An estimate: the header and what was assumed, the memory rows that hold most of the total (the small rows summed),
the verdict, the step time and what it buys, the communication total, the notes that change
the answer, and one line saying that ``--verbose`` shows every row and note. A comparison: one table of each
strategy's total, fit, traffic and step time. The full tables (``memcalc.report.render``) are what ``--verbose``, the
notebook display and ``--format markdown`` show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from memcalc.report.fitted import Fitted
from memcalc.units import MemoryUnit, format_memory, format_time, memory_label, text_in_unit, time_unit, to_memory_unit

if TYPE_CHECKING:
    from memcalc.report.results import Comparison, Estimate

SHOWN_SHARE = 0.02
"""A memory row of at least this share of the total is shown on its own line; the
smaller ones are summed into one line (their labels under --verbose)."""
MOST_ROWS = 8
"""At most this many rows shown on their own (the largest), so the table stays a glance."""
MATTERS = ("realistic accounting (the peak of a real step) not used", "activations are not counted", "step time:",
           "sequence parallelism has no effect", "the ZeRO-3 coordinator settings given", "--micro-batch auto")
"""Notes that change how the answer reads (another accounting, a part not counted, no step time, a setting without
effect, the micro-batch --micro-batch auto chose or that none fits): kept in the concise view. The rest (sources, calibration, how the timeline was modelled) under --verbose."""
VERBOSE_HINT = "--verbose for all rows and notes"


def memory_rows(r: Estimate) -> list[tuple[str, int]]:
    """(label, bytes) of the rows shown: each row of at least ``SHOWN_SHARE`` of the total (the ``MOST_ROWS``
    largest), in the breakdown's order, the smaller ones summed as one; they add up to the total."""
    items = [(x.label, x.bytes) for x in r.memory.per_gpu.rows]
    total = r.memory.per_gpu.total
    big = sorted((b for _, b in items if b >= SHOWN_SHARE * total), reverse=True)[:MOST_ROWS]
    floor = big[-1] if big else total + 1
    shown = [(label, b) for label, b in items if b >= floor]
    rest = [b for label, b in items if b < floor]
    if len(rest) <= 1:  # one row left: itself, not "1 more row"
        return items
    shown.append((f"{len(rest)} smaller rows", sum(rest)))
    return shown


def memory_table(r: Estimate, unit: MemoryUnit = "gib") -> Table:
    total = r.memory.per_gpu.total
    t = Table(title="Memory per GPU, at the step's peak" if r.accounting == "realistic" else "Memory per GPU",
              title_justify="left")
    t.add_column("component")
    t.add_column(memory_label(unit), justify="right")
    t.add_column("share", justify="right")
    for label, b in memory_rows(r):
        t.add_row(label, f"{to_memory_unit(b, unit):,.2f}", f"{100 * b / total:.0f}%" if total else "-")
    t.add_section()
    t.add_row(Text("total", style="bold"), Text(f"{to_memory_unit(total, unit):,.2f}", style="bold"), "100%")
    return t


def time_line(r: Estimate) -> Text | None:
    """The step's time and its parts, in one line (the time table's figures)."""
    from memcalc.report.formats import time_parts

    st = r.time
    if st is None:
        return None
    u = time_unit(st.step_s)
    parts = " + ".join(f"{name} {format_time(s, u)}" for _, name, s, _ in time_parts(st))
    return Text(f"step time on {st.cluster}: {format_time(st.step_s, u)} {u} = {parts}", style="bold")


def communication_line(r: Estimate, unit: MemoryUnit = "gib") -> Text:
    """What one GPU sends per optimizer step, in total (the communication table's total)."""
    c = r.communication
    if not c.collectives and not c.host_transfers:
        return Text("communication: none (one GPU holds everything)")
    line = (f"communication per optimizer step, per GPU: {format_memory(c.sent_bytes_per_gpu, unit)} sent in "
            f"{len(c.collectives)} collective{'s' * (len(c.collectives) != 1)}")
    if c.inter_node_sent_bytes_per_gpu:
        line += f" ({format_memory(c.inter_node_sent_bytes_per_gpu, unit)} of it across nodes)"
    if c.host_transfers:
        line += f" · {format_memory(c.host_transfer_bytes, unit)} to and from host memory or NVMe"
    return Text(line)


def offload_line(r: Estimate, unit: MemoryUnit = "gib") -> Text | None:
    node = r.memory.per_node
    if not node.rows:
        return None
    held = [f"host RAM {format_memory(node.cpu, unit)}" if node.cpu else "",
            f"NVMe {format_memory(node.nvme, unit)}" if node.nvme else ""]
    return Text(f"offloaded per node ({node.ranks} GPUs): {' · '.join(h for h in held if h)}")


def estimate_parts(r: Estimate, unit: MemoryUnit = "gib") -> list[Text | Fitted]:
    from memcalc.report.render import _headline, throughput_line, training_line, verdict

    parts: list[Text | Fitted] = [_headline(r, unit), training_line(r)]
    parts += [Text(f"assumed: {a}", style="bold yellow") for a in r.assumed]
    parts += [Fitted(memory_table(r, unit)), verdict(r, unit)]
    parts += [x for x in (offload_line(r, unit), time_line(r), throughput_line(r)) if x is not None]
    parts.append(communication_line(r, unit))
    kept = [n for n in r.notes if n.startswith(MATTERS)]
    parts += [Text(f"note: {text_in_unit(n, unit)}", style="dim") for n in kept]
    left = len(r.notes) - len(kept)
    parts.append(Text(f"{VERBOSE_HINT} ({len(r.memory.per_gpu.rows)} memory rows, communication, "
                      f"{left} more note{'s' * (left != 1)})", style="dim"))
    return parts


COMPARE_COLUMNS = ("strategy", "micro-batch", "total", "fits", "host RAM/node", "sent/step")
"""The columns of the concise comparison (and the step time and tokens/s/GPU where timed)."""


def comparison_parts(cmp: Comparison, unit: MemoryUnit = "gib") -> list[Text | Fitted]:
    from memcalc.report.formats import accounting_line, auto_line
    from memcalc.report.render import assumed_precision_line, comparison_table, ranking_line, step_header

    keep = (*COMPARE_COLUMNS, step_header(cmp), "tokens/s/GPU")
    lines = [x for x in (auto_line(cmp), accounting_line(cmp)) if x]
    told = assumed_precision_line(cmp)
    table = comparison_table(cmp, unit, keep=keep)
    title, table.title = Text(str(table.title)), None  # a line as wide as the output, not wrapped to the table's width
    return ([title, Fitted(table), ranking_line(cmp)]
            + ([Text(told, style="bold yellow")] if told else [])
            + [Text("note: " + text_in_unit(line, unit), style="dim") for line in lines]
            + [Text(f"{VERBOSE_HINT} (each strategy's parameters, gradients, optimizer states, activations, NVMe and "
                    "network traffic)", style="dim")])
