"""What one micro-batch step runs: sequence, micro-batch, recompute, attention kernel, loss, compile, dropout
(``Workload``), checked when made."""

from typing import Literal

from memcalc.errors import InputError
from memcalc.memory.families.megatron_saved import megatron_recompute
from memcalc.model.architecture import MAX_POSITIONS
from memcalc.validated import Validated, bounded

MAX_MICRO_BATCHES = 2**20
"""1,048,576 sequences in a micro-batch, or micro-batches in a step: 680x GPT-3's whole batch (3.2M tokens = 1,536
sequences of 2,048, arXiv 2005.14165 Table 2.1)."""


class Workload(Validated):
    """What one micro-batch looks like, for activation memory."""

    seq_len: int = bounded(gt=0, le=MAX_POSITIONS, why="1.6x the longest advertised context")
    """s: tokens per sequence."""
    micro_batch: int = bounded(default=1, gt=0, le=MAX_MICRO_BATCHES, why="680x GPT-3's whole batch")
    """b: sequences per micro-batch on one data-parallel rank."""
    recompute: str = "none"
    """Activation recomputation: none, selective (core attention, Korthikanti §5), full (every layer), every:K
    (every K-th layer, torchtitan's layer AC) or op-sac (torchtitan's per-op selective AC)."""
    attention: Literal["eager", "flash", "sdpa"] | None = None
    """eager keeps the a·s² score matrices (the paper's case); flash does not; sdpa is PyTorch's dispatcher. None:
    what the model code runs (``memcalc.memory.accountings.scope.default_attention``: sdpa; eager for BLOOM and Gemma 2, and
    under ``accounting="paper"``), resolved by ``build_input``."""
    dropout: float | None = bounded(default=None, ge=0, lt=1)
    """Dropout probability; None takes the architecture's (0 when it has none)."""
    device: Literal["cuda", "cpu"] = "cuda"
    """Where it runs: CUDA keeps 1-byte dropout masks, CPU keeps them in the activation dtype."""
    loss: str = "standard"
    """The loss as the training code computes it: standard (the framework's own: Hugging Face upcasts the logits to
    fp32), chunked:N (torchtune's CEWithChunkedOutputLoss, N chunks) or fused (linear + cross-entropy in one kernel:
    the logits never exist). Realistic accounting."""
    compile: bool = False
    """torch.compile on each decoder layer (torchtitan and torchtune compile per block): AOTAutograd's min-cut
    partitioner recomputes cheap element-wise ops instead of saving them (``memcalc.memory.families.compiled``, exact against a
    census of compiled layers on CPU; the paper accounting counts the eager layer); the norms, activations and rotary
    run fused."""
    compile_loss: bool | None = None
    """With ``compile``: the loss compiled too (inductor's fused cross-entropy saves the logits instead of the fp32
    log-softmax). None: as the framework does (a compiled Hugging Face model has its loss in the graph; torchtune
    compiles a chunked loss only; torchtitan since ``compile.components`` (2025): taken as not, the larger answer)."""
    optimizer_impl: Literal["foreach", "fused", "for-loop", "in-backward"] = "foreach"
    """torch.optim.AdamW's implementation: foreach (torch's default on CUDA: temporaries as large as the parameters),
    fused (none), for-loop (one parameter's worth), in-backward (each gradient freed after its own step)."""

    def _check(self) -> None:
        if not (self.recompute in ("none", "selective", "full", "op-sac") or _every(self.recompute)
                or megatron_recompute(self.recompute)):
            raise InputError(f"--recompute {self.recompute!r} is not accepted; accepted: none, selective, full, "
                             "every:K (K >= 1), op-sac, and under --framework megatron selective:MODULES (core_attn, "
                             "mlp, layernorm, moe_act joined by +), full:uniform:N, full:block:N")
        if not (self.loss in ("standard", "fused") or _chunks(self.loss)):
            raise InputError(f"--loss {self.loss!r} is not accepted; accepted: standard, chunked:N (N >= 1), fused")
        if self.compile_loss is not None and not self.compile:
            raise InputError(f"--{'' if self.compile_loss else 'no-'}compile-loss says how torch.compile treats the "
                             "loss; give --compile with it, or leave it out")


def _every(text: str) -> bool:
    head, _, k = text.partition(":")
    return head == "every" and k.isdigit() and 1 <= int(k) <= 100_000


def _chunks(text: str) -> bool:
    head, _, n = text.partition(":")
    return head == "chunked" and n.isdigit() and 1 <= int(n) <= 10_000

