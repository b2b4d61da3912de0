"""The loose keyword arguments of ``memcalc.estimate``/``compare``/``build_input``, checked before anything is built.

Each keyword has one accepted kind (a whole number within bounds, a finite size, a switch, a name from a list, or
one of the input records); anything else, an unknown keyword or a record given beside the loose flags it replaces,
is one ``InputError`` line naming the keyword, the value and what is accepted. Nothing is coerced: ``True`` is not
one GPU, ``0`` micro-batches is not one, ``"2"`` GiB is not a size.
"""

from __future__ import annotations

import re

import functools
import inspect
import math
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from memcalc.errors import InputError, did_you_mean, shown
from memcalc.inputs.workload import MAX_MICRO_BATCHES, Workload, megatron_recompute
from memcalc.inputs.hardware import GPU, MAX_GIB, MAX_GPUS, Cluster, Overheads
from memcalc.inputs.model import Model
from memcalc.inputs.strategy import MAX_BUFFER_FACTOR, Parallelism, Strategy
from memcalc.inputs.dtypes import Optimizer, Precision
from memcalc.model import architecture as shape
from memcalc.model.architecture import Architecture
from memcalc.units import gib, parse_count

Check = Callable[[Any], bool]


def _whole(lo: int, hi: int, why: str = "") -> tuple[Check, str]:
    return (lambda v: type(v) is int and lo <= v <= hi,
            f"a whole number from {lo:,} to {hi:,}{f' ({why})' if why else ''}")


def _size(lo: float, hi: float, lo_open: bool, what: str) -> tuple[Check, str]:
    def ok(v: Any) -> bool:
        return (type(v) in (int, float) and math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi)

    return ok, f"a finite number {'above' if lo_open else 'from'} {lo:g} {'up ' if lo_open else ''}to {hi:,.0f}{what}"


def _one_of(*names: str) -> tuple[Check, str]:
    return (lambda v: type(v) is str and v in names), ", ".join(names)


def _kind(*types: type, text: str, none: bool = False) -> tuple[Check, str]:
    return (lambda v: (none and v is None) or isinstance(v, types)), text


def _maybe(check: tuple[Check, str]) -> tuple[Check, str]:
    return (lambda v: v is None or check[0](v)), f"{check[1]}, or None"


_SWITCH = ((lambda v: type(v) is bool), "True or False")
_PATH = (str, os.PathLike)
_COUNT_TEXT = "a count such as 7e9, '7B' or 350_000_000"

