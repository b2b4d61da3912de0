"""The model as its modules are called: parameter tensors, the module tree and each family's call layout.

Read from transformers' modeling code (the call order of every family here is checked against the real classes
in tests/test_frameworks.py). FSDP's wrapping (``memcalc.memory.accountings.frameworks.units``) and DeepSpeed ZeRO-3's
coordinator (``memcalc.memory.overlays.zero3``) walk this tree.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from memcalc.errors import InputError
from memcalc.frozen import frozen
from memcalc.model.architecture import Architecture
from memcalc.model.memo import per_architecture
from memcalc.model.params import embedding_params, position_params

Shape = tuple[int, ...]


def _norm(arch: Architecture) -> list[Shape]:
    return [(arch.hidden,), (arch.hidden,)] if arch.norm == "layernorm" and arch.norm_bias else [(arch.hidden,)]


def _linear(out: int, inp: int, bias: bool) -> list[Shape]:
    return [(out, inp)] + ([(out,)] if bias else [])


def _mlp(arch: Architecture, width: int) -> list[Shape]:
    h, b = arch.hidden, arch.mlp_bias
    if arch.gated_mlp and arch.fused_gate_up:
        return _linear(2 * width, h, b) + _linear(h, width, b)
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
    if arch.qk_norm:
        shapes += [(w,) for w in arch.qk_norm_widths]
    shapes += _linear(h, q, arch.out_bias)
    if not moe:
        return shapes + _mlp(arch, arch.ffn_size)
    shapes += _linear(arch.experts, h, arch.router_bias)
    for _ in range(arch.experts):
        shapes += _mlp(arch, arch.expert_ffn_size)
    for _ in range(arch.shared_experts):
        shapes += _mlp(arch, arch.ffn_size)
    return shapes


@frozen
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


@frozen
class Layout:
    """How a Hugging Face model class calls its modules, parameter-less ones included: they run hooks too, and
    DeepSpeed ZeRO-3 prefetches at every hook (memcalc.memory.overlays.zero3). Read from transformers' modeling code; the forward
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
    grouped_experts: bool = False
    """An MoE layer's MLP is transformers 5's sparse block: a parameter-less module that calls its router (``gate``,
    E × h) and then one experts module holding every expert's gate_up (E × 2f × h) and down (E × h × f), which calls
    its activation module (``experts.act_fn``)."""


LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout(inner="transformer", embed_dropout=True, residual_dropout=True, act=True),
    "llama": Layout(inner="model", rotary=True, act=True),
    "mistral": Layout(inner="model", rotary=True, act=True),
    "qwen2": Layout(inner="model", rotary=True, act=True),
    "gpt_neox": Layout(inner="gpt_neox", embed_dropout=True, rotary=True, residual_dropout=True, act=True),
    "bloom": Layout(inner="transformer", attention_dropout=True, act=True),
    "falcon": Layout(inner="transformer", rotary=True, act=True),
    "opt": Layout(inner="decoder", act=True, mlp_module=False, project_out_last=True),
    "mixtral": Layout(inner="model", rotary=True, act=True, grouped_experts=True),
    "qwen3_moe": Layout(inner="model", rotary=True, act=True, grouped_experts=True),
}
"""Families whose Hugging Face call layout the module tree follows; others (no family, an MoE model of another
family) keep the parameter-holding modules and their parents only."""


def layout(arch: Architecture) -> Layout | None:
    """The family's Hugging Face call layout, or None for memcalc's generic one."""
    if arch.family not in LAYOUTS or (arch.moe and not LAYOUTS[arch.family].grouped_experts):
        return None
    lay = LAYOUTS[arch.family]
    if arch.family == "falcon" and arch.position == "alibi":  # the ALiBi path calls attention_dropout as a module
        lay = replace(lay, attention_dropout=True)
    if arch.family == "falcon" and arch.parallel_block and arch.norms_per_layer == 2:  # ln_attn, ln_mlp
        lay = replace(lay, norms_first=True)
    return lay


def _leaf(name: str, shapes: list[Shape]) -> Node:
    return Node(name, tuple((f"{name}.{i}", s) for i, s in enumerate(shapes)))


