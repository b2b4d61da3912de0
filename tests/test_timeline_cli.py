"""The step's timeline at the command line: --format timeline-csv, --json --timeline, and one line (exit 2) where
the realistic accounting does not replay the step."""

import csv
import io
import json

from typer.testing import CliRunner

from memcalc.cli import app
from memcalc.memory.engine.moments import KINDS
from memcalc.report.results import Estimate

runner = CliRunner()
FSDP2 = ["--model", "llama-3-8b", "--fsdp", "FULL_SHARD", "--fsdp-version", "2", "--gpus", "8", "--seq-len", "2048"]


def run(*args):
    return runner.invoke(app, list(args))


def test_timeline_csv_has_a_row_per_moment_and_its_largest_total_is_the_peak():
    csv_out = run("estimate", *FSDP2, "--format", "timeline-csv")
    assert csv_out.exit_code == 0, csv_out.output
    rows = list(csv.DictReader(io.StringIO(csv_out.stdout)))
    assert list(rows[0]) == ["index", "phase", "label", *KINDS, "total"]
    assert [int(r["index"]) for r in rows] == list(range(len(rows)))
    for r in rows:
        assert sum(int(r[k]) for k in KINDS) == int(r["total"])
    r = Estimate.model_validate_json(run("estimate", *FSDP2, "--json", "--timeline").stdout)
    assert len(r.memory.timeline.moments) == len(rows)
    assert max(int(x["total"]) for x in rows) == r.memory.per_gpu.peak_allocated


def test_json_leaves_the_moments_out_unless_asked():
    d = json.loads(run("estimate", *FSDP2, "--json").stdout)
    assert d["memory"]["timeline"]["moments"] == []


def test_a_plan_the_realistic_accounting_does_not_replay_is_one_line_exit_2():
    for args in (["--params", "7e9", "--gpus", "8"], [*FSDP2, "--accounting", "paper"]):
        r = run("estimate", *args, "--format", "timeline-csv")
        assert r.exit_code == 2
        assert len(r.output.strip().splitlines()) == 1 and "realistic accounting" in r.output
