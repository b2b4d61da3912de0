"""The as-implemented formulas (memcalc.memory.accountings.frameworks) by hand; tests/validation proves them against real runs."""

import pytest

import memcalc
from memcalc.model import tree
from memcalc.memory.accountings import frameworks as fw
from memcalc.model.params import model_params
from memcalc.inputs.presets import load_model


@pytest.mark.parametrize("name", ["gpt2", "llama-2-7b", "mixtral-8x7b", "falcon-7b", "opt-1.3b", "bloom-176b"])
@pytest.mark.parametrize("min_num_params", [None, 10**6, 10**8])
def test_units_hold_every_parameter_once(name, min_num_params):
    a = load_model(name)
    us = fw.units(a, min_num_params)
    extra = 0
    if a.tied_embeddings:  # FSDP1 flattens a tied weight into every unit that reaches it: embedding's and head's
        def find(node, name):
            return node if node.name == name else next((x for c in node.children if (x := find(c, name))), None)

        shape = find(tree.module_tree(a), "embed").params[0][1]
        copies = sum(u.shapes.count(shape) for u in us)
        assert copies == 1 or (min_num_params is not None and copies == 2)
        extra = (copies - 1) * shape[0] * shape[1]
    assert sum(u.numel for u in us) == model_params(a).total + extra
    assert us[0].root and all(not u.root for u in us[1:]) and all(u.numel for u in us[1:])


def test_a_tied_embedding_split_across_units_is_held_twice():
    # gpt2 at 1e6: the embedding (38.6M) is wrapped alone and the head, reaching the same weight, too.
    us = fw.units(load_model("gpt2"), 10**6)
    assert [u.name for u in us if u.shapes == ((50257, 768),)] == ["embed", "head"]


def test_transformer_policy_wraps_each_layer():
    a = load_model("llama-2-7b")
    us = fw.units(a)
    assert len(us) == 1 + 32
    assert {u.numel for u in us[1:]} == {202_383_360}
    assert us[0].numel == 2 * 131_072_000 + 4096  # embedding, head, final norm


def test_size_policy_follows_torchs_recursive_wrap():
    # gpt2 (GPT2LMHeadModel) at min_num_params = 1e6: each layer (7.1M) is recursed into; its QKV (1.77M), fc1 (2.36M)
    # and fc2 (2.36M) are wrapped, and what is left of the layer (ln, attention output 0.59M) is below 1e6, so the
    # layer is not. The embedding (38.6M) is wrapped on its own. What the inner `transformer` module has left
    # (positions, the layers' leftovers, the final norm: 7.9M) reaches 1e6, so it is wrapped too; so is the head,
    # whose tied weight (38.6M) FSDP1 flattens a second time. The root keeps nothing.
    a = load_model("gpt2")
    us = fw.units(a, 10**6)
    names = [u.name for u in us]
    assert names[:5] == ["root", "embed", "layer0.qkv", "layer0.mlp.fc1", "layer0.mlp.fc2"]
    assert names[-2:] == ["transformer", "head"] and len(us) == 4 + 12 * 3
    h = 768
    per_layer_left = 4 * h + h * h + h  # two LayerNorms + attention output projection
    assert us[0].numel == 0 and us[-2].numel == 1024 * h + 12 * per_layer_left + 2 * h
    # A threshold above the whole model leaves one unit: the root.
    assert [u.name for u in fw.units(a, 10**9)] == ["root"]


def test_size_policy_in_the_estimate():
    r = memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, accounting="implementation", min_num_params="1M")
    assert any("size_based_auto_wrap_policy(min_num_params=1,000,000): 39 units" in n for n in r.notes), r.notes
    forward = next(c for c in r.communication.collectives if c.op == "all-gather" and c.phase == "forward")
    assert forward.calls_per_step == 39