def _layer_node(arch: Architecture, i: int, experts: int | None = None, shared: int | None = None) -> Node:
    """One decoder layer, in the order its modules are called: norm, attention (QKV, output), norm, MLP (or
    router + experts), with the parameter-less modules of the family's Hugging Face layout.

    ``experts`` and ``shared``, when given, replace the architecture's expert counts (to count modules)."""
    experts = arch.experts if experts is None else experts
    shared = arch.shared_experts if shared is None else shared
    h, q, kv, p = arch.hidden, arch.q_width, arch.kv_width, f"layer{i}"
    lay = layout(arch) or Layout()
    if arch.fused_qkv:
        attn = [_leaf(f"{p}.qkv", _linear(q + 2 * kv, h, arch.qkv_bias))]
    else:
        attn = [_leaf(f"{p}.{x}", _linear(w, h, arch.qkv_bias)) for x, w in (("q", q), ("k", kv), ("v", kv))]
    if arch.qk_norm:  # Qwen3, OLMo 2: q_proj, q_norm, k_proj, k_norm, v_proj (Gemma 3 norms after v_proj)
        qn, kn = arch.qk_norm_widths
        attn[1:1] = [_leaf(f"{p}.q_norm", [(qn,)])]
        attn[3:3] = [_leaf(f"{p}.k_norm", [(kn,)])]
    if lay.attention_dropout:
        attn.append(Node(f"{p}.attention_dropout"))
    attn.append(_leaf(f"{p}.o", _linear(h, q, arch.out_bias)))
    if lay.residual_dropout:
        attn.append(Node(f"{p}.resid_dropout"))

    def mlp(name: str, width: int) -> list[Node]:
        b = arch.mlp_bias
        act = [Node(f"{name}.act")] if lay.act else []
        if arch.gated_mlp and arch.fused_gate_up:  # Phi-3: down(up * act(gate)), gate, up = gate_up(x).chunk(2)
            parts = [_leaf(f"{name}.gate_up", _linear(2 * width, h, b)), *act, _leaf(f"{name}.down", _linear(h, width, b))]
        elif arch.gated_mlp:  # down(act(gate(x)) * up(x))
            parts = [_leaf(f"{name}.gate", _linear(width, h, b)), *act, _leaf(f"{name}.up", _linear(width, h, b)),
                     _leaf(f"{name}.down", _linear(h, width, b))]  # fmt: skip
        else:  # fc2(act(fc1(x)))
            parts = [_leaf(f"{name}.fc1", _linear(width, h, b)), *act, _leaf(f"{name}.fc2", _linear(h, width, b))]
        if lay.residual_dropout:
            parts.append(Node(f"{name}.dropout"))
        return [Node(name, children=tuple(parts))] if lay.mlp_module else parts

    if arch.is_moe_layer(i) and lay.grouped_experts:
        f, router = arch.expert_ffn_size, _leaf(f"{p}.router", _linear(arch.experts, h, arch.router_bias))
        act = (Node(f"{p}.experts.act"),) if lay.act else ()
        grouped = Node(f"{p}.experts", ((f"{p}.experts.0", (experts, 2 * f, h)), (f"{p}.experts.1", (experts, h, f))),
                       children=act)  # fmt: skip
        always = [x for e in range(shared) for x in mlp(f"{p}.shared{e}", arch.ffn_size)]
        ffn = [Node(f"{p}.mlp", children=(router, grouped, *always))]
    elif arch.is_moe_layer(i):
        routed = Node(f"{p}.experts", children=tuple(x for e in range(experts) for x in mlp(f"{p}.expert{e}", arch.expert_ffn_size)),
                      container=True)  # fmt: skip
        always = [x for e in range(shared) for x in mlp(f"{p}.shared{e}", arch.ffn_size)]
        ffn = [Node(f"{p}.moe", children=(_leaf(f"{p}.router", _linear(arch.experts, h, arch.router_bias)), routed, *always))]
    else:
        ffn = mlp(f"{p}.mlp", arch.ffn_size)
    norms = [_leaf(f"{p}.norm{k + 1}", _norm(arch)) for k in range(arch.norms_per_layer)]
    attention = Node(f"{p}.attn", children=tuple(attn))
    if lay.norms_first:
        children = [*norms, attention, *ffn]
    elif arch.norm_placement == "sandwich":  # Gemma 2, 3: input, attention, post-attention, pre-MLP, MLP, post-MLP
        children = [norms[0], attention, *norms[1:3], *ffn, *norms[3:]]
    elif arch.norm_placement == "post":  # OLMo 2: attention, its norm, MLP, its norm
        children = [attention, norms[0], *ffn, *norms[1:]]
    else:
        children = [norms[0], attention, *norms[1:], *ffn]
    return Node(p, children=tuple(children), layer=True)


MAX_LAYER_MODULES = 10_000
"""The most decoder-layer modules ``module_tree`` builds: the implementation accounting replays each of them
(FSDP's wrapping, DeepSpeed ZeRO-3's coordinator, one Python step per hook), and at this size an estimate takes
at most about 0.8 s on a 2-core machine (the slowest: a generic layout with biases, 1 leaf per module) (tests/test_core_speed_laws.py times the largest accepted shapes)."""


def _count(node: Node) -> int:
    return 1 + sum(_count(c) for c in node.children)


