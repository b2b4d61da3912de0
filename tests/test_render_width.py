"""The CLI's tables fit the terminal: every figure whole at 80, 100 and 120 columns, no line wider than the console."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

import memcalc
from memcalc.report.render import Fitted, comparison_table
from memcalc.report.view import render

WIDTHS = (80, 100, 120)
_RULES = str.maketrans({c: " " for c in "│┃┆┊║"})

CASES = {
    "compare 7e9": lambda: memcalc.compare(params=7e9, gpus=64),
    "compare llama-3-8b timed": lambda: memcalc.compare(model="llama-3-8b", gpus=64, gpu="h100", seq_len=4096),
    "zero-3 175e9": lambda: memcalc.estimate(params=175e9, stage=3, gpus=128),
    "fsdp llama-3-8b timed": lambda: memcalc.estimate(model="llama-3-8b", fsdp="FULL_SHARD", gpus=64, gpu="h100",
                                                      seq_len=8192, strategy=None),
    "zero-3 offload llama-2-7b": lambda: memcalc.estimate(model="llama-2-7b", strategy="zero-3+opt-cpu+param-nvme",
                                                          gpus=16, seq_len=4096),
}  # fmt: skip
_results: dict[str, object] = {}


def _result(name: str):
    if name not in _results:
        _results[name] = CASES[name]()
    return _results[name]


def _text(obj: object, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), markup=False, emoji=False, highlight=False)
    console.print(render(obj))  # type: ignore[arg-type]
    return console.export_text()


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:,.2f}"


def _s(seconds: float, longest: float) -> str:
    """A step time in its column's one unit: seconds, or milliseconds where the longest step is under a second."""
    return f"{seconds:,.3f}" if longest >= 1 else f"{seconds * 1e3:,.2f}"


def _estimate_figures(r) -> list[str]:
    """Every figure the estimate's tables show, once per cell that shows it."""
    g, node, com = r.memory.per_gpu, r.memory.per_node, r.communication
    out = [_gib(row.bytes) for row in g.rows] + [_gib(g.total)]
    out += [_gib(row.bytes) for row in node.rows] + [_gib(b) for b in (node.cpu, node.nvme) if b]
    out += [_gib(b) for c in com.collectives for b in (c.payload_bytes, c.sent_bytes_per_gpu)]
    out += [_gib(com.payload_bytes), _gib(com.sent_bytes_per_gpu)]
    out += [_gib(com.inter_node_sent_bytes_per_gpu)] if com.inter_node_sent_bytes_per_gpu else []
    out += [_gib(h.bytes) for h in com.host_transfers for _ in range(2)]
    if r.time is not None:
        out.append(_s(r.time.step_s, r.time.step_s))
    return out


def _comparison_figures(cmp) -> list[str]:
    out = []
    longest = max((r.time.step_s for r in cmp.estimates if r.time is not None), default=1.0)
    for r in cmp.estimates:
        g, c = r.memory.per_gpu, r.communication
        other = g.total - g.parameters - g.gradients - g.optimizer_states - g.activations
        acts = (g.activations,) if r.input.workload is not None else ()  # no column when none were counted
        out += [_gib(b) for b in (g.parameters, g.gradients, g.optimizer_states, *acts, other, g.total,
                                  r.memory.per_node.cpu, r.memory.per_node.nvme, c.sent_bytes_per_gpu,
                                  c.inter_node_sent_bytes_per_gpu)]  # fmt: skip
        out += r.strategy.label.split()
        if r.time is not None:
            out += [_s(r.time.step_s, longest), f"{r.time.tokens_per_s_per_gpu:,.0f}"]
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(CASES))
def test_every_figure_whole_and_no_line_too_wide(name: str, width: int) -> None:
    obj = _result(name)
    text = _text(obj, width)
    lines = text.splitlines()
    # Whole figures are whole words between the rules; a cut or folded figure would leave a different word.
    words = Counter(w for line in lines for w in line.translate(_RULES).split())
    want = Counter(_comparison_figures(obj) if name.startswith("compare") else _estimate_figures(obj))
    # Headers wrap at spaces: each of their words stays whole.
    want += Counter(w for f in render(obj).renderables if isinstance(f, Fitted)  # type: ignore[attr-defined]
                    for c in f.table.columns for w in str(c.header).split())  # fmt: skip
    missing = want - words
    assert not missing, f"{name} at {width} columns lacks {dict(missing)}"
    assert "…" not in text
    assert max(cell_len(line) for line in lines) <= width


