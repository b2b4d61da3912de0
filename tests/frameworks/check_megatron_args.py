"""Megatron-Core's own config classes over memcalc's megatron_args.txt files: exit 1 if any refuses one.

Run with the python of a venv that has megatron-core (its torch pin differs from memcalc's test venv):

    python tests/frameworks/check_megatron_args.py DIR/megatron_args.txt ...

megatron-core ships ``megatron/core`` without Megatron-LM's argparse parser, so each option is taken where
Megatron-LM takes it (megatron/training/arguments.py: ``core_transformer_config_from_args`` copies every parsed
option whose name is a ``TransformerConfig`` field, ``--fp8-format`` is stored as ``fp8``, ``--swiglu`` sets a
SiLU-gated MLP, ``--num-layers-per-virtual-pipeline-stage`` becomes the virtual pipeline size in ``validate_args``).
An option this table does not route is a failure: memcalc must not write a name Megatron does not have.

Then the job is built as rank 0 of the world size launch.sh's torchrun line gives, on torch's fake process group:
``TransformerConfig`` (its ``__post_init__`` checks recompute, fp8, sequence-parallel and pipeline rules),
``OptimizerConfig`` and ``DistributedDataParallelConfig``, ``parallel_state.initialize_model_parallel`` (the world
size must divide into tp x pp x cp and the experts' layout), the micro-batch calculator (the global batch must be
micro-batch x data-parallel size x a whole number), and rank 0's ``GPTModel`` from the local layer spec on the meta
device, whose parameters are printed.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from pathlib import Path

RENAMED = {"--fp8-format": "fp8", "--num-experts": "num_moe_experts", "--disable-bias-linear": None,
           "--swiglu": None, "--group-query-attention": None, "--fp8-param-gather": "fp8_param"}  # fmt: skip
"""Options whose TransformerConfig field is not the option's own name (None: handled below; ``--fp8-param-gather``
is ``fp8_param``, core_transformer_config_from_args)."""
LISTS = {"--recompute-modules"}
"""Options Megatron-LM's argparse takes with ``nargs="*"``: a list however many words follow."""
MODEL_ARGS = {"--max-position-embeddings", "--position-embedding-type", "--untie-embeddings-and-output-weights"}
"""GPTModel's own arguments (pretrain_gpt.py ``model_provider``)."""
TRAINING_ARGS = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--use-distributed-optimizer",
                 "--num-layers-per-virtual-pipeline-stage", "--grad-reduce-in-bf16"}  # fmt: skip
"""Taken by the training loop: the micro-batch calculator, the optimizer and DDP configs, validate_args
(``--grad-reduce-in-bf16``: ``DistributedDataParallelConfig.grad_reduce_in_fp32`` off)."""


def parse(path: Path) -> dict[str, object]:
    words = shlex.split(path.read_text(encoding="utf-8"), comments=True)
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        opt = words[i]
        assert opt.startswith("--"), f"{opt!r} is not an option"
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        given = [int(w) if re.fullmatch(r"\d+", w) else w for w in words[i + 1:j]]
        # argparse's nargs: a list option (--recompute-modules) takes every word up to the next option, any other
        # one value or none (a flag)
        assert opt in LISTS or len(given) <= 1, f"{opt} takes one value, not {given}"
        value: object = given if opt in LISTS else given[0] if given else True
        i = j
        assert opt not in out, f"{opt} given twice"
        out[opt] = value
    return out


def world_size(launch: Path) -> int:
    m = re.search(r"--nnodes (\d+) --nproc_per_node (\d+)", launch.read_text(encoding="utf-8"))
    assert m, f"no torchrun line in {launch}"
    return int(m[1]) * int(m[2])


