"""The benchmarks' tables: markdown with the machine a measurement ran on under the title."""

from __future__ import annotations

from fp8lab.numerics import kernels
from fp8lab.timing import machine_line
from fp8lab.timing import print_table as timing_table

__all__ = ["print_table"]


def print_table(title: str, rows: list[dict], note: str = "") -> None:
    """timing.print_table with the machine line under the title (date, CPU, GPU, torch, kernels)."""
    timing_table(title, rows, "\n".join(filter(None, (machine_line(kernels.state_label()), note))))
