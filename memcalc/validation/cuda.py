"""On a CUDA machine: the peak of one real training step against the realistic accounting's, what memcalc answers.

A small Hugging Face Llama (``SMALL_LLAMA``: random weights, built from its config, nothing downloaded) trains on
one GPU as the Trainer runs it: pure bf16, SDPA attention, no dropout, ``torch.optim.AdamW`` (foreach), the model's
own loss, ``zero_grad(set_to_none=True)``. The second step is measured (the optimizer's states exist by then):
``torch.cuda.max_memory_allocated`` against the estimate's ``peak_allocated`` and ``max_memory_reserved`` against
its ``peak_reserved``. The estimate is ``memcalc.estimate`` with the same model and step, the realistic accounting
(the one ``memcalc estimate`` answers with for this step); the CUDA context is outside the allocator and is not
compared.

The step runs through ``memcalc.validation.trace_step``, the code the CPU traces run, so the tests run it on the
CPU (``two_steps(..., device="cpu")``) where no GPU is present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
    "num_hidden_layers": 4, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "use_cache": False,
}  # fmt: skip
"""The model the check trains: Llama's layout at 4 layers of hidden 512 (20,189,696 parameters; a 0.58 GB peak)."""
SEQ_LEN, MICRO_BATCH = 512, 4
STEP = dict(precision="bf16", optimizer_impl="foreach", attention="sdpa")
"""How the step runs, in memcalc.validation.trace_step.StepSpec's words (its dropout is the config's: none)."""


@dataclass(frozen=True)
class CudaPeak:
    """One step's peak on the GPU, measured and estimated, in bytes."""

    measured_allocated: int
    estimated_allocated: int
    measured_reserved: int
    estimated_reserved: int

    def line(self) -> str:
        def pair(measured: int, estimated: int) -> str:
            return f"measured {measured:,}, estimated {estimated:,} ({(estimated - measured) / measured:+.1%})"

        return (f"CUDA peak of a bf16 step, Hugging Face Llama ({SMALL_LLAMA['num_hidden_layers']} layers, hidden "
                f"{SMALL_LLAMA['hidden_size']}, {MICRO_BATCH} x {SEQ_LEN} tokens, one GPU) against the realistic "
                f"accounting, bytes: max_memory_allocated {pair(self.measured_allocated, self.estimated_allocated)}"
                f"; max_memory_reserved {pair(self.measured_reserved, self.estimated_reserved)}")  # fmt: skip


def realistic_estimate(hf_config: dict[str, Any] = SMALL_LLAMA, seq_len: int = SEQ_LEN,
                       micro_batch: int = MICRO_BATCH) -> Any:  # fmt: skip
    """``memcalc.estimate`` of the step the check runs, with the realistic accounting (no torch needed)."""
    import memcalc
    from memcalc.model.hf_config import architecture_from_config

    arch = architecture_from_config(hf_config, name="llama (memcalc validate)")
    return memcalc.estimate(model=arch, ddp=True, gpus=1, seq_len=seq_len, micro_batch=micro_batch, dropout=0.0,
                            precision=STEP["precision"], optimizer_impl=STEP["optimizer_impl"],
                            attention=STEP["attention"], framework="hf", accounting="realistic")  # fmt: skip


def two_steps(hf_config: dict[str, Any] = SMALL_LLAMA, seq_len: int = SEQ_LEN, micro_batch: int = MICRO_BATCH,
              device: str = "cuda") -> tuple[int, int] | None:  # fmt: skip
    """Two training steps on ``device``; on CUDA, the second's (max_memory_allocated, max_memory_reserved)."""
    import torch

    from memcalc.validation.trace_step import StepSpec, batch, build_model, build_optimizer, run_step

    spec = StepSpec(seq_len=seq_len, micro_batch=micro_batch, **STEP)
    torch.manual_seed(0)
    model = build_model(hf_config, spec).to(device)
    optimizer = build_optimizer(model, spec.optimizer_impl)
    ids, pos = (t.to(device) for t in batch(hf_config, spec))
    cuda = device.startswith("cuda")
    for step in range(2):
        if step == 1 and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        run_step(model, optimizer, ids, pos, spec, None)
    if not cuda:
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def peak_vs_estimate() -> CudaPeak:
    """The measured and the estimated peak of the check's step on this machine's GPU."""
    measured = two_steps()
    assert measured is not None
    est = realistic_estimate().memory.per_gpu
    return CudaPeak(measured_allocated=measured[0], estimated_allocated=est.peak_allocated,
                    measured_reserved=measured[1], estimated_reserved=est.peak_reserved)  # fmt: skip