def test_ddp_total_is_whole_at_100_columns() -> None:
    # The figure that used to print as "10…": DDP's 104.81 GiB per GPU for 7e9 parameters on 64 GPUs.
    cmp = _result("compare 7e9")
    ddp = next(r for r in cmp.estimates if r.strategy.label == "DDP")  # type: ignore[attr-defined]
    assert _gib(ddp.memory.per_gpu.total) == "104.81"
    assert any(line.translate(_RULES).split()[:1] == ["DDP"] and "104.81" in line
               for line in _text(cmp, 100).splitlines())  # fmt: skip


def test_comparison_splits_into_stacked_tables_that_repeat_the_strategy() -> None:
    cmp = _result("compare llama-3-8b timed")
    # 160 columns: one table; 120: memory, then host/communication/time; 80: four tables.
    for width, tables in ((160, 1), (120, 2), (80, 4)):
        text = _text(cmp, width)
        assert text.count("┃ strategy") == tables, width
        assert text.count("│ DDP ") == tables, width


def test_communication_split_repeats_phase_and_operation() -> None:
    text = _text(_result("zero-3 175e9"), 80)
    heads = [line for line in text.splitlines() if line.startswith("┃") and "phase" in line]
    assert len(heads) == 2 and all("operation" in h for h in heads)
    assert "payload" in text and "group (size)" in text


def test_a_table_that_fits_is_printed_as_built() -> None:
    # The README's output is generated at 160 columns: the estimate's tables fit there and keep rich's own layout.
    r = _result("zero-3 175e9")
    wide = _text(r, 160)
    fitted = [x for x in render(r).renderables if isinstance(x, Fitted)]  # type: ignore[union-attr]
    console = Console(width=160, record=True, file=io.StringIO(), markup=False, emoji=False, highlight=False)
    for f in fitted:
        assert isinstance(f.table, Table)
        console.print(f.table)
        assert console.export_text() in wide


def test_pipeline_stage_table_keeps_every_figure_at_80_columns() -> None:
    r = memcalc.estimate(model="megatron-175b", gpus=512, tp=8, pp=8, sequence_parallel=True, recompute="selective",
                         seq_len=2048, grad_accum=64, stage=1)  # fmt: skip
    text = _text(r, 80)
    words = Counter(w for line in text.splitlines() for w in line.translate(_RULES).split())
    want = Counter(f"{st.parameters:,}" for st in r.memory.stages)
    want += Counter(_gib(b) for st in r.memory.stages for b in (st.model_states, st.activations, st.total))
    want += Counter(["micro-batches", "in", "flight", "model", "states", "most", "loaded"])
    assert not want - words
    assert "…" not in text and max(cell_len(line) for line in text.splitlines()) <= 80


def test_compare_has_an_activations_column_only_when_activations_are_counted() -> None:
    bare = comparison_table(memcalc.compare(params=7e9, gpus=8, strategies=["zero-2", "zero-3"]))
    shaped = comparison_table(memcalc.compare(model="llama-2-7b", seq_len=2048, gpus=8, strategies=["zero-2", "zero-3"]))
    assert [str(c.header) for c in bare.columns][:5] == ["strategy", "params", "grads", "optimizer", "other"]
    assert [str(c.header) for c in shaped.columns][:6] == ["strategy", "params", "grads", "optimizer", "activations",
                                                           "other"]
