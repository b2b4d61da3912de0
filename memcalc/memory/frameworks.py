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
  its coordinator decides (memcalc.memory.zero3) and reduce-scatters the padded gradients.
- torch.optim.Adam/AdamW keep exp_avg and exp_avg_sq like the parameter and a 4-byte ``step`` tensor per
  parameter tensor (not fused, not capturable); DeepSpeed's ZeRO-1/2/3 hand it one flat tensor per group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from memcalc.model.architecture import Architecture
from memcalc.inputs import Zero3Settings
from memcalc.model.params import embedding_params, position_params
from memcalc.units import ceil_div

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: a decoder layer, or the root (everything outside the layers)."""

    name: str
    shapes: tuple[Shape, ...]
    """Its parameter tensors, as ``nn.Linear`` ([out, in]) and ``nn.Embedding`` ([rows, width]) lay them out."""
    root: bool = False

    @property
    def numel(self) -> int:
        return sum(prod(s) for s in self.shapes)


def _norm(arch: Architecture) -> list[Shape]:
    return [(arch.hidden,), (arch.hidden,)] if arch.norm == "layernorm" and arch.norm_bias else [(arch.hidden,)]


def _linear(out: int, inp: int, bias: bool) -> list[Shape]:
    return [(out, inp)] + ([(out,)] if bias else [])


def _mlp(arch: Architecture, width: int) -> list[Shape]:
    h, b = arch.hidden, arch.mlp_bias
    if arch.gated_mlp:
        return _linear(width, h, b) + _linear(width, h, b) + _linear(h, width, b)
    return _linear(width, h, b) + _linear(h, width, b)


def layer_shapes(arch: Architecture, moe: bool) -> list[Shape]:
    """One decoder layer's parameter tensors (norms, attention, MLP or experts + router)."""
    h, q, kv = arch.hidden, arch.q_width, arch.kv_width
    shapes = _norm(arch) * arch.norms_per_layer
    if arch.fused_qkv:
        shapes += _linear(q + 2 * kv, h, arch.qkv_bias)
    else:
        shapes += _linear(q, h, arch.qkv_bias) + _linear(kv, h, arch.qkv_bias) + _linear(kv, h, arch.qkv_bias)
    shapes += _linear(h, q, arch.out_bias)
    if not moe:
        return shapes + _mlp(arch, arch.ffn_size)
    shapes += _linear(arch.experts, h, arch.router_bias)
    for _ in range(arch.experts):
        shapes += _mlp(arch, arch.expert_ffn_size)
    for _ in range(arch.shared_experts):
        shapes += _mlp(arch, arch.ffn_size)
    return shapes


@dataclass(frozen=True)
class Node:
    """A module of the model as it is called: the parameters it registers itself, and its children in call order."""

    name: str
    params: tuple[tuple[str, Shape], ...] = ()
    """(identity, shape); a tied head names the embedding's weight."""
    children: tuple[Node, ...] = ()
    container: bool = False
    """A ModuleList: never called itself (its members are), and size_based_auto_wrap_policy never wraps one."""
    layer: bool = False
    """A decoder layer: what the transformer auto-wrap policy wraps."""
    grad_input: bool = True
    """Its input needs a gradient, so a hook on its input fires in backward (not so for the model itself, the
    token and position embeddings)."""
    grad_output: bool = True
    """Its output needs a gradient, so it takes part in backward (not so for a rotary embedding's cos/sin)."""


