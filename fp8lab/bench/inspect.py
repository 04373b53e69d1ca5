"""`python -m fp8lab bench inspect`: what fp8lab.inspect costs beside the model's own training step."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from fp8lab.bench.table import print_table
from fp8lab.training.readiness import inspect

__all__ = ["bench_inspect"]


def bench_inspect(size: int | None = None, rounds: int | None = None) -> list[dict]:
    """Seconds for inspect() on models of 100+ linears (`python -m fp8lab bench inspect`).

    The models: 25 blocks of 4 linears (q/k/v-style fused in, out, MLP up and down) of width
    `size` (default 64 and 128), 64 tokens, the five DEFAULT_RECIPES; median of `rounds`."""
    widths = (size,) if size else (64, 128)
    rounds = rounds or 5
    rows = []
    for d in widths:
        blocks = [nn.Sequential(nn.Linear(d, 3 * d), nn.Linear(3 * d, d), nn.Linear(d, 4 * d), nn.GELU(),
                                nn.Linear(4 * d, d)) for _ in range(25)]
        model = nn.Sequential(*blocks)
        x = torch.randn(64, d, generator=torch.Generator().manual_seed(0))
        times = []
        report = inspect(model, x)  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            report = inspect(model, x)
            times.append(time.perf_counter() - t0)
        rows.append({"model": f"{len(report.layers)} linears, width {d}", "tokens": 64,
                     "recipes": len(report.recipes), "rows": len(report.frame),
                     "median s": statistics.median(times), "max s": max(times)})
    print_table(f"fp8lab.inspect on 100-linear models (median of {rounds})", rows)
    return rows
