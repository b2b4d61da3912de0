"""Live bytes of one DeepSpeed ZeRO training step of a Hugging Face model, op by op, on CPU ranks (gloo).

``world`` spawned processes each build ``AutoModelForCausalLM.from_config`` in fp32, hand it to
``deepspeed.initialize`` with ``bf16: {enabled: true}`` (DeepSpeed casts the module to bf16) and a
``torch.optim.AdamW`` client optimizer, and run three steps of
``loss = engine(input_ids=ids, labels=ids).loss; engine.backward(loss); engine.step()``; the third runs under
``trace_tracker.LiveBytes`` on every rank and rank 0's trace comes back. Every storage is also recorded with the
op, phase and source line that allocated it, and the live set is kept at each phase's peak
(``DeepSpeedTrace.held``): storages get the name of what holds them (``zero_opt.bit16_groups_flat[0]``,
``optimizer.state[0].exp_avg``, ``param lm_head.weight.grad``; looked up at every phase mark), and transients
the DeepSpeed or transformers line that allocated them (``deepspeed/runtime/zero/stage_1_and_2.py:3266``).

Phases: ``input``, ``forward``, ``forward.layer.i``, ``forward.head``, ``loss`` (``trace_step.mark_phases`` on
``engine.module``), ``backward``, ``backward.layer.i``, ``backward.epilogue`` (the engine's and ZeRO's end of
backward: the last reductions), ``optimizer`` (``engine.step``: norms, the fp32 gradient partition),
``optimizer.adamw`` (the inner ``torch.optim.AdamW.step``), ``optimizer.update`` (fp32 → bf16 copy, all-gather),
``zero_grad`` (after ``engine.step``, which already cleared the gradients).

Collectives run on untracked copies (``_stage_collectives``). Gloo's worker thread drops its reference to a
finished collective's tensors some time after ``wait()`` returns, on a loaded machine an op or a phase later, so a
buffer DeepSpeed has released could otherwise die late in some runs and not in others (ZeRO-3's gathered head
weight alive into the loss, ZeRO-0's flattened all-reduce buffers into the optimizer's first op). What a backend
allocates inside a collective is not DeepSpeed's and is not counted either (gloo's ``reduce_scatter_tensor`` copies
its input; NCCL reduces in place): the trace shows what DeepSpeed holds and where it lets go.

The caller's main module must be importable by the spawned ranks (an ``if __name__ == "__main__":`` guard).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from memcalc.errors import InputError
from memcalc.validation.ranks import arm_watchdog, run_ranks
from memcalc.validation.trace_deepspeed_storage import AttributedLiveBytes, Held, named_storages
from memcalc.validation.trace_step import (
    ATTENTIONS,
    RECOMPUTES,
    enable_checkpointing,
    mark_phases,
)
from memcalc.validation.trace_tracker import BASELINE, Trace

STAGES = (0, 1, 2, 3)
PRECISIONS = ("bf16", "fp32")
"""bf16: ``bf16: {enabled: true}``; fp32: neither fp16 nor bf16 enabled (as the Trainer's ``"auto"`` without
--fp16/--bf16), the module trained in fp32."""
OPTIMIZERS = ("torch-adamw", "torch-adamw-foreach", "torch-adamw-fused")
"""torch.optim.AdamW with its default implementation (the for-loop one on CPU), foreach=True, or fused=True."""


@dataclass(frozen=True)
class DeepSpeedTrace:
    trace: Trace
    held: dict[str, tuple[Held, ...]] = field(repr=False)
    """``baseline``, every phase at its peak, and ``end``: the storages live then."""
    config: dict = field(repr=False)
    """The DeepSpeed config the ranks ran."""
    facts: dict[str, int] = field(default_factory=dict)
    """Rank 0's sizes in elements: ``psi`` (parameters), ``largest`` (parameter), ``flat`` (ZeRO-1/2's padded
    flat bf16 buffer), ``partition`` (ZeRO-1/2: flat / world; ZeRO-3: sum of per-parameter partitions),
    ``in_partition`` (ZeRO-1/2: elements of the parameters overlapping rank 0's partition)."""


def ds_config(stage: int, micro_batch: int, reduce_bucket_size: int | None, overlap_comm: bool | None,
              contiguous_gradients: bool | None, zero_config: dict | None, precision: str = "bf16") -> dict:
    """The DeepSpeed config: bf16 (or fp32), ZeRO ``stage`` (ZeRO-3 partitions every parameter), untested client
    optimizer."""
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # DeepSpeed's default keeps parameters up to 1e5 whole
    for key, v in (("reduce_bucket_size", reduce_bucket_size), ("overlap_comm", overlap_comm),
                   ("contiguous_gradients", contiguous_gradients)):  # fmt: skip
        if v is not None:
            zero[key] = v
    zero.update(zero_config or {})
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            "zero_allow_untested_optimizer": True, "bf16": {"enabled": precision == "bf16"},
            "zero_optimization": zero, "steps_per_print": 10**9}  # fmt: skip


