"""`python -m fp8lab bench quantize`: fp8lab's quantization beside torchao's MX and a plain copy."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from fp8lab.bench.table import print_table
from fp8lab.extras import available
from fp8lab.numerics.formats import E4M3, E8M0
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerBlock, PerTensor
from fp8lab.timing import time_interleaved

__all__ = ["bench_quantize"]


def bench_quantize(size: int = 4096, rounds: int = 20) -> list[dict]:
    """fp8lab's quantization of a size x size float32 tensor beside torchao's MX and a copy."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=g)
    dst = torch.empty_like(x)
    cands: dict[str, Callable[[], object]] = {
        "copy: x.clone() (allocates)": lambda: x.clone(),
        "copy: dst.copy_(x) (preallocated)": lambda: dst.copy_(x),
        "fp8lab per-tensor E4M3": lambda: quantize(x, E4M3, PerTensor()),
        "fp8lab 1x128 E4M3": lambda: quantize(x, E4M3, PerBlock(1, 128)),
        "fp8lab 128x128 E4M3": lambda: quantize(x, E4M3, PerBlock(128, 128)),
        "fp8lab 1x32 E4M3 + E8M0 (rceil)": lambda: quantize(x, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0),
    }
    if not available("torchao"):
        print('torchao is not installed: its column is missing (pip install "fp8lab[torchao]")')
    else:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        cands["torchao MXTensor.to_mx 1x32 (floor)"] = lambda: MXTensor.to_mx(x, torch.float8_e4m3fn, 32)
        cands["torchao MXTensor.to_mx 1x32 (rceil)"] = lambda: MXTensor.to_mx(
            x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    times = time_interleaved(cands, rounds=rounds)
    # the floor: read 4 bytes and write 1 per element, at the bandwidth a copy reaches (a copy
    # reads 4 and writes 4): into fresh memory (x.clone(), which page-faults every page it
    # writes) and into memory already mapped (dst.copy_(x)); quantize's outputs are fresh
    # tensors, which glibc serves from reused pages up to 32 MiB (settings.keep_freed_memory)
    floor = statistics.median(times["copy: x.clone() (allocates)"]) * 5 / 8
    floor_mapped = statistics.median(times["copy: dst.copy_(x) (preallocated)"]) * 5 / 8
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"what": name, "median ms": med * 1e3, "x floor": med / floor,
                     "x floor (mapped)": med / floor_mapped, "GB/s (4 B in)": size * size * 4 / med / 1e9})
    print_table(f"quantize {size}x{size} float32 (median of {rounds}, interleaved)", rows,
                f"floor = 5/8 of x.clone() = {floor * 1e3:.1f} ms; floor (mapped) = 5/8 of dst.copy_(x) = "
                f"{floor_mapped * 1e3:.1f} ms (read 4 B, write 1 B per element)")
    return rows
