"""Rendering: results -> rich renderables. Returns Tables and Groups; never prints. What the CLI prints wraps each
table in ``Fitted`` (memcalc.report.fitted), which lays it out for the console's width without ever cutting a figure;
``plain_text`` gives the same characters where the output shows no styles (memcalc.report.plain)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from memcalc.report.fitted import Fitted
from memcalc.report.plain import text_lines
from memcalc.units import (
    MemoryUnit,
    format_memory,
    format_rate,
    format_time,
    memory_label,
    text_in_unit,
    time_unit,
    to_memory_unit,
)

if TYPE_CHECKING:  # results import this module to display themselves; at run time it only reads their fields
    from rich.console import Group

    from memcalc.report.results import Comparison, Estimate


def _mem(n_bytes: int, unit: MemoryUnit) -> str:
    return f"{to_memory_unit(n_bytes, unit):,.2f}"


def _headline(r: Estimate, unit: MemoryUnit) -> Text:
    inp = r.input
    c = inp.cluster
    head = Text()
    exact = f" ({r.model.parameters:,})" if r.model.breakdown is not None else ""
    head.append(f"{r.model.name}{exact} parameters", style="bold")
    head.append(f" · {r.strategy.label} · {c.gpus} x {inp.gpu.name} ({c.nodes} node{'s' * (c.nodes > 1)} of "
                f"{c.gpus_per_node})")  # fmt: skip
    head.append(f" · {inp.precision.name} · {inp.optimizer.name}")
    if r.strategy.shard_group_size > 1:
        head.append(f" · sharded over N = {r.strategy.shard_group_size}")
        if r.strategy.replicas > 1:
            head.append(f", {r.strategy.replicas} replicas")
    head.append(f" · accounting: {r.accounting}", style="dim")
    return head


def memory_table(r: Estimate, unit: MemoryUnit = "gib") -> Table:
    label = memory_label(unit)
    t = Table(title="Memory per GPU", title_justify="left", show_footer=False)
    t.add_column("component")
    t.add_column(label, justify="right")
    t.add_column("formula · source", style="dim")
    for row in r.memory.per_gpu.rows:
        t.add_row(row.label, _mem(row.bytes, unit), text_in_unit(row.detail, unit))
    t.add_section()
    t.add_row(Text("total", style="bold"), Text(_mem(r.memory.per_gpu.total, unit), style="bold"), "sum of the rows")
    return t


def verdict(r: Estimate, unit: MemoryUnit = "gib") -> Text:
    fit, gpu, g = r.memory.fit, r.input.gpu, r.memory.per_gpu
    total, usable = g.total, format_memory(fit.usable_bytes, unit)
    tl = r.memory.timeline
    peak = (f" · peak in {tl.peak_phase} ({tl.peak_moment}): {format_memory(g.peak_allocated, unit)} allocated, "
            f"{format_memory(g.peak_reserved, unit)} reserved") if tl is not None else ""
    if fit.verdict == "at-risk":
        return Text(f"! at risk: {format_memory(total, unit)} of {usable} usable on {gpu.name}, margin "
                    f"{format_memory(fit.headroom_bytes, unit)} is within the allocator's variability"
                    + (" and the buffers the paper's rows leave out" if r.accounting == "paper" else "") + peak,
                    style="bold yellow")
    if fit.fits:
        pct = 100 * total / fit.usable_bytes
        return Text(f"✓ fits: {format_memory(total, unit)} of {usable} usable on {gpu.name} ({pct:.0f}%), "
                    f"headroom {format_memory(fit.headroom_bytes, unit)}{peak}", style="bold green")
    return Text(f"✗ does not fit: {format_memory(total, unit)} needed, {usable} usable on {gpu.name}, "
                f"short by {format_memory(-fit.headroom_bytes, unit)}{peak}", style="bold red")


def training_line(r: Estimate) -> Text:
    from memcalc.report.formats import layout_text

    return Text(layout_text(r), style="dim")


def stage_table(r: Estimate, unit: MemoryUnit = "gib") -> Table | None:
    if len(r.memory.stages) < 2:
        return None
    label = memory_label(unit)
    t = Table(title="Pipeline stages (one GPU each)", title_justify="left")
    reserved = all(st.peak_reserved is not None for st in r.memory.stages)
    for col in ("stage", "parameters", "layers", "micro-batches in flight", f"model states {label}",
                f"activations {label}", f"total {label}", *([f"reserved {label}"] if reserved else [])):  # fmt: skip
        t.add_column(col, justify="right")
    for st in r.memory.stages:
        mark = " ◀ most loaded" if st.stage == r.memory.most_loaded_stage else ""
        t.add_row(f"{st.stage}{mark}", f"{st.parameters:,}", str(st.layers), f"{st.micro_batches_in_flight:g}",
                  _mem(st.model_states, unit), _mem(st.activations, unit), _mem(st.total, unit),
                  *([_mem(st.peak_reserved or 0, unit)] if reserved else []))  # fmt: skip
    return t


def activation_table(r: Estimate, unit: MemoryUnit = "gib") -> Table | None:
    a = r.memory.activations
    if a is None:
        return None
    small, name = (2**20, "MiB") if unit == "gib" else (10**6, "MB")
    t = Table(title=f"What one layer saves for backward, per micro-batch, this GPU ({a.kernel} attention, "
                    f"{a.recompute} recompute)", title_justify="left")  # fmt: skip
    t.add_column("tensor")
    t.add_column(name, justify="right")
    for x in a.layer_tensors:
        t.add_row(x.name, f"{x.bytes / small:,.2f}")
    t.add_section()
    t.add_row(Text("one layer", style="bold"), Text(f"{a.layer_bytes / small:,.2f}", style="bold"))
    if a.moe_layer_bytes is not None:
        t.add_row("one MoE layer", f"{a.moe_layer_bytes / small:,.2f}")
    return t


def host_table(r: Estimate, unit: MemoryUnit = "gib") -> Table | None:
    node = r.memory.per_node
    if not node.rows:
        return None
    t = Table(title=f"Offloaded per node ({node.ranks} GPUs)", title_justify="left")
    t.add_column("component")
    t.add_column("where")
    t.add_column(memory_label(unit), justify="right")
    for row in node.rows:
        t.add_row(row.label, "host RAM" if row.location == "cpu" else "NVMe", _mem(row.bytes, unit))
    t.add_section()
    if node.cpu:
        t.add_row(Text("host RAM", style="bold"), "", Text(_mem(node.cpu, unit), style="bold"))
    if node.nvme:
        t.add_row(Text("NVMe", style="bold"), "", Text(_mem(node.nvme, unit), style="bold"))
    return t


def communication_table(r: Estimate, unit: MemoryUnit = "gib") -> Table:
    label = memory_label(unit)
    com = r.communication
    t = Table(title="Communication per optimizer step, per GPU", title_justify="left")
    for name, justify in (("phase", "left"), ("operation", "left"), ("tensor", "left"), ("group (size)", "left"),
                          ("link", "left"), ("dtype", "left"), ("calls", "right"),
                          (f"payload {label}", "right"), (f"sent {label}", "right")):  # fmt: skip
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in com.collectives:
        t.add_row(c.phase, c.op, c.tensor, f"{c.group} ({c.group_size})", c.link, c.dtype, str(c.calls_per_step),
                  _mem(c.payload_bytes, unit), _mem(c.sent_bytes_per_gpu, unit))  # fmt: skip
    if not com.collectives:
        t.add_row("-", "none: one GPU holds everything", "", "", "", "", "", "0", "0")
    t.add_section()
    t.add_row(Text("total", style="bold"), "collectives", "", "", "", "", "",
              Text(_mem(com.payload_bytes, unit), style="bold"), Text(_mem(com.sent_bytes_per_gpu, unit), style="bold"))  # fmt: skip
    if com.inter_node_sent_bytes_per_gpu:
        t.add_row("", "of which in groups across nodes", "", "", "", "", "", "",
                  _mem(com.inter_node_sent_bytes_per_gpu, unit))
    if com.host_transfers:
        t.add_section()
        for h in com.host_transfers:
            t.add_row(h.phase, h.op, h.tensor, "this GPU", h.link, "", str(h.calls_per_step), _mem(h.bytes, unit),
                      _mem(h.bytes, unit))  # fmt: skip
    return t


def links_line(r: Estimate) -> Text:
    g = r.input.gpu
    rate = lambda gbps: "?" if gbps is None else format_rate(gbps * 1e9)  # noqa: E731 (absent from the GPU's file)
    return Text(
        f"links: {g.intra_node_link} {rate(g.intra_node_gbps)} (both directions) inside a node · "
        f"network {rate(g.network_gbps)} per GPU · PCIe {rate(g.pcie_gbps)} each way",
        style="dim",
    )


def time_table(r: Estimate) -> Table | None:
    """Where a step's seconds go, and what the step buys; one unit for the column (the step's)."""
    from memcalc.report.formats import time_parts

    st = r.time
    if st is None:
        return None
    unit = time_unit(st.step_s)
    t = Table(title=f"Step time on {st.cluster} ({'seconds' if unit == 's' else 'milliseconds'})", title_justify="left")
    t.add_column("part")
    t.add_column(unit, justify="right")
    t.add_column("what", style="dim")
    for _, name, s, what in time_parts(st):
        t.add_row(name, format_time(s, unit), what)
    t.add_section()
    t.add_row(Text("step", style="bold"), Text(format_time(st.step_s, unit), style="bold"), "sum of the parts")
    return t


def throughput_line(r: Estimate) -> Text | None:
    from memcalc.report.formats import throughput_text

    return None if r.time is None else Text(throughput_text(r.time), style="bold")


def estimate_parts(r: Estimate, unit: MemoryUnit = "gib") -> list[Text | Fitted]:
    """The lines and tables of an estimate, in order."""
    parts: list[Text | Fitted] = [_headline(r, unit), training_line(r)]
    parts += [Text(f"assumed: {a}", style="bold yellow") for a in r.assumed]  # values a file left open: said first
    parts += [Fitted(memory_table(r, unit)), verdict(r, unit)]
    for extra in (stage_table(r, unit), activation_table(r, unit), host_table(r, unit)):
        if extra is not None:
            parts.append(Fitted(extra))
    parts += [Fitted(communication_table(r, unit), keys=2), links_line(r)]
    time = time_table(r)
    parts += [x for x in (Fitted(time) if time is not None else None, throughput_line(r)) if x is not None]
    parts += [Text(f"note: {text_in_unit(n, unit)}", style="dim") for n in r.notes]
    return parts


def render_estimate(r: Estimate, unit: MemoryUnit = "gib") -> Group:
    from rich.console import Group

    return Group(*estimate_parts(r, unit))


def step_unit(cmp: Comparison) -> str:
    """The one unit of a comparison's step column: seconds, or milliseconds where every step is under one."""
    return time_unit(max((r.time.step_s for r in cmp.estimates if r.time is not None), default=1.0))


