"""Hugging Face ``config.json`` -> ``Architecture``, without network and without transformers.

Each reader maps one ``model_type``'s keys (and that model class's defaults when a key is absent,
from the transformers configuration_*.py and modeling_*.py files) onto the shape memcalc counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memcalc.model.architecture import Architecture
from memcalc.errors import InputError

Config = dict[str, Any]


def _dropout(cfg: Config, *keys: str) -> float:
    return max((float(cfg.get(k) or 0.0) for k in keys), default=0.0)


def _llama_like(cfg: Config, **over: Any) -> dict[str, Any]:
    """LLaMA, Mistral, Qwen2, Mixtral: RMSNorm, rotary, SwiGLU, untied by default."""
    bias = bool(cfg.get("attention_bias", False))
    return {
        "layers": cfg["num_hidden_layers"],
        "hidden": cfg["hidden_size"],
        "heads": cfg["num_attention_heads"],
        "kv_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        "head_dim": cfg.get("head_dim"),
        "ffn": cfg["intermediate_size"],
        "gated_mlp": True,
        "vocab": cfg["vocab_size"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "position": "rotary",
        "norm": "rmsnorm",
        "norm_bias": False,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "dropout": _dropout(cfg, "attention_dropout"),
        **over,
    }


def _llama(cfg: Config) -> dict[str, Any]:
    return _llama_like(cfg)


def _mistral(cfg: Config) -> dict[str, Any]:
    return _llama_like(cfg, qkv_bias=False, out_bias=False, mlp_bias=False)


def _qwen2(cfg: Config) -> dict[str, Any]:
    # modeling_qwen2.py: q/k/v projections have a bias, o_proj and the MLP do not.
    return _llama_like(cfg, qkv_bias=True, out_bias=False, mlp_bias=False)


def _mixtral(cfg: Config) -> dict[str, Any]:
    return _llama_like(cfg, qkv_bias=False, out_bias=False, mlp_bias=False, experts=cfg.get("num_local_experts", 8),
                       top_k=cfg.get("num_experts_per_tok", 2))  # fmt: skip


def _gpt2(cfg: Config) -> dict[str, Any]:
    return {
        "layers": cfg["n_layer"],
        "hidden": cfg["n_embd"],
        "heads": cfg["n_head"],
        "ffn": cfg.get("n_inner") or 4 * cfg["n_embd"],
        "vocab": cfg["vocab_size"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "position": "learned",
        "max_positions": cfg.get("n_positions", 1024),
        "fused_qkv": True,
        "dropout": _dropout(cfg, "attn_pdrop", "resid_pdrop"),
    }


def _gpt_neox(cfg: Config) -> dict[str, Any]:
    bias = bool(cfg.get("attention_bias", True))
    return {
        "layers": cfg["num_hidden_layers"],
        "hidden": cfg["hidden_size"],
        "heads": cfg["num_attention_heads"],
        "ffn": cfg["intermediate_size"],
        "vocab": cfg["vocab_size"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "position": "rotary",
        "fused_qkv": True,
        "qkv_bias": bias,
        "out_bias": bias,
        "parallel_block": bool(cfg.get("use_parallel_residual", True)),
        "dropout": _dropout(cfg, "attention_dropout", "hidden_dropout"),
    }


def _bloom(cfg: Config) -> dict[str, Any]:
    hidden = cfg.get("hidden_size") or cfg["n_embed"]
    return {
        "layers": cfg.get("n_layer") or cfg["num_hidden_layers"],
        "hidden": hidden,
        "heads": cfg.get("n_head") or cfg["num_attention_heads"],
        "vocab": cfg["vocab_size"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "position": "alibi",
        "embedding_norm": True,
        "fused_qkv": True,
        "dropout": _dropout(cfg, "attention_dropout", "hidden_dropout"),
    }


def _opt(cfg: Config) -> dict[str, Any]:
    hidden = cfg["hidden_size"]
    bias = bool(cfg.get("enable_bias", True))
    return {
        "layers": cfg["num_hidden_layers"],
        "hidden": hidden,
        "heads": cfg["num_attention_heads"],
        "ffn": cfg["ffn_dim"],
        "vocab": cfg["vocab_size"],
        "embedding_dim": cfg.get("word_embed_proj_dim") or hidden,
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "position": "learned",
        "max_positions": cfg.get("max_position_embeddings", 2048),
        "position_offset": 2,  # OPTLearnedPositionalEmbedding keeps 2 extra rows
        "final_norm": bool(cfg.get("do_layer_norm_before", True)),
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bias,
        "dropout": _dropout(cfg, "dropout", "attention_dropout"),
    }


def _falcon(cfg: Config) -> dict[str, Any]:
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        kv = cfg.get("num_kv_heads") or heads
    else:
        kv = 1 if cfg.get("multi_query", True) else heads
    bias = bool(cfg.get("bias", False))
    parallel = bool(cfg.get("parallel_attn", True))
    return {
        "layers": cfg.get("num_hidden_layers") or cfg["n_layer"],
        "hidden": cfg["hidden_size"],
        "heads": heads,
        "kv_heads": kv,
        "ffn": cfg.get("ffn_hidden_size") or 4 * cfg["hidden_size"],
        "vocab": cfg["vocab_size"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "position": "alibi" if cfg.get("alibi", False) else "rotary",
        "norms_per_layer": 2 if new_arch or not parallel else 1,
        "parallel_block": parallel,
        "fused_qkv": True,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bias,
        "dropout": _dropout(cfg, "attention_dropout", "hidden_dropout"),
    }


READERS: dict[str, Callable[[Config], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "opt": _opt,
    "falcon": _falcon,
}


def architecture_from_config(cfg: Config, name: str | None = None) -> Architecture:
    """An ``Architecture`` from a parsed config.json."""
    model_type = cfg.get("model_type")
    if model_type not in READERS:
        raise InputError(
            f"config.json model_type {model_type!r} is not supported; supported: {', '.join(sorted(READERS))}"
        )
    try:
        fields = READERS[model_type](cfg)
    except KeyError as e:
        raise InputError(f"config.json for {model_type} lacks the key {e.args[0]!r}") from None
    return Architecture(name=name, family=model_type, source="config.json", **fields)


def load_hf_config(path: str | Path) -> Architecture:
    p = Path(path).expanduser()
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"--hf-config {str(path)!r} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--hf-config {str(path)!r} is not a readable JSON file: {e}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"--hf-config {str(path)!r} does not hold a JSON object")
    return architecture_from_config(cfg, name=cfg.get("_name_or_path") or p.parent.name or p.stem)
