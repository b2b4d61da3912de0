"""The implementation accounting's replays stay linear, exact and bounded: every accepted shape answers quickly.

The fast paths (one pass for subtree sizes, a module count read off small layers, cached replays) are checked
against the straightforward definitions over many small shapes; the largest accepted shapes are timed with a
generous bound (3 s, for a loaded 2-core machine; about 0.5 s unloaded).
"""

from __future__ import annotations

import time
from math import prod

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.evaluate import evaluate, notes
from memcalc.inputs.plan import to_plan
from memcalc.inputs.presets import load_model
from memcalc.memory.accountings import frameworks as fw
from memcalc.memory.overlays import zero3
from memcalc.model import tree
from memcalc.model.architecture import MAX_EXPERTS, MAX_LAYERS, Architecture

SHAPES = [
    Architecture(family=f, layers=L, hidden=32, heads=4, vocab=50, max_positions=16, tied_embeddings=t,
                 fused_qkv=f in ("gpt2", "bloom", "falcon"))
    for f in ("gpt2", "llama", "opt", "bloom", "falcon", None) for L in (1, 3) for t in (False, True)
] + [
    Architecture(family="mixtral", layers=L, hidden=32, heads=4, vocab=50, position="rotary", gated_mlp=True,
                 norm="rmsnorm", experts=e, top_k=1, shared_experts=sh, moe_every=k)
    for L in (1, 4) for e in (1, 3) for sh in (0, 2) for k in (1, 2)
]  # fmt: skip


def _nodes(n: tree.Node):
    yield n
    for c in n.children:
        yield from _nodes(c)


@pytest.mark.parametrize("arch", SHAPES + [load_model("gpt2"), load_model("mixtral-8x7b")], ids=repr)
def test_layer_module_count_is_the_built_trees(arch):
    layers = next(n for n in _nodes(tree.module_tree(arch)) if n.name == "layers")
    assert tree.layer_modules(arch) == sum(tree._count(c) for c in layers.children)


@pytest.mark.parametrize("arch", SHAPES, ids=repr)
def test_subtree_sizes_are_module_params_each_once(arch):
    root = tree.module_tree(arch)
    sizes = tree.subtree_numel(root)
    assert all(sizes[id(n)] == sum(prod(s) for s in tree.module_params(n).values()) for n in _nodes(root))


@pytest.mark.parametrize("arch", SHAPES, ids=repr)
@pytest.mark.parametrize("dp", [1, 3, 8])
def test_cached_replay_is_the_logged_replay(arch, dp):
    # With a log the replay always runs afresh; without one it is cached per model and settings.
    for s in (zero3.Zero3Settings(), zero3.Zero3Settings(param_persistence_threshold=0, prefetch_bucket_size=2_000,
                                                          max_reuse_distance=5_000, max_live_parameters=8_000)):
        for first in (False, True):
            assert zero3.replay(arch, dp, s, first) == zero3.replay(arch, dp, s, first, log=[])


def _largest(per_layer_shape: dict) -> Architecture:
    one = Architecture(layers=1, **per_layer_shape)
    return Architecture(layers=tree.MAX_LAYER_MODULES // tree.layer_modules(one), **per_layer_shape)


GENERIC = dict(hidden=64, heads=4, vocab=100, max_positions=16)
DENSE = dict(family="llama", hidden=64, heads=4, vocab=100, position="rotary", gated_mlp=True, norm="rmsnorm")
MOE = dict(hidden=64, heads=4, vocab=100, position="rotary", gated_mlp=True, norm="rmsnorm", experts=1_000, top_k=1)


@pytest.mark.parametrize("shape", [GENERIC, DENSE, MOE], ids=["generic", "llama", "moe"])
@pytest.mark.parametrize("strategy", [dict(stage=3), dict(fsdp="FULL_SHARD", min_num_params=10_000),
                                      dict(fsdp="FULL_SHARD", fsdp_version=2)], ids=["zero-3", "fsdp1-size", "fsdp2"])
def test_largest_accepted_shapes_answer_quickly(shape, strategy):
    arch = _largest(shape)
    assert tree.layer_modules(arch) <= tree.MAX_LAYER_MODULES < tree.layer_modules(arch.model_copy(
        update={"layers": arch.layers + 1}))
    t0 = time.perf_counter()
    plan = to_plan(memcalc.build_input(model=arch, gpus=8, accounting="implementation", **strategy))
    evaluate(plan), notes(plan)
    assert time.perf_counter() - t0 < 3.0


@pytest.mark.parametrize("arch", [Architecture(layers=MAX_LAYERS, **GENERIC),
                                  Architecture(**{**MOE, "layers": 1, "experts": MAX_EXPERTS})], ids=["deep", "wide"])
def test_beyond_the_bound_is_one_line_input_error_at_once(arch):
    t0 = time.perf_counter()
    plan = to_plan(memcalc.build_input(model=arch, gpus=8, stage=3, accounting="implementation"))
    with pytest.raises(InputError, match=rf"at most {tree.MAX_LAYER_MODULES:,} modules .* use --accounting paper") as e:
        evaluate(plan)
    assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 3.0
    # the paper accounting still answers
    evaluate(to_plan(memcalc.build_input(model=arch, gpus=8, stage=3)))
