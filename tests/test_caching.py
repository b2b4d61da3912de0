"""The caching allocator replay (``memcalc.memory.allocator.caching``) against the rules of torch's
``c10/cuda/CUDACachingAllocator.cpp``: segment sizes, best fit, splitting, merging, release and retry."""

import pytest

from memcalc.errors import InputError
from memcalc.memory.allocator.caching import CachingAllocator, replay

MiB = 1 << 20


def test_small_requests_share_a_two_mib_segment():
    a = CachingAllocator()
    a.malloc("x", 1000)  # rounded to 1024 B, from a 2 MiB small segment
    a.malloc("y", 512 * 1024)
    assert a.reserved == 2 * MiB and a.mallocs == 1
    assert a.allocated == 1024 + 512 * 1024


def test_mid_requests_get_twenty_mib_and_large_ones_their_own_rounded_segment():
    a = CachingAllocator()
    a.malloc("mid", 5 * MiB)
    assert a.reserved == 20 * MiB
    a.malloc("mid2", 14 * MiB)  # the 15 MiB left in the 20 MiB segment serves it: no new segment
    assert a.mallocs == 1
    a.malloc("large", 11 * MiB + 1)  # 10 MiB and up: its own segment, rounded to 2 MiB -> 12 MiB
    assert a.reserved == 32 * MiB and a.mallocs == 2


def test_a_large_block_is_split_only_when_more_than_one_mib_would_remain():
    a = CachingAllocator()
    a.malloc("x", 11 * MiB)  # 12 MiB segment: 1 MiB would remain -> handed out whole
    assert a.allocated == 12 * MiB
    a.malloc("y", 2 * MiB)  # nothing cached: a new segment (the 1 MiB was not split off)
    assert a.mallocs == 2


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    a = replay([("a", 40 * MiB), ("b", 20 * MiB), ("a", -1), ("b", -1), ("c", 18 * MiB)])
    assert a.mallocs == 2 and a.reserved == 60 * MiB
    assert a.segments[a._live["c"].segment] == 20 * MiB


def test_freed_neighbours_merge_and_serve_a_request_as_large_as_the_segment():
    a = CachingAllocator()
    a.malloc("big", 100 * MiB)
    a.free("big")
    a.malloc("p", 30 * MiB)
    a.malloc("q", 30 * MiB)
    a.free("p")
    a.free("q")
    a.malloc("big2", 100 * MiB)
    assert a.mallocs == 1 and a.peak_reserved == 100 * MiB


def test_a_partly_used_segment_cannot_serve_a_request_its_free_part_could_in_total():
    events = [("logits", 100 * MiB), ("logits", -1), ("act", 60 * MiB), ("logits2", 100 * MiB)]
    a = replay(events)
    assert a.peak_reserved == 200 * MiB and a.peak_allocated == 160 * MiB
    # on a 180 MiB device the cache cannot be released (the segment holds "act"): out of memory with 20 MiB left
    a = replay(events, capacity=180 * MiB)
    assert a.oom is not None and (a.oom.request, a.oom.free) == (100 * MiB, 80 * MiB)


def test_release_and_retry_frees_wholly_cached_segments():
    events = [("a", 100 * MiB), ("a", -1), ("b", 150 * MiB)]
    assert replay(events).peak_reserved == 250 * MiB
    a = replay(events, capacity=200 * MiB)
    assert a.oom is None and a.reserved == 150 * MiB and a.peak_reserved == 150 * MiB


def test_bad_use_is_refused():
    with pytest.raises(InputError):
        CachingAllocator(capacity=0)
    a = CachingAllocator()
    a.malloc("x", 10)
    with pytest.raises(InputError):
        a.malloc("x", 10)
