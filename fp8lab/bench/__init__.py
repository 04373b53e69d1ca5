"""The project's own benchmarks: `python -m fp8lab bench NAME`, one file each.

  quantize.py  gemm.py  train.py  inspect.py  widgets.py  notebooks.py  blas.py  gpu.py
  load.py (notebooks and a drag on a busy machine and in a CPU quota)  room.py (N kernels at once)
  threadcount.py (a training loop with one thread and with all, quiet and busy: `bench threads`)
  (table.py: the tables' machine line; kernelrun.py: a Run All in a kernel started as a learner starts
  it; drag.py: a slider dragged in a running kernel; cgroups.py: a scheduling group, a CPU quota, a CPU
  weight)
Candidates are timed in interleaved rounds on the same inputs, so a noisy, shared machine slows all
of them alike; the tables report medians and ratios from one run. Tests never time anything.
"""

from __future__ import annotations

import argparse

from fp8lab.numerics import kernels
from fp8lab.timing import machine_line

__all__ = ["BENCHES", "main", "non_negative_int", "positive_int"]


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not " + ("a positive integer (1 or more)" if least else
                                                               "an integer of 0 or more"))
    return value


def positive_int(text: str) -> int:
    """argparse's type for a count or a size: an integer of at least 1 (else argparse's usage error, exit 2)."""
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    """argparse's type for a setting where 0 means off: an integer of at least 0."""
    return _integer(text, 0)


BENCHES = ("quantize", "gemm", "gpu", "train", "widgets", "notebooks", "blas", "lessons", "inspect", "load", "room",
           "threads", "all")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab bench", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=BENCHES)
    p.add_argument("count", nargs="?", type=positive_int, default=None, help="for 'room': how many kernels at once")
    p.add_argument("--size", type=positive_int, default=None, help="matrix size (defaults per benchmark)")
    p.add_argument("--rounds", type=positive_int, default=None, help="timed rounds per candidate")
    p.add_argument("--device", default=None, help="for 'gpu': cuda (default when present) or cpu (dry run)")
    p.add_argument("--only", nargs="*", default=None, help="for 'notebooks': only those whose name contains one; "
                   "for 'load': the notebooks (default 06 08); for 'room': the notebook (default 06)")
    p.add_argument("--conditions", nargs="+", default=None, help="for 'load': quiet busy shared quota (default: all)")
    p.add_argument("--starts", nargs="+", default=None, help="for 'load': lab jupyter torch-first (default: lab "
                   "jupyter); for 'room': the one way its kernels start (default lab)")
    p.add_argument("--tree", default=None, help="for 'load' and 'room': the checkout whose notebooks and fp8lab the "
                   "kernels run (default: this one), to compare two versions on one machine")
    p.add_argument("--no-drag", action="store_true", help="for 'load': skip the slider drags")
    p.add_argument("--json", default=None, help="for 'load': append every row to this file (JSON lines)")
    p.add_argument("--steps", type=positive_int, default=60, help="for 'threads': training steps per run (default 60)")
    p.add_argument("--ignore-memory", action="store_true", help="for 'room': start the kernels even where they "
                   "cannot all fit in the memory available (by default room refuses, saying the arithmetic)")
    p.add_argument("--weight", type=non_negative_int, default=0, help="for 'load', 'room' and 'threads' (root, "
                   "cgroup v1): run in a cgroup of this many times the default CPU weight, so that other people's "
                   "work on a shared machine barely disturbs a measurement (the tables say how much CPU the others "
                   "took)")
    args = p.parse_args(argv)
    if args.count is not None and args.name != "room":
        p.error("only 'room' takes a count")
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
        elif name == "load":
            from fp8lab.bench.load import CONDITIONS, bench_load

            bench_load(tuple(args.only or ("06", "08")), tuple(args.conditions or CONDITIONS),
                       tuple(args.starts or ("lab", "jupyter")), rounds=args.rounds or 2, tree=args.tree,
                       drag=not args.no_drag, out=args.json, weight=args.weight)
        elif name == "room":
            from fp8lab.bench.room import RoomTooBig, bench_room

            if args.count is None:
                p.error("bench room needs the number of kernels: python -m fp8lab bench room 4")
            try:
                bench_room(args.count, (args.only or ["06"])[0], (args.starts or ["lab"])[0], rounds=args.rounds or 2,
                           tree=args.tree, weight=args.weight, check_memory=not args.ignore_memory)
            except RoomTooBig as err:
                p.error(str(err))
        elif name == "threads":
            from fp8lab.bench.threadcount import bench_threads

            bench_threads(steps=args.steps, rounds=args.rounds or 4, weight=args.weight)
        elif name == "lessons":
            from fp8lab.training.train import lesson_table

            print("\nnotebook 06's lessons: final loss (mean of the last 10 steps, 3 seeds)")
            print(machine_line(kernels.state_label()))
            lesson_table()
    return status
