"""A DeepSpeed JSON config (plain, or under the Hugging Face Trainer / accelerate) as estimate arguments.

    >>> from memcalc.configs import read_deepspeed
    >>> r = read_deepspeed("ds_config_zero3.json", world_size=16, micro_batch=4, hidden=4096)
    >>> memcalc.estimate(**r.arguments, model="llama-2-7b")

Rules followed (DeepSpeed 0.19 runtime/config.py; transformers integrations/deepspeed.py
``HfTrainerDeepSpeedConfig.trainer_config_process`` / ``trainer_config_finalize``):
- ``"auto"`` is the Trainer's: micro-batch from ``micro_batch`` (per_device_train_batch_size, default 8),
  accumulation from ``grad_accum`` (default 1), ``train_batch_size`` = dp x micro x accumulation,
  ``fp16``/``bf16.enabled`` from ``fp16=``/``bf16=`` (--fp16/--bf16, default false); ``reduce_bucket_size`` = h²,
  ZeRO-3 ``stage3_prefetch_bucket_size`` = int(0.9·h²), ``stage3_param_persistence_threshold`` = 10·h.
  An integer that disagrees with the Trainer's value is refused, as the Trainer refuses it.
- Plain DeepSpeed derives the third of train batch / micro-batch / accumulation from the other two and
  dp = world / (tp x pp) (``DeepSpeedConfig._set_batch_related_parameters``) and asserts the product.
- DeepSpeed ignores unknown top-level keys; a near miss of a known key is refused here (it would silently run
  without the setting), other unknown keys are listed as ignored. Sub-sections refuse unknown keys, as
  DeepSpeed's pydantic models do (``extra="forbid"``).
- ZeRO-1/2 with ``"device": "nvme"`` for the optimizer offload to host memory (stage_1_and_2.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memcalc.configs import deepspeed_keys as K
from memcalc.configs import reading
from memcalc.configs.deepspeed_batch import resolve_batch
from memcalc.configs.reading import (
    Collector,
    ConfigReading,
    as_bool,
    as_int,
    as_mapping,
    as_str,
    check_depth,
    installed_refuses,
    load_json,
    near_miss,
    refuse_unknown,
)

AUTO = "auto"


def read_deepspeed(
    config: str | os.PathLike[str] | Mapping[str, Any],
    *,
    world_size: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    hidden: int | None = None,
    tp: int | None = None,
    pp: int = 1,
    fp16: bool | None = None,
    bf16: bool | None = None,
    seq_len: int | None = None,
    gpus_per_node: int | None = None,
    accounting: str = "paper",
) -> ConfigReading:
    """Read a DeepSpeed config (a path or an already-loaded dict) into ``memcalc.estimate`` arguments.

    ``world_size``: GPUs in the job; ``micro_batch``/``grad_accum``: the Trainer's per-device batch and
    accumulation (fill ``"auto"``, must agree with integers); ``hidden``: the model's hidden size for the ZeRO
    ``"auto"`` buckets; ``tp``/``pp``: model-parallel degrees (dp = world / (tp x pp)); ``fp16``/``bf16``: the
    Trainer's --fp16/--bf16; ``seq_len``: adds the micro-batch to the arguments (activations need both);
    ``accounting="realistic"``, ``"implementation"`` or ``"auto"`` also passes the ZeRO-3 coordinator knobs (the
    accountings that use them; where ``auto`` answers with the paper's accounting a note says they are unused).
    """
    if isinstance(config, Mapping):
        data, name = dict(config), "<dict>"
        check_depth(data, name)
    else:
        data, name = load_json(config)
    c = Collector(name, "deepspeed")
    _check_top(c, data)
    dp_tp = _model_parallel(c, data, tp, pp)
    resolve_batch(c, data, world_size, micro_batch, grad_accum, dp_tp, seq_len)
    _precision(c, data, fp16, bf16)
    _optimizer(c, data)
    _zero(c, data, hidden, accounting)
    _activation_checkpointing(c, data)
    if gpus_per_node is not None:
        c.arguments["gpus_per_node"] = gpus_per_node
    c.note("activation recomputation is switched on by the training script (Trainer: --gradient_checkpointing), "
           "not by this file: pass recompute= to count it")  # fmt: skip
    return c.freeze()


def _check_top(c: Collector, data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if key in K.TOP_REMOVED:
            _removed(c, key, value)
            continue
        if key in K.TOP_READ:
            continue
        if key in K.TOP_IGNORED:
            c.ignore(key, K.TOP_IGNORED[key])
        elif key in K.TOP_UNMODELLED:
            if key == "compile":
                _compile_keys(c, as_mapping(c, key, value))
            if key == "torch_autocast" and isinstance(value, dict) and value.get("enabled") is not True:
                c.ignore(key, "not enabled")
            else:
                c.unmodelled(key, K.TOP_UNMODELLED[key])
        else:
            close = near_miss(key, K.TOP_KNOWN)
            if close is not None:
                raise c.fail(key, f"unknown key (did you mean {close!r}?); DeepSpeed ignores unknown top-level keys "
                                  "silently, so this setting would not apply")  # fmt: skip
            c.ignore(key, "not a DeepSpeed key (DeepSpeed ignores unknown top-level keys)")


def _removed(c: Collector, path: str, value: Any) -> None:
    """A block DeepSpeed 0.19.7 removed (``K.TOP_REMOVED``, ``K.ZERO_REMOVED``): refused in one line where the
    installed DeepSpeed refuses it; else read as DeepSpeed 0.19.6 and earlier read it, with a note: a disabled block
    (``enabled: false``) or one with no effect on memory is passed over, an enabled one that changes memory is listed
    as not modelled."""
    name = installed_refuses("deepspeed", K.REMOVED_FROM)
    if name is not None:
        raise c.fail(path, f"was removed from DeepSpeed 0.19.7 (the installed {name} refuses the file); delete it")
    key = path.rsplit(".", 1)[-1]
    effect = K.REMOVED_EFFECT.get(key, "")
    disabled = value is False or value is None or (isinstance(value, Mapping) and value.get("enabled") is False)
    if disabled or not effect:
        c.ignore(path, "disabled" if disabled else "no effect on the memory held")
    else:
        c.unmodelled(path, effect)
    c.note(f"{path}: read as DeepSpeed 0.19.6 and earlier read it; 0.19.7 and later refuse the file (delete it)")


def _compile_keys(c: Collector, section: Mapping[str, Any]) -> None:
    """The compile section as the DeepSpeed of its time read it (``K.COMPILE_RELEASES``). A key no release accepted
    that is near a current one is a misspelling; a file that uses a current key is for 0.16.6 and later, which refuse
    any other. Otherwise the installed DeepSpeed decides: keys it refuses fail in one line naming it, and where none
    is installed or it passed over the section, they are passed over with a note."""
    stray = [key for key in section if key not in K.COMPILE_KEYS]
    if not stray:
        return
    older = {key for _, keys in K.COMPILE_RELEASES[:-1] if keys for key in keys}
    if any(key in K.COMPILE_KEYS for key in section) or any(
            key not in older and near_miss(str(key), K.COMPILE_KEYS) is not None for key in stray):
        refuse_unknown(c, "compile", section, K.COMPILE_KEYS)
    release = reading.installed_release("deepspeed", patch=True)
    accepted = None  # the keys the installed release parses (None: it passes over the section)
    for since, keys in K.COMPILE_RELEASES:
        if release is not None and release >= since:
            accepted = keys
    refused = [key for key in section if accepted is not None and key not in accepted]
    if release is not None and refused:
        name = ".".join(map(str, release))
        raise c.fail(f"compile.{refused[0]}", f"unknown key, which the installed DeepSpeed {name} refuses (accepted: "
                                              f"{', '.join(accepted)}; DeepSpeed 0.14.4 to 0.16.5 passed over the "
                                              f"compile section)")  # fmt: skip
    if accepted is None:
        c.note(f"compile.{', '.join(map(str, stray))}: passed over, as DeepSpeed 0.14.4 to 0.16.5 passed over the "
               f"compile section; 0.16.6 and later refuse these keys (the script's engine.compile() decides "
               f"compilation)")  # fmt: skip


def _model_parallel(c: Collector, data: Mapping[str, Any], tp: int | None, pp: int) -> int:
    """tp x pp; tensor_parallel.autotp_size (DeepSpeed AutoTP training) gives tp when tp= is not passed."""
    file_tp = None
    if "tensor_parallel" in data:
        section = as_mapping(c, "tensor_parallel", data["tensor_parallel"])
        refuse_unknown(c, "tensor_parallel", section, K.TENSOR_PARALLEL_KEYS)
        if "autotp_size" in section:
            file_tp = as_int(c, "tensor_parallel.autotp_size", section["autotp_size"]) or None
            c.used("tensor_parallel.autotp_size")
        for key in section:
            if key != "autotp_size":
                c.ignore(f"tensor_parallel.{key}", "AutoTP option")
    if tp is not None and file_tp is not None and tp != file_tp:
        raise c.fail("tensor_parallel.autotp_size", f"{file_tp} disagrees with tp={tp}; give the same degree")
    tp = tp or file_tp or 1
    if tp > 1:
        c.arguments["tp"] = tp
    if pp > 1:
        c.arguments["pp"] = pp
    return tp * pp


def _enabled(c: Collector, data: Mapping[str, Any], section: str, keys: tuple[str, ...], flag: bool | None) -> bool:
    body = as_mapping(c, section, data[section])
    if section != "fp16":
        _bf16_legacy(c, section, body)
        keys = (*keys, *K.BF16_LEGACY_KEYS)
    refuse_unknown(c, section, body, keys)
    value = body.get("enabled", False)
    c.used(f"{section}.enabled")
    if value == AUTO:
        return bool(flag)
    enabled = as_bool(c, f"{section}.enabled", value)
    if flag is not None and flag != enabled:
        name = "fp16" if section == "fp16" else "bf16"
        raise c.fail(f"{section}.enabled", f"{enabled} disagrees with --{name} {flag}; the Trainer refuses a mismatch "
                                           "(use \"auto\")")  # fmt: skip
    return enabled


def _bf16_legacy(c: Collector, section: str, body: Mapping[str, Any]) -> None:
    """fp16's loss-scaling keys in the bf16 section: refused where the installed DeepSpeed refuses them (0.17 and
    later), else passed over with a note, as the DeepSpeed of the file's time did."""
    legacy = [key for key in body if key in K.BF16_LEGACY_KEYS]
    if not legacy:
        return
    name = installed_refuses("deepspeed", K.BF16_STRICT_FROM)
    if name is not None:
        raise c.fail(f"{section}.{legacy[0]}", f"fp16's loss-scaling key in the bf16 section, which the installed "
                                                f"DeepSpeed {name} refuses (0.17 and later; earlier releases passed "
                                                f"over it); remove it: bf16 needs no loss scaling")  # fmt: skip
    c.note(f"{section}.{', '.join(legacy)}: fp16's loss-scaling keys, which DeepSpeed before 0.17 passes over in the "
           f"bf16 section and 0.17 and later refuse; remove them before running this file with a newer DeepSpeed")  # fmt: skip


