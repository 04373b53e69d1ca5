"""`python -m fp8lab bench room N`: N learners' kernels running one notebook at once on this machine.

Public: bench_room(n, notebook, start, rounds, tree).
Each round times one kernel alone (its quiet Run All, kernel start included), then N kernels started
together, each the way `fp8lab lab` starts them (or --start). A kernel's fair share is N / CPUs times
the quiet time (CPUs: those fp8lab may use here, fp8lab.threads); the table gives each kernel's time
against it (target: within 1.5x) and each kernel's peak memory, from which a facilitator sizes a
JupyterHub or Binder node (FACILITATOR.md). A room that cannot fit in the memory available is refused
(RoomTooBig, saying the arithmetic; --ignore-memory starts it anyway): before anything starts, from what
each kernel holds at least (the unshared memory of a process that has imported torch and fp8lab, as this
one has), and after the quiet kernel, from its measured peak.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fp8lab import threads
from fp8lab.bench.cgroups import CpuWeight
from fp8lab.bench.kernelrun import finish, run_in_subprocess, spec, start_in_subprocess
from fp8lab.bench.load import ROOT, cpu_seconds, notebook_path
from fp8lab.bench.table import print_table

__all__ = ["FAIR_TARGET", "RoomTooBig", "available_memory_mb", "bench_room", "own_memory_mb", "room_fits"]

FAIR_TARGET = 1.5  # each kernel within 1.5x its fair share


class RoomTooBig(ValueError):
    """The kernels asked for cannot all fit in the memory available here (the message says the arithmetic)."""


def available_memory_mb(root: str | os.PathLike = "/") -> tuple[float | None, str]:
    """(MB the machine can give new processes now, where that was read), or (None, why not): MemAvailable of
    /proc/meminfo, or less where this process's memory cgroup (v2 memory.max, v1 memory.limit_in_bytes)
    leaves less room under its limit."""
    root = Path(root)
    found: list[tuple[float, str]] = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) / 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        cgroups = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        cgroups = []
    for line in cgroups:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2
            base = root / "sys/fs/cgroup" / path.lstrip("/")
            limit, used, name = base / "memory.max", base / "memory.current", "cgroup memory.max"
        elif "memory" in controllers.split(","):  # v1
            base = root / "sys/fs/cgroup/memory" / path.lstrip("/")
            limit, used, name = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes", \
                "cgroup memory.limit_in_bytes"
        else:
            continue
        try:
            cap, now = limit.read_text().strip(), int(used.read_text())
            if cap != "max" and int(cap) < 2**60:
                found.append(((int(cap) - now) / 2**20, f"{name} {int(cap) / 2**30:.1f} GiB, {now / 2**30:.1f} in use"))
        except (OSError, ValueError):
            continue
    return min(found) if found else (None, "no /proc/meminfo here")


def own_memory_mb() -> float | None:
    """The memory this process holds that no other process shares (its anonymous pages: /proc/self/smaps_rollup),
    in MB: at least what each kernel holds once it has imported torch and fp8lab. None off Linux."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def room_fits(n: int, per_kernel_mb: float, basis: str, available: tuple[float | None, str]) -> str | None:
    """Why n kernels of per_kernel_mb each (`basis` says where that figure comes from) cannot fit in the memory
    available (available_memory_mb()), with the arithmetic; None where they fit or nothing is known."""
    free, source = available
    if free is None or per_kernel_mb <= 0 or n * per_kernel_mb <= free:
        return None
    most = int(free // per_kernel_mb)
    return (f"bench room {n}: {n} kernels x {per_kernel_mb:.0f} MB ({basis}) = {n * per_kernel_mb / 1024:.1f} GB, "
            f"but this machine has {free / 1024:.1f} GB available ({source}): they cannot all fit. Ask for at most "
            f"{most} kernel(s) here, or pass --ignore-memory to start them anyway")


def bench_room(n: int, notebook: str = "06", start: str = "lab", rounds: int = 2, tree: Path | None = None,
               timeout: float = 3600.0, weight: int = 0, check_memory: bool = True) -> list[dict]:
    """One table per round: the quiet kernel, then each of the N kernels run at once. weight: as bench_load's.
    check_memory: raise RoomTooBig where the N kernels cannot all fit in the memory available (room_fits),
    before anything starts and again after the quiet kernel of the first round (from its peak)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"bench room needs at least 1 kernel, not {n!r}")
    if check_memory and (floor := own_memory_mb()) is not None:
        why = room_fits(n, floor, "at least: the unshared memory of a process that has imported torch and fp8lab, "
                        "as every kernel has before its notebook's first cell", available_memory_mb())
        if why:
            raise RoomTooBig(why)
    if weight:
        with CpuWeight(weight):
            print(f"bench room: in a cgroup of {weight}x the default CPU weight", flush=True)
            return bench_room(n, notebook, start, rounds, tree, timeout, 0, check_memory)
    tree = Path(tree or ROOT).resolve()
    path = notebook_path(tree, notebook)
    cpus = threads.decision().cpus
    rows = []
    for r in range(1, rounds + 1):
        load = os.getloadavg()[0]
        machine0, mine0 = cpu_seconds()
        alone = run_in_subprocess(spec(path, start, tree, timeout=timeout))
        if "error" in alone:
            raise RuntimeError(f"the quiet kernel failed: {alone['error']}")
        quiet = alone["run_all_s"]
        if check_memory and r == 1:
            why = room_fits(n, alone["peak_mb"], "the quiet kernel's peak, just measured; resident memory, the "
                            "shared libraries counted in each kernel", available_memory_mb())
            if why:
                raise RoomTooBig(why)
        fair = n / cpus * quiet
        t0 = time.perf_counter()
        procs = [start_in_subprocess(spec(path, start, tree, timeout=timeout)) for _ in range(n)]
        results = [finish(p, timeout + 120) for p in procs]
        wall = time.perf_counter() - t0
        machine1, mine1 = cpu_seconds()
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