# --- one rank ------------------------------------------------------------------------------------------------
def _engine(hf_config: dict, attention: str, optimizer: str, recompute: str, config: dict, lora: Any = None) -> Any:
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in hf_config.items()
           if k not in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype")}  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg),
                                             attn_implementation=attention)  # fp32; DeepSpeed casts it to bf16
    model.train()
    if lora is not None:  # peft injects its adapters into the model in place and freezes the rest
        from memcalc.validation.lora import add_adapters

        add_adapters(model, hf_config, lora)
    impl = {"foreach": optimizer.endswith("foreach"), "fused": optimizer.endswith("fused")}
    trainable = [p for p in model.parameters() if p.requires_grad]  # Trainer.create_optimizer's groups
    engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                           optimizer=torch.optim.AdamW(trainable, lr=1e-4, **impl))
    if recompute == "full":
        enable_checkpointing(engine.module)
    return engine


def _wrap_phase(obj: Any, name: str, mark, before: str, after: str | None = None) -> None:
    """Mark phases around a method, set on the instance (DeepSpeed calls these through ``self``)."""
    inner = getattr(obj, name, None)
    if inner is None:
        return

    def wrapped(*a, **k):
        mark(before)
        out = inner(*a, **k)
        if after:
            mark(after)
        return out

    setattr(obj, name, wrapped)


def _facts(engine: Any) -> dict[str, int]:
    zero_opt, params = engine.optimizer, list(engine.module.parameters())
    sizes = [int(getattr(p, "ds_numel", p.numel())) for p in params]
    flat, part = getattr(zero_opt, "bit16_groups_flat", None), getattr(zero_opt, "partition_size", None)
    facts = {"psi": sum(sizes), "largest": max(sizes), "flat": sum(t.numel() for t in flat) if flat else 0}
    if hasattr(params[0], "partition_numel"):  # ZeRO-3: per-parameter partitions
        facts["partition"] = sum(int(p.partition_numel()) for p in params)
    elif isinstance(part, list):  # ZeRO-1/2
        facts["partition"] = int(sum(part))
        facts["in_partition"] = sum(p.numel() for g in zero_opt.params_in_partition for p in g)
    return facts


_COLLECTIVES = ("all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_reduce", "all_reduce_coalesced",
                "all_to_all", "all_to_all_single", "broadcast", "gather", "reduce", "reduce_scatter",
                "reduce_scatter_tensor", "scatter")  # fmt: skip
"""``deepspeed.comm``'s backend methods that move tensors (every ZeRO collective goes through one of them)."""


class _Done:
    """The handle of a collective that has already run (what a staged ``async_op=True`` call returns)."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _clones(x: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``x`` with every tensor in it (lists and tuples followed) replaced by a clone; (tensor, clone) appended to
    ``pairs``. A module-level function: a recursive closure would be a reference cycle keeping the tensors alive
    until the garbage collector runs."""
    if isinstance(x, torch.Tensor):
        pairs.append((x, x.detach().clone()))
        return pairs[-1][1]
    if isinstance(x, (list, tuple)):
        return type(x)(_clones(y, pairs) for y in x)
    return x


def _staged(fn: Any) -> Any:
    """``fn`` run on untracked clones of its tensor arguments, waited for, the results copied back in place.

    Gloo keeps a finished collective's tensors until its worker thread gets round to dropping them; the clones are
    made with the dispatch modes off, so the tracker never counts them (nor what gloo copies inside the collective)
    and the caller's own tensors die when DeepSpeed lets go of them, in every run alike. An asynchronous call
    (``async_op=True``) returns a handle that has already completed."""

    def run(*args: Any, **kwargs: Any) -> Any:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        with _disable_current_modes(), torch.no_grad():
            args = _clones(args, pairs)
            kwargs = {key: _clones(value, pairs) for key, value in kwargs.items()}
            result = fn(*args, **kwargs)
            waited = callable(getattr(result, "wait", None))
            if waited:
                result.wait()
            for original, copy in pairs:
                original.copy_(copy)
        return _Done() if waited else result

    return run


