"""How frameworks compose data, context and pipeline parallelism: the group that shards, the traffic that follows it,
uneven pipeline stages, and FSDP2 over a flattened dp x cp mesh held to torch."""

import json

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.evaluate import evaluate
from memcalc.inputs.plan import to_plan
from memcalc.inputs.presets import load_model
from memcalc.layout.compose import rank_layers, torchtitan_split
from memcalc.time.estimate import placed
from memcalc.time.hardware import load_calibration
from memcalc.time.step import Plan as StepPlan
from memcalc.time.step import _stage_profile

PSI_8B = 8_030_261_248  # Llama-3-8B: 32 x 218,112,000 + 2 x 128,256 x 4,096 + 4,096 (memcalc.model.params)
LAYER_8B = 218_112_000  # q, o 4096² + k, v 4096 x 1024 + 3 x 4096 x 14336 + 2 norms x 4096
EMBED_8B = 525_336_576  # 128,256 x 4,096


def rows(r) -> dict[str, int]:
    return {x.key: x.bytes for x in r.memory.per_gpu.rows if x.location == "gpu"}


def dp_ops(r) -> list[tuple[str, str, int]]:
    groups = ("data-parallel", "shard group", "replica group")
    return [(c.op, c.group, c.group_size) for c in r.communication.collectives if c.group in groups]


# ---------------------------------------------------------------------------------------------
# Sharding over dp x cp: 8 GPUs, cp = 2, dp = 4, N = dp x cp = 8; Ψ/8 = 1,003,782,656 exactly.
# bf16-mixed: 2 B params, 2 B grads, 4 B fp32 master, 2 x 4 B Adam moments (ZeRO §3.1, §5).
# ---------------------------------------------------------------------------------------------

N8 = PSI_8B // 8


@pytest.mark.parametrize("framework, strategy, expected", [
    # Megatron's distributed optimizer (ZeRO-1): 2Ψ + 4Ψ (its fp32 main_grad buffer) + 12Ψ/N over its data-parallel
    # group with context parallelism (get_data_parallel_group(with_context_parallel=True))
    ("megatron", dict(stage=1), dict(parameters=2 * PSI_8B, gradients=4 * PSI_8B, master_weights=4 * N8,
                                     optimizer_moments=8 * N8)),
    # DeepSpeed-Ulysses ZeRO-2 over seq_data_parallel_group: 2Ψ + 14Ψ/N
    ("deepspeed", dict(stage=2), dict(parameters=2 * PSI_8B, gradients=2 * N8, master_weights=4 * N8,
                                      optimizer_moments=8 * N8)),
    ("deepspeed", dict(stage=3), dict(parameters=2 * N8, gradients=2 * N8, master_weights=4 * N8,
                                      optimizer_moments=8 * N8)),
    # torchtitan FSDP2 over dp_shard_cp, accelerate's ParallelismConfig over dp_shard_cp: 16Ψ/N
    ("torchtitan", dict(fsdp="FULL_SHARD"), dict(parameters=2 * N8, gradients=2 * N8, master_weights=4 * N8,
                                                 optimizer_moments=8 * N8)),
    ("hf", dict(fsdp="FULL_SHARD"), dict(parameters=2 * N8, gradients=2 * N8, master_weights=4 * N8,
                                         optimizer_moments=8 * N8)),
])  # fmt: skip
def test_cp2_shards_over_dp_times_cp(framework, strategy, expected):
    r = memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, framework=framework, accounting="paper", **strategy)
    assert r.model.parameters == PSI_8B
    assert r.training.dp == 4 and r.strategy.shard_group_size == 8
    got = rows(r)
    assert {k: got[k] for k in expected} == expected
    # The same figures without --framework: every framework that runs CP shards over dp x cp, so that is the default
    # (Megatron's gradients aside: bf16 gradients in 2 bytes elsewhere)
    plain = rows(memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, accounting="paper", **strategy))
    assert plain == got | ({"gradients": 2 * PSI_8B} if framework == "megatron" else {})


