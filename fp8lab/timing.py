"""Wall-clock timing helpers shared by the benchmarks, the GEMM probe and the timing panel.

Public: timed(fn, repeats, warmup) -> list of seconds per call; time_interleaved(cands, ...);
print_table(title, rows, note) for the benchmarks' tables; cpu_name() and machine_line(), the
machine a measurement was taken on (date, CPU, threads, GPU, torch, the CPU kernels); reference_speed(),
how fast this process multiplies matrices (an fp32 2048^3 matmul), so that a table says how slow its
machine was.
Speed is measured by benchmarks (`python -m fp8lab bench`), never asserted by tests.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["REFERENCE_SIZE", "cpu_name", "machine_line", "print_table", "reference_speed", "time_interleaved",
           "timed"]

REFERENCE_SIZE = 2048


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
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return ", ".join([datetime.date.today().isoformat(), cpu_name(), f"{torch.get_num_threads()} threads", gpu,
                      f"torch {torch.__version__}", *extra])


def reference_speed(size: int = REFERENCE_SIZE, repeats: int = 3, bf16_budget_s: float = 1.0) -> str:
    """This process's matmul speed, measured now: "fp32 2048^3 mm 45.2 ms (2 threads), 88.1 ms (1 thread);
    bf16 7.1 ms". The median of `repeats` calls after one warm-up, with torch's threads as they are, and with
    one thread where that differs (a panel redraws with one). bf16 is timed where a call is cheap: a CPU without
    bf16 matrix units takes a minute at 2048^3, so a 256^3 call is timed first and bf16 is left out when that
    call, scaled to size^3, would take over `bf16_budget_s` seconds."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, dtype=torch.float32, device="cpu") for _ in range(2))
    threads = torch.get_num_threads()
    ms = statistics.median(timed(lambda: a @ b, repeats, 1)) * 1e3
    parts = [f"fp32 {size}^3 mm {ms:.1f} ms ({threads} thread{'s' if threads > 1 else ''})"]
    if threads > 1:
        torch.set_num_threads(1)
        try:
            parts.append(f"{statistics.median(timed(lambda: a @ b, repeats, 1)) * 1e3:.1f} ms (1 thread)")
        finally:
            torch.set_num_threads(threads)
    small = 256
    sa, sb = a[:small, :small].bfloat16(), b[:small, :small].bfloat16()
    estimate = min(timed(lambda: sa @ sb, 3, 1)) * (size / small) ** 3
    if estimate > bf16_budget_s:
        bf16 = f"bf16 not timed (a {small}^3 call scaled to {size}^3: {estimate:.0f} s)"
    else:
        ab, bb = a.bfloat16(), b.bfloat16()
        bf16 = f"bf16 {statistics.median(timed(lambda: ab @ bb, repeats, 1)) * 1e3:.1f} ms"
    return ", ".join(parts) + "; " + bf16
