"""A census of what torchtitan's Llama 3 saves for backward, on this CPU (torchtitan 0.3.0, torch 2.13).

The model is torchtitan's own (``torchtitan.models.llama3``: ``Llama3Model``, ``_build_llama3_layers`` with
``fuse_qkv=True`` as every flavour builds it, ``ComplexRoPE``, ``FlexAttention``) at a tiny size, run as the
trainer runs it (``trainer.py`` ``post_dataloading_process``: per-document ``positions`` of shape (b, s) and the
block-causal ``BlockMask`` from ``Decoder.get_attention_masks``). Two stand-ins, because flex attention has no
CPU backward (torch ``nn/attention/flex_attention.py`` ``_validate_device``) and is compiled by torchtitan:
the device check is lifted for the forward (no backward runs here) and ``flex_attention`` runs eagerly. What the
op saves is its autograd function's ``save_values_for_backward`` (torch ``_higher_order_ops/flex_attention.py``
``FlexAttentionAutogradOp.forward``): q, k, v, out, log-sum-exp, max_scores and the block mask. Compiled (as
torchtitan runs it), the partitioner keeps only what ``flex_attention_backward`` reads: max_scores is not kept,
so records named ``(eager only)`` are left out of the totals.

Regimes: ``fp32``; ``bf16`` = FSDP2 ``MixedPrecisionPolicy(param_dtype=bfloat16)`` on one process: the
parameters are cast to bf16, buffers (the complex64 RoPE cache) are not, the loss upcasts as torchtitan does.
Recompute: ``none``, ``full`` (``FullAC``: ``ptd_checkpoint_wrapper`` per block), ``selective`` (``SelectiveAC``,
per-op: the outputs of the ops in ``_get_default_save_ops`` except every second mm). Under checkpointing the
census reads what the checkpoint keeps: the block's arguments (torch ``utils/checkpoint.py`` closes over them)
and, for SAC, the cache of ``_CachingTorchDispatchMode`` (outputs of MUST_SAVE ops).

Records are ``(name, shape, dtype, bytes)``; bytes count once per storage (views share), parameters count 0.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

Record = tuple[str, tuple[int, ...], str, int]
DIM, HEADS, KV, LAYERS, VOCAB, SEQ, BATCH, MULTIPLE_OF = 256, 4, 2, 2, 1000, 64, 2, 64
RECOMPUTE = ("none", "full", "selective")


def available() -> bool:
    try:
        import torchtitan.models.llama3  # noqa: F401
    except ImportError:  # not installed, or an import it needs is missing
        return False
    return True


def ffn_dim(dim: int = DIM, multiple_of: int = MULTIPLE_OF) -> int:
    from torchtitan.models.common import compute_ffn_hidden_dim

    return compute_ffn_hidden_dim(dim, multiple_of=multiple_of)


@contextmanager
def _eager_flex() -> Any:
    """Run torchtitan's FlexAttention eagerly and let its forward build a graph on CPU (see the module doc)."""
    import torch.nn.attention.flex_attention as fa
    import torchtitan.models.common.attention as ta

    saved = (
        fa._validate_device,
        ta.FlexAttention._compiled_flex_attn,
        ta._compiled_create_block_mask,
    )
    fa._validate_device = lambda *a, **k: None
    ta.FlexAttention._compiled_flex_attn = fa.flex_attention
    ta._compiled_create_block_mask = fa.create_block_mask
    try:
        yield
    finally:
        (
            fa._validate_device,
            ta.FlexAttention._compiled_flex_attn,
            ta._compiled_create_block_mask,
        ) = saved