def step_header(cmp: Comparison) -> str:
    return f"step {step_unit(cmp)}"


def precisions(cmp: Comparison) -> str:
    """The comparison's precision: one name, or each strategy's default where none was given and they differ."""
    return " / ".join(dict.fromkeys(r.input.precision.name for r in cmp.estimates))


def assumed_precision_line(cmp: Comparison) -> str | None:
    """Where no precision was given: the one each strategy got (its framework's own), and the flag that sets one."""
    if not any(r.input.assumed for r in cmp.estimates):
        return None
    rows: dict[str, list[str]] = {}
    for r in cmp.estimates:
        rows.setdefault(r.input.precision.name, []).append(r.strategy.label)
    if len(rows) == 1:  # one reason for all of them: the first's
        said = cmp.estimates[0].input.assumed[0].removesuffix("; pass precision=")
        return f"assumed: {said}; --precision sets another"
    most = max(rows, key=lambda n: len(rows[n]))  # the most rows' precision: "the others"
    each = ", ".join(f"{n} for {', '.join(labels)}" for n, labels in rows.items() if n != most)
    return f"assumed: each strategy's own precision: {each}, {most} for the others; --precision sets one for all"


def comparison_table(cmp: Comparison, unit: MemoryUnit = "gib", keep: Sequence[str] | None = None) -> Table:
    """Every strategy's row; ``keep``: only the columns of those names (the concise view)."""
    from memcalc.report.formats import auto_rows, micro_batch_cell, row_label  # not on an estimate's path

    label = memory_label(unit)
    first = cmp.estimates[0]
    inp = first.input
    t = Table(
        title=f"{first.model.name} parameters on {inp.cluster.gpus} x {inp.gpu.name} · {precisions(cmp)} · "
        f"{inp.optimizer.name} · {label}",
        title_justify="left",
    )
    # Per GPU unless said: host RAM and NVMe per node; communication sent per GPU per step, and its network part.
    timed = any(r.time is not None for r in cmp.estimates)
    # No activations column when none were counted (no --seq-len): a column of zeros would read as "none needed".
    counted = inp.workload is not None
    auto = auto_rows(cmp.estimates)
    names = ["strategy", *(["micro-batch"] if auto else []), "params", "grads", "optimizer",
             *(["activations"] if counted else []), "other", "total",
             "fits", "host RAM/node", "NVMe/node", "sent/step", "network"] + ([step_header(cmp), "tokens/s/GPU"] if timed else [])
    shown = [i for i, name in enumerate(names) if keep is None or name in keep]
    for name in (names[i] for i in shown):
        t.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=name == "strategy")
    for r in cmp.estimates:
        times = ([format_time(r.time.step_s, step_unit(cmp)), f"{r.time.tokens_per_s_per_gpu:,.0f}"] if r.time is not None else ["-", "-"]
                 ) if timed else []
        g = r.memory.per_gpu
        other = g.total - g.parameters - g.gradients - g.optimizer_states - g.activations
        fits = (Text("yes", style="green") if r.memory.fit.fits else Text("risk", style="yellow")
                if r.memory.fit.verdict == "at-risk" else Text("no", style="red"))
        c = r.communication
        acts = [_mem(g.activations, unit)] if counted else []
        mb = [micro_batch_cell(r)] if auto else []
        cells = [row_label(cmp.estimates, r), *mb, _mem(g.parameters, unit), _mem(g.gradients, unit), _mem(g.optimizer_states, unit),
                 *acts, _mem(other, unit), Text(_mem(g.total, unit), style="bold"), fits,
                 _mem(r.memory.per_node.cpu, unit), _mem(r.memory.per_node.nvme, unit),
                 _mem(c.sent_bytes_per_gpu, unit), _mem(c.inter_node_sent_bytes_per_gpu, unit), *times]  # fmt: skip
        t.add_row(*(cells[i] for i in shown))
    return t


def ranking_line(cmp: Comparison) -> Text:
    """Which strategy needs the least memory, and which is fastest among those that fit."""
    from memcalc.report.formats import ranking_text

    return Text(ranking_text(cmp), style="bold")


def plain_text(items: Sequence[Text | Fitted], width: int) -> str | None:
    """What rich's console prints for ``Group(*items)`` where it is ``width`` wide, shows no styles, parses no markup
    or emoji and writes UTF-8; None where that takes rich itself (memcalc.report.plain says what it draws)."""
    out: list[str] = []
    for item in items:
        lines = item.lines(width) if isinstance(item, Fitted) else text_lines(item, width)
        if lines is None:
            return None
        out += lines
    return "".join(f"{line}\n" for line in out)
