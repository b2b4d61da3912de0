"""Spawned CPU ranks that fail fast and say where they stopped.

``run_ranks`` starts ``world`` processes (the ``spawn`` context) and waits for them. A rank that raises writes
``rank{r}.error`` into the run's folder and leaves without the closing barrier; the parent then stops every rank at
once and raises with that traceback, instead of the others waiting in their next collective until the process
group's timeout. A rank that dies without a word (a signal, a native abort: a non-zero exit code, where the ranks
leave with ``os._exit(0)``) stops the run the same way, and the error names its exit code. A rank still running at the deadline has written its threads' stacks (``arm_watchdog``:
``faulthandler.dump_traceback_later``) into ``rank{r}.stack``, and the parent's error carries them, so a hang names
the line it hung on.
"""

from __future__ import annotations

import faulthandler
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

POLL_S = 0.05
GRACE_S = 2.0
"""After a rank reports an error, how long the others get to leave by themselves before they are killed."""


WATCHDOG_MARGIN = (0.95, 1.0)
"""The stacks are written at 95 % of ``timeout`` less 1 s after the rank starts: the parent's deadline runs from
before the spawn, so the margin (12 s at DeepSpeed's 240 s) covers the rank's start-up (importing torch) and leaves
the dump on disk before the parent kills the rank."""


def arm_watchdog(out_dir: str, rank: int, timeout: float) -> None:
    """In a rank: write every thread's stack to ``rank{rank}.stack`` shortly before the parent's deadline."""
    f = open(Path(out_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115 - kept open for the rank's whole life
    share, seconds = WATCHDOG_MARGIN
    faulthandler.dump_traceback_later(max(1.0, share * timeout - seconds), file=f)


def run_ranks(target: Callable[..., None], args: Sequence[Sequence[Any]], out_dir: str, timeout: float,
              name: str) -> None:  # fmt: skip
    """Run ``target(*args[r])`` in ``len(args)`` spawned processes; raise ``RuntimeError`` naming ``name`` if a
    rank reports an error (``rank{r}.error`` in ``out_dir``) or the ranks outlive ``timeout`` seconds."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=tuple(a), daemon=True) for a in args]
    out = Path(out_dir)
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if now >= deadline or (failed_at is not None and now - failed_at >= GRACE_S):
                break
            if failed_at is None and (any(out.glob("*.error")) or any(p.exitcode for p in procs)):
                failed_at = now
            time.sleep(POLL_S)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        died = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode}  # before the survivors are killed
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    errors = sorted(out.glob("*.error"))
    if errors:
        raise RuntimeError(f"{name}: {errors[0].stem}: {errors[0].read_text()}")
    if died:
        raise RuntimeError(f"{name}: rank(s) {sorted(died)} died without reporting an error (exit codes "
                           f"{list(died.values())})")
    if hung:
        stacks = "".join(f"\n--- rank {r} ---\n{_tail(out / f'rank{r}.stack')}" for r in hung)
        raise RuntimeError(f"{name}: ranks {hung} still running after {timeout} s; their stacks:{stacks}")


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text() if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or "(none written)"