def test_shard_over_dp_keeps_the_states_replicated_across_context_ranks():
    r = memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, stage=3, shard_over="dp", accounting="paper")
    assert r.strategy.shard_group_size == 4
    n4 = PSI_8B // 4
    assert {k: rows(r)[k] for k in ("parameters", "gradients", "master_weights", "optimizer_moments")} == dict(
        parameters=2 * n4, gradients=2 * n4, master_weights=4 * n4, optimizer_moments=8 * n4)
    assert dp_ops(r) == [("all-gather", "data-parallel", 4), ("all-gather", "data-parallel", 4),
                         ("reduce-scatter", "data-parallel", 4)]  # fmt: skip


def test_gradient_traffic_follows_the_dp_cp_group():
    # ZeRO-3 over N = 8: all-gather forward, all-gather backward, reduce-scatter; Ψ·2 B padded to N.
    r = memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, stage=3, accounting="paper")
    assert dp_ops(r) == [("all-gather", "data-parallel", 8), ("all-gather", "data-parallel", 8),
                         ("reduce-scatter", "data-parallel", 8)]  # fmt: skip
    rs = next(c for c in r.communication.collectives if c.op == "reduce-scatter" and c.group == "data-parallel")
    assert rs.payload_bytes_per_call == 2 * PSI_8B and rs.sent_bytes_per_gpu == 2 * PSI_8B * 7 // 8
    assert not rs.crosses_nodes
    # DDP: the gradient all-reduce spans dp x cp = 8 ranks (Megatron-LM's DDP reduces over the same group).
    ddp = memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, ddp=True, accounting="paper")
    assert dp_ops(ddp) == [("all-reduce", "data-parallel", 8)] and ddp.strategy.replicas == 8
    # 16 GPUs in two nodes of 8, tp = 2, cp = 2: dp = 4, dp x cp = 8 ranks 2 apart: 16 ranks, two nodes.
    wide = memcalc.estimate(model="llama-3-8b", gpus=16, tp=2, cp=2, stage=3, accounting="paper")
    assert {(c.group_size, c.crosses_nodes) for c in wide.communication.collectives if c.group == "data-parallel"} \
        == {(8, True)}


def test_step_time_places_the_dp_cp_group_in_the_node():
    inp = memcalc.build_input(model="llama-3-8b", gpus=8, cp=2, stage=3, seq_len=8192, attention="flash",
                              accounting="paper", gpu="h100")  # fmt: skip
    plan = to_plan(inp)
    ev = evaluate(plan)
    data = [p for p in placed(ev.collectives, plan) if p.group == "data-parallel"]
    assert {(p.group_size, p.ranks_per_node) for p in data} == {(8, 8)}  # stride tp = 1: all 8 in the node
    old = to_plan(memcalc.build_input(model="llama-3-8b", gpus=8, cp=2, stage=3, seq_len=8192, attention="flash",
                                      accounting="paper", gpu="h100", shard_over="dp"))  # fmt: skip
    assert {(p.group_size, p.ranks_per_node) for p in placed(evaluate(old).collectives, old)
            if p.group == "data-parallel"} == {(4, 4)}  # dp ranks stand cp = 2 apart


def test_hybrid_shard_group_is_taken_inside_dp_times_cp():
    # 32 GPUs, tp 2, cp 2: dp = 8, dp x cp = 16 ranks 2 apart; one node holds 8 / 2 = 4 of them.
    r = memcalc.estimate(model="llama-3-8b", fsdp="HYBRID_SHARD", gpus=32, tp=2, cp=2, accounting="paper")
    assert r.strategy.shard_group_size == 4 and r.strategy.replicas == 4
    ops = {(c.op, c.group): c for c in r.communication.collectives}
    assert ops[("reduce-scatter", "shard group")].group_size == 4
    assert not ops[("reduce-scatter", "shard group")].crosses_nodes
    assert ops[("all-reduce", "replica group")].group_size == 4 and ops[("all-reduce", "replica group")].crosses_nodes
    # torchtitan's HSDP: fully_shard on (dp_replicate, dp_shard_cp): dp_shard 2 x cp 2 = a shard group of 4.
    g = memcalc.estimate(model="llama-3-8b", fsdp="HYBRID_SHARD", shard_group=8, gpus=32, tp=2, cp=2)
    assert g.strategy.shard_group_size == 8 and g.strategy.replicas == 2
    with pytest.raises(InputError, match=r"--shard-group 3 must divide the data-parallel size dp\(8\) x cp\(2\)"):
        memcalc.estimate(model="llama-3-8b", fsdp="HYBRID_SHARD", shard_group=3, gpus=32, tp=2, cp=2)


