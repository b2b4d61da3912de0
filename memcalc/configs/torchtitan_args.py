"""torchtitan 0.3's run arguments (``torchtitan_args.txt``): ``--module``/``--config`` naming a registered Python
config, dotted overrides, and the activation-checkpoint policy as a subcommand, last.

Sources (pytorch/torchtitan v0.3.0): config/manager.py ``ConfigManager.parse_args`` (``--module`` and ``--config``
taken out, the rest parsed by tyro over the registered config's ``Trainer.Config``: unknown arguments are refused);
models/llama3/config_registry.py (``llama3_8b``: local batch 1, seq_len 8192, per-op selective AC; ``llama3_70b``:
local batch 8, seq_len 8192, tp 8, full AC; ``llama3_405b``: local batch 2, seq_len 8192, tp 8, full AC, compile with
async TP, float8 rowwise linears but ``lm_head``: its model spec is no command-line field, so float8 is on there and
off in the other two); distributed/activation_checkpoint.py (the policies ``selective`` = per-op SAC, ``full``,
``memory-budget``, ``none``: the layer-interval selective AC of v0.2 is gone); trainer.py (CUDA graphs capture
forward + backward unless ``--training.disable_cuda_graphs``; refused with pipeline parallelism);
config/configs.py (``compile.enable_async_tensor_parallel``, ``parallelism.enable_sequence_parallel``).

The overrides are read onto the v0.2 TOML's dotted names (``memcalc.configs.torchtitan``), over the registered
config's own values, so that one reader answers for both.
"""

from __future__ import annotations

import shlex
from typing import Any

from memcalc.configs.reading import Collector, near
from memcalc.configs.torchtitan_keys import BOOLS_03, KEYS_03

RELEASE = "0.3.0"
REGISTERED: dict[str, dict[str, Any]] = {
    "llama3_8b": {"model.name": "llama3", "model.flavor": "8B", "training.local_batch_size": 1,
                  "training.seq_len": 8192, "activation_checkpoint.mode": "selective",
                  "activation_checkpoint.selective_ac_option": "op"},
    "llama3_70b": {"model.name": "llama3", "model.flavor": "70B", "training.local_batch_size": 8,
                   "training.seq_len": 8192, "parallelism.tensor_parallel_degree": 8,
                   "activation_checkpoint.mode": "full"},
    "llama3_405b": {"model.name": "llama3", "model.flavor": "405B", "training.local_batch_size": 2,
                    "training.seq_len": 8192, "parallelism.tensor_parallel_degree": 8,
                    "activation_checkpoint.mode": "full", "compile.enable": True,
                    "parallelism.enable_async_tensor_parallel": True,
                    "model.converters": ["quantize.linear.float8"], "quantize.linear.float8.recipe_name": "rowwise",
                    "quantize.linear.float8.filter_fqns": ["lm_head"]},
}  # fmt: skip
"""The registered llama3 configs (module ``llama3``) as the v0.2 TOML's dotted names: what each sets that differs
from the dataclass defaults memcalc's reader assumes."""
CONFIG_OF = {"llama-3-8b": "llama3_8b", "llama-3-70b": "llama3_70b", "llama-3-405b": "llama3_405b"}
"""memcalc preset -> registered config."""
AC_POLICIES = {"selective": ("selective", "op"), "full": ("full", None), "memory_budget": ("memory_budget", None),
               "none": ("none", None)}  # fmt: skip
RENAMED = {"compile.enable_async_tensor_parallel": "parallelism.enable_async_tensor_parallel"}
"""0.3 names -> the v0.2 names memcalc's reader reads."""


def is_args_file(text: str) -> bool:
    """An argument list (its first word a ``--`` option) rather than a job TOML."""
    words = _words(text)
    return bool(words) and words[0].startswith("--")


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes: a TOML string, or a broken list; the TOML reader says which
        return []


