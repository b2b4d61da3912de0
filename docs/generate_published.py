"""Replay published memory measurements through memcalc: the table in docs/timeline.md, "Against published runs".

    python docs/generate_published.py

Each row is configured as its source ran it (the configuration recorded with the measurement, plus what the
framework's recipe sets: torchtune's configs run ``torch.optim.AdamW(fused=True)``, ``CEWithChunkedOutputLoss`` with
8 chunks, and compile the layers and the loss when ``compile: True``) and answered by ``memcalc.estimate``. Sources:
torchtune's README ("Optimization flags": Llama 3.2 3B, ``full_finetune_single_device``, batch 2, packed to 4096,
bf16, one A100; "Memory and training speed"), Hugging Face's blog "Accelerate Large Model Training using PyTorch
Fully Sharded Data Parallel" (GPT-2 on two 24 GB TITAN RTX, fp32), stanford_alpaca issue 220. The GPU files and
the Llama 3.2 3B config are in docs/published/. The blog's largest-batch rows are left out: its command is cut
before the block size, and the figures move with it.
"""

from __future__ import annotations

from pathlib import Path

import memcalc
from memcalc.units import GiB

HERE = Path(__file__).resolve().parent / "published"
L32_3B = str(HERE / "llama32_3b.json")
TITAN = str(HERE / "titan_rtx.toml")
A6000 = str(HERE / "rtx_a6000.toml")

TUNE = dict(hf_config=L32_3B, gpus=1, precision="bf16", seq_len=4096, micro_batch=2, attention="flash",
            gpu="a100-80g", framework="torchtune")  # fmt: skip
# (row, measured GiB, what the source reports, arguments): peak_memory_active is torchtune's max active bytes, the
# allocator's allocated peak (paged optimizer states live outside it)
PEAKS = [
    ("TUNE-3b-packed", 60.0, "peak_memory_active", TUNE | dict(loss="standard")),
    ("TUNE-3b-compile", 51.0, "peak_memory_active", TUNE | dict(loss="standard", compile=True)),
    ("TUNE-3b-chunkedCE", 42.9, "peak_memory_active", TUNE | dict(loss="chunked:8", compile=True)),
    ("TUNE-3b-AC", 24.9, "peak_memory_active", TUNE | dict(loss="chunked:8", compile=True, recompute="full")),
    ("TUNE-3b-optbwd", 23.1, "peak_memory_active", TUNE | dict(loss="chunked:8", compile=True, recompute="full",
                                                              optimizer_impl="in-backward")),
    # "Memory and training speed" (bs 2, packed seq 2048, compile): 8B_full_single_device (bitsandbytes
    # PagedAdamW8bit stepped in backward) on a 24 GB RTX 4090; 70B_full on 8 A100s with fsdp_cpu_offload and
    # custom_sharded_layers ['tok_embeddings', 'output'] (torchtune's FSDP2 units: --framework torchtune)
    ("TUNE-8b-4090", 18.9, "peak memory", dict(TUNE, hf_config=None, model="llama-3-8b", seq_len=2048,
                                               optimizer="paged-adam-8bit", loss="chunked:8", compile=True,
                                               recompute="full", optimizer_impl="in-backward", gpu="rtx-4090")),
    ("TUNE-70b-offload", 13.9, "peak memory", dict(TUNE, hf_config=None, model="llama-3-70b", seq_len=2048,
                                                   fsdp="FULL_SHARD", fsdp_version=2, offload_params="cpu", gpus=8,
                                                   loss="chunked:8", compile=True, recompute="full")),
]  # fmt: skip
# (row, what ran: "oom" or "ran", arguments)
FITS = [
    ("HF-FSDP-xl-ddp-1gpu", "oom", dict(model="gpt2-xl", gpus=1, precision="fp32", seq_len=128, micro_batch=1,
                                        gpu=TITAN)),
    ("HF-FSDP-xl-ddp-2gpu", "oom", dict(model="gpt2-xl", ddp=True, gpus=2, precision="fp32", seq_len=128,
                                        micro_batch=1, gpu=TITAN)),
    ("HF-FSDP-xl-ddpfp16-1gpu", "oom", dict(model="gpt2-xl", gpus=1, precision="amp-fp16", seq_len=128,
                                            micro_batch=1, gpu=TITAN)),
    # the recipe's `--fsdp "full_shard auto_wrap"`: the Trainer's FSDP1 (FullyShardedDataParallel)
    ("ALPACA220-fsdp-1gpu", "oom", dict(model="llama-2-7b", fsdp="FULL_SHARD", fsdp_version=1, gpus=1,
                                        precision="bf16-mixed", seq_len=512, micro_batch=4, attention="eager",
                                        gpu="a100-80g", framework="hf")),
]  # fmt: skip


