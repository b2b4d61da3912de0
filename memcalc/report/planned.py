"""The result of ``memcalc plan`` (``memcalc.plan``): pydantic models, the public contract of ``plan --json``.

Field names of ``PlanResult``, ``PlannedRun``, ``PlanLayout``, ``PlanMemory`` and ``PlanTime`` are fixed; sizes are
integer bytes, times seconds.
"""

from typing import Any, Literal

from pydantic import Field

from memcalc.validated import Result, empty_dict, empty_list

Verdict = Literal["fits", "at-risk", "oom"]
Objective = Literal["time", "cost", "memory"]


class _Model(Result):
    """The base of the plan's result models."""

class PlanLayout(_Model):
    """How the GPUs are split: dp x tp x pp x cp = GPUs (ep subdivides the data-parallel ranks for experts)."""

    dp: int = Field(description="Data-parallel degree.")
    tp: int = Field(description="Tensor-parallel degree.")
    pp: int = Field(description="Pipeline stages.")
    cp: int = Field(description="Context-parallel degree.")
    ep: int = Field(description="Expert-parallel degree (1 for dense models).")
    virtual_stages: int = Field(description="Model chunks per pipeline rank (2: interleaved 1F1B).")


class PlanMemory(_Model):
    """The plan's per-GPU memory, as ``memcalc estimate`` gives it for the same arguments."""

    peak_allocated: int = Field(description="Bytes the framework's tensors hold at the step's peak.")
    peak_reserved: int = Field(description="Bytes the caching allocator reserves at the peak (what nvidia-smi shows "
                                           "less the CUDA context).")
    verdict: Verdict = Field(description="fits, at-risk (within the allocator's variability) or oom.")
    headroom_bytes: int = Field(description="Usable GPU memory left beside the estimate's per-GPU total (negative: "
                                            "short by this much).")


class PlanTime(_Model):
    """The plan's step time and what it costs."""

    step_s: float = Field(description="Seconds per optimizer step.")
    tokens_per_s_per_gpu: float = Field(description="Training tokens per second per GPU.")
    mfu: float = Field(description="Model FLOPs utilisation (0-1).")
    time_to_train_s: float | None = Field(default=None, description="Seconds to train on --tokens (None without).")
    cost: float | None = Field(default=None, description="Price x GPUs x hours to train on --tokens, in the price's "
                                                         "currency (None without --tokens and a price).")


class PlannedRun(_Model):
    """One plan: where it runs, how it is laid out, and what memcalc estimates for it."""

    rank: int = Field(description="1 for the best by the objective.")
    gpu: str = Field(description="GPU preset key.")
    gpus: int = Field(description="GPUs in the job.")
    framework: str = Field(description="torchtitan, megatron, deepspeed or hf.")
    layout: PlanLayout = Field(description="The parallel layout.")
    strategy: str = Field(description="The data-parallel strategy as memcalc names it (zero-3, FULL_SHARD, ...), "
                                      "with its offload.")
    recompute: str = Field(description="Activation recomputation policy.")
    micro_batch: int = Field(description="Sequences per micro-batch.")
    grad_accum: int = Field(description="Micro-batches per optimizer step on each data-parallel rank.")
    accounting: str = Field(description="realistic (a real step's peak) or paper (the ZeRO paper's rows: the "
                                        "realistic accounting does not model this layout yet).")
    memory: PlanMemory = Field(description="Per-GPU memory.")
    time: PlanTime = Field(description="Step time and cost.")
    bound: str = Field(description="What the step is mostly made of: compute, exposed communication, pipeline "
                                   "bubble, optimizer or offload.")
    estimate_args: list[str] = Field(description="The `memcalc estimate` arguments that reproduce this plan's peak "
                                                 "and step time.")


class PlanJob(_Model):
    """The job the plans are for."""

    model: str = Field(description="The model's name.")
    parameters: int = Field(description="Its parameters.")
    seq_len: int = Field(description="Tokens per sequence.")
    global_batch: int = Field(description="Sequences per optimizer step.")
    tokens_per_step: int = Field(description="seq_len x global_batch.")
    gpus: list[int] = Field(description="GPU counts searched.")
    gpu: list[str] = Field(description="GPU types searched (preset keys).")
    gpus_per_node: int = Field(description="GPUs per node.")
    frameworks: list[str] = Field(description="Frameworks searched.")
    objective: Objective = Field(description="What ranks the plans.")
    tokens: float | None = Field(default=None, description="Tokens to train on (for time and cost to train).")
    prices: dict[str, float] = Field(default_factory=empty_dict, description="Price per GPU-hour by GPU preset key.")
    fixed: dict[str, Any] = Field(default_factory=empty_dict, description="The estimate keywords held fixed.")


class Miss(_Model):
    """The candidate that came closest to fitting without fitting."""

    plan: PlannedRun = Field(description="It, as estimated.")
    over_bytes: int = Field(description="Bytes over the GPU's usable memory (or into the at-risk band).")


def layout_text(r: PlannedRun) -> str:
    """dp 8 · tp 8 (with pp, cp, ep and v where above 1)."""
    lay = r.layout
    parts = [f"dp {lay.dp}"] + [f"{k} {v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp),
                                                       ("ep", lay.ep), ("v", lay.virtual_stages)) if v > 1]
    return " · ".join(parts)


class PlanResult(_Model):
    """``memcalc plan``: the best plans that fit, searched over layouts, strategies, recompute and batch splits."""

    schema_version: int = Field(default=1, description="1.")
    job: PlanJob = Field(description="What was asked.")
    evaluated: int = Field(description="Candidates timed (layout x strategy x recompute x micro-batch x GPU).")
    feasible: int = Field(description="Candidates checked and found to fit (the search stops checking once the "
                                      "ranking is settled).")
    checked: int = Field(description="Candidates whose memory was checked.")
    replays: int = Field(description="Realistic step replays run (the rest were settled by a bound).")
    paper_accounted: int = Field(description="Candidates answered by the paper accounting.")
    not_runnable: dict[str, int] = Field(default_factory=empty_dict, description="Candidate settings memcalc or the "
                                                                           "framework refuses, by reason.")
    seconds: float = Field(description="Wall time of the search.")
    candidates_per_s: float = Field(description="evaluated / seconds.")
    plans: list[PlannedRun] = Field(description="The best plans, best first (empty: none fits).")
    best_per_gpu: list[PlannedRun] = Field(default_factory=empty_list, description="The best plan for each (GPU type, "
                                                                             "count) that has one.")
    fastest: PlannedRun | None = Field(default=None, description="The shortest step among the plans found.")
    cheapest: PlannedRun | None = Field(default=None, description="The lowest cost to train (with --tokens and "
                                                                  "prices).")
    closest_miss: Miss | None = Field(default=None, description="The checked candidate closest to fitting.")
    unheld_best: PlannedRun | None = Field(default=None, description="With dimensions held (--tp, --recompute, ...): "
                                                                      "the best plan of the search without them.")
    offload: bool = Field(default=False, description="Offload was searched because nothing fits without it.")
    notes: list[str] = Field(default_factory=empty_list, description="What the search assumed and left out.")
