"""A census of what a Hugging Face decoder layer saves for backward under ``torch.compile``, on this CPU.

Under ``torch.compile`` a compiled region's forward runs inside AOTAutograd's ``CompiledFunction``
(torch/_functorch/_aot_autograd/runtime_wrappers.py), an ``autograd.Function`` whose forward keeps the values the
partitioner chose through ``ctx.save_for_backward``: ``torch.autograd.graph.saved_tensors_hooks`` sees each of them,
in the order of the partitioned forward graph's outputs after the user outputs (``fw_outputs + saved_values``,
torch/_functorch/partitioners.py ``_extract_fwd_bwd_outputs``). The census names each saved tensor by its node in
that graph and the source line that made it, and counts bytes once per storage, as ``memcalc.validation.saved``.

Backends: ``aot_eager`` (AOTAutograd with ``min_cut_rematerialization_partition`` and eager kernels,
torch/_dynamo/backends/debugging.py ``aot_eager``) is what the census runs by default: the same partitioner as
``inductor`` (torch/_inductor/compile_fx.py ``compile_fx`` partitions with ``min_cut_rematerialization_partition``)
in a second or two rather than half a minute of C++ compilation per graph. ``inductor`` can be run too; it names
saved tensors by position only and reports activations and weight casts together (``kind="all"``). On this machine
both backends save the same bytes per layer for llama in fp32, bf16 and amp-bf16 (tests/test_compile.py checks one
case when ``MEMCALC_INDUCTOR=1``).

Scopes: ``layer`` compiles each decoder layer on its own (``torch.compile(layer)``, as torchtitan's
``apply_compile`` and torchtune's ``compile_model`` do per transformer block); ``model`` compiles the whole causal
LM, loss included, into one graph (a 3-layer model: layer 1 is a middle layer, attributed by the saved node's
``nn_module_stack``; a layer's output residual, the next layer's input, is attributed to the layer that made it).
Shapes are static (``dynamic=False``): every (s, b) compiles anew, as a fixed-length training run does.
``code="torchtitan"`` compiles the blocks of torchtitan's Llama 3 (``memcalc.validation.saved_torchtitan.build``,
SDPA) per block instead.

Re-run: ``python -m memcalc.validation.saved_compile llama amp-bf16 8 2 [layer|model] [aot_eager|inductor]``.
"""

from __future__ import annotations

import functools
import os
import re
from contextlib import nullcontext
from typing import Any, Literal

Scope = Literal["layer", "model"]
BACKENDS = ("aot_eager", "inductor")
FAMILIES = ("llama", "mistral", "qwen2")
_VIEWS = {"t", "view", "transpose", "permute", "detach", "alias", "_unsafe_view", "expand", "unsqueeze", "clone"}


def available(backend: str = "aot_eager") -> bool:
    """Whether torch.compile runs here: a tiny function compiled with ``backend`` goes forward and backward."""
    try:
        import torch

        x = torch.ones(4, requires_grad=True)
        torch.compile(lambda y: (y * 2).sin(), backend=backend, dynamic=False)(x).sum().backward()
        return x.grad is not None
    except Exception:  # noqa: BLE001  no dynamo on this Python, no C compiler for inductor, ...
        return False


