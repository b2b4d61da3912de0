"""One Hugging Face training step, built and run the way Trainer runs it, for the live-bytes tracker.

The step: ``AutoModelForCausalLM.from_config``, input ids with ``labels=input_ids`` (the model's own loss,
``transformers/loss/loss_utils.py: ForCausalLMLoss``), forward under ``torch.autocast`` for "amp-bf16",
backward, ``torch.optim.AdamW`` (foreach / fused / for-loop), ``zero_grad(set_to_none=True)``. The same code
runs on real tensors and on fake ones (``trace.trace_step`` wraps it in ``FakeTensorMode``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from memcalc.errors import InputError
from memcalc.validation.trace_tracker import LiveBytes, model_state_tensors

PRECISIONS = ("fp32", "bf16", "amp-bf16")
OPTIMIZERS = ("foreach", "fused", "for-loop")
RECOMPUTES = ("none", "full")
ATTENTIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class StepSpec:
    """How one step is run."""

    seq_len: int
    micro_batch: int = 1
    precision: str = "fp32"
    """fp32 | bf16 (weights, gradients and AdamW moments in bf16) | amp-bf16 (fp32 weights, autocast bf16)"""
    optimizer_impl: str = "foreach"
    """foreach | fused | for-loop (torch.optim.AdamW's three implementations)"""
    recompute: str = "none"
    """none | full (gradient_checkpointing_enable, use_reentrant=False)"""
    attention: str = "sdpa"
    """sdpa | eager (attn_implementation)"""

    def check(self) -> None:
        for name, value, accepted in (("precision", self.precision, PRECISIONS),
                                      ("optimizer_impl", self.optimizer_impl, OPTIMIZERS),
                                      ("recompute", self.recompute, RECOMPUTES),
                                      ("attention", self.attention, ATTENTIONS)):  # fmt: skip
            if value not in accepted:
                raise InputError(f"{name} {value!r} is not supported; accepted: {', '.join(accepted)}")
        if self.seq_len < 1 or self.micro_batch < 1:
            raise InputError(f"seq_len {self.seq_len} and micro_batch {self.micro_batch} must be at least 1")


@contextlib.contextmanager
def eager_masks() -> Iterator[None]:
    """Keep transformers on its eager mask path under fake tensors.

    ``transformers/utils/import_utils.py: is_tracing`` is true for fake tensors, so
    ``masking_utils.find_packed_sequence_indices`` returns a packed-sequence mask and an explicit attention mask
    is built (SDPA then runs its math fallback). Training batches here are one sequence per row, for which the
    real function returns None; patched on real runs too so both run the same ops.
    """
    from transformers import masking_utils

    orig = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


@contextlib.contextmanager
def _quiet_imports() -> Iterator[None]:
    """transformers imports torchao when it is installed; torchao's loader then logs each compiled extension this torch
    cannot load (CUDA-only kernels on a CPU build) and torch's pytree notes its enum registrations. Neither concerns
    the traced step: both loggers are held at ERROR while the import runs."""
    names = ("torchao", "torch.utils._pytree")
    levels = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, level in zip(names, levels):
            logging.getLogger(n).setLevel(level)


@functools.cache
def cache_promotes_values() -> bool:
    """Whether the installed transformers' ``DynamicCache`` promotes a bf16 V to the dtype of an fp32 K (5.x before
    5.24: the empty values tensor was made with K's dtype), probed with one update; the timeline's
    ``cache_promotes_values`` for comparing its autocast steps with a trace."""
    with _quiet_imports():
        from transformers.cache_utils import DynamicCache

    _, value = DynamicCache().update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2, dtype=torch.bfloat16), 0)
    return value.dtype == torch.float32


