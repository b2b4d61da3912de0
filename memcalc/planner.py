"""``memcalc.plan``: the fastest (or cheapest, or smallest) plans that fit one job, searched.

The edge of the search: the user's job validated once, every candidate setting validated by ``build_input`` (what
memcalc or the framework refuses is counted with its reason), the search run on plain plans
(``memcalc.planning.search``), and each plan it returns estimated again exactly as ``memcalc estimate`` would, so that
its ``estimate_args`` reproduce its figures.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from memcalc.errors import InputError, did_you_mean, shown
from memcalc.inputs.arguments import flag
from memcalc.planning import search as S
from memcalc.planning.space import PLAN_FRAMEWORKS, SEARCHED, SPACES, Shape, micro_batches, settings
from memcalc.report.planned import Miss, PlanJob, PlanLayout, PlanMemory, PlannedRun, PlanResult, PlanTime

MAX_CANDIDATES = 1_000_000
"""A search larger than this asks for a narrower one instead of running for minutes."""
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
    raise InputError(f"{name} {shown(x)} is not a whole number")


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


def _cli_args(model_args: dict, kwargs: dict) -> list[str]:
    """``memcalc estimate`` arguments for these keywords (a flag per keyword; True as a bare flag)."""
    out: list[str] = []
    for k, v in {**model_args, **kwargs}.items():
        if v is False and k in ("compile_loss", "zero_init"):
            out.append("--no-" + k.replace("_", "-"))
        if v is None or v is False:
            continue
        out += [flag(k)] if v is True else [flag(k), str(v)]
    return out


def plan(params: Any = None, *, seq_len: int | None = None, global_batch: int | None = None,
         global_batch_tokens: float | str | None = None, gpus: int | str | Sequence[int] = 8,
         gpu: str | Sequence[str] | None = None, gpus_per_node: int = 8, framework: str | Sequence[str] = "any",
         objective: str = "time", tokens: float | str | None = None, price: float | str | dict | None = None,
         top: int = 10, **fixed: Any) -> PlanResult:  # fmt: skip
    """The ``top`` best plans that fit one job: ``memcalc.plan(model="llama-3-70b", seq_len=8192, global_batch=128,
    gpus=64, gpu="h100")``. Any other ``memcalc.estimate`` keyword holds its dimension fixed (``tp=8``,
    ``recompute="full"``, ``stage=3``) or applies to every candidate (``attention``, ``lora_rank``, ...)."""
    t0 = time.perf_counter()
    job, arch, model_args, held, passthrough, gpu_args = _job(params, seq_len, global_batch, global_batch_tokens, gpus, gpu,
                                                    gpus_per_node, framework, objective, tokens, price, top, fixed)
    reasons: Counter[str] = Counter()
    offload = False
    groups = _groups(job, arch, held, passthrough, reasons, gpu_args, offload=False)
    out, candidates = _search(groups, job, top)
    if not out.kept and not any(k in held for k in ("stage", "fsdp", "ddp", "strategy")):
        more = _groups(job, arch, held, passthrough, reasons, gpu_args, offload=True)
        if more:
            offload = True
            out2, cands2 = _search(more, job, top)
            out2.evaluated += out.evaluated
            out2.misses += out.misses
            out, candidates = out2, candidates + cands2
    reasons.update(out.refused)
    free = _unheld(job, arch, held, passthrough, gpu_args, model_args)
    seconds = time.perf_counter() - t0
    result = _result(job, model_args, passthrough, out, candidates, reasons, offload, seconds)
    if free is None:
        return result
    return result.model_copy(update={"unheld_best": free, "notes": result.notes + _unheld_note(result, free, held)})


def _unheld(job: PlanJob, arch: Any, held: dict, passthrough: dict, gpu_args: dict,
            model_args: dict) -> PlannedRun | None:  # fmt: skip
    """With dimensions held, the best plan of the free search too (what holding them costs)."""
    layout_keys = [k for k in held if k not in ("precision",)]
    if not layout_keys:
        return None
    out, _ = _search(_groups(job, arch, {}, passthrough, Counter(), gpu_args, offload=False), job, 1)
    return _run(0, out.kept[0], job, model_args) if out.kept else None


def _unheld_note(res: PlanResult, free: PlannedRun, held: dict) -> list[str]:
    given = " ".join(f"{flag(k)} {v}" if v is not True else flag(k) for k, v in held.items())
    if not res.plans:
        return [f"held to {given}, nothing fits; without it: {_describe(free)}"]
    best, key = res.plans[0], {"time": "step_s", "cost": "cost", "memory": None}[res.job.objective]
    if key is None:
        a, b, what = best.memory.peak_reserved, free.memory.peak_reserved, "memory"
    else:
        a, b, what = getattr(best.time, key), getattr(free.time, key), "step" if key == "step_s" else "cost"
    if a is None or b is None or b >= a:
        return [f"held to {given}: no free plan does better by the objective"]
    differs = [name for name, x, y in (("framework", best.framework, free.framework),
                                       ("layout", best.layout, free.layout), ("strategy", best.strategy, free.strategy),
                                       ("recompute", best.recompute, free.recompute),
                                       ("micro-batch", best.micro_batch, free.micro_batch)) if x != y]  # fmt: skip
    return [f"held to {given}: the free search's best is {100 * (a / b - 1):.1f} % better by {what} "
            f"({_describe(free)}; it differs in {', '.join(differs) or 'nothing shown'}; bound by {free.bound}, the "
            f"held plan by {best.bound})"]


def _describe(r: PlannedRun) -> str:
    return (f"{r.gpus} x {r.gpu} {r.framework} {_layout(r)} {r.strategy} recompute {r.recompute} micro-batch "
            f"{r.micro_batch} x {r.grad_accum}, {r.time.step_s:.3f} s per step")


def _job(params: Any, seq_len: Any, global_batch: Any, global_batch_tokens: Any, gpus: Any, gpu: Any,
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


def _settings(job: PlanJob, arch: Any, held: dict, offload: bool,
              gpu_args: dict) -> Iterable[tuple[str, int, str, dict, list]]:  # fmt: skip
    """(gpu, count, framework, estimate keywords, micro-batch pairs) of every candidate setting."""
    shape = Shape(layers=arch.layers, experts=arch.experts)
    for gpu in (gpu_args[k] for k in job.gpu):
        for n in job.gpus:
            for fw in job.frameworks:
                for kw in settings(fw, n, job.gpus_per_node, shape, held, offload=offload):
                    dp = n // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
                    pairs = micro_batches(job.global_batch, dp, kw.get("pp", 1), kw.get("virtual_stages", 1), held)
                    yield gpu, n, fw, kw, pairs


def _groups(job: PlanJob, arch: Any, held: dict, passthrough: dict, reasons: Counter, gpu_args: dict,
            offload: bool) -> list[S.Group]:  # fmt: skip
    """Every candidate setting validated by ``build_input`` once (at its first micro-batch pair)."""
    from memcalc.inputs.plan import to_plan
    from memcalc.inputs.build import build_input

    every = list(_settings(job, arch, held, offload, gpu_args))
    key_of = {arg: key for key, arg in gpu_args.items()}
    total = sum(len(p) for *_, p in every)
    if total > MAX_CANDIDATES:
        raise InputError(f"this search has {total:,} candidates, more than {MAX_CANDIDATES:,}: narrow it (fewer --gpus "
                         "or --gpu, one --framework, or hold --tp, --pp or --recompute fixed)")
    if every and total == 0:
        raise InputError(f"--global-batch {job.global_batch}: no layout of {', '.join(map(str, job.gpus))} GPUs divides "
                         "it into micro-batch x accumulation x data-parallel size (a pipeline also needs at least pp "
                         "micro-batches); accepted: a global batch that a data-parallel size divides, e.g. "
                         f"{max(job.gpus) * max(1, job.global_batch // max(job.gpus))}")
    groups = []
    for gpu, n, fw, kw, pairs in every:
        if not pairs:
            reasons["no micro-batch x accumulation x dp makes the global batch (or fills the pipeline)"] += 1
            continue
        args = _estimate_kwargs(job, fw, gpu, n, kw, passthrough)
        try:
            plan = to_plan(build_input(model=arch, micro_batch=pairs[0][0], grad_accum=pairs[0][1], **args))
        except InputError as e:
            reasons[_reason(str(e))] += len(pairs)
            continue
        groups.append(S.Group(gpu, n, fw, args, plan, tuple(pairs), job.prices.get(key_of[gpu])))
    return groups


def _estimate_kwargs(job: PlanJob, fw: str, gpu: str, n: int, kw: dict, passthrough: dict) -> dict:
    precision = passthrough.get("precision", SPACES[fw].precision)
    return {**passthrough, **kw, "seq_len": job.seq_len, "gpus": n, "gpu": gpu, "gpus_per_node": job.gpus_per_node,
            "framework": fw, "precision": precision}


def _reason(message: str) -> str:
    """A refusal's reason without its numbers, so that alike refusals count together."""
    import re

    return re.sub(r"\d[\d,._]*", "N", message.split(";")[0])[:160]


