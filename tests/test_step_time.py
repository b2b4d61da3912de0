"""Step time: monotonic in the right directions, overlap rules, pipeline bubble, bad inputs."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from memcalc.errors import InputError
from memcalc.inputs.presets import load_model
from memcalc.time.hardware import load_machine
from memcalc.time.step import Plan, step_time

H100 = load_machine("dgx-h100")
A100 = load_machine("dgx-a100")
LLAMA = load_model("llama-3-8b")


def col(op, phase, group, n, payload, calls=1, crosses=False):
    return SimpleNamespace(op=op, phase=phase, group=group, group_size=n, crosses_nodes=crosses,
                           calls_per_step=calls, payload_bytes_per_call=payload)


def test_parts_sum_and_rates_agree():
    st = step_time(LLAMA, Plan(gpus=1, seq=8192, micro_batch=1), H100)
    assert st.step_s == pytest.approx(st.compute_s + st.memory_bound_s + st.optimizer_s)
    assert st.tokens_per_s == pytest.approx(8192 / st.step_s)
    assert st.mfu == pytest.approx(st.model_tflops_per_gpu * 1e12 / 989e12)
    assert 0.3 < st.mfu < 0.8  # measured GEMMs run at 0.69-0.80 of peak on the H100


def test_compute_matches_summed_kernel_measurements():
    # h100-kernels.md, a Llama-3-8B layer's seven GEMMs (q, k, v, o, gate, up, down), fwd, dX and dW columns. At
    # 16384 tokens (a sustained load, as in a training step) the curve's large-GEMM points are these rows' medians:
    # forward 0.784 + 2 x 0.225 + 0.784 + 2 x 2.723 + 2.671 ms, all three columns 31.16 ms.
    from memcalc.time.step import layer_time

    lt = layer_time(LLAMA, False, H100.calibration, "bf16", 16384, 1)
    forward = (0.784 + 2 * 0.225 + 0.784 + 2 * 2.723 + 2.671) * 1e-3
    assert lt.matmul_fwd == pytest.approx(forward, rel=0.03)
    assert 3 * lt.matmul_fwd == pytest.approx(31.16e-3, rel=0.03)
    # at 8192 tokens the isolated forward ran faster (4.644 ms; the clock before a sustained load settles): the curve
    # is above it, by less than 12 %
    lt = layer_time(LLAMA, False, H100.calibration, "bf16", 8192, 1)
    forward = (0.364 + 2 * 0.109 + 0.364 + 2 * 1.224 + 1.250) * 1e-3
    assert forward < lt.matmul_fwd < 1.12 * forward


def test_monotonic():
    base = Plan(gpus=8, seq=4096, micro_batch=1, micro_batches=4)
    t0 = step_time(LLAMA, base, H100).step_s
    assert step_time(LLAMA, replace(base, micro_batches=8), H100).step_s > t0  # more work
    assert step_time(LLAMA, replace(base, recompute="selective"), H100).step_s > t0
    assert step_time(LLAMA, replace(base, recompute="full"), H100).step_s > step_time(
        LLAMA, replace(base, recompute="selective"), H100).step_s
    assert step_time(LLAMA, replace(base, optimizer="foreach"), H100).optimizer_s > step_time(
        LLAMA, base, H100).optimizer_s
    assert step_time(LLAMA, base, A100).step_s > t0  # slower GPU
    assert step_time(LLAMA, replace(base, attention="cudnn"), H100).step_s < t0  # faster kernel (measured)


def test_more_communication_never_faster():
    plan = Plan(gpus=16, seq=4096, micro_batch=1, micro_batches=1)
    grads = 2 * 8_030_261_248
    small = step_time(LLAMA, plan, H100, [col("all-reduce", "backward", "data-parallel", 16, grads, 1, True)])
    big = step_time(LLAMA, plan, H100, [col("all-reduce", "backward", "data-parallel", 16, 4 * grads, 1, True)])
    assert big.step_s > small.step_s
    # DDP: the last 25 MiB bucket is always exposed, the rest hides behind backward.
    assert small.exposed_communication_s > 0


def test_fsdp_prefetch_exposes_only_what_compute_cannot_hide():
    plan = Plan(gpus=8, seq=8192, micro_batch=1)
    p = 2 * 8_030_261_248
    rows = [col("all-gather", "forward", "data-parallel", 8, p), col("all-gather", "backward", "data-parallel", 8, p),
            col("reduce-scatter", "backward", "data-parallel", 8, 2 * p)]
    st = step_time(LLAMA, plan, H100, rows)
    # On NVLink the gathers hide: only the first unit's gather and the last unit's reduce-scatter show.
    assert 0 < st.exposed_communication_s < 0.1 * st.compute_s
    slow = step_time(LLAMA, plan, H100, [replace_group(r, True) for r in rows])
    assert slow.exposed_communication_s > st.exposed_communication_s


def replace_group(c, crosses):
    return SimpleNamespace(**{**vars(c), "crosses_nodes": crosses})


def test_tensor_parallel_is_exposed_and_bubble_follows_schedule():
    plan = Plan(gpus=16, seq=2048, micro_batch=1, micro_batches=16, tp=8, pp=2, sp=True)
    tp = col("all-gather", "forward", "tensor-parallel", 8, 2048 * 4096 * 2, calls=2 * 16 * 16)
    a = step_time(LLAMA, plan, H100)
    b = step_time(LLAMA, plan, H100, [tp])
    assert dict(b.communication_s)["tensor-parallel"] > 0 and b.step_s > a.step_s
    one_f1b = a.bubble_s
    per_mb = (a.compute_s + a.memory_bound_s + a.recompute_s) / 16
    assert one_f1b == pytest.approx((2 - 1) * per_mb)  # (p-1) micro-batch times = (p-1)/m of the compute
    inter = step_time(LLAMA, replace(plan, virtual=2), H100)
    assert inter.bubble_s == pytest.approx(one_f1b / 2)  # interleaved: (p-1)/(m·v)


def test_offload_and_cpu_optimizer():
    plan = Plan(gpus=8, seq=2048, micro_batch=1, optimizer="cpu", optimizer_params=1_000_000_000)
    st = step_time(LLAMA, plan, H100)
    # 8 ranks share the node's host memory: 1e9 x 8 x 28 B / (614.4 GB/s x 0.7)
    assert st.optimizer_s == pytest.approx(1e9 * 8 * 28 / (614.4e9 * 0.7))
    tr = SimpleNamespace(op="host-to-device", phase="optimizer step", link="pcie", bytes=64 * 10**9)
    assert step_time(LLAMA, plan, H100, (), [tr]).offload_s == pytest.approx(1.0)


def test_bad_inputs():
    with pytest.raises(InputError, match="multiple of tp"):
        step_time(LLAMA, Plan(gpus=6, seq=128, micro_batch=1, tp=4), H100)
    with pytest.raises(InputError, match="interleaved"):
        step_time(LLAMA, Plan(gpus=4, seq=128, micro_batch=1, micro_batches=3, pp=4, virtual=2), H100)
    with pytest.raises(InputError, match="attention"):
        step_time(LLAMA, Plan(gpus=1, seq=128, micro_batch=1, attention="fast"), H100)
    with pytest.raises(InputError, match="implementation"):
        step_time(LLAMA, Plan(gpus=1, seq=128, micro_batch=1, optimizer="fusd"), H100)
    with pytest.raises(InputError, match="group"):
        step_time(LLAMA, Plan(gpus=1, seq=128, micro_batch=1), H100, [col("all-reduce", "backward", "x", 2, 1)])


def test_op_recompute_is_every_second_matmul_and_the_elementwise_forward():
    # torchtitan per-op selective AC: k, o, up (2nd, 4th, 6th mm of q, k, v, o, gate, up, down) run again; the
    # attention output is saved, so unlike memcalc's selective no attention is recomputed.
    from memcalc.time.flops import layer_gemms, op_recomputed, step_flops
    from memcalc.time.step import layer_time

    assert [g.name for g in op_recomputed(layer_gemms(LLAMA, False))] == ["k", "o", "up"]
    extra = step_flops(LLAMA, 8192, 2, "op").recompute
    assert extra == 2 * 8192 * 32 * 2 * 4096 * (1024 + 4096 + 14336)  # tokens x layers x 2·k·n summed
    lt = layer_time(LLAMA, False, H100.calibration, "bf16", 8192, 2)
    assert 0 < lt.matmul_op_recompute < lt.matmul_fwd / 2
    assert lt.recompute("op") == lt.matmul_op_recompute + lt.memory_fwd
    plan = Plan(gpus=1, seq=8192, micro_batch=2)
    op = step_time(LLAMA, replace(plan, recompute="op"), H100)
    assert op.recompute_s == pytest.approx(32 * (lt.matmul_op_recompute + lt.memory_fwd))
    assert op.compute_s == step_time(LLAMA, plan, H100).compute_s
    with pytest.raises(InputError, match="none, selective, full, op"):
        step_time(LLAMA, replace(plan, recompute="ops"), H100)


def test_hbm2e_500w_calibration_scales_compute_by_the_power_limit_and_memory_by_hbm():
    # torchtitan's H100 benchmarks: 96GB HBM2e, 2.4 TB/s, 500 W; efficiency fractions inherited from h100-sxm, the
    # tensor-core peak between the SXM (700 W, 989.4) and NVL (400 W, 835.5) datasheet rates as a power law
    import math

    from memcalc.time.hardware import load_calibration

    slow = replace(H100, calibration=load_calibration("h100-sxm-hbm2e-500w"))
    plan = Plan(gpus=1, seq=8192, micro_batch=1)
    a, b = step_time(LLAMA, plan, H100), step_time(LLAMA, plan, slow)
    k = math.log(989.4 / 835.5) / math.log(700 / 400)
    assert b.peak_flops == pytest.approx(989.4e12 * (500 / 700) ** k, rel=1e-4)
    assert 835.5e12 < b.peak_flops < 989e12
    assert b.compute_s == pytest.approx(a.compute_s * 989 / 893.8)
    assert b.memory_bound_s == pytest.approx(a.memory_bound_s * 3350 / 2400)


def test_eager_norms_and_rotary_follow_the_model_code():
    from memcalc.time.moved import elementwise_bytes
    from memcalc.time.step import layer_time

    # LlamaRMSNorm on a bf16 stream: to(fp32) 2 + 4, pow 8, mean 4, x * rsqrt 8, to(bf16) 4 + 2, * weight 4
    assert elementwise_bytes("hf", 2, 2) == (36.0, 20.0)
    assert elementwise_bytes("hf", 2, 4) == (28.0, 20.0)  # autocast: the stream is fp32, the casts are no-ops
    assert elementwise_bytes("torchtitan", 2, 2) == (4.0, 20.0)  # fused rms_norm, eager complex rotary
    assert elementwise_bytes("fused", 2, 2) == (4.0, 4.0)
    cal = H100.calibration
    hf = layer_time(LLAMA, False, cal, "bf16", 8192, 1, elementwise="hf")
    fused = layer_time(LLAMA, False, cal, "bf16", 8192, 1)
    h, qw, kvw = LLAMA.hidden, LLAMA.q_width, LLAMA.kv_width
    extra = 8192 * (2 * (36 - 4) * h + 20 * (qw + kvw) - 2 * 2 * (qw + 2 * kvw))
    assert hf.memory_fwd - fused.memory_fwd == pytest.approx(extra / cal.hbm_bytes_per_s, rel=1e-12)


def test_sliding_window_layers_run_their_window_or_the_whole_mask():
    """Gemma 3's sliding layers: FlashAttention-2's window skips the keys outside it; SDPA, handed the sliding mask
    once s >= the window, computes every pair; below the window both are a causal layer."""
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.time.flops import attention_core_flops
    from memcalc.time.step import layer_time

    g = architecture_from_config({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                                  "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
                                  "head_dim": 256, "vocab_size": 262144, "sliding_window": 512})  # fmt: skip
    cal = H100.calibration
    full = layer_time(g, False, cal, "bf16", 8192, 1)
    window = layer_time(g, False, cal, "bf16", 8192, 1, window=512)
    masked = layer_time(g, False, cal, "bf16", 8192, 1, window=512, sliding="masked")
    assert window.attention_fwd < full.attention_fwd / 2 < masked.attention_fwd / 2  # 1/8 of the pairs; 2x
    # Each at the kernel's efficiency for its own FLOPs: the window's (2·512·8192 pairs) and every pair (8192²).
    w_flops = attention_core_flops(g, 8192, "causal", window=512)
    assert w_flops == 4 * (512 * 513 // 2 + (8192 - 512) * 512) * 1024
    assert window.attention_fwd == pytest.approx(w_flops / (cal.peak("bf16") * cal.attention("flash", 3.5 * w_flops)))
    f_flops = attention_core_flops(g, 8192, "full")
    assert masked.attention_fwd == pytest.approx(f_flops / (cal.peak("bf16") * cal.attention("flash", 3.5 * f_flops)))
    short = [layer_time(g, False, cal, "bf16", 256, 1, window=512, sliding=k) for k in ("window", "masked")]
    assert short[0] == short[1] == layer_time(g, False, cal, "bf16", 256, 1)


@pytest.mark.parametrize("e, m", [(2, 4), (2, 2), (4, 4)])  # autocast (fp32 mask), pure bf16, fp32
def test_eager_attention_bytes_are_what_hugging_face_code_moves(e, m):
    """Every aten op of transformers' ``eager_attention_forward`` and its backward, run on CPU: the bytes of each
    score-sized tensor an op reads or writes (views excluded; the broadcast mask read once per score element)."""
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from torch.utils._python_dispatch import TorchDispatchMode

    from memcalc.time.moved import eager_attention_bytes

    dt = {2: torch.bfloat16, 4: torch.float32}
    b, a, s, d = 1, 2, 16, 8
    n = b * a * s * s
    q, k, v = (torch.randn(b, a, s, d, dtype=dt[e], requires_grad=True) for _ in range(3))
    mask = torch.zeros(b, 1, s, s, dtype=dt[m])

    class Count(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func is not torch.ops.aten._unsafe_view.default:  # no bytes move
                for t in [*args, *((out,) if isinstance(out, torch.Tensor) else out or ())]:
                    if isinstance(t, torch.Tensor) and (t is mask or t.numel() == n):
                        self.moved += n * t.element_size()
            return out

    module = SimpleNamespace(num_key_value_groups=1, training=True)
    with Count() as fwd:
        out, _ = llama.eager_attention_forward(module, q, k, v, mask, scaling=d**-0.5)
    grad = torch.ones_like(out)
    with Count() as bwd:
        out.backward(grad)
    assert (fwd.moved / n, bwd.moved / n) == eager_attention_bytes("hf", e, m, False)


def test_autocast_steps_pay_for_their_casts_and_pure_bf16_for_half_the_optimizer_bytes():
    from memcalc.time.step import layer_time

    cal = H100.calibration
    pure = layer_time(LLAMA, False, cal, "bf16", 4096, 1, elementwise="hf", residual_bytes=2)
    amp = layer_time(LLAMA, False, cal, "bf16", 4096, 1, elementwise="hf", residual_bytes=4)
    h, f = LLAMA.hidden, LLAMA.ffn_size
    norms = 2 * 28 * h - 2 * 36 * h  # LlamaRMSNorm on an fp32 stream moves 28 bytes per element, on bf16 36
    adds = 2 * (2 * 4 + 2) * h - 2 * (2 * 2 + 2) * h  # the residual adds read and write the fp32 stream
    inputs = (3 + 2) * (4 + 2) * h  # q, k, v, gate and up each cast their fp32 input
    weights = 2 * h * h + 2 * h * LLAMA.kv_width + 3 * h * f  # q, o; k, v; gate, up, down
    extra = 4096 * (norms + adds + inputs) / cal.hbm_bytes_per_s + 2 * (4 + 2) * weights / 3 / cal.hbm_bytes_per_s
    assert amp.memory_fwd - pure.memory_fwd == pytest.approx(extra, rel=1e-12)
    # AdamW moves 7 x the state bytes per parameter: 28 in fp32, 14 when pure bf16 keeps bf16 moments
    plan = Plan(gpus=1, seq=4096, micro_batch=1, optimizer="foreach")
    fp32 = step_time(LLAMA, plan, H100).optimizer_s
    assert step_time(LLAMA, replace(plan, optimizer_state_bytes=2), H100).optimizer_s == pytest.approx(fp32 / 2)


def test_one_rank_group_in_backward_is_timed_as_no_communication():
    """A data-parallel group of one rank lists its gradient all-reduce (the implementation accounting's DDP on one
    GPU) but sends nothing: the step is the same as without the row, not a division by zero."""
    plain = step_time(LLAMA, Plan(gpus=1, seq=4096, micro_batch=1), H100)
    one = step_time(LLAMA, Plan(gpus=1, seq=4096, micro_batch=1), H100,
                    [col("all-reduce", "backward", "data-parallel", 1, 16 * 2**30)])
    assert one.step_s == pytest.approx(plain.step_s)
    assert one.exposed_communication_s == 0


def test_plans_that_share_a_stage_profile_differ_only_in_fields_it_does_not_read() -> None:
    """The step model shares one stage profile among plans that differ only in ``_UNREAD_BY_PROFILE`` (the planner
    times every sharding strategy and accumulation count of a layout): changing those fields alone, the profile
    computed afresh is the same, and changing any other field changes the key."""
    import dataclasses

    from memcalc.time.hardware import load_calibration
    from memcalc.time.step import _PROFILE_KEY, _UNREAD_BY_PROFILE, _stage_profile

    arch, cal = load_model("llama-3-8b"), load_calibration("h100-sxm-80gb")
    unread = dict(gpus=64, micro_batches=12, optimizer="cpu", optimizer_state_bytes=2, optimizer_params=123,
                  flops_attention="causal", gather_units=1, tp_overlap=True)
    assert set(unread) == set(_UNREAD_BY_PROFILE)
    for base in (Plan(gpus=32, seq=4096, micro_batch=2, micro_batches=4, pp=4, tp=2, recompute="full"),
                 Plan(gpus=8, seq=8192, micro_batch=1, tp=8, sp=True, recompute="op", attention="eager", dropout=True),
                 Plan(gpus=16, seq=2048, micro_batch=4, micro_batches=8, pp=2, virtual=2, cp=2)):
        other = replace(base, **unread)
        assert _PROFILE_KEY(other) == _PROFILE_KEY(base)
        assert _stage_profile(arch, cal, other) == _stage_profile(arch, cal, base)
        read = [f.name for f in dataclasses.fields(Plan) if f.name not in _UNREAD_BY_PROFILE]
        assert _PROFILE_KEY(replace(base, micro_batch=base.micro_batch + 1)) != _PROFILE_KEY(base)
        assert len(_PROFILE_KEY(base)) == len(read)


def test_tp_overlap_leaves_the_userbuffers_chunks_exposed():
    # Transformer Engine's initialize_ub defaults: ring-exchange all-gathers in tp chunks (1/tp exposed), the
    # forward's pipelined reduce-scatters in 4 splits (1/4), the backward's bulk reduce-scatters hidden
    from memcalc.time.step import _tp_exposed

    assert _tp_exposed(8.0, 8.0, 100.0, 4) == pytest.approx(8 * (1 / 4 + 1 / 4) / 2 + 8 / 4 / 2)
    assert _tp_exposed(8.0, 8.0, 100.0, 8) == pytest.approx(8 * (1 / 8 + 1 / 4) / 2 + 8 / 8 / 2)
    assert _tp_exposed(8.0, 8.0, 1.0, 4) == pytest.approx((8 - 1) + (8 - 2))  # nothing hides more than the GEMMs last
    plan = Plan(gpus=8, seq=8192, micro_batch=1, micro_batches=4, tp=8, sp=True)
    rows = [col("all-gather", ph, "tensor-parallel", 8, 64 * 2**20, calls=128) for ph in ("forward", "backward")]
    rows += [col("reduce-scatter", ph, "tensor-parallel", 8, 64 * 2**20, calls=128) for ph in ("forward", "backward")]
    plain, over = step_time(LLAMA, plan, H100, rows), step_time(LLAMA, replace(plan, tp_overlap=True), H100, rows)
    waits = dict(plain.communication_s)["tensor-parallel"]
    assert dict(over.communication_s)["tensor-parallel"] == pytest.approx(waits * ((1 / 8 + 1 / 4) + 1 / 8) / 4)
    assert over.compute_s == plain.compute_s and over.step_s < plain.step_s


def test_megatron_times_tp_with_userbuffers_only_under_sequence_parallelism():
    import memcalc

    kw = dict(model="llama-3-70b", framework="megatron", gpus=64, gpu="h100", tp=4, pp=4, seq_len=8192,
              micro_batch=1, micro_batches=16, stage=1)
    sp, plain = memcalc.estimate(**kw, sequence_parallel=True), memcalc.estimate(**kw)
    note = [n for n in sp.notes if "userbuffers" in n]
    assert len(note) == 1 and "--tp-comm-overlap" in note[0]
    assert not [n for n in plain.notes if "userbuffers" in n]
    assert sp.time.breakdown.communication_s["tensor-parallel"] < plain.time.breakdown.communication_s["tensor-parallel"] / 3
    titan = memcalc.estimate(**{**kw, "framework": "torchtitan", "stage": None, "fsdp": "FULL_SHARD"},
                             sequence_parallel=True)
    assert not [n for n in titan.notes if "userbuffers" in n]