def layer_modules(arch: Architecture) -> int:
    """Modules in the decoder layers, counted without building them: a MoE layer's count is affine in its routed
    and shared experts (each adds the same modules), so it is read off layers with one and two of each."""
    moe = arch.moe_layers
    # Layer 0 is dense whenever any layer is; layer moe_every - 1 is the first MoE layer.
    total = (arch.layers - moe) * _count(_layer_node(arch, 0)) if moe < arch.layers else 0
    if moe:
        first = arch.moe_every - 1
        base = _count(_layer_node(arch, first, 1, 1))
        per_routed = _count(_layer_node(arch, first, 2, 1)) - base
        per_shared = _count(_layer_node(arch, first, 1, 2)) - base
        total += moe * (base + (arch.experts - 1) * per_routed + (arch.shared_experts - 1) * per_shared)
    return total


def check_replayable(arch: Architecture) -> None:
    """InputError when the model has more decoder-layer modules than the implementation accounting replays."""
    n = layer_modules(arch)
    if n > MAX_LAYER_MODULES:
        raise InputError(
            f"--accounting implementation replays every module: at most {MAX_LAYER_MODULES:,} modules in the decoder "
            f"layers, this model has {n:,} ({arch.layers:,} layers, {arch.experts:,} experts); use --accounting paper"
        )


@per_architecture
def module_tree(arch: Architecture) -> Node:
    """The model as its modules are called: embeddings, the layers (a ModuleList), the final norm, the head.

    Families with a Hugging Face layout (``LAYOUTS``) follow their model class exactly, inner model module and
    parameter-less modules included; others keep the parameter-holding modules and their parents.
    InputError beyond ``MAX_LAYER_MODULES`` (``check_replayable``).
    """
    check_replayable(arch)
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


@per_architecture
def lora_tree(arch: Architecture, lora) -> Node:
    """``module_tree`` of a peft LoRA model (``memcalc.model.lora.LoraPlan``): each targeted projection becomes peft's
    ``lora.Linear``, a module without parameters of its own that calls, in order, its ``base_layer`` (the frozen
    weight, the same parameter ids), ``lora_dropout["default"]`` (``nn.Identity`` at dropout 0), ``lora_A["default"]``
    (r × in) and ``lora_B["default"]`` (out × r) (peft ``tuners/lora/layer.py`` ``Linear.forward``:
    ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``). The adapters' parameter ids end in ``.lora_A`` and
    ``.lora_B``."""
    from memcalc.model.lora import targeted

    suffix = {}  # the leaf's last name in ``_layer_node`` -> (in, out)
    for p in targeted(arch, lora):
        if len(p.names) > 1:  # one module for q, k, v, or for gate and up
            leaf = "qkv" if len(p.names) == 3 else "gate_up"
        elif not arch.gated_mlp and p.names[0] in ("up", "down"):  # fc2(act(fc1(x)))
            leaf = {"up": "fc1", "down": "fc2"}[p.names[0]]
        else:
            leaf = p.names[0]
        suffix[leaf] = (p.fan_in, p.fan_out)
    r = lora.rank

    def wrap(n: Node) -> Node:
        last = n.name.rsplit(".", 1)[-1]
        if n.params and not n.children and n.name.startswith("layer") and last in suffix:
            fan_in, fan_out = suffix[last]
            return Node(n.name, children=(
                Node(f"{n.name}.base_layer", n.params), Node(f"{n.name}.lora_dropout"),
                Node(f"{n.name}.lora_A", ((f"{n.name}.lora_A", (r, fan_in)),)),
                Node(f"{n.name}.lora_B", ((f"{n.name}.lora_B", (fan_out, r)),))))  # fmt: skip
        return replace(n, children=tuple(wrap(c) for c in n.children)) if n.children else n

    return wrap(module_tree(arch))


def subtree_numel(root: Node) -> dict[int, int]:
    """Elements of ``module_params(node)`` for every node under ``root`` (keyed by ``id(node)``), in one pass.

    Sums bottom-up; a subtree that holds a parameter registered more than once (a tied head) is counted
    with ``module_params``, each parameter once.
    """
    uses: dict[str, int] = {}
    stack = [root]
    while stack:
        n = stack.pop()
        for pid, _ in n.params:
            uses[pid] = uses.get(pid, 0) + 1
        stack.extend(n.children)
    shared = {pid for pid, k in uses.items() if k > 1}
    out: dict[int, int] = {}

    def visit(n: Node) -> bool:
        """Fill ``out`` under ``n``; whether the subtree holds a shared parameter."""
        has_shared = any(pid in shared for pid, _ in n.params)
        total = sum(prod(s) for _, s in n.params)
        for c in n.children:
            has_shared |= visit(c)
            total += out[id(c)]
        out[id(n)] = sum(prod(s) for s in module_params(n).values()) if has_shared else total
        return has_shared

    visit(root)
    return out


def module_params(node: Node) -> dict[str, Shape]:
    """module.parameters(): every parameter under the node, each once."""
    out = dict(node.params)
    for c in node.children:
        for k, v in module_params(c).items():
            out.setdefault(k, v)
    return out