def _search(groups: list[S.Group], job: PlanJob, top: int) -> tuple[S.Outcome, list[S.Candidate]]:
    from memcalc.time.estimate import time_fields

    candidates = [c for g in groups for c in S.timed(g, time_fields)]
    return S.search(candidates, job.objective, top), candidates


def _run(rank: int, c: S.Candidate, job: PlanJob, model_args: dict) -> PlannedRun:
    """One candidate estimated again as ``memcalc estimate`` estimates its arguments."""
    from memcalc.api import estimate_from_input
    from memcalc.inputs.build import build_input

    g = c.group
    timing = {"tokens": job.tokens, "price_per_gpu_hour": g.price if job.tokens is not None else None}
    kwargs = {**g.kwargs, "micro_batch": c.micro_batch, "grad_accum": c.grad_accum,
              **{k: v for k, v in timing.items() if v is not None}}
    inp_args = {**kwargs, **({"model": g.plan.arch} if True else {})}
    e = estimate_from_input(build_input(**inp_args))
    t, pg, tr = e.time, e.memory.per_gpu, e.training
    assert t is not None  # every candidate was timed
    return PlannedRun(
        rank=rank, gpu=e.input.gpu.key, gpus=g.gpus, framework=g.framework,
        layout=PlanLayout(dp=tr.dp, tp=tr.tp, pp=tr.pp, cp=tr.cp, ep=tr.ep, virtual_stages=tr.virtual_stages),
        strategy=_strategy(e.strategy.name, g), recompute=kwargs.get("recompute", "none"), micro_batch=c.micro_batch,
        grad_accum=c.grad_accum, accounting=e.accounting,
        memory=PlanMemory(peak_allocated=pg.peak_allocated, peak_reserved=pg.peak_reserved,
                          verdict=e.memory.fit.verdict, headroom_bytes=e.memory.fit.headroom_bytes),
        time=PlanTime(step_s=t.step_s, tokens_per_s_per_gpu=t.tokens_per_s_per_gpu, mfu=t.mfu,
                      time_to_train_s=t.time_to_train_s, cost=t.cost),
        bound=c.bound, estimate_args=_cli_args(model_args, kwargs))


