"""Results as CSV and as GitHub Markdown: pure functions that return strings (standard library only).

CSV keeps every size as an integer number of bytes, with the same size in GiB (or GB) beside it, so a
spreadsheet reads exact figures, and every duration in seconds; Markdown shows sizes in one labelled unit and a
step's parts in one unit (seconds, or milliseconds for a step under one), as the terminal tables do. Both carry
what the tables carry: the step time, throughput, MFU, time to train and cost, and compare's rankings.
    >>> print(to_markdown(memcalc.compare(params=7e9, gpus=8)))
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memcalc.errors import InputError
from memcalc.units import (
    MEMORY_UNITS,
    MemoryUnit,
    format_duration,
    format_time,
    memory_label,
    text_in_unit,
    time_unit,
    to_memory_unit,
)

if TYPE_CHECKING:  # the results' display hooks render through this module: told apart by their class's name
    from memcalc.report.results import Comparison, Estimate
    from memcalc.report.results_time import StepTimeInfo

Rows = Sequence[Mapping[str, Any]]

ESTIMATE_COLUMNS = ("section", "key", "label", "location", "category", "bytes", "{unit}", "payload_bytes",
                    "calls_per_step", "group", "group_size", "dtype", "detail", "value", "value_unit")  # fmt: skip
"""One row per memory row (per GPU, then per node), then per collective and host transfer, then (with a step
time) per part of the step and per throughput figure: those carry ``value`` in ``value_unit`` (s, tokens/s, ...)."""


# ---- Step time: shared by every format (the terminal's tables as well) ----


def time_parts(st: StepTimeInfo) -> list[tuple[str, str, float, str]]:
    """The parts of a step that take time (compute always): (key, label, seconds, what), in the table's order."""
    b = st.breakdown
    rows = [("compute", "compute", b.compute_s, "matmuls and attention at the GPU's achievable rate for their shapes"),
            ("memory_bound", "memory-bound ops", b.memory_bound_s,
             "norms, activations, element-wise: bytes over HBM bandwidth"),
            ("recompute", "recompute", b.recompute_s, "the forward work recomputation repeats")]  # fmt: skip
    rows += [(f"communication:{g}", f"communication: {g}", s, "exposed: not hidden behind compute")
             for g, s in b.communication_s.items()]  # fmt: skip
    rows += [("bubble", "pipeline bubble", b.bubble_s, "(p-1) micro-batches' worth, / chunks when interleaved"),
             ("optimizer", "optimizer step", b.optimizer_s, "AdamW on the GPU, or CPU Adam when offloaded"),
             ("offload", "offload copies", b.offload_s, "exposed PCIe / NVMe transfers"),
             ("host", "host (launches)", b.host_s, "the GPU waiting for the host to launch kernels")]  # fmt: skip
    return [row for row in rows if row[2] or row[0] == "compute"]


def throughput_text(st: StepTimeInfo) -> str:
    """What a step buys, in one line: tokens per second, model TFLOP/s, MFU and HFU, time to train and cost."""
    line = (f"{st.tokens_per_s:,.0f} tokens/s ({st.tokens_per_s_per_gpu:,.0f} per GPU) · "
            f"{st.model_tflops_per_gpu:,.0f} model TFLOP/s per GPU of {st.peak_tflops_per_gpu:,.0f} peak · "
            f"MFU {100 * st.mfu:.1f}% · HFU {100 * st.hfu:.1f}%")  # fmt: skip
    if st.time_to_train_s is not None:
        line += f" · time to train {format_duration(st.time_to_train_s)}"
    if st.cost is not None:
        line += f" · cost {st.cost:,.0f} (the price's currency)"
    return line


def ranking_text(cmp: Comparison) -> str:
    """Which strategy needs the least memory, and which is fastest among those that fit."""
    parts = [f"least memory: {cmp.smallest}"]
    if cmp.by_time:
        parts.append(f"fastest that fits: {cmp.fastest_that_fits}" if cmp.fastest_that_fits
                     else "none that fits has a step time")  # fmt: skip
    else:
        parts.append("no step times: give the model's shape and --seq-len to rank by time")
    return " · ".join(parts)


