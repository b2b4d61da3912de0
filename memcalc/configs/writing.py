"""An estimate (or a plan's best) written as the framework's own files: ``config_text`` and ``write_config``.

    >>> import memcalc
    >>> r = memcalc.plan(model="llama-3-8b", seq_len=4096, global_batch=32, gpus=16, gpu="h100")
    >>> memcalc.config_text(r)                       # {"torchtitan.toml": "...", "launch.sh": "...", ...}
    >>> memcalc.write_config(r, directory="run/")    # the same files, written

Each framework's files are built by ``memcalc.configs.write_frameworks``; before anything is returned they are read
back by memcalc's own reader of that framework (``--deepspeed``, ``--accelerate-config``, ``--torchtitan-config``,
``--megatron-args``) with the flags ``README.txt`` lists, and that estimate must give the same peak (byte for byte)
and step time. What a framework cannot hold is one ``InputError`` line, and nothing is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memcalc.configs.written import Written
from memcalc.errors import InputError
from memcalc.units import GiB

FRAMEWORKS = ("deepspeed", "accelerate", "torchtitan", "megatron")
ALIASES = {"hf": "accelerate", "huggingface": "accelerate", "trainer": "accelerate"}



def config_text(result: Any, framework: str | None = None) -> dict[str, str]:
    """The files that run ``result`` (an ``Estimate``, or a ``PlanResult``: its best plan) under ``framework``
    (``deepspeed``, ``accelerate``/``hf``, ``torchtitan``, ``megatron``; default: the estimate's own), file name ->
    text. Refuses, in one line, what the framework's files cannot express."""
    estimate = _estimate_of(result)
    written = _write(estimate, _framework(estimate, framework))
    _check_round_trip(estimate, written)
    return {**written.files, "launch.sh": _launch_sh(estimate, written), "README.txt": _readme(estimate, written)}


def write_config(result: Any, directory: str | os.PathLike[str], framework: str | None = None,
                 force: bool = False) -> list[Path]:  # fmt: skip
    """Write ``config_text(result, framework)`` into ``directory`` (made if missing); an existing file of the same
    name is refused unless ``force``. The files are written into a temporary folder beside it and moved in, so a
    refusal or a failure leaves nothing half-written. Returns the paths written."""
    files = config_text(result, framework)
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise InputError(f"{target}: not a directory; give a directory to write the config files into")
    clash = [n for n in files if (target / n).exists()]
    if clash and not force:
        raise InputError(f"{target / clash[0]} exists; pass --force (force=True) to overwrite it, or give another "
                         f"directory")  # fmt: skip
    parent = target.parent if not target.exists() else target
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".memcalc-", dir=parent))
    except OSError as e:
        raise InputError(f"{target}: cannot write there ({e.strerror or e})") from None
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "launch.sh").chmod(0o755)
        if not target.exists():
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the target is an ordinary one
            staging.rename(target)
        else:
            for name in files:
                os.replace(staging / name, target / name)
    except OSError as e:
        raise InputError(f"{target}: cannot write there ({e.strerror or e})") from None
    finally:
        if staging.exists() and staging != target:
            shutil.rmtree(staging, ignore_errors=True)
    return [target / n for n in files]


def _estimate_of(result: Any) -> Any:
    """An Estimate as it is; a PlanResult's best plan estimated again from its ``estimate_args``."""
    from memcalc.report.planned import PlannedRun, PlanResult
    from memcalc.report.results import Estimate

    if isinstance(result, Estimate):
        return result
    if isinstance(result, PlanResult):
        if not result.plans:
            raise InputError("no plan fits, so there are no files to write; try more GPUs, a GPU with more memory, or "
                             "a shorter sequence")  # fmt: skip
        result = result.plans[0]
    if isinstance(result, PlannedRun):
        from memcalc.api import estimate

        again = estimate(**arguments_of(result.estimate_args))
        if again.memory.per_gpu.peak_reserved != result.memory.peak_reserved:
            raise InputError(f"the plan's estimate_args do not reproduce its peak ({' '.join(result.estimate_args)}); "
                             "write the estimate instead")  # fmt: skip
        return again
    raise InputError(f"{type(result).__name__} is not accepted; accepted: an Estimate, a PlanResult or a PlannedRun")


