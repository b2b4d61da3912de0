"""Predicted (``--accounting implementation``) against measured, for one configuration or a list of them.

Used by ``memcalc validate``, ``tests/validation`` and ``docs/generate_validation.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import memcalc
from memcalc.model.architecture import Architecture
from memcalc.validation.measure import Collective, Config, RankResult, run

FSDP1 = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
ODD = dict(vocab=101, hidden=60, heads=4, seq=15)  # sizes that force padding at world 4
QUICK = (Config("ddp", "ddp"), Config("fsdp1", "FULL_SHARD", mixed_precision=True), Config("fsdp2", "default"))
FULL = tuple(
    [Config("ddp", "ddp"), Config("ddp", "ddp", world=4, **ODD), Config("ddp", "ddp", bucket_view=True)]
    + [Config("fsdp1", s, world=4, **ODD) for s in FSDP1]
    + [Config("fsdp1", "FULL_SHARD"), Config("fsdp1", "FULL_SHARD", mixed_precision=True, vocab=103, hidden=44, seq=13),
       Config("fsdp1", "SHARD_GRAD_OP", mixed_precision=True, world=4, **ODD)]
    + [Config("fsdp2", s, world=4, **ODD) for s in ("default", "no-reshard", "hsdp")]
    + [Config("fsdp2", "default", mixed_precision=True, vocab=103, hidden=44, seq=13), Config("fsdp2", "default", layers=3)]
    # size_based_auto_wrap_policy: QKV, fc1, fc2 become units, the rest of each block falls to the root
    + [Config("fsdp1", "FULL_SHARD", world=4, min_num_params=10_000, **ODD),
       Config("fsdp1", "FULL_SHARD", min_num_params=12_000, mixed_precision=True)]
)  # fmt: skip
# DeepSpeed (when installed): every stage, bf16 and fp32, sizes that force its padding (Ψ = 25,980 on 4 ranks).
DS_ODD = dict(vocab=103, hidden=30, heads=3, seq=15)
# ZeRO-3 is measured in its third step: the first records the module trace, the second checks it across ranks.
DEEPSPEED = tuple(Config("deepspeed", f"zero-{s}", world=w, mixed_precision=m, steps=3 if s == 3 else 1, **DS_ODD)
                  for s in range(4) for m in (True, False) for w in ((2, 4) if s in (1, 3) and m else (4,)))  # fmt: skip
# ZeRO-3's coordinator at settings that make it prefetch, keep and release parameters in every combination:
# a prefetch bucket smaller than the model, reuse distances that keep some layers from forward to backward,
# a live-parameter limit, persistent small parameters (gathered after the step), padding on 4 ranks.
ZERO3 = (
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, layers=4, prefetch_bucket_size=20_000),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, layers=4, prefetch_bucket_size=20_000,
           max_reuse_distance=60_000),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, layers=4, prefetch_bucket_size=0,
           max_reuse_distance=100_000),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, layers=4, max_live_parameters=50_000,
           max_reuse_distance=30_000),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, max_reuse_distance=0, max_live_parameters=0),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, persistence_threshold=5_000),
    Config("deepspeed", "zero-3", steps=3, world=4, layers=3, prefetch_bucket_size=3_000, max_live_parameters=9_000,
           max_reuse_distance=4_000, persistence_threshold=100, **DS_ODD),
    Config("deepspeed", "zero-3", mixed_precision=True, steps=3, world=4, layers=5, prefetch_bucket_size=1_500,
           max_reuse_distance=7_000, **DS_ODD),
)
# Real Hugging Face models (when transformers is installed), whose modules memcalc follows exactly, parameter-less
# ones included (memcalc.memory.accountings.frameworks.LAYOUTS). FSDP1's size policy wraps their inner transformer/model/decoder
# module and, for tied models (GPT-2, OPT), can flatten the tied embedding into two units; ZeRO-3 prefetches at
# every module's hooks.
HF_FSDP = (
    Config("fsdp1", "FULL_SHARD", model="hf-gpt2", layers=3, min_num_params=8_000),
    Config("fsdp1", "FULL_SHARD", model="hf-gpt2", layers=3, min_num_params=3_000, world=4, vocab=101),
    Config("fsdp1", "FULL_SHARD", model="hf-llama", layers=3, min_num_params=60_000, mixed_precision=True),
    Config("fsdp1", "FULL_SHARD", model="hf-opt", layers=3, min_num_params=3_000, world=4, vocab=101),
    Config("fsdp1", "FULL_SHARD", model="hf-bloom", layers=3, min_num_params=8_000, mixed_precision=True),
    Config("fsdp1", "SHARD_GRAD_OP", model="hf-gpt_neox", layers=3, min_num_params=3_000, world=4, vocab=101),
)
HF_ZERO3 = (
    Config("deepspeed", "zero-3", model="hf-gpt2", mixed_precision=True, steps=3, layers=3, prefetch_bucket_size=10_000,
           max_reuse_distance=30_000),
    Config("deepspeed", "zero-3", model="hf-llama", mixed_precision=True, steps=3, layers=4, world=4, vocab=101,
           max_live_parameters=30_000, max_reuse_distance=20_000, persistence_threshold=100),
    Config("deepspeed", "zero-3", model="hf-gpt2", steps=3, world=4, layers=3, prefetch_bucket_size=3_000,
           max_live_parameters=9_000, max_reuse_distance=4_000, persistence_threshold=100, **DS_ODD),
) + tuple(Config("deepspeed", "zero-3", model=f"hf-{m}", mixed_precision=True, steps=3, layers=3,
                 prefetch_bucket_size=10_000, max_reuse_distance=30_000, persistence_threshold=100)
          for m in ("gpt_neox", "bloom", "opt", "falcon"))  # fmt: skip
# The first (trace-recording) step: --zero3-step first.
ZERO3_FIRST = (Config("deepspeed", "zero-3", mixed_precision=True, persistence_threshold=5_000),
               Config("deepspeed", "zero-3", world=4, layers=3, prefetch_bucket_size=3_000, **DS_ODD))
OPS = {"allreduce": "all-reduce", "allgather": "all-gather", "allgather_base": "all-gather",
       "allgather_into_tensor_coalesced": "all-gather", "reduce_scatter_base": "reduce-scatter",
       "reduce_scatter_tensor_coalesced": "reduce-scatter"}  # fmt: skip
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def deepspeed_available() -> bool:
    return _importable("deepspeed")


def transformers_available() -> bool:
    return _importable("transformers")


def full() -> tuple[Config, ...]:
    """Every configuration: the PyTorch ones; Hugging Face models' and DeepSpeed's when they are installed."""
    hf, ds = transformers_available(), deepspeed_available()
    return (FULL + (HF_FSDP if hf else ()) + (DEEPSPEED + ZERO3 + ZERO3_FIRST if ds else ())
            + (HF_ZERO3 if hf and ds else ()))  # fmt: skip


def architecture(c: Config) -> Architecture:
    """memcalc's description of the measured model: TinyGPT, or the Hugging Face model from its config."""
    if c.model != "tiny":
        from memcalc.model.hf_config import architecture_from_config

        return architecture_from_config(c.hf_config())
    return Architecture(family=None, layers=c.layers, hidden=c.hidden, heads=c.heads, vocab=c.vocab,
                        max_positions=c.seq, tied_embeddings=True, fused_qkv=True)  # fmt: skip


