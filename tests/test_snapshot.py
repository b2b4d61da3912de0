"""The predicted step as a PyTorch memory snapshot: torch's own tooling reads it, and the most bytes its trace
holds at once is the estimate's peak_allocated."""

import pickle

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.inputs.plan import to_plan
from memcalc.memory.engine.moments import StepMoment, step_moments
from memcalc.report.snapshot import snapshot, trace_peak
from test_moments import PEAKS
from test_stack import PLANS

runner = CliRunner()


CASES = {**PEAKS, "interleaved pipeline (a part written as negative)": PLANS["PP 4 x TP 2 + SP, interleaved"]}


@pytest.mark.parametrize("name", list(CASES))
def test_the_trace_peaks_at_the_estimate_s_peak(name):
    r = memcalc.estimate(**CASES[name])
    snap = snapshot(step_moments(to_plan(r.input), r.memory.most_loaded_stage))
    assert trace_peak(snap) == r.memory.per_gpu.peak_allocated
    trace = snap["device_traces"][0]
    assert {e["action"] for e in trace} == {"segment_alloc", "alloc", "free_requested", "free_completed"}
    seg = snap["segments"][0]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"] >= r.memory.per_gpu.peak_allocated
    assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")


def test_a_part_that_shrinks_frees_its_latest_blocks_first():
    moments = [StepMoment("a", "one", (("x", 100),)), StepMoment("b", "two", (("x", 150), ("y", 10))),
               StepMoment("c", "three", (("x", 120),)), StepMoment("d", "four", ())]
    trace = snapshot(moments)["device_traces"][0]
    acts = [(e["action"], e["size"]) for e in trace if e["action"] != "free_requested"]
    assert acts == [("segment_alloc", 160), ("alloc", 100), ("alloc", 50), ("alloc", 10), ("free_completed", 50),
                    ("free_completed", 10), ("alloc", 20), ("free_completed", 20), ("free_completed", 100)]
    assert trace_peak(snapshot(moments)) == 160


def test_torch_s_memory_viz_reads_it(tmp_path):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    out = tmp_path / "step.pickle"
    r = runner.invoke(app, ["estimate", *_args(PEAKS["ZeRO-3"]), "--memory-snapshot", str(out)])
    assert r.exit_code == 0, r.output
    snap = pickle.loads(out.read_bytes())
    assert "total_reserved" in mv.segsum(snap)
    assert mv.trace(snap).startswith("Device 0")
    for html in (mv.trace_plot(snap), mv.segment_plot(snap)):
        assert "snapshot.pickle" in html
    flame = mv.memory(snap, format_flamegraph=lambda lines: lines)
    assert "active_allocated" in flame and "parameters" in flame
    assert mv.segments(snap, format_flamegraph=lambda lines: lines)
    assert mv.compare(snap["segments"], snap["segments"], format_flamegraph=lambda lines: lines) == ""


def test_no_snapshot_without_the_realistic_accounting(tmp_path):
    out = tmp_path / "step.pickle"
    r = runner.invoke(app, ["estimate", "--params", "7e9", "--gpus", "8", "--memory-snapshot", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert not out.exists()


def _args(kw):
    out = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, str(v)]
    return out
