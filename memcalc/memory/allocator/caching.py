"""The CUDA caching allocator, replayed: reserved memory from a sequence of allocations and frees.

A plain simulation of torch ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``) with its default
settings (no ``max_split_size_mb``, no ``expandable_segments``, no garbage-collection threshold, one stream):

- ``malloc``: the request is rounded up to 512 B (``round_size``); requests up to 1 MiB come from the small pool,
  larger ones from the large pool (``get_pool``). ``get_free_block`` takes the smallest cached free block of the
  pool that is at least the request (``BlockComparatorSize``: size, then address). With none, ``alloc_block``
  ``cudaMalloc``s a segment of ``get_allocation_size`` bytes (2 MiB for small requests, 20 MiB below 10 MiB, else
  the request rounded to 2 MiB). If that would pass the device's capacity, ``release_cached_blocks`` frees every
  cached segment that is wholly free and the ``cudaMalloc`` is retried; failing again is an out-of-memory error.
- ``should_split``: the block handed out is cut to the request when the rest is at least 512 B (small pool) or more
  than 1 MiB (large pool); the rest stays a free block of the same segment.
- ``free_block``: a freed block merges with its free neighbours in the segment (``try_merge_blocks``) and goes back
  to its pool, still reserved.

``reserved`` is the sum of the segments; its peak is ``torch.cuda.max_memory_reserved``. ``allocated`` counts whole
blocks (``allocated_bytes``), so a request served by a block it did not split counts the block.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from memcalc.errors import InputError
from memcalc.memory.allocator.allocator import MIN_BLOCK, SMALL_SIZE, round_request, segment_size


class OutOfMemory(Exception):
    """A ``cudaMalloc`` that fails after the cache was released: ``torch.OutOfMemoryError`` on a GPU."""

    def __init__(self, request: int, free: int) -> None:
        super().__init__(f"a {request} B segment with {free} B left outside the reserved segments")
        self.request, self.free = request, free


class _Block:
    __slots__ = ("size", "addr", "segment", "prev", "next", "free", "small")

    def __init__(self, size: int, addr: int, segment: int, small: bool) -> None:
        self.size, self.addr, self.segment, self.small = size, addr, segment, small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.free = False


class CachingAllocator:
    """One device's caching allocator; ``malloc(key, nbytes)`` and ``free(key)`` replay a step's tensors."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity <= 0:
            raise InputError(f"capacity {capacity} must be positive")
        self.capacity = capacity
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.segments: dict[int, int] = {}  # segment id -> bytes
        self._pools: dict[bool, list[tuple[int, int, _Block]]] = {True: [], False: []}  # sorted (size, addr, block)
        self._live: dict[object, _Block] = {}
        self._next_addr = 0
        self.mallocs = 0
        self.oom: OutOfMemory | None = None
        """Set by ``replay`` when a request could not be served (the replay stops there)."""

    # --- pools ------------------------------------------------------------------------------------------------
    def _insert(self, b: _Block) -> None:
        b.free = True
        bisect.insort(self._pools[b.small], (b.size, b.addr, b), key=lambda t: (t[0], t[1]))

    def _remove(self, b: _Block) -> None:
        pool = self._pools[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr), key=lambda t: (t[0], t[1]))
        assert pool[i][2] is b
        del pool[i]
        b.free = False

    def _new_segment(self, nbytes: int, small: bool) -> _Block:
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self.release_cached()
            if self.reserved + nbytes > self.capacity:
                raise OutOfMemory(nbytes, self.capacity - self.reserved)
        seg = self._next_addr
        self._next_addr += nbytes
        self.segments[seg] = nbytes
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.mallocs += 1
        return _Block(nbytes, seg, seg, small)

    def release_cached(self) -> None:
        """``release_cached_blocks``: give back every segment that is one free block."""
        for small in (True, False):
            keep = []
            for entry in self._pools[small]:
                b = entry[2]
                if b.prev is None and b.next is None:
                    self.reserved -= self.segments.pop(b.segment)
                else:
                    keep.append(entry)
            self._pools[small] = keep

    # --- public -----------------------------------------------------------------------------------------------
    def malloc(self, key: object, nbytes: int) -> None:
        if key in self._live:
            raise InputError(f"allocation {key!r} is already live")
        size = round_request(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1), key=lambda t: (t[0], t[1]))
        if i < len(pool):
            b = pool.pop(i)[2]
            b.free = False
        else:
            b = self._new_segment(segment_size(size), small)
        rest = b.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = _Block(rest, b.addr + size, b.segment, small)
            tail.prev, tail.next = b, b.next
            if b.next is not None:
                b.next.prev = tail
            b.next, b.size = tail, size
            self._insert(tail)
        self._live[key] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        b = self._live.pop(key)
        self.allocated -= b.size
        for other in (b.prev, b.next):  # try_merge_blocks
            if other is not None and other.free:
                self._remove(other)
                if other is b.prev:
                    b.addr, b.prev = other.addr, other.prev
                    if other.prev is not None:
                        other.prev.next = b
                else:
                    b.next = other.next
                    if other.next is not None:
                        other.next.prev = b
                b.size += other.size
        self._insert(b)


def replay(events: Iterable[tuple[object, int]], capacity: int | None = None) -> CachingAllocator:
    """Replay ``(key, nbytes)`` events (``nbytes >= 0`` allocates, ``-1`` frees ``key``) through a fresh allocator.

    With ``capacity`` (the bytes the allocator may reserve: the GPU's memory less the CUDA context), a request that
    cannot be served even after the cache is released stops the replay and is kept in ``oom``."""
    a = CachingAllocator(capacity)
    try:
        for key, n in events:
            if n < 0:
                a.free(key)
            else:
                a.malloc(key, n)
    except OutOfMemory as e:
        a.oom = e
    return a
