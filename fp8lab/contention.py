"""Torch's threads fitted to the CPUs other programs leave free, while a notebook runs.

Public: PERIOD, Sample, sample(cpus, root), others_cpus(before, after), threads_for(free, ceiling),
Follower, follow(), fit(), following(), line().
On a shared machine (a hub's node, a laptop with a video call) a two-thread GEMM whose partner core runs
another program waits at every barrier for the thread the scheduler has parked: one thread then does the
same work sooner (docs/performance.md measures it). setup() turns following on in a notebook's kernel:
before each cell (IPython's pre_run_cell event) and every PERIOD seconds inside fp8lab's training loops,
fit() measures the CPU time other programs took since its last look (the /proc/stat lines of the CPUs in
the affinity mask, less this process's own CPU time) and sets torch's threads to the CPUs left free,
rounded, between 1 and the thread policy's count (fp8lab.threads). A user's choice wins: where the user
set the threads (OMP_NUM_THREADS, torch.set_num_threads before fp8lab or at any time after), nothing is
changed. The numbers do not move with the thread count (MKL_CBWR: fp8lab.settings).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fp8lab import threads

__all__ = ["PERIOD", "Follower", "Sample", "fit", "follow", "following", "line", "others_cpus", "sample",
           "threads_for"]

PERIOD = 0.5  # seconds between two looks inside a training loop
SHORTEST = 0.2  # a window shorter than this says too little (a tick is 10 ms): wait for a longer one
OURS = ("torch's default", "set by fp8lab", "OMP_NUM_THREADS from the process that started this one")


@dataclass(frozen=True)
class Sample:
    """One look at the CPUs: wall: time.monotonic(); busy: CPU seconds the affinity mask's CPUs spent busy
    (every program, steal included); own: this process's CPU seconds (all its threads)."""

    wall: float
    busy: float
    own: float


def sample(cpus: set[int], root: str | os.PathLike = "/") -> Sample | None:
    """The CPUs' busy seconds from /proc/stat's per-CPU lines (user nice system idle iowait irq softirq
    steal: all but idle and iowait) and this process's CPU time; None where /proc/stat cannot be read."""
    try:
        text = (Path(root) / "proc/stat").read_text()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    for row in text.splitlines():
        name, _, rest = row.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        fields = [int(x) for x in rest.split()[:8]]
        busy += sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)
    return Sample(time.monotonic(), busy / ticks, time.process_time())


def others_cpus(before: Sample, after: Sample) -> float:
    """CPUs other programs used between two looks: (busy seconds - this process's) / wall seconds, >= 0."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def threads_for(free: float, ceiling: int) -> int:
    """Threads for `free` CPUs: rounded half up, at least 1, at most `ceiling` (the thread policy's)."""
    return max(1, min(ceiling, math.floor(free + 0.5)))


class Follower:
    """Fits torch's threads to the CPUs left free; look() is fit()'s work (from the main thread only).

    cpus: the CPUs of the affinity mask; ceiling: the thread policy's count (also the free CPUs' cap,
    with a CPU quota); look: the sampler (a test plants its own); set_threads / get_threads: torch's."""

    def __init__(self, cpus: set[int], ceiling: int, look: Callable[[], Sample | None],
                 set_threads: Callable[[int], None], get_threads: Callable[[], int]) -> None:
        self.cpus, self.ceiling, self._look = cpus, ceiling, look
        self._set, self._get = set_threads, get_threads
        self.last = look()
        self.current = get_threads()
        self.others = 0.0
        self.changes = 0
        self.stopped = "" if self.last is not None else "/proc/stat cannot be read"

    def look(self, force: bool = False) -> int:
        """Measure since the last look (at least SHORTEST seconds ago; PERIOD unless forced) and set the
        threads; returns the count in force."""
        if self.stopped:
            return self._get()
        if threading.current_thread() is not threading.main_thread():
            return self.current
        now = time.monotonic()
        if self.last is None or now - self.last.wall < (SHORTEST if force else PERIOD):
            return self.current
        if self._get() != self.current:  # the user called torch.set_num_threads: theirs wins from now on
            self.stopped = f"torch.set_num_threads({self._get()}) was called after setup(): yours stands"
            return self._get()
        after = self._look()
        if after is None:
            self.stopped = "/proc/stat cannot be read"
            return self.current
        self.others = others_cpus(self.last, after)
        self.last = after
        wanted = threads_for(min(self.ceiling, len(self.cpus) - self.others), self.ceiling)
        if wanted != self.current:
            self._set(wanted)
            self.current = wanted
            self.changes += 1
        return self.current


_FOLLOWER: list[Follower] = []
_WHY_NOT: list[str] = []


def follow(root: str | os.PathLike = "/") -> Follower | None:
    """Start following (once per process; setup() calls it): the Follower, or None where the user chose
    the threads, where there is one CPU, or where /proc/stat cannot be read (line() says which)."""
    if _FOLLOWER:
        return _FOLLOWER[0]
    chosen = threads.decision()
    _WHY_NOT.clear()
    if not chosen.threads_by.startswith(OURS):
        _WHY_NOT.append(f"the threads are {chosen.threads_by.split(' (')[0]}")
    elif chosen.threads < 2:
        _WHY_NOT.append("one thread: nothing to fit")
    if _WHY_NOT:
        return None
    import torch

    cpus = threads.affinity_cpus()
    follower = Follower(cpus, chosen.threads, lambda: sample(cpus, root), torch.set_num_threads,
                        torch.get_num_threads)
    if follower.stopped:
        _WHY_NOT.append(follower.stopped)
        return None
    _FOLLOWER.append(follower)
    _before_each_cell()
    return follower


def _before_cell(*_info) -> None:
    fit(force=True)


def _before_each_cell() -> None:
    """In an IPython kernel, fit before each cell runs (pre_run_cell), registered once."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and _before_cell not in shell.events.callbacks.get("pre_run_cell", []):
        shell.events.register("pre_run_cell", _before_cell)


def fit(force: bool = False) -> int | None:
    """Fit the threads now if following and PERIOD has passed (force: SHORTEST); the count, or None."""
    return _FOLLOWER[0].look(force) if _FOLLOWER else None


def following() -> Follower | None:
    return _FOLLOWER[0] if _FOLLOWER else None


def line() -> str:
    """What following does, for the status line: "" before setup()."""
    if _FOLLOWER:
        f = _FOLLOWER[0]
        if f.stopped:
            return f"threads no longer follow the load: {f.stopped}"
        return (f"threads follow the load (fewer while other programs hold the CPUs; now {f.current}, "
                f"checked before each cell and every {PERIOD} s of training)")
    return f"threads do not follow the load: {_WHY_NOT[0]}" if _WHY_NOT else ""