@dataclass(frozen=True)
class Layout:
    """How a Hugging Face model class calls its modules, parameter-less ones included: they run hooks too, and
    DeepSpeed ZeRO-3 prefetches at every hook (memcalc.memory.zero3). Read from transformers' modeling code; the forward
    call order of every family here is checked against the real classes in tests/test_frameworks.py."""

    inner: str | None = None
    """The module between the root and the embeddings, layers and final norm (GPT2Model, LlamaModel, ...)."""
    embed_dropout: bool = False
    """A Dropout module called on the embeddings (GPT-2's ``drop``, GPT-NeoX's ``emb_dropout``)."""
    rotary: bool = False
    """A rotary-embedding module called once after the embeddings (its cos/sin need no gradient)."""
    attention_dropout: bool = False
    """A Dropout module on the attention probabilities, between QKV and the output projection (BLOOM)."""
    residual_dropout: bool = False
    """Dropout modules on the attention and MLP outputs (GPT-2's resid_dropout / mlp.dropout, NeoX's post_*)."""
    act: bool = False
    """An activation module between the MLP's projections."""
    mlp_module: bool = True
    """The MLP's projections sit in their own module (not so in OPT, whose layer holds fc1 and fc2)."""
    norms_first: bool = False
    """Both norms run before attention (Falcon's new decoder architecture: ln_attn, ln_mlp)."""
    project_out_last: bool = False
    """OPT-350M: project_out runs after the final norm, project_in after the embeddings."""


LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout(inner="transformer", embed_dropout=True, residual_dropout=True, act=True),
    "llama": Layout(inner="model", rotary=True, act=True),
    "mistral": Layout(inner="model", rotary=True, act=True),
    "qwen2": Layout(inner="model", rotary=True, act=True),
    "gpt_neox": Layout(inner="gpt_neox", embed_dropout=True, rotary=True, residual_dropout=True, act=True),
    "bloom": Layout(inner="transformer", attention_dropout=True, act=True),
    "falcon": Layout(inner="transformer", rotary=True, act=True),
    "opt": Layout(inner="decoder", act=True, mlp_module=False, project_out_last=True),
}
"""Families whose Hugging Face call layout the module tree follows; others (MoE models, no family) keep the
parameter-holding modules and their parents only."""


def layout(arch: Architecture) -> Layout | None:
    """The family's Hugging Face call layout, or None for memcalc's generic one."""
    if arch.moe or arch.family not in LAYOUTS:
        return None
    lay = LAYOUTS[arch.family]
    if arch.family == "falcon" and arch.position == "alibi":  # the ALiBi path calls attention_dropout as a module
        lay = replace(lay, attention_dropout=True)
    if arch.family == "falcon" and arch.parallel_block and arch.norms_per_layer == 2:  # ln_attn, ln_mlp
        lay = replace(lay, norms_first=True)
    return lay


def _leaf(name: str, shapes: list[Shape]) -> Node:
    return Node(name, tuple((f"{name}.{i}", s) for i, s in enumerate(shapes)))


def _layer_node(arch: Architecture, i: int) -> Node:
    """One decoder layer, in the order its modules are called: norm, attention (QKV, output), norm, MLP (or
    router + experts), with the parameter-less modules of the family's Hugging Face layout."""
    h, q, kv, p = arch.hidden, arch.q_width, arch.kv_width, f"layer{i}"
    lay = layout(arch) or Layout()
    if arch.fused_qkv:
        attn = [_leaf(f"{p}.qkv", _linear(q + 2 * kv, h, arch.qkv_bias))]
    else:
        attn = [_leaf(f"{p}.{x}", _linear(w, h, arch.qkv_bias)) for x, w in (("q", q), ("k", kv), ("v", kv))]
    if lay.attention_dropout:
        attn.append(Node(f"{p}.attention_dropout"))
    attn.append(_leaf(f"{p}.o", _linear(h, q, arch.out_bias)))
    if lay.residual_dropout:
        attn.append(Node(f"{p}.resid_dropout"))

    def mlp(name: str, width: int) -> list[Node]:
        b = arch.mlp_bias
        act = [Node(f"{name}.act")] if lay.act else []
        if arch.gated_mlp:  # down(act(gate(x)) * up(x))
            parts = [_leaf(f"{name}.gate", _linear(width, h, b)), *act, _leaf(f"{name}.up", _linear(width, h, b)),
                     _leaf(f"{name}.down", _linear(h, width, b))]  # fmt: skip
        else:  # fc2(act(fc1(x)))
            parts = [_leaf(f"{name}.fc1", _linear(width, h, b)), *act, _leaf(f"{name}.fc2", _linear(h, width, b))]
        if lay.residual_dropout:
            parts.append(Node(f"{name}.dropout"))
        return [Node(name, children=tuple(parts))] if lay.mlp_module else parts

    if arch.is_moe_layer(i):
        experts = Node(f"{p}.experts", children=tuple(x for e in range(arch.experts) for x in mlp(f"{p}.expert{e}", arch.expert_ffn_size)),
                       container=True)  # fmt: skip
        shared = [x for e in range(arch.shared_experts) for x in mlp(f"{p}.shared{e}", arch.ffn_size)]
        ffn = [Node(f"{p}.moe", children=(_leaf(f"{p}.router", _linear(arch.experts, h, arch.router_bias)), experts, *shared))]
    else:
        ffn = mlp(f"{p}.mlp", arch.ffn_size)
    norms = [_leaf(f"{p}.norm{k + 1}", _norm(arch)) for k in range(arch.norms_per_layer)]
    attention = Node(f"{p}.attn", children=tuple(attn))
    if lay.norms_first:
        children = [*norms, attention, *ffn]
    else:
        children = [norms[0], attention, *norms[1:], *ffn]
    return Node(p, children=tuple(children), layer=True)