def _precision(c: Collector, data: Mapping[str, Any], fp16: bool | None, bf16: bool | None) -> None:
    on16 = _enabled(c, data, "fp16", K.FP16_KEYS, fp16) if "fp16" in data else bool(fp16)
    bf_key = "bf16" if "bf16" in data else ("bfloat16" if "bfloat16" in data else None)
    onbf = _enabled(c, data, bf_key, K.BF16_KEYS, bf16) if bf_key else bool(bf16)
    autos = [f"{s}.enabled" for s in ("fp16", bf_key) if s and isinstance(data.get(s), dict) and data[s].get("enabled") == AUTO]
    if autos and fp16 is None and bf16 is None:
        c.assume(f"precision fp32, from {' and '.join(autos)} 'auto': the Trainer's default without its fp16/bf16 "
                 "arguments; pass precision=")  # fmt: skip
    if ("fp16" not in data and fp16) or (bf_key is None and bf16):
        c.note("no fp16/bf16 section: taken from fp16=/bf16= as accelerate does (it adds the section, "
               "utils/dataclasses.py); under the Trainer DeepSpeed would then train in fp32")  # fmt: skip
    if on16 and onbf:
        raise c.fail("fp16.enabled", "fp16 and bf16 are both enabled; DeepSpeed accepts one of them")
    c.arguments["precision"] = "fp16-mixed" if on16 else "bf16-mixed" if onbf else "fp32"
    for section in ("fp16", bf_key):
        body = data.get(section) if section else None
        if not isinstance(body, dict):
            continue
        for key, value in body.items():
            path = f"{section}.{key}"
            if key in ("fp16_master_weights_and_grads", "bf16_master_weights_and_grads", "bf16_optimizer_states"):
                if value is True:
                    c.unmodelled(path, "16-bit master weights / optimizer states instead of fp32")
                else:
                    c.ignore(path, "off")
            elif section != "fp16" and key in K.BF16_LEGACY_KEYS:
                c.ignore(path, "fp16's loss-scaling key, which DeepSpeed before 0.17 passes over under bf16")
            elif key != "enabled":
                c.ignore(path, "loss scaling and overflow checks hold no tensors")


