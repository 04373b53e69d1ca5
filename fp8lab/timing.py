"""Wall-clock timing helpers shared by the benchmarks, the GEMM probe and the timing panel.

Public: timed(fn, repeats, warmup) -> list of seconds per call; time_interleaved(cands, ...).
Speed is measured by benchmarks (`python -m fp8lab bench`), never asserted by tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["time_interleaved", "timed"]


def timed(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> list[float]:
    """Seconds per call of fn, `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def time_interleaved(
    cands: dict[str, Callable[[], object]], rounds: int = 15, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each candidate: `rounds` rounds, each calling every candidate once,
    so that a noisy machine slows all of them alike."""
    for fn in cands.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(rounds):
        for name, fn in cands.items():
            times[name].extend(timed(fn, 1, 0))
    return times
