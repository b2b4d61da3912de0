"""Rendering: results -> rich renderables. Returns Tables and Groups; never prints. What the CLI prints wraps each
table in ``Fitted``, which lays it out for the console's width without ever cutting a figure."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from memcalc.units import MemoryUnit, format_memory, format_rate, memory_label, to_memory_unit

if TYPE_CHECKING:  # results import this module to display themselves; at run time it only reads their fields
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
        t.add_row(row.label, _mem(row.bytes, unit), row.detail)
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
                    f"{format_memory(fit.headroom_bytes, unit)} is within the allocator's variability{peak}",
                    style="bold yellow")
    if fit.fits:
        pct = 100 * total / fit.usable_bytes
        return Text(f"✓ fits: {format_memory(total, unit)} of {usable} usable on {gpu.name} ({pct:.0f}%), "
                    f"headroom {format_memory(fit.headroom_bytes, unit)}{peak}", style="bold green")
    return Text(f"✗ does not fit: {format_memory(total, unit)} needed, {usable} usable on {gpu.name}, "
                f"short by {format_memory(-fit.headroom_bytes, unit)}{peak}", style="bold red")


def training_line(r: Estimate) -> Text:
    t = r.training
    parts = [f"dp {t.dp}"] + [f"{k} {v}" for k, v in (("tp", t.tp), ("pp", t.pp), ("cp", t.cp), ("ep", t.ep)) if v > 1]
    if t.sequence_parallel:
        parts.append("sequence parallel")
    if t.virtual_stages > 1:
        parts.append(f"{t.virtual_stages} virtual stages")
    if t.seq_len is not None:
        auto = " (largest that fits)" if t.micro_batch_auto else ""
        parts.append(f"seq {t.seq_len} x micro-batch {t.micro_batch}{auto} x {t.micro_batches} micro-batches")
        parts.append(f"global batch {t.global_batch} = {t.tokens_per_step:,} tokens per step")
    elif t.micro_batches > 1:
        parts.append(f"{t.micro_batches} micro-batches per step")
    return Text("layout: " + " · ".join(parts), style="dim")


def stage_table(r: Estimate, unit: MemoryUnit = "gib") -> Table | None:
    if len(r.memory.stages) < 2:
        return None
    label = memory_label(unit)
    t = Table(title="Pipeline stages (one GPU each)", title_justify="left")
    for col in ("stage", "parameters", "layers", "micro-batches in flight", f"model states {label}",
                f"activations {label}", f"total {label}"):  # fmt: skip
        t.add_column(col, justify="right")
    for st in r.memory.stages:
        mark = " ◀ most loaded" if st.stage == r.memory.most_loaded_stage else ""
        t.add_row(f"{st.stage}{mark}", f"{st.parameters:,}", str(st.layers), f"{st.micro_batches_in_flight:g}",
                  _mem(st.model_states, unit), _mem(st.activations, unit), _mem(st.total, unit))  # fmt: skip
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
        t.add_row("", "of which over the network", "", "", "", "", "", "", _mem(com.inter_node_sent_bytes_per_gpu, unit))
    if com.host_transfers:
        t.add_section()
        for h in com.host_transfers:
            t.add_row(h.phase, h.op, h.tensor, "this GPU", h.link, "", str(h.calls_per_step), _mem(h.bytes, unit),
                      _mem(h.bytes, unit))  # fmt: skip
    return t


def links_line(r: Estimate) -> Text:
    g = r.input.gpu
    return Text(
        f"links: {g.intra_node_link} {format_rate(g.intra_node_gbps * 1e9)} (both directions) inside a node · "
        f"network {format_rate(g.network_gbps * 1e9)} per GPU · PCIe {format_rate(g.pcie_gbps * 1e9)} each way",
        style="dim",
    )


def _s(seconds: float) -> str:
    return f"{seconds:.3f}" if seconds >= 0.01 else f"{seconds * 1e3:.3f} ms"


def _duration(seconds: float) -> str:
    for div, name in ((86400, "days"), (3600, "hours"), (60, "minutes")):
        if seconds >= div:
            return f"{seconds / div:,.1f} {name}"
    return f"{seconds:.1f} s"


def time_table(r: Estimate) -> Table | None:
    """Where a step's seconds go, and what the step buys."""
    st = r.time
    if st is None:
        return None
    b = st.breakdown
    t = Table(title=f"Step time on {st.cluster} (seconds)", title_justify="left")
    t.add_column("part")
    t.add_column("s", justify="right")
    t.add_column("what", style="dim")
    rows = [("compute", b.compute_s, "matmuls and attention at the GPU's achievable rate for their shapes"),
            ("memory-bound ops", b.memory_bound_s, "norms, activations, element-wise: bytes over HBM bandwidth"),
            ("recompute", b.recompute_s, "the forward work recomputation repeats")]
    rows += [(f"communication: {g}", s, "exposed: not hidden behind compute") for g, s in b.communication_s.items()]
    rows += [("pipeline bubble", b.bubble_s, "(p-1) micro-batches' worth, / chunks when interleaved"),
             ("optimizer step", b.optimizer_s, "AdamW on the GPU, or CPU Adam when offloaded"),
             ("offload copies", b.offload_s, "exposed PCIe / NVMe transfers")]
    for name, s, what in rows:
        if s or name == "compute":
            t.add_row(name, _s(s), what)
    t.add_section()
    t.add_row(Text("step", style="bold"), Text(_s(st.step_s), style="bold"), "sum of the parts")
    return t