def throughput_figures(st: StepTimeInfo) -> list[tuple[str, str, float | None, str]]:
    """(key, label, value, unit) of what a step buys; time to train and cost are None unless given."""
    return [("tokens_per_s", "tokens per second", st.tokens_per_s, "tokens/s"),
            ("tokens_per_s_per_gpu", "tokens per second per GPU", st.tokens_per_s_per_gpu, "tokens/s"),
            ("model_tflops_per_gpu", "model TFLOP/s per GPU", st.model_tflops_per_gpu, "TFLOP/s"),
            ("peak_tflops_per_gpu", "peak TFLOP/s per GPU", st.peak_tflops_per_gpu, "TFLOP/s"),
            ("mfu", "model FLOPs utilisation", st.mfu, "fraction"),
            ("hfu", "hardware FLOPs utilisation", st.hfu, "fraction"),
            ("time_to_train", "time to train", st.time_to_train_s, "s"),
            ("cost", "cost", st.cost, "the price's currency")]  # fmt: skip


def _unit(unit: str) -> MemoryUnit:
    if unit not in MEMORY_UNITS:
        raise InputError(f"unit {unit!r} is not accepted; accepted: {', '.join(MEMORY_UNITS)}")
    return unit  # type: ignore[return-value]


def _in_unit(n_bytes: int, unit: MemoryUnit) -> str:
    """A size in GiB/GB for CSV: 6 decimals (a kilobyte's resolution), no thousands separators."""
    return f"{to_memory_unit(n_bytes, unit):.6f}"


def _csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


# ---- CSV ----


def estimate_rows(r: Estimate, unit: MemoryUnit = "gib") -> list[list[Any]]:
    """The rows of ``to_csv(estimate)``, in ``ESTIMATE_COLUMNS`` order."""
    rows: list[list[Any]] = []

    def mem(section: str, key: str, label: str, location: str, category: str, n: int, detail: str = "") -> None:
        rows.append([section, key, label, location, category, n, _in_unit(n, unit), "", "", "", "", "", detail])

    g, node = r.memory.per_gpu, r.memory.per_node
    for row in g.rows:
        mem("per_gpu", row.key, row.label, row.location, row.category, row.bytes, text_in_unit(row.detail, unit))
    mem("per_gpu", "total", "total per GPU", "gpu", "total", g.total, "sum of the per_gpu rows")
    for row in node.rows:
        mem("per_node", row.key, row.label, row.location, row.category, row.bytes, row.detail)
    mem("per_node", "cpu", "host RAM per node", "cpu", "total", node.cpu, f"offloaded states of {node.ranks} ranks")
    mem("per_node", "nvme", "NVMe per node", "nvme", "total", node.nvme, f"offloaded states of {node.ranks} ranks")
    com = r.communication
    for c in com.collectives:
        rows.append(["communication", c.op, f"{c.op} of {c.tensor}", c.link, c.phase, c.sent_bytes_per_gpu,
                     _in_unit(c.sent_bytes_per_gpu, unit), c.payload_bytes, c.calls_per_step, c.group, c.group_size,
                     c.dtype, "bytes: sent per GPU per step (payload x bus factor); payload_bytes: nccl-tests' S x calls"])  # fmt: skip
    rows.append(["communication", "total", "collectives per GPU per step", "", "total", com.sent_bytes_per_gpu,
                 _in_unit(com.sent_bytes_per_gpu, unit), com.payload_bytes, "", "", "", "", "sum of the collectives"])  # fmt: skip
    for h in com.host_transfers:
        rows.append(["host_transfer", h.op, f"{h.op} of {h.tensor}", h.link, h.phase, h.bytes, _in_unit(h.bytes, unit),
                     "", h.calls_per_step, "", "", "", "bytes per GPU per step"])  # fmt: skip
    rows = [row + ["", ""] for row in rows]
    st = r.time
    if st is not None:
        blank = [""] * 7  # bytes .. dtype
        for key, label, seconds, what in time_parts(st):
            rows.append(["time", key, label, "", "part", *blank, what, seconds, "s"])
        rows.append(["time", "step", "step", "", "total", *blank, f"sum of the parts, on {st.cluster}", st.step_s, "s"])
        rows += [["throughput", key, label, "", "", *blank, "", value, u]
                 for key, label, value, u in throughput_figures(st) if value is not None]  # fmt: skip
    return rows


