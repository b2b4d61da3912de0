"""The realistic accounting under --framework megatron (memcalc.memory.accountings.megatron): Megatron-Core's buffers and
optimizer shards, the TE layer's saved set, the schedule's micro-batches in flight; what it refuses."""

import pytest

import memcalc
from memcalc.evaluate import evaluate, notes
from memcalc.inputs.plan import to_plan
from memcalc.memory.accountings import megatron
from memcalc.memory.families.megatron_saved import Shape, layer_bytes, layer_saved

BASE = dict(model="llama-3-70b", gpus=64, tp=4, pp=4, sequence_parallel=True, framework="megatron", stage=1,
            seq_len=8192, micro_batch=1, grad_accum=32, gpu="h100")


def plan(**kw):
    return to_plan(memcalc.build_input(**{**BASE, **kw}))


def rows(p, stage=0):
    return {r.key: r.bytes for r in megatron.evaluate(p, stage).rows}


def test_applies_realistic():
    assert plan().accounting == "realistic"


def test_distributed_optimizer_states():
    """bf16 params + fp32 grad buffer whole, fp32 master and Adam moments over dp·cp: 6 + 12/d bytes a buffer
    element."""
    p = plan()
    r = rows(p)
    n = r["parameters"] // 2
    assert r["gradients"] == 4 * n
    assert r["master_weights"] + r["optimizer_moments"] == 12 * (n // p.shard_group_size)
    from memcalc.memory.accountings.paper import param_groups

    psi = param_groups(p, 0)[0]
    assert psi < n <= psi + 128 * (psi // megatron.BUCKET_MIN + 1)


def test_ddp_states_18_bytes():
    p = plan(stage=0)
    r = rows(p)
    from memcalc.memory.accountings.paper import param_groups

    psi = param_groups(p, 0)[0]
    assert r["parameters"] + r["gradients"] + r["master_weights"] + r["optimizer_moments"] == 18 * psi


def test_fp8_weight_copies_and_smaller_saved_set():
    bf, f8 = rows(plan()), rows(plan(float8="tensorwise"))
    assert "fp8_weights" not in bf
    assert f8["fp8_weights"] == 2 * megatron._linear_weights(plan(), 0)
    assert f8["activations"] < bf["activations"]


def test_te_layer_saved_set_llama70b():
    """Llama-3-70B at s 8192, tp 4 with SP: 12h + 4kv + 6f bytes a token / tp in bf16, plus the fp32 statistics."""
    x = Shape(8192, 8192, 1024, 28672, True, 64, "rmsnorm", 8192, 1, 4, True)
    t = 8192 // 4
    stats = 2 * 4 * t + 4 * 64 // 4 * 8192
    assert layer_bytes(x) == (12 * 8192 + 4 * 1024 + 6 * 28672) * t + stats
    names = [n for n, _ in layer_saved(x, fp8=True)]
    assert "proj input (fp8 copy)" in names
    assert layer_bytes(x, modules=("core_attn",)) == layer_bytes(x) - 4 * 64 // 4 * 8192


@pytest.mark.parametrize("pp,v,expect", [(4, 1, [4, 3, 2, 1]), (4, 5, [23, 21, 19, 17])])
def test_in_flight(pp, v, expect):
    assert [megatron.in_flight(r, pp, 32, v) for r in range(pp)] == expect
    assert megatron.in_flight(0, 4, 2, 1) == 2  # capped at the micro-batches


def test_interleaved_first_rank_most_loaded_and_below_paper():
    p = plan(virtual_stages=5, float8="tensorwise", cp=2, grad_accum=64)
    ev = evaluate(p)
    assert ev.top == 0 and ev.realistic is not None
    paper = evaluate(plan(virtual_stages=5, float8="tensorwise", cp=2, grad_accum=64, accounting="paper"))
    assert ev.total < paper.total
    assert any("Megatron-Core" in n for n in notes(p))


def test_full_recompute_keeps_inputs():
    """Full recompute (uniform, one layer): each of rank 0's 20 layers keeps its input (2·s·h/tp under SP) for each
    of its 4 micro-batches in flight, and the layer being backpropagated its whole saved set again."""
    full, none = rows(plan(recompute="full")), rows(plan())
    assert full["activations"] == 2 * 8192 * 8192 // 4 * 20 * 4
    assert full["activations_recomputed"] == none["activations"] // (20 * 4)


def test_moe_with_expert_parallelism_is_realistic():
    """Mixtral under EP 8: the routed experts in a buffer of their own, sharded over dp/ep; the experts' saved
    inputs over the s·b·k tokens the dispatcher brings."""
    p = plan(model="mixtral-8x7b", tp=1, pp=4, ep=8, sequence_parallel=False, seq_len=4096)
    assert p.accounting == "realistic"
    r = rows(p)
    from memcalc.memory.accountings.paper import param_groups

    groups = param_groups(p, 0)[1]
    assert [g.n for g in groups] == [16, 2]
    n = [megatron.buffer_elements(g.psi, g.n, True) for g in groups]
    assert r["master_weights"] == 4 * (n[0] // 16 + n[1] // 2)
    saved = dict(megatron.layer_saved(p, 0))
    assert saved["experts: fc1 input (dispatched tokens)"] == 2 * 4096 * 4096 * 2
    assert saved["experts: fc1 output (activation input)"] == 2 * 2 * 14336 * 4096 * 2


def test_moe_with_a_shared_expert_router_bias_takes_paper_with_note():
    from memcalc.memory.accountings.scope import why_not

    arch = to_plan(memcalc.build_input(model="mixtral-8x7b", seq_len=4096)).arch
    biased = arch.replace(router_bias=True)
    w = plan(model="mixtral-8x7b", seq_len=4096, tp=1, sequence_parallel=False).work
    assert "MoE layer" in why_not(biased, "bf16-mixed", "adamw", "zero-1", w, framework="megatron")


def test_ep_not_dividing_experts_is_one_line():
    with pytest.raises(memcalc.InputError):
        evaluate(plan(model="mixtral-8x7b", tp=1, pp=1, ep=3, gpus=48, sequence_parallel=False, seq_len=4096))


@pytest.mark.parametrize("rc,expect", [("full:uniform:2", (10, 0, 2)), ("full:uniform:3", (7, 0, 3)),
                                       ("full:block:2", (2, 18, 1)), ("full:block:0", (0, 20, 0))])
def test_full_recompute_methods(rc, expect):
    """uniform N: a checkpoint per run of N layers; block N: the first N layers of the chunk checkpointed one by one
    (transformer_block.py _checkpointed_forward), here on a 20-layer chunk."""
    groups, whole, again = expect
    p = plan(recompute=rc)
    r = rows(p)
    x = megatron._shape(p)
    kept = 2 * 8192 * 8192 // 4
    layer = layer_bytes(x)
    assert r["activations"] == (groups * kept + whole * layer) * 4
    assert r.get("activations_recomputed", 0) == again * layer


def test_selective_modules():
    x = Shape(8192, 8192, 1024, 28672, True, 64, "rmsnorm", 8192, 1, 4, True)
    t = 8192 // 4
    mlp = layer_bytes(x, modules=("core_attn", "mlp"))
    assert layer_bytes(x, modules=("core_attn",)) - mlp == (2 * 8192 + 6 * 28672) * t + 4 * t
    p = plan(recompute="selective:core_attn+mlp")
    assert rows(p)["activations"] == mlp * 20 * 4


def test_megatron_recompute_needs_megatron():
    with pytest.raises(memcalc.InputError, match="--framework megatron"):
        memcalc.build_input(model="llama-3-8b", seq_len=1024, recompute="full:block:2")
    with pytest.raises(memcalc.InputError):
        memcalc.build_input(model="llama-3-8b", seq_len=1024, recompute="selective:attn", framework="megatron")


def test_reads_megatron_recompute_options(tmp_path):
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "args.txt"
    f.write_text("--recompute-granularity full --recompute-method block --recompute-num-layers 3 --seq-length 8\n")
    assert read_megatron(f).arguments["recompute"] == "full:block:3"
    f.write_text("--recompute-granularity selective --recompute-modules core_attn mlp --seq-length 8\n")
    assert read_megatron(f).arguments["recompute"] == "selective:core_attn+mlp"
    f.write_text("--recompute-granularity selective --seq-length 8\n")
    assert read_megatron(f).arguments["recompute"] == "selective"


def test_virtual_stages_not_dividing_layers_refused():
    with pytest.raises(memcalc.InputError):
        evaluate(plan(virtual_stages=3))


def test_bf16_grad_buffer_and_the_steps_fp32_copy():
    """--grad-reduce-in-bf16: the grad buffer in 2 bytes an element; the optimizer step's fp32 copy of the rank's
    grad shard (distrib_optimizer.py _copy_model_grads_to_main_grads) is the peak only where it outweighs the
    activations it follows; the reduce-scatter carries half the bytes."""
    fp32, bf16 = plan(), plan(grad_reduce_dtype="bf16")
    assert (fp32.grad_bytes, bf16.grad_bytes) == (4, 2)
    a, b = rows(fp32), rows(bf16)
    assert b["gradients"] * 2 == a["gradients"] and b["parameters"] == a["parameters"]
    assert "gradients_fp32" not in b and b["activations"] == a["activations"]  # the first backward is the peak
    # no activations to speak of (16 tokens): the step's copy of the shard is the peak
    small = plan(model="llama-3-8b", gpus=8, tp=1, pp=1, sequence_parallel=False, seq_len=16, grad_accum=1,
                 grad_reduce_dtype="bf16")
    real = megatron.evaluate(small, 0)
    step = {r.key: r.bytes for r in real.rows}
    assert real.peak_phase == "optimizer step" and "activations" not in step
    assert step["gradients_fp32"] == step["master_weights"] > 0  # 4 bytes an element of the shard, as the master
    e32 = memcalc.estimate(**{**BASE, "gpus": 128})
    e16 = memcalc.estimate(**{**BASE, "gpus": 128, "grad_reduce_dtype": "bf16"})
    rs32 = [c for c in e32.communication.collectives if c.group == "data-parallel" and c.op == "reduce-scatter"]
    rs16 = [c for c in e16.communication.collectives if c.group == "data-parallel" and c.op == "reduce-scatter"]
    assert rs32 and rs16[0].payload_bytes * 2 == rs32[0].payload_bytes and rs16[0].dtype == "bf16"


def test_fp8_param_gather():
    """--fp8-param-gather (--float8-all-gather): FP8 linear weights in the param buffer, 1 byte and 1 for the
    transpose, no bf16 copy and no workspace: 2 bytes a linear weight less than the cached casts."""
    cast, gathered = rows(plan(float8="tensorwise")), rows(plan(float8="tensorwise", float8_all_gather=True))
    w = megatron._linear_weights(plan(), 0)
    assert cast["parameters"] - gathered["parameters"] == w
    assert gathered["fp8_weights"] == w
    with pytest.raises(memcalc.InputError, match="distributed optimizer"):
        memcalc.build_input(**{**BASE, "stage": 0, "float8": "tensorwise", "float8_all_gather": True})


def test_reads_fp8_param_gather(tmp_path):
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "args.txt"
    f.write_text("--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather --use-distributed-optimizer --bf16 "
                 "--seq-length 8\n")
    a = read_megatron(f).arguments
    assert a["float8"] == "tensorwise" and a["float8_all_gather"] is True


@pytest.mark.parametrize("rc", ["selective:core_attn+mlp", "full:block:3", "full:uniform:2", "selective", "full"])
def test_written_megatron_args_read_back(rc, tmp_path):
    """The recompute and FP8 settings written as Megatron-LM arguments come back as the estimate's."""
    from memcalc.configs.megatron import read_megatron

    e = memcalc.estimate(**{**BASE, "recompute": rc, "float8": "tensorwise", "float8_all_gather": True,
                            "grad_reduce_dtype": "bf16"})
    f = tmp_path / "megatron_args.txt"
    f.write_text(memcalc.config_text(e)["megatron_args.txt"])
    a = read_megatron(f, world_size=64, layers=80).arguments
    assert (a["recompute"], a["float8"], a["float8_all_gather"], a["grad_reduce_dtype"]) == (rc, "tensorwise", True,
                                                                                              "bf16")


def test_an_option_not_modelled_takes_the_paper_accounting_with_a_note(tmp_path):
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "args.txt"
    f.write_text("--fp8-format e4m3 --fp8-recipe mxfp8 --bf16 --seq-length 8\n")
    r = read_megatron(f)
    assert r.arguments["accounting"] == "paper"
    assert any("mxfp8" in u for u in r.unmodelled) and any("paper accounting answers" in n for n in r.notes)
    f.write_text("--fp8-format e4m3 --fp8-recipe tensorwise --bf16 --seq-length 8\n")
    assert "accounting" not in read_megatron(f).arguments


def test_float8_rowwise_takes_the_paper_with_a_note():
    inp = memcalc.build_input(**{**BASE, "float8": "rowwise"})
    assert inp.accounting == "paper"
    assert any("per-tensor FP8" in n for n in notes(to_plan(inp)))


@pytest.mark.parametrize("argv, words", [
    (["--model", "llama-3-70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--virtual-stages", "3"],
     "is not divisible by pp(4) * virtual_stages(3)"),
    (["--model", "mixtral-8x7b", "--gpus", "48", "--ep", "3"], "ep(3) needs an MoE model whose experts (8) it divides"),
    (["--model", "llama-3-8b", "--recompute", "full:block"], "--recompute 'full:block' is not accepted"),
])  # fmt: skip
def test_cli_refuses_megatron_layouts_in_one_line(argv, words):
    from typer.testing import CliRunner

    from memcalc.cli import app

    r = CliRunner().invoke(app, ["estimate", *argv, "--framework", "megatron", "--stage", "1", "--seq-len", "4096",
                                 "--gpu", "h100"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_cli_json_carries_the_megatron_rows():
    from typer.testing import CliRunner

    from memcalc.cli import app

    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--framework", "megatron",
                                 "--stage", "1", "--seq-len", "4096", "--gpu", "h100", "--json"])
    assert r.exit_code == 0, r.stderr
    import json

    d = json.loads(r.stdout)
    keys = {row["key"] for row in d["memory"]["per_gpu"]["rows"]}
    assert {"parameters", "gradients", "master_weights", "optimizer_moments", "activations", "loss"} <= keys


def test_reads_megatron_bridge_overrides(tmp_path):
    """Megatron-Bridge's recipe overrides read as the Megatron-LM options they set, the same estimate arguments."""
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "overrides.txt"
    f.write_text("model.tensor_model_parallel_size=4 model.pipeline_model_parallel_size=4\n"
                 "model.virtual_pipeline_model_parallel_size=5 model.context_parallel_size=2\n"
                 "model.sequence_parallel=True ddp.use_distributed_optimizer=true\n"
                 "mixed_precision=bf16_with_fp8_current_scaling_mixed model.fp8_param_gather=True\n"
                 "model.recompute_granularity=selective model.recompute_modules=[core_attn,mlp]\n"
                 "train.micro_batch_size=1 train.global_batch_size=128 model.seq_length=8192 train.train_iters=100\n")
    a = read_megatron(f, world_size=64, layers=80).arguments
    assert a == dict(framework="megatron", stage=1, tp=4, pp=4, cp=2, sequence_parallel=True, virtual_stages=5,
                     precision="bf16-mixed", float8="tensorwise", float8_all_gather=True,
                     recompute="selective:core_attn+mlp", micro_batch=1, seq_len=8192, gpus=64, grad_accum=64)
    f.write_text("model.hidden_dropout=0.1 model.seq_length=8\n")
    with pytest.raises(memcalc.InputError, match="unknown Megatron-Bridge override"):
        read_megatron(f)
    f.write_text("mixed_precision=bf16_with_mxfp8_mixed model.seq_length=8\n")
    assert read_megatron(f).arguments["accounting"] == "paper"


def test_mlp_recompute_leaves_moe_layers_whole():
    """transformer_layer.py recomputes the mlp module only where the MLP is not a MoELayer."""
    kw = dict(model="mixtral-8x7b", tp=1, pp=4, ep=8, sequence_parallel=False, seq_len=4096)
    assert megatron.layer_saved(plan(**kw, recompute="selective:core_attn+mlp"), 0) == \
        megatron.layer_saved(plan(**kw, recompute="selective"), 0)


@pytest.mark.parametrize("text, split", [
    # Llama 3.1 405B's 126 layers over pp 8 x 8 chunks with the embedding and the loss each counted as a layer
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--num-virtual-stages-per-pipeline-rank 8", [1] + [2] * 62 + [1]),
    ("--decoder-first-pipeline-num-layers 12 --decoder-last-pipeline-num-layers 12", [12] + [17] * 6 + [12]),
])  # fmt: skip
def test_reads_megatron_uneven_pipeline_splits(text, split, tmp_path):
    """transformer_block.py get_num_layers_to_build's splits as --stage-layers (global stage c·pp + r)."""
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "args.txt"
    f.write_text(f"--pipeline-model-parallel-size 8 {text} --seq-length 8\n")
    assert read_megatron(f, layers=126).arguments["stage_layers"] == split
    r = memcalc.estimate(model="llama-3.1-405b", gpus=1024, tp=8, pp=8, cp=2, framework="megatron", stage=1,
                         seq_len=8192, micro_batch=1, gpu="h100", sequence_parallel=True, grad_accum=64,
                         stage_layers=split, virtual_stages=len(split) // 8)
    assert r.accounting == "realistic" and sum(s.layers for s in r.memory.stages) == 126
    f.write_text("--pipeline-model-parallel-size 8 --decoder-first-pipeline-num-layers 15 --seq-length 8\n")
    with pytest.raises(memcalc.InputError, match="middle stages"):
        read_megatron(f, layers=126)


def test_expert_groups_span_the_data_and_context_ranks():
    """Megatron-Core forms expert groups from the data x context ranks (NeMo's Mixtral 8x22B layout: ep 8 over dp 4 x
    cp 8): accepted under --framework megatron, the routed experts' optimizer shards over dp·cp/ep ranks; elsewhere ep
    still divides dp; an ep dividing neither is one line."""
    kw = dict(model="mixtral-8x7b", gpus=64, tp=2, pp=1, cp=8, ep=8, sequence_parallel=True, framework="megatron",
              stage=1, seq_len=16384, micro_batch=1, grad_accum=4, gpu="h100")
    p = to_plan(memcalc.build_input(**kw))
    from memcalc.memory.accountings.paper import param_groups

    _, groups = param_groups(p, 0)
    assert (p.dp, p.shard_group_size) == (4, 32) and [g.n for g in groups] == [32, 4]
    with pytest.raises(memcalc.InputError, match=r"ep\(8\) does not divide dp\(4\) = gpus\(64\)"):
        memcalc.build_input(**{**kw, "framework": "torchtitan", "stage": None, "fsdp": "FULL_SHARD"})
    with pytest.raises(memcalc.InputError, match=r"ep\(16\) does not divide dp\(2\) x cp\(4\), the ranks Megatron-Core"):
        memcalc.build_input(**{**kw, "gpus": 16, "cp": 4, "ep": 16})


def test_fp8_core_attn_keeps_only_projs_copy_of_the_attention_output():
    """Under the core_attn checkpoint the fused attention keeps nothing; in bf16 proj keeps its input (the attention
    output), under FP8 only its one-byte copy (TE linear.py saves the quantized input)."""
    x = Shape(8192, 8192, 1024, 28672, True, 64, "rmsnorm", 8192, 1, 4, True)
    names = {spec: dict(layer_saved(x, "te", fp8, ("core_attn",))) for spec, fp8 in (("bf16", False), ("fp8", True))}
    assert names["bf16"]["attention output (proj input)"] == 2 * 8192 * 8192 // 4
    assert "attention output (proj input)" not in names["fp8"]
    assert names["fp8"]["proj input (fp8 copy)"] == 8192 * 8192 // 4
    plain = dict(layer_saved(x, "te", True, ()))
    assert plain["attention output (proj input)"] == 2 * 8192 * 8192 // 4  # no checkpoint: the attention keeps it


def test_deferred_embedding_wgrad_keeps_the_output_layers_tensors_on_the_last_stage():
    """--defer-embedding-wgrad-compute (--wgrad-deferral-limit N, 0: all): the last stage keeps, per deferred
    micro-batch, the output layer's input (the SP shard) and its output gradient over the vocabulary shard
    (tensor_parallel/layers.py); other stages unchanged; refused without pp or outside Megatron."""
    base = dict(grad_accum=16, seq_len=4096)
    off, limited, every = (plan(**base, defer_embedding_wgrad=d) for d in (None, 8, 0))
    each = 2 * 8192 * 4096 // 4 + 2 * 4096 * -(-128256 // 4)  # input shard (SP) + output gradient (vocab / tp)
    assert each == 2 * 8192 * 1024 + 2 * 4096 * 32064
    last = megatron.evaluate(limited, 3)
    assert {r.key: r.bytes for r in last.rows}["deferred_wgrad"] == 8 * each
    assert {r.key: r.bytes for r in megatron.evaluate(every, 3).rows}["deferred_wgrad"] == 16 * each
    assert megatron.evaluate(limited, 3).peak_allocated - megatron.evaluate(off, 3).peak_allocated == 8 * each
    assert megatron.evaluate(limited, 0).peak_allocated == megatron.evaluate(off, 0).peak_allocated
    with pytest.raises(memcalc.InputError, match="needs pipeline parallelism"):
        memcalc.build_input(**{**BASE, "pp": 1, "defer_embedding_wgrad": 0})
    with pytest.raises(memcalc.InputError, match="needs --framework megatron"):
        memcalc.build_input(model="llama-3-8b", gpus=2, pp=2, seq_len=1024, defer_embedding_wgrad=0)


def test_reads_and_writes_the_deferred_embedding_wgrad(tmp_path):
    from memcalc.configs.megatron import read_megatron

    f = tmp_path / "args.txt"
    f.write_text("--pipeline-model-parallel-size 4 --defer-embedding-wgrad-compute --wgrad-deferral-limit 0 --bf16 "
                 "--seq-length 8\n")
    assert read_megatron(f, world_size=4).arguments["defer_embedding_wgrad"] == 0
    f.write_text("model.pipeline_model_parallel_size=4 comm_overlap.defer_embedding_wgrad_compute=true "
                 "comm_overlap.wgrad_deferral_limit=22 model.seq_length=8\n")
    assert read_megatron(f, world_size=4).arguments["defer_embedding_wgrad"] == 22
    e = memcalc.estimate(**{**BASE, "defer_embedding_wgrad": 22})
    f.write_text(memcalc.config_text(e)["megatron_args.txt"])
    assert read_megatron(f, world_size=64, layers=80).arguments["defer_embedding_wgrad"] == 22
    for text, words in (("--defer-embedding-wgrad-compute --seq-length 8", "needs pipeline parallelism"),
                        ("--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute "
                         "--no-gradient-accumulation-fusion --seq-length 8", "without gradient-accumulation fusion"),
                        ("--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute --wgrad-deferral-limit -1 "
                         "--seq-length 8", "--wgrad-deferral-limit: '-1'")):  # fmt: skip
        f.write_text(text + "\n")
        with pytest.raises(memcalc.InputError, match=words):
            read_megatron(f, world_size=4)
    f.write_text("--wgrad-deferral-limit 4 --seq-length 8\n")
    assert any(x.startswith("--wgrad-deferral-limit: read with") for x in read_megatron(f).ignored)
