"""Shard a traced model as rank 0 of ``world`` ranks, with torch's fake process group (no other process runs).

- FSDP2: ``fully_shard`` on every decoder layer, then on the root (torch ``distributed/fsdp/_fully_shard``; the
  per-block wrapping torchtitan's ``parallelize_llama`` uses), optionally with
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``.
- Tensor parallelism with DTensor (torchtitan ``models/llama3/infra/parallelize.py: apply_tp``): q, k, v and
  gate, up ``ColwiseParallel``; o and down ``RowwiseParallel`` (replicated output: no sequence parallelism). The
  embedding and the output head stay replicated: Hugging Face computes the loss inside the model, outside
  ``loss_parallel``.
- Sequence parallelism (``sequence_parallel``): torchtitan's plan on Hugging Face names over the whole model
  (``_sp_plan``), the loss under ``loss_parallel`` (``trace_step.run_step``).
The fake process group answers every collective at once without moving data
(``torch/testing/_internal/distributed/fake_pg.py``); shapes and storage sizes are those of rank 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from memcalc.errors import InputError
from memcalc.validation.trace_step import decoder_layers


def fresh_dtensor_caches() -> None:
    """DTensor's redistribution planners are cached per mesh (``_redistribute._planner_cache``: a weak reference to
    the mesh, which compares equal to an earlier trace's mesh of the same layout) and its sharding propagation per
    spec (in Python and in the C++ fast path): an earlier trace's entries would hand back the meshes of its
    destroyed process group."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _redistribute

    clears = (getattr(_redistribute, "clear_redistribute_planner_cache", None),
              getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
              getattr(DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding, "cache_clear", None),
              getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None))  # the C++ fast path's own cache
    for clear in clears:  # (torch 2.13's names; a release without one of them has no such cache to clear)
        if clear is not None:
            clear()


@contextlib.contextmanager
def fake_process_group(world: int, tp: int, fsdp: bool = False, replicate: int = 1) -> Iterator[object | None]:
    """The (dp, tp) ``DeviceMesh`` on "cpu" for rank 0 of ``world`` ranks, or None when ``world`` is 1 (unless
    ``fsdp``: FSDP2 on a single rank, as a FULL_SHARD run on one GPU has it); with ``replicate`` above 1 the
    (replicate, dp, tp) mesh of HSDP, the model states sharded over dp and replicated over ``replicate``.

    Built outside any fake mode (a mesh made of fake tensors cannot be used); the process group is destroyed on
    exit so that several traces can run in one process.
    """
    if world == 1 and not fsdp:
        yield None
        return
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise InputError("a torch.distributed process group is already initialised; trace in a fresh process")
    fresh_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with unset_fake_temporarily():
            if replicate > 1:
                mesh = init_device_mesh("cpu", (replicate, world // tp // replicate, tp),
                                        mesh_dim_names=("replicate", "dp", "tp"))
            else:
                mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        yield mesh
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _real_mesh_concatenate() -> Iterator[None]:
    """FSDP2 over a TP-sharded DTensor joins the dp and tp meshes (``DeviceMesh._concatenate``), which indexes the
    mesh's real rank tensor: run that outside the fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    orig = DeviceMesh._concatenate

    def concatenate(meshes):
        with unset_fake_temporarily():
            return orig(meshes)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(orig)


def _tp_plan(layer: torch.nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    names = {n for n, _ in layer.named_modules()}
    need = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}  # fmt: skip
    if not need <= names:
        raise InputError(f"tensor parallelism is wired for Llama-style layers ({', '.join(sorted(need))}); "
                         f"{type(layer).__name__} lacks {', '.join(sorted(need - names))}")  # fmt: skip
    return {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def _sp_plan(model: torch.nn.Module, loss_parallel: bool, local: bool = False) -> dict:
    """Sequence parallelism as torchtitan's ``apply_tp`` (torchtitan 0.1/0.2 ``models/llama3/infra/parallelize.py``)
    on Hugging Face module names: the embedding ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``,
    every norm ``SequenceParallel``, ``PrepareModuleInput`` Shard(1) -> Replicate before attention and the MLP,
    o and down ``RowwiseParallel(output_layouts=Shard(1))`` (a reduce-scatter), the head
    ``ColwiseParallel(input_layouts=Shard(1))`` with vocabulary-sharded logits under ``loss_parallel``.

    The residual stream stays a ``DTensor`` (``use_local_output=False`` on the embedding, o and down; torchtitan hands
    on the local shard): Hugging Face derives the causal mask's length from the embedding output's global shape,
    and a DTensor cannot be added to a plain tensor. Same local storages either way. ``local``: torchtitan's own
    ``use_local_output=True`` (a pipeline stage hands on and receives the plain local shard)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                              use_local_output=local),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                   use_local_output=not loss_parallel),
    }  # fmt: skip
    for i, layer in enumerate(decoder_layers(model)):
        _tp_plan(layer)  # checks the names
        p = f"model.layers.{i}."
        plan.update({
            p + "input_layernorm": SequenceParallel(),
            p + "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            p + "self_attn.q_proj": ColwiseParallel(),
            p + "self_attn.k_proj": ColwiseParallel(),
            p + "self_attn.v_proj": ColwiseParallel(),
            p + "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=local),
            p + "post_attention_layernorm": SequenceParallel(),
            p + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "mlp.gate_proj": ColwiseParallel(),
            p + "mlp.up_proj": ColwiseParallel(),
            p + "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=local),
        })  # fmt: skip
    return plan


