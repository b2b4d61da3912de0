"""Regenerate the predicted-vs-published table of docs/performance-model.md.

    python docs/generate_performance.py [--write]

Each row is configured from its paper (model shape, GPUs, TP x PP, batch) and run through
``memcalc.time.step.step_time`` with the tensor/pipeline traffic of ``memcalc.comm.traffic`` and one data-parallel
gradient all-reduce. Prints Markdown tables. The data-parallel runs at the end go through the bridge
(``memcalc.build_input`` -> ``to_plan`` -> ``evaluate`` -> ``memcalc.time.estimate.time_evaluation``), so their traffic
is memcalc's own (``Evaluation.collectives``) and each group is placed in nodes from the plan's layout.
Every run compared is recorded (``replayed``) and printed last in one table with its error; ``--write`` puts that
table into docs/performance-model.md between its markers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import memcalc
from memcalc.comm.traffic import model_parallel_collectives
from memcalc.evaluate import evaluate
from memcalc.inputs.plan import to_plan
from memcalc.model.architecture import Architecture
from memcalc.model.params import Shard, stage_params
from memcalc.time.estimate import machine_for, placed, step_plan, time_evaluation
from memcalc.time.hardware import cluster_for_gpu, load_calibration, load_machine
from memcalc.time.step import Plan, step_time

REPLAYS: list[tuple[str, str, str, float, float]] = []
"""Every published run replayed: (set, run, figure compared, published, predicted); filled as the tables print."""


def replayed(group: str, name: str, figure: str, published: float, predicted: float) -> str:
    """Record one replay and return its error, signed, as the tables print it."""
    REPLAYS.append((group, name, figure, float(published), float(predicted)))
    return f"{100 * (predicted / published - 1):+.0f} %"

# Narayanan et al. 2021 (arXiv 2104.04473) Table 1, as recorded in /work/shared/measurements/published.md
# (rows MEG21-*, from NVIDIA/Megatron-LM README images/cases_april2021.png): name, layers, hidden, heads, GPUs, tp,
# pp, global batch, achieved TFLOP/s per GPU (hardware FLOPs, eq. 3, full recompute). Vocab 51200, seq 2048.
NARAYANAN = [
    ("1.7B", 24, 2304, 24, 32, 1, 1, 512, 137), ("3.6B", 30, 3072, 32, 64, 2, 1, 512, 138),
    ("7.5B", 36, 4096, 32, 128, 4, 1, 512, 142), ("18.4B", 40, 6144, 48, 256, 8, 1, 1024, 135),
    ("39.1B", 48, 8192, 64, 512, 8, 2, 1536, 138), ("76.1B", 60, 10240, 80, 1024, 8, 4, 1792, 140),
    ("145.6B", 80, 12288, 96, 1536, 8, 8, 2304, 148), ("310.1B", 96, 16384, 128, 1920, 8, 16, 2160, 155),
    ("529.6B", 105, 20480, 128, 2520, 8, 35, 2520, 163), ("1008.0B", 128, 25600, 160, 3072, 8, 64, 3072, 163),
]  # fmt: skip
# Korthikanti et al. 2022 (arXiv 2205.05198): shapes and TP x PP of Table 3 (presets/models/megatron-*.toml); data
# parallel size one (NVIDIA/Megatron-LM README: "measured using a data parallel size of one"); MFU and HFU with
# sequence parallelism + selective recompute from the same README table. Global batch sizes 4, 64, 280, 512 are the
# paper's Table 3 as remembered, not re-read here (the search tool did not return the table).
KORTHIKANTI = [
    ("22B", 48, 6144, 64, 8, 1, 4, 41.5, 43.7), ("175B", 96, 12288, 96, 8, 8, 64, 51.4, 52.8),
    ("530B", 105, 20480, 128, 8, 35, 280, 56.0, 57.0), ("1T", 128, 25600, 160, 8, 64, 512, 56.3, 57.0),
]  # fmt: skip

# torchtitan FSDP2 runs, no torch.compile, no Float8 (seq_len 8192 and compile = false: torchtitan
# torchtitan/models/llama3/train_configs/llama3_8b.toml). Name, source, memcalc model, GPUs, local batch, recompute
# (torchtitan's "selective op" AC taken as memcalc's selective), GPU preset, published tokens/s per GPU.
TORCHTITAN = [
    ("Llama 3.1 8B, FSDP, 8 x H100", "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1",
     "llama-3-8b", 8, 2, "selective", "h100", 5762),
    ("Llama 3.1 8B, FSDP, 128 x H100", "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 3",
     "llama-3-8b", 128, 2, "selective", "h100", 5605),
    ("Llama 3 8B, FSDP, 64 x A100",
     "pytorch/torchtitan docs/performance.md (commit 0413364) Llama 3 table, selective op", "llama-3-8b", 64, 1,
     "selective", "a100-80g", 2973),
    ("Llama 3 70B, FSDP, 64 x A100", "pytorch/torchtitan docs/performance.md (commit 0413364) Llama 3 table, full AC",
     "llama-3-70b", 64, 1, "full", "a100-80g", 331),
]  # fmt: skip


# Float8 (torchao) against bf16 on the same runs: name, source, model, GPUs, local batch, recipe, FSDP fp8 all-gather,
# published tokens/s per GPU in bf16 and in float8 (both with torch.compile, which memcalc does not time: the ratio
# is the figure compared).
FLOAT8 = [
    ("Llama 3.1 8B, FSDP, 8 x H100, op AC", "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1",
     "llama-3-8b", 8, 2, "tensorwise", False, 6667, 8532),
    ("Llama 3.1 8B, FSDP, 128 x H100, op AC", "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 3",
     "llama-3-8b", 128, 2, "tensorwise", False, 6514, 8380),
    ("Llama 3 8B, FSDP, 8 x H100, op AC, bs 1", "pytorch/ao docs/source/workflows/training.md (e2e benchmarks)",
     "llama-3-8b", 8, 1, "tensorwise", True, 6150, 7689.5),
    ("Llama 3 8B, FSDP, 8 x H100, op AC, bs 1", "pytorch/ao docs/source/workflows/training.md (e2e benchmarks)",
     "llama-3-8b", 8, 1, "rowwise", False, 6150, 6768),
]  # fmt: skip


def narayanan_bridge(L: int, h: int, a: int, gpus: int, tp: int, pp: int, batch: int):
    """Configured as measurements/published.md's MEG21-* rows: Megatron-LM (its fused kernels), DDP (stage 0),
    fp16-mixed, micro-batch 1."""
    inp = memcalc.build_input(model="megatron-22b", layers=L, hidden=h, heads=a, ffn=4 * h, vocab=51200, stage=0,
                              gpus=gpus, tp=tp, pp=pp, precision="fp16-mixed", seq_len=2048, micro_batch=1,
                              grad_accum=batch // (gpus // (tp * pp)), recompute="full", attention="eager",
                              gpu="a100-80g", framework="megatron")  # fmt: skip
    return time_evaluation(evaluate(to_plan(inp)), gpu=inp.gpu.key)


def torchtitan_bridge(model: str, gpus: int, micro_batch: int, recompute: str, gpu: str, op_ac: bool = False,
                      calibration: str | None = None, float8: str = "none", float8_all_gather: bool = False):
    """``op_ac``: time torchtitan's per-op selective AC (memcalc.time.flops.op_recomputed) in place of memcalc's
    selective; ``calibration``: the GPU's rates from that calibration preset (links from the GPU's cluster)."""
    inp = memcalc.build_input(model=model, fsdp="FULL_SHARD", fsdp_version=2, gpus=gpus, precision="bf16-mixed",
                              seq_len=8192, micro_batch=micro_batch, recompute=recompute, attention="sdpa",
                              gpu=gpu, float8=float8, float8_all_gather=float8_all_gather,
                              framework="torchtitan")  # fmt: skip
    ev = evaluate(to_plan(inp))
    rc = "op" if op_ac else None
    if calibration is None:
        return time_evaluation(ev, gpu=inp.gpu.key, recompute=rc)
    plan = ev.plan
    machine = replace(machine_for(cluster_for_gpu(inp.gpu.key), plan.ranks_per_node),
                      calibration=load_calibration(calibration))  # fmt: skip
    return step_time(plan.arch, step_plan(plan, recompute=rc), machine, placed(ev.collectives, plan), ev.transfers)


def gpt(layers: int, hidden: int, heads: int, vocab: int, multiple: int) -> Architecture:
    return Architecture(layers=layers, hidden=hidden, heads=heads, vocab=vocab, vocab_multiple=multiple,
                        max_positions=2048, fused_qkv=True, tied_embeddings=True, dropout=0.1)  # fmt: skip


def predict(arch: Architecture, gpus: int, tp: int, pp: int, batch: int, recompute: str, sp: bool, cluster: str):
    dp = gpus // (tp * pp)
    m = batch // dp
    plan = Plan(gpus=gpus, seq=2048, micro_batch=1, micro_batches=m, tp=tp, pp=pp, sp=sp, recompute=recompute,
                attention="eager", dtype="fp16", dropout=True)  # fmt: skip
    machine = load_machine(cluster)
    stage = pp // 2
    rows = model_parallel_collectives(
        tp=tp, pp=pp, cp=1, ep=1, dp=dp, sp=sp, stage=stage, virtual=1, layers=arch.layers // pp, moe_layers=0,
        tokens=2048, hidden=arch.hidden, kv_width=arch.kv_width, top_k=1, act_bytes=2, dtype="fp16",
        micro_batches=m, full_recompute=recompute == "full", gpus_per_node=8, intra_link="nvlink3",
    )  # fmt: skip
    if dp > 1:  # fp16 gradients all-reduced once per step over the data-parallel ranks (tp x pp apart: across nodes)
        grads = stage_params(arch, stage, pp, Shard(tp=tp)).total * 2
        rows.append(SimpleNamespace(op="all-reduce", phase="backward", group="data-parallel", group_size=dp,
                                    crosses_nodes=tp * pp * dp > 8, calls_per_step=1, payload_bytes_per_call=grads))
    return step_time(arch, plan, machine, rows)


def main() -> None:
    print("| Narayanan et al. 2021, Table 1 | GPUs | t x p | batch | published TFLOP/s/GPU | predicted | error |")
    print("|---|---|---|---|---|---|---|")
    for name, L, h, a, gpus, tp, pp, batch, pub in NARAYANAN:
        st = predict(gpt(L, h, a, 51200, 1), gpus, tp, pp, batch, "full", False, "dgx-a100")
        hw = st.hardware_flops / st.step_s / gpus / 1e12
        print(f"| GPT {name} | {gpus} | {tp} x {pp} | {batch} | {pub} | {hw:.0f} | {100 * (hw / pub - 1):+.0f} % |")
    print()
    print("| Korthikanti et al. 2022 (SP + selective) | GPUs | t x p | batch | published MFU / HFU "
          "| predicted MFU / HFU | MFU error | predicted step s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, L, h, a, tp, pp, batch, mfu, hfu in KORTHIKANTI:
        st = predict(gpt(L, h, a, 50257, 128 * tp), tp * pp, tp, pp, batch, "selective", True, "dgx-a100")
        err = replayed("Megatron-LM (Korthikanti 2022), A100", f"{name}, {tp * pp} GPUs", "MFU", mfu, 100 * st.mfu)
        print(f"| {name} | {tp * pp} | {tp} x {pp} | {batch} | {mfu} % / {hfu} % | {100 * st.mfu:.1f} % / "
              f"{100 * st.hfu:.1f} % | {err} | {st.step_s:.2f} |")

    print()
    print("| Narayanan et al. 2021, Table 1, through `time_evaluation` | GPUs | t x p | published TFLOP/s/GPU "
          "| predicted | error | exposed data-parallel s | step s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, L, h, a, gpus, tp, pp, batch, pub in NARAYANAN:
        st = narayanan_bridge(L, h, a, gpus, tp, pp, batch)
        hw = st.hardware_flops / st.step_s / gpus / 1e12
        dp = dict(st.communication_s).get("data-parallel", 0.0)
        err = replayed("Megatron-LM (Narayanan 2021), A100", f"GPT {name}, {gpus} GPUs", "TFLOP/s per GPU", pub, hw)
        print(f"| GPT {name} | {gpus} | {tp} x {pp} | {pub} | {hw:.0f} | {err} | {dp:.3f} | {st.step_s:.2f} |")
    print()
    print("| torchtitan run | source | published tokens/s/GPU | predicted | error | predicted MFU | step s |")
    print("|---|---|---|---|---|---|---|")
    for name, source, model, gpus, b, rc, gpu, pub in TORCHTITAN:
        st = torchtitan_bridge(model, gpus, b, rc, gpu)
        tps = st.tokens_per_s_per_gpu
        err = f"{100 * (tps / pub - 1):+.0f} %"
        if gpu != "h100":  # the H100 rows are replayed with the benchmark's own inputs in torchtitan_parallel()
            err = replayed("torchtitan, A100", name, "tokens/s per GPU", pub, tps)
        print(f"| {name} | {source} | {pub:,} | {tps:,.0f} | {err} | {100 * st.mfu:.1f} % | {st.step_s:.2f} |")
    print()
    print("| torchtitan H100 run, corrected inputs | published tokens/s/GPU | memcalc selective, h100-sxm | op AC, "
          "h100-sxm | op AC, h100-sxm-hbm2e-500w | error | recompute s | memory-bound s | step s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name, source, model, gpus, b, rc, gpu, pub in TORCHTITAN:
        if gpu != "h100":
            continue
        a, o, t = (torchtitan_bridge(model, gpus, b, rc, gpu), torchtitan_bridge(model, gpus, b, rc, gpu, True),
                   torchtitan_bridge(model, gpus, b, rc, gpu, True, "h100-sxm-hbm2e-500w"))  # fmt: skip
        tps = t.tokens_per_s_per_gpu
        print(f"| {name} | {pub:,} | {a.tokens_per_s_per_gpu:,.0f} | {o.tokens_per_s_per_gpu:,.0f} | {tps:,.0f} | "
              f"{100 * (tps / pub - 1):+.0f} % | {t.recompute_s:.3f} | {t.memory_bound_s:.3f} | {t.step_s:.2f} |")

    print()
    print("| float8 run | source | recipe | published bf16 -> float8 tokens/s/GPU | published speed-up | predicted "
          "speed-up |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, source, model, gpus, b, recipe, ag, bf16, fp8 in FLOAT8:
        base = torchtitan_bridge(model, gpus, b, "selective", "h100", True)
        f8 = torchtitan_bridge(model, gpus, b, "selective", "h100", True, float8=recipe, float8_all_gather=ag)
        pred = f8.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu
        print(f"| {name} | {source} | {recipe}{' + fp8 all-gather' if ag else ''} | {bf16:,} -> {fp8:,} | "
              f"{100 * (fp8 / bf16 - 1):+.1f} % | {100 * (pred - 1):+.1f} % |")

    print()
    single_gpu()
    print()
    torchtitan_parallel()
    print()
    nemo()
    print()
    nemo("b200")


# torchtitan's benchmark, Tables 2 and 4-6 (TPS/GPU): the same runs whose memory docs/generate_published.py answers,
# with the same arguments (compile and Float8, which memcalc times as eager layers with fp8 GEMMs)
TITAN_TPS = {"Table 1: FSDP, 8 GPUs, op AC": 5762, "Table 1: + torch.compile": 6667,
             "Table 1: + torch.compile + Float8": 8532, "Table 3: FSDP, 128 GPUs, op AC": 5605,
             "Table 3: + torch.compile": 6514, "Table 3: + torch.compile + Float8": 8380,
             "Table 2: FSDP 8, seq 32768, full AC, compile, float8": 3890, "Table 2: FSDP 4 x CP 2, seq 65536": 2540,
             "Table 2: FSDP 2 x CP 4, seq 131072": 1071, "Table 2: FSDP 1 x CP 8, seq 262144": 548,
             "Table 4: 70B, FSDP 32 x TP 8, full AC, compile, float8": 829,
             "Table 4: + AsyncTP (answered as plain TP)": 876, "Table 5: 1F1B, local batch 32": 100,
             "Table 5: interleaved 1F1B": 128, "Table 6: FSDP 8, CP 1, seq 32768": 76,
             "Table 6: FSDP 4, CP 2, seq 65536": 47, "Table 6: FSDP 2, CP 4, seq 131072": 31,
             "Table 6: FSDP 1, CP 8, seq 262144": 16}  # fmt: skip


# Pairs of the benchmark's runs that differ in one choice (tests/test_ranking.py holds their order):
# (what differs, the run published slower, the run published faster).
PAIRS = [
    # (what differs, slower run, faster run): published TPS/GPU slower < faster
    ("pipeline schedule", "Table 5: 1F1B, local batch 32", "Table 5: interleaved 1F1B"),
    ("context parallel 1 -> 2 (405B, 4D)", "Table 6: FSDP 4, CP 2, seq 65536", "Table 6: FSDP 8, CP 1, seq 32768"),
    ("context parallel 2 -> 4 (405B, 4D)", "Table 6: FSDP 2, CP 4, seq 131072", "Table 6: FSDP 4, CP 2, seq 65536"),
    ("context parallel 4 -> 8 (405B, 4D)", "Table 6: FSDP 1, CP 8, seq 262144", "Table 6: FSDP 2, CP 4, seq 131072"),
    ("context parallel 1 -> 2 (8B)", "Table 2: FSDP 4 x CP 2, seq 65536",
     "Table 2: FSDP 8, seq 32768, full AC, compile, float8"),
    ("context parallel 2 -> 4 (8B)", "Table 2: FSDP 2 x CP 4, seq 131072", "Table 2: FSDP 4 x CP 2, seq 65536"),
    ("context parallel 4 -> 8 (8B)", "Table 2: FSDP 1 x CP 8, seq 262144", "Table 2: FSDP 2 x CP 4, seq 131072"),
    ("eager -> torch.compile, 8 GPUs", "Table 1: FSDP, 8 GPUs, op AC", "Table 1: + torch.compile"),
    ("eager -> torch.compile, 128 GPUs", "Table 3: FSDP, 128 GPUs, op AC", "Table 3: + torch.compile"),
    ("bf16 -> float8, 8 GPUs", "Table 1: + torch.compile", "Table 1: + torch.compile + Float8"),
    ("bf16 -> float8, 128 GPUs", "Table 3: + torch.compile", "Table 3: + torch.compile + Float8"),
]  # fmt: skip


def ranking() -> str:
    """Each published pair: the published and predicted speed-up of the faster run, and whether the order holds."""
    runs = dict(titan_runs())
    lines = ["| pair (torchtitan benchmark) | published speed-up | predicted | order |", "|---|---|---|---|"]
    for what, slower, faster in PAIRS:
        a, b = (memcalc.estimate(**runs[n]).time.tokens_per_s_per_gpu for n in (slower, faster))
        pub = TITAN_TPS[faster] / TITAN_TPS[slower]
        lines.append(f"| {what} | {pub:.2f}x | {b / a:.2f}x | {'as measured' if b > a else 'REVERSED'} |")
    return "\n".join(lines)


def titan_runs() -> list[tuple[str, dict]]:
    """The benchmark's runs as docs/generate_published.py configures them, with Table 2's CP 4 and CP 8 rows (whose
    memory it does not compare) configured alike."""
    from generate_published import MODEL_ONLY, TITAN
    from generate_published import TORCHTITAN as MEM
    from generate_published import TORCHTITAN_PP

    cp = [(f"Table 2: FSDP {8 // c} x CP {c}, seq {32768 * c}",
           TITAN | dict(gpus=8, cp=c, micro_batch=1, seq_len=32768 * c, recompute="full", **MODEL_ONLY,
                        float8="tensorwise")) for c in (4, 8)]  # fmt: skip
    return [(name, kw) for name, _, kw in [*MEM, *TORCHTITAN_PP]] + cp


def torchtitan_parallel() -> None:

    print("| torchtitan run (H100 96GB, 500 W) | published tokens/s/GPU | predicted | error | compute + recompute s "
          "| bubble s | host s | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, kw in titan_runs():
        if name not in TITAN_TPS:
            continue
        t = memcalc.estimate(**kw).time
        pub, tps, b = TITAN_TPS[name], t.tokens_per_s_per_gpu, t.breakdown
        replayed("torchtitan (Dec 2024), H100 96GB 500 W", name, "tokens/s per GPU", pub, tps)
        print(f"| {name} | {pub:,} | {tps:,.0f} | {100 * (tps / pub - 1):+.1f} % | "
              f"{b.compute_s + b.recompute_s:.1f} | {b.bubble_s:.1f} | {b.host_s:.3f} | {t.step_s:.2f} |")


# NVIDIA NeMo 24.12 performance summary, pre-training at FP8 on DGX-H100 (docs.nvidia.com/nemo-framework/user-guide/
# 24.12/performance/performance_summary.html): Megatron-Core with Transformer Engine, NeMo's FP8 recipe
# (bf16_with_fp8_mixed: per-tensor scaling, fp8_param_gather=True), the distributed optimizer, sequence parallelism
# and TE's TP overlap with tensor parallelism. Name, memcalc model (with shape overrides for GPT3 5B and 20B, NeMo's
# gpt3 configs), GPUs, global batch, micro-batch, seq, tp, pp, cp, vp, ep, published tokens/s per GPU. Left out: the
# Nemotron rows (squared-ReLU MLP, no memcalc family) and the fine-tuning rows (LoRA under Megatron is not modelled).
NEMO = [
    ("GPT3-5B, 64 GPUs", dict(model="gpt3-175b", layers=24, hidden=4096, heads=32, ffn=16384), 64, 2048, 4, 2048,
     1, 1, 1, 1, 1, 23406),
    ("GPT3-20B, 64 GPUs", dict(model="gpt3-175b", layers=44, hidden=6144, heads=48, ffn=24576), 64, 256, 2, 2048,
     2, 1, 1, 1, 1, 5851),
    ("GPT3-175B, 128 GPUs", dict(model="gpt3-175b"), 128, 256, 1, 2048, 4, 8, 1, 6, 1, 716),
    ("GPT3-175B, 512 GPUs", dict(model="gpt3-175b"), 512, 2048, 2, 2048, 4, 8, 1, 6, 1, 825),
    ("Llama 2 7B, 8 GPUs", dict(model="llama-2-7b"), 8, 128, 1, 4096, 1, 1, 1, 1, 1, 16934),
    ("Llama 2 13B, 16 GPUs", dict(model="llama-2-13b"), 16, 128, 1, 4096, 1, 4, 1, 10, 1, 8715),
    ("Llama 2 70B, 64 GPUs", dict(model="llama-2-70b"), 64, 128, 1, 4096, 4, 4, 1, 20, 1, 1728),
    ("Llama 3 8B, 8 GPUs", dict(model="llama-3-8b"), 8, 128, 1, 8192, 1, 1, 2, 1, 1, 12273),
    ("Llama 3 70B, 64 GPUs", dict(model="llama-3-70b"), 64, 128, 1, 8192, 4, 4, 2, 5, 1, 1524),
]  # fmt: skip


# NeMo 25.02's performance summary, pre-training at FP8 on DGX-B200 (docs.nvidia.com/nemo-framework/user-guide/latest/
# performance/performance_summary.html, "Container: NeMo 25.02, System: DGX-B200"), the same columns (ep the last
# before the figure). Mixtral 8x22B is Mistral's shape (56 layers, hidden 6144, 48 heads, 8 KV heads, ffn 16384, 8
# experts, vocabulary 32768); its row's global batch and micro-batch read 1 and 64, taken as 64 and 1 (its GA 16
# over dp 4 says so). Left out: the Nemotron rows.
L405 = "1," + ",".join(["2"] * 62) + ",1"  # 126 layers over 8 x 8 chunks, the embedding and loss as a layer each
NEMO_B200 = [
    ("GPT3-175B, 512 GPUs", dict(model="gpt3-175b"), 512, 2048, 2, 2048, 4, 4, 1, 6, 1, 1600),
    ("Llama 3 8B, 8 GPUs", dict(model="llama-3-8b"), 8, 128, 2, 8192, 1, 1, 1, 1, 1, 26006),
    ("Llama 3 70B, 64 GPUs", dict(model="llama-3-70b"), 64, 128, 1, 8192, 2, 4, 2, 5, 1, 3062),
    ("Llama 3 405B, 128 GPUs", dict(model="llama-3-405b", stage_layers=L405), 128, 64, 1, 8192, 4, 8, 2, 8, 1, 625),
    ("Mixtral 8x7B, 64 GPUs", dict(model="mixtral-8x7b"), 64, 256, 2, 4096, 1, 1, 1, 1, 8, 15457),
    ("Mixtral 8x22B, 256 GPUs", dict(model="mixtral-8x7b", layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384,
                                     vocab=32768), 256, 64, 1, 65536, 2, 4, 8, 14, 8, 2232),
]  # fmt: skip
NEMO_SETS = {"h100": ("NeMo 24.12, DGX-H100, FP8", "NeMo 24.12 (Megatron-Core), H100, FP8"),
             "b200": ("NeMo 25.02, DGX-B200, FP8", "NeMo 25.02 (Megatron-Core), B200, FP8")}


def nemo(gpu: str = "h100") -> None:
    """NVIDIA's published Megatron-Core throughput (NeMo 24.12 on H100, 25.02 on B200; FP8) through
    ``memcalc.estimate``."""
    title, group = NEMO_SETS[gpu]
    runs = NEMO if gpu == "h100" else NEMO_B200
    print(f"| {title} | t x p x c x v, ep | global batch x micro-batch x seq | published tokens/s/GPU "
          "| predicted | error | step s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, shape, gpus, gbs, mbs, seq, tp, pp, cp, vp, ep, pub in runs:
        dp = gpus // (tp * pp * cp)
        e = memcalc.estimate(**shape, gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep, virtual_stages=vp,
                             sequence_parallel=tp > 1, framework="megatron", stage=1, seq_len=seq, micro_batch=mbs,
                             grad_accum=gbs // (mbs * dp), gpu=gpu, float8="tensorwise", float8_all_gather=True)
        t = e.time
        assert t is not None
        err = replayed(group, name, "tokens/s per GPU", pub, t.tokens_per_s_per_gpu)
        print(f"| {name} | {tp} x {pp} x {cp} x {vp}, {ep} | {gbs} x {mbs} x {seq} | {pub:,} | "
              f"{t.tokens_per_s_per_gpu:,.0f} | {err} | {t.step_s:.2f} |")


def single_gpu() -> None:
    """One H100 80GB, Hugging Face models under the Trainer's step (measurements/h100-single-gpu.md, the rows
    docs/generate_timeline.py holds): measured step ms against ``time.step_s``."""
    import statistics
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import generate_timeline as g

    print("| one H100, measured step | regime | attention | recompute | seq x batch | measured ms | predicted ms "
          "| error |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for r in (r for r in g.ROWS if r.step_ms is not None):
        ms = g.predict_step_s(r) * 1e3
        errors.append(ms / r.step_ms - 1)
        # tokens/s: the inverse of the step time, so the error's sign says fast (+) or slow (-) like every other row
        replayed("one H100, measured (h100-single-gpu.md)", f"{r.model} {r.regime} {r.attention} "
                 f"{'full' if r.ckpt else 'none'} {r.seq} x {r.batch}", "tokens/s", 1 / r.step_ms, 1 / ms)
        print(f"| {r.model} | {r.regime} | {r.attention} | {'full' if r.ckpt else 'none'} | {r.seq} x {r.batch} | "
              f"{r.step_ms:.0f} | {ms:.0f} | {100 * errors[-1]:+.0f} % |")
    print(f"\nmedian |error| {100 * statistics.median(abs(e) for e in errors):.1f} %, "
          f"largest {100 * max(abs(e) for e in errors):.1f} %")


BEGIN, END = "<!-- replays: python docs/generate_performance.py --write -->", "<!-- /replays -->"
DOC = Path(__file__).resolve().parent / "performance-model.md"


def summary() -> str:
    """Every replay in one table, each with its error, and the median and largest |error| per set and overall."""
    import statistics

    lines = ["| set | run | figure | published | predicted | error |", "|---|---|---|---|---|---|"]
    for group, name, figure, pub, pred in REPLAYS:
        fmt = "{:.3g}" if pub < 1 else "{:,.0f}" if pub >= 100 else "{:.1f}"
        shown_pub, shown_pred = (fmt.format(pub), fmt.format(pred)) if pub >= 1 else (f"{1 / pub:.0f} ms",
                                                                                      f"{1 / pred:.0f} ms")
        lines.append(f"| {group} | {name} | {figure} | {shown_pub} | {shown_pred} | {100 * (pred / pub - 1):+.1f} % |")
    lines += ["", "| set | runs | median \|error\| | largest \|error\| |", "|---|---|---|---|"]
    groups: dict[str, list[float]] = {}
    for group, _, _, pub, pred in REPLAYS:
        groups.setdefault(group, []).append(abs(pred / pub - 1))
    for group, errs in [*groups.items(), ("all", [e for v in groups.values() for e in v])]:
        lines.append(f"| {group} | {len(errs)} | {100 * statistics.median(errs):.1f} % | {100 * max(errs):.1f} % |")
    return "\n".join(lines)


def _tables(text: str) -> list[list[str]]:
    """The Markdown tables of ``text``: runs of lines that start with ``|``."""
    tables, run = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            run.append(line)
        elif run:
            tables.append(run)
            run = []
    return tables


def _first_cell(header: str) -> str:
    return header.split("|")[1].strip()


def write(printed: str, replays: str) -> None:
    """Regenerate docs/performance-model.md's tables: each table whose first header cell is that of a printed one
    becomes the printed one, and the block between the markers becomes ``replays``."""
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    fresh = {_first_cell(t[0]): t for t in _tables(printed)}

    def regenerate(part: str) -> str:
        lines, out, i = part.splitlines(), [], 0
        while i < len(lines):
            if lines[i].startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
                j = i
                while j < len(lines) and lines[j].startswith("|"):
                    j += 1
                out += fresh.get(_first_cell(lines[i]), lines[i:j])
                i = j
            else:
                out.append(lines[i])
                i += 1
        return "\n".join(out) + ("\n" if part.endswith("\n") else "")

    DOC.write_text(f"{regenerate(head)}{BEGIN}\n{replays}\n{END}{regenerate(tail)}")


if __name__ == "__main__":
    import contextlib
    import io
    import sys

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main()
    table = summary() + "\n\n" + ranking()
    print(out.getvalue())
    print(table)
    if "--write" in sys.argv[1:]:
        write(out.getvalue(), table)
