"""`python -m fp8lab bench gemm`: fp8lab.matmul (quantization included) and the emulated GEMM against
torch's fp32 matmul.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from fp8lab.bench.table import print_table
from fp8lab.gemm import emulated_mm, matmul, quantize_operands
from fp8lab.timing import time_interleaved, timed

__all__ = ["QUANTIZE_INCLUDED", "bench_gemm"]


QUANTIZE_INCLUDED = ("tensorwise", "blockwise", "mxfp8")  # bench_gemm's rows with the quantization timed too


def bench_gemm(size: int = 2048, rounds: int = 7, recipes: tuple[str, ...] = ("tensorwise", "rowwise", "blockwise",
                                                                             "mxfp8", "nvfp4")) -> list[dict]:
    """fp32 and bf16 torch.mm beside fp8lab's emulated GEMM at size^3, and one shape not tuned for.

    Rows: the fast emulation and the reference on operands quantized beforehand; and the call a
    learner makes, fp8lab.matmul(a[M, K], b, recipe) with its quantization, for b given naturally
    (b[K, N], row-major) and as a transposed view of w[N, K] (b = w.t()), for the recipes in
    QUANTIZE_INCLUDED, at size^3 and at (3/4, 3/2, 3/8) * size (1536x3072x768 for 2048). The
    bf16 torch.mm is timed once (one call, no warm-up: a CPU without bf16 units takes over a
    minute for it at 2048^3), or a median of `rounds` where one call takes under 0.5 s."""
    g = torch.Generator().manual_seed(0)
    shapes = [(size, size, size), (3 * size // 4, 3 * size // 2, 3 * size // 8)]  # (M, K, N)
    cands: dict[tuple[str, str], Callable[[], object]] = {}
    operands = {}
    for m, k, n in shapes:
        shape = f"{m}x{k}x{n}"
        a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        b = w.t().contiguous()  # b[K, N] row-major: the natural layout
        operands[shape] = (a, b)
        cands[shape, "torch.mm fp32"] = lambda a=a, b=b: a @ b
        if shape == f"{size}x{size}x{size}":
            for r in recipes:
                aq, bq = quantize_operands(a, b, r)
                cands[shape, f"fp8lab {r} fast"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq, emulation="fast")
                if r in ("tensorwise", "blockwise"):
                    cands[shape, f"fp8lab {r} reference"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq,
                                                                                             emulation="reference")
        for r in (r for r in recipes if r in QUANTIZE_INCLUDED):
            cands[shape, f"fp8lab {r} matmul(a, b[K,N]) + quantize"] = lambda a=a, b=b, r=r: matmul(
                a, b, r, verbose=False)
            cands[shape, f"fp8lab {r} matmul(a, w.t()) + quantize"] = lambda a=a, w=w, r=r: matmul(
                a, w.t(), r, verbose=False)
    times = time_interleaved(cands, rounds=rounds, warmup=1)
    a, b = operands[f"{size}x{size}x{size}"]
    ab, bb = a.bfloat16(), b.bfloat16()
    bf16 = timed(lambda: ab @ bb, repeats=1, warmup=0)
    bf16_note = "timed once (one call, no warm-up)"
    if bf16[0] < 0.5:
        bf16 = timed(lambda: ab @ bb, repeats=rounds, warmup=1)
        bf16_note = f"median of {rounds}, after the others"
    times[f"{size}x{size}x{size}", "torch.mm bf16 (bf16 output)"] = bf16
    rows = []
    for m, k, n in shapes:
        shape = f"{m}x{k}x{n}"
        base = statistics.median(times[shape, "torch.mm fp32"])
        for (where, name), ts in times.items():
            if where == shape:
                med = statistics.median(ts)
                rows.append({"what": name, "M x K x N": shape, "median ms": med * 1e3, "x fp32 mm": med / base,
                             "GFLOP/s": 2 * m * k * n / med / 1e9})
    print_table(f"GEMM {size}^3 and {shapes[1][0]}x{shapes[1][1]}x{shapes[1][2]} on the CPU (median of {rounds}, "
                "interleaved; 'fast' and 'reference': operands quantized beforehand; '+ quantize': the whole call)",
                rows, f"torch.mm bf16: {bf16_note}; b[K,N]: b row-major; w.t(): a transposed view of w[N, K]")
    return rows