def _source(node: Any) -> str:
    """``file:line code`` of the innermost frame that made ``node`` in the traced forward."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    files = [i for i, line in enumerate(trace) if line.strip().startswith("File ")]
    if not files:
        return ""
    i = files[-1]
    m = re.search(r'File "([^"]+)", line (\d+)', trace[i])
    code = trace[i + 1].strip() if i + 1 < len(trace) else ""
    return f"{os.path.basename(m.group(1))}:{m.group(2)} {code}" if m else code


def _layer_of(node: Any) -> int | None:
    for path, _ in reversed(list((node.meta.get("nn_module_stack") or {}).values())):
        m = re.search(r"layers[.\[](\d+)", str(path))
        if m:
            return int(m.group(1))
    return None


class _Recorder:
    """An ``aot_eager`` backend that remembers, for each forward graph it runs, what each output is."""

    def __init__(self) -> None:
        self.calls: list[list[dict]] = []  # per compiled-forward call: one dict per graph output

    def backend(self) -> Any:
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        def fw(gm: Any, example_inputs: Any) -> Any:
            run = boxed_nop(gm, example_inputs)
            places = [n for n in gm.graph.nodes if n.op == "placeholder"]
            outs = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])

            def call(args: list) -> Any:
                import torch

                params = {p for p, a in zip(places, args) if isinstance(a, torch.nn.Parameter)}
                self.calls.append([_describe(n, params) for n in outs])
                return run(args)

            call._boxed_call = True  # type: ignore[attr-defined]
            return call

        return aot_autograd(fw_compiler=fw, bw_compiler=boxed_nop, partition_fn=min_cut_rematerialization_partition,
                            keep_inference_input_mutations=True)  # fmt: skip


def _describe(node: Any, params: set) -> dict:
    """Name, kind (activation, weight_cast, parameter) and layer of one forward-graph output node."""
    cur, cast, layer = node, False, _layer_of(node)
    while getattr(cur, "op", None) == "call_function" and getattr(cur.target, "__name__", "").split(".")[0] in (
        _VIEWS | {"_to_copy"}
    ):  # back through views and casts: to a parameter (a weight cast), and to a node that knows its layer
        cast = cast or cur.target.__name__.startswith("_to_copy")
        cur = cur.args[0]
        layer = layer if layer is not None else _layer_of(cur)
    kind = "activation"
    if cur in params:
        kind = "weight_cast" if cast else "parameter"
    name = node.name if node.op == "placeholder" else f"{node.name}: {_source(node)}"
    return {"name": name, "kind": kind, "layer": layer}


def _build(family: str, regime: str, attention: str, layers: int) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from memcalc.validation.saved import _LAYER_KEYS, tiny_config

    cfg = tiny_config(family) | {_LAYER_KEYS.get(family, "num_hidden_layers"): layers}
    torch.manual_seed(0)
    dtype = torch.bfloat16 if regime == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), attn_implementation=attention, dtype=dtype)
    return model.train()


def compiled_layer_census(family: str, regime: str, s: int, b: int, *, attention: str = "sdpa",
                          scope: Scope = "layer", backend: str = "aot_eager",
                          kind: str = "activation") -> list[tuple[str, tuple[int, ...], str, int]]:  # fmt: skip
    """(name, shape, dtype, bytes) of every storage decoder layer 1 saves for backward under ``torch.compile``.

    ``kind``: ``activation`` or ``weight_cast`` (autocast's bf16 copies of weights) with ``aot_eager``; ``all``
    (both; with ``inductor`` named by position only) with either backend. Parameters and storages that several
    layers save (the rotary cos, sin) are left out; a storage saved twice counts once (bytes 0 the second time)."""
    if kind not in ("activation", "weight_cast", "all") or (backend != "aot_eager" and kind != "all"):
        raise ValueError(f"kind {kind!r}: aot_eager gives activation, weight_cast or all; inductor gives all")
    rows = census_rows(family, regime, s, b, attention=attention, scope=scope, backend=backend)
    return [(n, sh, dt, nb) for n, sh, dt, nb, k in rows if kind == "all" or k == kind]


def census_rows(family: str, regime: str, s: int, b: int, *, attention: str = "sdpa", scope: Scope = "layer",
                backend: str = "aot_eager", code: str = "hf") -> list[tuple[str, tuple[int, ...], str, int, str]]:  # fmt: skip
    """The census's rows with their kind last: ``activation``, ``weight_cast``, or ``all`` (inductor: not told).
    ``code="torchtitan"``: torchtitan's Llama 3 blocks (``memcalc.validation.saved_torchtitan.build``, fp32 or
    bf16, SDPA: flex attention has no CPU backward), compiled per block as torchtitan's ``apply_compile`` does."""
    import torch

    if family not in FAMILIES or (code == "torchtitan" and family != "llama"):
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)} (torchtitan: llama)")
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if scope == "model" and (backend != "aot_eager" or code != "hf"):  # a whole-model graph is split by node names
        raise ValueError("scope 'model' needs the aot_eager backend and Hugging Face code")
    torch._dynamo.reset()
    model, layers, call = _setup(code, family, regime, attention, s, b, 3 if scope == "model" else 2)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    rec = _Recorder()
    compiler = rec.backend() if backend == "aot_eager" else "inductor"
    where = ["outside"]  # the layer running (scope "layer"), read by the pack hook
    if scope == "model":
        call = functools.partial(call, torch.compile(model, backend=compiler, dynamic=False, fullgraph=True))
    else:
        call = functools.partial(call, model)
        for i, (key, layer) in enumerate(list(layers.items())):
            c = torch.compile(layer, backend=compiler, dynamic=False, fullgraph=True)
            c.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, f"layer.{i}"))
            c.register_forward_hook(lambda m, a, o: where.__setitem__(0, "outside"))
            layers[key] = c
    events: list[tuple[int, str, torch.Tensor]] = []  # (forward-graph call, part, tensor)

    def pack(t: torch.Tensor) -> torch.Tensor:
        events.append((len(rec.calls) - 1, where[0], t))
        return t

    amp = torch.autocast("cpu", dtype=torch.bfloat16) if regime == "amp-bf16" else nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        out = call()
    rows = _rows(events, rec.calls, params, scope, backend)
    del out
    torch._dynamo.reset()
    return rows