def comparison_figures(r: Estimate) -> dict[str, Any]:
    """Every figure of one strategy, flat: names end in ``_bytes`` for sizes (integers)."""
    g, fit, node, com = r.memory.per_gpu, r.memory.fit, r.memory.per_node, r.communication
    out: dict[str, Any] = {"strategy": r.strategy.name, "label": r.strategy.label, "accounting": r.accounting,
                           "framework": r.strategy.framework,
                           "shard_group_size": r.strategy.shard_group_size, "replicas": r.strategy.replicas,
                           "offload_optimizer": r.strategy.offload_optimizer,
                           "offload_params": r.strategy.offload_params, "fits": fit.fits}  # fmt: skip
    if r.training.micro_batch_auto:  # --micro-batch auto: each row's own (None: not even 1 fits)
        out["micro_batch"] = None if r.training.micro_batch_none_fits else r.training.micro_batch
    sizes = {f"{k}_bytes": v for k, v in g.model_dump(exclude={"rows"}).items()}
    sizes["other_bytes"] = g.total - g.parameters - g.gradients - g.optimizer_states - g.activations
    sizes |= {"usable_bytes": fit.usable_bytes, "headroom_bytes": fit.headroom_bytes,
              "host_ram_per_node_bytes": node.cpu, "nvme_per_node_bytes": node.nvme}  # fmt: skip
    sizes |= {(k if "bytes" in k else f"{k}_bytes"): v for k, v in com.model_dump(exclude={"collectives", "host_transfers"}).items()}
    return out | sizes


def ranked_figures(cmp: Comparison, r: Estimate) -> dict[str, Any]:
    """A compared row's step time and what it buys (None where it has none), and its place in the rankings
    (1 = least memory, 1 = fastest; None: no step time)."""
    timed = any(e.time is not None for e in cmp.estimates)
    st = r.time
    out: dict[str, Any] = {"rank_by_memory": _rank(cmp.by_memory, r)}
    if timed:
        out |= {"step_s": st and st.step_s, "tokens_per_s_per_gpu": st and st.tokens_per_s_per_gpu,
                "mfu": st and st.mfu}  # fmt: skip
        if any(e.time is not None and e.time.time_to_train_s is not None for e in cmp.estimates):
            out["time_to_train_s"] = st and st.time_to_train_s
        if any(e.time is not None and e.time.cost is not None for e in cmp.estimates):
            out["cost"] = st and st.cost
        out |= {"rank_by_time": _rank(cmp.by_time, r),
                "fastest_that_fits": cmp.fastest_that_fits is not None and cmp.fastest_that_fits == r.strategy.label}
    return out


def _rank(labels: Sequence[str], r: Estimate) -> int | None:
    return labels.index(r.strategy.label) + 1 if r.strategy.label in labels else None


def comparison_rows(cmp: Comparison, unit: MemoryUnit = "gib") -> tuple[list[str], list[list[Any]]]:
    """Header and rows of ``to_csv(comparison)``: every ``_bytes`` figure is followed by the same in ``unit``; then
    the step time, tokens/s/GPU and MFU (and time to train and cost where given) and the rankings."""
    figures = [comparison_figures(r) | ranked_figures(cmp, r) for r in cmp.estimates]
    label = memory_label(unit).lower()
    header: list[str] = []
    for name in figures[0] if figures else ():
        header.append(name)
        if name.endswith("_bytes") or "_bytes_" in name:
            header.append(name.replace("bytes", label, 1))
    rows = []
    for f in figures:
        row: list[Any] = []
        for name, value in f.items():
            row.append(_cell(value))
            if name.endswith("_bytes") or "_bytes_" in name:
                row.append(_in_unit(value, unit))
        rows.append(row)
    return header, rows


