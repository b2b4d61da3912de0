"""``--deepspeed``, ``--accelerate-config``, ``--torchtitan-config``, ``--megatron-args``: a framework's own config
file as the flags.

The file gives the arguments (``memcalc.configs``); flags typed on the command line win over it. What the file
holds that memcalc does not model, or that does not change memory, is said on stderr (one line each), so that
``--json`` on stdout stays clean.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from memcalc.errors import InputError


def typed(ctx: Any) -> set[str]:
    """The parameters the user typed (not left at their defaults)."""
    from typer._click.core import ParameterSource

    return {k for k in ctx.params if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE}


def with_config(ctx: Any, kwargs: dict[str, Any], deepspeed: str | None, accelerate: str | None,
                torchtitan: str | None, *, megatron: str | None = None, quiet: bool = False,
                origin: dict[str, tuple[str, Any]] | None = None, said: list[str] | None = None,
                assumed: list[str] | None = None) -> dict[str, Any]:
    """``kwargs`` (the command's arguments for ``memcalc.estimate``) with a config file's arguments beneath them.

    origin: filled with the arguments the file gave (name -> (the file, the value)), for ``blame``. said: gets the
    reading's stderr lines (what is not modelled, the notes, the ignored keys) instead of stderr, for the caller to
    print once the estimate succeeded (a failing one prints its one error line alone). assumed: gets the values the
    file leaves to the training script and that change the answer, with the flag that gives yours, for the output's
    header (without it, they are said with the rest)."""
    files = [(flag, f) for flag, f in (("--deepspeed", deepspeed), ("--accelerate-config", accelerate),
                                       ("--torchtitan-config", torchtitan), ("--megatron-args", megatron))
             if f is not None]
    if not files:
        return kwargs
    if len(files) > 1:
        raise InputError(f"{' and '.join(f for f, _ in files)} cannot be combined; choose one config file")
    from memcalc.configs import (
        merge_arguments,
        read_accelerate,
        read_deepspeed,
        read_torchtitan,
    )

    given = typed(ctx) & set(kwargs)
    mb = kwargs.get("micro_batch") if "micro_batch" in given and kwargs.get("micro_batch") != "auto" else None
    hidden, layers = kwargs.get("hidden"), kwargs.get("layers")
    if (hidden is None or (megatron and layers is None)) and (kwargs.get("model") or kwargs.get("hf_config")):
        from memcalc.api import resolve_architecture

        arch = resolve_architecture(kwargs.get("model"), kwargs.get("hf_config"))
        hidden = hidden if hidden is not None else arch.hidden if arch is not None else None
        layers = layers if layers is not None else arch.layers if arch is not None else None
    world = kwargs["gpus"] if "gpus" in given else None
    common = dict(world_size=world, micro_batch=mb, grad_accum=kwargs.get("grad_accum"), hidden=hidden,
                  seq_len=kwargs.get("seq_len"), accounting=kwargs.get("accounting", "paper"))
    try:
        if deepspeed is not None:
            reading = read_deepspeed(deepspeed, tp=kwargs["tp"] if "tp" in given else None, pp=kwargs.get("pp", 1),
                                     **common)
        elif accelerate is not None:
            reading = read_accelerate(accelerate, cwd=Path.cwd(), **common)
        elif torchtitan is not None:
            reading = read_torchtitan(torchtitan, world_size=world)
        else:
            from memcalc.configs.megatron import read_megatron

            reading = read_megatron(megatron, world_size=world, layers=layers)  # type: ignore[arg-type]
    except InputError as e:
        raise InputError(as_flags(str(e))) from None
    if not quiet:
        lines = [f"memcalc: {reading.source}: {what}: {as_flags(item)}\n"
                 for what, items in (("not modelled", reading.unmodelled), ("note", reading.notes)) for item in items]
        # an assumption ends with the argument that gives yours: a flag typed for it settles it
        told = [a for a in reading.assumed if (m := re.search(r"pass ([a-z_]+)=$", a)) is None or m[1] not in given]
        if assumed is not None:
            assumed += [as_flags(item) for item in told]
        else:
            lines += [f"memcalc: {reading.source}: assumed: {as_flags(item)}\n" for item in told]
        if reading.ignored:
            lines.append(f"memcalc: {reading.source}: {len(reading.ignored)} keys do not change memory and are "
                         f"ignored: {', '.join(_key(x) for x in reading.ignored)}\n")
        if said is None:
            sys.stderr.writelines(lines)
        else:
            said += lines
    kept = {k: v for k, v in kwargs.items() if k not in given}
    merged = merge_arguments(reading.arguments, {k: kwargs[k] for k in given})
    if origin is not None:
        origin.update({k: (reading.source, v) for k, v in reading.arguments.items() if k not in given})
    return {**kept, **merged}


def _key(entry: str) -> str:
    """An ignored entry's key path without its reason ("path: reason"; a nested file's "file: path: reason" as
    "file:path")."""
    first, _, rest = entry.partition(": ")
    return f"{first}:{rest.partition(': ')[0]}" if first.endswith((".json", ".yaml", ".yml")) and rest else first


# The readers' notes name memcalc.estimate's arguments ("pass micro_batch="); on the command line they are flags
# (``memcalc.inputs.arguments.flag``; the readers' world_size is the command's --gpus).
NAMED = ("world_size", "micro_batch", "grad_accum", "seq_len", "recompute", "hidden", "model", "hf_config", "tp", "pp",
         "precision", "accounting")


def as_flags(text: str) -> str:
    """A reader's message with the API arguments it names (``micro_batch=``) written as the command's flags."""
    from memcalc.inputs.arguments import flag

    def to_flag(m: re.Match[str]) -> str:
        if m[1] not in NAMED:
            return m[0]
        name = "--gpus" if m[1] == "world_size" else flag(m[1])
        return f"{name} {m[2]}" if m[2] else name

    return re.sub(r"\b([a-z_]+)=([\w.-]*)(?=[\s),;]|$)", to_flag, text).replace("pass --", "give --")


def blame(error: InputError, arguments: dict[str, Any], origin: dict[str, tuple[str, Any]]) -> InputError:
    """``error`` with the file named where a flag it names was not typed but read from a config file (and reached
    the estimate: a typed flag can drop a file's value, e.g. --fsdp its ZeRO stage)."""
    from memcalc.inputs.arguments import flag

    text = str(error)
    for name, (source, value) in origin.items():
        if arguments.get(name) == value and re.search(rf"{re.escape(flag(name))}(?![\w-])", text):
            text += f" ({flag(name)} {value} is read from {source})"
    return InputError(text)


def write_files(result: Any, directory: str | None, force: bool) -> None:
    """``--write-config DIR``: the framework's files for ``result`` (an Estimate or a PlanResult), one line on stderr
    naming them."""
    if directory is None:
        return
    from memcalc.configs.writing import write_config

    paths = write_config(result, directory=directory, force=force)
    sys.stderr.write(f"memcalc: wrote {', '.join(p.name for p in paths)} to {directory}\n")
