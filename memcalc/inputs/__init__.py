"""Inputs are data: frozen pydantic models (``memcalc.validated``), checked when made, never mutated.

Every size inside is an ``int`` of bytes; preset and CLI values that carry another unit say so in
their name (``memory_gib``, ``hbm_gbps``) and are converted by properties through ``memcalc.units``.
The tables of precisions and optimizers live in the core (``memcalc.layout.dtypes``) and are re-exported here.
"""

from __future__ import annotations

from memcalc.inputs.estimate import Accounting, EstimateInput
from memcalc.inputs.hardware import GPU, Cluster, Overheads
from memcalc.inputs.model import Model
from memcalc.inputs.strategy import EstimatorOptions, FrameworkOptions, Parallelism, Strategy, Timing
from memcalc.inputs.dtypes import OPTIMIZERS, PRECISIONS, Optimizer, Precision, resolve_optimizer, resolve_precision
from memcalc.inputs.workload import Workload
from memcalc.layout.dtypes import OptimizerName, PrecisionName
from memcalc.layout.plan import Zero3Settings

__all__ = [
    "GPU", "OPTIMIZERS", "PRECISIONS", "Accounting", "Cluster", "EstimateInput", "EstimatorOptions",
    "FrameworkOptions", "Model", "Optimizer", "OptimizerName", "Overheads", "Parallelism", "Precision",
    "PrecisionName", "Strategy", "Timing", "Workload", "Zero3Settings", "resolve_optimizer", "resolve_precision",
]
