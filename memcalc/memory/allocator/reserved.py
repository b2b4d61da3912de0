"""Reserved memory beyond the live bytes: blocks the caching allocator keeps but cannot hand to the step's peak.

``torch.cuda.max_memory_reserved`` counts every segment the allocator holds, used or not. Three mechanisms leave
cached blocks that the requests at a step's peak cannot use, each read from the allocator's rules
(c10/cuda/CUDACachingAllocator.cpp) and from the code that makes the requests:

1. **The loss's blocks.** A step's largest tensors are logit-sized (T·V elements). ``get_free_block`` takes only a
   cached block at least as large as the request, so the bf16 logits' block, freed once the loss is computed
   (transformers' ``Trainer`` keeps only the loss; torchtitan's train step ``del pred``), cannot serve the fp32
   gradients the loss's backward asks for next: that backward gets a fresh segment while the logits' block sits in
   the cache. ``loss_events`` writes the loss's allocations in the order the code makes them and ``loss_cached``
   replays them through ``memcalc.memory.allocator.caching``: the bytes cached but free at the loss's peak.
2. **Stream pools.** A cached block serves only requests on the stream it was allocated on (``BlockPool`` blocks
   are ordered by stream first; ``get_free_block`` searches the request's stream), and a freed block goes back to
   that stream's pool. FSDP2 allocates each all-gather output on its all-gather copy-in stream
   (``_fsdp_collectives.foreach_all_gather``) and each reduce-scatter output, the gradient shard that lives until
   ``zero_grad``, on its reduce-scatter stream (``foreach_reduce``; the reduce-scatter *input* is allocated on the
   default stream before the stream switch). Each pool holds the most its own tensors needed at once, for the whole
   run; the default stream's tensors cannot use it. So during the forward and the loss, when no gradient shard is
   alive (``zero_grad(set_to_none=True)``), a gradient-sized pool is reserved beside the step's live bytes.
3. **The forward's blocks.** The segments the default stream reserved before the loss (at least the most bytes alive
   there: under recomputation a checkpointed layer's forward transients, the gathered inputs and partial sums of
   sequence parallelism) are split into blocks no larger than the forward's tensors. Where the logits are larger
   than any of them, none serves the loss's requests: the loss takes fresh segments for its logit-sized blocks,
   and what the forward reserved stays beside them, its part not filled by what the loss's moment keeps alive
   cached and free (``reserved_peak``'s ``loss_blocks``; traced and replayed: tests/test_reserved.py).

All three leave wholly free segments, which ``release_cached_blocks`` gives back before a ``cudaMalloc`` fails: they
raise ``max_memory_reserved`` when the GPU has room, never the verdict.

Not modelled: a chunked loss's freed chunks; the first step's optimizer states, created lazily inside
``optimizer.step()`` into blocks the activations left, which can displace a later step's loss into one more segment
(``memcalc trace`` replays that per tensor, docs/timeline.md); fragmentation among the layers' own tensors.
"""

from __future__ import annotations

from functools import lru_cache

from memcalc.memory.allocator.caching import CachingAllocator

POOLS = (("all-gather copy-in stream", ("all-gather output (",)),
         ("reduce-scatter stream", ("gradient shards of the layers above", "gradients (shards)",
                                    "all-reduce buffers (HSDP)", "reduce-scatter output", "embedding gradient shard")))
"""FSDP2's side-stream pools and the timeline parts (``memcalc.memory.overlays.fsdp_overlay.FsdpOverlay``) allocated on
them (name prefixes): HSDP's all-reduce buffers are reduce-scatter outputs, allocated on that stream too
(``_fsdp_collectives.foreach_reduce``)."""


def loss_events(tokens: int, vocab: int, width: int, option: str = "standard", compiled: bool = False,
                parallel: bool = False) -> list[tuple[str, int]]:  # fmt: skip
    """The loss's allocations (``nbytes >= 0``) and frees (``-1``) in the order the code makes them, from the head's
    logits to the head's input gradient, for ``tokens`` × ``vocab`` logits of ``width`` bytes (the rank's vocabulary
    share under ``parallel``).

    standard (transformers ``ForCausalLMLoss``, torchtitan ``cross_entropy_loss``: ``cross_entropy(logits.float())``):
    logits, their fp32 copy, log-softmax's fp32 output (saved); the copy and the logits freed; backward: NLL's
    gradient, log-softmax's input gradient, the cast back to the logits' dtype. parallel (torch
    ``distributed/tensor/parallel/loss.py``): the same around ``_log_softmax``'s ``shifted`` (alive until its result
    is made) and ``exp(shifted)`` (summed and freed before), and its backward's ``zeros_like``, ``exp`` and their
    sum (``memcalc.memory.families.saved.parallel_loss``). compiled: inductor's fused kernels save the logits and write
    their gradient (``saved.loss_transient``); compiled under ``loss_parallel``, the forward's one-hot scatter and
    the fp32 sum it saves instead. chunked:N and fused are not replayed (no events): fused makes no
    logits; a chunked loss's blocks are a chunk's size each, and what its freed chunks leave is not counted."""
    n = tokens * vocab
    d, f = width * n, 4 * n
    if option != "standard":
        return []
    if compiled and parallel:  # the forward's scatter and its saved sum; the caller drops the logits before backward
        return [("logits", d), ("scatter", f), ("saved", f), ("scatter", -1), ("logits", -1), ("logits gradient", d),
                ("saved", -1)]
    if compiled:
        return [("logits", d), ("max, log-sum-exp", 8 * tokens), ("logits gradient", d), ("logits gradient", -1)]
    up = d != f  # logits.float() is a no-op on fp32 logits
    ev = [("logits", d)] + ([("fp32 copy", f)] if up else [])
    if parallel:
        ev += [("shifted", f), ("exp", f), ("exp", -1), ("log-softmax", f), ("shifted", -1)]
    else:
        ev += [("log-softmax", f)]
    ev += ([("fp32 copy", -1)] if up else []) + [("logits", -1)]
    if parallel:
        ev += [("zeros", f), ("exp x", f), ("input gradient", f), ("zeros", -1), ("exp x", -1)]
    else:
        ev += [("nll gradient", f), ("input gradient", f), ("nll gradient", -1)]
    ev += [("log-softmax", -1)] + ([("cast gradient", d), ("input gradient", -1)] if up else [])
    return ev


