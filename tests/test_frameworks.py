"""The as-implemented formulas (memcalc.frameworks) by hand; tests/validation proves them against real runs."""

import pytest

import memcalc
from memcalc import frameworks as fw
from memcalc.params import model_params
from memcalc.presets import load_model


@pytest.mark.parametrize("name", ["gpt2", "llama-2-7b", "mixtral-8x7b", "falcon-7b", "opt-1.3b", "bloom-176b"])
@pytest.mark.parametrize("min_num_params", [None, 10**6, 10**8])
def test_units_hold_every_parameter_once(name, min_num_params):
    a = load_model(name)
    us = fw.units(a, min_num_params)
    assert sum(u.numel for u in us) == model_params(a).total
    assert us[0].root and all(not u.root for u in us[1:]) and all(u.numel for u in us[1:])


def test_transformer_policy_wraps_each_layer():
    a = load_model("llama-2-7b")
    us = fw.units(a)
    assert len(us) == 1 + 32
    assert {u.numel for u in us[1:]} == {202_383_360}
    assert us[0].numel == 2 * 131_072_000 + 4096  # embedding, head, final norm


def test_size_policy_follows_torchs_recursive_wrap():
    # gpt2 at min_num_params = 1e6: each layer (7.1M) is recursed into; its QKV (1.77M), fc1 (2.36M) and fc2 (2.36M)
    # are wrapped, and what is left of the layer (ln, attention output 0.59M) is below 1e6, so the layer is not. The
    # embedding (38.6M) is wrapped on its own; the tied head then has nothing left to wrap.
    a = load_model("gpt2")
    us = fw.units(a, 10**6)
    names = [u.name for u in us]
    assert names[:5] == ["root", "embed", "layer0.qkv", "layer0.mlp.fc1", "layer0.mlp.fc2"]
    assert len(us) == 2 + 12 * 3
    h = 768
    per_layer_left = 4 * h + h * h + h  # two LayerNorms + attention output projection
    assert us[0].numel == 1024 * h + 12 * per_layer_left + 2 * h  # positions, leftovers, final norm
    # A threshold above the whole model leaves one unit: the root.
    assert [u.name for u in fw.units(a, 10**9)] == ["root"]


def test_size_policy_in_the_estimate():
    r = memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, accounting="implementation", min_num_params="1M")
    assert any("size_based_auto_wrap_policy(min_num_params=1,000,000): 38 units" in n for n in r.notes)
    forward = next(c for c in r.communication.collectives if c.op == "all-gather" and c.phase == "forward")
    assert forward.calls_per_step == 38


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
    held3, issued3 = fw.deepspeed(a, 3, 8, lp_bytes=2, moments=2, step_counter=True)
    shapes = [s for u in fw.units(a) for s in u.shapes]
    part = sum(-(-(s[0] * (s[1] if len(s) > 1 else 1)) // 8) for s in shapes)
    assert held3.parameters == held3.gradients == 2 * part and held3.master == 4 * part
    embedding = -(-(50257 * 768) // 8)
    assert issued3[0].payload_bytes == 8 * (part + embedding) * 2  # the tied embedding is gathered twice


def test_implementation_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="needs|shape"):
        memcalc.estimate(params=7e9, fsdp="FULL_SHARD", gpus=8, accounting="implementation")
    with pytest.raises(ValueError, match="CPU offload"):
        memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, accounting="implementation", offload_params="cpu")
    with pytest.raises(ValueError, match="data parallelism"):
        memcalc.estimate(model="gpt2", fsdp="FULL_SHARD", gpus=8, tp=2, accounting="implementation")


def test_size_policy_matches_torch_on_a_real_module_tree():
    torch = pytest.importorskip("torch")
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
