"""A slower machine on demand: `python -m fp8lab bench NAME --quota 0.5` runs the benchmark in a child process
inside a cgroup v1 CPU quota.

Public: QUOTA_BENCHES, DEFAULT_PERIOD_MS, QuotaUnavailable, quota_problem(cpus, period_ms), check_host(),
run_in_quota(command, cpus, period_ms) -> exit status, quota_label().
The child gets `cpus` x period of CPU time in every period (0.5 with the default 10 ms period: 5 ms in every
10 ms). A short period slows the process evenly, as a slower CPU or a hub's share of a core does; the usual
100 ms period lets it run at full speed for 50 ms and then stops it for 50, so a 30 ms redraw would take
either 30 ms or 80. Everything the child starts (a notebook's kernel) runs in the same quota, and fp8lab
there sizes torch's threads to it (fp8lab.threads). The group is removed when the child ends, also on
Ctrl-C or an error; processes the child left behind in it are ended first. Needs root and a cgroup v1 cpu
controller: elsewhere QuotaUnavailable says which is missing and how to get a quota instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fp8lab import threads
from fp8lab.bench.cgroups import CpuQuota, cpu_controller

__all__ = ["DEFAULT_PERIOD_MS", "QUOTA_BENCHES", "QuotaUnavailable", "check_host", "quota_label", "quota_problem",
           "run_in_quota"]

DEFAULT_PERIOD_MS = 10.0
# the benchmarks that run in one process tree of their own (load, room and threads make their own groups)
QUOTA_BENCHES = ("quantize", "gemm", "train", "widgets", "notebooks", "blas", "inspect", "lessons", "all")
# the child writes its own pid into the group, then becomes the command (same pid: exec), with Ctrl-C ignored: the
# parent ends it (SIGTERM) on Ctrl-C, so that it stops without a traceback and the group goes away after it
ENTER_QUOTA = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "open(sys.argv[1], 'w').write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])")
# what cgroup v1 accepts (kernel/sched/core.c: a period of 1 ms to 1 s, a quota of at least 1 ms)
MIN_US, MAX_PERIOD_US = 1000, 1_000_000


class QuotaUnavailable(OSError):
    """No CPU quota can be made here; the message says why and what to do instead."""


def quota_problem(cpus: float, period_ms: float) -> str | None:
    """What is wrong with a quota of `cpus` CPUs per `period_ms` milliseconds, or None."""
    if not cpus > 0:
        return f"--quota must be a positive number of CPUs (0.5: half a CPU), not {cpus:g}"
    if cpus > (os.cpu_count() or 1):
        return f"--quota {cpus:g} is more than this machine's {os.cpu_count()} CPUs: it would slow nothing"
    if not MIN_US <= period_ms * 1000 <= MAX_PERIOD_US:
        return f"--period-ms must be from 1 to 1000 (cgroup v1's limits), not {period_ms:g}"
    if cpus * period_ms * 1000 < MIN_US:
        return (f"--quota {cpus:g} of a {period_ms:g} ms period is {cpus * period_ms:g} ms, under cgroup v1's "
                f"smallest quota of 1 ms: give a longer --period-ms (at least {MIN_US / 1000 / cpus:g})")
    return None


def _instead(cpus: float, period_ms: float) -> str:
    return (f"to measure in a quota without it, start the benchmark in one yourself, e.g. `systemd-run --scope -p "
            f"CPUQuota={cpus * 100:g}% -p CPUQuotaPeriodSec={period_ms:g}ms python -m fp8lab bench ...` "
            "(the table's machine line then names the quota)")


def check_host(cpus: float = 0.5, period_ms: float = DEFAULT_PERIOD_MS) -> None:
    """Raise QuotaUnavailable unless this process can make a cgroup v1 CPU quota (root, a v1 cpu controller)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise QuotaUnavailable(f"--quota makes a cgroup, which needs root (this process runs as uid {os.geteuid()}):"
                               f" run it with sudo; or {_instead(cpus, period_ms)}")
    try:
        version, _ = cpu_controller()
    except OSError as err:
        raise QuotaUnavailable(f"--quota needs a cgroup v1 cpu controller: {err}; {_instead(cpus, period_ms)}") \
            from err
    if version != "v1":
        raise QuotaUnavailable("--quota makes a cgroup v1 cpu group, and this machine has cgroup v2 only (v2 lets "
                               "processes live only in leaf groups, so a group for the benchmark cannot be made "
                               f"beside this process); {_instead(cpus, period_ms)}")


def _end_leftovers(procs: Path, grace: float = 5.0) -> list[int]:
    """End the processes still in the group (the child's own children, e.g. a kernel): SIGTERM, then SIGKILL."""
    def members() -> list[int]:
        try:
            return [int(x) for x in procs.read_text().split()]
        except (OSError, ValueError):
            return []

    left = members()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in members():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while members() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not members():
            break
    return left


def _raise_on_signal(signum, frame) -> None:
    """SIGTERM or SIGHUP while the child runs: leave through the finally clauses that remove the group."""
    raise SystemExit(128 + signum)


def run_in_quota(command: list[str], cpus: float, period_ms: float = DEFAULT_PERIOD_MS,
                 env: dict[str, str] | None = None) -> int:
    """Run `command` (an argv; command[0] an executable's path) in a new cgroup with a quota of `cpus` CPUs per
    `period_ms` ms; its exit status.

    The child enters the group before it runs anything (it writes its own pid to cgroup.procs, then execs the
    command: the same process). The group goes away when the command ends, on Ctrl-C, SIGTERM or SIGHUP too
    (the child ignores Ctrl-C and is ended here, with whatever it started: exit status 130).
    Raises ValueError for a quota cgroup v1 does not take, QuotaUnavailable where no quota can be made."""
    problem = quota_problem(cpus, period_ms)
    if problem:
        raise ValueError(problem)
    check_host(cpus, period_ms)
    group = CpuQuota(cpus, round(period_ms * 1000))
    try:
        group.__enter__()
    except OSError as err:  # a read-only cgroup mount (a container), a quota the kernel refuses
        raise QuotaUnavailable(f"could not make the quota's cgroup: {err}; {_instead(cpus, period_ms)}") from err
    handled = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _raise_on_signal) for sig in handled} if _main_thread() else {}
    proc = None
    try:
        print(f"bench: in the cgroup {group.folder} with a CPU quota of {cpus:g} CPU ({cpus * period_ms:g} ms in "
              f"every {period_ms:g} ms)", flush=True)
        proc = subprocess.Popen([sys.executable, "-c", ENTER_QUOTA, group.procs, *command], env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            print("bench: interrupted; ending the benchmark and removing its cgroup", file=sys.stderr, flush=True)
            return 130
        return 128 - code if code < 0 else code  # a child ended by signal N: 128 + N, as a shell says
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _end_leftovers(Path(group.procs))
        group.__exit__()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def quota_label() -> str:
    """The CPU quota this process runs in, for the tables' machine line ("" where none):
    "in a CPU quota of 0.5 CPU (cgroup v1 cpu.cfs_quota_us/cfs_period_us 5000/10000)"."""
    cpus, source = threads.cpu_quota()
    return "" if cpus is None else f"in a CPU quota of {cpus:g} CPU ({source})"