def _catalogue_header(rows: Rows) -> list[str]:
    header: list[str] = []
    for row in rows:
        header += [k for k in row if k not in header]
    return header


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v) for v in value)
    return value


def to_csv(obj: Estimate | Comparison | Rows, unit: str = "gib") -> str:
    """CSV text: an estimate's memory and communication rows, a comparison's strategies, or catalogue rows."""
    u = _unit(unit)
    if _kind(obj) == "Estimate":
        header = [c.format(unit=memory_label(u)) for c in ESTIMATE_COLUMNS]
        return _csv(header, estimate_rows(obj, u))
    if _kind(obj) == "Comparison":
        return _csv(*comparison_rows(obj, u))
    rows = _rows(obj)
    header = _catalogue_header(rows)
    return _csv(header, ([_cell(row.get(k)) for k in header] for row in rows))


def _kind(obj: object) -> str:
    return type(obj).__name__


def _rows(obj: Any) -> Rows:
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Sequence) or not all(isinstance(r, Mapping) for r in obj):
        raise InputError(f"cannot format {type(obj).__name__}; accepted: an Estimate, a Comparison or a list of dict rows")
    return obj


# ---- Markdown ----


def _md_cell(value: Any) -> str:
    text = str(_cell(value))
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> str:
    """A GitHub table; columns whose index is in ``right`` are right-aligned (numbers)."""
    right = set(right)
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _mem(n_bytes: int, unit: MemoryUnit) -> str:
    return f"{to_memory_unit(n_bytes, unit):,.2f}"


def _estimate_markdown(r: Estimate, u: MemoryUnit) -> str:
    label = memory_label(u)
    inp, g = r.input, r.memory.per_gpu
    name = r.model.name or "model"
    head = (f"**{name} ({r.model.parameters:,} parameters) · {r.strategy.label} · {inp.cluster.gpus} x {inp.gpu.name} · "
            f"{inp.precision.name} · {inp.optimizer.name} · accounting: {r.accounting}**\n")  # fmt: skip
    head += f"\n{layout_text(r)}\n"
    head += "".join(f"\n- assumed: {a}" for a in r.assumed) + ("\n" if r.assumed else "")
    memory = [[row.label, _mem(row.bytes, u), row.location, text_in_unit(row.detail, u)] for row in g.rows]
    memory.append(["**total**", f"**{_mem(g.total, u)}**", "gpu", "sum of the rows"])
    fit = r.memory.fit
    verdict = (f"{'Fits' if fit.fits else 'Does not fit'}: {_mem(g.total, u)} {label} of {_mem(fit.usable_bytes, u)} "
               f"{label} usable per GPU, headroom {_mem(fit.headroom_bytes, u)} {label}.\n")  # fmt: skip
    parts = [head, "Memory per GPU\n", markdown_table(["component", label, "location", "formula · source"], memory, [1]),
             verdict]  # fmt: skip
    node = r.memory.per_node
    if node.rows:
        rows = [[row.label, row.location, _mem(row.bytes, u)] for row in node.rows]
        parts += [f"Offloaded states per node ({node.ranks} ranks)\n",
                  markdown_table(["component", "location", label], rows, [2])]  # fmt: skip
    com = r.communication
    rows = [[c.phase, c.op, c.tensor, f"{c.group} ({c.group_size})", c.link, c.dtype, c.calls_per_step,
             _mem(c.payload_bytes, u), _mem(c.sent_bytes_per_gpu, u)] for c in com.collectives]  # fmt: skip
    rows += [[h.phase, h.op, h.tensor, "this GPU", h.link, "", h.calls_per_step, _mem(h.bytes, u), _mem(h.bytes, u)]
             for h in com.host_transfers]  # fmt: skip
    rows.append(["**total**", "collectives", "", "", "", "", "", f"**{_mem(com.payload_bytes, u)}**",
                 f"**{_mem(com.sent_bytes_per_gpu, u)}**"])  # fmt: skip
    header = ["phase", "operation", "tensor", "group (size)", "link", "dtype", "calls",
              f"payload {label}", f"sent {label}"]  # fmt: skip
    parts += ["Communication per optimizer step, per GPU\n", markdown_table(header, rows, [6, 7, 8])]
    if r.time is not None:
        parts.append(_time_markdown(r.time))
    if r.notes:
        parts.append("".join(f"- note: {text_in_unit(n, u)}\n" for n in r.notes))
    return "\n".join(parts)


