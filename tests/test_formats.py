"""CSV and Markdown output: parsed back, the figures equal the estimate's integers."""

import csv
import io

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.report.formats import (
    comparison_figures,
    markdown_table,
    to_csv,
    to_markdown,
)
from memcalc.units import GB, GiB


@pytest.fixture(scope="module")
def offloaded():
    """ZeRO-3 with the optimizer on CPU: memory rows on GPU and per node, collectives and host transfers."""
    return memcalc.estimate(model="llama-2-7b", strategy="zero-3+opt-cpu", gpus=16, seq_len=2048, micro_batch=1)


@pytest.fixture(scope="module")
def comparison():
    return memcalc.compare(params=7e9, gpus=8, strategies=["ddp", "zero-1", "zero-3", "FULL_SHARD+param-cpu"],
                           precision="bf16-mixed")  # the ZeRO paper's 2 + 2 + 12 bytes per parameter for every row


def _parse(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_estimate_csv_rows_equal_the_estimates_integers(offloaded):
    rows = _parse(to_csv(offloaded))
    g, node, com = offloaded.memory.per_gpu, offloaded.memory.per_node, offloaded.communication
    gpu = [r for r in rows if r["section"] == "per_gpu"]
    assert [(r["key"], r["label"], r["location"], r["category"], int(r["bytes"])) for r in gpu[:-1]] == [
        (m.key, m.label, m.location, m.category, m.bytes) for m in g.rows]
    assert gpu[-1]["key"] == "total" and int(gpu[-1]["bytes"]) == g.total == sum(m.bytes for m in g.rows)
    for r in rows:
        if r["section"] not in ("time", "throughput"):  # those carry value and value_unit
            assert float(r["GiB"]) == pytest.approx(int(r["bytes"]) / GiB, abs=1e-6)
    per_node = {r["key"]: int(r["bytes"]) for r in rows if r["section"] == "per_node"}
    assert per_node["cpu"] == node.cpu > 0 and per_node["nvme"] == node.nvme == 0
    assert {m.key: m.bytes for m in node.rows}.items() <= per_node.items()
    sent = [r for r in rows if r["section"] == "communication"]
    assert [(r["key"], r["category"], int(r["bytes"]), int(r["payload_bytes"]), int(r["calls_per_step"]),
             int(r["group_size"])) for r in sent[:-1]] == [
        (c.op, c.phase, c.sent_bytes_per_gpu, c.payload_bytes, c.calls_per_step, c.group_size) for c in com.collectives]
    assert (int(sent[-1]["bytes"]), int(sent[-1]["payload_bytes"])) == (com.sent_bytes_per_gpu, com.payload_bytes)
    host = [r for r in rows if r["section"] == "host_transfer"]
    assert [(r["key"], int(r["bytes"])) for r in host] == [(h.op, h.bytes) for h in com.host_transfers]
    assert len(host) == 2 and len(com.collectives) == 3  # ZeRO-3: all-gather forward and backward, reduce-scatter


def test_csv_in_gb_labels_its_column(offloaded):
    rows = _parse(to_csv(offloaded, unit="gb"))
    assert "GB" in rows[0] and "GiB" not in rows[0]
    assert float(rows[0]["GB"]) == pytest.approx(int(rows[0]["bytes"]) / GB, abs=1e-6)


def test_comparison_csv_has_every_figure_per_strategy(comparison):
    rows = _parse(to_csv(comparison))
    assert [r["strategy"] for r in rows] == ["ddp", "zero-1", "zero-3", "FULL_SHARD"]
    for r, e in zip(rows, comparison.estimates):
        g = e.memory.per_gpu
        assert int(r["parameters_bytes"]) == g.parameters and int(r["gradients_bytes"]) == g.gradients
        assert int(r["optimizer_states_bytes"]) == g.optimizer_states and int(r["total_bytes"]) == g.total
        assert int(r["usable_bytes"]) == e.memory.fit.usable_bytes
        assert int(r["headroom_bytes"]) == e.memory.fit.headroom_bytes
        assert int(r["host_ram_per_node_bytes"]) == e.memory.per_node.cpu
        assert int(r["sent_bytes_per_gpu"]) == e.communication.sent_bytes_per_gpu
        assert r["fits"] == str(e.memory.fit.fits)
        assert float(r["total_gib"]) == pytest.approx(g.total / GiB, abs=1e-6)
        assert float(r["sent_gib_per_gpu"]) == pytest.approx(e.communication.sent_bytes_per_gpu / GiB, abs=1e-6)
    # ZeRO paper §5 (Ψ = 7.5B there, 7e9 here): DDP holds 16Ψ of model states, ZeRO-3 16Ψ/N with N = 8.
    assert int(rows[0]["parameters_bytes"]) + int(rows[0]["gradients_bytes"]) + int(rows[0]["optimizer_states_bytes"]) == 16 * 7 * 10**9
    assert int(rows[2]["parameters_bytes"]) + int(rows[2]["gradients_bytes"]) + int(rows[2]["optimizer_states_bytes"]) == 2 * 7 * 10**9
    assert rows[0]["fits"] == "False" and rows[2]["fits"] == "True"
    assert int(rows[3]["host_ram_per_node_bytes"]) == 16 * 7 * 10**9  # FSDP offload: every state on the host
    o = comparison_figures(comparison.estimates[0])
    assert o["other_bytes"] == o["cuda_context_bytes"] + o["allocator_reserve_bytes"] == 2**29  # 0.5 GiB context


def test_estimate_markdown_has_labelled_tables(offloaded):
    md = to_markdown(offloaded)
    assert md.startswith("**llama-2-7b (6,738,415,616 parameters) · ZeRO-3")
    assert "| component | GiB | location | formula · source |\n|---|---:|---|---|\n" in md
    g = offloaded.memory.per_gpu
    assert f"| **total** | **{g.total / GiB:,.2f}** | gpu | sum of the rows |" in md
    assert "| phase | operation | tensor | group (size) | link | dtype | calls | payload GiB | sent GiB |" in md
    assert "| forward | all-gather | parameters | data-parallel (16) | network | bf16 | 1 |" in md
    assert "| component | location | GiB |" in md  # offloaded states per node
    gb = to_markdown(offloaded, unit="gb")
    assert "| component | GB | location |" in gb and f"**{g.total / GB:,.2f}**" in gb


def test_comparison_markdown(comparison):
    md = to_markdown(comparison, unit="gb")
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| strategy"))
    assert lines[header] == ("| strategy | params GB | grads GB | optimizer GB | activations GB | other GB | total GB | fits | "
                             "host RAM/node GB | NVMe/node GB | sent/step GB | network/step GB |")
    assert lines[header + 1] == "|---|" + "---:|" * 6 + "---|" + "---:|" * 4  # numbers right, "fits" left
    assert lines[header + 2].startswith("| DDP | 14.00 | 14.00 | 84.00 | 0.00 | 0.54 | 112.54 | no |")
    assert lines[header + 4].startswith("| ZeRO-3 | 1.75 | 1.75 | 10.50 | 0.00 | 0.54 | 14.54 | yes |")
    assert lines[header + 6:] == ["", "**least memory: FSDP FULL_SHARD + offload cpu · no step times: give the model's "
                                  "shape and --seq-len to rank by time**"]  # fmt: skip


def test_catalogue_rows():
    rows = [{"name": "a|b", "parameters": 7, "aliases": ("x", "y")}, {"name": "c", "parameters": 13, "extra": None}]
    assert to_csv(rows) == 'name,parameters,aliases,extra\na|b,7,"x, y",\nc,13,,\n'
    assert to_markdown(rows) == ("| name | parameters | aliases | extra |\n|---|---:|---|---|\n"
                                 "| a\\|b | 7 | x, y |  |\n| c | 13 |  |  |\n")  # fmt: skip
    assert markdown_table(["a"], []) == "| a |\n|---|\n"


@pytest.mark.parametrize("bad", ["text", 5, [1, 2], None])
def test_other_objects_and_units_are_refused(bad, offloaded):
    with pytest.raises(InputError, match="accepted: an Estimate, a Comparison or a list of dict rows"):
        to_csv(bad)
    with pytest.raises(InputError, match="unit 'mib' is not accepted; accepted: gib, gb"):
        to_markdown(offloaded, unit="mib")


@pytest.fixture(scope="module")
def timed():
    """Timed strategies with a price: step time, throughput, time to train and cost in every format."""
    return memcalc.compare(model="llama-2-7b", gpus=8, seq_len=2048, micro_batch=1, strategies=["ddp", "zero-2", "zero-3"],
                           tokens=1e9, price_per_gpu_hour=2.0)  # fmt: skip


def test_estimate_csv_carries_the_step_time(timed):
    e = timed.estimates[2]
    st, b = e.time, e.time.breakdown
    rows = _parse(to_csv(e))
    parts = {r["key"]: float(r["value"]) for r in rows if r["section"] == "time"}
    assert {r["value_unit"] for r in rows if r["section"] == "time"} == {"s"}
    assert parts == {"compute": b.compute_s, "memory_bound": b.memory_bound_s, "optimizer": b.optimizer_s,
                     "communication:data-parallel": b.communication_s["data-parallel"], "host": b.host_s,
                     "step": st.step_s}
    assert b.host_s > 0  # the first layer's launches after the step's sync, at least
    assert sum(v for k, v in parts.items() if k != "step") == pytest.approx(st.step_s, rel=1e-12)
    got = {r["key"]: (float(r["value"]), r["value_unit"]) for r in rows if r["section"] == "throughput"}
    assert got["tokens_per_s_per_gpu"] == (st.tokens_per_s_per_gpu, "tokens/s")
    assert got["mfu"] == (st.mfu, "fraction") and 0.4 < st.mfu < 0.6
    assert got["time_to_train"] == (st.time_to_train_s, "s") == (1e9 / st.tokens_per_s, "s")
    assert got["cost"] == (st.cost, "the price's currency") == (pytest.approx(2.0 * 8 * st.time_to_train_s / 3600), got["cost"][1])
    memory = [r for r in rows if r["section"] == "per_gpu"]
    assert all(r["value"] == "" for r in memory)  # memory rows keep bytes and GiB


def test_estimate_csv_without_a_step_time_has_no_time_rows(offloaded):
    assert offloaded.time is not None  # llama-2-7b with --seq-len is timed; drop the time to check
    rows = _parse(to_csv(offloaded.model_copy(update={"time": None})))
    assert not [r for r in rows if r["section"] in ("time", "throughput")]


def test_comparison_csv_carries_time_and_rankings(timed):
    rows = _parse(to_csv(timed))
    for r, e in zip(rows, timed.estimates):
        assert float(r["step_s"]) == e.time.step_s and float(r["mfu"]) == e.time.mfu
        assert float(r["tokens_per_s_per_gpu"]) == e.time.tokens_per_s_per_gpu
        assert float(r["time_to_train_s"]) == e.time.time_to_train_s and float(r["cost"]) == e.time.cost
    assert [r["strategy"] for r in rows] == ["ddp", "zero-2", "zero-3"]
    assert [r["rank_by_time"] for r in rows] == ["3", "2", "1"] and [r["rank_by_memory"] for r in rows] == ["3", "2", "1"]
    assert [r["fastest_that_fits"] for r in rows] == ["False", "False", "True"] and timed.fastest_that_fits == "ZeRO-3"


def test_comparison_csv_without_times_has_no_time_columns(comparison):
    header = to_csv(comparison).splitlines()[0].split(",")
    assert "rank_by_memory" in header and not {"step_s", "mfu", "rank_by_time", "fastest_that_fits"} & set(header)


def test_estimate_markdown_has_the_step_time_table(timed):
    e = timed.estimates[2]
    md = to_markdown(e)
    assert "Step time on dgx-a100 (milliseconds)\n\n| part | ms | what |\n|---|---:|---|\n" in md
    assert f"| compute | {e.time.breakdown.compute_s * 1e3:,.2f} | matmuls" in md
    assert f"| **step** | **{e.time.step_s * 1e3:,.2f}** | sum of the parts |" in md
    assert f"({e.time.tokens_per_s_per_gpu:,.0f} per GPU)" in md and f"MFU {100 * e.time.mfu:.1f}%" in md
    assert f"time to train {e.time.time_to_train_s / 3600:,.1f} hours · cost {e.time.cost:,.0f}" in md


def test_comparison_markdown_has_time_columns_and_the_ranking(timed):
    lines = to_markdown(timed).splitlines()
    header = next(line for line in lines if line.startswith("| strategy"))
    assert header.endswith("| step ms | tokens/s/GPU | MFU % | time to train | cost |")
    z3 = timed.estimates[2].time
    row = next(line for line in lines if line.startswith("| ZeRO-3 |"))
    assert row.endswith(f"| {z3.step_s * 1e3:,.2f} | {z3.tokens_per_s_per_gpu:,.0f} | {100 * z3.mfu:.1f} | "
                        f"{z3.time_to_train_s / 3600:,.1f} hours | {z3.cost:,.0f} |")  # fmt: skip
    assert "**least memory: ZeRO-3 · fastest that fits: ZeRO-3**" in lines


def test_comparison_markdown_without_times_says_how_to_rank(comparison):
    md = to_markdown(comparison)
    assert md.splitlines()[2].endswith("| network/step GiB |") and "no step times: give the model's shape and --seq-len" in md
