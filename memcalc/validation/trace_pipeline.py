"""One pipeline rank's training step, traced: torch's own ``PipelineStage`` and schedule on fake tensors.

One process acts as rank ``rank`` of a (pp, dp, tp) mesh of torch's fake process group: its stage module holds the
Hugging Face model's decoder layers of that stage (with the embedding on the first, the final norm and the head on the
last), ``fully_shard`` on each layer and on the stage with ``reshard_after_forward=False`` when dp is above 1
(torchtitan's ``parallelize`` under pipelining; before it, with tp above 1, torchtitan's sequence-parallel plan),
and runs ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``
(torch/distributed/pipelining). The fake process group completes every send and receive at once without data; the
schedules' first-step shape inference is replaced by the static shapes the stage is given (what every real rank
agrees on with static shapes). The second step is traced (the first creates the optimizer's state and the receive
buffers), with the parameters, the optimizer's state, the buffers and the receive buffers as its baseline, its phases
labelled as ``memcalc.memory.overlays.timeline_pp.stage_timeline``'s (``forward.layer.i``, ``backward.layer.i``, ...).

What it checks: ``memcalc.memory.overlays.timeline_pp.stage_timeline`` (tests/test_pipeline_realistic.py).
"""

from __future__ import annotations

import contextlib
import time
import warnings

import torch

from memcalc.errors import InputError
from memcalc.validation.trace_parallel import _real_mesh_concatenate, _sp_plan, check_tp_heads, fresh_dtensor_caches
from memcalc.validation.trace_step import StepSpec, build_model
from memcalc.validation.trace_tracker import LiveBytes


class _Stage(torch.nn.Module):
    """The layers ``layers`` of a causal LM, with its embedding when ``first`` and its final norm and head when
    ``last`` (as torchtitan's ``pipeline_module_split`` keeps them: the others set to None)."""

    def __init__(self, model: torch.nn.Module, first: bool, last: bool, layers: list[torch.nn.Module],
                 seq_len: int | None = None) -> None:
        super().__init__()
        self.seq_len = seq_len  # the whole sequence where the stage's input is a sequence-parallel shard
        inner = model.model
        self.embed = inner.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(layers)
        self.rotary = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        pos = torch.arange(self.seq_len or h.shape[1]).unsqueeze(0)  # one row: what model(input_ids) makes
        pe = self.rotary(h, pos)
        for layer in self.layers:
            h = layer(h, position_embeddings=pe, attention_mask=None, position_ids=pos)
            h = h[0] if isinstance(h, tuple) else h
        if self.head is not None:
            h = self.head(self.norm(h))
        return h


def _mark(stage: _Stage, first_layer: int, box: list) -> None:
    """Phase labels as the analytic stage timeline's: ``forward`` at each stage forward, ``forward.layer.i`` and
    ``backward.layer.i`` with the model's own layer index ``i``, ``forward.head`` at the last stage's head and
    ``backward`` for its loss (the loss runs after the head's forward)."""

    def at(label: str):
        def hook(*_):
            if box[0] is not None:
                box[0].phase(label)

        return hook

    stage.register_forward_pre_hook(at("forward"), prepend=True)
    for j, layer in enumerate(stage.layers):
        layer.register_forward_pre_hook(at(f"forward.layer.{first_layer + j}"), prepend=True)
        layer.register_full_backward_pre_hook(at(f"backward.layer.{first_layer + j}"), prepend=True)
    if stage.head is not None:
        stage.head.register_forward_pre_hook(at("forward.head"), prepend=True)
        stage.head.register_forward_hook(at("backward"))


