"""The batch numbers of a DeepSpeed config: micro-batch, accumulation and train batch, with "auto" resolved.

Sources: DeepSpeed 0.19 runtime/config.py ``DeepSpeedConfig._set_batch_related_parameters`` (the third number
derived from the other two and the data-parallel size; floor divisions, then ``_batch_assertion`` checks
train_batch_size == micro x accumulation x dp); transformers integrations/deepspeed.py
``HfTrainerDeepSpeedConfig.trainer_config_process`` ("auto" = per_device_train_batch_size,
gradient_accumulation_steps, world x micro x accumulation; an integer that disagrees is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memcalc.configs.reading import Collector, as_int
from memcalc.errors import InputError

AUTO = "auto"
HF_DEFAULT_MICRO_BATCH = 8  # transformers TrainingArguments.per_device_train_batch_size default
HF_DEFAULT_GRAD_ACCUM = 1  # TrainingArguments.gradient_accumulation_steps default


def _batch_value(c: Collector, data: Mapping[str, Any], key: str) -> int | str | None:
    if key not in data:
        return None
    c.used(key)
    v = data[key]
    return AUTO if v == AUTO else as_int(c, key, v, minimum=1)  # DeepSpeed multiplies these: no strings


def resolve_batch(c: Collector, data: Mapping[str, Any], world: int | None, micro: int | None, accum: int | None,
                  mp: int, seq_len: int | None) -> None:  # fmt: skip
    """Put gpus, grad_accum (and micro_batch with seq_len) into ``c.arguments``; dp = world / mp (tp x pp)."""
    if world is not None and (world < 1 or world % mp):
        raise InputError(f"{c.source}: world_size {world} is not a multiple of tp x pp = {mp}")
    dp = None if world is None else world // mp
    tbs, mbs, gas = (_batch_value(c, data, k) for k in
                     ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))  # fmt: skip
    # The Trainer's values: fill "auto", and must equal an integer the file gives.
    for key, given, default, what in (("train_micro_batch_size_per_gpu", micro, HF_DEFAULT_MICRO_BATCH, "micro_batch"),
                                      ("gradient_accumulation_steps", accum, HF_DEFAULT_GRAD_ACCUM, "grad_accum")):  # fmt: skip
        value = mbs if key == "train_micro_batch_size_per_gpu" else gas
        if value == AUTO:
            if given is None and (what == "grad_accum" or seq_len is not None):  # the micro-batch counts with seq_len
                name = "micro-batch" if what == "micro_batch" else "gradient accumulation"
                c.assume(f"{name} {default}, from {key} 'auto': the Trainer's default; pass {what}=")
            elif given is None:
                c.note(f"{key} 'auto' taken as the Trainer's default {default} (pass {what}= for yours)")
            value = default if given is None else given
        elif value is None and given is not None:
            value = given
        elif value is not None and given is not None and value != given:
            raise c.fail(key, f"{value} disagrees with {what}={given}; the Trainer refuses a mismatch (use \"auto\")")
        if key == "train_micro_batch_size_per_gpu":
            mbs = value
        else:
            gas = value
    if tbs == AUTO:
        if dp is None:
            c.note("train_batch_size 'auto' = world x micro-batch x accumulation: pass world_size= to fix the world")
            tbs = None
        else:  # the Trainer's world x per-device batch x accumulation, whichever of the two the file leaves out
            if mbs is None:
                c.note(f"train_batch_size 'auto' without train_micro_batch_size_per_gpu: the Trainer's default "
                       f"per-device batch {HF_DEFAULT_MICRO_BATCH} (pass micro_batch= for yours)")
            tbs = (dp * (mbs if mbs is not None else HF_DEFAULT_MICRO_BATCH)
                   * (gas if gas is not None else HF_DEFAULT_GRAD_ACCUM))  # fmt: skip
    # Plain DeepSpeed: derive the missing one of the three (DeepSpeedConfig._set_batch_related_parameters).
    if dp is None:
        if tbs is not None and mbs is not None and gas is not None:
            if tbs % (mbs * gas):
                raise c.fail("train_batch_size", f"{tbs} is not micro-batch {mbs} x accumulation {gas} x a whole number "
                                                 "of data-parallel ranks")  # fmt: skip
            dp = tbs // (mbs * gas)
            c.note(f"data-parallel size {dp} = train_batch_size {tbs} / ({mbs} x {gas}); world size {dp * mp} inferred")
        elif tbs is not None:
            raise c.fail("train_batch_size", f"{tbs} needs the world size to derive the micro-batch or accumulation; "
                                             "pass world_size=")  # fmt: skip
    else:
        if isinstance(tbs, int) and tbs < dp:
            raise c.fail("train_batch_size", f"{tbs} is below the data-parallel size {dp} (world {world} / (tp x pp) "
                                             f"{mp}): every rank needs a micro-batch of at least 1; accepted: a multiple "
                                             f"of {dp} or \"auto\"")  # fmt: skip
        if tbs is not None and mbs is not None and gas is None:
            gas = tbs // mbs // dp
        elif tbs is not None and gas is not None and mbs is None:
            mbs = tbs // dp // gas
        elif tbs is not None and mbs is None and gas is None:
            gas, mbs = 1, tbs // dp
        elif mbs is not None and gas is None:
            gas = 1
        if mbs is not None and gas is not None and tbs is not None and (not mbs or not gas or tbs != mbs * gas * dp):
            raise c.fail("train_batch_size", f"{tbs} != micro-batch {mbs} x accumulation {gas} x data-parallel size {dp} "
                                             f"(world {world} / (tp x pp) {mp}); accepted: {max(mbs, 1) * max(gas or 1, 1) * dp}"
                                             " or \"auto\"")  # fmt: skip
    if dp is not None:
        c.arguments["gpus"] = dp * mp
    if gas is not None:
        c.arguments["grad_accum"] = gas
    if mbs is None:
        c.note("no micro-batch in the file: pass micro_batch= (and seq_len=) to count activations")
    elif seq_len is not None:
        c.arguments["micro_batch"] = mbs
        c.arguments["seq_len"] = seq_len
    else:
        c.note(f"micro-batch {mbs} per GPU: pass seq_len= to count activations")
