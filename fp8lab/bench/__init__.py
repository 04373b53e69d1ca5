"""The project's own benchmarks: `python -m fp8lab bench NAME`, one file each.

  quantize.py  gemm.py  train.py  inspect.py  widgets.py  notebooks.py  blas.py  gpu.py
  load.py (notebooks and a drag on a busy machine and in a CPU quota)  room.py (N kernels at once)
  threadcount.py (a training loop with one thread and with all, quiet and busy: `bench threads`)
  quota.py (`--quota 0.5`: the benchmark in a CPU quota, a slower machine)
  (table.py: the tables' machine line; kernelrun.py: a Run All in a kernel started as a learner starts
  it; drag.py: a slider dragged in a running kernel; cgroups.py: a scheduling group, a CPU quota, a CPU
  weight)
Candidates are timed in interleaved rounds on the same inputs, so a noisy, shared machine slows all
of them alike; the tables report medians and ratios from one run. Tests never time anything.
"""

from __future__ import annotations

import argparse
import sys

from fp8lab import settings
from fp8lab.bench.blas import bench_blas
from fp8lab.bench.gemm import bench_gemm
from fp8lab.bench.gpu import bench_gpu
from fp8lab.bench.inspect import bench_inspect
from fp8lab.bench.load import CONDITIONS, bench_load
from fp8lab.bench.notebooks import bench_notebooks
from fp8lab.bench.quantize import bench_quantize
from fp8lab.bench.quota import DEFAULT_PERIOD_MS, QUOTA_BENCHES, QuotaUnavailable, quota_problem, run_in_quota
from fp8lab.bench.room import RoomTooBig, bench_room
from fp8lab.bench.threadcount import bench_threads
from fp8lab.bench.train import MODELS, bench_train
from fp8lab.numerics import kernels
from fp8lab.timing import machine_line
from fp8lab.training.train import lesson_table

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
                   "for 'widgets': these panels; for 'train': these models (unseen_mlp lesson_mlp llm_like); "
                   "for 'load': the notebooks (default 06 08); for 'room': the notebook (default 06)")
    p.add_argument("--conditions", nargs="+", default=None, help="for 'load': quiet busy shared quota (default: all)")
    p.add_argument("--starts", nargs="+", default=None, help="for 'load': lab jupyter torch-first (default: lab "
                   "jupyter); for 'room': the one way its kernels start (default lab)")
    p.add_argument("--tree", default=None, help="for 'load' and 'room': the checkout whose notebooks and fp8lab the "
                   "kernels run (default: this one), to compare two versions on one machine")
    p.add_argument("--no-drag", action="store_true", help="for 'load': skip the slider drags")
    p.add_argument("--json", default=None, help="for 'load': append every row to this file (JSON lines)")
    p.add_argument("--parts", action="store_true", help="for 'train': time each step's C passes too (fp8lab's kernels "
                   "on operands and outputs) and give each recipe's floor, fp32's step plus those passes")
    p.add_argument("--steps", type=positive_int, default=60, help="for 'threads': training steps per run (default 60)")
    p.add_argument("--ignore-memory", action="store_true", help="for 'room': start the kernels even where they "
                   "cannot all fit in the memory available (by default room refuses, saying the arithmetic)")
    p.add_argument("--weight", type=non_negative_int, default=0, help="for 'load', 'room' and 'threads' (root, "
                   "cgroup v1): run in a cgroup of this many times the default CPU weight, so that other people's "
                   "work on a shared machine barely disturbs a measurement (the tables say how much CPU the others "
                   "took)")
    p.add_argument("--quota", type=float, default=None, help="run in a CPU quota of this many CPUs (0.5: a machine "
                   "about half as fast), a cgroup made for it (root, cgroup v1); not for load, room, threads, gpu")
    p.add_argument("--period-ms", type=float, default=None, help="the quota's period in ms (default 10: the process "
                   "slows evenly, not in bursts)")
    p.add_argument("--in-quota", action="store_true", help=argparse.SUPPRESS)  # the child run_in_quota starts
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.count is not None and args.name != "room":
        p.error("only 'room' takes a count")
    if args.parts and args.name != "train":
        p.error("--parts is for 'train' (each step's C passes and each recipe's floor)")
    if args.quota is not None or args.period_ms is not None:
        if args.quota is None:
            p.error("--period-ms goes with --quota")
        if not args.in_quota:
            return _in_quota(p, args, argv)
    if args.only and args.name in ("widgets", "train"):
        unknown = _unknown_names(args.name, args.only)
        if unknown:
            p.error(unknown)
    settings.keep_freed_memory()  # as fp8lab.setup() does in the notebooks
    names = ("quantize", "gemm", "train", "widgets") if args.name == "all" else (args.name,)
    status = 0
    for name in names:
        kw = {k: v for k, v in {"size": args.size, "rounds": args.rounds}.items() if v is not None}
        if name == "quantize":
            bench_quantize(**kw)
        elif name == "gemm":
            bench_gemm(**kw)
        elif name == "gpu":
            gkw = {"device": args.device}
            if args.size:
                gkw["size"] = args.size
            if args.rounds:
                gkw["calls"] = args.rounds
            if bench_gpu(**gkw)["failures"]:
                status = 1
        elif name == "train":
            bench_train(**kw, models=tuple(args.only) if args.only else None, parts=args.parts)
        elif name == "widgets":
            # ipywidgets and the panels are the lab extra's: `bench gpu` on a GPU box runs with torch alone
            from fp8lab.bench.widgets import bench_widgets

            bench_widgets(rounds=args.rounds, panels=tuple(args.only) if args.only else None)
        elif name == "notebooks":
            bench_notebooks(tuple(args.only) if args.only else None)
        elif name == "blas":
            bench_blas(**kw)
        elif name == "inspect":
            bench_inspect(**kw)
        elif name == "load":
            bench_load(tuple(args.only or ("06", "08")), tuple(args.conditions or CONDITIONS),
                       tuple(args.starts or ("lab", "jupyter")), rounds=args.rounds or 2, tree=args.tree,
                       drag=not args.no_drag, out=args.json, weight=args.weight)
        elif name == "room":
            if args.count is None:
                p.error("bench room needs the number of kernels: python -m fp8lab bench room 4")
            try:
                bench_room(args.count, (args.only or ["06"])[0], (args.starts or ["lab"])[0], rounds=args.rounds or 2,
                           tree=args.tree, weight=args.weight, check_memory=not args.ignore_memory)
            except RoomTooBig as err:
                p.error(str(err))
        elif name == "threads":
            bench_threads(steps=args.steps, rounds=args.rounds or 4, weight=args.weight)
        elif name == "lessons":
            print("\nnotebook 06's lessons: final loss (mean of the last 10 steps, 3 seeds)")
            print(machine_line(kernels.state_label()))
            lesson_table()
    return status


def _unknown_names(name: str, only: list[str]) -> str:
    """What is wrong with `--only` for widgets (panels) or train (models), or ""."""
    if name == "widgets":
        # the panels load matplotlib and every notebook's panel (measured: 2.3 s of CPU): only where they are named
        from fp8lab.lab.panels import PANELS as valid
    else:
        valid = MODELS
    unknown = sorted(set(only) - set(valid))
    what = "panels" if name == "widgets" else "models"
    return f"unknown {what} {unknown}; valid: {', '.join(valid)}" if unknown else ""


def _in_quota(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """Run this same command again in a child process inside a CPU quota (fp8lab.bench.quota); its exit status."""
    if args.name not in QUOTA_BENCHES:
        p.error(f"--quota is for {', '.join(QUOTA_BENCHES)} (load, room and threads make their own groups; gpu "
                f"times the GPU), not '{args.name}'")
    period = args.period_ms if args.period_ms is not None else DEFAULT_PERIOD_MS
    problem = quota_problem(args.quota, period)
    if problem:
        p.error(problem)
    try:
        return run_in_quota([sys.executable, "-m", "fp8lab", "bench", *argv, "--in-quota"], args.quota, period)
    except QuotaUnavailable as err:
        print(f"python -m fp8lab bench: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