# ---------------------------------------------------------------------------------------------
# Uneven pipeline stages.
# ---------------------------------------------------------------------------------------------


def test_torchtitan_split_weighs_the_input_and_output_modules():
    # generate_llm_fqn_per_model_part(8, 126): 126 + 1 + 1 = 128 units, 16 a stage; the embedding and the
    # head take one unit each off the first and the last stage.
    assert torchtitan_split(8, 126) == (15, 16, 16, 16, 16, 16, 16, 15)
    # 32 layers, 4 stages: 34 units = 9, 9, 8, 8 -> 8, 9, 8, 7 (even when the layers divide).
    assert torchtitan_split(4, 32) == (8, 9, 8, 7)
    assert torchtitan_split(2, 3, 2, 2) == (2, 1)  # its docstring's example: 7 units, 4 - 2 and 3 - 2
    assert torchtitan_split(1, 5) == (5,)
    with pytest.raises(InputError, match="torchtitan cannot split 2 layers"):
        torchtitan_split(5, 2)


def test_chunks_go_to_ranks_in_loop_order():
    split = (3, 4, 4, 4, 4, 4, 4, 3)  # 30 layers, pp 4 x 2 chunks
    assert rank_layers(split, 4, 0) == (range(0, 3), range(15, 19))
    assert rank_layers(split, 4, 3) == (range(11, 15), range(27, 30))


def test_126_layers_over_8_stages_as_torchtitan_splits_them():
    r = memcalc.estimate(model="llama-3-8b", layers=126, stage=1, gpus=64, pp=8, framework="torchtitan",
                         seq_len=4096, attention="flash", grad_accum=8, accounting="paper")  # fmt: skip
    assert [s.layers for s in r.memory.stages] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert [s.parameters for s in r.memory.stages] == (
        [15 * LAYER_8B + EMBED_8B] + [16 * LAYER_8B] * 6 + [15 * LAYER_8B + 4096 + EMBED_8B])
    assert r.memory.most_loaded_stage == 0  # the embedding, and p micro-batches in flight (1F1B)
    first = r.memory.stages[0]
    assert first.micro_batches_in_flight == 8
    assert r.memory.per_gpu.total == first.total


def test_explicit_stage_layers_set_memory_and_the_slowest_stage():
    kw = dict(model="llama-3-8b", stage=1, gpus=32, pp=4, seq_len=4096, attention="flash", grad_accum=4,
              accounting="paper")
    r = memcalc.estimate(stage_layers="6,10,10,6", **kw)
    assert [s.layers for s in r.memory.stages] == [6, 10, 10, 6]
    assert r.memory.stages[1].parameters == 10 * LAYER_8B
    even = memcalc.estimate(**kw)
    assert [s.layers for s in even.memory.stages] == [8] * 4
    # The step model times the plan's split: the head (≈ 2.4 layers of matmuls at 128k vocabulary) on the last
    # stage makes it the slowest with 14 layers; with 16 there and 14 on the first, still the last (16 + head).
    arch, cal = load_model("llama-3-8b"), load_calibration("h100-sxm-80gb")
    base = dict(gpus=32, seq=4096, micro_batch=1, micro_batches=4, pp=4)
    assert _stage_profile(arch, cal, StepPlan(**base, stage_layers=(2, 8, 8, 14)))[-1] == 14
    assert _stage_profile(arch, cal, StepPlan(**base, stage_layers=(14, 8, 8, 2)))[-1] == 14  # first: 14 layers
    assert _stage_profile(arch, cal, StepPlan(**base, stage_layers=(6, 10, 10, 6)))[-1] == 10


def test_megatron_refuses_an_uneven_split_without_explicit_stages():
    with pytest.raises(InputError, match=r"layers\(126\) is not divisible by pp\(8\) \* virtual_stages\(1\): "
                                         r"Megatron-LM splits layers evenly"):
        memcalc.estimate(model="llama-3-8b", layers=126, stage=1, gpus=64, pp=8, framework="megatron")
    r = memcalc.estimate(model="llama-3-8b", layers=126, stage=1, gpus=64, pp=8, framework="megatron",
                         stage_layers=[14, 16, 16, 16, 16, 16, 16, 16])  # fmt: skip
    assert [s.layers for s in r.memory.stages] == [14] + [16] * 7