# torchtitan's benchmark (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1, H100 96GB HBM2e
# at 500 W, bf16 parameters with fp32 gradient reduction, seq 8192; torch.compile then compiled the model only, hence
# --no-compile-loss;
# "Memory(GiB)" is what torchtitan logs, the allocator's reserved peak): (row, measured GiB, arguments)
# The benchmark's torchtitan (commit 9dec370ad, Dec 2024) kept the embedding, final norm and head in FSDP's root
# unit (parallelize_llama.py: ``fully_shard`` per block, then on the model), as releases up to v0.1.0 do: fsdp_wrap
# "root"; torchtitan's own default in memcalc is v0.2's units of their own ("separate").
MODEL_ONLY = dict(compile=True, compile_loss=False)  # 9dec370 predates the compiled loss (bbb1b616e, April 2025)
TITAN = dict(framework="torchtitan", gpu="h100-96g", precision="bf16-mixed", fsdp="FULL_SHARD", fsdp_version=2,
             fsdp_wrap="root", attention="flash", model="llama-3-8b", seq_len=8192)  # fmt: skip
TORCHTITAN = [
    ("Table 1: FSDP, 8 GPUs, op AC", 82.4, TITAN | dict(gpus=8, micro_batch=2, recompute="op-sac")),
    ("Table 1: + torch.compile", 77.0, TITAN | dict(gpus=8, micro_batch=2, recompute="op-sac", **MODEL_ONLY)),
    ("Table 3: FSDP, 128 GPUs, op AC", 67.0, TITAN | dict(gpus=128, micro_batch=2, recompute="op-sac")),
    ("Table 3: + torch.compile", 62.0, TITAN | dict(gpus=128, micro_batch=2, recompute="op-sac", **MODEL_ONLY)),
    # "+ Float8": tensorwise with the fp8 all-gather torchtitan's float8 notes pair it with (without it: +0.2 GiB)
    ("Table 1: + torch.compile + Float8", 76.8,
     TITAN | dict(gpus=8, micro_batch=2, recompute="op-sac", **MODEL_ONLY, float8="tensorwise", float8_all_gather=True)),
    ("Table 3: + torch.compile + Float8", 61.8,
     TITAN | dict(gpus=128, micro_batch=2, recompute="op-sac", **MODEL_ONLY, float8="tensorwise",
                  float8_all_gather=True)),
    ("Table 2: FSDP 8, seq 32768, full AC, compile, float8", 83.9,
     TITAN | dict(gpus=8, micro_batch=1, seq_len=32768, recompute="full", **MODEL_ONLY, float8="tensorwise")),
    ("Table 2: FSDP 4 x CP 2, seq 65536", 84.2,
     TITAN | dict(gpus=8, cp=2, micro_batch=1, seq_len=65536, recompute="full", **MODEL_ONLY, float8="tensorwise")),
    ("Table 4: 70B, FSDP 32 x TP 8, full AC, compile, float8", 71.9,
     TITAN | dict(model="llama-3-70b", gpus=256, tp=8, sequence_parallel=True, micro_batch=16, recompute="full",
                  **MODEL_ONLY, float8="tensorwise")),
    # async TP (inductor's fused all-gather/reduce-scatter matmuls) is not modelled: answered as plain TP
    ("Table 4: + AsyncTP (answered as plain TP)", 67.6,
     TITAN | dict(model="llama-3-70b", gpus=256, tp=8, sequence_parallel=True, micro_batch=16, recompute="full",
                  **MODEL_ONLY, float8="tensorwise")),
]  # fmt: skip

# A community run in the same folder (benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: Llama 3.1 8B on 4 and 8
# nodes of 8 H200s, torchtitan e7c0cae of 2025-06-13 with llama3_8b.toml's per-op SAC and seq 8192, local batch 2,
# ``--training.compile``, which from bbb1b616e (April 2025) compiles the loss too, float8 tensorwise with fp8
# all-gathers; "Memory(GiB)" as above, read at step 100). Its FSDP units are 9dec370's (the root keeps the embedding
# and the head): memcalc's torchtitan defaults otherwise, the compiled loss included.
H200 = TITAN | dict(gpu="h200", micro_batch=2, recompute="op-sac", compile=True, float8="tensorwise",
                    float8_all_gather=True)  # fmt: skip
# torchao's B200 benchmark (pytorch/ao torchao/prototype/mx_formats/README.md, "Training e2e benchmarks on NVIDIA
# B200"; torchtitan docs/mxfp8.md): Llama 3 8B on 8 power-limited B200s, local batch 1, seq 8192, torch.compile (model
# and loss at torchtitan 6fc499f, 2025-08-14), FSDP2 with the embedding and the head as units of their own (its
# apply_fsdp), per-op SAC; "Peak Memory" as torchtitan logs it. The MX rows are not modelled.
B200 = TITAN | dict(gpu="b200", gpus=8, micro_batch=1, recompute="op-sac", compile=True, fsdp_wrap="separate")
TORCHTITAN_2025 = [
    ("H200, 4 nodes: FSDP 32, compile, float8", 47.96, H200 | dict(gpus=32)),
    ("H200, 8 nodes: FSDP 64, compile, float8", 46.97, H200 | dict(gpus=64)),
    ("B200: FSDP 8, compile, bf16", 33.71, B200),
    ("B200: + float8 tensorwise (fp8 all-gather)", 33.38, B200 | dict(float8="tensorwise", float8_all_gather=True)),
    ("B200: + float8 rowwise", 33.72, B200 | dict(float8="rowwise")),
]


