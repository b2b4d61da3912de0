"""Kernels as each framework runs them (memcalc/time/kernels.py): ring attention under context parallelism."""

from __future__ import annotations

from dataclasses import replace

import pytest

import memcalc
from memcalc.evaluate import evaluate
from memcalc.inputs.plan import to_plan
from memcalc.time.datasheet import gpu_machine
from memcalc.time.estimate import machine_for, placed, step_plan
from memcalc.time.step import step_time


def _cp(framework: str, seq: int = 16384):
    inp = memcalc.build_input(model="llama-3-70b", gpus=8, cp=8, fsdp="FULL_SHARD", fsdp_version=2,
                              precision="bf16-mixed", seq_len=seq, micro_batch=1, recompute="full", gpu="h100",
                              framework=framework)  # fmt: skip
    ev = evaluate(to_plan(inp))
    return ev, step_plan(ev.plan)


def test_torchtitan_ring_passes_k_and_v_expanded_to_the_query_heads():
    # torchtitan's Llama calls repeat_kv before sdpa: 64 query heads over 8 KV heads pass 8x the bytes round the ring
    _, titan = _cp("torchtitan")
    _, megatron = _cp("megatron")
    assert titan.cp_kv_factor == 8
    assert megatron.cp_kv_factor == 1


def test_expanded_k_and_v_expose_more_of_the_ring_when_attention_is_short():
    ev, sp = _cp("torchtitan", seq=4096)
    plan = ev.plan
    machine = machine_for(gpu_machine("h100"), plan.ranks_per_node, intra_node_gbps=1.0)
    rows = placed(ev.collectives, plan)
    expanded = step_time(plan.arch, sp, machine, rows)
    kv_heads = step_time(plan.arch, replace(sp, cp_kv_factor=1.0), machine, rows)
    exposed = dict(expanded.communication_s).get("context-parallel", 0.0)
    assert exposed > dict(kv_heads.communication_s).get("context-parallel", 0.0)
    assert expanded.step_s > kv_heads.step_s


def test_a_ring_step_runs_at_the_efficiency_of_its_own_block():
    # each of the cp ring steps is one kernel call on 1/cp of the rank's pairs: a short sequence split 8 ways runs
    # its attention further down the measured curve than the same pairs in one call
    ev, sp = _cp("megatron", seq=8192)
    machine = gpu_machine("h100")
    cal = machine.calibration
    one_call = cal.attention("flash", 3.5 * 1e12)
    eighth = cal.attention("flash", 3.5 * 1e12 / 8)
    assert eighth < one_call
    st = step_time(ev.plan.arch, sp, machine_for(machine, ev.plan.ranks_per_node), placed(ev.collectives, ev.plan))
    assert st.compute_s > 0
    assert pytest.approx(st.step_s) == sum((st.compute_s, st.memory_bound_s, st.recompute_s, st.bubble_s,
                                            st.optimizer_s, st.offload_s, st.host_s, st.exposed_communication_s))


@pytest.mark.parametrize("gpu, faster", [("h100", True), ("a100-80g", False)])
def test_megatron_runs_cudnn_attention_on_hopper_and_flash_before(gpu, faster):
    # Transformer Engine prefers cuDNN's fused attention on Hopper+ (get_attention_backend); torch's SDPA of late
    # 2024 picked FlashAttention-2. Same job, same GPU: only the attention kernel differs between the two codes.
    from memcalc.time.kernels import attention_kernel

    assert attention_kernel("megatron", "flash") == "te"
    assert attention_kernel("torchtitan", "flash") == "flash"
    assert attention_kernel("megatron", "eager") == "eager"
    kw = dict(model="llama-3-8b", gpus=1, precision="bf16", seq_len=8192, micro_batch=1, gpu=gpu, attention="flash",
              ddp=True)  # fmt: skip
    te = step_plan(evaluate(to_plan(memcalc.build_input(**kw, framework="megatron"))).plan)
    sdpa = replace(te, attention="flash")
    ev = evaluate(to_plan(memcalc.build_input(**kw, framework="megatron")))
    machine = machine_for(gpu_machine(gpu), 1)
    a, b = step_time(ev.plan.arch, te, machine), step_time(ev.plan.arch, sdpa, machine)
    assert (a.compute_s < 0.97 * b.compute_s) if faster else a.compute_s == pytest.approx(b.compute_s, rel=1e-12)