def _optimizer(c: Collector, data: Mapping[str, Any]) -> None:
    if "optimizer" not in data:
        c.note("no optimizer section: the client's optimizer is used (the Trainer's default is AdamW)")
        return
    section = as_mapping(c, "optimizer", data["optimizer"])
    if "type" not in section:
        c.note("optimizer without a type: the client's optimizer is used")
        return
    kind = as_str(c, "optimizer.type", section["type"])
    c.used("optimizer.type")
    name, why = K.OPTIMIZERS.get(kind.lower(), (None, f"optimizer {kind!r} is not one memcalc models"))
    if kind.lower() == "sgd":
        params = section.get("params") or {}
        if isinstance(params, dict) and params.get("momentum") not in (None, 0, 0.0):
            name = "sgd-momentum"
    if name is not None:
        c.arguments["optimizer"] = name
    if why is not None:
        c.unmodelled("optimizer.type", why)
    for key in section:
        if key != "type":
            c.ignore(f"optimizer.{key}", "hyperparameters")


def _offload_device(c: Collector, zero: Mapping[str, Any], key: str, keys: tuple[str, ...], stage: int) -> str:
    if key not in zero or zero[key] is None:
        return "none"
    section = as_mapping(c, f"zero_optimization.{key}", zero[key])
    refuse_unknown(c, f"zero_optimization.{key}", section, keys)
    device = as_str(c, f"zero_optimization.{key}.device", section.get("device", "none"), K.OFFLOAD_DEVICES)
    c.used(f"zero_optimization.{key}.device")
    for sub, value in section.items():
        path = f"zero_optimization.{key}.{sub}"
        if sub == "ratio" and isinstance(value, (int, float)) and value < 1 and stage != 3:
            # DeepSpeedZeroConfig.offload_ratio_check: "Partial offloading only supported for ZeRO Stage 3."
            raise c.fail(path, f"{value} (partial offload) needs ZeRO stage 3; accepted at stage {stage}: 1.0")
        if sub == "ratio" and device != "none" and isinstance(value, (int, float)) and value < 1:
            c.unmodelled(path, f"partial optimizer offload ({value}); counted as full offload")
        elif sub == "super_offload" and value is True:
            c.unmodelled(path, "SuperOffload for Grace-Hopper superchips")
        elif sub != "device":
            c.ignore(path, "host/NVMe-side tuning")
    return device


