"""Live bytes of a training step, op by op, counted from the storages the ops create.

A ``TorchDispatchMode`` sees every aten op's outputs. Each output's ``UntypedStorage`` is counted once (views and
in-place results share their input's storage) and subtracted by a weakref callback when the storage dies, which is
when the caching allocator would get the block back. ``UntypedStorage.resize_`` is not an aten op the mode sees,
so it is wrapped: FSDP2 frees and refills its unsharded parameters that way
(torch ``distributed/fsdp/_fully_shard/_fsdp_param.py``: ``alloc_storage`` / ``free_storage``).
The same accounting as torch's ``distributed/_tools/mem_tracker.py`` (``_WeakRefInfo``, ``_track_resize``), except
that DTensor outputs are counted through their local shards only: a DTensor wrapper, and the global-shape meta
tensors of its sharding propagation, own no memory of their own. DTensor's dispatch runs below the mode, which sees
only its outputs; ``loss_parallel``'s handlers, whose temporaries are logit-sized, are run with the mode back on.

Works the same on real and on fake tensors (``torch._subclasses.fake_tensor``): a fake storage reports the bytes
a real one would hold, so a traced step on fake "cpu" tensors and the real step agree byte for byte.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import wraps

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

BASELINE = "baseline"
_WAIT = torch.ops._c10d_functional.wait_tensor.default


def _leaf_tensors(t: torch.Tensor) -> Iterable[torch.Tensor]:
    """The tensors that own memory behind ``t``: itself, or the inner tensors of a wrapper subclass (DTensor)."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        for a in attrs:
            inner = getattr(t, a)
            if isinstance(inner, torch.Tensor):  # DTensor also lists its device_mesh
                yield from _leaf_tensors(inner)
    elif t.device.type != "meta":  # meta tensors (shape propagation) own no memory; fake tensors report "cpu"
        yield t