def arguments_of(args: list[str]) -> dict[str, Any]:
    """``memcalc estimate`` flags (a plan's ``estimate_args``) as ``memcalc.estimate`` keywords."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        name = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            text = args[i + 1]
            out[name] = int(text) if text.isdigit() else _number(text)
            i += 2
        else:
            out[name[3:] if name.startswith("no_") else name] = not name.startswith("no_")
            i += 1
    return out


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _framework(estimate: Any, framework: str | None) -> str:
    """The framework asked for, else the estimate's: its --framework (hf: accelerate), else a ZeRO stage's
    DeepSpeed, else accelerate (FSDP, DDP)."""
    if framework is not None:
        name = ALIASES.get(framework.strip().lower(), framework.strip().lower())
        if name not in FRAMEWORKS:
            raise InputError(f"--framework {framework!r} cannot be written; accepted: deepspeed, accelerate (hf), "
                             f"torchtitan, megatron")  # fmt: skip
        return name
    own = estimate.input.parallelism.framework
    if own is not None:
        if own == "torchtune":
            raise InputError("torchtune's recipe files are not written; give --framework accelerate or torchtitan")
        return ALIASES.get(own, own)
    stage = estimate.input.strategy.name
    return "deepspeed" if stage in ("zero-1", "zero-2", "zero-3") else "accelerate"


def _write(estimate: Any, framework: str) -> Written:
    from memcalc.configs import write_frameworks as W
    from memcalc.configs import write_parallel as P

    writers: dict[str, Callable[[Any], Written]] = {
        "deepspeed": W.deepspeed, "accelerate": W.accelerate, "torchtitan": P.torchtitan, "megatron": P.megatron}
    return writers[framework](estimate)


# --------------------------------------------------------------------------------------------
# Read back: memcalc's own reader of the files, with the flags the README lists, must give the same estimate.
# --------------------------------------------------------------------------------------------


def base_arguments(estimate: Any) -> dict[str, Any]:
    """The model and GPU the estimate was made for, as ``memcalc.estimate`` keywords (records, not names, so that
    a model given by its shape or a GPU file is the same one)."""
    inp = estimate.input
    out: dict[str, Any] = {"params": inp.model, "gpu": inp.gpu, "gpus_per_node": inp.cluster.gpus_per_node}
    if inp.overheads != type(inp.overheads)():
        out["overheads"] = inp.overheads
    return out


def read_back(written: Written, reader: str, path: Path, base: dict[str, Any]) -> dict[str, Any]:
    """The estimate arguments memcalc's ``reader`` (a flag of ``READER_FLAG``) gives for ``path``, under the base
    and the script's flags, as ``memcalc estimate`` merges them (flags win over the file)."""
    from memcalc.configs import merge_arguments, read_accelerate, read_deepspeed, read_torchtitan
    from memcalc.configs.megatron import read_megatron

    flags = written.flags
    arch = base["params"].architecture
    common = dict(world_size=flags.get("gpus"), micro_batch=flags.get("micro_batch"),
                  grad_accum=flags.get("grad_accum"), seq_len=flags.get("seq_len"), accounting="auto",
                  hidden=arch.hidden if arch is not None else None)  # fmt: skip
    if reader == "--deepspeed":
        reading = read_deepspeed(path, **common)
    elif reader == "--accelerate-config":
        reading = read_accelerate(path, cwd=path.parent, **common)
    elif reader == "--torchtitan-config":
        reading = read_torchtitan(path, world_size=flags.get("gpus"))
    else:
        reading = read_megatron(path, world_size=flags.get("gpus"), layers=arch.layers if arch is not None else None)
    arguments = merge_arguments(reading.arguments, {"params": base["params"], **flags})
    arguments.pop("model", None)
    return {**arguments, **base}


