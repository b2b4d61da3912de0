"""The implementation accounting: what DDP, FSDP1/2 and DeepSpeed ZeRO-0..3 really allocate and issue, per rank.

``--accounting implementation``. The arithmetic is ``memcalc.memory.accountings.frameworks`` (and ``memcalc.memory.overlays.zero3``
for ZeRO-3's coordinator), proven byte for byte against real runs on CPU in tests/validation (torch 2.13,
DeepSpeed 0.19); this module turns it into rows, collectives and notes.
"""

from __future__ import annotations

from memcalc.comm.collectives import sent_bytes_per_rank
from memcalc.comm.traffic import Collective
from memcalc.layout.plan import Plan
from memcalc.memory.accountings import frameworks as fw
from memcalc.memory.accountings.rows import Row
from memcalc.memory.overlays.zero3 import persistent, replay
from memcalc.model import tree

_SRC = "torch 2.13, DeepSpeed 0.19; measured in tests/validation"


def _framework(plan: Plan) -> tuple[fw.Held, list[fw.Issued], int, str]:
    """(what one rank holds, what it issues, the stored parameter dtype's bytes, a description)."""
    arch, p, opt, spec = plan.arch, plan.precision, plan.optimizer, plan.spec
    assert arch is not None
    # Mixed precision: DDP runs under autocast and FSDP shards fp32 parameters (the master copy); collectives
    # and gathered parameters are in the low dtype under FSDP MixedPrecision. Pure bf16 stores everything in bf16.
    store = p.param_bytes if p.master_bytes == 0 else p.master_bytes
    mom = opt.moment_bytes_for(p) if opt.moment_bytes is not None else store
    if spec.framework == "deepspeed":
        stage = int(spec.name.split("-")[1])
        held, issued = fw.deepspeed(arch, stage, plan.dp, p.param_bytes, opt.moments, opt.step_counter, plan.zero3,
                                    first_step=plan.zero3_step == "first")
        how = ("flat buffer padded to 2 x dp" if stage in (1, 2) else
               "per-parameter partitions" if stage == 3 else "replicated")
        return held, issued, p.param_bytes, f"DeepSpeed ZeRO-{stage} ({how})"
    if spec.framework == "ddp":
        held, issued = fw.ddp(arch, plan.dp, store, opt.moments, mom, opt.step_counter, plan.bucket_view)
        return held, issued, store, "DDP (replicated, autocast keeps fp32 parameters)" if p.master_bytes else "DDP"
    v = plan.fsdp_version
    held, issued = fw.fsdp(arch, v, plan.dp, plan.shard_group_size, plan.replicas,
                           reshard_after_forward=spec.shards_params, shards=spec.shards_grads, store_bytes=store,
                           comm_bytes=p.param_bytes, moments=opt.moments, moment_bytes=mom,
                           step_counter=opt.step_counter, min_num_params=plan.min_num_params)
    flat = "FlatParameter per unit, padded to" if v == 1 else "dim-0 shards padded to"
    return held, issued, store, f"FSDP{v} {flat} x{plan.shard_group_size}"


def model_state_rows(plan: Plan) -> tuple[list[Row], list[fw.Issued]]:
    """Model-state rows and collectives of one rank as the framework allocates and issues them."""
    arch, p, opt, spec = plan.arch, plan.precision, plan.optimizer, plan.spec
    assert arch is not None
    held, issued, store, what = _framework(plan)
    dtype = "fp32" if store == 4 else p.low_dtype
    master_label = "" if held.master else ", the master copy"
    rows = [
        Row("parameters", f"parameters ({dtype}{master_label})", held.parameters, "gpu", "model_state",
            f"{what} ({_SRC})"),
        Row("master_weights", "master weights (fp32)", held.master, "gpu", "model_state",
            "DeepSpeed's fp32 partition the optimizer updates"),
        Row("gradients", f"gradients ({dtype})", held.gradients, "gpu", "model_state",
            f"kept like the parameters ({_SRC})"),
        Row("optimizer_moments", f"optimizer moments ({opt.name})", held.optimizer_moments, "gpu", "model_state",
            f"{opt.moments} per parameter element"),
        Row("optimizer_steps", "optimizer step counters", held.optimizer_steps, "gpu", "model_state",
            "4-byte step tensor per parameter tensor (torch.optim)"),
    ]
    if held.backward_gradients:
        rows.append(Row("gradients_backward", f"gradients during backward ({p.low_dtype})", held.backward_gradients,
                        "gpu", "model_state",
                        "ZeRO-0/1: every gradient until the boundary; ZeRO-2: the averaged partition (DeepSpeed's "
                        "code; freed by the end of the step, so not in the after-step proof)"))
    if held.step_gradients:
        rows.append(Row("gradients_step", "fp32 gradients (during the step)", held.step_gradients, "gpu",
                        "model_state", "the reduced gradients upcast for the optimizer; freed after the step"))
    if held.buckets:
        rows.append(Row("gradient_buckets", "DDP gradient buckets", held.buckets, "gpu", "model_state",
                        "a copy of the gradients (gradient_as_bucket_view=False)"))
    if held.live:
        z = plan.zero3
        step = "first" if plan.zero3_step == "first" else "steady-state"
        rows.append(Row("gathered_parameters", f"gathered parameters ({p.low_dtype})", held.live, "gpu",
                        "model_state",
                        f"at peak: the most elements DeepSpeed's coordinator holds gathered in the {step} step "
                        f"(max_live_parameters {z.max_live_parameters:,} bounds prefetching, not fetching; "
                        "memcalc.memory.overlays.zero3)"))
    if spec.framework == "fsdp":
        us = fw.units(arch, plan.min_num_params)
        if spec.shards_params:
            # The root stays gathered from forward to backward; one layer is gathered while the next is prefetched.
            gathered = (us[0].numel + 2 * max((u.numel for u in us[1:]), default=0)) * p.param_bytes
            how = "root unit (not resharded after forward) + the largest layer twice (current + prefetched)"
        else:
            gathered = sum(u.numel for u in us) * p.param_bytes if spec.shards_grads else 0
            how = "every unit, kept from forward to backward"
        if gathered:
            rows.append(Row("gathered_parameters", f"gathered parameters ({p.low_dtype})", gathered, "gpu",
                            "model_state", f"at peak: {how}"))
    return rows, issued


