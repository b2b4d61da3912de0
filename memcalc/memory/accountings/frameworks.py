"""What DDP, FSDP1 and FSDP2 really hold and send (``--accounting implementation``), unit by unit.

Measured on torch 2.13 (CPU, gloo; ``tests/validation``) and read from the code it follows:
- DDP (torch/nn/parallel/distributed.py): the module's own parameters and gradients, plus gradient buckets
  (a second copy of the gradients unless ``gradient_as_bucket_view=True``); one all-reduce per bucket.
- FSDP1 (torch/distributed/fsdp/_flat_param.py): one FlatParameter per wrapped unit, padded to a multiple of
  the shard group and sharded; the sharded fp32 FlatParameter is the master copy under MixedPrecision, its
  gradient is kept sharded in the parameter dtype; forward all-gathers every unit, backward re-gathers every
  unit but the root (which FSDP does not reshard after forward), then reduce-scatters every unit in the
  reduce dtype (= param_dtype by default).
- FSDP2 (torch/distributed/fsdp/_fully_shard): every parameter sharded on dim 0, padded to a multiple of the
  shard group; the root module keeps its parameters gathered from forward to backward by default.
- DeepSpeed 0.19 (runtime/zero/stage_1_and_2.py, stage3.py; measured with a torch.optim.AdamW client optimizer):
  ZeRO-0 keeps the module in the training dtype, plus a full fp32 master copy under bf16/fp16; ZeRO-1/2 keep one
  flat buffer in the training dtype padded to a multiple of 2 x dp (nccl_start_alignment_factor), an fp32 master
  partition of it, all-reduce the gradients in backward and all-gather the updated flat buffer after the step;
  ZeRO-3 partitions every parameter on its own (⌈numel/dp⌉ each), keeps a low-precision partition, an fp32 master
  partition and a gradient partition, keeps "persistent" small parameters whole as well, all-gathers parameters as
  its coordinator decides (memcalc.memory.overlays.zero3) and reduce-scatters the padded gradients.
- torch.optim.Adam/AdamW keep exp_avg and exp_avg_sq like the parameter and a 4-byte ``step`` tensor per
  parameter tensor (not fused, not capturable); DeepSpeed's ZeRO-1/2/3 hand it one flat tensor per group.
"""

from __future__ import annotations

from math import prod

from memcalc.frozen import frozen
from memcalc.memory.overlays.zero3 import Zero3Settings, persistent, replay
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture
from memcalc.model.tree import Node, Shape, module_tree, subtree_numel
from memcalc.units import ceil_div


@frozen
class Unit:
    """One FSDP unit: a decoder layer, or the root (everything outside the layers)."""

    name: str
    shapes: tuple[Shape, ...]
    """Its parameter tensors, as ``nn.Linear`` ([out, in]) and ``nn.Embedding`` ([rows, width]) lay them out."""
    root: bool = False

    @property
    def numel(self) -> int:
        return sum(prod(s) for s in self.shapes)


def units(arch: Architecture, min_num_params: int | None = None) -> list[Unit]:
    """FSDP units, the root first (``_units``; one wrapping per model and policy, made once)."""
    return list(_units(arch, min_num_params))


@per_architecture
def _units(arch: Architecture, min_num_params: int | None) -> tuple[Unit, ...]:
    """FSDP units, the root first: one per decoder layer (transformer auto-wrap policy, the default), or as
    torch.distributed.fsdp.wrap.size_based_auto_wrap_policy decides with ``min_num_params``.

    Follows torch's ``_recursive_wrap``: recurse into a module whose parameters reach the threshold; after its
    children, wrap it if what its wrapped children left still reaches it (never a ModuleList). A unit holds the
    parameters of the modules under it that no unit below took, each once; the root takes the rest.

    As FSDP1 flattens them: a tied weight whose modules land in different units (an embedding wrapped on its
    own, the head left to the root) is flattened into each of them, so every such unit holds a copy.
    """
    wrapped_nodes: set[str] = set()
    found: list[Unit] = []

    def free(node: Node) -> dict[str, Shape]:
        """Parameters of the modules under ``node`` that are not inside a unit already made, each once."""
        if node.name in wrapped_nodes:
            return {}
        out = dict(node.params)
        for c in node.children:
            for k, v in free(c).items():
                out.setdefault(k, v)
        return out

    def make_unit(node: Node) -> None:
        own = free(node)
        wrapped_nodes.add(node.name)
        if own:  # a module whose parameters all sit in units below gets no FlatParameter
            found.append(Unit(node.name, tuple(own.values())))

    root = module_tree(arch)
    numel = subtree_numel(root) if min_num_params is not None else {}

    def walk(node: Node) -> int:
        if min_num_params is None:  # ModuleWrapPolicy({decoder layer})
            for c in node.children:
                walk(c)
            if node.layer:
                make_unit(node)
            return 0
        total = numel[id(node)]  # sum(numel of module_params(node))
        if total < min_num_params:
            return 0
        wrapped = sum(walk(c) for c in node.children)
        if total - wrapped >= min_num_params and not node.container and node.name != "root":
            make_unit(node)
            return total
        return wrapped

    walk(root)
    return (Unit("root", tuple(free(root).values()), root=True), *found)