def _check_round_trip(estimate: Any, written: Written) -> None:
    base = base_arguments(estimate)
    with tempfile.TemporaryDirectory(prefix="memcalc-") as tmp:
        for name, text in written.files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        for reader, name in written.read_back:
            again = _again(estimate, written, reader, Path(tmp), name, base)
            unsaid = _unsaid(estimate, again, written)
            if unsaid:
                written.flags.update(unsaid)
                again = _again(estimate, written, reader, Path(tmp), name, base)
            _same(estimate, again, written.framework, name)


SCRIPT_SETTINGS = ("attention", "dropout", "loss", "compile", "compile_loss", "optimizer_impl")
"""What a Hugging Face training script decides (the model's attn_implementation and dropout, the loss, torch.compile,
the optimizer's implementation): under accelerate and DeepSpeed the read-back command names them; torchtitan's and
Megatron-LM's own code decides them, so there a difference is refused."""


def _unsaid(estimate: Any, again: Any, written: Written) -> dict[str, Any]:
    """The settings the files leave unsaid that read back differently: memcalc's accounting (an estimate asked for
    the paper's rows where --accounting auto answers with the realistic one, say), and the training script's."""
    out: dict[str, Any] = {}
    if again.accounting != estimate.accounting and "accounting" not in written.flags:
        out["accounting"] = estimate.accounting
    want, got = estimate.input.workload, again.input.workload
    if written.framework in ("accelerate", "deepspeed") and want is not None and got is not None:
        for name in SCRIPT_SETTINGS:
            if getattr(want, name) != getattr(got, name) and getattr(want, name) is not None:
                out[name] = getattr(want, name)
    return out


def _again(estimate: Any, written: Written, reader: str, folder: Path, name: str, base: dict[str, Any]) -> Any:
    from memcalc.api import estimate

    try:
        return estimate(**read_back(written, reader, folder / name, base))
    except InputError as e:  # the reader's line, naming the file as written rather than the scratch copy
        raise InputError(f"{written.framework}'s files cannot hold this estimate: read back, "
                         f"{str(e).replace(str(folder) + os.sep, '')}") from None


def _same(estimate: Any, again: Any, framework: str, name: str) -> None:
    from memcalc.units import format_memory

    want, got = estimate.memory.per_gpu, again.memory.per_gpu
    for what, a, b in (("a peak of", want.peak_reserved, got.peak_reserved),
                       ("an allocated peak of", want.peak_allocated, got.peak_allocated),
                       ("a per-GPU total of", want.total, got.total)):  # fmt: skip
        if a != b:
            shown = (format_memory(b), format_memory(a))
            shown = shown if shown[0] != shown[1] else (f"{b:,} bytes", f"{a:,} bytes")
            break
    else:
        if _step(estimate) == _step(again):
            return
        what, shown = "a step of", (f"{_step(again)} s", f"{_step(estimate)} s")
    differ = _differences(estimate.input, again.input)
    raise InputError(f"{framework}'s files cannot hold this estimate: {name} read back gives {what} {shown[0]} "
                     f"instead of {shown[1]}{f' ({differ})' if differ else ''}")


def _step(e: Any) -> float | None:
    return e.time.step_s if e.time is not None else None


def _differences(want: Any, got: Any) -> str:
    """The input fields that differ, ``name: wanted -> read back`` (the first few; a default made explicit, None ->
    a value, after the others: it is seldom the cause)."""
    changed, explicit = [], []
    for part in ("strategy", "parallelism", "workload", "framework", "estimator"):
        a, b = getattr(want, part), getattr(got, part)
        if a is None or b is None or a == b:
            continue
        for name in type(a).model_fields:
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                (explicit if x is None else changed).append(f"{name}: {x} -> {y}")
    for name in ("precision", "optimizer", "lora", "grad_accum", "accounting", "float8", "float8_all_gather"):
        x, y = getattr(want, name), getattr(got, name)
        x, y = getattr(x, "name", x), getattr(y, "name", y)
        if x != y:
            changed.append(f"{name}: {x} -> {y}")
    return ", ".join((changed + explicit)[:4])