def _stage_collectives() -> None:
    """Every tensor collective of ``deepspeed.comm``'s backend staged through ``_staged``."""
    from deepspeed.comm import comm

    for name in _COLLECTIVES:
        if hasattr(comm.cdb, name):
            setattr(comm.cdb, name, _staged(getattr(comm.cdb, name)))


def _rank_main(rank: int, world: int, hf_config: dict, seq_len: int, micro_batch: int, recompute: str,
               attention: str, optimizer: str, config: dict, init_file: str, out_dir: str, timeout: float,
               lora: Any = None) -> None:
    import datetime
    import logging
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    arm_watchdog(out_dir, rank, timeout)
    failed = False
    try:
        torch.set_num_threads(1)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # DeepSpeed asks for them
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))  # fmt: skip
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        deepspeed.init_distributed(dist_backend="gloo")
        _stage_collectives()
        engine = _engine(hf_config, attention, optimizer, recompute, config, lora)
        box: list[AttributedLiveBytes | None] = [None]

        def mark(label: str) -> None:
            if box[0] is not None:
                box[0].phase(label)
                box[0].name(named_storages(engine))

        class _Marker:  # what mark_phases' hooks call .phase(label) on
            phase = staticmethod(mark)

        mark_phases(engine.module, lambda: _Marker if box[0] is not None else None)
        _wrap_phase(engine, "_backward_epilogue", mark, "backward.epilogue")
        _wrap_phase(engine.optimizer, "independent_gradient_partition_epilogue", mark, "backward.epilogue")
        _wrap_phase(getattr(engine.optimizer, "optimizer", engine.optimizer), "step", mark, "optimizer.adamw",
                    "optimizer.update")  # fmt: skip
        gen = torch.Generator().manual_seed(rank)
        for step in range(3):
            ids = torch.randint(0, int(hf_config.get("vocab_size", 2)), (micro_batch, seq_len), generator=gen)
            if step == 2:
                tracker = AttributedLiveBytes()
                gc.collect()
                skip = ids.untyped_storage()._cdata
                tracker.add_baseline(o for o in gc.get_objects()
                                     if isinstance(o, torch.Tensor) and o.untyped_storage()._cdata != skip)
                tracker.name(named_storages(engine))
                tracker.snapshots[BASELINE] = list(tracker.info.values())
                box[0] = tracker
                start = time.perf_counter()
                tracker.__enter__()
                tracker.phase("input")
                tracker.track_tensor(ids)
            mark("forward")
            loss = engine(input_ids=ids, labels=ids).loss
            mark("backward")
            engine.backward(loss)
            del loss
            mark("optimizer")
            engine.step()
            mark("zero_grad")
        tracker.__exit__(None, None, None)
        seconds = time.perf_counter() - start
        del ids
        gc.collect()
        tracker.name(named_storages(engine))
        tracker.snapshots["end"] = list(tracker.info.values())
        box[0] = None
        if rank == 0:
            dtype = "bf16" if config["bf16"]["enabled"] else "fp32"
            label = (f"{hf_config['model_type']} b{micro_batch}xs{seq_len} deepspeed "
                     f"zero-{config['zero_optimization']['stage']} world={world} {dtype} {optimizer} "
                     f"recompute={recompute} {attention}"
                     + (f" lora r={lora.rank} {','.join(lora.targets)}" if lora is not None else ""))  # fmt: skip
            held = {k: tuple(i.held() for i in v) for k, v in tracker.snapshots.items()}
            result = DeepSpeedTrace(tracker.result(label, seconds), held, config, _facts(engine))
            Path(out_dir, "rank0.pkl").write_bytes(pickle.dumps(result))
    except BaseException:  # noqa: BLE001 - reported to the parent through the file system
        failed = True
        Path(out_dir, f"rank{rank}.error").write_text(traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):  # the others may be gone already
            if dist.is_initialized() and not failed:  # after an error the parent stops the others (run_ranks)
                dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # gloo can abort in destroy_process_group


