"""The JSON schemas of memcalc's public models: what ``--json`` prints and what the API takes.

``memcalc schema estimate`` prints ``Estimate``'s, ``compare`` ``Comparison``'s, ``plan`` ``PlanResult``'s and
``input`` ``EstimateInput``'s, each from pydantic's ``model_json_schema`` (every field described by the docstring or
the ``Field`` description under it). docs/json-schema.md is generated from them by ``docs/generate_schema.py``.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from memcalc.errors import InputError

SCHEMAS = {
    "estimate": ("memcalc.report.results", "Estimate", "memcalc estimate --json, memcalc.estimate()"),
    "compare": ("memcalc.report.results", "Comparison", "memcalc compare --json, memcalc.compare()"),
    "plan": ("memcalc.report.planned", "PlanResult", "memcalc plan --json, memcalc.plan()"),
    "input": ("memcalc.inputs", "EstimateInput", "memcalc.build_input(), the input field of an estimate"),
}
"""Each schema's name: (module, model, where it is met)."""


def model_of(name: str) -> Any:
    """The pydantic model behind a schema's name, or one line naming the accepted ones."""
    if not isinstance(name, str) or name.strip().lower() not in SCHEMAS:
        raise InputError(f"schema {name!r} is not accepted; accepted: {', '.join(SCHEMAS)}")
    module, cls, _ = SCHEMAS[name.strip().lower()]
    return getattr(importlib.import_module(module), cls)


def schema(name: str) -> dict[str, Any]:
    """The JSON schema of ``name`` (estimate, compare, plan or input)."""
    return model_of(name).model_json_schema()  # type: ignore[no-any-return]


def schema_text(name: str) -> str:
    """The schema as ``memcalc schema`` prints it: indented JSON, keys in pydantic's order."""
    return json.dumps(schema(name), indent=2, ensure_ascii=False)