def _strategy(name: str, g: S.Group) -> str:
    """The strategy as the framework's users name it: FSDP1/FSDP2 FULL_SHARD, ZeRO-3, DDP, the distributed
    optimizer (Megatron-LM's ``--use-distributed-optimizer``, memcalc's ZeRO-1 under ``--framework megatron``)."""
    p = g.plan
    if p.spec.framework == "fsdp":
        base = f"FSDP{p.fsdp_version} {name}"
    elif name == "zero-1" and g.framework == "megatron":
        base = "distributed optimizer"
    elif name.startswith("zero-") and name != "zero-0":
        base = "ZeRO-" + name[-1]
    else:
        base = "DDP"
    mods = [f"+opt-{p.offload_optimizer}"] if p.offload_optimizer != "none" else []
    mods += [f"+param-{p.offload_params}"] if p.offload_params != "none" else []
    return base + "".join(mods)


def _result(job: PlanJob, model_args: dict, passthrough: dict, out: S.Outcome, candidates: list[S.Candidate],
            reasons: Counter, offload: bool, seconds: float) -> PlanResult:  # fmt: skip
    runs = {id(c): _run(i + 1, c, job, model_args) for i, c in enumerate(out.kept)}
    best = []
    for c in out.best_per_bucket.values():
        if id(c) not in runs:
            runs[id(c)] = _run(0, c, job, model_args)
        best.append(runs[id(c)])
    best.sort(key=lambda r: (job.gpu.index(r.gpu), r.gpus))
    plans = [runs[id(c)] for c in out.kept]
    every = plans + best
    fastest = min(every, key=lambda r: r.time.step_s, default=None)
    priced = [r for r in every if r.time.cost is not None]
    cheapest = min(priced, key=lambda r: r.time.cost, default=None)  # type: ignore[arg-type, return-value]
    miss = _closest_miss(out, job, model_args)
    paper = sum(1 for c in candidates if c.plan.accounting == "paper")
    notes = _notes(job, plans, out, paper, offload, miss)
    checked = sum(1 for c in candidates if c.verdict is not None)
    return PlanResult(job=job, evaluated=out.evaluated, feasible=sum(1 for c in candidates if c.verdict == "fits"),
                      checked=checked, replays=out.replays, paper_accounted=paper, not_runnable=dict(reasons.most_common()),
                      seconds=round(seconds, 4), candidates_per_s=round(out.evaluated / max(seconds, 1e-9), 1),
                      plans=plans, best_per_gpu=best, fastest=fastest, cheapest=cheapest, closest_miss=miss,
                      offload=offload, notes=notes)