def module_tree(arch: Architecture) -> Node:
    """The model as its modules are called: embeddings, the layers (a ModuleList), the final norm, the head.

    Families with a Hugging Face layout (``LAYOUTS``) follow their model class exactly, inner model module and
    parameter-less modules included; others keep the parameter-holding modules and their parents.
    """
    width = arch.embedding_dim or arch.hidden
    rows = embedding_params(arch) // width
    lay = layout(arch)
    plain = lay or Layout()
    children = [replace(_leaf("embed", [(rows, width)]), grad_input=False)]
    if position_params(arch):
        children.append(replace(_leaf("pos", [(arch.max_positions + arch.position_offset, arch.hidden)]), grad_input=False))
    projected = bool(arch.embedding_dim and arch.embedding_dim != arch.hidden)
    if projected:
        children.append(_leaf("project_in", [(arch.hidden, width)]))
        if not plain.project_out_last:
            children.append(_leaf("project_out", [(width, arch.hidden)]))
    if arch.embedding_norm:
        children.append(_leaf("embed_norm", _norm(arch)))
    if plain.embed_dropout:
        children.append(Node("embed_dropout"))
    if plain.rotary:
        children.append(Node("rotary_emb", grad_input=False, grad_output=False))
    children.append(Node("layers", children=tuple(_layer_node(arch, i) for i in range(arch.layers)), container=True))
    if arch.final_norm:
        children.append(_leaf("final_norm", _norm(arch)))
    if projected and plain.project_out_last:
        children.append(_leaf("project_out", [(width, arch.hidden)]))
    head = Node("head", (("embed.0", (rows, width)),)) if arch.tied_embeddings else _leaf("head", [(rows, width)])
    if lay is not None and lay.inner:
        inner = Node(lay.inner, children=tuple(children), grad_input=False)
        return Node("root", children=(inner, head), grad_input=False)
    return Node("root", children=(*children, head), grad_input=False)


def _params(node: Node) -> dict[str, Shape]:
    """module.parameters(): every parameter under the node, each once."""
    out = dict(node.params)
    for c in node.children:
        for k, v in _params(c).items():
            out.setdefault(k, v)
    return out


def units(arch: Architecture, min_num_params: int | None = None) -> list[Unit]:
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

    def walk(node: Node) -> int:
        total = sum(prod(s) for s in _params(node).values())
        if min_num_params is None:  # ModuleWrapPolicy({decoder layer})
            for c in node.children:
                walk(c)
            if node.layer:
                make_unit(node)
            return 0
        if total < min_num_params:
            return 0
        wrapped = sum(walk(c) for c in node.children)
        if total - wrapped >= min_num_params and not node.container and node.name != "root":
            make_unit(node)
            return total
        return wrapped

    root = module_tree(arch)
    walk(root)
    return [Unit("root", tuple(free(root).values()), root=True), *found]


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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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

    ZeRO-3's gathers are those of a steady-state step, or of the first step (``memcalc.memory.zero3.replay`` with ``z3``,
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
    from memcalc.memory.zero3 import persistent, replay  # memcalc.memory.zero3 walks this module's tree

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
