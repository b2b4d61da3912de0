"""Fine-tuning a frozen base: LoRA adapters (``--lora-rank``, ``--lora-targets``) and QLoRA (``--quantize nf4``)."""

from typing import TYPE_CHECKING, Literal

from memcalc.errors import InputError
from memcalc.model.architecture import MAX_LORA_RANK as MAX_RANK
from memcalc.model.architecture import PROJECTIONS as TARGETS
from memcalc.validated import Validated, bounded

if TYPE_CHECKING:
    from memcalc.model.lora import LoraPlan


class Lora(Validated):
    """LoRA adapters of rank r on the target projections; the base model is frozen (Hu et al. 2021, peft)."""

    rank: int = bounded(gt=0, le=MAX_RANK, why="wider than any model's hidden size")
    """r: A is r x in, B is out x r."""
    targets: tuple[str, ...] | None = None
    """Neutral projection names (q, k, v, o, gate, up, down), Hugging Face module names as peft's ``target_modules``
    gives them (q_proj, ...), or all-linear; None: every projection of the layers (peft's "all-linear" without the
    head). Checked against the model's shape by ``EstimateInput`` (``memcalc.model.lora.resolve_targets``)."""
    quantize: Literal["none", "nf4"] = "none"
    """none: the frozen base in the compute dtype; nf4: QLoRA, its linear weights stored by bitsandbytes in NF4 with
    double quantization (blocks of 64, 8-bit absmax per 256 blocks)."""

    def _check(self) -> None:
        from memcalc.model.lora import ALL_LINEAR, MODULE_NAMES

        for t in self.targets or ():
            if t.lower() not in TARGETS and t.lower() != ALL_LINEAR and t.rsplit(".", 1)[-1] not in MODULE_NAMES:
                raise InputError(f"--lora-targets {t!r} is not accepted; accepted: a comma-separated subset of "
                                 f"{','.join(TARGETS)}, the model's module names (q_proj, ...) or {ALL_LINEAR}")

    def plan(self, targets: tuple[str, ...]) -> "LoraPlan":
        from memcalc.model.lora import LoraPlan  # the core's record, loaded when LoRA is asked for

        return LoraPlan(rank=self.rank, targets=targets, quantize=self.quantize)


def parse_quantize(text: str) -> str:
    """``--quantize``: none or nf4; int8 (LLM.int8, outlier columns kept in fp16 at a count that depends on the
    weights) is refused rather than guessed."""
    key = str(text).strip().lower()
    if key not in ("none", "nf4"):
        extra = " (int8 keeps a data-dependent number of fp16 outlier columns: not modelled)" if key == "int8" else ""
        raise InputError(f"--quantize {text!r} is not accepted{extra}; accepted: none, nf4")
    return key


def parse_targets(text: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """``q,k,v`` -> ('q', 'k', 'v'); None stays None (every projection)."""
    if text is None:
        return None
    parts = text.split(",") if isinstance(text, str) else list(text)
    from memcalc.model.lora import ALL_LINEAR

    # neutral names and all-linear in lower case; module names as given (peft matches them case-sensitively)
    out = tuple(t.lower() if t.lower() in (*TARGETS, ALL_LINEAR) else t for t in (str(p).strip() for p in parts) if t)
    if not out:
        raise InputError(f"--lora-targets is empty; accepted: a comma-separated subset of {','.join(TARGETS)}")
    return out