def throughput_line(r: Estimate) -> Text | None:
    st = r.time
    if st is None:
        return None
    line = (f"{st.tokens_per_s:,.0f} tokens/s ({st.tokens_per_s_per_gpu:,.0f} per GPU) · "
            f"{st.model_tflops_per_gpu:,.0f} model TFLOP/s per GPU of {st.peak_tflops_per_gpu:,.0f} peak · "
            f"MFU {100 * st.mfu:.1f}% · HFU {100 * st.hfu:.1f}%")
    if st.time_to_train_s is not None:
        line += f" · time to train {_duration(st.time_to_train_s)}"
    if st.cost is not None:
        line += f" · cost {st.cost:,.0f} (the price's currency)"
    return Text(line, style="bold")


def render_estimate(r: Estimate, unit: MemoryUnit = "gib") -> Group:
    parts: list[RenderableType] = [_headline(r, unit), training_line(r), Fitted(memory_table(r, unit)),
                                   verdict(r, unit)]  # fmt: skip
    for extra in (stage_table(r, unit), activation_table(r, unit), host_table(r, unit)):
        if extra is not None:
            parts.append(Fitted(extra))
    parts += [Fitted(communication_table(r, unit), keys=2), links_line(r)]
    time = time_table(r)
    parts += [x for x in (Fitted(time) if time is not None else None, throughput_line(r)) if x is not None]
    parts += [Text(f"note: {n}", style="dim") for n in r.notes]
    return Group(*parts)


def comparison_table(cmp: Comparison, unit: MemoryUnit = "gib") -> Table:
    label = memory_label(unit)
    first = cmp.estimates[0]
    inp = first.input
    t = Table(
        title=f"{first.model.name} parameters on {inp.cluster.gpus} x {inp.gpu.name} · {inp.precision.name} · "
        f"{inp.optimizer.name} · {label}",
        title_justify="left",
    )
    # Per GPU unless said: host RAM and NVMe per node; communication sent per GPU per step, and its network part.
    timed = any(r.time is not None for r in cmp.estimates)
    # No activations column when none were counted (no --seq-len): a column of zeros would read as "none needed".
    counted = inp.workload is not None
    names = ["strategy", "params", "grads", "optimizer", *(["activations"] if counted else []), "other", "total",
             "fits", "host RAM/node", "NVMe/node", "sent/step", "network"] + (["step s", "tokens/s/GPU"] if timed else [])
    for name in names:
        t.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=name == "strategy")
    for r in cmp.estimates:
        times = ([_s(r.time.step_s), f"{r.time.tokens_per_s_per_gpu:,.0f}"] if r.time is not None else ["-", "-"]
                 ) if timed else []
        g = r.memory.per_gpu
        other = g.total - g.parameters - g.gradients - g.optimizer_states - g.activations
        fits = Text("yes", style="green") if r.memory.fit.fits else Text("no", style="red")
        c = r.communication
        acts = [_mem(g.activations, unit)] if counted else []
        t.add_row(r.strategy.label, _mem(g.parameters, unit), _mem(g.gradients, unit), _mem(g.optimizer_states, unit),
                  *acts, _mem(other, unit), Text(_mem(g.total, unit), style="bold"), fits,
                  _mem(r.memory.per_node.cpu, unit), _mem(r.memory.per_node.nvme, unit),
                  _mem(c.sent_bytes_per_gpu, unit), _mem(c.inter_node_sent_bytes_per_gpu, unit), *times)  # fmt: skip
    return t


