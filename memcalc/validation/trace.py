"""A traced training step: the bytes a real step holds, op by op, on the CPU with no GPU and no weights.

``trace_step`` builds a Hugging Face model from its config.json under
``torch._subclasses.fake_tensor.FakeTensorMode`` (fake "cpu" tensors: shapes, dtypes and storage sizes, no data),
optionally shards it the way FSDP2 (``fully_shard``) and DTensor tensor parallelism do through torch's fake process
group (rank 0 of ``world``), and runs ``steps`` training steps while ``trace_tracker.LiveBytes`` counts live
storages. The last step is reported. What a trace cannot see (the caching allocator's rounding and reserve, kernel
workspaces, the CUDA context, NCCL buffers, the attention kernel a GPU picks) stays an analytic row on top.

    python -m memcalc.validation.trace --hf-config config.json --seq-len 2048 --precision amp-bf16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memcalc.errors import InputError
from memcalc.layout.compose import check_wrap
from memcalc.validation.trace_parallel import apply_layout, check_tp_heads, fake_process_group
from memcalc.validation.trace_step import (StepSpec, batch, build_model, build_optimizer,  # noqa: F401
                                           traced_steps)
from memcalc.validation.trace_tracker import LiveBytes, Trace  # noqa: F401


def _label(hf_config: dict, spec: StepSpec, world: int, fsdp: bool, tp: int, mp_bf16: bool) -> str:
    parts = [str(hf_config.get("model_type")), f"b{spec.micro_batch}xs{spec.seq_len}", spec.precision,
             spec.optimizer_impl, f"recompute={spec.recompute}", spec.attention]  # fmt: skip
    if world > 1 or fsdp:
        parts.append(f"world={world}" + (" fsdp2" if fsdp else "") + (" mp=bf16" if mp_bf16 else "") + f" tp={tp}")
    return " ".join(parts)


def _moe(hf_config: dict) -> bool:
    """The config's model has a mixture of experts (its shape as memcalc reads it; a config memcalc cannot read is
    left to transformers)."""
    from memcalc.model.hf_config import architecture_from_config

    try:
        return architecture_from_config(hf_config).moe
    except InputError:
        return False


def trace_step(hf_config: dict, *, seq_len: int, micro_batch: int = 1, precision: str = "fp32",
               optimizer_impl: str = "foreach", recompute: str = "none", attention: str = "sdpa", steps: int = 2,
               world: int = 1, fsdp: bool = False, tp: int = 1, fsdp_param_dtype: str | None = None,
               fake: bool = True, seed: int = 0, sequence_parallel: bool = False,
               loss_parallel: bool | None = None, capacity: int | None = None, float8: str = "none",
               float8_all_gather: bool = False, fsdp_wrap: str = "root", replicate: int = 1,
               reshard_after_forward: bool = True, fsdp_reduce_fp32: bool = False, fsdp_version: int = 2,
               backward_prefetch: str = "pre", layer_units: bool = True) -> Trace:
    """Trace the last of ``steps`` training steps of rank 0; ``fake=False`` runs the same step on real tensors.

    ``world`` ranks are ``world // tp`` data-parallel (FSDP2-sharded when ``fsdp``) × ``tp`` tensor-parallel.
    ``fsdp_param_dtype="bf16"`` adds FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``.
    ``sequence_parallel``: torchtitan's sequence-parallel TP plan (``trace_parallel._sp_plan``), with the loss under
    ``loss_parallel`` unless ``loss_parallel=False`` (None: as ``sequence_parallel``).
    ``float8``: torchao's ``convert_to_float8_training`` on every linear but the head (torchtitan's filter), with
    ``float8_all_gather`` its FSDP2 fp8 all-gather (needs torchao installed; the casts run eagerly).
    ``fsdp_wrap``: where the embedding and the head sit among FSDP2's units (``memcalc.layout.compose.FSDP_WRAPS``).
    ``replicate``: HSDP, the data-parallel ranks split into ``replicate`` groups of ``world // tp // replicate``
    that shard (FSDP2 on a 2-D mesh). ``reshard_after_forward`` False: the layers stay gathered from their forward
    to their backward (SHARD_GRAD_OP). ``fsdp_reduce_fp32``: gradients reduced in fp32 under
    ``fsdp_param_dtype="bf16"`` (torchtitan's ``mixed_precision_reduce``). ``fsdp_version`` 1: FSDP1's
    ``FullyShardedDataParallel`` as accelerate wraps a transformer (``trace_parallel.apply_layout``), its
    ``backward_prefetch`` pre (torch's default), post or none (accelerate's). ``layer_units`` False: accelerate's
    NO_WRAP, no unit per decoder layer (FSDP1: the model one FlatParameter; FSDP2: the layers in the root, the
    embedding and [final norm, head] carved as accelerate 1.15 does: ``fsdp_wrap`` separate, or root with tied
    embeddings for its [final norm, embedding, head] unit).
    ``capacity``: the bytes the caching allocator may reserve (the GPU's memory less the CUDA context); the replayed
    allocator then reports the first request the GPU could not serve (``Trace.oom_request``).
    """
    spec = StepSpec(seq_len, micro_batch, precision, optimizer_impl, recompute, attention)
    spec.check()
    if steps < 1:
        raise InputError(f"steps {steps} must be at least 1")
    if capacity is not None and capacity <= 0:
        raise InputError(f"capacity {capacity} must be a positive number of bytes")
    if world < 1 or tp < 1 or world % tp:
        raise InputError(f"tp({tp}) must divide world({world}); accepted: world = data-parallel × tp")
    if fsdp_param_dtype not in (None, "bf16"):
        raise InputError(f"fsdp_param_dtype {fsdp_param_dtype!r} is not supported; accepted: bf16 or None")
    if float8 not in ("none", "tensorwise", "rowwise"):
        raise InputError(f"float8 {float8!r} is not one of none, tensorwise, rowwise")
    check_wrap(fsdp_wrap)
    if fsdp_wrap != "root" and (not fsdp or hf_config.get("tie_word_embeddings", False)):
        raise InputError(f"fsdp_wrap {fsdp_wrap} needs fsdp and untied embeddings (the tied weight cannot sit in two "
                         "FSDP2 units)")
    if float8_all_gather and (float8 != "tensorwise" or not fsdp):
        raise InputError("float8_all_gather needs float8 'tensorwise' and fsdp (torchao's FSDP2 fp8 all-gather)")
    if sequence_parallel and tp < 2:
        raise InputError(f"sequence_parallel needs tp above 1; got tp {tp}")
    loss_parallel = sequence_parallel if loss_parallel is None else loss_parallel
    if loss_parallel and not sequence_parallel:
        raise InputError("loss_parallel is wired with sequence_parallel only (the head's vocabulary-sharded output)")
    dp = world // tp
    if replicate < 1 or dp % replicate or (replicate > 1 and not fsdp):
        raise InputError(f"replicate({replicate}) must divide dp({dp}) and needs fsdp (HSDP)")
    if fsdp_reduce_fp32 and fsdp_param_dtype != "bf16":
        raise InputError("fsdp_reduce_fp32 is a MixedPrecisionPolicy's reduce_dtype beside param_dtype bf16: give "
                         "fsdp_param_dtype='bf16'")
    if fsdp_version not in (1, 2):
        raise InputError(f"fsdp_version {fsdp_version!r} is not 1 or 2")
    if backward_prefetch not in ("pre", "post", "none") or (backward_prefetch != "pre" and fsdp_version != 1):
        raise InputError(f"backward_prefetch {backward_prefetch!r}: FSDP1's pre, post or none (with fsdp_version 1)")
    if fsdp_version == 1 and (tp > 1 or fsdp_reduce_fp32 or fsdp_wrap != "root" or float8 != "none"):
        raise InputError("fsdp_version 1 is traced with the root wrap, without tensor parallelism, fp32 reduction "
                         "or float8")
    if fsdp_version == 1 and not reshard_after_forward and fake:
        raise InputError("FSDP1 without resharding after forward (SHARD_GRAD_OP) checks its parameters' storages, "
                         "which fake tensors do not have: trace it with fake=False")
    if not layer_units and (not fsdp or tp > 1 or float8 != "none" or fsdp_wrap not in ("root", "separate") or (
            fsdp_version == 2 and (replicate > 1 or not reshard_after_forward
                                   or (fsdp_wrap == "root") != bool(hf_config.get("tie_word_embeddings"))))):
        raise InputError("NO_WRAP (--fsdp-auto-wrap none) is traced with --fsdp, without tensor parallelism or "
                         "float8, as accelerate 1.15 wraps it: FSDP2 FULL_SHARD with --fsdp-wrap separate (root with "
                         "tied embeddings), FSDP1 with root")
    if _moe(hf_config) and precision != "bf16" and fsdp_param_dtype != "bf16":
        raise InputError(f"precision {precision!r} with a mixture of experts: transformers' grouped_mm experts take "
                         "bf16 only; accepted: --precision bf16, or --fsdp with --fsdp-param-dtype bf16")
    if not reshard_after_forward and not fsdp:
        raise InputError("reshard_after_forward is FSDP2's: set fsdp")
    if dp > 1 and not fsdp:
        raise InputError(f"world({world}) = dp({dp}) × tp({tp}) without fsdp: replicated data parallelism holds "
                         "what one rank holds (plus DDP buckets); trace world=tp, or set fsdp")  # fmt: skip
    torch.manual_seed(seed)
    if tp > 1:
        check_tp_heads(hf_config, tp)
    with fake_process_group(world, tp, fsdp, replicate) as mesh, warnings.catch_warnings():
        # FSDP1 compares storages by data pointer, which fake tensors warn about (the comparison still holds)
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        with FakeTensorMode() if fake else contextlib.nullcontext():
            model = build_model(hf_config, spec)
            if float8 != "none":
                convert_float8(model, float8, float8_all_gather)
            if world > 1 or fsdp:
                model = apply_layout(model, mesh, dp=dp, tp=tp, fsdp=fsdp, mp_bf16=fsdp_param_dtype == "bf16",
                                     sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                                     fsdp_wrap=fsdp_wrap, replicate=replicate,
                                     reshard_after_forward=reshard_after_forward, reduce_fp32=fsdp_reduce_fp32,
                                     fsdp_version=fsdp_version, backward_prefetch=backward_prefetch,
                                     layer_units=layer_units)
            optimizer = build_optimizer(model, optimizer_impl)
            ids, pos = batch(hf_config, spec)
            tracker = traced_steps(model, optimizer, ids, pos, spec, steps, loss_parallel, capacity)
        label = _label(hf_config, spec, world, fsdp, tp, fsdp_param_dtype == "bf16")
        label += (" sp" + (" loss_parallel" if loss_parallel else "")) if sequence_parallel else ""
        label += "".join(part for part, on in ((f" hsdp={replicate}x{dp // replicate}", replicate > 1),
                                               (" no-reshard-after-forward", not reshard_after_forward),
                                               (" reduce=fp32", fsdp_reduce_fp32),
                                               (f" wrap={fsdp_wrap}", fsdp_wrap != "root"),
                                               (" no-wrap", not layer_units)) if on)
        if fsdp and fsdp_version == 1:
            label = label.replace(" fsdp2", " fsdp1", 1)
        result = tracker.result(label, tracker.seconds)
        del model, optimizer, ids, pos
    return result


def convert_float8(model: torch.nn.Module, recipe: str, all_gather: bool) -> None:
    """torchao float8 training as torchtitan applies it: every ``nn.Linear`` but the head becomes a ``Float8Linear``
    (torchao ``convert_to_float8_training``; torchtitan filters ``output``, Hugging Face's head is ``lm_head``)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise InputError("float8 tracing needs torchao: pip install torchao") from e
    config = (Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather) if recipe == "tensorwise"
              else Float8LinearConfig.from_recipe_name(recipe))
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: fqn != "lm_head")


def trace_summary(trace: Trace) -> dict:
    """Integer bytes to print beside an analytic estimate: peak, where it is, baseline and each phase's peak."""
    return {
        "label": trace.label,
        "baseline_bytes": int(trace.baseline),
        "peak_bytes": int(trace.peak),
        "peak_phase": trace.peak_phase,
        "peak_reserved_bytes": int(trace.peak_reserved),
        "oom": bool(trace.oom_request),
        "oom_request_bytes": int(trace.oom_request),
        "oom_free_bytes": int(trace.oom_free),
        "end_bytes": int(trace.end),
        "phase_peak_bytes": {k: int(v) for k, v in trace.phase_peaks.items()},
        "seconds": round(trace.seconds, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memcalc.validation.trace",
                                 description="Trace one training step's live bytes on fake tensors (no GPU, "
                                             "no weights) and print them as JSON.")  # fmt: skip
    ap.add_argument("--hf-config", required=True, help="a Hugging Face config.json")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--precision", default="fp32", help="fp32 | bf16 | amp-bf16")
    ap.add_argument("--optimizer", default="foreach", help="foreach | fused | for-loop")
    ap.add_argument("--recompute", default="none", help="none | full")
    ap.add_argument("--attention", default="sdpa", help="sdpa | eager")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--world", type=int, default=1, help="ranks (rank 0 is traced)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard per decoder layer and the root")
    ap.add_argument("--fsdp-param-dtype", default=None, help="bf16: MixedPrecisionPolicy(param_dtype=bf16)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (DTensor)")
    a = ap.parse_args(argv)
    try:
        cfg = json.loads(Path(a.hf_config).expanduser().read_text())
        trace = trace_step(cfg, seq_len=a.seq_len, micro_batch=a.micro_batch, precision=a.precision,
                           optimizer_impl=a.optimizer, recompute=a.recompute, attention=a.attention, steps=a.steps,
                           world=a.world, fsdp=a.fsdp, tp=a.tp, fsdp_param_dtype=a.fsdp_param_dtype)  # fmt: skip
    except (InputError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(trace_summary(trace), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