CHECKS: dict[str, tuple[Check, str]] = {
    "params": _kind(int, float, str, Model, text=_COUNT_TEXT + ", a Model, or None", none=True),
    "gpus": ((lambda v: isinstance(v, Cluster) or _whole(1, MAX_GPUS)[0](v)),
             f"a whole number from 1 to {MAX_GPUS:,} (64x the largest published training run) or a Cluster"),
    "gpus_per_node": _whole(1, MAX_GPUS, "64x the largest published training run"),
    "stage": ((lambda v: v is None or type(v) is str or type(v) is int and 0 <= v <= 3), "0, 1, 2, 3, or None"),
    "fsdp": ((lambda v: v is None or type(v) is str or type(v) is int and 1 <= v <= 5),
             "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, 1-5, or None"),
    "overlap_comm": ((lambda v: v is None or type(v) is bool), "True, False or None"),
    "grad_reduce_dtype": ((lambda v: v is None or type(v) is str), "fp32, bf16, or None (the framework's)"),
    "defer_embedding_wgrad": _maybe(_whole(0, MAX_MICRO_BATCHES, "micro-batches; 0: every one")),
    "ddp": _SWITCH, "sequence_parallel": _SWITCH, "zero_init": _SWITCH, "bucket_view": _SWITCH,
    "strategy": _kind(str, Strategy, text="a strategy name such as 'zero-3+opt-cpu', a Strategy, or None", none=True),
    "offload_optimizer": _one_of("none", "cpu", "nvme"),
    "offload_params": _one_of("none", "cpu", "nvme"),
    "shard_group": _maybe(_whole(1, MAX_GPUS, "at most every GPU")),
    "gpu": _kind(*_PATH, GPU, text="a GPU name such as 'h100-sxm', the path of a .toml file, or a GPU"),
    "precision": _kind(str, Precision, text="a precision name such as 'bf16-mixed', a Precision, or None (the "
                                            "framework's own)", none=True),
    "optimizer": _kind(str, Optimizer, text="an optimizer name such as 'adamw', or an Optimizer"),
    "grad_accum": _maybe(_whole(1, MAX_MICRO_BATCHES, "680x GPT-3's whole batch")),
    "micro_batches": _maybe(_whole(1, MAX_MICRO_BATCHES, "680x GPT-3's whole batch")),
    "cuda_context_gib": _maybe(_size(0, MAX_GIB, False, " GiB (1 PiB)")),
    "reserve_gib": _maybe(_size(0, MAX_GIB, False, " GiB (1 PiB)")),
    "overheads": _kind(Overheads, text="an Overheads, or None", none=True),
    "model": _kind(str, Architecture, text="a model name such as 'llama-2-7b', a .toml path, an Architecture, or None",
                   none=True),
    "seq_len": _maybe(_whole(1, shape.MAX_POSITIONS, "1.6x the longest advertised context")),
    "micro_batch": _maybe(_whole(1, MAX_MICRO_BATCHES, "680x GPT-3's whole batch")),
    "recompute": ((lambda v: type(v) is str and (v in ("none", "selective", "full", "op-sac")
                                                  or re.fullmatch(r"every:[1-9][0-9]{0,4}", v) is not None
                                                  or megatron_recompute(v))),
                  "none, selective, full, every:K (every K-th layer checkpointed), op-sac, selective:MODULES, "
                  "full:uniform:N, full:block:N"),
    "loss": ((lambda v: type(v) is str and (v in ("standard", "fused")
                                             or re.fullmatch(r"chunked:[1-9][0-9]{0,3}", v) is not None)),
             "standard, chunked:N (N chunks, 1-9999), fused"),
    "optimizer_impl": _maybe(_one_of("foreach", "fused", "for-loop", "in-backward")),
    "attention": _maybe(_one_of("eager", "flash", "sdpa")),
    "dropout": _maybe(((lambda v: type(v) in (int, float) and 0 <= v < 1), "a number from 0 up to (not including) 1")),
    "device": _one_of("cuda", "cpu"),
    "tp": _whole(1, shape.MAX_HEADS, "tp divides the attention heads"),
    "pp": _whole(1, shape.MAX_LAYERS, "a pipeline stage holds at least one layer"),
    "cp": _whole(1, shape.MAX_POSITIONS, "cp divides the sequence"),
    "ep": _whole(1, shape.MAX_EXPERTS, "ep divides the experts"),
    "virtual_stages": _whole(1, shape.MAX_LAYERS, "a model chunk holds at least one layer"),
    "framework": ((lambda v: v is None or type(v) is str), "hf, torchtitan, torchtune, megatron, deepspeed, or None"),
    "shard_over": ((lambda v: v is None or type(v) is str), "dp, dp-cp, or None"),
    "stage_layers": ((lambda v: v is None or type(v) is str or (isinstance(v, (list, tuple))
                                                               and all(type(n) is int for n in v))),
                     "decoder layers per pipeline stage: '15,16,16,15', a list of whole numbers, or None"),
    "parallelism": _kind(Parallelism, text="a Parallelism, or None", none=True),
    "workload": _kind(Workload, text="a Workload, or None", none=True),
    "accounting": _one_of("auto", "realistic", "paper", "implementation", "deepspeed-estimator"),
    "buffer_factor": _size(0, MAX_BUFFER_FACTOR, True, " (DeepSpeed's default is 1.5)"),
    "largest_layer_params": _kind(int, float, str, text=_COUNT_TEXT + ", or None", none=True),
    "fsdp_version": ((lambda v: v is None or type(v) is int and v in (1, 2)), "1, 2, or None (the framework's)"),
    "fsdp_wrap": ((lambda v: v is None or type(v) is str), "root, separate, separate-reshard, or None"),
    "fsdp_auto_wrap": ((lambda v: v is None or type(v) is str), "transformer, none, or None"),
    "backward_prefetch": ((lambda v: v is None or type(v) is str), "pre, post, none, or None"),
    "min_num_params": _kind(int, float, str, text=_COUNT_TEXT + ", or None", none=True),
    "max_reuse_distance": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "max_live_parameters": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "prefetch_bucket_size": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "reduce_bucket_size": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "persistence_threshold": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "sub_group_size": _kind(int, float, str, text="a count of elements, 0 or more, or None", none=True),
    "zero3_step": _one_of("steady", "first"),
    "cluster": _kind(*_PATH, text="a cluster preset such as 'dgx-h100', the path of a .toml file, or None", none=True),
    "tokens": _kind(int, float, str, text="a count of tokens such as 2e12 or 15T, or None", none=True),
    "lora_rank": _maybe(_whole(1, 65_536, "LoRA's r; wider than any model's hidden size")),
    "lora_targets": ((lambda v: v is None or type(v) is str or (isinstance(v, (list, tuple))
                                                               and all(type(t) is str for t in v))),
                     "comma-separated projection names such as 'q,k,v,o' (q, k, v, o, gate, up, down), a list of "
                     "them, or None"),
    "quantize": _kind(str, text="none, nf4"),
    "float8": _kind(str, text="none, tensorwise, rowwise"),
    "float8_all_gather": _SWITCH,
    "compile": _SWITCH,
    "compile_loss": ((lambda v: v is None or type(v) is bool), "True, False or None (as the framework does)"),
}
"""Keywords of ``build_input`` checked here: (accepts?, what is accepted). The shape flags and ``hf_config`` are
checked where they are read (``resolve_architecture``, ``Architecture``, ``memcalc.model.hf_config.read_bounded``)."""