def build(
    dtype: str = "fp32",
    recompute: str = "none",
    attention: str = "flex",
    seq: int = SEQ,
) -> nn.Module:
    """The tiny torchtitan Llama 3 (``attention``: ``flex`` as torchtitan 0.3 builds it, or ``sdpa``: its
    ``ScaledDotProductAttention`` with ``is_causal=True``, the backend of earlier releases)."""
    if dtype not in ("fp32", "bf16") or recompute not in RECOMPUTE or attention not in ("flex", "sdpa"):
        raise ValueError(f"dtype {dtype!r}, recompute {recompute!r}, attention {attention!r}: not supported")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.model import Llama3Model

    layers = _build_llama3_layers(
        fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV, hidden_dim=ffn_dim(),
        rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=seq, theta=500000, scaling="llama"),
        attn_backend="flex")  # fmt: skip
    if attention == "sdpa":
        for layer in layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    cfg = Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)))  # fmt: skip
    torch.manual_seed(0)
    model = cfg.build()
    if dtype == "bf16":  # MixedPrecisionPolicy(param_dtype=bf16) casts parameters only
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    if recompute == "full":
        FullAC(FullAC.Config()).apply(model)
    elif recompute == "selective":
        SelectiveAC(SelectiveAC.Config()).apply(model)
    model.train()
    return model


def inputs(model: nn.Module, attention: str, seq: int = SEQ, batch: int = BATCH) -> tuple[torch.Tensor, dict]:
    """Token ids and the keyword arguments the trainer passes (positions; the BlockMask for flex)."""
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).repeat(batch, 1)
    kw: dict = {"positions": positions}
    if attention == "flex":
        kw["attention_masks"] = model.get_attention_masks(positions)
    return ids, kw


def _labels(ids: torch.Tensor) -> torch.Tensor:
    """The targets, a tensor of their own as the dataloader yields them (the next tokens)."""
    return torch.roll(ids, -1, dims=1)


def _op_names(root: torch.Tensor | None) -> dict[int, str]:
    """Storage pointer -> the autograd node (and its field) that saved it, from a walk of the graph."""
    names: dict[int, str] = {}
    seen, todo = (
        set(),
        [root.grad_fn] if root is not None and root.grad_fn is not None else [],
    )
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        fields = [(a, getattr(fn, a, None)) for a in dir(fn) if a.startswith("_saved_")]
        if not fields and hasattr(fn, "saved_tensors"):
            try:
                fields = [(f"saved[{i}]", t) for i, t in enumerate(fn.saved_tensors)]
            except RuntimeError:
                fields = []
        for attr, v in fields:
            for t in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                    ptr, node = t.untyped_storage().data_ptr(), type(fn).__name__
                    if ptr not in names or "Attention" in node:  # the attention op over the matmul sharing it
                        names[ptr] = f"{node}.{attr.removeprefix('_saved_')}"
        todo.extend(n for n, _ in fn.next_functions)
    return names


def _block_mask_tensors(x: Any) -> list[torch.Tensor]:
    from torch.nn.attention.flex_attention import BlockMask

    if isinstance(x, BlockMask):
        return [t for t in vars(x).values() if isinstance(t, torch.Tensor)]
    return [x] if isinstance(x, torch.Tensor) else []


def _wrap_checkpoints(model: nn.Module, kept: dict[int, list]) -> None:
    """Record what each block's checkpoint keeps: its arguments, and the SAC cache of MUST_SAVE outputs."""
    for name, block in model.layers.named_children():
        i = int(name)

        def pre(mod, args, kwargs, i=i):
            for a in list(args) + list(kwargs.values()):
                kept[i] += [("checkpoint argument", t) for t in _block_mask_tensors(a)]

        block.register_forward_pre_hook(pre, with_kwargs=True)
        kw = dict(block.checkpoint_fn.keywords)
        ctx_fn = kw.get("context_fn")
        if ctx_fn is None:
            continue

        def context_fn(ctx_fn=ctx_fn, i=i):
            fwd, rec = ctx_fn()
            kept[i].append(("sac", fwd.storage))
            return fwd, rec

        kw["context_fn"] = context_fn
        block.checkpoint_fn = partial(block.checkpoint_fn.func, *block.checkpoint_fn.args, **kw)


def _sac_tensors(storage: dict) -> list[tuple[str, torch.Tensor]]:
    out = []
    for key, entries in storage.items():
        op = getattr(key, "__name__", str(key))
        for value in entries.values():
            for j, leaf in enumerate(tree_flatten(value)[0]):
                t = getattr(leaf, "val", None)
                if isinstance(t, torch.Tensor):  # flex_attention returns (out, logsumexp, max_scores)
                    eager = " (eager only)" if op == "flex_attention" and j == 2 else ""
                    out.append((f"SAC kept: {op}[{j}]{eager}", t))
    return out


