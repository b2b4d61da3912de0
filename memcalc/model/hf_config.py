"""Hugging Face ``config.json`` -> ``Architecture``, without network and without transformers.

Each reader maps one ``model_type``'s keys (and that model class's defaults when a key is absent,
from the transformers configuration_*.py and modeling_*.py files) onto the shape memcalc counts.

Reading is strict: a count is a JSON integer from 1 to its bound (``memcalc.model.architecture.MAX_*``), a switch
is a JSON boolean, a dropout a JSON number in [0, 1). A float count is refused even when it is whole (4096.0):
transformers writes counts with ``json.dumps`` of Python ints, and ``nn.Linear(4096.0, ...)`` fails in PyTorch,
so a float there is a hand edit that the model class itself would not load. ``null`` stands for "absent" only
where the transformers config class maps ``None`` to a default (``head_dim``, ``n_inner``,
``num_key_value_heads``, ...). Every refusal is one ``InputError`` line naming the file, the key, the value and
what is accepted.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from collections.abc import Callable
from typing import Any


from memcalc.errors import InputError
from memcalc.files import MAX_FILE_BYTES, read_bounded  # noqa: F401 - read_bounded is used here and re-exported
from memcalc.model.hf_hub import hub_config, hub_id
from memcalc.model import architecture as shape
from memcalc.model.architecture import Architecture
from memcalc.model.hf_json import MAX_DEPTH, Config, _kind, _show, parse_config  # noqa: F401 - re-exported



_REQUIRED = object()

# What each count means, for the message: (bound, meaning).
LAYERS = (shape.MAX_LAYERS, "decoder layers")
HIDDEN = (shape.MAX_HIDDEN, "model width")
HEADS = (shape.MAX_HEADS, "attention heads")
HEAD_DIM = (shape.MAX_HEAD_DIM, "width of one head")
FFN = (shape.MAX_FFN, "MLP inner width")
VOCAB = (shape.MAX_VOCAB, "vocabulary size")
POSITIONS = (shape.MAX_POSITIONS, "learned positions")
EXPERTS = (shape.MAX_EXPERTS, "experts")


class _Keys:
    """Typed reads of one config.json's keys; ``where`` names the file in every message."""

    def __init__(self, cfg: Config, where: str, model_type: str) -> None:
        self.cfg, self.where, self.model_type = cfg, where, model_type
        self.keys: dict[str, str] = {}
        """Architecture field -> the config key it was read from (for messages about two fields)."""

    def _refuse(self, key: str, value: Any, problem: str, accepted: str) -> InputError:
        return InputError(f"{self.where}: {key} {_show(value)} {problem}; accepted: {accepted}")

    def _find(self, keys: tuple[str, ...], nullable: bool) -> tuple[str, Any] | None:
        for key in keys:
            if key in self.cfg and not (nullable and self.cfg[key] is None):
                return key, self.cfg[key]
        return None

    def count(self, field: str, *keys: str, bound: tuple[int, str], default: Any = _REQUIRED,
              nullable: bool = False) -> Any:  # fmt: skip
        """A whole number from 1 to ``bound``, from the first of ``keys`` present (``nullable``: null = absent)."""
        found = self._find(keys, nullable)
        if found is None:
            if default is _REQUIRED:
                alt = "".join(f" (or {k!r})" for k in keys[1:])
                raise InputError(f"{self.where} for {self.model_type} lacks the key {keys[0]!r}{alt}")
            return default
        key, value = found
        high, meaning = bound
        accepted = f"a JSON integer from 1 to {high:,} ({meaning})"
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._refuse(key, value, f"is {_kind(value)}", accepted)
        if not 1 <= value <= high:
            raise self._refuse(key, value, "is out of range", accepted)
        self.keys[field] = key
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean (true/false), ``default`` when absent; "false", 0 and null are refused."""
        value = self.cfg.get(key, default)
        if not isinstance(value, bool):
            raise self._refuse(key, value, f"is {_kind(value)}", "a JSON boolean, true or false")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A fraction in (0, 1] (``default`` when absent or null)."""
        value = self.cfg.get(key)
        if value is None:
            return default
        accepted = "a JSON number above 0 and at most 1"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(key, value, f"is {_kind(value)}", accepted)
        if not (math.isfinite(value) and 0 < value <= 1):
            raise self._refuse(key, value, "is out of range", accepted)
        return float(value)

    def dropout(self, *keys: str) -> float:
        """The largest of the dropout probabilities present (0 when none is)."""
        out = 0.0
        for key in (k for k in keys if k in self.cfg):
            value = self.cfg[key]
            accepted = "a JSON number from 0 up to (not including) 1"
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._refuse(key, value, f"is {_kind(value)}", accepted)
            if not (math.isfinite(value) and 0 <= value < 1):
                raise self._refuse(key, value, "is out of range", accepted)
            out = max(out, float(value))
        return out