# torchtitan's 3D and 4D runs (same file, Tables 5 and 6: Llama 3.1 405B on 512 GPUs, TP 8 x PP 8, full AC, compile,
# float8 with fp8 all-gathers, async TP). torchtitan of that date split the local batch into pp-degree micro-batches
# (``pipeline_parallel_microbatches`` unset: torchtitan/distributed/pipelining_utils.py), so Table 5's local batch 32
# ran as 8 micro-batches of 4 and Table 6's 8 as 8 of 1; its default split of 126 layers is 15,16,...,16,15 (1F1B)
# and 7,8,...,8,7 over 16 stages (interleaved, two per rank). The pipeline ranks' steps are replayed by the realistic
# accounting (memory/overlays/timeline_pp.py); on Table 6's CP rows each rank runs the sequence-parallel step of its s/cp tokens
# (docs/timeline.md).
PP = TITAN | dict(model="llama-3-405b", gpus=512, tp=8, pp=8, sequence_parallel=True, recompute="full", **MODEL_ONLY,
                  float8="tensorwise", float8_all_gather=True)  # fmt: skip
TORCHTITAN_PP = [
    ("Table 5: 1F1B, local batch 32", 82.5, PP | dict(micro_batch=4, grad_accum=8)),
    ("Table 5: interleaved 1F1B", 72.7, PP | dict(micro_batch=4, grad_accum=8, virtual_stages=2)),
    ("Table 6: FSDP 8, CP 1, seq 32768", 75.3, PP | dict(micro_batch=1, grad_accum=8, seq_len=32768)),
    ("Table 6: FSDP 4, CP 2, seq 65536", 75.9, PP | dict(micro_batch=1, grad_accum=8, seq_len=65536, cp=2)),
    ("Table 6: FSDP 2, CP 4, seq 131072", 77.1, PP | dict(micro_batch=1, grad_accum=8, seq_len=131072, cp=4)),
    ("Table 6: FSDP 1, CP 8, seq 262144", 84.9, PP | dict(micro_batch=1, grad_accum=8, seq_len=262144, cp=8)),
]  # fmt: skip


def main() -> None:
    print("| row | measured GiB | memcalc peak_allocated GiB | error | verdict | peak moment |")
    print("|---|---|---|---|---|---|")
    for name, measured, _, kw in PEAKS:
        r = memcalc.estimate(**kw)
        got = r.memory.per_gpu.peak_allocated / GiB
        print(f"| {name} | {measured:.1f} | {got:.2f} | {(got - measured) / measured * 100:+.1f} % | "
              f"{r.memory.fit.verdict} | {r.memory.timeline.peak_phase} |")
    print()
    print("| row | what ran | memcalc total GiB | verdict | accounting |")
    print("|---|---|---|---|---|")
    for name, ran, kw in FITS:
        r = memcalc.estimate(**kw)
        print(f"| {name} | {ran} | {r.memory.per_gpu.total / GiB:.2f} | {r.memory.fit.verdict} | {r.accounting} |")
    print()
    print("| torchtitan run | measured GiB (reserved) | memcalc peak_reserved GiB | error | accounting |")
    print("|---|---|---|---|---|")
    for name, measured, kw in TORCHTITAN + TORCHTITAN_2025:
        r = memcalc.estimate(**kw)
        got = (r.memory.per_gpu.peak_reserved or r.memory.per_gpu.total) / GiB
        print(f"| {name} | {measured:.1f} | {got:.2f} | {(got - measured) / measured * 100:+.1f} % | {r.accounting} |")
    print()
    print("| torchtitan 405B run | measured GiB (reserved, largest over the ranks) | memcalc peak_reserved GiB (largest "
          "over the stages) | error | stage | most loaded stage (total) | accounting |")
    print("|---|---|---|---|---|---|---|")
    for name, measured, kw in TORCHTITAN_PP:
        r = memcalc.estimate(**kw)
        top = max(r.memory.stages, key=lambda st: (st.peak_reserved or 0, -st.stage))
        got = (top.peak_reserved or r.memory.per_gpu.total) / GiB
        print(f"| {name} | {measured:.1f} | {got:.2f} | {(got - measured) / measured * 100:+.1f} % | {top.stage} | "
              f"{r.memory.most_loaded_stage} | {r.accounting} |")


if __name__ == "__main__":
    main()