def fsdp1_shard(unit: Unit, n: int) -> int:
    """Elements of a unit's FlatParameter one rank holds: ⌈numel / n⌉ (the flat buffer is padded to n x that)."""
    return ceil_div(unit.numel, n)


def fsdp2_shard(unit: Unit, n: int) -> int:
    """Elements one rank holds of a unit under fully_shard: each parameter's dim 0 padded to a multiple of n."""
    return sum(ceil_div(s[0], n) * prod(s[1:]) for s in unit.shapes)


def fsdp2_local(unit: Unit, n: int, rank: int) -> int:
    """Unpadded elements rank ``rank`` owns of a unit under fully_shard: the rows of each dim-0 chunk that hold data.

    The parameter and gradient storages are padded (every rank the same, ``fsdp2_shard``); the optimizer's
    moments are made like the unpadded local tensor, so the last ranks can hold fewer.
    """
    total = 0
    for s in unit.shapes:
        chunk = ceil_div(s[0], n)
        rows = max(0, min(chunk, s[0] - rank * chunk))
        total += rows * prod(s[1:])
    return total


@frozen
class Held:
    """Bytes one rank holds after an optimizer step."""

    parameters: int
    gradients: int
    optimizer_moments: int
    optimizer_steps: int
    """torch.optim Adam/AdamW: one 4-byte ``step`` tensor per parameter tensor (or FlatParameter)."""
    buckets: int = 0
    """DDP gradient buckets."""
    master: int = 0
    """DeepSpeed's fp32 copy of the parameters (DDP and FSDP update the parameters themselves)."""
    backward_gradients: int = 0
    """DeepSpeed: gradients alive during backward and freed by the end of the step (not in ``gradients``)."""
    step_gradients: int = 0
    """DeepSpeed: the fp32 gradients the optimizer reads during the step, freed after it."""
    live: int = 0
    """DeepSpeed ZeRO-3: the most gathered parameter bytes held at once (its coordinator's live count)."""


@frozen
class Issued:
    """One collective as the framework issues it, summed over calls in one step."""

    op: str
    phase: str
    tensor: str
    group: str
    group_size: int
    dtype_bytes: int
    calls: int
    payload_bytes: int


def ddp(arch: Architecture, dp: int, param_bytes: int, moments: int, moment_bytes: int, step_counter: bool,
        bucket_view: bool) -> tuple[Held, list[Issued]]:  # fmt: skip
    """DDP: everything replicated; buckets hold a copy of the gradients unless they are views of them."""
    us = units(arch)
    numel = sum(u.numel for u in us)
    tensors = sum(len(u.shapes) for u in us)
    held = Held(numel * param_bytes, numel * param_bytes, numel * moments * moment_bytes,
                4 * tensors if step_counter else 0, 0 if bucket_view else numel * param_bytes)  # fmt: skip
    return held, [Issued("all-reduce", "backward", "gradients", "data-parallel", dp, param_bytes, 1, numel * param_bytes)]