def _pop(stack: list[str]) -> Any:
    def hook(mod: nn.Module, args: Any, out: Any) -> None:  # returns None: the output is left as it is
        stack.pop()

    return hook


def _layer_of(path: str) -> int | None:
    parts = path.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit() else None


def census(dtype: str = "fp32", recompute: str = "none", attention: str = "flex",
           seq: int = SEQ, batch: int = BATCH, with_loss: bool = False) -> dict[str, list[Record]]:  # fmt: skip
    """Run the model's forward (no loss) and return the saved tensors per part: ``layer.i``, ``shared`` (saved by
    more than one layer: the block mask, the positions), and the outside modules' paths."""
    with _eager_flex():
        model = build(dtype, recompute, attention, seq)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        ids, kw = inputs(model, attention, seq, batch)
        events: list[tuple[str, str, torch.Tensor]] = []  # (module path, name hint, tensor)
        kept: dict[int, list] = {i: [] for i in range(LAYERS)}
        if recompute != "none":
            _wrap_checkpoints(model, kept)
        stack: list[str] = []
        hooks = []
        for name, mod in model.named_modules():
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=name: stack.append(n)))
            hooks.append(mod.register_forward_hook(_pop(stack), always_call=True))

        def pack(t: torch.Tensor) -> torch.Tensor:
            events.append((stack[-1] if stack else "", "", t))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(ids, **kw)
            if with_loss:  # trainer.py ``_forward_backward_body``: loss_fn(pred, labels), here unchunked
                from torchtitan.components.loss import cross_entropy_loss

                stack.append("loss")
                out = cross_entropy_loss(out, _labels(ids))
        for h in hooks:
            h.remove()
    # Under checkpointing, reading a saved tensor of a block would replay it: names come from the hints only.
    ops = _op_names(out) if recompute == "none" else {}
    for i, items in kept.items():
        for hint, v in items:
            pairs = _sac_tensors(v) if hint == "sac" else [(hint, v)]
            events += [(f"layers.{i}", n, t) for n, t in pairs]
    return _attribute(events, ops, params)


def _attribute(events: list, ops: dict[int, str], params: set[int]) -> dict[str, list[Record]]:
    layers_of: dict[int, set[int]] = {}
    for path, _, t in events:
        if (i := _layer_of(path)) is not None:
            layers_of.setdefault(t.untyped_storage().data_ptr(), set()).add(i)
    parts: dict[str, list[Record]] = {}
    seen: set[int] = set()
    for path, hint, t in events:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if not st.nbytes() or ptr in params or ptr in seen:
            continue
        seen.add(ptr)
        i = _layer_of(path)
        part = path or "<root>" if i is None else ("shared" if len(layers_of[ptr]) > 1 else f"layer.{i}")
        name = hint or ops.get(
            ptr,
            "checkpoint input (_CheckpointFrame.save_inputs)" if i is not None else "?",
        )
        if name.startswith("FlexAttentionAutogradOp") and t.dim() == 3 and ptr != 0 and _is_max_scores(name):
            name += " (eager only)"
        parts.setdefault(part, []).append((f"{name} @ {path}", tuple(t.shape), str(t.dtype).removeprefix("torch."),
                                           st.nbytes()))  # fmt: skip
    return parts


def _is_max_scores(name: str) -> bool:
    return name.endswith("saved[5]")  # q, k, v, out, logsumexp, max_scores, *block_mask: index 5


def torchtitan_layer_census(dtype: str, recompute: str, attention: str = "flex") -> list[Record]:
    """Every storage decoder layer 0 keeps for backward (tiny config, b=2, s=64); ``recompute``: none | full |
    selective. Empty when torchtitan is not installed."""
    if not available():
        return []
    return census(dtype, recompute, attention)["layer.0"]


def layer_bytes(records: list[Record]) -> int:
    """Bytes of a layer's records, without what only the eager (uncompiled) flex attention keeps."""
    return sum(r[3] for r in records if "(eager only)" not in r[0])