# --- public --------------------------------------------------------------------------------------------------
def trace_deepspeed(hf_config: dict, *, stage: int, world: int, seq_len: int, micro_batch: int,
                    precision: str = "bf16", recompute: str = "none", attention: str = "sdpa",
                    reduce_bucket_size: int | None = None, overlap_comm: bool | None = None,
                    contiguous_gradients: bool | None = None, optimizer: str = "torch-adamw",
                    zero_config: dict | None = None, timeout: float = 300, lora: Any = None) -> DeepSpeedTrace:
    """Rank 0's trace of the third DeepSpeed step, with what was live at the baseline, each phase's peak and the end.

    Baseline (the exact count): every storage behind a torch tensor alive in the rank's process just before the
    third step (``gc.get_objects()`` after ``gc.collect()``: parameters, their views into DeepSpeed's flat buffers,
    gradients, buffers, DeepSpeed's bf16/fp32 partitions and buffers, the optimizer moments), each storage counted
    once at its full size, meta tensors excluded, the batch excluded (it is counted in ``input``). Storages
    created and freed inside the step are counted by ``LiveBytes``. ``None`` for ``reduce_bucket_size``,
    ``overlap_comm`` and ``contiguous_gradients`` keeps DeepSpeed's defaults (5e8 elements, on for ZeRO-3 only,
    on); ``zero_config`` adds entries to the ``zero_optimization`` section. Ranks still running after ``timeout``
    seconds are killed and a ``RuntimeError`` names the configuration. ``lora``: a ``memcalc.model.lora.LoraPlan``;
    peft's adapters (``lora_dropout=0``, ``enable_input_require_grads()``) on the model before DeepSpeed wraps it,
    and the client optimizer over the trainable parameters, as ``Trainer.create_optimizer`` builds it.
    """
    for name, value, accepted in (("precision", precision, PRECISIONS), ("recompute", recompute, RECOMPUTES),
                                  ("attention", attention, ATTENTIONS), ("optimizer", optimizer, OPTIMIZERS),
                                  ("stage", stage, STAGES)):  # fmt: skip
        if value not in accepted:
            raise InputError(f"{name} {value!r} is not supported; accepted: {', '.join(map(str, accepted))}")
    if world < 1 or seq_len < 1 or micro_batch < 1:
        raise InputError(f"world {world}, seq_len {seq_len} and micro_batch {micro_batch} must be at least 1")
    if "model_type" not in hf_config:
        raise InputError("hf_config lacks 'model_type'; accepted: a Hugging Face config.json dict")
    config = ds_config(stage, micro_batch, reduce_bucket_size, overlap_comm, contiguous_gradients, zero_config,
                       precision)
    with tempfile.TemporaryDirectory() as out:
        init_file = os.path.join(out, "init")
        args = [(r, world, dict(hf_config), seq_len, micro_batch, recompute, attention, optimizer, config, init_file,
                 out, timeout, lora) for r in range(world)]  # fmt: skip
        name = f"zero-{stage} world={world}"
        run_ranks(_rank_main, args, out, timeout, name)
        path = Path(out, "rank0.pkl")
        if not path.exists():
            raise RuntimeError(f"{name}: rank 0 wrote no result (it crashed)")
        return pickle.loads(path.read_bytes())


def trace_deepspeed_step(hf_config: dict, *, stage: int, world: int, seq_len: int, micro_batch: int,
                         precision: str = "bf16", recompute: str = "none", attention: str = "sdpa",
                         reduce_bucket_size: int | None = None, overlap_comm: bool | None = None,
                         contiguous_gradients: bool | None = None, optimizer: str = "torch-adamw") -> Trace:
    """Rank 0's ``Trace`` of the third DeepSpeed ZeRO step (two warm-up steps first, the tracker active in the
    third only; baseline = every tensor storage alive in the rank before it, the batch excluded): see
    ``trace_deepspeed``, which also returns what was live at each phase's peak."""
    return trace_deepspeed(hf_config, stage=stage, world=world, seq_len=seq_len, micro_batch=micro_batch,
                           precision=precision, recompute=recompute, attention=attention,
                           reduce_bucket_size=reduce_bucket_size, overlap_comm=overlap_comm,
                           contiguous_gradients=contiguous_gradients, optimizer=optimizer).trace  # fmt: skip

