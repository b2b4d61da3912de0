"""The job ``memcalc plan`` is asked for, validated once: counts, GPUs, prices, the global batch, the model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memcalc.errors import InputError, did_you_mean, shown
from memcalc.inputs.arguments import flag
from memcalc.planning.space import PLAN_FRAMEWORKS, SEARCHED, SPACES
from memcalc.report.planned import PlanJob


MAX_GPUS = 1 << 20


MODEL_KEYS = ("params", "model", "hf_config", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab")


OBJECTIVES = ("time", "cost", "memory")


def parse_gpus(value: int | str | Sequence[int]) -> list[int]:
    """``64``, ``64,128,256`` or ``32..512`` (the powers of two from 32 to 512)."""
    if isinstance(value, bool):
        raise InputError(f"--gpus {shown(value)} is not accepted; accepted: a count, a list 64,128 or a range 32..512")
    if isinstance(value, int):
        counts = [value]
    elif isinstance(value, str) and ".." in value:
        lo, _, hi = value.partition("..")
        a, b = _whole("--gpus", lo), _whole("--gpus", hi)
        counts = [1 << k for k in range(max(a, 1).bit_length() - 1, b.bit_length()) if a <= 1 << k <= b]
        if not counts:
            raise InputError(f"--gpus {value} holds no power of two; accepted: a range such as 32..512")
    elif isinstance(value, str):
        counts = [_whole("--gpus", x) for x in value.split(",") if x.strip()]
    elif isinstance(value, Sequence):
        counts = [_whole("--gpus", x) for x in value]
    else:
        raise InputError(f"--gpus {shown(value)} is not accepted; accepted: a count, a list 64,128 or a range 32..512")
    if not counts or any(n < 1 or n > MAX_GPUS for n in counts):
        raise InputError(f"--gpus {shown(value)}: every count must be from 1 to {MAX_GPUS:,}")
    return sorted(set(counts))


def _whole(name: str, x: object) -> int:
    s = x.strip() if isinstance(x, str) else x
    if isinstance(s, str) and s.isdigit() and len(s) < 10:
        return int(s)
    if isinstance(s, int) and not isinstance(s, bool):
        return s
    forms = "a count (64), a list (64,128) or a range of powers of two (32..512)" if name == "--gpus" else \
        "a whole number of 1 or more"
    raise InputError(f"{name} {shown(x)} is not a whole number; accepted: {forms}")


def _names(value: str | Sequence[str] | None, default: Sequence[str]) -> list[str]:
    if value is None:
        return list(default)
    items = value.split(",") if isinstance(value, str) else list(value)
    return [x.strip() for x in items if isinstance(x, str) and x.strip()] or list(default)


def parse_prices(price: float | str | dict | None, gpus: list[str]) -> dict[str, float]:
    """One price for every GPU, or ``h100=2.5,b200=5.0`` (GPU names or aliases, each one of the searched GPUs)."""
    from memcalc.inputs.presets import load_gpu

    if price is None:
        return {}
    if isinstance(price, (int, float)) and not isinstance(price, bool):
        pairs = {g: float(price) for g in gpus}
    elif isinstance(price, str) and "=" not in price:
        try:
            pairs = {g: float(price) for g in gpus}
        except ValueError:
            raise InputError(f"--price {shown(price)} is not accepted; accepted: 2.5, or h100=2.5,b200=5.0") from None
    else:
        items = price.items() if isinstance(price, dict) else (p.partition("=")[::2] for p in str(price).split(","))
        pairs = {}
        for name, v in items:
            key = load_gpu(str(name).strip()).key
            if key not in gpus:
                raise InputError(f"--price names {name!s}, which is not among the GPUs searched ({', '.join(gpus)})")
            try:
                pairs[key] = float(v)
            except (TypeError, ValueError):
                raise InputError(f"--price {name}={v!s} is not a number") from None
    for k, v in pairs.items():
        if not math.isfinite(v) or v < 0:
            raise InputError(f"--price {k}={v} must be a non-negative number")
    return pairs


def _global_batch(seq_len: int, global_batch: int | None, tokens: float | str | None) -> int:
    if (global_batch is None) == (tokens is None):
        raise InputError("give the global batch: --global-batch N (sequences) or --global-batch-tokens 1M, one of them")
    if global_batch is not None:
        b = _whole("--global-batch", global_batch)
    else:
        from memcalc.units import parse_count

        t = parse_count(tokens, "--global-batch-tokens")  # type: ignore[arg-type]
        binary = _binary(tokens)
        if t % seq_len and binary is not None and binary % seq_len == 0:
            t = binary
        if t % seq_len:
            raise InputError(f"--global-batch-tokens {t:,} is not a whole number of sequences of {seq_len:,} tokens; "
                             f"accepted: a multiple of --seq-len, e.g. {max(1, t // seq_len) * seq_len:,}")
        b = int(t // seq_len)
    if b < 1:
        raise InputError(f"--global-batch {b} must be 1 or more sequences")
    return b


def _binary(tokens: object) -> int | None:
    """``1M`` read as 2^20 tokens (how batch sizes in tokens are quoted: Llama 2's "4M tokens" is 1,024 x 4,096)."""
    if not isinstance(tokens, str) or not tokens.strip() or tokens.strip()[-1].lower() not in "kmgb":
        return None
    power = {"k": 10, "m": 20, "g": 30, "b": 30}[tokens.strip()[-1].lower()]
    try:
        return int(float(tokens.strip()[:-1]) * (1 << power))
    except ValueError:
        return None


def read_job(params: Any, seq_len: Any, global_batch: Any, global_batch_tokens: Any, gpus: Any, gpu: Any,
             gpus_per_node: Any, framework: Any, objective: Any, tokens: Any, price: Any, top: Any,
             fixed: dict) -> tuple[PlanJob, Any, dict, dict, dict, dict]:  # fmt: skip
    """The job, validated once: (job, architecture, the model's keywords, the held ones, the passed-through ones,
    each GPU's argument by its key: the preset's key, or the path of the user's file)."""
    import inspect

    from memcalc.inputs.arguments import check_names
    from memcalc.inputs.build import DEFAULT_GPU, build_input, resolve_architecture
    from memcalc.inputs.presets import load_gpu
    from memcalc.units import parse_count

    accepted = [n for n in inspect.signature(build_input).parameters if n not in ("gpus", "gpu", "tokens")]
    check_names("plan", fixed, accepted)
    if objective not in OBJECTIVES:
        raise InputError(f"--objective {shown(objective)} is not accepted{did_you_mean(str(objective), OBJECTIVES)}; "
                         f"accepted: {', '.join(OBJECTIVES)}")
    if seq_len is None:
        raise InputError("memcalc plan needs --seq-len (the tokens of one sequence)")
    seq = _whole("--seq-len", seq_len)
    if seq < 1:
        raise InputError(f"--seq-len {seq} must be 1 or more")
    top_n = _whole("--top", top)
    if top_n < 1:
        raise InputError(f"--top {top_n} must be 1 or more")
    per_node = _whole("--gpus-per-node", gpus_per_node)
    if per_node < 1:
        raise InputError(f"--gpus-per-node {per_node} must be 1 or more")
    batch = _global_batch(seq, global_batch, global_batch_tokens)
    counts = parse_gpus(gpus)
    records = {}
    for g in _names(gpu, [DEFAULT_GPU]):
        rec = load_gpu(g)
        records.setdefault(rec.key, g if g.endswith(".toml") else rec.key)
    keys = list(records)
    for k in records.values():
        _timed_gpu(k)
    frameworks = _frameworks(framework)
    if fixed.get("grad_reduce_dtype") is not None and frameworks != ["megatron"]:
        raise InputError(f"--grad-reduce-dtype {shown(fixed['grad_reduce_dtype'])} is Megatron-Core's gradient buffer "
                         f"dtype: give --framework megatron (searching {', '.join(frameworks)})")
    prices = parse_prices(price, keys)
    if objective == "cost" and set(prices) != set(keys):
        raise InputError("--objective cost needs a price per GPU-hour for every GPU searched: --price 2.5, or "
                         f"--price {','.join(f'{k}=...' for k in keys)}")
    n_tokens = None if tokens is None else float(parse_count(tokens, "--tokens"))
    model_args = {k: fixed.pop(k) for k in MODEL_KEYS if fixed.get(k) is not None}
    if params is not None:
        model_args["params"] = params
    shape = {k: model_args.get(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
    arch = resolve_architecture(model_args.get("model"), model_args.get("hf_config"), **shape)
    if arch is None:
        raise InputError("memcalc plan needs the model's shape: give --model, --hf-config or --layers/--hidden/"
                         "--heads/--vocab (a bare --params has no layers to lay out)")
    held = {k: fixed.pop(k) for k in SEARCHED if fixed.get(k) is not None and fixed.get(k) is not False}
    for k in ("tp", "pp", "cp", "ep", "virtual_stages", "micro_batch", "grad_accum", "fsdp_version"):
        if k in held:
            held[k] = _whole(flag(k), held[k])
    passthrough = {k: v for k, v in fixed.items() if v is not None}
    from memcalc.model.params import model_params

    job = PlanJob(model=arch.name or "custom", parameters=model_params(arch).total, seq_len=seq, global_batch=batch,
                  tokens_per_step=seq * batch, gpus=counts, gpu=keys, gpus_per_node=per_node, frameworks=frameworks,
                  objective=objective, tokens=n_tokens, prices=prices,
                  fixed={**held, **{k: v for k, v in passthrough.items() if isinstance(v, (int, float, str, bool))}})
    return job, arch, model_args, held, passthrough, records


def _timed_gpu(key: str) -> None:
    """The planner ranks by step time: a GPU without one is refused in one line."""
    from memcalc.time.datasheet import gpu_machine

    try:
        gpu_machine(key)
    except InputError as e:
        raise InputError(f"--gpu {key} has no step time, which memcalc plan ranks by ({' '.join(str(e).split())})") \
            from None


def _frameworks(value: str | Sequence[str]) -> list[str]:
    names = [n.lower() for n in _names(value, ["any"])]
    if "any" in names:
        return list(PLAN_FRAMEWORKS)
    for n in names:
        if n not in SPACES:
            raise InputError(f"--framework {shown(n)} is not one memcalc plan searches{did_you_mean(n, SPACES)}; "
                             f"accepted: {', '.join(PLAN_FRAMEWORKS)} or any")
    return list(dict.fromkeys(names))