@pytest.mark.parametrize("kwargs, message", [
    (dict(stage_layers="15,16,16,16,16,16,16,16"), r"--stage-layers adds up to 127, not layers\(126\); accepted: 8"),
    (dict(stage_layers="63,63"), r"--stage-layers has 2 entries; accepted: pp\(8\) x virtual_stages\(1\) = 8"),
    (dict(stage_layers="16,16,16,16,16,16,31,-1"), r"has an entry below 0 or above layers\(126\)"),
    (dict(stage_layers=[0] * 7 + [10**5000]), r"has an entry below 0 or above layers\(126\)"),
    (dict(stage_layers="16,16,x"), "--stage-layers '16,16,x' is not accepted"),
    (dict(), r"layers\(126\) is not divisible by pp\(8\).*give --stage-layers \(e.g. 16,16,16,16,16,16,15,15\)"),
    (dict(framework="hf"), "--framework hf has no pipeline parallelism for training"),
    (dict(framework="titan"), "--framework 'titan' is not known"),
    (dict(shard_over="cp"), "--shard-over 'cp' is not accepted; accepted: dp, dp-cp"),
])  # fmt: skip
def test_bad_layouts_are_one_line(kwargs, message):
    with pytest.raises(InputError, match=message) as e:
        memcalc.estimate(model="llama-3-8b", layers=126, stage=1, gpus=64, pp=8, **kwargs)
    assert "\n" not in str(e.value)


def test_a_framework_without_context_parallelism_is_refused():
    with pytest.raises(InputError, match=r"--framework torchtune has no context parallelism \(--cp 2\); use --cp 1, "
                                         r"or one of: hf, torchtitan, megatron, deepspeed"):
        memcalc.estimate(model="llama-3-8b", gpus=8, cp=2, fsdp="FULL_SHARD", framework="torchtune")


def test_cli_flags():
    runner = CliRunner()
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--cp", "2", "--stage", "3",
                            "--framework", "torchtitan", "--accounting", "paper", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["strategy"]["shard_group_size"] == 8
    r = runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--layers", "126", "--gpus", "64", "--pp", "8",
                            "--stage-layers", "15,16", "--stage", "1"])  # fmt: skip
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "2 entries" in r.stderr


# ---------------------------------------------------------------------------------------------
# Held to torch: FSDP2 fully_shard over a (dp, cp) mesh flattened to dp_shard_cp, as torchtitan builds it.
# ---------------------------------------------------------------------------------------------

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "tie_word_embeddings": False,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False}  # fmt: skip


def test_fsdp2_over_flattened_dp_cp_mesh_matches_the_shard_group(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig, AutoModelForCausalLM

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    cfg = dict(TINY)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "cp"))
        flat = mesh["dp", "cp"]._flatten("dp_shard_cp")  # torchtitan parallel_dims.py
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())
        for layer in model.model.layers:
            fully_shard(layer, mesh=flat)
        fully_shard(model, mesh=flat)
        local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    finally:
        dist.destroy_process_group()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    r = memcalc.estimate(hf_config=str(path), fsdp="FULL_SHARD", gpus=8, cp=2, precision="fp32", accounting="paper")
    assert r.model.parameters == total == 115_008
    assert rows(r)["parameters"] == local == 4 * total // 8  # fp32 shards of rank 0: Ψ/(dp x cp) each
    old = memcalc.estimate(hf_config=str(path), fsdp="FULL_SHARD", gpus=8, cp=2, precision="fp32",
                           accounting="paper", shard_over="dp")  # fmt: skip
    assert rows(old)["parameters"] == 2 * local  # sharded over dp alone: twice what torch holds


# ---------------------------------------------------------------------------------------------
# The torchtitan reader: --framework torchtitan and its stage split.
# ---------------------------------------------------------------------------------------------