def _static_shapes() -> None:
    """Every schedule's first-step shape exchange answered with the static shapes the stages were given."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._utils import InferenceMode

    def static(self, stages, has_backward, p2p_done):
        for st in stages:
            st._inference_mode = InferenceMode.STATIC

    for name in dir(schedules):
        cls = getattr(schedules, name)
        if isinstance(cls, type) and "_warmup_p2p" in cls.__dict__:
            cls._warmup_p2p = static


def trace_pipeline_rank(hf_config: dict, spec: StepSpec, *, pp: int, dp: int, rank: int, micro_batches: int,
                        stage_layers: list[int] | None = None, virtual: int = 1,
                        fsdp_param_dtype: str | None = None, reduce_fp32: bool = False, tp: int = 1,
                        record_blocks: bool = False) -> LiveBytes:  # fmt: skip
    """The traced second step of pipeline rank ``rank`` of ``pp`` (FSDP2 over ``dp`` ranks inside its stages when
    ``dp`` is above 1). ``stage_layers``: decoder layers of each of the ``pp·virtual`` stages (default: even);
    ``virtual`` above 1 runs ``ScheduleInterleaved1F1B`` with stages ``rank + c·pp`` on this rank.
    ``fsdp_param_dtype`` "bf16" with an fp32 model: ``MixedPrecisionPolicy(param_dtype=bf16)`` (``reduce_fp32``:
    ``reduce_dtype=fp32``). ``tp`` above 1: a (pp, dp, tp) mesh, the whole model first laid out by torchtitan's
    sequence-parallel plan (``trace_parallel._sp_plan`` with its plain local outputs: a stage boundary is the rank's
    1/tp of the sequence), the loss under ``loss_parallel`` over the vocabulary-sharded logits, as torchtitan's
    ``parallelize`` applies TP before FSDP and its train step runs the pipeline under ``loss_parallel``. Returns the
    tracker (``peak``, ``baseline``, ``timeline``). ``record_blocks``: the baseline's storages, then the traced step's
    allocations, replayed through the caching allocator (``memcalc.memory.allocator.caching``, one stream, from an empty cache)
    into ``peak_reserved``."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
    from torch.distributed.tensor.parallel import loss_parallel as parallel_loss
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec.check()
    n_layers = hf_config["num_hidden_layers"]
    stages = pp * virtual
    split = stage_layers or [n_layers // stages + (k < n_layers % stages) for k in range(stages)]
    if len(split) != stages or sum(split) != n_layers or min(split) < 1 or not 0 <= rank < pp:
        raise InputError(f"stage_layers {split} must be {stages} positive counts adding up to {n_layers}, rank < pp")
    if dist.is_initialized():
        raise InputError("a torch.distributed process group is already initialised; trace in a fresh process")
    warnings.filterwarnings("ignore", module="torch.distributed")
    _static_shapes()
    if tp > 1:
        check_tp_heads(hf_config, tp)
        fresh_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=rank * dp * tp, world_size=pp * dp * tp)
    try:
        with unset_fake_temporarily():
            mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        with FakeTensorMode():
            model = build_model(hf_config, spec)
            if tp > 1:
                from torch.distributed.tensor.parallel import parallelize_module

                parallelize_module(model, mesh["tp"], _sp_plan(model, loss_parallel=True, local=True))
            all_layers = list(model.model.layers)
            starts = [sum(split[:k]) for k in range(stages)]
            act = torch.bfloat16 if spec.precision == "bf16" or fsdp_param_dtype == "bf16" else torch.float32
            s, mb, h = spec.seq_len, spec.micro_batch, hf_config["hidden_size"]
            vocab = hf_config["vocab_size"]
            mods, pstages = [], []
            box: list[LiveBytes | None] = [None]  # the tracker, once the traced step begins
            for c in range(virtual):
                k = rank + c * pp
                mod = _Stage(model, k == 0, k == stages - 1, all_layers[starts[k]:starts[k] + split[k]], s)
                if dp > 1:
                    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if fsdp_param_dtype == "bf16" else None,
                                              reduce_dtype=torch.float32 if reduce_fp32 else None)
                    with _real_mesh_concatenate():
                        for layer in mod.layers:
                            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=False, mp_policy=mp)
                        fully_shard(mod, mesh=mesh["dp"], reshard_after_forward=False, mp_policy=mp)
                # the metadata asks for gradients (requires_grad) where they flow: the input's from a stage after the
                # first (its backward sends it back), the output's where the next stage sends one back
                x_in = (torch.randint(0, vocab, (mb, s)) if k == 0
                        else torch.empty(mb, s // tp, h, dtype=act, requires_grad=True))
                out = (torch.empty(mb, s, vocab, dtype=act) if k == stages - 1
                       else torch.empty(mb, s // tp, h, dtype=act, requires_grad=True))
                mods.append(mod)
                _mark(mod, starts[k], box)
                pstages.append(PipelineStage(mod, k, stages, torch.device("cpu"), input_args=(x_in,),
                                             output_args=(out,), group=mesh["pp"].get_group()))
            del model, all_layers

            def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten(0, 1))

            sched = (Schedule1F1B(pstages[0], n_microbatches=micro_batches, loss_fn=loss_fn) if virtual == 1 else
                     ScheduleInterleaved1F1B(pstages, n_microbatches=micro_batches, loss_fn=loss_fn))
            params = [p for mod in mods for p in mod.parameters()]
            from memcalc.validation.trace_step import build_optimizer

            holder = torch.nn.Module()
            holder.stages = torch.nn.ModuleList(mods)
            opt = build_optimizer(holder, spec.optimizer_impl)
            ids = torch.randint(0, vocab, (micro_batches * mb, s))

            def step() -> None:
                kw = {}
                if any(st.is_last for st in pstages):
                    kw["target"] = ids
                    kw["return_outputs"] = False
                with parallel_loss() if tp > 1 else contextlib.nullcontext():
                    if any(st.is_first for st in pstages):
                        sched.step(ids, **kw)
                    else:
                        sched.step(**kw)
                if box[0] is not None:
                    box[0].phase("optimizer")
                opt.step()
                if box[0] is not None:
                    box[0].phase("zero_grad")
                opt.zero_grad(set_to_none=True)

            step()
            t = box[0] = LiveBytes(record_blocks=record_blocks)
            base = params + [b for mod in mods for b in mod.buffers()]
            base += [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
            for st in pstages:  # the receive buffers, made by the first step and kept
                for infos in list(st.args_recv_info.values()) + list(st.grad_recv_info.values()):
                    base += [i.buffer for i in infos if getattr(i, "buffer", None) is not None]
            t.add_baseline(base)
            with t:
                t.phase("forward")
                began = time.perf_counter()
                step()
                t.seconds = time.perf_counter() - began
                t.stop()
    finally:
        dist.destroy_process_group()
    if record_blocks:
        from memcalc.memory.allocator.caching import replay

        assert t.blocks is not None
        t.peak_reserved = replay(t.blocks).peak_reserved
    return t


__all__ = ["trace_pipeline_rank"]