def _zero(c: Collector, data: Mapping[str, Any], hidden: int | None, accounting: str) -> None:
    raw = data.get("zero_optimization", {})
    if isinstance(raw, bool):  # the deprecated form: "zero_optimization": true means stage 1
        c.used("zero_optimization")
        c.arguments["stage"] = 1 if raw else 0
        c.note("zero_optimization given as a boolean (deprecated): true is stage 1")
        return
    zero = as_mapping(c, "zero_optimization", raw)
    for key in zero:
        if key in K.ZERO_REMOVED:
            _removed(c, f"zero_optimization.{key}", zero[key])
    zero = {k: v for k, v in zero.items() if k not in K.ZERO_REMOVED}
    refuse_unknown(c, "zero_optimization", zero, K.ZERO_KNOWN)
    for alias, field_name in K.ZERO_ALIASES.items():
        if alias in zero and field_name in zero:
            raise c.fail(f"zero_optimization.{field_name}", f"is given twice, also as {alias}; give one spelling")
    values: dict[str, Any] = {K.ZERO_ALIASES.get(k, k): v for k, v in zero.items()}
    spelled = {K.ZERO_ALIASES.get(k, k): k for k in zero}
    stage = 0
    if "stage" in values:
        if values["stage"] in ("0", "1", "2", "3"):
            c.note("zero_optimization.stage given as a string: DeepSpeed parses it, but the Trainer's is_zero3() "
                   "compares with the number 3; write it as a number")  # fmt: skip
        stage = as_int(c, "zero_optimization.stage", values["stage"], digit_strings=True)
        if stage > 3:
            raise c.fail("zero_optimization.stage", f"{stage} is not a ZeRO stage; accepted: 0, 1, 2, 3")
        c.used("zero_optimization.stage")
    c.arguments["stage"] = stage
    for key in K.ZERO_INT:
        if key in values and values[key] != AUTO:
            as_int(c, f"zero_optimization.{spelled[key]}", values[key], minimum=0,
                   digit_strings=True)  # pydantic ints: DeepSpeed parses "500" too
    for key in K.ZERO_BOOL:
        if key in values and values[key] != AUTO:
            as_bool(c, f"zero_optimization.{spelled[key]}", values[key])
    # Offload, with the deprecated booleans (DeepSpeedZeroConfig cpu_offload -> offload_optimizer cpu, ...).
    opt = _offload_device(c, zero, "offload_optimizer", K.OFFLOAD_OPTIMIZER_KEYS, stage)
    par = _offload_device(c, zero, "offload_param", K.OFFLOAD_PARAM_KEYS, stage)
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if values.get(old) is True:
            if new in zero:
                raise c.fail(f"zero_optimization.{old}", f"and zero_optimization.{new} both given; keep {new} only")
            c.used(f"zero_optimization.{old}")
            c.note(f"zero_optimization.{old} (deprecated) read as {new}.device cpu")
            opt, par = ("cpu", par) if new == "offload_optimizer" else (opt, "cpu")
        elif old in values:
            c.ignore(f"zero_optimization.{old}", "false")
    if opt != "none" and stage == 0:
        c.ignore("zero_optimization.offload_optimizer", "ZeRO stage 0 has no partitioned optimizer to offload")
        opt = "none"
    if opt == "nvme" and stage in (1, 2):
        c.note("offload_optimizer nvme at ZeRO-1/2: DeepSpeed keeps those optimizer states in host memory "
               "(stage_1_and_2.py), counted as cpu")  # fmt: skip
        opt = "cpu"
    if par != "none" and stage != 3:
        c.ignore("zero_optimization.offload_param", f"parameter offload is ZeRO-3 only; stage {stage} does not read it")
        par = "none"
    if opt != "none":
        c.arguments["offload_optimizer"] = opt
    if par != "none":
        c.arguments["offload_params"] = par
    _zero_knobs(c, values, spelled, stage, hidden, accounting)


