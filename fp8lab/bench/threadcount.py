"""`python -m fp8lab bench threads`: a training loop with one thread and with all of them, quiet and busy.

Public: CONDITIONS, bench_threads(steps, rounds, busy, weight).
Notebook 06's lesson (tensorwise and two delayed recipes, `steps` steps) trains in a process of its own
with one torch thread and with as many as fp8lab's thread policy gives here (OMP_NUM_THREADS, set as a
user would), in three conditions of `bench load`: quiet; busy (two spinning processes in a scheduling
group of their own, as another program is); shared (the spinners in the training process's own group:
the CPU is shared per thread). Candidates run interleaved round by round, so that a machine whose speed
drifts meets each alike. It answers whether fewer threads would serve a loaded machine better than
torch's own count, which fp8lab keeps where there is no CPU quota (fp8lab.threads).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from fp8lab import threads
from fp8lab.bench.cgroups import CpuWeight
from fp8lab.bench.kernelrun import kernel_environment
from fp8lab.bench.load import ROOT, Busy, groups
from fp8lab.bench.table import print_table

__all__ = ["CONDITIONS", "bench_threads"]

CONDITIONS = ("quiet", "busy", "shared")
WORK = """
import json, time
import fp8lab, torch
fp8lab.setup(quiet=True)
from fp8lab.training.train import LESSON, delayed_recipes, train
short, long = delayed_recipes()
t = time.perf_counter()
train(("tensorwise", short, long), steps={steps}, gain_schedule=LESSON.gain_schedule, monitor_every=3, progress=False)
print("RESULT", json.dumps({{"s": time.perf_counter() - t, "threads": torch.get_num_threads()}}))
"""


def run(count: int, steps: int, procs: str | None = None) -> dict:
    """One training run with `count` torch threads, in the cgroup whose cgroup.procs is `procs` (None: here):
    {"s": seconds, "threads": torch's count in the run}."""
    env = {**kernel_environment("jupyter", ROOT), "OMP_NUM_THREADS": str(count)}  # the user's count: kept
    proc = subprocess.Popen([sys.executable, "-c", WORK.format(steps=steps)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if procs:
        Path(procs).write_text(str(proc.pid))
    out, err = proc.communicate(timeout=1800)
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"bench threads: the run with {count} threads failed: {err[-1500:]}")
    return json.loads(line[len("RESULT "):])


def bench_threads(steps: int = 60, rounds: int = 4, busy: int = 2, weight: int = 0) -> list[dict]:
    """Every (round, condition, thread count) run, printed as one table of medians; returns the runs."""
    if weight:
        with CpuWeight(weight):
            return bench_threads(steps, rounds, busy, 0)
    counts = sorted({1, threads.decision().cpus})
    runs = []
    for r in range(1, rounds + 1):
        for condition in CONDITIONS:
            for count in counts:
                if condition == "quiet":
                    out = run(count, steps)
                else:
                    with groups(condition) as (kernel, others, _how), Busy(busy, others):
                        out = run(count, steps, kernel)
                runs.append({"round": r, "condition": condition, "count": count, **out})
                print(f"round {r} {condition} {count} threads: {out['s']:.2f} s", flush=True)
    table = []
    for condition in CONDITIONS:
        mine = {c: [x["s"] for x in runs if x["condition"] == condition and x["count"] == c] for c in counts}
        best = min(statistics.median(v) for v in mine.values())
        for count, seconds in mine.items():
            table.append({"condition": condition, "threads": count, "median s": statistics.median(seconds),
                          "x the faster": statistics.median(seconds) / best,
                          "rounds s": ", ".join(f"{s:.2f}" for s in seconds)})
    print_table(f"bench threads: notebook 06's lesson, {steps} steps, {rounds} rounds interleaved", table,
                "busy: two spinning processes in a group of their own (per group); shared: in the training "
                "process's group (per thread)")
    return runs