def check(path: Path) -> str:
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.num_microbatches_calculator import (
        destroy_num_microbatches_calculator, get_num_microbatches, init_num_microbatches_calculator)
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    args = parse(path)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw: dict[str, object] = {}
    for opt, value in args.items():
        if opt in MODEL_ARGS or opt in TRAINING_ARGS:
            continue
        name = RENAMED.get(opt, opt[2:].replace("-", "_"))
        if name is None:
            continue
        assert name in fields, f"{opt}: Megatron-Core's TransformerConfig has no field {name!r}"
        kw[name] = value
    if args.get("--swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if args.get("--disable-bias-linear"):
        kw["add_bias_linear"] = False
    if not args.get("--group-query-attention"):
        kw.pop("num_query_groups", None)
    if kw.get("defer_embedding_wgrad_compute"):  # Megatron-LM's default, which the deferral needs (it refuses it
        kw.setdefault("gradient_accumulation_fusion", True)  # without: model_parallel_config.py)
    _check_types(TransformerConfig, kw)
    for needed in ("num_layers", "hidden_size", "num_attention_heads"):
        assert needed in kw, f"--{needed.replace('_', '-')} is not written"
    tp, pp = kw.get("tensor_model_parallel_size", 1), kw.get("pipeline_model_parallel_size", 1)
    cp, ep = kw.get("context_parallel_size", 1), kw.get("expert_model_parallel_size", 1)
    per_chunk = args.get("--num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:  # validate_args: num_layers // pp // per_chunk model chunks per rank
        assert kw["num_layers"] % (pp * per_chunk) == 0, "layers do not divide into pp x virtual chunks"
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // pp // per_chunk
    dtype = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else torch.float32
    config = TransformerConfig(**kw, params_dtype=dtype, pipeline_dtype=dtype, use_cpu_initialization=True,
                               perform_initialization=False)  # core_transformer_config_from_args: pipeline_dtype
    distributed = bool(args.get("--use-distributed-optimizer"))
    OptimizerConfig(optimizer="adam", bf16=bool(kw.get("bf16")), fp16=bool(kw.get("fp16")),
                    use_distributed_optimizer=distributed)
    bf16_grads = bool(args.get("--grad-reduce-in-bf16"))
    assert not bf16_grads or kw.get("bf16"), "--grad-reduce-in-bf16 without --bf16"
    DistributedDataParallelConfig(use_distributed_optimizer=distributed, grad_reduce_in_fp32=not bf16_grads)

    world = world_size(path.parent / "launch.sh")
    seq = args["--seq-length"]
    assert seq <= args["--max-position-embeddings"], "--seq-length above --max-position-embeddings"
    if cp > 1:  # megatron/core/utils.py get_batch_on_this_cp_rank: 2 x cp chunks of the sequence
        assert seq % (2 * cp) == 0, f"--seq-length {seq} does not split into 2 x cp {cp} chunks"
    torch.distributed.init_process_group("fake", rank=0, world_size=world,
                                         store=torch.distributed.HashStore())  # fmt: skip
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=kw.get("virtual_pipeline_model_parallel_size"),
            context_parallel_size=cp, expert_model_parallel_size=ep,
            create_gloo_process_groups=False)  # gloo groups would connect to the other (absent) ranks
        dp = parallel_state.get_data_parallel_world_size()
        init_num_microbatches_calculator(0, None, args["--global-batch-size"], args["--micro-batch-size"], dp)
        accumulation = get_num_microbatches()
        spec = get_gpt_layer_local_spec(num_experts=kw.get("num_moe_experts"), qk_layernorm=bool(kw.get("qk_layernorm")),
                                        normalization=kw.get("normalization"))
        # The local spec's torch norms refuse sequence parallelism and its attention context parallelism (Transformer
        # Engine's layers, Megatron-LM's default --transformer-impl, take both): the config above was checked with
        # them; rank 0's parameters are the same without them.
        # (and the fused weight-gradient kernel, which the deferral needs, is CUDA's: built without both)
        built = dataclasses.replace(config, sequence_parallel=False, context_parallel_size=1,
                                    gradient_accumulation_fusion=False, defer_embedding_wgrad_compute=False)
        with torch.device("meta"):
            model = GPTModel(built, spec, vocab_size=128256, max_sequence_length=args["--max-position-embeddings"],
                             pre_process=True, post_process=pp == 1,
                             share_embeddings_and_output_weights=not args.get("--untie-embeddings-and-output-weights"),
                             position_embedding_type=args.get("--position-embedding-type", "learned_absolute"),
                             vp_stage=0 if per_chunk is not None else None)
        params = sum(p.numel() for p in model.parameters())
    finally:
        destroy_num_microbatches_calculator()
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
    return (f"world {world}: dp {dp} tp {tp} pp {pp} cp {cp} ep {ep}, accumulation {accumulation}, "
            f"rank 0's first model chunk {params / 1e9:.3f}B parameters (vocab 128256)")


def _check_types(cls: type, kw: dict[str, object]) -> None:
    """A dataclass does not check its annotations: a value outside a field's Literal, or not of its type, is refused
    here as Megatron-LM's argparse ``choices``/``type`` would."""
    import typing

    hints = typing.get_type_hints(cls)
    for name, value in kw.items():
        hint = hints[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union \
            else [hint]
        kinds = [a for a in args if typing.get_origin(a) is typing.Literal]
        if kinds:
            allowed = [v for a in kinds for v in typing.get_args(a)]
            assert value in allowed, f"{name} {value!r} is not one of {allowed}"
        elif args and all(isinstance(a, type) for a in args):
            assert isinstance(value, tuple(args)), f"{name} {value!r} is not {' or '.join(a.__name__ for a in args)}"


def main(paths: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")  # no Transformer Engine or apex here: megatron-core says so at every import
    if not paths:
        print("give megatron_args.txt files", file=sys.stderr)
        return 2
    failed = 0
    for path in map(Path, paths):
        try:
            print(f"ok {path}: {check(path)}")
        except Exception as e:  # noqa: BLE001 - every refusal is reported, then the exit status says so
            print(f"FAIL {path}: Megatron-Core refused it: {type(e).__name__}: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