def collective(x: fw.Issued, plan: Plan) -> Collective:
    """A framework's collective as a row of the communication table (per micro-batch ones x grad_accum)."""
    spec = plan.spec
    per_micro = (x.phase == "forward" or x.op != "all-reduce" or spec.reduce_each_micro_batch
                 or x.group == "replica group")
    k = plan.grad_accum if per_micro else 1
    span = x.group_size if x.group != "replica group" else plan.dp
    crosses = span > plan.gpus_per_node
    per_call = x.payload_bytes // x.calls
    dtype = {2: plan.precision.low_dtype, 4: "fp32"}[x.dtype_bytes]
    return Collective(x.op, x.phase, x.tensor, x.group, x.group_size, crosses,
                      "network" if crosses else plan.intra_link, dtype, x.calls * k, per_call, x.payload_bytes * k,
                      sent_bytes_per_rank(x.op, per_call, x.group_size) * x.calls * k)  # type: ignore[arg-type]


def _zero3_notes(plan: Plan) -> list[str]:
    arch, z, lp = plan.arch, plan.zero3, plan.precision.param_bytes
    assert arch is not None
    out = []
    settings = (f"max_reuse_distance {z.max_reuse_distance:,}, max_live_parameters {z.max_live_parameters:,}, "
                f"prefetch_bucket_size {z.prefetch_bucket_size:,}")
    if plan.zero3_step == "steady":
        first = replay(arch, plan.dp, z, first_step=True)
        out.append(f"ZeRO-3 traffic is a steady-state step's, replayed through DeepSpeed's parameter coordinator "
                   f"({settings}). The first step records the module trace and gathers every parameter on each use "
                   f"instead: {first.forward * lp:,} bytes in forward and {first.backward * lp:,} in backward "
                   "(--zero3-step first shows it)")
    else:
        steady = replay(arch, plan.dp, z)
        out.append("ZeRO-3 traffic is the first step's: DeepSpeed records its module trace and gathers every "
                   f"parameter on each use. Every later step ({settings}) gathers {steady.forward * lp:,} bytes in "
                   f"forward and {steady.backward * lp:,} in backward")
    if tree.layout(arch) is None:
        out.append(f"ZeRO-3 replay: the module call order is memcalc's generic layout (family {arch.family or 'unset'}"
                   f"{', MoE' if arch.moe else ''}); it follows Hugging Face's model classes for "
                   f"{', '.join(tree.LAYOUTS)} (dense). Parameter-less modules a model calls (dropout, activation) "
                   "each give the prefetcher one more round, so gathers can differ")
    if arch.moe:
        out.append("ZeRO-3 replay: every expert is assumed to run in every step; experts that receive no tokens "
                   "break DeepSpeed's trace (mark MoE blocks with deepspeed.utils.set_z3_leaf_modules)")
    whole = persistent(arch, z)
    out.append(f"ZeRO-3 persistence_threshold {z.param_persistence_threshold:,}: {len(whole)} parameter tensors "
               f"({sum(whole.values()):,} elements) stay whole on every rank, are all-gathered after each optimizer "
               "step and, after the first step, never in forward or backward" if whole else
               f"ZeRO-3 persistence_threshold {z.param_persistence_threshold:,}: every parameter is partitioned")
    return out


def notes(plan: Plan) -> list[str]:
    """What the implementation accounting shows, how the framework wraps the model, and what it leaves out."""
    arch, spec = plan.arch, plan.spec
    assert arch is not None
    name = {"ddp": "DDP", "deepspeed": f"DeepSpeed {spec.label}"}.get(spec.framework,
                                                                     f"FSDP{plan.fsdp_version} {spec.name}")
    out = [f"accounting: implementation: what {name} allocates and issues (padding, step counters, buckets), "
           "proven against real runs on CPU in tests/validation"]
    if spec.framework == "fsdp":
        if spec.shards_params:
            root = fw.units(arch, plan.min_num_params)[0].numel * plan.precision.param_bytes
            out.append(f"the root unit is not resharded after forward: backward all-gathers {root:,} bytes less "
                       "than forward (3Ψ becomes 3Ψ minus the root unit)" if root else
                       "the root unit is not resharded after forward, but the wrapping leaves it no parameters: "
                       "backward all-gathers as much as forward")
        mnp = plan.min_num_params
        if mnp is None:
            out.append("wrapping: one unit per decoder layer plus the root (embeddings, final norm, head)")
        else:
            k = sum(1 for u in fw.units(arch, mnp) if u.shapes)
            out.append(f"wrapping: size_based_auto_wrap_policy(min_num_params={mnp:,}): {k} unit{'s' * (k != 1)} "
                       "holding parameters (the root counted if it keeps any)")
    if spec.name == "zero-3":
        out += _zero3_notes(plan)
    if spec.framework == "deepspeed":
        out.append("DeepSpeed: small scalar collectives (gradient norm, overflow flags) are left out")
    if plan.work is None:
        out.append("activations are not counted: give --seq-len")
    return out