def _llama_like(k: _Keys, **over: Any) -> dict[str, Any]:
    """LLaMA, Mistral, Qwen2, Mixtral: RMSNorm, rotary, SwiGLU, untied by default."""
    layers = k.count("layers", "num_hidden_layers", bound=LAYERS)
    hidden = k.count("hidden", "hidden_size", bound=HIDDEN)
    heads = k.count("heads", "num_attention_heads", bound=HEADS)
    bias = k.flag("attention_bias", False)
    fields = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        # LlamaConfig: num_key_value_heads None -> num_attention_heads; head_dim None -> hidden_size // heads.
        "kv_heads": k.count("kv_heads", "num_key_value_heads", bound=HEADS, default=heads, nullable=True),
        "head_dim": k.count("head_dim", "head_dim", bound=HEAD_DIM, default=None, nullable=True),
        "ffn": k.count("ffn", "intermediate_size", bound=FFN),
        "gated_mlp": True,
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        "tied_embeddings": k.flag("tie_word_embeddings", False),
        "position": "rotary",
        "norm": "rmsnorm",
        "norm_bias": False,
        "qkv_bias": bias,
        "out_bias": bias,
        "dropout": k.dropout("attention_dropout"),
    }
    if "mlp_bias" not in over:
        fields["mlp_bias"] = k.flag("mlp_bias", False)
    return fields | over


def _qwen3_moe(k: _Keys) -> dict[str, Any]:
    """configuration_qwen3_moe.py, modeling_qwen3_moe.py: Qwen3's attention (q_norm/k_norm, no bias by default; the
    attention reads ``head_dim`` where the config has it, else hidden_size // heads) and a sparse MoE block of
    ``num_experts`` experts ``moe_intermediate_size`` wide, ``num_experts_per_tok`` each, on every
    ``decoder_sparse_step``-th layer; ``norm_topk_prob`` (default false) divides the top-k weights by their sum.
    ``mlp_only_layers`` (dense layers named one by one) is refused unless empty."""
    only = k.cfg.get("mlp_only_layers")
    if only not in (None, []):
        raise k._refuse("mlp_only_layers", only, "names dense layers among the sparse ones, which memcalc does not "
                        "model", "an empty list (every decoder_sparse_step-th layer sparse)")
    return _llama_like(k, mlp_bias=False, qk_norm=True,
                       experts=k.count("experts", "num_experts", bound=EXPERTS, default=128),
                       top_k=k.count("top_k", "num_experts_per_tok", bound=EXPERTS, default=8),
                       expert_ffn=k.count("expert_ffn", "moe_intermediate_size", bound=FFN, default=768),
                       moe_every=k.count("moe_every", "decoder_sparse_step", bound=LAYERS, default=1),
                       router_norm=k.flag("norm_topk_prob", False))


