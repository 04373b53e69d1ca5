"""`python -m fp8lab bench load`: notebooks 06 and 08 and a slider drag on a shared machine.

Public: CONDITIONS, Busy, groups(condition), bench_load(...) (the cgroups: fp8lab.bench.cgroups).
Each round runs, for each start way (fp8lab.bench.kernelrun: `lab`, `jupyter`, `torch-first`), each
notebook's Run All (kernel start included) under each condition, then drags three sliders in notebook
06's kernel (fp8lab.bench.drag):
  quiet   nothing else started by the benchmark (other programs on the machine are not stopped:
          the table prints the load average)
  busy    two processes that spin on the CPU beside the kernel (tools/under_load.py's): another program,
          a video call or a neighbour's training run, in a scheduling group of its own as Linux gives each
          program (a session's autogroup, a desktop app's systemd scope, a hub learner's container); the
          kernel is in its own group (a cgroup each where the benchmark can make them, else their own
          sessions: autogroup). The CPU is shared per group first: the kernel's fair share is one core
  shared  the same two processes in the kernel's own group: the CPU is shared per thread (programs the
          learner starts from the kernel's terminal; a hub that keeps every kernel in one group). The
          fair share is 2/3 of a core for a serial cell and one core for a two-thread one (1.5-2x)
  quota   the kernel in a cgroup with a CPU quota (1 CPU: cpu.max or cpu.cfs_quota_us), as a JupyterHub
          on Kubernetes or Binder gives; needs root and a cgroup CPU controller, else skipped, saying why
Ratios are to the quiet run of the same round, start way and notebook; each round is reported, with
the CPU seconds that programs other than the benchmark's spent meanwhile (/proc/stat less the
benchmark's own processes): a quiet run beside other people's work is not quiet.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fp8lab.bench import drag as drag_module
from fp8lab.bench.cgroups import CpuGroup, CpuQuota, CpuWeight, autogroup
from fp8lab.bench.kernelrun import START_WAYS, run_in_subprocess, spec
from fp8lab.bench.table import print_table

__all__ = ["CONDITIONS", "Busy", "bench_load", "cpu_seconds", "notebook_path"]

CONDITIONS = ("quiet", "busy", "shared", "quota")
SPIN = "import time\nwhile True:\n    sum(i * i for i in range(10_000))\n"
ROOT = Path(__file__).resolve().parents[2]


def notebook_path(tree: Path, name: str) -> Path:
    """The notebook of `tree` whose file name starts with `name` ("06")."""
    found = sorted((tree / "notebooks").glob(f"{name}*.ipynb"))
    if not found:
        raise ValueError(f"no notebook {name}* in {tree / 'notebooks'}")
    return found[0]


@contextlib.contextmanager
def Busy(n: int = 2, procs: str | None = None) -> Iterator[list[subprocess.Popen]]:
    """`n` processes spinning on the CPU for the duration of the block: in the cgroup whose cgroup.procs
    file is `procs`, or (None) in a session of their own, which autogroup schedules as one group."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=procs is None) for _ in range(n)]
    try:
        for p in spinners if procs else ():
            Path(procs).write_text(str(p.pid))
        time.sleep(0.5)  # let them reach the run queue
        yield spinners
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


@contextlib.contextmanager
def groups(condition: str) -> Iterator[tuple[str | None, str | None, str]]:
    """(the kernel's cgroup.procs, the busy processes', how they are grouped) for a busy condition: "busy",
    two cgroups; "shared", one. Without a cgroup controller (not root): "busy" leaves the grouping to
    autogroup (kernel and spinners each start a session), "shared" raises OSError (no way to share)."""
    if condition not in ("busy", "shared"):
        raise ValueError(f"groups are for the busy conditions (busy, shared), not {condition!r}")
    with contextlib.ExitStack() as stack:
        try:
            kernel = stack.enter_context(CpuGroup("kernel"))
            others = kernel if condition == "shared" else stack.enter_context(CpuGroup("busy"))
        except OSError as err:
            if condition == "shared":
                raise OSError(f"the shared condition needs a cgroup: {err}") from err
            how = ("sessions of their own, which autogroup schedules as groups" if autogroup()
                   else "sessions of their own, autogroup off: shared per thread")
            yield None, None, f"{how} ({err})"
            return
        yield kernel.procs, others.procs, ("one cgroup for the kernel and the busy processes (shared per thread)"
                                           if condition == "shared" else
                                           "a cgroup for the kernel, another for the busy processes (per group)")