def layout_text(r: Estimate) -> str:
    """The layout line: parallel degrees, then the batch and the attention that counted the activations."""
    t = r.training
    parts = [f"dp {t.dp}"] + [f"{k} {v}" for k, v in (("tp", t.tp), ("pp", t.pp), ("cp", t.cp), ("ep", t.ep)) if v > 1]
    if t.sequence_parallel:
        parts.append("sequence parallel")
    if t.virtual_stages > 1:
        parts.append(f"{t.virtual_stages} virtual stages")
    if t.seq_len is not None:
        auto = (" (auto: none fits)" if t.micro_batch_none_fits else " (largest that fits)" if t.micro_batch_auto
                else "")  # fmt: skip
        parts.append(f"seq {t.seq_len} x micro-batch {t.micro_batch}{auto} x {t.micro_batches} micro-batches")
        work = r.input.workload
        if work is not None and work.attention is not None:
            parts.append(f"{work.attention} attention")
        parts.append(f"global batch {t.global_batch} = {t.tokens_per_step:,} tokens per step")
    elif t.micro_batches > 1:
        parts.append(f"{t.micro_batches} micro-batches per step")
    return "layout: " + " · ".join(parts)


def _time_markdown(st: StepTimeInfo) -> str:
    """The step time table (one unit: the step's) and what the step buys."""
    unit = time_unit(st.step_s)
    rows = [[label, format_time(seconds, unit), what] for _, label, seconds, what in time_parts(st)]
    rows.append(["**step**", f"**{format_time(st.step_s, unit)}**", "sum of the parts"])
    name = "seconds" if unit == "s" else "milliseconds"
    return (f"Step time on {st.cluster} ({name})\n\n" + markdown_table(["part", unit, "what"], rows, [1])
            + f"\n**{throughput_text(st)}**\n")


def row_label(rows: Sequence[Estimate], r: Estimate) -> str:
    """A compared row's strategy, with its accounting when the rows take more than one (``memcalc.compare``
    answers each row as its own estimate would)."""
    return r.strategy.label + (f" ({r.accounting})" if r.accounting != "realistic" and mixed(rows) else "")


def mixed(rows: Sequence[Estimate]) -> bool:
    """Whether the compared rows take more than one accounting."""
    return len({r.accounting for r in rows}) > 1


def auto_rows(rows: Sequence[Estimate]) -> bool:
    """Whether the compared rows took ``--micro-batch auto`` (each its own largest micro-batch that fits)."""
    return any(r.training.micro_batch_auto for r in rows)


def micro_batch_cell(r: Estimate) -> str:
    """A compared row's micro-batch under ``--micro-batch auto``: the largest that fits, or none."""
    return "none" if r.training.micro_batch_none_fits else str(r.training.micro_batch)


def auto_line(cmp: Comparison) -> str | None:
    """Under ``--micro-batch auto``: what the micro-batch column means, and how the rows are ranked."""
    if not auto_rows(cmp.estimates):
        return None
    return ("--micro-batch auto: each row at its own largest micro-batch that fits (none: not even 1 fits, the row "
            "shows micro-batch 1); the fastest is the one with the most tokens per second")


def accounting_line(cmp: Comparison) -> str | None:
    """Under a comparison whose rows take more than one accounting: which rows are not the realistic accounting's,
    and why (each estimate's own note)."""
    if not mixed(cmp.estimates):
        return None
    prefix = "realistic accounting (the peak of a real step) not used: "
    rows: dict[str, list[str]] = {}  # why -> the rows it keeps from the realistic accounting
    for r in cmp.estimates:
        if r.accounting != "realistic":
            why = next((n[len(prefix):] for n in r.notes if n.startswith(prefix)), f"--accounting {r.accounting}")
            rows.setdefault(why, []).append(r.strategy.label)
    return ("rows marked (paper) are the ZeRO paper's states and Korthikanti's activations, not a step's peak; the "
            "others are the realistic accounting's peak. Not realistic: "
            + "; ".join(f"{', '.join(labels)}: {why}" for why, labels in rows.items()))