def torchtitan_head_census(dtype: str, recompute: str = "none", attention: str = "flex") -> dict[str, list[Record]]:
    """What the model keeps outside its layers with torchtitan's unchunked ``cross_entropy_loss``
    (components/loss.py: ``cross_entropy(pred.flatten(0, 1).float(), labels, reduction="sum")``): parts
    ``tok_embeddings``, ``shared`` (block mask), ``norm``, ``lm_head``, ``loss``. Empty without torchtitan."""
    if not available():
        return {}
    parts = census(dtype, recompute, attention, with_loss=True)
    return {k: v for k, v in parts.items() if not k.startswith("layer.")}


def torchtitan_loss_peak(dtype: str, chunks: int | None = 8, seq: int = SEQ, batch: int = BATCH) -> dict[str, int]:
    """Live bytes the loss adds on top of the forward's saved tensors (``memcalc.validation.trace_tracker.LiveBytes``),
    with the head weight frozen so that its gradient (a parameter gradient) is not counted.

    ``chunks=None``: the unchunked ``CrossEntropyLoss`` as ``_forward_backward_body`` runs it (the trainer drops
    ``pred`` before ``loss.backward()``); the head's input is detached so only the head and loss run backward.
    ``chunks=N``: ``ChunkedLossWrapper`` (the default loss of every llama3 trainer config in 0.3.0,
    models/llama3/config_registry.py), which runs the head and a backward per chunk inside its call.
    Keys: ``forward`` and ``backward`` peaks (unchunked), ``peak`` and ``end`` (bytes still live when the loss
    returns: the gradient of the head's input), all relative to the bytes live before the loss."""
    from torchtitan.components.loss import ChunkedLossWrapper, cross_entropy_loss

    from memcalc.validation.trace_tracker import LiveBytes

    with _eager_flex():
        model = build(dtype, "none", "flex", seq)
        model._skip_lm_head = True
        ids, kw = inputs(model, "flex", seq, batch)
        h = model(ids, **kw)
    labels = _labels(ids)
    model.lm_head.weight.requires_grad_(False)
    tracker = LiveBytes(record_timeline=False)
    base = tracker.add_baseline([*model.parameters(), *model.buffers(), h, ids, labels])
    if chunks is None:
        hd = h.detach().requires_grad_()
        with tracker:
            tracker.phase("forward")
            logits = model.lm_head(hd)
            loss = cross_entropy_loss(logits, labels)
            del logits
            tracker.phase("backward")
            loss.backward()
        p = tracker.phase_peaks
        return {"forward": p["forward"] - base, "backward": p["backward"] - base, "peak": tracker.peak - base,
                "end": tracker.live - base}  # fmt: skip
    wrapper = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=chunks))
    wrapper.set_lm_head(model.lm_head)
    with tracker:
        tracker.phase("loss")
        loss, _ = wrapper(h, labels)
    return {"peak": tracker.peak - base, "end": tracker.live - base}


def main() -> None:
    """Print every census: ``python -m memcalc.validation.saved_torchtitan``."""
    if not available():
        print("torchtitan is not installed")
        return
    for attention in ("flex", "sdpa"):
        for dtype in ("fp32", "bf16"):
            for recompute in RECOMPUTE:
                rec = torchtitan_layer_census(dtype, recompute, attention)
                print(f"== layer 0, {attention} {dtype} recompute={recompute}: {layer_bytes(rec)} B")
                for r in rec:
                    print(f"   {r[0]:90} {r[1]!s:18} {r[2]:10} {r[3]}")
    for dtype in ("fp32", "bf16"):
        for part, rec in torchtitan_head_census(dtype).items():
            print(f"== outside, {dtype}: {part} {sum(r[3] for r in rec)} B")
            for r in rec:
                print(f"   {r[0]:90} {r[1]!s:18} {r[2]:10} {r[3]}")
        for chunks in (None, 8):
            print(f"== loss live bytes, {dtype}, chunks={chunks}: {torchtitan_loss_peak(dtype, chunks)}")


if __name__ == "__main__":
    main()
