"""DeepSpeed's estimator as an accounting: its GPU terms as rows and its host RAM per node.

``--accounting deepspeed-estimator``; the functions themselves are ``memcalc.memory.accountings.deepspeed_estimator``.
"""

from __future__ import annotations

from memcalc.layout.plan import Plan
from memcalc.memory.accountings import deepspeed_estimator as dse
from memcalc.memory.accountings.rows import Row
from memcalc.model.params import largest_module, model_params


def model_state_rows(plan: Plan) -> tuple[list[Row], int]:
    """GPU rows and host RAM per node as DeepSpeed's estimator gives them (its terms, its int() truncation)."""
    arch = plan.arch
    psi = model_params(arch).total if arch is not None else plan.psi
    nodes, per_node = plan.nodes, plan.ranks_per_node
    if plan.spec.name == "zero-3":
        largest = plan.largest_layer_params or (largest_module(arch)[1] if arch is not None else 0)
        e = dse.zero3(psi, largest, per_node, nodes, plan.offload_optimizer != "none", plan.offload_params != "none",
                      plan.zero_init, plan.buffer_factor)
        src = "deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs"
    else:
        e = dse.zero2(psi, per_node, nodes, plan.offload_optimizer != "none", plan.buffer_factor)
        src = "deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs"
    rows = [Row(k, label, b, "gpu", "model_state", f"{formula} ({src})") for k, label, formula, b in e.terms]
    return rows, e.cpu


def host_row(cpu: int) -> Row:
    """DeepSpeed's host figure: one number per node, buffer factor included."""
    return Row("host", "host RAM (DeepSpeed's estimate)", cpu, "cpu", "model_state", "per node, with the buffer factor")


def notes(plan: Plan) -> list[str]:
    return [
        "accounting: deepspeed-estimator: exactly DeepSpeed's estimate_zero2/3_model_states_mem_needs (model "
        "states only, no CUDA context, host RAM with its 1.5 buffer factor); DeepSpeed prints these in GiB "
        "labelled 'GB'",
        "communication is the paper's (DeepSpeed's estimator has none)",
    ]