def _comparison_markdown(cmp: Comparison, u: MemoryUnit) -> str:
    label = memory_label(u)
    auto = auto_rows(cmp.estimates)
    sizes = ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes", "other_bytes",
             "total_bytes")  # fmt: skip
    header = ["strategy", *(["micro-batch"] if auto else []), f"params {label}", f"grads {label}",
              f"optimizer {label}", f"activations {label}", f"other {label}", f"total {label}", "fits",
              f"host RAM/node {label}", f"NVMe/node {label}", f"sent/step {label}", f"network/step {label}"]  # fmt: skip
    timed = _time_columns(cmp)
    header += [name for name, _ in timed]
    rows = []
    for r in cmp.estimates:
        f = comparison_figures(r)
        fits = "yes" if f["fits"] else "risk" if r.memory.fit.verdict == "at-risk" else "no"
        rows.append([row_label(cmp.estimates, r), *([micro_batch_cell(r)] if auto else [])]
                    + [_mem(f[k], u) for k in sizes] + [fits]
                    + [_mem(f[k], u) for k in ("host_ram_per_node_bytes", "nvme_per_node_bytes", "sent_bytes_per_gpu",
                                               "inter_node_sent_bytes_per_gpu")]
                    + [cell(r) for _, cell in timed])  # fmt: skip
    head = ""
    if cmp.estimates:
        first = cmp.estimates[0]
        head = (f"**{first.model.name or 'model'} ({first.model.parameters:,} parameters) on {first.input.cluster.gpus} x "
                f"{first.input.gpu.name}, per GPU unless marked per node; sent per optimizer step**\n\n")  # fmt: skip
    lines = [x for x in (auto_line(cmp), accounting_line(cmp)) if x]
    return (head + markdown_table(header, rows, [i for i in range(1, len(header)) if header[i] != "fits"])
            + f"\n**{ranking_text(cmp)}**\n"
            + ("\n" + "".join(f"- note: {text_in_unit(line, u)}\n" for line in lines) if lines else ""))


def _time_columns(cmp: Comparison) -> list[tuple[str, Any]]:
    """A comparison's time columns (none without a step time): (header, the cell of an estimate); the step in one
    unit, the longest step's."""
    timed = [e.time for e in cmp.estimates if e.time is not None]
    if not timed:
        return []
    unit = time_unit(max(st.step_s for st in timed))

    def of(fmt: Any) -> Any:
        return lambda r: "-" if r.time is None or fmt(r.time) is None else fmt(r.time)

    cols = [(f"step {unit}", of(lambda st: format_time(st.step_s, unit))),
            ("tokens/s/GPU", of(lambda st: f"{st.tokens_per_s_per_gpu:,.0f}")),
            ("MFU %", of(lambda st: f"{100 * st.mfu:.1f}"))]  # fmt: skip
    if any(st.time_to_train_s is not None for st in timed):
        cols.append(("time to train", of(lambda st: st.time_to_train_s and format_duration(st.time_to_train_s))))
    if any(st.cost is not None for st in timed):
        cols.append(("cost", of(lambda st: st.cost and f"{st.cost:,.0f}")))
    return cols


def to_markdown(obj: Estimate | Comparison | Rows, unit: str = "gib") -> str:
    """GitHub Markdown: an estimate's tables, a comparison's table, or a catalogue table; units in the headers."""
    u = _unit(unit)
    if _kind(obj) == "Estimate":
        return _estimate_markdown(obj, u)
    if _kind(obj) == "Comparison":
        return _comparison_markdown(obj, u)
    rows = _rows(obj)
    header = _catalogue_header(rows)
    numeric = [i for i, k in enumerate(header) if rows and all(isinstance(r.get(k), (int, float)) and not
                                                              isinstance(r.get(k), bool) for r in rows)]  # fmt: skip
    return markdown_table(header, ([row.get(k) for k in header] for row in rows), numeric)