@dataclass(frozen=True)
class Trace:
    """What one traced step held, in bytes."""

    baseline: int
    """Parameters, gradients, optimizer states and buffers alive before the step (one count per storage)."""
    peak: int
    """Most bytes live at once during the step, baseline included."""
    peak_phase: str
    """Phase label at the peak (``forward.layer.3``, ``loss``, ``backward``, ``optimizer`` ...)."""
    phase_peaks: dict[str, int]
    """Most bytes live during each phase, in the order the phases first ran."""
    end: int
    """Bytes live when the step ended (after ``zero_grad``)."""
    timeline: list[tuple[int, int, str]] = field(repr=False)
    """(event index, live bytes, phase) after every allocation, free and resize."""
    label: str = ""
    """The configuration traced, for printing."""
    seconds: float = 0.0
    """Wall time of the traced step."""
    peak_reserved: int = 0
    """The caching allocator's reserved peak over every traced step (``torch.cuda.max_memory_reserved`` after the
    last one): the states' and the steps' storages replayed in order through ``memcalc.memory.allocator.caching``, with the
    two cuBLAS workspaces; 0 when not replayed."""
    oom_request: int = 0
    """With a capacity: the segment the replayed allocator could not get (``torch.OutOfMemoryError``), else 0."""
    oom_free: int = 0
    """With a capacity: the bytes left outside the reserved segments when that request failed."""


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages; ``phase(label)`` marks where the step is.

    Usage: ``t = LiveBytes(); t.add_baseline(tensors); with t: ...; t.phase("backward"); ...``
    """

    propagating = 0
    """Above 0 inside loss_parallel's shape propagation, for every tracker on the stack: the global-shape tensors
    it makes own no memory."""

    def __init__(self, record_timeline: bool = True, record_blocks: bool = False) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.peak_phase = BASELINE
        self.phase_peaks: dict[str, int] = {}
        self.timeline: list[tuple[int, int, str]] = []
        self.events = 0
        self.current = BASELINE
        self.baseline = 0
        self._record = record_timeline
        self._sizes: dict[int, tuple[int, weakref.ref]] = {}  # storage cdata -> (bytes counted, weakref)
        self._orig_resize = None
        self.seconds = 0.0  # wall time of the traced step, set by the caller
        self.peak_reserved = 0  # set by the caller that replays the logged blocks
        self.oom: object = None  # memcalc.memory.allocator.caching.OutOfMemory, set by the same replay
        self.blocks: list[tuple[int, int]] | None = [] if record_blocks else None
        """With ``record_blocks``: ``(uid, nbytes)`` when a storage is allocated, ``(uid, -1)`` when it dies, in order:
        the requests a caching allocator would see (``memcalc.memory.allocator.caching.replay``)."""
        self._uids: dict[int, int] = {}  # storage cdata -> uid of its current allocation
        self._uid = 0

    # --- bookkeeping -------------------------------------------------------------------------------------------
    def _block(self, key: int, n: int) -> None:
        """Log the storage ``key`` now holding ``n`` bytes: its old allocation is freed, a new one made."""
        if self.blocks is None:
            return
        old = self._uids.pop(key, None)
        if old is not None:
            self.blocks.append((old, -1))
        if n:
            self._uid += 1
            self._uids[key] = self._uid
            self.blocks.append((self._uid, n))

    def _change(self, delta: int) -> None:
        self.live += delta
        self.events += 1
        if self._record:
            self.timeline.append((self.events, self.live, self.current))
        if self.live > self.phase_peaks.get(self.current, -1):
            self.phase_peaks[self.current] = self.live
        if self.live > self.peak:
            self.peak, self.peak_phase = self.live, self.current

    def _died(self, key: int, ref: weakref.ref) -> None:
        entry = self._sizes.get(key)
        if entry is not None and entry[1] is ref:
            del self._sizes[key]
            self._block(key, 0)
            if entry[0]:
                self._change(-entry[0])

    def _track(self, st: torch.UntypedStorage) -> None:
        key = st._cdata
        if key in self._sizes:
            return
        n = st.nbytes()
        ref = weakref.ref(st, lambda r, k=key: self._died(k, r))
        self._sizes[key] = (n, ref)
        self._block(key, n)
        if n:
            self._change(n)

    def track_tensor(self, t: torch.Tensor) -> None:
        for leaf in _leaf_tensors(t):
            self._track(leaf.untyped_storage())

    def _resized(self, st: torch.UntypedStorage) -> None:
        key, n = st._cdata, st.nbytes()
        entry = self._sizes.get(key)
        if entry is None:
            self._track(st)
        elif entry[0] != n:
            self._sizes[key] = (n, entry[1])
            self._block(key, n)
            self._change(n - entry[0])

    # --- public ------------------------------------------------------------------------------------------------
    def add_baseline(self, tensors: Iterable[torch.Tensor | None]) -> int:
        """Count tensors that exist before the step (parameters, gradients, optimizer states, buffers)."""
        before = self.live
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track_tensor(t)
        self.baseline += self.live - before
        self.phase_peaks[BASELINE] = self.live
        self.peak = max(self.peak, self.live)
        return self.baseline

    def phase(self, label: str) -> None:
        """Mark the start of a phase; the bytes live now count toward its peak."""
        self.current = label
        if self.live > self.phase_peaks.get(label, -1):
            self.phase_peaks[label] = self.live

    def stop(self) -> None:
        """The traced step is over: storages that die later (the model and the optimizer let go after it) no
        longer change ``live``, which stays what the step ended with."""
        self._sizes.clear()
        self._uids.clear()

    def result(self, label: str = "", seconds: float = 0.0) -> Trace:
        oom = self.oom
        return Trace(self.baseline, self.peak, self.peak_phase, dict(self.phase_peaks), self.live,
                     list(self.timeline), label, seconds, self.peak_reserved, getattr(oom, "request", 0),
                     getattr(oom, "free", 0))  # fmt: skip

    # --- mode --------------------------------------------------------------------------------------------------
    def __enter__(self) -> LiveBytes:
        self._orig_resize = orig = torch.UntypedStorage.resize_
        tracker = self

        @wraps(orig)
        def resize_(st: torch.UntypedStorage, size: int):
            out = orig(st, size)
            tracker._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
        super().__exit__(*exc)

    def _alias(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Count ``dst`` as the same memory as ``src``: the entry moves to ``dst``'s storage with no event."""
        for a, b in zip(_leaf_tensors(src), _leaf_tensors(dst)):
            sa, sb = a.untyped_storage(), b.untyped_storage()
            entry = self._sizes.get(sa._cdata)
            if sa._cdata == sb._cdata or entry is None or sb._cdata in self._sizes:
                continue
            del self._sizes[sa._cdata]
            key = sb._cdata
            if sa._cdata in self._uids:
                self._uids[key] = self._uids.pop(sa._cdata)
            self._sizes[key] = (entry[0], weakref.ref(sb, lambda r, k=key: self._died(k, r)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        handler = _loss_parallel_handler(func)
        if handler is not None and any(isinstance(a, torch.Tensor) and is_traceable_wrapper_subclass(a)
                                       for a in tree_flatten(args)[0]):
            out = self._run_loss_handler(handler, func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        if func is _WAIT and isinstance(out, torch.Tensor):
            # A real wait_tensor returns its input; the fake kernel returns a fresh tensor of the same size.
            self._alias(args[0], out)
        if LiveBytes.propagating:
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track_tensor(t)
        return out

    def _run_loss_handler(self, handler, func, args, kwargs):
        """loss_parallel's handlers compute on the local shards inside DTensor's dispatch, where this mode is off:
        run the handler with the mode back on the stack, so that its temporaries are counted, except inside its
        shape propagation (``_propagate_tensor_meta`` runs the op on global-shape tensors that own no memory)."""
        import torch.distributed.tensor.parallel.loss as lp

        propagate = lp._propagate_tensor_meta

        def unseen(*a, **k):
            LiveBytes.propagating += 1
            try:
                return propagate(*a, **k)
            finally:
                LiveBytes.propagating -= 1

        lp._propagate_tensor_meta = unseen
        _push_mode(self)
        try:
            return handler(func, args, kwargs)
        finally:
            _pop_mode()
            lp._propagate_tensor_meta = propagate


def _loss_parallel_handler(func):
    """loss_parallel's handler of ``func`` while it is enabled (torch ``distributed/tensor/parallel/loss.py``:
    ``customized_loss_ops``, installed into DTensor's ``_custom_op_handlers``), else None. Nothing is imported
    here, inside a traced op: where that module was never imported, loss_parallel cannot be on."""
    loss = sys.modules.get("torch.distributed.tensor.parallel.loss")
    ops = getattr(loss, "customized_loss_ops", None)
    if not ops or func not in ops:
        return None
    from torch.distributed.tensor import DTensor  # imported already: the loss module imports it

    return DTensor._op_dispatcher._custom_op_handlers.get(func)


def model_state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Parameters, their gradients, buffers and every tensor in the optimizer's state."""
    out: list[torch.Tensor] = []
    for p in model.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
    out.extend(model.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out
