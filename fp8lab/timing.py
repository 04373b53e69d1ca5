"""Wall-clock timing helpers shared by the benchmarks, the GEMM probe and the timing panel.

Public: timed(fn, repeats, warmup) -> list of seconds per call; time_interleaved(cands, ...);
print_table(title, rows, note) for the benchmarks' tables; cpu_name() and machine_line(), the
machine a measurement was taken on (date, CPU, threads, GPU, torch, the CPU kernels).
Speed is measured by benchmarks (`python -m fp8lab bench`), never asserted by tests.
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable

__all__ = ["cpu_name", "machine_line", "print_table", "time_interleaved", "timed"]


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


def print_table(title: str, rows: list[dict], note: str = "") -> None:
    """A markdown table of `rows` (dicts with the same keys) under a title and an optional note."""
    print(f"\n{title}")
    if note:
        print(note)
    if not rows:
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))  # every key, in first-seen order
    widths = {c: max(len(c), *(len(_fmt(r.get(c, "-"))) for r in rows)) for c in cols}
    print("| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        print("| " + " | ".join(_fmt(r.get(c, "-")).ljust(widths[c]) for c in cols) + " |")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line(*extra: str) -> str:
    """Where a measurement was taken: date, CPU, torch's threads, GPU, torch version, then `extra`
    (the callers add whether fp8lab's CPU kernels were on: fp8lab.numerics.kernels.state_label())."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return ", ".join([datetime.date.today().isoformat(), cpu_name(), f"{torch.get_num_threads()} threads", gpu,
                      f"torch {torch.__version__}", *extra])
