"""The step's memory over time by kind: every moment of the every-layer replay (``memcalc.memory.accountings.realistic.replay``),
each part of it sorted into one of a few kinds (``KIND_OF``), for the timeline plot, ``--json``'s
``memory.timeline.moments`` and the memory snapshot.

Plain data: the report floor turns it into results (``memcalc.report.build``) and pictures (``memcalc.report.plot``).
"""

from __future__ import annotations

from typing import NamedTuple

from memcalc.layout.plan import Plan

KINDS = ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "communication_buffers")
"""The kinds of a moment's bytes, bottom to top of the plot; a part no rule of ``KIND_OF`` names is ``OTHER``."""
OTHER = "other"

DDP_BUCKETS = "DDP gradient buckets"
"""The part added to every moment of a DDP step: torch DDP's bucket copy of the gradients, alive all run."""

KIND_OF: tuple[tuple[str, str], ...] = (
    # communication: collectives' inputs and outputs, staging copies, DDP's and DeepSpeed's buckets, pipeline buffers
    ("all-gather output", "communication_buffers"), ("reduce-scatter input", "communication_buffers"),
    ("reduce-scatter output", "communication_buffers"), ("all-reduce", "communication_buffers"),
    ("flat gradient (", "communication_buffers"), ("gradient bucket", "communication_buffers"),
    ("flattened gradients", "communication_buffers"), ("for the all-gather", "communication_buffers"),
    ("copied to the GPU", "communication_buffers"), ("staging buffer", "communication_buffers"),
    ("partial sums", "communication_buffers"), ("receive buffers", "communication_buffers"),
    ("being sent", "communication_buffers"),
    # what lives for a moment: backward transients, the loss's gradients, the optimizer's temporaries, workspaces
    ("copy of this rank's rows", "gradients"), ("embedding output", "activations"),
    ("one gradient and its step", "gradients"), ("new gradients", "gradients"),
    ("temporaries", "temporaries"), ("backward", "temporaries"), ("down projection's gradients", "temporaries"),
    ("gradient of the residual stream", "temporaries"), ("head input gradient", "temporaries"),
    ("logits gradient", "temporaries"), ("loss gradients", "temporaries"), ("loss and its gradient", "temporaries"),
    ("logits copy", "temporaries"), ("normalized (", "temporaries"), ("flattened partition", "temporaries"),
    ("cuBLAS", "temporaries"),
    # model states
    ("optimizer states", "optimizer_states"), ("master partition", "optimizer_states"),
    ("copies of the parameters", "optimizer_states"),
    ("gradient", "gradients"),
    ("parameters", "parameters"), ("buffers", "parameters"), ("weight (", "parameters"),
    ("weight casts", "parameters"), ("cast cache", "parameters"),
    # what the forward keeps for the backward, and the batch
    ("activation", "activations"), ("saved", "activations"), ("input", "activations"), ("output", "activations"),
    ("recomputed", "activations"), ("ids", "activations"), ("labels", "activations"), ("logits", "activations"),
    ("mask", "activations"), ("rotary", "activations"), ("ALiBi", "activations"), ("position", "activations"),
    ("norm", "activations"), ("residual", "activations"), ("hidden state", "activations"),
    ("q, k, v", "activations"), ("micro-batch", "activations"), ("log-softmax", "activations"),
    ("log-sum-exp", "activations"), ("loss, total weight", "activations"), ("forward", "activations"),
)
"""(text in the part's name, kind), the first that matches wins: the timelines name their parts in words
(``memcalc.memory.engine.timeline._moment``), so a rule is a phrase those names share."""

_CACHE: dict[str, str] = {}


def kind_of(part: str) -> str:
    """The kind of a timeline part named ``part`` (``OTHER`` where no rule of ``KIND_OF`` names it)."""
    kind = _CACHE.get(part)
    if kind is None:
        kind = _CACHE[part] = next((k for text, k in KIND_OF if text in part), OTHER)
    return kind


class StepMoment(NamedTuple):
    """One moment of the step: its phase, label and parts (name, bytes), DDP's buckets included."""

    phase: str
    label: str
    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(b for _, b in self.parts)

    def by_kind(self) -> dict[str, int]:
        """Bytes per kind: every one of ``KINDS``, and ``OTHER`` where a part falls to it."""
        out = dict.fromkeys(KINDS, 0)
        for name, b in self.parts:
            k = kind_of(name)
            out[k] = out.get(k, 0) + b
        return out


def step_moments(plan: Plan, stage: int = 0) -> list[StepMoment]:
    """Every moment of one GPU's step (pipeline rank ``stage``) for ``plan``, which the realistic accounting takes,
    from the replay of every decoder layer: the largest total is the realistic ``peak_allocated``."""
    from memcalc.memory.accountings.realistic import replay

    tl, ddp_buckets, _ = replay(plan, stage, every_layer=True)
    extra = ((DDP_BUCKETS, ddp_buckets),) if ddp_buckets else ()
    return [StepMoment(m.phase, m.label, tuple(m.parts) + extra) for m in tl.moments]


def phase_group(phase: str) -> str:
    """The phase a moment is drawn under: ``forward.layer.3`` is forward, ``backward.layer.0`` backward."""
    return phase.split(".")[0]


__all__ = ["DDP_BUCKETS", "KINDS", "KIND_OF", "OTHER", "StepMoment", "kind_of", "phase_group", "step_moments"]