def ranking_line(cmp: Comparison) -> Text:
    """Which strategy needs the least memory, and which is fastest among those that fit."""
    parts = [f"least memory: {cmp.smallest}"]
    if cmp.by_time:
        parts.append(f"fastest that fits: {cmp.fastest_that_fits}" if cmp.fastest_that_fits
                     else "none that fits has a step time")
    else:
        parts.append("no step times: give the model's shape and --seq-len to rank by time")
    return Text(" · ".join(parts), style="bold")


def render(obj: Estimate | Comparison, unit: MemoryUnit = "gib") -> RenderableType:
    kind = type(obj).__name__
    if kind == "Comparison":
        table = Fitted(comparison_table(obj, unit), breaks=("host RAM/node", "step s"))  # type: ignore[arg-type]
        return Group(table, ranking_line(obj))  # type: ignore[arg-type]
    if kind == "Estimate":
        return render_estimate(obj, unit)  # type: ignore[arg-type]
    raise TypeError(f"cannot render {type(obj).__name__}")


def to_text_and_html(obj: Estimate | Comparison, width: int = 120) -> tuple[str, str]:
    """Plain text and HTML of the rendering, for Jupyter/IPython display: at least ``width`` columns, wider when a
    table needs it, so that no number is ever cut."""
    renderable = render(obj)
    probe = Console(width=10_000, file=_Null(), markup=False, emoji=False, highlight=False)
    tables = [r.table for r in getattr(renderable, "renderables", [renderable]) if isinstance(r, Fitted)]
    width = max([width] + [probe.measure(t).maximum for t in tables])
    console = Console(record=True, width=width, file=_Null(), force_jupyter=False, markup=False, emoji=False,
                      highlight=False)
    console.print(renderable)
    return console.export_text(clear=False), console.export_html(inline_styles=True)


