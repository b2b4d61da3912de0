"""What FSDP adds to each moment of the step, as ``(label, bytes)`` parts: the methods of
``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay`` (whose docstring gives the order of events and its sources), kept apart
from its fields. Every method takes the overlay (or None: no sharding, the single-GPU parts) first."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.memory.overlays.fsdp_overlay import FsdpOverlay


class FsdpMoments:
    """The moments' parts; ``FsdpOverlay`` holds the sizes they read."""

    @staticmethod
    def forward(fs: FsdpOverlay | None, i: int = 0) -> list[tuple[str, int]]:
        """During layer ``i``'s forward: the root, this layer gathered (and the layers before it, kept gathered
        under ``keep``), and its flat all-gather output."""
        if fs is None:
            return []
        if fs.whole:  # the embedding's all-gather output, until the head's gather copies out (tied: the root's
            # post-forward frees the [norm, embedding, head] unit's)
            return [("root parameters (gathered)", fs.root), ("all-gather output (embedding's unit)", fs.embed + fs.tail)]
        return [("root parameters (gathered)", fs.root)] + fs._kept(0) + [
                ("this layer's parameters (gathered)" if not fs.keep else f"layers 0..{i} parameters (gathered)",
                 fs.layer * (i + 1 if fs.keep else 1)),
                ("all-gather output (this layer)", 0 if fs.flat else fs.layer_flat)]

    @staticmethod
    def gather(fs: FsdpOverlay, i: int) -> list[tuple[str, int]]:
        """Layer ``i``'s forward all-gather copied out while the previous gather's output (the root's or the
        embedding's before layer 0) is still alive."""
        if fs.flat:  # FSDP1: the low-precision shard the all-gather sends, freed once it is done
            return FsdpMoments.forward(fs, i) + [("low-precision shard for the all-gather", fs.mp_shard)]
        previous = (fs.root_flat if fs.wrap == "root" else fs.embed) if i == 0 else fs.layer_flat
        return FsdpMoments.forward(fs, i) + [("all-gather output (previous unit)", previous)]

    def _kept(self, n: int) -> list[tuple[str, int]]:
        """Under ``keep``: the embedding's unit (gathered from its forward to its post-backward) and the ``n``
        decoder layers still gathered."""
        if not self.keep:
            return []
        embed = [("embedding parameters (gathered)", self.embed)] if self.wrap != "root" else []
        return embed + ([(f"layers 0..{n - 1} parameters (gathered)", n * self.layer)] if n else [])

    @staticmethod
    def after_layers(fs: FsdpOverlay | None, at: str = "loss", layers: int = 0) -> list[tuple[str, int]]:
        """From the final norm to the loss's gradients (``at``: gather, the head unit's pre-forward with the last
        layer's all-gather output not yet freed; norm, head, loss or loss-backward). Root wrap: the
        root gathered; the last layer's all-gather output (freed at the root's post-forward, then prefetched again
        by the root's pre-backward, unless the layers are kept gathered). separate: the head's unit, gathered at the
        final norm, and its all-gather output until the root's post-forward (the root has no parameters, so nothing
        is prefetched before the head's pre-backward). separate-reshard: the head's unit gathered for the head's
        forward only; its all-gather output from the head's forward to the root's post-forward, and again from the
        root's pre-backward (its prefetch). ``layers``: the model's, kept gathered under ``keep``."""
        if fs is None:
            return []
        root = [("root parameters (gathered)", fs.root)] + fs._kept(layers)
        if fs.flat:  # FSDP1: nothing of a layer until the root's pre-backward prefetches the last one, unsharded
            return root + [("last layer's parameters (prefetched)",
                            fs.layer if at == "loss-backward" and fs.prefetch and not fs.keep else 0)]
        if fs.wrap == "root" and fs.whole:  # tied: the [norm, embedding, head] unit's, until the root's post-forward
            return root + [("all-gather output (embedding's unit)", 0 if at == "loss-backward" else fs.tail)]
        if fs.wrap == "root":
            flat = 0 if fs.keep and at == "loss-backward" else fs.layer_flat
            return root + [("all-gather output (last layer)", flat)]
        gathered = ("head parameters (gathered)", fs.head)
        flat = ("all-gather output (head)", fs.head)
        if at == "gather":  # the last layer's all-gather output, or (whole) the embedding's
            return root + [gathered, flat, ("all-gather output (previous unit)", fs.embed if fs.whole else fs.layer_flat)]
        if fs.wrap == "separate":
            return root + [gathered] + ([] if at == "loss-backward" else [flat])
        if at == "norm":
            return root + [("all-gather output (last layer)", fs.layer_flat)]
        if fs.keep:  # the head's unit stays gathered from its forward; the root's prefetch finds it so
            return root + [gathered] + ([] if at == "loss-backward" else [flat])
        return root + ([gathered] if at == "head" else []) + [flat]

    @staticmethod
    def norm_backward(fs: FsdpOverlay | None, grads: int, layers: int = 0) -> list[tuple[str, int]]:
        """The final norm's backward; ``grads``: the head's and the final norm's unsharded gradients (the root's, or
        the head unit's until its post-backward). The head's pre-backward has prefetched the last layer's all-gather
        (the root's, under the root wrap; nothing under ``keep``); under separate-reshard the head's post-backward
        has reduce-scattered its gradients and the final norm's are the root's."""
        if fs is None:
            return [("head and final norm gradients", grads)]
        if fs.wrap == "root":
            return FsdpMoments.after_layers(fs, "loss-backward", layers) + [("head and final norm gradients", grads)]
        prefetched = ("all-gather output (next unit, prefetched)", 0 if fs.keep else fs.prefetched)
        if fs.wrap == "separate":  # (the root: nothing but the layers under ``whole``)
            return [("root parameters (gathered)", fs.root), ("head parameters (gathered)", fs.head),
                    ("head and final norm gradients", grads), prefetched] + fs._kept(layers)
        return [("root parameters (gathered)", fs.root), ("final norm gradients", fs.norm_grads),
                ("gradient shards of the layers above", fs.head_grad_shard),
                ("reduce-scatter input (head)", fs.head_reduce), ("all-reduce buffers (HSDP)", fs.head_held_reduce),
                prefetched] + fs._kept(layers)

    @staticmethod
    def head_backward(fs: FsdpOverlay, layers: int = 0) -> list[tuple[str, int]]:
        """The head's backward under a wrap with the head in a unit of its own: the unit gathered (copied out at its
        pre-backward), the root's parameters, and the last layer's all-gather prefetched by that pre-backward
        (under ``keep`` the ``layers`` still gathered instead)."""
        return [("root parameters (gathered)", fs.root), ("head parameters (gathered)", fs.head),
                ("all-gather output (next unit, prefetched)", 0 if fs.keep else fs.prefetched)] + fs._kept(layers)

    @staticmethod
    def backward(fs: FsdpOverlay | None, i: int, held: int, root_grads: int, gather: bool = False
                 ) -> list[tuple[str, int]]:  # fmt: skip
        """During layer ``i``'s backward; ``held``: the single-GPU gradients so far, ``root_grads`` of them the
        root's (head, final norm: unsharded until the root's post-backward). ``gather``: at its pre-backward, the
        prefetched all-gather copied out and not yet freed (the next layer's prefetch comes after). With the head in
        a unit of its own its gradients are a shard by now, and layer 0's pre-backward prefetches the embedding.
        Under ``keep`` layers 0..i are still gathered and nothing is gathered."""
        if fs is None:
            return [("parameter gradients so far", held)]
        if fs.whole:  # every gradient so far unsharded but the [head, norm] unit's; its reduce-scatter input kept
            return [("root parameters (gathered)", fs.root),
                    ("root gradients (unsharded)", fs._whole_grads(held, root_grads)),
                    ("gradient shards of the layers above", fs.head_grad_shard),
                    ("reduce-scatter input (layer above)", fs.head_reduce),
                    ("all-gather output (next unit, prefetched)", fs.prefetched)]
        done = (held - root_grads) // fs.layer_grads  # layers above i, already reduce-scattered
        reduce = fs.reduce_input
        if fs.wrap == "root":
            root, shards, last_reduce, prefetch, ar = root_grads // fs.width * fs.gathered_width, 0, 0, 0, 0
        else:
            root = fs.norm_grads if fs.wrap == "separate-reshard" else 0
            shards, last_reduce, prefetch, ar = fs.head_grad_shard, fs.head_reduce, fs.embed, fs.head_held_reduce
        flat = 0 if fs.keep or (fs.flat and not fs.prefetch) else \
            fs.layer_flat if i > 0 or (gather and not fs.flat) else prefetch
        if fs.flat:  # FSDP1 reduce-scatters the flat gradient and frees it before the next unit's
            reduce = last_reduce = 0
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", root)] + fs._kept(0) + [
                ("this layer's parameters (gathered)" if not fs.keep else f"layers 0..{i} parameters (gathered)",
                 fs.layer * (i + 1 if fs.keep else 1)),
                ("all-gather output (this layer)" if gather else "all-gather output (next layer, prefetched)", flat),
                ("gradient shards of the layers above", done * fs.layer_grad_shard + shards),
                ("reduce-scatter input (layer above)", reduce if done else last_reduce),
                ("all-reduce buffers (HSDP)", done * fs.held_reduce + ar)]

    def _whole_grads(self, held: int, root_grads: int) -> int:
        """``whole``: the unsharded gradients in the gathered dtype of ``held`` single-GPU gradient bytes, of which
        ``root_grads`` are the head's and the final norm's (the root's under the root wrap, the final norm's under
        separate-reshard, reduce-scattered by their unit under separate)."""
        ends = {"root": root_grads // self.width * self.gathered_width, "separate-reshard": self.norm_grads}
        return (held - root_grads) // self.width * self.gathered_width + ends.get(self.wrap, 0)

    @staticmethod
    def whole_gather(fs: FsdpOverlay) -> list[tuple[str, int]]:
        """``whole``, the forward's start: the root's all-gather copied out (FSDP2: its output still alive; FSDP1:
        gathered straight into the unsharded FlatParameter, the low-precision shard it sent not yet freed), and
        under a separate wrap the embedding's all-gather copied out before the root's output is freed."""
        if fs.flat:
            return [("root parameters (gathered)", fs.root), ("low-precision shard for the all-gather", fs.mp_shard)]
        return [("root parameters (gathered)", fs.root), ("all-gather output (root)", fs.root_flat),
                ("embedding parameters (gathered)", fs.embed),
                ("all-gather output (embedding's unit)", fs.embed + fs.tail)]

    @staticmethod
    def whole_copy_in(fs: FsdpOverlay, held: int, root_grads: int) -> list[tuple[str, int]]:
        """FSDP2 ``whole``: the root's post-backward, in the backward's final callback before the embedding's: the
        layers resharded, then its reduce-scatter input allocated beside every unsharded gradient (the head unit's
        input dropped first); the embedding's unit still gathered with its unsharded gradient. ``held``: the
        single-GPU gradients of the root's parameters, ``root_grads`` of them the head's and the final norm's."""
        return [("root gradients (unsharded)", fs._whole_grads(held, root_grads)),
                ("reduce-scatter input (root)", fs.root_reduce),
                ("embedding parameters (gathered)", fs.embed + fs.tail), ("embedding gradients (unsharded)", fs.embed),
                ("gradient shards of the layers above", fs.head_grad_shard)]

    @staticmethod
    def tail_copy_in(fs: FsdpOverlay, grads: int) -> list[tuple[str, int]]:
        """FSDP2 ``whole`` under the root wrap: the [norm, embedding, head] unit's post-backward after the root's:
        resharded, its reduce-scatter input and output (and the output's cast to the shard's dtype when they differ)
        beside its unsharded gradients (``grads`` bytes in the single-GPU width), as ``embedding_copy_in``."""
        shard = fs.tail_shard
        return [("embedding gradients (unsharded)", grads // fs.width * fs.gathered_width),
                ("gradient shards of the layers above", fs.layer_count * fs.layer_grad_shard),
                ("reduce-scatter input (embedding)", fs.tail),
                ("reduce-scatter output (embedding)", fs.gathered_width * shard),
                ("embedding gradient shard (cast)", fs.width * shard if fs.width != fs.gathered_width else 0)]

    @staticmethod
    def copy_in(fs: FsdpOverlay, i: int, held: int, root_grads: int) -> list[tuple[str, int]]:
        """Layer ``i``'s post-backward: its parameters resharded, its reduce-scatter input allocated and its
        unsharded gradients (the parameters' dtype, unpadded) not yet freed (``_fsdp_collectives.foreach_reduce``:
        the copy-in, then ``unsharded_grads.clear()``); the previous reduce-scatter's input was dropped before
        (``post_backward`` waits on ``reduce_scatter_state`` and clears it first)."""
        parts = [(n, 0 if n.startswith("reduce-scatter input") else x)
                 for n, x in FsdpMoments.backward(fs, i, held, root_grads)]
        if fs.frozen_layers:  # frozen: resharded once the input's gradient is made, the layer below prefetched
            return parts + [("next layer's parameters (prefetched)", fs.layer if i > 0 and fs.prefetch else 0)]
        if fs.flat:  # FSDP1: still gathered; the gradients copied into one padded flat gradient, reduced from it
            return parts + [("this layer's unsharded gradients", fs.unsharded_grads),
                            ("flat gradient (reduce-scatter input)", fs.layer)]
        layer = next(k for k, (n, _) in enumerate(parts) if n.endswith("parameters (gathered)") and "layer" in n)
        parts[layer] = (f"layers 0..{i - 1} parameters (gathered)", fs.layer * i if fs.keep else 0)
        return parts + [("this layer's unsharded gradients", fs.unsharded_grads),
                        ("reduce-scatter input (this layer)", fs.reduce_input)]

    @staticmethod
    def embedding_backward(fs: FsdpOverlay | None, done: int) -> list[tuple[str, int]]:
        """After layer 0's backward, under a wrap with the embedding's own unit: the embedding gathered (its
        prefetch copied out), its unsharded gradient and the layers' and the head's gradient shards, layer 0's
        reduce-scatter input; ``done``: the layers reduce-scattered. Empty under the root wrap (the root's
        embedding is gathered through the whole step, its gradient counted with the root's)."""
        if fs is None or fs.wrap == "root":
            return []
        if fs.whole:  # before the root's post-backward (done 0) every layer gathered with its gradients unsharded
            root, grads = (fs.root, fs._whole_grads(fs.layer_count * fs.layer_grads, 0)) if not done else (0, 0)
            return [("root parameters (gathered)", root), ("root gradients (unsharded)", grads),
                    ("embedding parameters (gathered)", fs.embed), ("embedding gradients (unsharded)", fs.embed),
                    ("gradient shards of the layers above", fs.head_grad_shard + done * fs.layer_grad_shard),
                    ("reduce-scatter input (layer above)", fs.head_reduce if not done else fs.root_reduce)]
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", fs.norm_grads
                                                          if fs.wrap == "separate-reshard" else 0),
                ("embedding parameters (gathered)", fs.embed),
                ("embedding gradients (unsharded)", 0 if fs.frozen_ends else fs.embed),
                ("gradient shards of the layers above", done * fs.layer_grad_shard + fs.head_grad_shard),
                ("reduce-scatter input (layer above)", fs.reduce_input),
                ("all-reduce buffers (HSDP)", done * fs.held_reduce + fs.head_held_reduce)]

    @staticmethod
    def tied_embedding_backward(fs: FsdpOverlay | None, held: int, root_grads: int, layers: int) -> list[tuple[str, int]]:
        """The embedding's backward under tied embeddings, before its gradient is added to the head's (``held``: the
        single-GPU gradients so far, ``root_grads`` of them the root's): one GPU's gradients; under FSDP the layers
        reduce-scattered (FSDP2: layer 0's reduce-scatter input alive until the next), the root gathered with its
        gradients unsharded; ``whole``: as in a layer's backward."""
        if fs is None:
            return [("parameter gradients so far", held)]
        if fs.whole:
            return FsdpMoments.backward(fs, 0, held, root_grads)
        return [("root parameters (gathered)", fs.root),
                ("root gradients (unsharded)", root_grads // fs.width * fs.gathered_width),
                ("gradient shards of the layers above", layers * fs.layer_grad_shard),
                ("reduce-scatter input (layer above)", 0 if fs.flat else fs.reduce_input)]

    @staticmethod
    def root_copy_in(fs: FsdpOverlay, layers: int) -> list[tuple[str, int]]:
        """FSDP1's root post-backward, after layer 0's: the root still gathered, its parameters' unsharded gradients
        copied into its padded flat gradient, every layer's gradient shard."""
        return [("root parameters (gathered)", fs.root), ("root gradients (unsharded)", fs.root_grads),
                ("root flat gradient (reduce-scatter input)", fs.root),
                ("gradient shards of the layers above", layers * fs.layer_grad_shard)]

    @staticmethod
    def embedding_copy_in(fs: FsdpOverlay, done: int) -> list[tuple[str, int]]:
        """The embedding's post-backward: resharded, its reduce-scatter input and output (and the output's cast to
        the shard's dtype when the reduce dtype differs) allocated while its unsharded gradient is still alive
        (layer 0's input dropped first; the last unit's gradient is freed after its reduce-scatter output is made,
        as traced), as ``copy_in``. Under a MixedPrecisionPolicy the trace has the root's final norm
        (separate-reshard) already reduced here: counted gathered, 3 bytes per element of it above the trace."""
        parts = [(n, 0 if n.startswith(("reduce-scatter input", "embedding parameters")) else x)
                 for n, x in FsdpMoments.embedding_backward(fs, done)]
        if fs.frozen_ends:  # no gradient: the post-backward reshards and reduces nothing
            return parts
        cast = fs.embed_reduce_out // fs.reduce_width * fs.width if fs.reduce_width != fs.width else 0
        return parts + [("reduce-scatter input (embedding)", fs.embed // fs.gathered_width * fs.reduce_width),
                        ("reduce-scatter output (embedding)", fs.embed_reduce_out),
                        ("embedding gradient shard (cast)", cast)]
