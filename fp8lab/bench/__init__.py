"""The project's own benchmarks: `python -m fp8lab bench NAME`, one file each.

  quantize.py  gemm.py  train.py  inspect.py  widgets.py  notebooks.py  blas.py  gpu.py
  (table.py: the tables' machine line)
Candidates are timed in interleaved rounds on the same inputs, so a noisy, shared machine slows all
of them alike; the tables report medians and ratios from one run. Tests never time anything.
"""

from __future__ import annotations

import argparse

from fp8lab.numerics import kernels
from fp8lab.timing import machine_line

__all__ = ["BENCHES", "main"]


BENCHES = ("quantize", "gemm", "gpu", "train", "widgets", "notebooks", "blas", "lessons", "inspect", "all")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab bench", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=BENCHES)
    p.add_argument("--size", type=int, default=None, help="matrix size (defaults per benchmark)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per candidate")
    p.add_argument("--device", default=None, help="for 'gpu': cuda (default when present) or cpu (dry run)")
    p.add_argument("--only", nargs="*", default=None, help="for 'notebooks': only those whose name contains one")
    args = p.parse_args(argv)
    kernels.keep_freed_memory()  # as fp8lab.setup() does in the notebooks
    names = ("quantize", "gemm", "train", "widgets") if args.name == "all" else (args.name,)
    status = 0
    for name in names:
        kw = {k: v for k, v in {"size": args.size, "rounds": args.rounds}.items() if v is not None}
        if name == "quantize":
            from fp8lab.bench.quantize import bench_quantize

            bench_quantize(**kw)
        elif name == "gemm":
            from fp8lab.bench.gemm import bench_gemm

            bench_gemm(**kw)
        elif name == "gpu":
            from fp8lab.bench.gpu import bench_gpu

            gkw = {"device": args.device}
            if args.size:
                gkw["size"] = args.size
            if args.rounds:
                gkw["calls"] = args.rounds
            if bench_gpu(**gkw)["failures"]:
                status = 1
        elif name == "train":
            from fp8lab.bench.train import bench_train

            bench_train(**kw)
        elif name == "widgets":
            from fp8lab.bench.widgets import bench_widgets

            bench_widgets(rounds=args.rounds)
        elif name == "notebooks":
            from fp8lab.bench.notebooks import bench_notebooks

            bench_notebooks(tuple(args.only) if args.only else None)
        elif name == "blas":
            from fp8lab.bench.blas import bench_blas

            bench_blas(**kw)
        elif name == "inspect":
            from fp8lab.bench.inspect import bench_inspect

            bench_inspect(**kw)
        elif name == "lessons":
            from fp8lab.training.train import lesson_table

            print("\nnotebook 06's lessons: final loss (mean of the last 10 steps, 3 seeds)")
            print(machine_line(kernels.state_label()))
            lesson_table()
    return status