# --------------------------------------------------------------------------------------------
# launch.sh and README.txt
# --------------------------------------------------------------------------------------------


def _launch_sh(estimate: Any, w: Written) -> str:
    cluster = estimate.input.cluster
    where = ("Run it on each node with NODE_RANK (0 on the first) and MASTER_ADDR (the first node's address) set."
             if cluster.gpus > cluster.gpus_per_node else "Run it on the node.")
    return f"#!/usr/bin/env bash\n# Written by memcalc. {where}\nset -euo pipefail\n{w.launch}\n"


def check_command(estimate: Any, written: Written, which: int = 0) -> str:
    """The ``memcalc estimate`` command that reads the files back (the model and GPU flags, the file of
    ``written.read_back[which]``, and the values the files leave to the training script)."""
    from memcalc.inputs.arguments import flag

    inp = estimate.input
    model = f"--model {inp.model.name}" if inp.model.name else "<your model flags>"
    parts = [f"memcalc estimate {model} --gpu {inp.gpu.key} --gpus-per-node {inp.cluster.gpus_per_node}",
             f"{written.read_back[which][0]} {written.read_back[which][1]}"]
    for name, value in written.flags.items():
        if isinstance(value, bool):
            parts.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            parts.append(f"{flag(name)} {value}")
    return " ".join(parts)


def _nodes(inp: Any) -> str:
    nodes, per = -(-inp.cluster.gpus // inp.cluster.gpus_per_node), min(inp.cluster.gpus, inp.cluster.gpus_per_node)
    return f"{nodes} node{'s' if nodes > 1 else ''} of {per} GPUs"


def _readme(estimate: Any, w: Written) -> str:
    inp, t = estimate.input, estimate.time
    model = inp.model.name or f"{estimate.model.parameters:,} parameters"
    lines = [
        f"Written by memcalc for {w.framework}: {model} on {inp.cluster.gpus} x {inp.gpu.name} ({_nodes(inp)}).",
        "",
        "What memcalc assumed:",
        f"  strategy {estimate.strategy.label}; dp {estimate.training.dp}, tp {inp.parallelism.tp}, "
        f"pp {inp.parallelism.pp}, cp {inp.parallelism.cp}",
        f"  micro-batch {estimate.training.micro_batch}, accumulation {inp.grad_accum}, sequence "
        f"{estimate.training.seq_len}, recompute {inp.workload.recompute if inp.workload else 'none'}, "
        f"precision {inp.precision.name}",
        f"  peak per GPU {estimate.memory.per_gpu.peak_reserved / GiB:.2f} GiB reserved "
        f"({estimate.memory.per_gpu.peak_allocated / GiB:.2f} GiB allocated; {estimate.accounting} accounting), "
        f"verdict {estimate.memory.fit.verdict}",
    ]
    if t is not None:
        lines.append(f"  step time {t.step_s:.3f} s, {t.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
                     f"MFU {t.mfu:.1%}")
    lines += ["", "Files:"] + [f"  {n}" for n in [*w.files, "launch.sh"]]
    lines += ["", "Fill in before running:"] + [f"  - {x}" for x in w.fill_in]
    if w.notes:
        lines += ["", "Notes:"] + [f"  - {x}" for x in w.notes]
    # one line per file the first file's reader reads (torchtitan's TOML and its 0.3 arguments)
    commands = [check_command(estimate, w, i) for i, (flag, _) in enumerate(w.read_back) if flag == w.read_back[0][0]]
    lines += ["", "Read back by memcalc (the same peak and step time):", *[f"  {c}" for c in commands], ""]
    return "\n".join(lines)