def _after_06() -> str:
    """The cell sent into notebook 06's kernel after its Run All: the drag module's source, then drag_all()."""
    source = Path(drag_module.__file__).read_text()
    return source + "\nimport json as _json\nprint('AFTER', _json.dumps(drag_all()))\n"


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has spent busy, those of this process and its children waited for)."""
    import resource

    mine = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return math.nan, mine
    ticks = os.sysconf("SC_CLK_TCK")
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    return busy / ticks, mine


def _one(notebook: Path, start: str, condition: str, tree: Path, drag: bool, busy: int, cpus: float) -> dict:
    after = _after_06() if drag and notebook.stem.startswith("06") else ""
    load_before = os.getloadavg()[0]
    machine_before, mine_before = cpu_seconds()
    if condition == "quota":
        try:
            with CpuQuota(cpus) as quota:
                result = run_in_subprocess(spec(notebook, start, tree, cgroup_procs=quota.procs, after=after))
        except OSError as err:
            return {"notebook": notebook.stem, "start": start, "condition": condition, "skipped": str(err)}
    elif condition in ("busy", "shared"):
        try:
            with groups(condition) as (kernel, others, how), Busy(busy, others):
                result = {**run_in_subprocess(spec(notebook, start, tree, cgroup_procs=kernel, after=after)),
                          "grouping": how}
        except OSError as err:
            return {"notebook": notebook.stem, "start": start, "condition": condition, "skipped": str(err)}
    else:
        result = run_in_subprocess(spec(notebook, start, tree, after=after))
    machine_after, mine_after = cpu_seconds()
    others = (machine_after - machine_before) - (mine_after - mine_before)
    return {**result, "notebook": notebook.stem, "condition": condition, "start": start,
            "load_before": load_before, "load_after": os.getloadavg()[0], "others_cpu_s": max(0.0, others)}


def bench_load(notebooks: tuple[str, ...] = ("06", "08"), conditions: tuple[str, ...] = CONDITIONS,
               starts: tuple[str, ...] = ("lab", "jupyter"), rounds: int = 2, tree: Path | None = None,
               drag: bool = True, busy: int = 2, cpus: float = 1.0, out: Path | None = None,
               weight: int = 0) -> list[dict]:
    """Run the grid `rounds` times; print one table per round and return every row (also appended as JSON
    lines to `out`). tree: the checkout whose notebooks and fp8lab the kernels run (default this one).
    weight: run in a cgroup of that many times the default CPU weight (CpuWeight; 0: not)."""
    if weight:
        with CpuWeight(weight):
            return _grid(notebooks, conditions, starts, rounds, tree, drag, busy, cpus, out,
                         f"the benchmark ran in a cgroup of {weight}x the default CPU weight")
    return _grid(notebooks, conditions, starts, rounds, tree, drag, busy, cpus, out, "")


def _grid(notebooks, conditions, starts, rounds, tree, drag, busy, cpus, out, note: str) -> list[dict]:
    tree = Path(tree or ROOT).resolve()
    bad = set(conditions) - set(CONDITIONS) or set(starts) - set(START_WAYS)
    if bad:
        raise ValueError(f"unknown {sorted(bad)}; conditions: {', '.join(CONDITIONS)}; starts: {', '.join(START_WAYS)}")
    rows = []
    for r in range(1, rounds + 1):
        this_round = []
        for start in starts:
            for name in notebooks:
                path = notebook_path(tree, name)
                for condition in conditions:
                    row = {"round": r, "note": note, **_one(path, start, condition, tree, drag, busy, cpus)}
                    this_round.append(row)
                    if out:
                        with open(out, "a") as f:
                            f.write(json.dumps(row) + "\n")
                    print(_progress(row), flush=True)
        rows += this_round
        report(this_round, f"bench load, round {r} of {rounds}: Run All (kernel start included) and slider drags",
               tree, note)
    return rows


def _progress(row: dict) -> str:
    if "skipped" in row:
        return f"{row['notebook']} {row['start']} {row['condition']}: skipped ({row['skipped']})"
    if "error" in row:
        return f"{row['notebook']} {row['start']} {row['condition']}: ERROR {row['error']}"
    return (f"{row['notebook']} {row['start']} {row['condition']}: {row['run_all_s']:.1f} s, "
            f"{row.get('peak_mb', 0):.0f} MB, load {row['load_before']:.1f}-{row['load_after']:.1f}, "
            f"{len(row.get('errors', []))} errors")


def report(rows: list[dict], title: str, tree: Path | None = None, note: str = "") -> None:
    """The tables of one round: Run All per notebook, start way and condition with its ratio to quiet; the drags."""
    quiet = {(r["notebook"], r["start"]): r["run_all_s"] for r in rows
             if r["condition"] == "quiet" and "run_all_s" in r}
    table = []
    for r in rows:
        if "run_all_s" not in r:
            table.append({"notebook": r["notebook"], "start": r["start"], "condition": r["condition"],
                          "run all s": "-", "x quiet": "-", "note": r.get("skipped") or r.get("error", "")[:80]})
            continue
        base = quiet.get((r["notebook"], r["start"]))
        table.append({"notebook": r["notebook"], "start": r["start"], "condition": r["condition"],
                      "run all s": r["run_all_s"], "x quiet": (r["run_all_s"] / base) if base else "-",
                      "kernel CPU s": r.get("cpu_s", 0) + r.get("children_cpu_s", 0),
                      "peak MB": r.get("peak_mb", "-"), "load avg": f"{r['load_before']:.1f}-{r['load_after']:.1f}",
                      "others' CPU s": r.get("others_cpu_s", "-"),
                      "threads": r.get("torch_threads", "-"), "OMP_WAIT_POLICY": r.get("omp_wait_policy") or "unset",
                      "note": "; ".join(r.get("errors", []))[:80]})
    grouped = sorted({f"{r['condition']}: {r['grouping']}" for r in rows if r.get("grouping")})
    note = "; ".join(filter(None, (f"kernels run {tree}" if tree and tree != ROOT else "", note, *grouped)))
    print_table(title, table, note)
    drags = [{"start": r["start"], "condition": r["condition"], "panel": d["name"], "changes": d["changes"],
              "redraws": d["redraws"], "median ms": d["median_ms"], "p95 ms": d["p95_ms"], "max ms": d["max_ms"],
              "last value ms": d["last_ms"], "one redraw ms": d["redraw_median_ms"]}
             for r in rows for d in (r.get("after") or [])]
    if drags:
        print_table("slider drags in notebook 06's kernel: from a value's arrival to the end of the redraw that shows "
                    "it (or a newer one)", drags,
                    "targets beside two busy processes (busy): median <= 100 ms, p95 <= 200 ms")