def _gpt2(k: _Keys) -> dict[str, Any]:
    hidden = k.count("hidden", "n_embd", bound=HIDDEN)
    return {
        "layers": k.count("layers", "n_layer", bound=LAYERS),
        "hidden": hidden,
        "heads": k.count("heads", "n_head", bound=HEADS),
        # modeling_gpt2.py: inner_dim = n_inner if n_inner is not None else 4 * hidden_size.
        "ffn": k.count("ffn", "n_inner", bound=FFN, default=4 * hidden, nullable=True),
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "position": "learned",
        "max_positions": k.count("max_positions", "n_positions", bound=POSITIONS, default=1024),
        "fused_qkv": True,
        # each GPT2Config's default 0.1 where the file leaves it out
        "dropout": max(k.dropout(key) if key in k.cfg else 0.1 for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop")),
    }


def _gpt_neox(k: _Keys) -> dict[str, Any]:
    bias = k.flag("attention_bias", True)
    hidden = k.count("hidden", "hidden_size", bound=HIDDEN)
    heads = k.count("heads", "num_attention_heads", bound=HEADS)
    # GPTNeoXAttention: rotary_ndims = int(head_size * partial_rotary_factor); the factor is config.json's
    # ``rotary_pct`` (transformers 4.x) or ``rope_parameters.partial_rotary_factor`` (5.x), 0.25 by default
    rope = k.cfg.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise k._refuse("rope_parameters", rope, f"is {_kind(rope)}",
                        "a JSON object (rope_theta, partial_rotary_factor)")
    factor = (k.fraction("rotary_pct", 0.25) if rope is None or rope.get("partial_rotary_factor") is None
              else _Keys(rope, f"{k.where}: rope_parameters", "gpt_neox").fraction("partial_rotary_factor", 0.25))
    return {
        "layers": k.count("layers", "num_hidden_layers", bound=LAYERS),
        "hidden": hidden,
        "heads": heads,
        "rotary_dims": max(1, int(hidden // heads * factor)),
        "ffn": k.count("ffn", "intermediate_size", bound=FFN),
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        "tied_embeddings": k.flag("tie_word_embeddings", False),
        "position": "rotary",
        "fused_qkv": True,
        "qkv_bias": bias,
        "out_bias": bias,
        "parallel_block": k.flag("use_parallel_residual", True),
        "dropout": k.dropout("attention_dropout", "hidden_dropout"),
    }


def _bloom(k: _Keys) -> dict[str, Any]:
    # BloomConfig: n_embed is the old name of hidden_size; n_layer and n_head are its attribute names.
    return {
        "layers": k.count("layers", "n_layer", "num_hidden_layers", bound=LAYERS, nullable=True),
        "hidden": k.count("hidden", "hidden_size", "n_embed", bound=HIDDEN, nullable=True),
        "heads": k.count("heads", "n_head", "num_attention_heads", bound=HEADS, nullable=True),
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "position": "alibi",
        "embedding_norm": True,
        "fused_qkv": True,
        "dropout": k.dropout("attention_dropout", "hidden_dropout"),
    }


def _opt(k: _Keys) -> dict[str, Any]:
    hidden = k.count("hidden", "hidden_size", bound=HIDDEN)
    bias = k.flag("enable_bias", True)
    return {
        "layers": k.count("layers", "num_hidden_layers", bound=LAYERS),
        "hidden": hidden,
        "heads": k.count("heads", "num_attention_heads", bound=HEADS),
        "ffn": k.count("ffn", "ffn_dim", bound=FFN),
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        # OPTConfig: word_embed_proj_dim None -> hidden_size.
        "embedding_dim": k.count("embedding_dim", "word_embed_proj_dim", bound=HIDDEN, default=hidden, nullable=True),
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "position": "learned",
        "max_positions": k.count("max_positions", "max_position_embeddings", bound=POSITIONS, default=2048),
        "position_offset": 2,  # OPTLearnedPositionalEmbedding keeps 2 extra rows
        "final_norm": k.flag("do_layer_norm_before", True),
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bias,
        "dropout": k.dropout("dropout", "attention_dropout"),
    }


def _falcon(k: _Keys) -> dict[str, Any]:
    # FalconConfig: n_head and n_layer are the old names of num_attention_heads and num_hidden_layers.
    heads = k.count("heads", "num_attention_heads", "n_head", bound=HEADS, nullable=True)
    new_arch = k.flag("new_decoder_architecture", False)
    if new_arch:  # FalconConfig: num_kv_heads None -> num_attention_heads
        kv = k.count("kv_heads", "num_kv_heads", bound=HEADS, default=heads, nullable=True)
    else:
        kv = 1 if k.flag("multi_query", True) else heads
    bias = k.flag("bias", False)
    parallel = k.flag("parallel_attn", True)
    hidden = k.count("hidden", "hidden_size", bound=HIDDEN)
    norms = k.count("norms", "num_ln_in_parallel_attn", bound=(2, "norms before a parallel block"), default=2,
                    nullable=True) if new_arch else 1
    return {
        "layers": k.count("layers", "num_hidden_layers", "n_layer", bound=LAYERS, nullable=True),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv,
        # modeling_falcon.py: ffn_hidden_size None -> 4 * hidden_size.
        "ffn": k.count("ffn", "ffn_hidden_size", bound=FFN, default=4 * hidden, nullable=True),
        "vocab": k.count("vocab", "vocab_size", bound=VOCAB),
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "position": "alibi" if k.flag("alibi", False) else "rotary",
        # FalconDecoderLayer: num_ln_in_parallel_attn None -> 2 under the new decoder architecture (ln_attn and ln_mlp
        # on the same input; Falcon-11B sets 1); a sequential block has its post_attention_layernorm
        "norms_per_layer": 2 if (new_arch and norms == 2) or not parallel else 1,
        "parallel_block": parallel,
        "kv_expanded": new_arch,
        "fused_qkv": True,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bias,
        "dropout": k.dropout("attention_dropout", "hidden_dropout"),
    }


def _nope_layers(k: _Keys) -> tuple[int, ...]:
    """SmolLM3Config: ``no_rope_layers`` (1 = rotary, 0 = none, one entry per layer) or, when absent or null, a
    NoPE layer every ``no_rope_layer_interval`` layers (default 4): layer i skips it when (i + 1) % interval == 0."""
    layers = k.count("layers", "num_hidden_layers", bound=LAYERS)
    flags = k.cfg.get("no_rope_layers")
    if flags is None:
        every = k.count("nope_every", "no_rope_layer_interval", bound=LAYERS, default=4, nullable=True)
        return tuple(i for i in range(layers) if (i + 1) % every == 0)
    if (not isinstance(flags, list) or len(flags) != layers
            or any(isinstance(f, bool) or f not in (0, 1) for f in flags)):  # fmt: skip
        raise k._refuse("no_rope_layers", flags, "is not a list of 0/1 flags, one per layer",
                        f"a JSON array of {layers} integers, each 0 (no rotary) or 1")
    return tuple(i for i, f in enumerate(flags) if f == 0)


def _softcap(k: _Keys, key: str, default: float | None) -> bool:
    """Gemma2Config/Gemma3TextConfig ``*_softcapping``: ``float | None``; a positive number turns the cap on."""
    value = k.cfg.get(key, default)
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise k._refuse(key, value, f"is {_kind(value)}" if not isinstance(value, (int, float)) or isinstance(
            value, bool) else "is out of range", "a positive JSON number, or null (no cap)")  # fmt: skip
    return True


_LAYER_TYPES = ("sliding_attention", "full_attention")


def _sliding(k: _Keys, layers: int, pattern: int) -> dict[str, Any]:
    """Gemma2Config, Gemma3TextConfig: ``layer_types`` (one of sliding_attention / full_attention per layer) or,
    when absent or null, layer i slides when (i + 1) % pattern != 0 (Gemma 2: 2, alternating from layer 0;
    Gemma 3: ``sliding_window_pattern``, default 6); ``sliding_window`` (default 4096; null: no layer slides)."""
    if "sliding_window" in k.cfg and k.cfg["sliding_window"] is None:
        return {}
    window = k.count("sliding_window", "sliding_window", bound=(shape.MAX_POSITIONS, "tokens a sliding layer sees"),
                     default=4096)
    types = k.cfg.get("layer_types")
    if types is None:
        return {"sliding_window": window, "sliding_layers": tuple(i for i in range(layers) if (i + 1) % pattern)}
    if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        raise k._refuse("layer_types", types, "is not a list of layer types, one per layer",
                        f"a JSON array of {layers} strings, each \"sliding_attention\" or \"full_attention\"")
    return {"sliding_window": window,
            "sliding_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention")}


def _gemma(k: _Keys, version: int) -> dict[str, Any]:
    """configuration_gemma.py, configuration_gemma2.py, configuration_gemma3.py (Gemma3TextConfig): head_dim 256,
    tied embeddings, no biases by default (attention_bias on q, k, v and o; the MLP has none), kv heads 16 (Gemma)
    or 4; GemmaRMSNorm scales by (1 + weight). Gemma 2 and 3 put a norm before and after attention and MLP
    (``pre_feedforward_layernorm``, ``post_feedforward_layernorm``) and mix sliding-window and full layers; Gemma 2
    soft-caps the attention scores (50.0) and the logits (30.0); Gemma 3 has q_norm/k_norm over head_dim and
    applies only ``final_logit_softcapping`` (default null; modeling_gemma3.py never passes the attention cap)."""
    layers = k.count("layers", "num_hidden_layers", bound=LAYERS)
    fields = _llama_like(k, mlp_bias=False, head_dim=k.count("head_dim", "head_dim", bound=HEAD_DIM, default=256),
                         kv_heads=k.count("kv_heads", "num_key_value_heads", bound=HEADS,
                                          default=16 if version == 1 else 4),
                         tied_embeddings=k.flag("tie_word_embeddings", True))  # fmt: skip
    if version == 1:
        return fields
    pattern = 2 if version == 2 else k.count("sliding_window_pattern", "sliding_window_pattern", bound=LAYERS,
                                             default=6)  # fmt: skip
    return fields | _sliding(k, layers, pattern) | {
        "norms_per_layer": 4, "norm_placement": "sandwich", "qk_norm": version == 3,
        "attention_softcap": version == 2 and _softcap(k, "attn_logit_softcapping", 50.0),
        "logit_softcap": _softcap(k, "final_logit_softcapping", 30.0 if version == 2 else None)}


READERS: dict[str, Callable[[_Keys], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": lambda k: _llama_like(k, qkv_bias=False, out_bias=False, mlp_bias=False),
    # modeling_qwen2.py: q/k/v projections have a bias, o_proj and the MLP do not.
    "qwen2": lambda k: _llama_like(k, qkv_bias=True, out_bias=False, mlp_bias=False),
    "mixtral": lambda k: _llama_like(k, qkv_bias=False, out_bias=False, mlp_bias=False,
                                     experts=k.count("experts", "num_local_experts", bound=EXPERTS, default=8),
                                     top_k=k.count("top_k", "num_experts_per_tok", bound=EXPERTS, default=2)),
    # modeling_qwen3.py: Qwen2 without the q/k/v bias (attention_bias, default false, on q, k, v and o), with q_norm
    # and k_norm; Qwen3Config's head_dim defaults to 128 when the key is absent (null: hidden_size // heads).
    "qwen3": lambda k: _llama_like(k, mlp_bias=False, qk_norm=True,
                                   **({} if "head_dim" in k.cfg else {"head_dim": 128})),
    "qwen3_moe": _qwen3_moe,
    # modeling_phi3.py: qkv_proj and gate_up_proj fused, no biases; Phi3Config has no attention_bias.
    "phi3": lambda k: _llama_like(k, qkv_bias=False, out_bias=False, mlp_bias=False, fused_qkv=True,
                                  fused_gate_up=True),
    # modeling_granite.py, modeling_smollm3.py: Llama's modules; Granite's multipliers scale by Python floats (no
    # saved tensors, no parameters); SmolLM3 skips the rotary embedding in every fourth layer (no_rope_layers).
    "granite": _llama_like,
    "smollm3": lambda k: _llama_like(k, tied_embeddings=k.flag("tie_word_embeddings", True),
                                     nope_layers=_nope_layers(k)),
    "gemma": lambda k: _gemma(k, 1),
    "gemma2": lambda k: _gemma(k, 2),
    "gemma3_text": lambda k: _gemma(k, 3),
    # modeling_olmo2.py: Llama's projections and SwiGLU without pre-norms: Olmo2RMSNorm after attention and after
    # the MLP (post_attention_layernorm, post_feedforward_layernorm), q_norm/k_norm over the whole q and kv width.
    "olmo2": lambda k: _llama_like(k, mlp_bias=False, qk_norm=True, qk_norm_width="full", norm_placement="post"),
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "opt": _opt,
    "falcon": _falcon,
}


def _relations(k: _Keys, f: dict[str, Any]) -> None:
    """The checks between two keys, worded with the config's own key names (Architecture repeats them)."""
    key = lambda field: k.keys.get(field, field)
    if f.get("head_dim") is None and f["hidden"] % f["heads"]:
        raise InputError(f"{k.where}: {key('heads')} {f['heads']} does not divide {key('hidden')} {f['hidden']}; "
                         f"accepted: a head count that divides the width")  # fmt: skip
    kv = f.get("kv_heads")
    if kv is not None and f["heads"] % kv:
        raise InputError(f"{k.where}: {key('kv_heads')} {kv} does not divide {key('heads')} {f['heads']}; "
                         f"accepted: a divisor of the head count")  # fmt: skip
    if f.get("experts") and f["top_k"] > f["experts"]:
        raise InputError(f"{k.where}: {key('top_k')} {f['top_k']} is more than {key('experts')} {f['experts']}; "
                         f"accepted: 1 to the number of experts")  # fmt: skip


def architecture_from_config(cfg: Config, name: str | None = None, where: str = "config.json") -> Architecture:
    """An ``Architecture`` from a parsed config.json; ``where`` names it in messages."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where} holds {_kind(cfg)}, not a JSON object; accepted: a Hugging Face config.json")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in READERS:
        raise InputError(
            f"{where} model_type {_show(model_type)} is not supported; supported: {', '.join(sorted(READERS))}"
        )
    keys = _Keys(cfg, where, model_type)
    fields = READERS[model_type](keys)
    _relations(keys, fields)
    try:
        return Architecture(name=name, family=model_type, source="config.json", **fields)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def read_config(path: str | os.PathLike[str]) -> bytes:
    """The bytes (at most ``MAX_FILE_BYTES + 1``) of a config.json path, or of a Hub id's config.json."""
    if isinstance(path, str) and hub_id(path) is not None:
        return hub_config(path, MAX_FILE_BYTES)[1]
    return read_bounded(path)[1]


def load_hf_config(path: str | os.PathLike[str]) -> Architecture:
    """An ``Architecture`` from a config.json file (at most 1 MiB, UTF-8, nested at most 32 levels), or from the
    config.json of a Hugging Face Hub id (``org/name[@revision]``: the local cache, else one request;
    ``memcalc.model.hf_hub``)."""
    where = f"--hf-config {str(path)!r}"
    hub = hub_id(path) if isinstance(path, str) else None
    data = read_config(path)
    fallback = "" if hub is not None else Path(path).expanduser().parent.name or Path(path).stem
    cfg = parse_config(data, where)
    name = cfg.get("_name_or_path")
    if name is not None and not isinstance(name, str):
        raise InputError(f"{where}: _name_or_path {_show(name)} is {_kind(name)}; accepted: a JSON string")
    # a Hub id names the model better than a config's _name_or_path, which is often a training run's local folder
    return architecture_from_config(cfg, name=hub[0] if hub is not None else name or fallback, where=where)
