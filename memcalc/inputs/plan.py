"""A validated ``EstimateInput`` turned into the core's plain ``Plan``, once, at the edge."""

from __future__ import annotations

from memcalc.inputs.dtypes import core_optimizer, core_precision
from memcalc.inputs.estimate import EstimateInput
from memcalc.layout.plan import REDUCE_BUCKET_SIZE, Plan, Work


def to_plan(inp: EstimateInput) -> Plan:
    """The numbers the core reads, taken from the validated input."""
    arch, w, par, s, f, e = (inp.model.architecture, inp.workload, inp.parallelism, inp.strategy, inp.framework,
                             inp.estimator)
    work = None
    if w is not None:
        work = Work(seq_len=w.seq_len, micro_batch=w.micro_batch, recompute=w.recompute, attention=w.attention,
                    dropout=inp.dropout, device=w.device, loss=w.loss, optimizer_impl=w.optimizer_impl,
                    compile=w.compile, compile_loss=w.compile_loss)
    return Plan(
        psi=inp.model.parameters or 0, arch=arch, precision=core_precision(inp.precision), optimizer=core_optimizer(inp.optimizer), spec=s.spec,
        gpus=inp.cluster.gpus, gpus_per_node=inp.cluster.gpus_per_node, usable_bytes=inp.gpu.usable_memory_bytes,
        intra_link=inp.gpu.intra_node_link, offload_optimizer=s.offload_optimizer, offload_params=s.offload_params,
        shard_group=s.shard_group, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep,
        sequence_parallel=par.sequence_parallel, virtual_stages=par.virtual_stages, work=work,
        cuda_context=inp.overheads.cuda_context_bytes, reserve=inp.overheads.allocator_reserve_bytes,
        grad_accum=inp.grad_accum, accounting=inp.accounting, fsdp_version=f.fsdp_version,
        bucket_view=f.bucket_view, min_num_params=f.min_num_params, zero3=f.zero3(), zero3_step=f.zero3_step,
        reduce_bucket_size=REDUCE_BUCKET_SIZE if f.reduce_bucket_size is None else f.reduce_bucket_size, overlap_comm=bool(f.overlap_comm),
        zero_init=e.zero_init, buffer_factor=e.buffer_factor, largest_layer_params=e.largest_layer_params,
        lora=inp.lora_plan,  # type: ignore[arg-type]
        shard_over=inp.shard_over, stage_layers=inp.stage_layers, framework=par.framework, fsdp_wrap=inp.fsdp_wrap,
        fsdp_prefetch=inp.fsdp_prefetch, fsdp_auto_wrap=f.fsdp_auto_wrap or "transformer",
        float8=inp.float8, float8_all_gather=inp.float8_all_gather, grad_reduce_dtype=f.grad_reduce_dtype,
        defer_embedding_wgrad=f.defer_embedding_wgrad,
    )