def _closest_miss(out: S.Outcome, job: PlanJob, model_args: dict) -> Miss | None:
    """The checked candidate that comes closest to fitting: least over the GPU (its exact estimate)."""
    seen = [c for c in out.misses if c.exact] or [c for c in out.misses if c.peak is not None]
    if not seen:
        return None
    c = min(seen, key=lambda c: (c.peak - c.plan.usable_bytes, c.step_s))  # type: ignore[operator]
    run = _run(0, c, job, model_args)
    usable = run.memory.headroom_bytes
    return Miss(plan=run, over_bytes=-usable)


def _notes(job: PlanJob, plans: list[PlannedRun], out: S.Outcome, paper: int, offload: bool,
           miss: Miss | None) -> list[str]:  # fmt: skip
    notes = []
    if plans:
        w = plans[0]
        notes.append(f"the winner's step is bound by {w.bound}")
    elif miss is not None:
        m = miss.plan
        notes.append(f"no plan fits; the closest, {m.framework} {_layout(m)} {m.strategy} recompute {m.recompute} "
                     f"micro-batch {m.micro_batch}, is {miss.over_bytes / 2**30:.2f} GiB over: try more GPUs, a GPU "
                     "with more memory, offload, or a shorter sequence")
    else:
        notes.append("no plan fits, and no candidate could be laid out: try other GPU counts or a global batch that "
                     "more data-parallel sizes divide")
    if offload and plans:
        notes.append("nothing fits without offload: the plans offload optimizer states or parameters to the host")
    elif offload:
        notes.append("offload was searched too (optimizer states and parameters on the host): nothing fits with it")
    if paper:
        notes.append(f"{paper:,} candidates are answered by the paper accounting (the realistic one does not model "
                     "their layout yet: Megatron-LM's layers, pipeline or context parallelism without FSDP, ...); "
                     "their verdicts are the paper's")
    return notes


def _layout(r: PlannedRun) -> str:
    lay = r.layout
    parts = [f"dp {lay.dp}"] + [f"{k} {v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp),
                                                       ("ep", lay.ep), ("v", lay.virtual_stages)) if v > 1]
    return " x ".join(parts)
