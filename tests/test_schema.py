"""Inputs and results are pydantic models with a JSON schema; docs/json-schema.md is generated from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.report.schema import SCHEMAS, schema

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ["EstimateInput", "Model", "Precision", "Optimizer", "GPU", "Cluster", "Strategy", "Overheads", "Estimate",
          "Comparison", "PlanResult", "PlannedRun", "CollectiveTimes"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_inputs_and_results_are_frozen_strict_pydantic_models(name):
    cls = getattr(memcalc, name)
    assert issubclass(cls, pydantic.BaseModel)
    assert cls.model_config["frozen"] is True and cls.model_config["extra"] == "forbid"
    assert cls.model_json_schema()["additionalProperties"] is False


def _properties(s: dict) -> list[tuple[str, str, dict]]:
    models = {"<top>": s, **s.get("$defs", {})}
    return [(m, f, p) for m, d in models.items() for f, p in d.get("properties", {}).items()]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_field_of_every_schema_is_described(name):
    props = _properties(schema(name))
    assert len(props) > 5
    undescribed = [f"{m}.{f}" for m, f, p in props if not p.get("description") and "$ref" not in p]
    assert undescribed == []


def test_bounds_and_closed_sets_are_in_the_schema():
    s = memcalc.EstimateInput.model_json_schema()
    cluster = s["$defs"]["Cluster"]["properties"]["gpus"]
    assert (cluster["exclusiveMinimum"], cluster["maximum"], cluster["type"]) == (0, 2**20, "integer")
    fw = s["$defs"]["FrameworkOptions"]["properties"]["fsdp_version"]
    assert fw["enum"] == [1, 2]
    assert s["properties"]["accounting"]["enum"] == ["realistic", "paper", "implementation", "deepspeed-estimator"]
    assert "ZeRO paper" in s["properties"]["accounting"]["description"]


def test_a_bad_field_is_one_input_error_line_naming_it():
    for call, text in ((lambda: memcalc.Cluster(gpus=0), "Cluster.gpus 0 is out of bounds; accepted: more than 0 and "
                                                         "at most 1,048,576 (64x the largest published training run)"),
                       (lambda: memcalc.Cluster(gpus="8"), "Cluster.gpus '8' is not accepted; accepted: a whole number"),
                       (lambda: memcalc.Strategy(name="zero-9"), "Strategy.name 'zero-9' is not accepted; accepted: "),
                       (lambda: memcalc.Overheads(cuda_context_bytes=float("nan")), "Overheads.cuda_context_bytes nan"),
                       (lambda: memcalc.Cluster(8), "Cluster takes its fields by name (gpus, gpus_per_node)")):
        with pytest.raises(InputError) as e:
            call()
        assert type(e.value) is InputError and len(str(e.value).splitlines()) == 1
        assert str(e.value).startswith(text), str(e.value)


def test_json_parses_back_leniently_and_refuses_in_one_line():
    r = memcalc.estimate(params=7e9, stage=3, gpus=64)
    assert memcalc.Estimate.model_validate_json(r.model_dump_json()) == r
    assert memcalc.Estimate.model_validate(r.model_dump()) == r
    data = r.model_dump()
    data["memory"]["per_gpu"]["total"] = "many"
    with pytest.raises(InputError, match=r"^Estimate\.memory\.per_gpu\.total: Input should be a valid integer"):
        memcalc.Estimate.model_validate(data)


def test_memcalc_schema_prints_each_schema():
    runner = CliRunner()
    for name, (_, cls, _) in SCHEMAS.items():
        r = runner.invoke(app, ["schema", name])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["title"] == cls
    r = runner.invoke(app, ["schema", "estimates"])
    assert r.exit_code == 2 and r.stderr.strip() == ("memcalc: error: schema 'estimates' is not accepted; accepted: "
                                                     "estimate, compare, plan, input")


def test_the_json_schema_page_is_the_generated_one():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "generate_schema.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr



def test_a_results_left_out_lists_and_dicts_are_its_own_and_empty():
    """The default factories (``memcalc.validated.empty_list``, ``empty_dict``) give each result a new container,
    and the schema shows no default for them."""
    from memcalc.report.results import Comparison
    from memcalc.report.results_time import StepTimeInfo

    first, second = Comparison(estimates=[]), Comparison(estimates=[])
    assert first.by_memory == [] and first.by_time == [] and first.by_memory is not second.by_memory
    sources = StepTimeInfo.model_fields["efficiency_sources"]
    made = [sources.get_default(call_default_factory=True) for _ in range(2)]
    assert made == [{}, {}] and made[0] is not made[1]
    assert "default" not in Comparison.model_json_schema()["properties"]["by_memory"]