def read_args(c: Collector, text: str) -> dict[str, Any]:
    """The overrides over the registered config, as the v0.2 TOML's flat dotted keys."""
    words = _words(text)
    module = config = policy = None
    given: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            head, _, name = word.partition(":")
            if head.replace("-", "_") != "activation_checkpoint" or not name:
                raise c.fail(word, "is not an option; torchtitan refuses stray words (accepted: --section.key VALUE, "
                                   "or activation_checkpoint:selective|full|memory-budget|none, last)")  # fmt: skip
            policy = name.replace("-", "_")
            if policy not in AC_POLICIES:
                raise c.fail(word, f"{name!r} is not accepted; accepted: selective, full, memory-budget, none")
            rest = words[i + 1:]
            if rest and not rest[0].replace("-", "_").startswith("__activation_checkpoint."):
                raise c.fail(rest[0], "follows the activation_checkpoint subcommand; torchtitan's parser takes the "
                                      "other options before it")  # fmt: skip
            for w in rest:
                if w.startswith("--"):
                    c.ignore(w[2:].split("=")[0], "an activation-checkpoint policy option (rng state, debug)")
            break
        name, eq, value = word[2:].partition("=")
        key = name.replace("-", "_")
        flag = key if key in ("module", "config") else _known(key)
        if flag is None:
            raise c.fail(key, f"unknown option{near(key, KEYS_03)}; torchtitan 0.3's parser refuses options its "
                              "config does not define")  # fmt: skip
        switch = flag in BOOLS_03
        if switch and eq:
            raise c.fail(key, f"is a switch and takes no value; accepted: --{flag} or --{_negated(flag)}")
        if not switch and not eq:
            if i + 1 >= len(words) or words[i + 1].startswith("--") or \
                    words[i + 1].replace("-", "_").startswith("activation_checkpoint:"):
                raise c.fail(key, "needs a value")
            i += 1
            value = words[i]
        i += 1
        if flag == "module":
            module = value
        elif flag == "config":
            config = value
        elif flag in given:
            raise c.fail(key, "given twice")
        else:
            given[flag] = key == flag if switch else _value(c, flag, value)
    if module is None or config is None:
        raise c.fail("--module" if module is None else "--config", "is missing; torchtitan 0.3 needs --module and "
                                                                   "--config (e.g. --module llama3 --config llama3_8b)")
    if module not in ("llama3", "torchtitan.models.llama3"):
        raise c.fail("--module", f"{module!r} is not one memcalc knows; accepted: llama3")
    if config not in REGISTERED:
        raise c.fail("--config", f"{config!r} is not one memcalc knows; accepted: {', '.join(REGISTERED)}")
    c.used("--module")
    c.used("--config")
    flat: dict[str, Any] = dict(REGISTERED[config])
    c.note(f"--config {config}: torchtitan {RELEASE}'s registered values under the overrides ("
           + ", ".join(f"{k.split('.')[-1]} {v}" for k, v in flat.items() if not k.startswith("model.")) + ")")
    if "compile.enable" in given and given.get("compile.enable") is False and "compile.enable_async_tensor_parallel" \
            not in given and flat.get("parallelism.enable_async_tensor_parallel"):
        raise c.fail("compile.enable", "off with async TP on (llama3_405b's): torchtitan refuses it; accepted: "
                                       "--compile.no_enable_async_tensor_parallel as well")  # fmt: skip
    if policy is not None:
        mode, option = AC_POLICIES[policy]
        flat["activation_checkpoint.mode"] = mode
        flat.pop("activation_checkpoint.selective_ac_option", None)
        if option:
            flat["activation_checkpoint.selective_ac_option"] = option
    for key, value in given.items():
        flat[RENAMED.get(key, key)] = value
    if flat.get("parallelism.pipeline_parallel_degree", 1) > 1 and not flat.get("training.disable_cuda_graphs"):
        raise c.fail("parallelism.pipeline_parallel_degree", "above 1 with CUDA graphs on: torchtitan refuses it; "
                                                             "accepted: --training.disable_cuda_graphs as well")
    if not flat.get("training.disable_cuda_graphs"):
        c.unmodelled("training.disable_cuda_graphs", "off: CUDA graphs capture forward + backward (their private "
                                                     "memory pool is not counted)")  # fmt: skip
    else:
        c.ignore("training.disable_cuda_graphs", "no CUDA graph capture, as counted")
    flat.pop("training.disable_cuda_graphs", None)
    if flat.get("parallelism.pipeline_parallel_degree", 1) > 1:
        flat.setdefault("parallelism.pipeline_parallel_schedule", "1F1B")
    return flat


def _known(key: str) -> str | None:
    """The 0.3 key ``key`` names (``no_`` switches by the key they clear), or None."""
    if key in KEYS_03 or key.startswith("optimizer.param_groups."):
        return key
    section, _, last = key.rpartition(".")
    if last.startswith("no_") and f"{section}.{last[3:]}".lstrip(".") in BOOLS_03:
        return f"{section}.{last[3:]}".lstrip(".")
    return None


def _negated(key: str) -> str:
    section, _, last = key.rpartition(".")
    return f"{section}.no_{last}" if section else f"no_{last}"


def _value(c: Collector, key: str, text: str) -> Any:
    """``text`` as the kind the v0.2 TOML's key of that name has (0.3's own keys stay text: memcalc reads none)."""
    from memcalc.configs.torchtitan_keys import KEYS

    kind = KEYS.get(RENAMED.get(key, key), ("str", ""))[0]
    if kind == "list":
        return text.split(",")
    if kind == "int":
        if not text.lstrip("-").isdigit():
            raise c.fail(key, f"{text!r} is not accepted; accepted: a whole number")
        return int(text)
    if kind in ("float", "number"):
        try:
            return int(text) if text.lstrip("-").isdigit() else float(text)
        except ValueError:
            raise c.fail(key, f"{text!r} is not accepted; accepted: a number") from None
    return text


def write_args(config: str, overrides: list[tuple[str, Any]], policy: str) -> str:
    """``torchtitan_args.txt``: one option a line (launch.sh passes them as ``$(grep -v '^#' ...)``)."""
    lines = [f"# torchtitan {RELEASE} run arguments written by memcalc: a registered config and its overrides",
             "--module llama3", f"--config {config}"]
    for key, value in overrides:
        if isinstance(value, bool):
            lines.append(f"--{key}" if value else f"--{_negated(key)}")
        elif isinstance(value, list):
            lines.append(f"--{key} {','.join(value)}")
        else:
            lines.append(f"--{key} {value}")
    lines.append(f"activation_checkpoint:{policy}")
    return "\n".join(lines) + "\n"
