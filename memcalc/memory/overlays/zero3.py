"""What DeepSpeed ZeRO-3 gathers, step by step: its parameter coordinator, replayed over the module tree.

DeepSpeed (runtime/zero/partitioned_param_coordinator.py, 0.19) fetches a module's parameters when a forward
or backward hook fires for it and releases them when the module is done. In the first step it records the
order in which modules run (the trace) and releases every parameter after use, so everything is gathered in
forward and again in backward. From the second step on it knows the trace and:

- prefetches: after each fetch it walks the parameter trace ahead and all-gathers parameters not yet present,
  up to ``min(stage3_max_live_parameters - live, stage3_prefetch_bucket_size)`` elements; a parameter it passes
  that is already present is marked as wanted at that later step and is not released before it;
- keeps a module's parameters after use when they appear again within ``stage3_max_reuse_distance`` elements
  of the modules still to run (counted with repeats);
- never releases "persistent" parameters (``numel <= stage3_param_persistence_threshold``): each rank keeps
  them whole and all-gathers them after every optimizer step.

``replay`` follows that code statement by statement (fetch, prefetch, release) over
the modules as they run (``memcalc.memory.accountings.frameworks.module_tree``, parameter-less modules included, since their hooks
fire too): forward in call order, each module before its children; backward each module whose output needs a
gradient before its children, the children reversed. A module's release comes after its children's; the
modules whose inputs need no gradient (the model itself, the token and position embeddings) release only when
backward ends.
Measured against DeepSpeed on CPU in tests/validation, every configuration byte for byte.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from math import prod

from memcalc.frozen import frozen
from memcalc.layout.plan import Zero3Settings
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture
from memcalc.model.tree import Node, lora_tree, module_tree
from memcalc.units import ceil_div

__all__ = ["Gathers", "Zero3Settings", "gathered_bytes", "persistent", "released_bytes", "replay"]

AVAILABLE, INFLIGHT, NOT_AVAILABLE = "available", "inflight", "not available"


@frozen
class Gathers:
    """Elements all-gathered in one training step (each parameter padded to a multiple of dp), by phase."""

    forward: int
    backward: int
    after_step: int
    """Persistent parameters, all-gathered after the optimizer step."""
    forward_calls: int
    backward_calls: int
    after_step_calls: int
    peak_live: int
    """The most elements the coordinator held gathered at once (its ``n_available_params``)."""


@frozen
class _Module:
    name: str
    params: tuple[str, ...]
    releases_at_end: bool
    """Its inputs need no gradient, so its post-backward hook never fires (DeepSpeed's backward leftovers)."""


@per_architecture
def _called(arch: Architecture, recompute: bool = False, lora=None
            ) -> tuple[list[tuple[str, str]], dict[str, _Module], dict[str, int]]:  # fmt: skip
    """Hook events in one step (("fetch" | "release", module)), the modules, and each parameter's numel.
    ``recompute``: each decoder layer is checkpointed; the backward of the first module its output's gradient
    reaches (fetched first) unpacks a checkpoint, which runs the layer's forward again (its forward hooks fire once
    more) before the rest of the layer's backward. ``lora``: the modules of a peft LoRA model
    (``memcalc.model.tree.lora_tree``)."""
    numel: dict[str, int] = {}
    mods: dict[str, _Module] = {}
    fwd: list[tuple[str, str]] = []
    bwd: list[tuple[str, str]] = []
    pending: list[Node] = []  # a checkpointed layer whose backward has started, its forward not yet run again

    def register(n: Node) -> None:
        for pid, shape in n.params:
            numel.setdefault(pid, prod(shape))
        mods[n.name] = _Module(n.name, tuple(pid for pid, _ in n.params), not n.grad_input)

    def forward(n: Node) -> None:
        if n.container:  # a ModuleList is never called; its members are
            for c in n.children:
                forward(c)
            return
        register(n)
        fwd.append(("fetch", n.name))
        for c in n.children:
            forward(c)
        fwd.append(("release", n.name))

    def backward(n: Node) -> None:
        if not n.grad_output:
            return
        if n.container:
            for c in reversed(n.children):
                backward(c)
            return
        bwd.append(("fetch", n.name))
        if recompute and n.layer:
            pending.append(n)
        if pending and not n.children:  # the first module the gradient reaches: its backward unpacks a checkpoint
            done = len(fwd)
            forward(pending.pop())
            bwd.extend(fwd[done:])
            del fwd[done:]
        for c in reversed(n.children):
            backward(c)
        if not mods[n.name].releases_at_end:
            bwd.append(("release", n.name))

    root = module_tree(arch) if lora is None else lora_tree(arch, lora)
    forward(root)
    backward(root)
    leftovers = [m for m in mods.values() if m.releases_at_end]
    events = fwd + [("backward", "")] + bwd + [("leftover", m.name) for m in reversed(leftovers)]
    return events, mods, numel


def _persistent(numel: dict[str, int], s: Zero3Settings) -> dict[str, int]:
    # deepspeed/runtime/zero/parameter_offload.py mark_persistent_parameters: ds_numel <= param_persistence_threshold
    return {p: n for p, n in numel.items() if n <= s.param_persistence_threshold}


def persistent(arch: Architecture, s: Zero3Settings, lora=None) -> dict[str, int]:
    """Parameters DeepSpeed keeps whole on every rank (numel <= stage3_param_persistence_threshold), with their numel."""
    return _persistent(_called(arch, False, lora)[2], s)


def replay(
    arch: Architecture, dp: int, s: Zero3Settings, first_step: bool = False, log: list[tuple[str, int, object]] | None = None
) -> Gathers:
    """Elements ZeRO-3 all-gathers in one step: the first (trace-recording) step, or any later one.

    ``log``, when given, receives ("ag", step, [parameters]) for each all-gather and ("rel", step, parameter) for
    each release, to set beside DeepSpeed's own debug log when a figure needs explaining.
    """
    if log is None:  # an estimate asks for the same replay several times (memory, traffic, notes)
        return _replay_once(arch, dp, s, first_step)
    return _replay(arch, dp, s, first_step, log)


@per_architecture
def gathered_bytes(arch: Architecture, dp: int, s: Zero3Settings, recompute: bool = False, width: int = 2,
                   lora=None) -> tuple[tuple[str, str, int, int], ...]:  # fmt: skip
    """(phase, module, running, fetching) for each module's fetch in a later step: the bytes of gathered
    parameters (``width`` bytes each) alive while the module runs (after its fetch and the prefetch that follows
    it), and at its fetch (the waits done, the flat all-gather buffers they emptied not yet freed); and
    ("loss", "", bytes, 0) as backward starts. Persistent parameters are left out (whole on every rank all step)."""
    mem: list[tuple[str, str, int, int]] = []
    _replay(arch, dp, s, False, None, mem, recompute, width, lora)
    return tuple(mem)


@per_architecture
def released_bytes(arch: Architecture, dp: int, s: Zero3Settings, recompute: bool = False, width: int = 2,
                   lora=None) -> tuple[tuple[str, str, int], ...]:  # fmt: skip
    """(phase, module, held) for each module's release in a later step: the bytes of gathered parameters alive once
    its post-hook has released what the reuse-distance rule lets go, before the next module's fetch (what a module's
    own work between two submodules, a gated MLP's product say, runs beside). Persistent parameters left out."""
    mem: list[tuple[str, str, int, int]] = []
    rel: list[tuple[str, str, int]] = []
    _replay(arch, dp, s, False, None, mem, recompute, width, lora, rel)
    return tuple(rel)


@per_architecture
def _replay_once(arch: Architecture, dp: int, s: Zero3Settings, first_step: bool) -> Gathers:
    return _replay(arch, dp, s, first_step, None)


def _replay(
    arch: Architecture, dp: int, s: Zero3Settings, first_step: bool, log: list[tuple[str, int, object]] | None,
    mem: list[tuple[str, str, int, int]] | None = None, recompute: bool = False, width: int = 2, lora=None,
    rel: list[tuple[str, str, int]] | None = None,
) -> Gathers:
    """The coordinator's fetches and releases over the modules as they run (``_Coordinator``); ``mem`` and ``rel``,
    when given, receive the bytes gathered at each fetch and release (``gathered_bytes``, ``released_bytes``)."""
    events, mods, numel = _called(arch, recompute, lora)
    c = _Coordinator(events, mods, numel, dp, s, first_step, log, mem, width, rel)
    for kind, name in events:
        if kind == "backward":
            c.phase = "backward"
            if mem is not None:  # gathered into the loss, as backward starts
                mem.append(("loss", "", c.held(), 0))
        elif kind == "fetch":
            c.fetch(name)
        elif kind == "release":
            c.release_module(name)
        else:  # leftover: released without the reuse check, persistent parameters kept
            for p in set(mods[name].params):
                c.active[p].discard(name)
                if p not in c.persist:
                    c.release(p)
    after = sum(c.padded[p] for p in c.persist)
    return Gathers(c.gathered["forward"], c.gathered["backward"], after, c.calls["forward"], c.calls["backward"],
                   1 if after else 0, c.peak)  # fmt: skip


class _Coordinator:
    """DeepSpeed's parameter coordinator over one step (partitioned_param_coordinator.py): each parameter's status,
    the modules using it, the trace it prefetches from, the elements live; and, for ``mem``, the bytes of its
    gathered copies and flat all-gather buffers."""

    __slots__ = ("mods", "numel", "s", "first_step", "log", "mem", "width", "rel", "persist", "padded", "trace",
                 "before", "uses", "status", "active", "queue", "fetched_for", "live", "peak", "step", "phase",
                 "gathered", "calls", "copies", "flats", "flat_bytes", "handle_of", "done")

    def __init__(self, events, mods: dict[str, _Module], numel: dict[str, int], dp: int, s: Zero3Settings,
                 first_step: bool, log: list[tuple[str, int, object]] | None,
                 mem: list[tuple[str, str, int, int]] | None, width: int,
                 rel: list[tuple[str, str, int]] | None) -> None:  # fmt: skip
        self.mods, self.numel, self.s, self.first_step = mods, numel, s, first_step
        self.log, self.mem, self.width, self.rel = log, mem, width, rel
        persist = self.persist = set(_persistent(numel, s))
        self.padded = {p: ceil_div(n, dp) * dp for p, n in numel.items()}
        trace = self.trace = [m for kind, m in events if kind == "fetch"]
        param_trace = [(p, i) for i, m in enumerate(trace) for p in mods[m].params]
        # Elements traversed before each trace position (the reuse-distance walk counts a parameter at every use).
        before = self.before = [0]
        for m in trace:
            before.append(before[-1] + sum(numel[p] for p in mods[m].params))
        uses: dict[str, list[int]] = {}
        for i, m in enumerate(trace):
            for p in mods[m].params:
                uses.setdefault(p, []).append(i)
        self.uses = uses
        # Persistent parameters are whole on every rank when a later step starts (gathered after the last step);
        # the first step releases them after use like the others.
        self.status = {p: AVAILABLE if p in persist and not first_step else NOT_AVAILABLE for p in numel}
        self.active: dict[str, set[str]] = {p: set() for p in numel}
        self.queue = deque(param_trace)
        self.fetched_for: dict[str, int] = {}
        self.live = self.peak = 0
        self.step = 0
        self.phase = "forward"
        self.gathered = {"forward": 0, "backward": 0}
        self.calls = {"forward": 0, "backward": 0}
        # Bytes (``mem``): one parameter gathered alone is a view of its padded all-gather buffer from the gather on
        # (``_all_gather_sequential``); several are gathered into one flat buffer of their padded partitions
        # (``_all_gather_dtype``), alive until the last of them is waited for, and the first wait copies each out
        # whole (``AllGatherCoalescedHandle.wait``: ``torch.cat`` of its slices), freed at its release.
        self.copies: dict[str, int] = {}
        self.flats: list[list] = []  # [bytes, params not yet waited for, copied out]
        self.flat_bytes = 0  # the bytes of the flat buffers alive: their sum, kept as they are made and freed
        self.handle_of: dict[str, int] = {}
        self.done: list[list] = []

    def held(self) -> int:
        """Bytes gathered: the copies and the flat buffers alive."""
        return sum(self.copies.values()) + self.flat_bytes

    def gather(self, params: list[str]) -> None:
        status, numel, padded = self.status, self.numel, self.padded
        todo = [p for p in params if status[p] == NOT_AVAILABLE]
        if not todo:
            return
        self.live += sum(numel[p] for p in todo)
        self.peak = max(self.peak, self.live)
        self.gathered[self.phase] += sum(padded[p] for p in todo)
        self.calls[self.phase] += 1
        if self.log is not None:
            self.log.append(("ag", self.step, sorted(todo)))
        for p in todo:
            status[p] = INFLIGHT
        if self.mem is not None and len(todo) == 1:
            self.copies[todo[0]] = self.width * padded[todo[0]]
        elif self.mem is not None:
            for p in todo:
                self.handle_of[p] = len(self.flats)
            flat = self.width * sum(padded[p] for p in todo)
            self.flats.append([flat, set(todo), False])
            self.flat_bytes += flat

    def wait(self, p: str) -> None:
        h = self.handle_of.pop(p, None)
        if h is None:
            return
        f = self.flats[h]
        if not f[2]:
            f[2] = True
            for q in f[1]:
                self.copies[q] = self.width * self.numel[q]
        f[1].discard(p)
        if not f[1]:
            self.done.append(f)  # freed once the module that waited for it has run (traced)

    def release(self, p: str) -> None:
        if self.status[p] == AVAILABLE and not self.active[p]:
            self.status[p] = NOT_AVAILABLE
            self.live -= self.numel[p]
            self.copies.pop(p, None)
            if self.log is not None:
                self.log.append(("rel", self.step, p))

    def to_release(self, m: _Module, at: int) -> set[str]:
        fetched_for = self.fetched_for
        out = {p for p in m.params if p not in self.persist and fetched_for.get(p, -(10**10)) <= at}
        # Modules within max_reuse_distance elements of ``at``: trace[at:end), end the first position where
        # the elements walked reach the distance.
        distance = self.s.max_reuse_distance
        end = bisect_left(self.before, self.before[at] + distance, lo=at) if distance > 0 else at
        end = min(end, len(self.trace))
        for p in list(out):
            u = self.uses[p]
            k = bisect_left(u, at)
            if k < len(u) and u[k] < end:
                out.discard(p)
        return out

    def fetch(self, name: str) -> None:
        """A module's pre-hook: its parameters gathered and waited for; in a later step, the trace advanced past
        them and the next parameters prefetched."""
        m, mem = self.mods[name], self.mem
        params = sorted(set(m.params), key=m.params.index)
        self.gather(params)
        for p in params:
            self.active[p].add(name)
            self.status[p] = AVAILABLE
            if mem is not None:
                self.wait(p)
        if mem is not None:
            peak_fetch = self.held()
        if not self.first_step:
            self.prefetch(name, params)
        if mem is not None:
            held = self.held()
            for f in self.done:  # the flat buffers whose last parameter this fetch waited for: freed as it returns
                held, self.flat_bytes, f[0] = held - f[0], self.flat_bytes - f[0], 0
            self.done.clear()
            mem.append((self.phase, name, held, peak_fetch))
        self.step += 1

    def prefetch(self, name: str, params: list[str]) -> None:
        """The trace popped past the module's own parameters, then walked ahead, gathering up to
        ``min(max_live_parameters - live, prefetch_bucket_size)`` elements not yet present."""
        queue, fetched_for, step, s = self.queue, self.fetched_for, self.step, self.s
        wanted = {p for p in params if fetched_for.get(p, -(10**10)) < step}
        popped: set[str] = set()
        while queue and len(popped) < len(wanted):
            p, at = queue.popleft()
            fetched_for[p] = at
            popped.add(p)
        assert popped == wanted, f"trace replay out of order at {name}"
        if s.prefetch_bucket_size > 0:
            budget = min(s.max_live_parameters - self.live, s.prefetch_bucket_size)
            ahead: dict[str, None] = {}  # insertion-ordered set
            n = 0
            while queue and n < budget:
                p, at = queue.popleft()
                fetched_for[p] = max(fetched_for.get(p, -(10**10)), at)
                if self.status[p] == NOT_AVAILABLE and p not in ahead:
                    ahead[p] = None
                    n += self.numel[p]
            if n > 0:
                self.gather(list(ahead))

    def release_module(self, name: str) -> None:
        """A module's post-hook: its parameters released but those used again within the reuse distance (all of
        them in the first step)."""
        m = self.mods[name]
        drop = set(m.params) if self.first_step else self.to_release(m, self.step)
        for p in set(m.params):
            self.active[p].discard(name)
            if p in drop:
                self.release(p)
        if self.rel is not None:
            self.rel.append((self.phase, name, self.held()))