def loss_cached(tokens: int, vocab: int, width: int, option: str = "standard", compiled: bool = False,
                parallel: bool = False) -> int:  # fmt: skip
    """Bytes the loss leaves cached and free at its most-live event, replayed from an empty cache (logit-sized
    blocks are the step's largest: nothing else the step freed could serve them)."""
    return cached_at_peak(loss_events(tokens, vocab, width, option, compiled, parallel))


@lru_cache(maxsize=256)
def loss_blocks_at_peak(tokens: int, vocab: int, width: int, option: str = "standard", compiled: bool = False,
                parallel: bool = False) -> tuple[int, int]:  # fmt: skip
    """``blocks_at_peak`` of ``loss_events``: the loss's allocated bytes at its most-live event and the bytes then
    cached but free, the same for every plan with these logits."""
    return blocks_at_peak(loss_events(tokens, vocab, width, option, compiled, parallel))


def cached_at_peak(events) -> int:
    """Replay ``(key, nbytes)`` events (``-1`` frees) through a fresh ``CachingAllocator``: reserved − allocated at
    the first event with the most allocated bytes."""
    return blocks_at_peak(events)[1]


def blocks_at_peak(events) -> tuple[int, int]:
    """Replay ``(key, nbytes)`` events (``-1`` frees) through a fresh ``CachingAllocator``: the allocated bytes at
    the first event with the most of them, and the bytes then cached but free."""
    a = CachingAllocator()
    cached = live = 0
    for key, nbytes in events:
        if nbytes < 0:
            a.free(key)
            continue
        a.malloc(key, nbytes)
        if a.allocated > live:
            live, cached = a.allocated, a.reserved - a.allocated
    return live, cached


_POOL_OF: dict[str, int] = {}


def _pool_of(name: str) -> int:
    """The index in ``POOLS`` of the pool a part is allocated on; -1: the default stream's."""
    i = _POOL_OF.get(name)
    if i is None:
        i = _POOL_OF[name] = next((k for k, (_, prefixes) in enumerate(POOLS) if name.startswith(prefixes)), -1)
    return i


def reserved_peak(moments, loss_moment: int = -1, loss_cache: int = 0, streams: bool = False,
                  loss_blocks: int = 0, fresh_from: int = -1) -> tuple[int, list[int], int]:  # fmt: skip
    """The reserved peak of a timeline (``memcalc.memory.engine.timeline.Moment``s), less the allocator's least gap; the
    side-stream pools' bytes in it; the forward's bytes cached at the loss's peak where the loss's moment is the
    default stream's reserved peak (else -1: ``loss_cache`` is not in it either).

    The default stream reserves at least its own live bytes at every moment, and from the loss's peak
    (``loss_moment``) on at least that moment's bytes plus ``loss_cache`` (segments are kept: reserved never falls).
    ``loss_blocks``: the loss's own blocks alive at that moment where no block the forward freed can serve them
    (``memcalc.memory.engine.timeline``: each larger than any tensor before the loss); the segments the default stream
    reserved before the loss's first request (its most live bytes there) then stay beside them, the part of them
    that the rest of the loss's moment does not fill cached and free. ``fresh_from``: the first moment that holds one
    of those blocks (-1: the first with logits). With ``streams`` (FSDP2), each side-stream
    pool reserves the most its parts are ever alive at once, for the whole step, and its parts are not the default
    stream's."""
    pools = [0] * len(POOLS)
    default = at_loss = before = forward_cached = 0
    side = [0] * len(POOLS)
    started = False  # the loss's first request (the logits) made
    for i, m in enumerate(moments):
        own = m.live_bytes
        if streams:
            for k in range(len(side)):
                side[k] = 0
            for name, b in m.parts:
                k = _POOL_OF.get(name)
                if k is None:
                    k = _pool_of(name)
                if k >= 0:
                    side[k] += b
            for k, x in enumerate(side):
                pools[k] = max(pools[k], x)
            own -= sum(side)
        if not started and i < loss_moment:
            started = i >= fresh_from if fresh_from >= 0 else any(name == "logits" and b for name, b in m.parts)
            if not started:
                before = max(before, own)
        if i == loss_moment:
            forward_cached = max(0, before - (own - loss_blocks)) if loss_blocks else 0
            at_loss = own + loss_cache + forward_cached
        default = max(default, own)
    return max(default, at_loss) + sum(pools), pools, forward_cached if at_loss > default else -1


__all__ = ["POOLS", "blocks_at_peak", "cached_at_peak", "loss_blocks_at_peak", "loss_cached", "loss_events",
           "reserved_peak"]