def estimate(c: Config, accounting: str = "implementation") -> memcalc.Estimate:
    """memcalc's estimate for the same model, framework and layout."""
    kw = dict(model=architecture(c), gpus=c.world, gpus_per_node=c.world, cuda_context_gib=0, accounting=accounting,
              precision="bf16-mixed" if c.mixed_precision else "fp32", bucket_view=c.bucket_view,
              min_num_params=(c.min_num_params or None) if accounting == "implementation" else None)  # fmt: skip
    if c.framework == "ddp":
        return memcalc.estimate(ddp=True, **kw)
    if c.framework == "deepspeed":
        kw.pop("bucket_view")
        kw.pop("min_num_params")
        if c.strategy == "zero-3":
            kw.update(max_reuse_distance=c.max_reuse_distance, max_live_parameters=c.max_live_parameters,
                      prefetch_bucket_size=c.prefetch_bucket_size, persistence_threshold=c.persistence_threshold,
                      zero3_step="first" if c.steps == 1 else "steady")  # fmt: skip
        return memcalc.estimate(stage=int(c.strategy.split("-")[1]), **kw)
    name = {"default": "FULL_SHARD", "no-reshard": "SHARD_GRAD_OP", "hsdp": "HYBRID_SHARD"}.get(c.strategy, c.strategy)
    hybrid = name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
    return memcalc.estimate(fsdp=name, fsdp_version=1 if c.framework == "fsdp1" else 2,
                            shard_group=c.world // 2 if hybrid else None, **kw)  # fmt: skip


def held(r: memcalc.Estimate) -> dict[str, int]:
    rows = {x.key: x.bytes for x in r.memory.per_gpu.rows}
    zero3 = r.strategy.name == "zero-3"
    return {"parameters": rows["parameters"], "gradients": rows["gradients"],
            "optimizer states": rows["optimizer_moments"] + rows["optimizer_steps"],
            "DDP buckets": rows.get("gradient_buckets", 0), "fp32 master": rows.get("master_weights", 0),
            "ZeRO-3 live parameters": rows.get("gathered_parameters", 0) if zero3 else 0}  # fmt: skip


def measured_held(m: RankResult, c: Config) -> dict[str, int]:
    lp = 2 if c.mixed_precision else 4  # DeepSpeed counts live parameters in elements of the training dtype
    return {"parameters": m.parameter_bytes, "gradients": m.gradient_bytes, "optimizer states": m.optimizer_bytes,
            "DDP buckets": m.bucket_bytes, "fp32 master": m.master_bytes,
            "ZeRO-3 live parameters": m.live_peak_elements * lp}  # fmt: skip


def payloads(r: memcalc.Estimate) -> Counter[tuple[str, str, int, str]]:
    out: Counter[tuple[str, str, int, str]] = Counter()
    for x in r.communication.collectives:
        out[(x.op, x.phase, x.group_size, x.dtype)] += x.payload_bytes
    return out


def collective_key(x: Collective) -> tuple[str, str, int, str]:
    """(op, phase, group size, dtype) of a measured collective, in memcalc's words."""
    return (OPS[x.op], x.phase, x.group_size, DTYPES.get(x.dtype, x.dtype))


SCALAR = 8
"""Bytes at or under which a collective is bookkeeping (DeepSpeed's gradient norm, overflow flag): not modelled."""


def measured_payloads(m: RankResult) -> Counter[tuple[str, str, int, str]]:
    out: Counter[tuple[str, str, int, str]] = Counter()
    for x in m.collectives:
        if x.payload_bytes > SCALAR:
            out[collective_key(x)] += x.payload_bytes
    return out


@dataclass(frozen=True)
class Row:
    config: str
    quantity: str
    predicted: int
    measured: int

    @property
    def match(self) -> bool:
        return self.predicted == self.measured


def compare(c: Config, ranks: list[RankResult] | None = None) -> list[Row]:
    """Predicted against measured on rank 0 (the most loaded rank, which memcalc reports)."""
    ranks = ranks if ranks is not None else run(c)
    r = estimate(c)
    m = ranks[0]
    got = measured_held(m, c)
    rows = [Row(c.name, k, v, got[k]) for k, v in held(r).items() if v or got[k]]
    want, got = payloads(r), measured_payloads(m)
    for key in sorted(set(want) | set(got)):
        op, phase, n, dtype = key
        rows.append(Row(c.name, f"{op} {phase} ({dtype}, group {n})", want.get(key, 0), got.get(key, 0)))
    return rows