def test_fsdp_shards():
    u = fw.Unit("x", ((101, 60), (60,)))
    assert fw.fsdp1_shard(u, 4) == -(-(101 * 60 + 60) // 4)
    assert fw.fsdp2_shard(u, 4) == 26 * 60 + 15  # dim 0 of each parameter padded: ⌈101/4⌉ rows, ⌈60/4⌉
    assert [fw.fsdp2_local(u, 4, r) for r in range(4)] == [26 * 60 + 15, 26 * 60 + 15, 26 * 60 + 15, 23 * 60 + 15]


def test_deepspeed_padding_rules():
    a = load_model("gpt2")
    psi = model_params(a).total  # 124,439,808
    held, issued = fw.deepspeed(a, 2, 3, lp_bytes=2, moments=2, step_counter=True)
    padded = -(-psi // 6) * 6  # flat buffer padded to 2 x dp
    assert held.parameters == 2 * padded and held.master == 4 * padded // 3
    assert held.optimizer_moments == 8 * padded // 3 and held.optimizer_steps == 4
    assert [(x.op, x.phase, x.payload_bytes) for x in issued] == [
        ("all-reduce", "backward", 2 * psi),  # ZeRO-1/2 all-reduce the (unpadded) gradients
        ("all-gather", "optimizer step", 2 * padded),
    ]
    from memcalc.memory.overlays.zero3 import Zero3Settings, replay

    shapes = [s for u in fw.units(a) for s in u.shapes]
    part = sum(-(-(s[0] * (s[1] if len(s) > 1 else 1)) // 8) for s in shapes)
    held3, issued3 = fw.deepspeed(a, 3, 8, lp_bytes=2, moments=2, step_counter=True,
                                  z3=Zero3Settings(param_persistence_threshold=0))  # fmt: skip
    assert held3.parameters == held3.gradients == 2 * part and held3.master == 4 * part
    # The first step gathers every parameter on each use, the tied embedding twice, in forward and in backward.
    first = replay(a, 8, Zero3Settings(param_persistence_threshold=0), first_step=True)
    embedding = -(-(50257 * 768) // 8)
    assert first.forward == first.backward == 8 * (part + embedding)
    # DeepSpeed's default threshold (1e5) keeps the norms and biases whole on every rank as well: 2 x 768 per
    # LayerNorm (25 of them) and the biases of QKV (2304), the projections (768 x 2) and fc1 (3072) in 12 layers.
    held_d, issued_d = fw.deepspeed(a, 3, 8, lp_bytes=2, moments=2, step_counter=True)
    whole = 25 * 2 * 768 + 12 * (2304 + 768 + 3072 + 768)
    assert held_d.parameters == 2 * (part + whole) and held_d.gradients == 2 * part
    assert ("all-gather", "optimizer step", 2 * whole) in [(x.op, x.phase, x.payload_bytes) for x in issued_d]


def test_implementation_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="needs|shape"):
        memcalc.estimate(params=7e9, fsdp="FULL_SHARD", gpus=8, accounting="implementation")
    with pytest.raises(ValueError, match="CPU offload"):
        memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, accounting="implementation", offload_params="cpu")
    with pytest.raises(ValueError, match="data parallelism"):
        memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, tp=2, accounting="implementation")


def test_size_policy_matches_torch_on_a_real_module_tree():
    pytest.importorskip("torch")
    from torch.distributed.fsdp.wrap import _recursive_wrap, size_based_auto_wrap_policy
    import functools

    from memcalc.validation.measure import Config, TinyGPT
    from memcalc.validation.suite import architecture

    c = Config("fsdp1", "FULL_SHARD", hidden=60, vocab=101, seq=15, min_num_params=10_000)
    wrapped: list[int] = []

    def wrapper(module, **kwargs):  # records what torch would wrap, and the parameters it would own
        wrapped.append(module)
        return module

    _recursive_wrap(TinyGPT(c), functools.partial(size_based_auto_wrap_policy, min_num_params=10_000), wrapper,
                    ignored_modules=set(), ignored_params=set(), only_wrap_children=True)  # fmt: skip
    ours = fw.units(architecture(c), 10_000)[1:]
    assert len(ours) == len(wrapped)
    taken: set[int] = set()
    sizes = []
    for m in wrapped:
        own = [p for p in m.parameters() if id(p) not in taken]
        taken.update(id(p) for p in own)
        sizes.append(sum(p.numel() for p in own))
    assert sizes == [u.numel for u in ours]


def _hf_config(family: str) -> dict:
    from memcalc.validation.measure import Config

    base = "llama" if family in ("mistral", "qwen2", "mixtral", "qwen3_moe") else family
    cfg = Config("fsdp1", "FULL_SHARD", model=f"hf-{base}", layers=3, vocab=101).hf_config()
    cfg["model_type"] = family
    if family == "mixtral":  # 4 experts, top 2
        cfg |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    if family == "qwen3_moe":  # its q_norm and k_norm, 4 experts 96 wide, top 2
        cfg |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 96, "head_dim": 16}
    return cfg


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox", "bloom", "opt", "falcon"])
@pytest.mark.parametrize("threshold", [3_000, 8_000, 12_000, 20_000, 60_000])
def test_size_policy_matches_torch_on_hugging_face_models(family, threshold):
    """torch's _recursive_wrap over real Hugging Face models (GPT2LMHeadModel, LlamaForCausalLM, ...) against
    memcalc's units, FSDP1's flattening of a tied weight into two units included."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import functools

    from torch.distributed.fsdp.wrap import _recursive_wrap, size_based_auto_wrap_policy

    from memcalc.model.hf_config import architecture_from_config

    cfg = _hf_config(family)
    model_type = cfg.pop("model_type")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg))
    wrapped: list = []

    def wrapper(module, **kwargs):
        wrapped.append(module)
        return module

    _recursive_wrap(model, functools.partial(size_based_auto_wrap_policy, min_num_params=threshold), wrapper,
                    ignored_modules=set(), ignored_params=set(), only_wrap_children=True)  # fmt: skip
    # FSDP1 flattens, for each wrapped module in turn, the parameters of the modules under it that an earlier
    # (inner) unit did not already flatten, each once; a tied weight reached from two units is flattened twice.
    done: set[int] = set()

    def flatten(m) -> int:
        under = [x for x in m.modules() if id(x) not in done]
        done.update(id(x) for x in under)
        return sum({id(p): p.numel() for x in under for p in x.parameters(recurse=False)}.values())

    sizes = [n for n in (flatten(m) for m in wrapped) if n]
    root = flatten(model)
    ours = fw.units(architecture_from_config({"model_type": model_type, **cfg}), threshold)
    assert [u.numel for u in ours[1:] if u.numel] == sizes
    assert ours[0].numel == root


FALCON_VARIANTS = [dict(new_decoder_architecture=True, num_kv_heads=2),  # ln_attn and ln_mlp before attention
                   dict(parallel_attn=False), dict(alibi=True)]  # fmt: skip


@pytest.mark.parametrize(("family", "extra"), [(f, {}) for f in sorted(tree.LAYOUTS)] + [("falcon", x) for x in FALCON_VARIANTS])
def test_module_tree_follows_hugging_faces_call_order(family, extra):
    """Every module a real Hugging Face model calls in forward, parameter-less ones included, with the parameters
    it owns, in order: what DeepSpeed ZeRO-3 hooks (and memcalc.memory.overlays.zero3 replays)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from memcalc.model.hf_config import architecture_from_config
    from memcalc.memory.overlays.zero3 import _called

    cfg = {**_hf_config(family), **extra}
    model_type = cfg.pop("model_type")
    # transformers 5's grouped experts take bf16 only (grouped_mm)
    dtype = torch.bfloat16 if model_type in ("mixtral", "qwen3_moe") else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg),
                                                          attn_implementation="eager", dtype=dtype)  # fmt: skip
    modules = dict(model.named_modules())
    called: list[tuple[str, int]] = []
    for name, m in modules.items():
        m.register_forward_pre_hook(lambda m, args, name=name: called.append(
            (name, sum(p.numel() for p in m.parameters(recurse=False)))))  # fmt: skip
    model(input_ids=torch.randint(0, cfg.get("vocab_size", 100), (1, 8)))
    events, mods, numel = _called(architecture_from_config({"model_type": model_type, **cfg}))
    forward = [m for kind, m in events[: events.index(("backward", ""))] if kind == "fetch"]
    ours = [sum(numel[p] for p in mods[m].params) for m in forward]
    assert ours == [n for _, n in called], list(zip(forward, called))
