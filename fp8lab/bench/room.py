"""`python -m fp8lab bench room N`: N learners' kernels running one notebook at once on this machine.

Public: bench_room(n, notebook, start, rounds, tree).
Each round times one kernel alone (its quiet Run All, kernel start included), then N kernels started
together, each the way `fp8lab lab` starts them (or --start). A kernel's fair share is N / CPUs times
the quiet time (CPUs: those fp8lab may use here, fp8lab.threads); the table gives each kernel's time
against it (target: within 1.5x) and each kernel's peak memory, from which a facilitator sizes a
JupyterHub or Binder node (FACILITATOR.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fp8lab import threads
from fp8lab.bench.kernelrun import finish, run_in_subprocess, spec, start_in_subprocess
from fp8lab.bench.load import ROOT, _cpu_seconds, notebook_path
from fp8lab.bench.table import print_table

__all__ = ["FAIR_TARGET", "bench_room"]

FAIR_TARGET = 1.5  # each kernel within 1.5x its fair share


def bench_room(n: int, notebook: str = "06", start: str = "lab", rounds: int = 2, tree: Path | None = None,
               timeout: float = 3600.0, weight: int = 0) -> list[dict]:
    """One table per round: the quiet kernel, then each of the N kernels run at once. weight: as bench_load's."""
    if n < 1:
        raise ValueError(f"bench room needs at least 1 kernel, not {n}")
    if weight:
        from fp8lab.bench.cgroups import CpuWeight

        with CpuWeight(weight):
            print(f"bench room: in a cgroup of {weight}x the default CPU weight", flush=True)
            return bench_room(n, notebook, start, rounds, tree, timeout, 0)
    tree = Path(tree or ROOT).resolve()
    path = notebook_path(tree, notebook)
    cpus = threads.decision().cpus
    rows = []
    for r in range(1, rounds + 1):
        load = os.getloadavg()[0]
        machine0, mine0 = _cpu_seconds()
        alone = run_in_subprocess(spec(path, start, tree, timeout=timeout))
        if "error" in alone:
            raise RuntimeError(f"the quiet kernel failed: {alone['error']}")
        quiet = alone["run_all_s"]
        fair = n / cpus * quiet
        t0 = time.perf_counter()
        procs = [start_in_subprocess(spec(path, start, tree, timeout=timeout)) for _ in range(n)]
        results = [finish(p, timeout + 120) for p in procs]
        wall = time.perf_counter() - t0
        machine1, mine1 = _cpu_seconds()
        others = max(0.0, (machine1 - machine0) - (mine1 - mine0))
        table = [{"kernel": "alone", "run all s": quiet, "x fair share": "-", "peak MB": alone["peak_mb"],
                  "kernel CPU s": alone["cpu_s"] + alone["children_cpu_s"], "threads": alone.get("torch_threads"),
                  "errors": len(alone["errors"])}]
        for i, res in enumerate(results, 1):
            if "error" in res:
                table.append({"kernel": f"{i} of {n}", "run all s": "-", "errors": res["error"][:80]})
                continue
            table.append({"kernel": f"{i} of {n}", "run all s": res["run_all_s"],
                          "x fair share": res["run_all_s"] / fair,
                          "peak MB": res["peak_mb"], "kernel CPU s": res["cpu_s"] + res["children_cpu_s"],
                          "threads": res.get("torch_threads"), "errors": len(res["errors"])})
        worst = max((t["x fair share"] for t in table[1:] if isinstance(t.get("x fair share"), float)), default=0.0)
        peak = max((t["peak MB"] for t in table if isinstance(t.get("peak MB"), float)), default=0.0)
        print_table(f"bench room {n}, round {r} of {rounds}: {path.stem}, {n} kernels at once (start: {start}); "
                    f"fair share = {n} / {cpus} CPUs x {quiet:.1f} s quiet = {fair:.1f} s", table,
                    f"load average {load:.1f} before the round, other programs' CPU {others:.1f} s during it; "
                    f"all {n} done in {wall:.1f} s; worst kernel "
                    f"{worst:.2f}x its fair share (target <= {FAIR_TARGET:g}x); peak {peak:.0f} MB per kernel")
        rows.append({"round": r, "n": n, "cpus": cpus, "quiet_s": quiet, "fair_s": fair, "wall_s": wall,
                     "others_cpu_s": others, "worst_x_fair": worst, "peak_mb": peak, "kernels": table})
    return rows