# A record replaces loose flags; a flag given beside it (not at its default) would be dropped, so it is refused.
REPLACES = {
    "parallelism": ("tp", "pp", "cp", "ep", "sequence_parallel", "virtual_stages", "framework", "shard_over",
                    "stage_layers"),
    "workload": ("seq_len", "micro_batch", "recompute", "attention", "dropout", "device", "loss", "optimizer_impl",
                 "compile", "compile_loss"),
    "overheads": ("cuda_context_gib", "reserve_gib"),
}
# Activation settings that mean nothing without a sequence length (they would be ignored).
NEEDS_SEQ_LEN = {"recompute": "none", "attention": None, "device": "cuda", "loss": "standard"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_names(function: str, given: Iterable[str], accepted: Iterable[str]) -> None:
    """Every keyword is one ``function`` takes, else one line naming it, a close name, and the accepted ones."""
    accepted = list(accepted)
    for name in given:
        if name not in accepted:
            raise InputError(f"{function}() has no keyword {shown(name)}{did_you_mean(str(name), accepted)}; "
                             f"accepted: {', '.join(accepted)}")


def check_values(values: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Each keyword's value has its accepted kind, and no record is given beside a flag it replaces."""
    for name, value in values.items():
        check = CHECKS.get(name)
        if check is not None and not check[0](value):
            raise InputError(f"{flag(name)} {shown(value)} is not accepted; accepted: {check[1]}")
    for record_name, flags in REPLACES.items():
        if values.get(record_name) is None:
            continue
        for f in flags:
            if f in values and values[f] != defaults.get(f):
                raise InputError(f"{flag(f)} {shown(values[f])} cannot be combined with {record_name}=; "
                                 f"accepted: set it in the {record_name} record, or drop {record_name}=")
    if isinstance(values.get("gpus"), Cluster) and values.get("gpus_per_node", 8) != defaults.get("gpus_per_node", 8):
        raise InputError(f"--gpus-per-node {shown(values['gpus_per_node'])} cannot be combined with a Cluster; "
                         "accepted: set gpus_per_node in the Cluster")
    if isinstance(values.get("params"), Model):
        given = [k for k in ("model", "hf_config", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
                 if values.get(k) is not None]
        if given:
            raise InputError(f"{flag(given[0])} cannot be combined with a Model; accepted: one of the two")
    if values.get("seq_len") is None and values.get("workload") is None:
        for name, default in NEEDS_SEQ_LEN.items():
            if values.get(name, default) != default:
                raise InputError(f"{flag(name)} {values[name]} needs --seq-len (activations are counted per sequence); "
                                 f"accepted without it: {'leave it out' if default is None else default}")


F = TypeVar("F", bound=Callable[..., Any])
def keywords(accepted: Callable[[], Iterable[str]] | None = None, values: bool = True) -> Callable[[F], F]:
    """The model size as the one positional argument, every other argument a keyword the function accepts."""

    def wrap(fn: F) -> F:
        params = inspect.signature(fn).parameters
        defaults = {k: p.default for k, p in params.items()}

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if len(args) > 1:
                raise InputError(f"{fn.__name__}() takes the model size as its only positional argument; got "
                                 f"{len(args)} positional values ({', '.join(shown(a, 20) for a in args)}); "
                                 "accepted: keywords for the rest")
            if args:
                if "params" in kwargs:
                    raise InputError(f"{fn.__name__}() got params twice (positionally and as params=); give it once")
                kwargs["params"] = args[0]
            names = list(accepted()) if accepted is not None else list(params)
            check_names(fn.__name__, kwargs, names)
            if values:
                check_values(kwargs, defaults)
            return fn(**kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def choice(flag: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise InputError(f"{flag} {value!r} is not accepted; accepted: {', '.join(accepted)}")


def elements(flag: str, value: int | float | str | None) -> int | None:
    """A count of elements that may be 0 (DeepSpeed's ZeRO-3 knobs), or None for DeepSpeed's default."""
    if value is None:
        return None
    if type(value) in (int, float) and value == 0 or type(value) is str and value.strip() in ("0", "0.0", "0e0"):
        return 0
    try:
        return parse_count(value, flag)
    except InputError:
        raise InputError(f"{flag} {value!r} is not accepted; give a count of elements, 0 or more, such as 0, 5e7 or 1e9") from None


def gib_arg(flag: str, value: float) -> int:
    if type(value) not in (int, float) or not 0 <= value <= MAX_GIB:  # also rejects NaN, inf and "2"
        raise InputError(f"{flag} {value!r} must be a finite size in GiB, 0 or more")
    return gib(value)