def _setup(code: str, family: str, regime: str, attention: str, s: int, b: int, layers: int) -> tuple:
    """(model, its layer container as a dict-like, forward(model) with the inputs its trainer passes)."""
    import torch

    if code == "torchtitan":
        from memcalc.validation import saved_torchtitan as tt

        if regime not in ("fp32", "bf16") or attention != "sdpa":
            raise ValueError(f"torchtitan census: fp32 or bf16 with sdpa; got {regime}, {attention}")
        model = tt.build(regime, "none", attention, s)
        ids, kw = tt.inputs(model, attention, s, b)
        return model, model.layers, lambda m: m(ids, **kw)
    if code != "hf":
        raise ValueError(f"code {code!r} is not one of hf, torchtitan")
    model = _build(family, regime, attention, layers)
    ids = torch.randint(0, 120, (b, s), generator=torch.Generator().manual_seed(0))
    seq = model.model.layers
    return model, _ListAsDict(seq), lambda m: m(input_ids=ids, labels=ids)


class _ListAsDict:
    """A ``ModuleList`` seen through ``items()`` and item assignment, as torchtitan's ``ModuleDict`` is."""

    def __init__(self, seq: Any) -> None:
        self.seq = seq

    def items(self) -> list:
        return list(enumerate(self.seq))

    def __setitem__(self, key: int, value: Any) -> None:
        self.seq[key] = value


def _rows(events: list, calls: list, params: set[int], scope: Scope, backend: str) -> list[tuple]:
    """Layer 1's rows (name, shape, dtype, bytes, kind) from the pack events, named by the graph outputs."""
    by_call: dict[tuple[int, str], list] = {}  # a compiled region's saves: one forward call, inside one part
    for c, part, t in events:
        by_call.setdefault((c, part), []).append((part, t))
    named = []  # (part, name, kind, tensor)
    for (c, part), evs in by_call.items():
        inside = backend == "aot_eager" and c >= 0 and (scope == "model" or part != "outside")
        descr = calls[c][-len(evs) :] if inside else [None] * len(evs)
        for (part, t), d in zip(evs, descr):
            if d is None:
                named.append((part, "saved", "all", t))
                continue
            if scope == "model":
                part = f"layer.{d['layer']}" if d["layer"] is not None else "outside"
            named.append((part, d["name"], d["kind"], t))
    layers_of: dict[int, set[str]] = {}
    for part, _, _, t in named:  # which layers save each storage (the rotary cos, sin: every layer)
        if part.startswith("layer."):
            layers_of.setdefault(t.untyped_storage().data_ptr(), set()).add(part)
    out, seen = [], set()
    for i, (part, name, k, t) in enumerate(named):
        ptr = t.untyped_storage().data_ptr()
        if layers_of.get(ptr) != {"layer.1"} or ptr in params or t.untyped_storage().nbytes() == 0:
            continue
        nb = 0 if ptr in seen else t.untyped_storage().nbytes()
        seen.add(ptr)
        label = name if name != "saved" else f"saved[{i}]"
        out.append((label, tuple(t.shape), str(t.dtype).removeprefix("torch."), nb, k))
    return out


def describe(rows: list[tuple[str, tuple[int, ...], str, int]]) -> str:
    return "\n".join(f"{dt:9} {sh!s:16} {nb:7}  {name}" for name, sh, dt, nb in rows)


if __name__ == "__main__":  # python -m memcalc.validation.saved_compile llama amp-bf16 8 2 [layer|model] [backend]
    import sys

    a = sys.argv[1:]
    rows = compiled_layer_census(a[0], a[1], int(a[2]), int(a[3]), scope=a[4] if len(a) > 4 else "layer",  # type: ignore[arg-type]
                                 backend=a[5] if len(a) > 5 else "aot_eager", kind="all")  # fmt: skip
    print(describe(rows))
    print("total", sum(r[3] for r in rows))
