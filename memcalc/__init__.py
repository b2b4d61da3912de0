"""memcalc: does this model fit, with which strategy, and what will it cost per GPU?

    >>> import memcalc
    >>> r = memcalc.estimate(params=175e9, stage=3, gpus=128)
    >>> r.memory.per_gpu.total, r.communication.sent_bytes_per_gpu   # integer bytes
    >>> memcalc.compare(params=7e9, gpus=64)                          # every strategy side by side
    >>> memcalc.plan(model="llama-3-8b", seq_len=8192, global_batch=16, gpus=8, gpu="h100")  # the best layouts
    >>> memcalc.write_config(memcalc.plan(...), directory="run/")    # the framework's files for the best

Names are imported lazily so that ``import memcalc`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "estimate": "memcalc.api",
    "compare": "memcalc.api",
    "plan": "memcalc.planner",
    "PlanResult": "memcalc.report.planned",
    "PlannedRun": "memcalc.report.planned",
    "build_input": "memcalc.api",
    "parse_strategy": "memcalc.api",
    "DEFAULT_COMPARE": "memcalc.api",
    "EstimateInput": "memcalc.inputs",
    "Model": "memcalc.inputs",
    "Precision": "memcalc.inputs",
    "Optimizer": "memcalc.inputs",
    "GPU": "memcalc.inputs",
    "Cluster": "memcalc.inputs",
    "Strategy": "memcalc.inputs",
    "Overheads": "memcalc.inputs",
    "PRECISIONS": "memcalc.inputs",
    "OPTIMIZERS": "memcalc.inputs",
    "Estimate": "memcalc.report.results",
    "Comparison": "memcalc.report.results",
    "STRATEGIES": "memcalc.layout.strategies",
    "load_gpu": "memcalc.inputs.presets",
    "gpu_names": "memcalc.inputs.presets",
    "InputError": "memcalc.errors",
    "collectives": "memcalc.report.collectives",
    "CollectiveTimes": "memcalc.report.collectives",
    "write_config": "memcalc.configs.writing",
    "config_text": "memcalc.configs.writing",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:
    from memcalc.api import DEFAULT_COMPARE, build_input, compare, estimate, parse_strategy
    from memcalc.errors import InputError
    from memcalc.report.collectives import CollectiveTimes, collectives
    from memcalc.inputs import (
        GPU,
        OPTIMIZERS,
        PRECISIONS,
        Cluster,
        EstimateInput,
        Model,
        Optimizer,
        Overheads,
        Precision,
        Strategy,
    )
    from memcalc.inputs.presets import gpu_names, load_gpu
    from memcalc.configs.writing import config_text, write_config
    from memcalc.planner import plan
    from memcalc.report.planned import PlannedRun, PlanResult
    from memcalc.report.results import Comparison, Estimate
    from memcalc.layout.strategies import STRATEGIES


def __dir__() -> list[str]:
    """The public API (``__all__``), not the module's internals or the submodules imported so far."""
    return list(__all__)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memcalc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