def check_tp_heads(hf_config: dict, tp: int) -> None:
    heads = int(hf_config.get("num_attention_heads") or hf_config.get("n_head") or 1)
    kv = int(hf_config.get("num_key_value_heads") or heads)
    if heads % tp or kv % tp:
        raise InputError(f"tp({tp}) must divide heads({heads}) and kv_heads({kv}); DTensor shards whole heads")


def apply_layout(model: torch.nn.Module, mesh, *, dp: int, tp: int, fsdp: bool, mp_bf16: bool,
                 sequence_parallel: bool = False, loss_parallel: bool = False, fsdp_wrap: str = "root",
                 replicate: int = 1, reshard_after_forward: bool = True, reduce_fp32: bool = False,
                 fsdp_version: int = 2, backward_prefetch: str = "pre", fsdp1_policy=None,
                 layer_units: bool = True) -> torch.nn.Module:
    """The model laid out (FSDP1 wraps it; the other layouts change it in place): tensor-parallelise each decoder
    layer over ``mesh["tp"]`` (with ``sequence_parallel`` the whole model: ``_sp_plan``), then FSDP2-shard over ``mesh["dp"]`` (HSDP: over ``mesh["replicate", "dp"]``): every decoder
    layer (``reshard_after_forward`` False: kept gathered from its forward to its backward, SHARD_GRAD_OP), and as
    ``fsdp_wrap`` says (``memcalc.layout.compose.FSDP_WRAPS``) the embedding and the head, then the root.
    ``reduce_fp32``: ``MixedPrecisionPolicy(reduce_dtype=torch.float32)`` beside the bf16 ``param_dtype``
    (torchtitan's ``mixed_precision_reduce``). ``fsdp_version`` 1: FSDP1's ``FullyShardedDataParallel`` instead, one
    FlatParameter per decoder layer (``ModuleWrapPolicy``, as accelerate's transformer-based wrap) and the root, with
    ``use_orig_params=True`` (accelerate's), ``backward_prefetch`` pre, post or none, ``MixedPrecision(param_dtype=bf16)``;
    ``fsdp1_policy``: another ``auto_wrap_policy`` for it (peft's, ``memcalc.validation.lora.trace_lora_step``)."""
    layers = decoder_layers(model)
    if tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        if sequence_parallel:
            parallelize_module(model, mesh["tp"], _sp_plan(model, loss_parallel))
        else:
            for layer in layers:
                parallelize_module(layer, mesh["tp"], _tp_plan(layer))
    if fsdp and fsdp_version == 1:
        from torch.distributed.fsdp import (
            BackwardPrefetch,
            FullyShardedDataParallel,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mp1 = MixedPrecision(param_dtype=torch.bfloat16) if mp_bf16 else None
        hybrid = replicate > 1
        if hybrid:
            strategy = ShardingStrategy.HYBRID_SHARD if reshard_after_forward else ShardingStrategy._HYBRID_SHARD_ZERO2
        else:
            strategy = ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP
        return FullyShardedDataParallel(model, process_group=None if hybrid else mesh["dp"].get_group(),
                                        sharding_strategy=strategy,
                                        device_mesh=mesh["replicate", "dp"] if hybrid else None,
                                        mixed_precision=mp1,
                                        auto_wrap_policy=(fsdp1_policy or ModuleWrapPolicy({type(layers[0])})
                                                          if layer_units else None),
                                        device_id=torch.device("cpu"), use_orig_params=True,
                                        backward_prefetch={"pre": BackwardPrefetch.BACKWARD_PRE, "none": None,
                                                           "post": BackwardPrefetch.BACKWARD_POST}[backward_prefetch])
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32 if reduce_fp32 else None)
              if mp_bf16 else MixedPrecisionPolicy())
        base = getattr(model, "model", model)
        dp_mesh = mesh["replicate", "dp"] if replicate > 1 else mesh["dp"]
        again = reshard_after_forward
        with _real_mesh_concatenate():
            if fsdp_wrap != "root":  # torchtitan apply_fsdp (since v0.2), torchtune shard_model(custom_sharded_layers)
                fully_shard(base.embed_tokens, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=again)
            for layer in layers if layer_units else ():
                fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=again)
            if not layer_units and fsdp_wrap == "root":  # accelerate's NO_WRAP, tied: [norm, embedding, head]
                fully_shard([base.norm, base.embed_tokens, model.lm_head], mesh=dp_mesh, mp_policy=mp,
                            reshard_after_forward=False)
            elif fsdp_wrap == "separate":  # [norm, output], kept gathered after forward
                fully_shard([base.norm, model.lm_head], mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)
            elif fsdp_wrap == "separate-reshard":  # output alone, resharded after forward; the norm stays in the root
                fully_shard(model.lm_head, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=again)
            fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    return model