def build_model(hf_config: dict, spec: StepSpec) -> torch.nn.Module:
    """The model with random weights on the current (possibly fake) mode, in training mode."""
    with _quiet_imports():
        from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config)
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise InputError("hf_config lacks 'model_type'; accepted: a Hugging Face config.json dict")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    if spec.recompute == "full":  # what transformers sets itself under checkpointing (and logs a line to say so)
        cfg["use_cache"] = False
    dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
    with _quiet_imports():  # the model classes import the rest lazily
        config = AutoConfig.for_model(model_type, **cfg)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=spec.attention, dtype=dtype)
    model.train()
    if spec.recompute == "full":
        enable_checkpointing(model)
    return model


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpointing of every decoder layer: transformers 5's ``activation_checkpointing_enable`` (the
    old ``gradient_checkpointing_enable`` warns that it goes in v6), the old name on releases that lack the new one."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks (``model.model.layers`` for Llama/Qwen2, ``transformer.h`` for GPT-2,
    ``model.decoder.layers`` for OPT)."""
    for owner in ("model", "transformer", "gpt_neox"):
        base = getattr(model, owner, None)
        base = getattr(base, "decoder", base)  # OPT: model.decoder.layers
        for name in ("layers", "h"):
            blocks = getattr(base, name, None)
            if isinstance(blocks, torch.nn.ModuleList):
                return list(blocks)
    raise InputError(f"{type(model).__name__}: no decoder layer list found (looked for model.layers, "
                     "model.decoder.layers, transformer.h)")


def build_optimizer(model: torch.nn.Module, impl: str) -> torch.optim.Optimizer:
    """torch.optim.AdamW: foreach=True / fused=True / neither (for-loop, the CPU default).

    Under tensor parallelism without FSDP the embedding, norms and head stay plain tensors beside DTensor
    weights; the multi-tensor kernels take one kind per list, so each kind gets its own parameter group.
    """
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    dist = [p for p in params if isinstance(p, DTensor)]
    groups = [{"params": g} for g in (dist, [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.AdamW(groups if len(groups) > 1 else params, lr=1e-4, foreach=impl == "foreach",
                             fused=impl == "fused")  # fmt: skip


def mark_phases(model: torch.nn.Module, tracker_ref: Callable[[], LiveBytes | None]) -> list:
    """Hooks that label the phase: ``forward.layer.i``, ``forward.head``, ``loss`` and, once a layer's output
    gradient is ready, ``backward.layer.i`` (under full recomputation its forward is recomputed there: Hugging
    Face checkpoints ``forward``, with module hooks outside, ``transformers/modeling_layers.py``)."""
    handles = []

    def at(label: str) -> Callable:
        def hook(*_):
            t = tracker_ref()
            if t is not None:
                t.phase(label)

        return hook

    for i, layer in enumerate(decoder_layers(model)):
        handles.append(layer.register_forward_pre_hook(at(f"forward.layer.{i}"), prepend=True))
        handles.append(layer.register_full_backward_pre_hook(at(f"backward.layer.{i}"), prepend=True))
    head = model.get_output_embeddings()
    handles.append(head.register_forward_pre_hook(at("forward.head"), prepend=True))
    handles.append(head.register_forward_hook(at("loss")))
    return handles


def batch(hf_config: dict, spec: StepSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and full-length position ids (one sequence per row)."""
    vocab = int(hf_config.get("vocab_size", 2))
    ids = torch.randint(0, vocab, (spec.micro_batch, spec.seq_len))
    pos = torch.arange(spec.seq_len).unsqueeze(0).expand(spec.micro_batch, -1)
    return ids, pos


def run_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, pos: torch.Tensor,
             spec: StepSpec, tracker: LiveBytes | None, loss_parallel: bool = False) -> None:
    """Forward (+ the model's loss), backward, optimizer step, zero_grad; phases marked on ``tracker``.

    ``loss_parallel``: forward and backward under ``torch.distributed.tensor.parallel.loss_parallel`` (the
    vocabulary-sharded logits' cross-entropy; torchtitan's ``train.py`` wraps both the same way)."""
    mark = tracker.phase if tracker is not None else (lambda _: None)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if spec.precision == "amp-bf16"
                else contextlib.nullcontext())  # fmt: skip
    if loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel as parallel_loss
        ctx = parallel_loss()
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        mark("forward")
        with autocast:
            loss = model(input_ids=ids, labels=ids, position_ids=pos).loss  # Trainer keeps only the loss
        mark("backward")
        loss.backward()
        del loss
    mark("optimizer")
    optimizer.step()
    mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)


def traced_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, pos: torch.Tensor,
                 spec: StepSpec, steps: int, loss_parallel: bool = False, capacity: int | None = None) -> LiveBytes:
    """Run ``steps`` steps; the last one under a fresh tracker whose baseline is the states alive before it.

    Every step's storages, after the states that exist before the first one, are also logged in order and replayed
    through the caching allocator (``memcalc.memory.allocator.caching``): ``tracker.peak_reserved`` is the reserved peak a
    GPU would reach by the end of the last step, the first steps' cached blocks included (the optimizer's states
    are created in the first step's ``optimizer.step()``, into blocks the activations left). With ``capacity`` the
    replay stops at the first request the GPU could not serve, kept in ``tracker.oom``."""
    import time

    from memcalc.memory.allocator.caching import replay
    from memcalc.memory.engine.timeline import CUBLAS_WORKSPACE

    box: list[LiveBytes | None] = [None]
    handles = mark_phases(model, lambda: box[0])
    log = LiveBytes(record_timeline=False, record_blocks=True)
    log.add_baseline(model_state_tensors(model, optimizer))
    assert log.blocks is not None
    # the forward's thread and autograd's backward thread each get a cuBLAS workspace at their first matmul
    log.blocks += [(-1, CUBLAS_WORKSPACE), (-2, CUBLAS_WORKSPACE)]
    try:
        with eager_masks(), log:
            log.track_tensor(ids)
            log.track_tensor(pos)
            for _ in range(steps - 1):
                run_step(model, optimizer, ids, pos, spec, None, loss_parallel)
            tracker = LiveBytes()
            tracker.add_baseline(model_state_tensors(model, optimizer))
            box[0] = tracker
            start = time.perf_counter()
            with tracker:
                tracker.phase("input")  # the batch, as a data loader hands it over each step
                tracker.track_tensor(ids)
                tracker.track_tensor(pos)
                run_step(model, optimizer, ids, pos, spec, tracker, loss_parallel)
            tracker.seconds = time.perf_counter() - start
    finally:
        for h in handles:
            h.remove()
    replayed = replay(log.blocks, capacity)
    tracker.peak_reserved, tracker.oom = replayed.peak_reserved, replayed.oom
    return tracker