def _zero_knobs(c: Collector, values: dict[str, Any], spelled: dict[str, str], stage: int, hidden: int | None,
                accounting: str) -> None:  # fmt: skip
    # The Trainer's "auto" (trainer_config_finalize): h², int(0.9·h²), 10·h for the model's hidden size h.
    hf_auto = {"reduce_bucket_size": lambda h: h * h, "prefetch_bucket_size": lambda h: int(0.9 * h * h),
               "param_persistence_threshold": lambda h: 10 * h}  # fmt: skip
    resolved: dict[str, int] = {}
    for key, value in values.items():
        path = f"zero_optimization.{spelled[key]}"
        if value == AUTO and key in hf_auto and (key == "reduce_bucket_size" or stage == 3):
            if hidden is None:
                c.note(f"{path} 'auto' is filled by the Trainer from the model's hidden size: pass hidden= "
                       "(DeepSpeed's default used)")  # fmt: skip
                continue
            resolved[key] = hf_auto[key](hidden)
            c.note(f"{path} 'auto' = {resolved[key]:,} for hidden {hidden}")
        elif value == AUTO:
            c.note(f"{path} 'auto': DeepSpeed drops it and uses its default")
            continue
        elif key in K.ZERO_INT:
            resolved[key] = as_int(c, path, value, digit_strings=True)
        if key in K.ZERO3_KNOBS:
            c.used(path)
        elif key == "sub_group_size" and key in resolved and stage == 3 and accounting in ("realistic", "auto"):
            c.used(path)  # the optimizer's sub-groups: the step's flattened and upcast gradients (realistic)
            c.arguments["sub_group_size"] = resolved[key]
        elif key == "reduce_bucket_size" and key in resolved and stage in (1, 2, 3):
            c.used(path)  # the gradient bucket the realistic accounting holds during backward
            c.arguments["reduce_bucket_size"] = resolved[key]
        elif key == "overlap_comm" and isinstance(value, bool) and stage in (1, 2):
            c.used(path)  # ZeRO-1/2: a second gradient bucket in flight
            c.arguments["overlap_comm"] = value
        elif key == "contiguous_gradients" and value is True:
            c.used(path)  # DeepSpeed's default, which the realistic timelines follow (the gradient bucket)
        elif key == "overlap_comm":
            what = "one gradient bucket either way (side streams)" if stage == 3 else "no gradient bucket"
            c.ignore(path, f"stage {stage}: {what}")
        elif key in K.ZERO_UNMODELLED and key in resolved:
            c.unmodelled(path, f"{K.ZERO_UNMODELLED[key]} ({resolved[key]:,})")
        elif key in K.ZERO_UNMODELLED and value not in (False, None, {}):
            c.unmodelled(path, K.ZERO_UNMODELLED[key])
        elif key not in ("stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"):
            c.ignore(path, "no effect on the memory held" if key not in K.ZERO_UNMODELLED else "off")
    knobs = {K.ZERO3_KNOBS[k]: v for k, v in resolved.items() if k in K.ZERO3_KNOBS}
    if not knobs:
        return
    if stage != 3:
        c.note(f"{', '.join(sorted(knobs))}: ZeRO-3 settings, unused at stage {stage}")
    elif accounting in ("implementation", "realistic", "auto"):
        c.arguments.update(knobs)  # where auto answers with the paper's accounting, a note says they are unused
        c.arguments["accounting"] = accounting
    else:
        c.note("ZeRO-3 coordinator settings read; memcalc uses them with accounting 'realistic', 'implementation' "
               "or 'auto' (pass accounting=); the paper's accounting has no "
               "coordinator")  # fmt: skip


def _activation_checkpointing(c: Collector, data: Mapping[str, Any]) -> None:
    if "activation_checkpointing" not in data:
        return
    section = as_mapping(c, "activation_checkpointing", data["activation_checkpointing"])
    refuse_unknown(c, "activation_checkpointing", section, K.ACTIVATION_CHECKPOINTING_KEYS)
    for key, value in section.items():
        path = f"activation_checkpointing.{key}"
        if key in ("partition_activations", "cpu_checkpointing") and value is True:
            c.unmodelled(path, "checkpoints split over model-parallel ranks / kept on the CPU (deepspeed.checkpointing)")
        else:
            c.ignore(path, "off" if key in ("partition_activations", "cpu_checkpointing") else "checkpointing tuning")