TT = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
seq_len = 2048
[parallelism]
data_parallel_shard_degree = -1
pipeline_parallel_degree = 4
"""


@pytest.mark.parametrize("extra, split, virtual", [
    ("", "8,9,8,7", None),  # 1F1B: one stage per rank; 32 + 2 units = 9, 9, 8, 8
    ('pipeline_parallel_schedule = "Interleaved1F1B"\n', "4,5,4,4,4,4,4,3", 2),  # two per rank: 34 over 8
    (('pipeline_parallel_schedule = "Interleaved1F1B"\npipeline_parallel_layers_per_stage = 4\n'
      "pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n"),
     "4,4,4,4,4,4,4,4", 2),  # ceil(32 / 4) = 8 stages
    (('module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], '
      '["layers.3"], ["layers.4", "norm", "output"]]\n'), "1,2,1,1", None),
])  # fmt: skip
def test_torchtitan_reader_sets_framework_and_split(tmp_path, extra, split, virtual):
    from memcalc.configs import read_torchtitan

    path = tmp_path / "job.toml"
    path.write_text(TT + extra)
    r = read_torchtitan(path, world_size=32)
    assert r.arguments["framework"] == "torchtitan" and r.arguments["pp"] == 4
    assert r.arguments["stage_layers"] == split and r.arguments.get("virtual_stages") == virtual
    if split != "1,2,1,1":  # the last names 5 of the model's 32 layers: a split memcalc refuses in one line
        est = memcalc.estimate(**r.arguments, accounting="paper")
        assert [s.layers for s in est.memory.stages] == [sum(int(x) for x in split.split(",")[k::4]) for k in range(4)]
    else:
        with pytest.raises(InputError, match=r"--stage-layers adds up to 5, not layers\(32\)"):
            memcalc.estimate(**r.arguments, accounting="paper")


def test_fsdp_inside_pipeline_stages_keeps_the_stage_gathered_and_its_gradients_unsharded():
    # torchtitan: no reshard after forward under PP; pipelining turns gradient sync off until the last micro-batch
    kw = dict(model="llama-3-8b", gpus=16, pp=2, fsdp="FULL_SHARD", seq_len=2048, grad_accum=4, gpu="h100")
    est = memcalc.estimate(framework="torchtitan", accounting="paper", **kw)  # (auto: the realistic timeline)
    top = max(est.memory.stages, key=lambda s: s.total)  # the stage the rows describe
    rows = {r.key: r.bytes for r in est.memory.per_gpu.rows}
    assert rows["pipeline_gathered_parameters"] == 2 * top.parameters  # bf16 compute copy of the whole stage
    assert rows["pipeline_unsharded_gradients"] == 4 * top.parameters  # fp32: FSDP2's reduce dtype accumulates
    ops = [(c.op, c.phase, c.calls_per_step) for c in est.communication.collectives if c.group == "data-parallel"]
    assert ops == [("all-gather", "forward", 1), ("reduce-scatter", "backward", 1)]  # once per step, not per micro-batch
    flat = memcalc.estimate(model="llama-3-8b", gpus=8, fsdp="FULL_SHARD", seq_len=2048, grad_accum=4, gpu="h100",
                            accounting="paper")
    assert not {"pipeline_gathered_parameters", "pipeline_unsharded_gradients"} & {r.key for r in flat.memory.per_gpu.rows}
    gathers = [c.calls_per_step for c in flat.communication.collectives if c.op == "all-gather"]
    assert gathers == [4, 4]  # without a pipeline: forward and backward, every micro-batch


def test_dtensor_tensor_parallel_saves_the_gathered_inputs_whole():
    # torchtitan (DTensor TP + SP): PrepareModuleInput gathers the normed input before attention and before the MLP,
    # and autograd keeps that full-sequence tensor for q/k/v and gate/up; Megatron keeps its 1/t shard (Korthikanti).
    kw = dict(model="llama-3-70b", gpus=64, tp=8, sequence_parallel=True, fsdp="FULL_SHARD", seq_len=8192,
              gpu="h100", recompute="selective", attention="flash")
    megatron = memcalc.estimate(**kw).memory.per_gpu.activations
    titan = memcalc.estimate(framework="torchtitan", **kw).memory.per_gpu.activations
    s, h, d, t, layers = 8192, 8192, 2, 8, 80
    assert titan - megatron == layers * 2 * (s * h * d - s * h * d // t)
    no_sp = {k: v for k, v in kw.items() if k != "sequence_parallel"}
    assert memcalc.estimate(framework="torchtitan", **no_sp).memory.per_gpu.activations == \
        memcalc.estimate(**no_sp).memory.per_gpu.activations  # without SP the inputs are whole either way


def test_torchtitan_reduces_fsdp_gradients_in_fp32():
    # torchtitan's mixed_precision_reduce = "float32" (config/configs.py): FSDP2's reduce-scatter carries fp32
    kw = dict(model="llama-3-8b", fsdp="FULL_SHARD", gpus=8, gpu="h100")
    rs = {fw: next(c for c in memcalc.estimate(framework=fw, **kw).communication.collectives
                   if c.op == "reduce-scatter") for fw in ("torchtitan", "hf")}
    assert (rs["torchtitan"].dtype, rs["hf"].dtype) == ("fp32", "bf16")
    assert rs["torchtitan"].payload_bytes_per_call == 2 * rs["hf"].payload_bytes_per_call == 4 * 8_030_261_248


def test_megatron_accumulates_and_reduces_bf16_gradients_in_fp32():
    # Megatron-LM's --bf16 sets accumulate_allreduce_grads_in_fp32 (arguments.py), so its grad buffer is fp32: 18 bytes
    # per parameter with the plain optimizer, 6 + 12/d with the distributed one (its dist_optimizer.md table)
    kw = {"model": "llama-3-8b", "gpus": 8, "framework": "megatron", "precision": "bf16-mixed", "accounting": "paper"}
    states = ("parameters", "gradients", "master_weights", "optimizer_moments")
    ddp, dist = memcalc.estimate(ddp=True, **kw), memcalc.estimate(stage=1, **kw)
    assert sum(rows(ddp)[k] for k in states) == 18 * PSI_8B
    assert sum(rows(dist)[k] for k in states) == 6 * PSI_8B + 12 * N8
    rs = next(c for c in dist.communication.collectives if c.op == "reduce-scatter")
    ag = next(c for c in dist.communication.collectives if c.op == "all-gather")
    assert (rs.dtype, rs.payload_bytes_per_call, ag.dtype) == ("fp32", 4 * PSI_8B, "bf16")
    # fp16 keeps fp16 gradients (the flag is bf16's), and other frameworks keep bf16 ones
    assert rows(memcalc.estimate(stage=1, **kw | {"precision": "fp16-mixed"}))["gradients"] == 2 * PSI_8B
    assert rows(memcalc.estimate(stage=1, **kw | {"framework": "deepspeed"}))["gradients"] == 2 * PSI_8B
    # with a sequence length too: Megatron-Core's own step (memory/accountings/megatron.py), not DeepSpeed's ZeRO-1 timeline:
    # the same fp32 grad buffer, each bucket padded to a multiple of lcm(dp, 128) (param_and_grad_buffer.py)
    auto = memcalc.estimate(stage=1, seq_len=2048, **kw | {"accounting": "auto"})
    assert auto.accounting == "realistic" and any("Megatron-Core" in n for n in auto.notes)
    buckets = -(-PSI_8B // 40_000_000)
    assert rows(auto)["gradients"] == 4 * (PSI_8B + buckets * 128)
    with pytest.raises(InputError, match="--framework megatron with --precision fp32"):
        memcalc.estimate(stage=1, seq_len=2048, **kw | {"accounting": "realistic", "precision": "fp32"})


def test_float8_all_gather_keeps_the_pipeline_stage_gathered_in_fp8():
    # torchao's fsdp_post_all_gather wraps the gathered fp8 bytes: under PP they stay gathered all step, 1 byte per
    # converted weight element, the embedding, norms and head in bf16
    from memcalc.inputs.presets import load_model
    from memcalc.model.float8 import layer_weights

    kw = dict(model="llama-3-8b", gpus=16, pp=2, fsdp="FULL_SHARD", fsdp_version=2, seq_len=2048, grad_accum=4,
              gpu="h100", framework="torchtitan", precision="bf16-mixed", float8="tensorwise", accounting="paper")
    plain = memcalc.estimate(**kw)
    fp8 = memcalc.estimate(**kw, float8_all_gather=True)
    rows = lambda e: {r.key: r.bytes for r in e.memory.per_gpu.rows}  # noqa: E731
    stage = max(plain.memory.stages, key=lambda s: s.total)
    n8 = stage.layers * layer_weights(load_model("llama-3-8b"), 1)
    assert rows(plain)["pipeline_gathered_parameters"] == 2 * stage.parameters
    assert rows(fp8)["pipeline_gathered_parameters"] == 2 * stage.parameters - n8
    assert rows(fp8)["pipeline_unsharded_gradients"] == rows(plain)["pipeline_unsharded_gradients"]