def fsdp(
    arch: Architecture,
    version: int,
    dp: int,
    n: int,
    replicas: int,
    reshard_after_forward: bool,
    shards: bool,
    store_bytes: int,
    comm_bytes: int,
    moments: int,
    moment_bytes: int,
    step_counter: bool,
    min_num_params: int | None = None,
) -> tuple[Held, list[Issued]]:
    """FSDP1 (flat parameters) or FSDP2 (per-parameter dim-0 shards), one unit per decoder layer or as the
    size-based policy wraps (``min_num_params``).

    ``n``: the shard group; ``replicas``: copies across which hybrid strategies all-reduce the shard;
    ``store_bytes``: the sharded parameters' dtype (fp32 under mixed precision); ``comm_bytes``: the dtype
    collectives run in (param_dtype / reduce_dtype under mixed precision).
    """
    # A unit with no parameters of its own (the root, when the size policy wrapped an inner module holding the
    # rest) has no FlatParameter / parameter group: it gathers nothing and issues no collective.
    us = [u for u in units(arch, min_num_params) if u.shapes]
    if not shards:
        numel = sum(u.numel for u in us)
        tensors = len(us) if version == 1 else sum(len(u.shapes) for u in us)
        held = Held(numel * store_bytes, numel * store_bytes, numel * moments * moment_bytes,
                    4 * tensors if step_counter else 0)  # fmt: skip
        ar = [Issued("all-reduce", "backward", "gradients", "data-parallel", dp, comm_bytes, len(us), numel * comm_bytes)]
        return held, ar
    local = [fsdp1_shard(u, n) if version == 1 else fsdp2_shard(u, n) for u in us]
    per_rank = sum(local)
    tensors = len(us) if version == 1 else sum(len(u.shapes) for u in us)
    held = Held(per_rank * store_bytes, per_rank * store_bytes, per_rank * moments * moment_bytes,
                4 * tensors if step_counter else 0)  # fmt: skip
    gathered = sum(n * x for x in local)
    regathered = sum(n * x for u, x in zip(us, local, strict=True) if not u.root) if reshard_after_forward else 0
    group = "shard group" if replicas > 1 else "data-parallel"
    rows = [Issued("all-gather", "forward", "parameters", group, n, comm_bytes, len(us), gathered * comm_bytes)]
    if regathered:
        calls = sum(1 for u in us if not u.root)
        rows.append(Issued("all-gather", "backward", "parameters", group, n, comm_bytes, calls, regathered * comm_bytes))
    rows.append(Issued("reduce-scatter", "backward", "gradients", group, n, comm_bytes, len(us), gathered * comm_bytes))
    if replicas > 1:
        rows.append(Issued("all-reduce", "backward", "gradients", "replica group", replicas, comm_bytes, len(us),
                           per_rank * comm_bytes))  # fmt: skip
    return held, rows


def deepspeed(
    arch: Architecture, stage: int, dp: int, lp_bytes: int, moments: int, step_counter: bool,
    z3: Zero3Settings | None = None,
    first_step: bool = False,
) -> tuple[Held, list[Issued]]:
    """DeepSpeed ZeRO-0..3 with a torch.optim client optimizer (fp32 moments), ``lp_bytes`` the training dtype.

    ZeRO-3's gathers are those of a steady-state step, or of the first step (``memcalc.memory.overlays.zero3.replay`` with ``z3``,
    DeepSpeed's defaults when None)."""
    us = units(arch)
    shapes = [s for u in us for s in u.shapes]
    psi = sum(prod(s) for s in shapes)
    steps = 4 if step_counter else 0
    mom = 4 * moments
    if stage == 0:
        master = 4 * psi if lp_bytes < 4 else 0  # BF16/FP16 optimizer wrapper: fp32 copies of every parameter
        held = Held(psi * lp_bytes, 0, psi * mom, steps * len(shapes), master=master,
                    backward_gradients=psi * lp_bytes, step_gradients=4 * psi if lp_bytes < 4 else 0)  # fmt: skip
        return held, [Issued("all-reduce", "backward", "gradients", "data-parallel", dp, lp_bytes, 1, psi * lp_bytes)]
    if stage in (1, 2):
        padded = ceil_div(psi, 2 * dp) * 2 * dp  # nccl_start_alignment_factor (2) x dp
        part = padded // dp
        # ZeRO-1 accumulates full gradients until the boundary; ZeRO-2 keeps only its averaged partition.
        during = psi * lp_bytes if stage == 1 else part * lp_bytes
        held = Held(padded * lp_bytes, 0, part * mom, steps, master=4 * part, backward_gradients=during,
                    step_gradients=4 * part)  # fmt: skip
        return held, [
            Issued("all-reduce", "backward", "gradients", "data-parallel", dp, lp_bytes, 1, psi * lp_bytes),
            Issued("all-gather", "optimizer step", "parameters", "data-parallel", dp, lp_bytes, 1, padded * lp_bytes),
        ]
    z3 = z3 or Zero3Settings()
    part = sum(ceil_div(s[0] * prod(s[1:]), dp) for s in shapes)
    # Persistent parameters: every rank also keeps them whole, in the buffer they were all-gathered into (padded).
    whole = sum(ceil_div(n, dp) * dp for n in persistent(arch, z3).values())
    g = replay(arch, dp, z3, first_step=first_step)
    held = Held((part + whole) * lp_bytes, part * lp_bytes, part * mom, steps, master=4 * part, step_gradients=4 * part,
                live=g.peak_live * lp_bytes)  # fmt: skip
    rows = [Issued("all-gather", "forward", "parameters", "data-parallel", dp, lp_bytes, g.forward_calls, g.forward * lp_bytes),
            Issued("all-gather", "backward", "parameters", "data-parallel", dp, lp_bytes, g.backward_calls,
                   g.backward * lp_bytes),
            Issued("reduce-scatter", "backward", "gradients", "data-parallel", dp, lp_bytes, 1, dp * part * lp_bytes),
            Issued("all-gather", "optimizer step", "parameters", "data-parallel", dp, lp_bytes, g.after_step_calls,
                   g.after_step * lp_bytes)]  # fmt: skip
    return held, [r for r in rows if r.calls]
