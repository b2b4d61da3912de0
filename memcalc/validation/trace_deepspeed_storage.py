"""Which DeepSpeed structure holds each storage live during a traced step: the call site that created it and the
engine attribute (ZeRO's flat buffers, partitions and gradient buckets) that names it. Used by
``memcalc.validation.trace_deepspeed``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from memcalc.validation.trace_tracker import BASELINE, LiveBytes

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_WRAPPERS = ("typing_extensions.py", "contextlib.py", "functools.py", os.path.join("deepspeed", "utils", "nvtx.py"))
_OWN = {os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace_deepspeed.py"),
        os.path.abspath(sys.modules[LiveBytes.__module__].__file__ or "")}
"""Frames skipped when naming the call site that allocated a storage: this tracer's own and its tracker's."""


@dataclass(frozen=True)
class Held:
    """One storage live at a moment of the step."""

    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    """The tensor's shape, or ``(elements,)`` when the tensor seen first was a view of part of the storage."""
    created: str
    """The phase that allocated it, or ``baseline``."""
    name: str
    """What holds it (``zero_opt.<attr>``, ``param <name>.grad``, ``optimizer.state[i].exp_avg``), or ''."""
    site: str
    """``file:line function`` that allocated it (``autograd`` for backward kernels); '' for baseline storages."""
    op: str


class _Info:
    __slots__ = ("created", "dtype", "name", "nbytes", "op", "shape", "site")

    def __init__(self, nbytes: int, dtype: str, shape: tuple, created: str, site: str, op: str) -> None:
        self.nbytes, self.dtype, self.shape, self.created = nbytes, dtype, shape, created
        self.site, self.op, self.name = site, op, ""

    def held(self) -> Held:
        return Held(self.nbytes, self.dtype, self.shape, self.created, self.name, self.site, self.op)


def _site() -> str:
    """The innermost caller outside torch, decorators and this tracker; ``autograd`` for backward kernels."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(_TORCH_DIR):
            if os.sep + "autograd" + os.sep in fn:
                return "autograd"
        elif os.path.abspath(fn) not in _OWN and not fn.endswith(_WRAPPERS):
            short = fn.split("site-packages" + os.sep, 1)[1] if "site-packages" in fn else os.path.basename(fn)
            return f"{short}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return "?"


class AttributedLiveBytes(LiveBytes):
    """``LiveBytes`` that also records what each live storage is and keeps the live set at each phase's peak."""

    def __init__(self) -> None:
        super().__init__()
        self.info: dict[int, _Info] = {}
        self.snapshots: dict[str, list[_Info]] = {}
        self._op = ""
        self._tensor: torch.Tensor | None = None

    def _snap(self) -> None:
        if self.live >= self.phase_peaks.get(self.current, -1):
            self.snapshots[self.current] = list(self.info.values())

    def _track(self, st: torch.UntypedStorage) -> None:
        key = st._cdata
        if key in self._sizes:
            return
        t, n = self._tensor, st.nbytes()
        shape: tuple[int, ...] = ()
        if t is not None:
            shape = tuple(t.shape) if t.numel() * t.element_size() == n else (n // t.element_size(),)
        self.info[key] = _Info(n, str(t.dtype).removeprefix("torch.") if t is not None else "?", shape, self.current,
                               "" if self.current == BASELINE else _site(), self._op)  # fmt: skip
        super()._track(st)
        if n:
            self._snap()

    def _died(self, key: int, ref) -> None:
        entry = self._sizes.get(key)
        if entry is not None and entry[1] is ref:
            self.info.pop(key, None)
        super()._died(key, ref)

    def _resized(self, st: torch.UntypedStorage) -> None:
        super()._resized(st)
        if st._cdata in self.info:
            self.info[st._cdata].nbytes = st.nbytes()
        self._snap()

    def track_tensor(self, t: torch.Tensor) -> None:
        self._tensor = t
        super().track_tensor(t)
        self._tensor = None

    def phase(self, label: str) -> None:
        super().phase(label)
        self._snap()

    def name(self, names: dict[int, str]) -> None:
        """Give live storages still unnamed their holder's name (storage key -> name)."""
        for key, label in names.items():
            if key in self.info and not self.info[key].name:
                self.info[key].name = label

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._op = str(func.overloadpacket.__name__)
        return super().__torch_dispatch__(func, types, args, kwargs)


_FIRST = ("bit16_groups_flat", "single_partition_of_fp32_groups", "fp16_partitioned_groups_flat",
          "fp32_partitioned_groups_flat", "grads_in_partition", "averaged_gradients", "ipg_buckets", "fp32_groups")


def named_storages(engine: Any) -> dict[int, str]:
    """Storage key -> the name of the biggest tensor on it that DeepSpeed's flat buffers, the inner optimizer's
    state, the module's parameters (with ``.grad`` and ZeRO-3's ``ds_tensor``) and buffers, or the rest of the
    ZeRO optimizer's attributes hold (in that order; the first found among equals)."""
    best: dict[int, tuple[int, str]] = {}
    seen: set[int] = set()

    def add(label: str, t: torch.Tensor) -> None:
        if t.device.type != "meta":
            key = t.untyped_storage()._cdata
            if key not in best or t.numel() > best[key][0]:
                best[key] = (t.numel(), label)

    def walk(x: Any, label: str, depth: int) -> None:
        if id(x) in seen or depth > 6:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            add(label, x)
            if x.grad is not None:
                add(label + ".grad", x.grad)
            for k, v in vars(x).items() if hasattr(x, "__dict__") else ():
                if isinstance(v, torch.Tensor):
                    walk(v, f"{label}.{k}", depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{label}[{i}]", depth + 1)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{label}[{k!r}]" if isinstance(k, (str, int)) else f"{label}[.]", depth + 1)
        elif not isinstance(x, torch.nn.Module) and type(x).__module__.startswith(("deepspeed", "torch.optim")):
            attrs = vars(x) if hasattr(x, "__dict__") else {}
            for k in [a for a in _FIRST if a in attrs] + [a for a in attrs if a not in _FIRST]:
                walk(attrs[k], f"{label}.{k.split('__')[-1]}", depth + 1)

    zero_opt = engine.optimizer
    inner = getattr(zero_opt, "optimizer", zero_opt)
    for attr in _FIRST:
        if hasattr(zero_opt, attr):
            walk(getattr(zero_opt, attr), f"zero_opt.{attr}", 1)
    index = {id(p): i for i, p in enumerate(p for g in getattr(inner, "param_groups", []) for p in g["params"])}
    for p, state in getattr(inner, "state", {}).items():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                add(f"optimizer.state[{index.get(id(p), '?')}].{k}", v)
    for n, p in engine.module.named_parameters():
        walk(p, f"param {n}", 1)
    for n, b in engine.module.named_buffers():
        add(f"buffer {n}", b)
    walk(zero_opt, "zero_opt", 0)
    return {k: v[1] for k, v in best.items()}