class Fitted:
    """A table laid out for the console's width; a figure (a right-aligned cell) is never wrapped, cut or folded.

    In order: the table as built when it fits whole; else its prose (left-aligned) columns wrapped at spaces, figure
    columns as wide as their widest figure, headers wrapped at spaces; else stacked tables that each repeat the first
    ``keys`` columns, cut where a header in ``breaks`` starts a group, groups that fit together kept together, and a
    group still too wide cut into the fewest even runs of columns that fit.
    """

    def __init__(self, table: Table, keys: int = 1, breaks: Sequence[str] = ()) -> None:
        self.table, self.keys, self.breaks = table, keys, tuple(breaks)
        self.need = [_column_need(c) for c in table.columns]
        # The width the table takes unwrapped, as rich lays it out with its default box and padding: every column's
        # widest line (header included) + two padding cells and a rule per column + the closing rule. Computed from
        # the cells' text, without rich's measuring pass.
        self.widest = [max(cell_len(line) for text in [_plain(c.header), *map(_plain, c._cells)]
                           for line in (text.splitlines() or [""])) for c in table.columns]
        self.natural = sum(self.widest) + 3 * len(table.columns) + 1

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Table]:
        width = options.max_width
        if self.natural <= width:
            # Whole: every column at its widest line, given to rich, which then skips measuring every cell.
            yield self._whole() or self._build(list(range(len(self.need))), self.widest, self.table.title, wrap=False)
            return
        parts = self.parts(width)
        if parts is None:  # narrower than the keys and one figure column: rich squeezes the table
            yield self.table
            return
        for n, part in enumerate(parts):
            yield self._build(part, self.widths(part, width) or [], self.table.title if n == 0 else None)

    def widths(self, cols: list[int], width: int) -> list[int] | None:
        """Content widths of ``cols`` in a table ``width`` wide, or None when even wrapped prose is too wide."""
        lo, w = [self.need[i][0] for i in cols], [self.need[i][1] for i in cols]
        # rich's default box and padding: each column has two padding cells and a rule on its left; one rule closes
        room = width - (3 * len(cols) + 1)
        if sum(lo) > room:
            return None
        while sum(w) > room:  # narrow the widest prose column that can still wrap, as rich does
            j = max((k for k in range(len(w)) if w[k] > lo[k]), key=lambda k: w[k])
            w[j] -= 1
        return w

    def parts(self, width: int) -> list[list[int]] | None:
        keys, rest = list(range(self.keys)), range(self.keys, len(self.need))
        if self.widths(keys + list(rest), width) is not None:
            return [keys + list(rest)]
        groups: list[list[int]] = []
        for i in rest:
            if not groups or _plain(self.table.columns[i].header) in self.breaks:
                groups.append([])
            groups[-1].append(i)
        packed: list[list[int]] = []
        for g in groups:
            if packed and self.widths(keys + packed[-1] + g, width) is not None:
                packed[-1] += g
            else:
                packed.append(g)
        out: list[list[int]] = []
        for g in packed:
            runs = [_even(g, k) for k in range(1, len(g) + 1)]
            fit = next((r for r in runs if all(self.widths(keys + c, width) is not None for c in r)), None)
            if fit is None:
                return None
            out += [keys + c for c in fit]
        return out

    def _whole(self) -> Table | None:
        """The whole table with every cell already padded and justified to its column's width: what rich would draw
        (same characters, same styles), without its per-cell padding and wrapping passes. None when a cell has
        more than one line or a column is centred (rich lays those out itself)."""
        cols = self.table.columns
        if any(c.justify not in ("left", "right") for c in cols):
            return None
        cells = [[c.header, *c._cells] for c in cols]
        if any("\n" in _plain(x) for col in cells for x in col):
            return None
        t = copy.copy(self.table)
        t.padding = (0, 0, 0, 0)
        t.columns = [replace(c, header=_fill(c.header, w, c.justify), _cells=[_fill(x, w, c.justify) for x in c._cells],
                             width=w + 2, min_width=None, max_width=None, justify="left", no_wrap=True, _index=n)
                     for n, (c, w) in enumerate(zip(cols, self.widest))]
        return t

    def _build(self, cols: list[int], widths: list[int], title: object, wrap: bool = True) -> Table:
        t = copy.copy(self.table)
        t.title = title  # type: ignore[assignment]
        # No figure is wider than its column, so none wraps; headers and prose wrap at spaces (when they must).
        picked = zip((self.table.columns[i] for i in cols), widths)
        t.columns = [replace(c, width=w, min_width=None, max_width=None, overflow="fold", no_wrap=not wrap, _index=n)
                     for n, (c, w) in enumerate(picked)]
        return t


def _fill(cell: object, width: int, justify: str) -> object:
    """A one-line cell as rich draws it in a column ``width`` wide with one space of padding each side."""
    if isinstance(cell, Text):
        out = cell.copy()
        gap = width - cell_len(out.plain)
        out.pad_left(1 + (gap if justify == "right" else 0))
        out.pad_right(1 + (gap if justify == "left" else 0))
        return out
    text = str(cell)
    gap = " " * (width - cell_len(text))
    return f" {gap}{text} " if justify == "right" else f" {text}{gap} "


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _column_need(col: Column) -> tuple[int, int]:
    """(narrowest, widest) content width: a figure column's widest cell, or its header's longest word if wider;
    prose down to its longest word."""
    cells = [_plain(c) for c in col._cells]
    lines = [line for text in [*cells, _plain(col.header)] for line in text.splitlines()]
    word = max((cell_len(w) for line in lines for w in line.split()), default=1)
    if col.justify == "right":
        return (w := max([word] + [cell_len(line) for c in cells for line in c.splitlines()])), w
    return word, max([word] + [cell_len(line) for line in lines])


def _even(cols: list[int], k: int) -> list[list[int]]:
    return [cols[i * len(cols) // k:(i + 1) * len(cols) // k] for i in range(k)]


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
