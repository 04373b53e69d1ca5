"""The benchmarks' tables: markdown with the machine a measurement ran on under the title.

The machine line names the date, the CPU, torch's threads, the GPU, torch, fp8lab's CPU kernels, the CPU quota
the process runs in (`bench NAME --quota`: fp8lab.bench.quota), and the reference speed measured in the same
process just after the benchmark (timing.reference_speed: an fp32 2048^3 matmul), so a reader knows how fast
the machine was.
"""

from __future__ import annotations

from fp8lab.bench.quota import quota_label
from fp8lab.numerics import kernels
from fp8lab.timing import machine_line, reference_speed
from fp8lab.timing import print_table as timing_table

__all__ = ["bench_machine_line", "print_table"]


def bench_machine_line(reference: bool = True) -> str:
    """timing.machine_line with the kernels' state, the CPU quota (if any) and (reference=True) the reference
    speed, measured now."""
    extra = [kernels.state_label(), quota_label()]
    if reference:
        extra.append(f"reference: {reference_speed()}")
    return machine_line(*filter(None, extra))


def print_table(title: str, rows: list[dict], note: str = "", reference: bool = True) -> None:
    """timing.print_table with the machine line under the title (date, CPU, GPU, torch, kernels, quota, and the
    reference speed unless reference=False)."""
    timing_table(title, rows, "\n".join(filter(None, (bench_machine_line(reference), note))))
