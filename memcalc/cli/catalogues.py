"""The catalogues: ``memcalc gpus``, ``memcalc models``, ``memcalc strategies`` (tables, JSON, CSV or Markdown)."""

from __future__ import annotations

from typing import Any

from memcalc.cli.app import Command, app, output_format, run_or_fail, show_rows
from memcalc.cli.options import Format


def gpu_rows() -> list[dict[str, Any]]:
    from memcalc.inputs.presets import gpu_names, load_gpu
    from memcalc.time.datasheet import nearest
    from memcalc.time.hardware import calibration_names

    rows, calibrated = [], set(calibration_names())
    for key in gpu_names():
        g = load_gpu(key)
        rows.append({"name": key, "GPU": g.name, "memory GB": g.memory_gb, "usable GiB": g.usable_memory_gib,
                     "HBM GB/s": g.hbm_gbps, "BF16 TFLOPS": g.bf16_tflops,
                     "link GB/s": f"{g.intra_node_link} {g.intra_node_gbps:g}",
                     "step time": "own calibration" if key in calibrated else f"{nearest(g)[0]} curves",
                     "aliases": ", ".join(g.aliases)})
    return rows


def model_rows() -> list[dict[str, Any]]:
    from memcalc.inputs.presets import load_model, model_names
    from memcalc.model.params import model_params

    rows = []
    for key in model_names():
        a = load_model(key)
        rows.append({"name": key, "parameters": model_params(a).total, "layers": a.layers, "hidden": a.hidden,
                     "heads": a.heads, "kv": a.n_kv, "ffn": str(a.ffn_size) + (f" x{a.experts}" if a.moe else ""),
                     "vocab": a.vocab, "aliases": ", ".join(a.aliases)})
    return rows


def strategy_rows() -> list[dict[str, Any]]:
    from memcalc.layout.strategies import STRATEGIES

    yes = lambda b: "sharded" if b else "replicated"  # noqa: E731
    rows = []
    for s in STRATEGIES.values():
        offload = "-" if s.optimizer_offload == ("none",) and s.param_offload == ("none",) else (
            f"opt: {'/'.join(s.optimizer_offload[1:]) or '-'}, params: {'/'.join(s.param_offload[1:]) or '-'}")
        rows.append({"name": s.name, "framework": s.framework, "params": yes(s.shards_params),
                     "grads": yes(s.shards_grads), "optimizer": yes(s.shards_optimizer),
                     "group": "shard group" if s.hybrid else "data-parallel", "same as": s.same_as, "offload": offload})
    return rows


@app.command(cls=Command, epilog="Example: memcalc gpus --format markdown")
def gpus(fmt: Format = "table") -> None:
    """List the GPU presets."""
    run_or_fail(lambda: show_rows("GPU presets (--gpu NAME or alias)", gpu_rows(), output_format(fmt, False),
                                  right=("memory GB", "usable GiB", "HBM GB/s", "BF16 TFLOPS")))


@app.command(cls=Command, epilog="Example: memcalc models")
def models(fmt: Format = "table") -> None:
    """List the model presets with their exact parameter counts."""
    run_or_fail(lambda: show_rows("Model presets (--model NAME or alias)", model_rows(), output_format(fmt, False),
                                  right=("parameters", "layers", "hidden", "heads", "kv", "ffn", "vocab")))


@app.command(cls=Command, epilog="Example: memcalc strategies")
def strategies(fmt: Format = "table") -> None:
    """List the strategies and what each shards."""
    run_or_fail(lambda: show_rows("Strategies (--stage N, --fsdp NAME, --ddp, or --strategy NAME)", strategy_rows(),
                                  output_format(fmt, False)))
