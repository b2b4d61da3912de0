"""Spawned ranks (memcalc.validation.ranks): a rank's error comes back at once with its traceback, while the other
rank would still be waiting; so does a rank that dies without a word; a hang comes back at the deadline with the line
each rank hung on."""

import time
from pathlib import Path

import pytest

from memcalc.validation.ranks import arm_watchdog, run_ranks


def _fails_or_waits(rank: int, out_dir: str, timeout: float) -> None:
    import os
    import traceback

    arm_watchdog(out_dir, rank, timeout)
    if rank == 1:
        try:
            raise ValueError("rank one's bad shape")
        except ValueError:
            Path(out_dir, f"rank{rank}.error").write_text(traceback.format_exc())
            os._exit(0)
    time.sleep(timeout)  # as a rank waiting for its peer in a collective
    os._exit(0)


def _dies_or_waits(rank: int, out_dir: str, timeout: float) -> None:
    import os

    arm_watchdog(out_dir, rank, timeout)
    if rank == 1:
        os._exit(3)  # as a native abort leaves: no traceback, no error file
    time.sleep(timeout)
    os._exit(0)


def _waits_forever(rank: int, out_dir: str, timeout: float) -> None:
    arm_watchdog(out_dir, rank, timeout)
    while True:
        time.sleep(0.1)


def _writes(rank: int, out_dir: str, timeout: float) -> None:
    import os

    arm_watchdog(out_dir, rank, timeout)
    Path(out_dir, f"rank{rank}.json").write_text(str(rank * 10))
    os._exit(0)


def test_an_error_stops_every_rank_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        run_ranks(_fails_or_waits, [(r, str(tmp_path), 60.0) for r in range(2)], str(tmp_path), 60.0, "two ranks")
    assert time.monotonic() - start < 30  # rank 0 alone would have slept 60 s
    assert str(e.value).startswith("two ranks: rank1: Traceback")
    assert "ValueError: rank one's bad shape" in str(e.value)


def test_a_silent_death_stops_every_rank_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        run_ranks(_dies_or_waits, [(r, str(tmp_path), 60.0) for r in range(2)], str(tmp_path), 60.0, "two ranks")
    assert time.monotonic() - start < 30
    assert str(e.value) == "two ranks: rank(s) [1] died without reporting an error (exit codes [3])"


def test_a_hang_says_where(tmp_path):
    with pytest.raises(RuntimeError) as e:
        run_ranks(_waits_forever, [(r, str(tmp_path), 4.0) for r in range(2)], str(tmp_path), 4.0, "hung")
    text = str(e.value)
    assert text.startswith("hung: ranks [0, 1] still running after 4.0 s; their stacks:")
    assert text.count("in _waits_forever") == 2  # faulthandler's line for each rank's frame


def test_results_come_back(tmp_path):
    run_ranks(_writes, [(r, str(tmp_path), 60.0) for r in range(3)], str(tmp_path), 60.0, "three")
    assert [Path(tmp_path, f"rank{r}.json").read_text() for r in range(3)] == ["0", "10", "20"]
