"""cgroups for the room benchmarks: a group a kernel or a busy program enters, a CPU quota, and a CPU weight
for the benchmark itself.

Public: CpuGroup(label), CpuQuota(cpus), CpuWeight(factor), cpu_controller(), autogroup(). All three are
context managers that make a cgroup under the benchmark's own (from /proc/self/cgroup, on the cpu
controller: cgroup v2 or v1) and remove it on exit. They need root and a cgroup CPU controller, else
they raise OSError saying which is missing.
CpuGroup: a scheduling group of the default weight. Linux shares the CPU between groups first, then
between the threads inside each: a desktop gives each session (autogroup) or app (a systemd scope) its
group, a JupyterHub each learner's container or scope; processes inside one group share per thread.
CpuQuota: a CpuGroup with `cpus` CPUs per period (100 ms unless asked; cpu.max, or cpu.cfs_quota_us and
cpu.cfs_period_us), as a JupyterHub on Kubernetes or Binder limits a learner; a short period (10 ms) slows a
process evenly, as a slower CPU does, instead of in bursts (`bench --quota`, fp8lab.bench.quota).
CpuWeight (cgroup v1): the benchmark and every process it starts move into a group with `factor` times the
default CPU weight (cpu.shares), so that other people's programs on a shared machine take at most 1 / (factor + 1)
of a core the benchmark wants: a quiet measurement on a machine that is not quiet. Its table says that it ran so,
and how much CPU the others took meanwhile.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fp8lab.threads import own_cgroups

__all__ = ["CpuGroup", "CpuQuota", "CpuWeight", "autogroup", "cpu_controller"]

PERIOD = 100_000


def cpu_controller(root: str | os.PathLike = "/") -> tuple[str, Path]:
    """("v2" or "v1", the folder of this process's cgroup on the cpu controller); OSError where none."""
    root = Path(root)
    paths = own_cgroups(root)
    mount = root / "sys/fs/cgroup"
    v2 = mount / "cgroup.controllers"
    if "v2" in paths and v2.exists() and "cpu" in v2.read_text().split():
        return "v2", mount.joinpath(*[p for p in paths["v2"].split("/") if p])
    for name in ("cpu,cpuacct", "cpu"):
        if "v1" in paths and (mount / name / "cpu.cfs_quota_us").exists():
            return "v1", (mount / name).joinpath(*[p for p in paths["v1"].split("/") if p])
    raise OSError(f"no cgroup CPU controller for this process under {mount} (v2 cpu.max or v1 cpu.cfs_quota_us)")


def _remove(folder: Path) -> None:
    for _ in range(50):  # a kernel's exit can lag its client's
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.2)
    print(f"bench: could not remove the cgroup {folder} (processes still in it?)", file=sys.stderr)


def autogroup(root: str | os.PathLike = "/") -> bool:
    """Whether the kernel schedules each session as a group of its own where no cgroup says otherwise
    (/proc/sys/kernel/sched_autogroup_enabled): a kernel that Jupyter starts in a new session then shares
    the CPU with a program of another session per group, not per thread."""
    try:
        return (Path(root) / "proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


class CpuGroup:
    """A cgroup of the default CPU weight; `.procs` is the file a process writes its pid to, to enter it.
    The label names it: fp8lab-LABEL-PID."""

    label = "group"

    def __init__(self, label: str | None = None) -> None:
        self.label = label or self.label
        self.folder: Path | None = None
        self.procs = ""
        self.version = ""

    def __enter__(self) -> CpuGroup:
        self.version, own = cpu_controller()
        self.folder = own / f"fp8lab-{self.label}-{os.getpid()}"
        self.folder.mkdir()
        self.procs = str(self.folder / "cgroup.procs")
        return self

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            _remove(self.folder)


class CpuQuota(CpuGroup):
    """A cgroup with a quota of `cpus` CPUs: cpus * period microseconds of CPU time in every `period`
    microseconds (default PERIOD). The folder is removed on exit, also when writing the quota fails."""

    label = "quota"

    def __init__(self, cpus: float = 1.0, period: int = PERIOD) -> None:
        super().__init__()
        self.cpus = cpus
        self.period = period
        self.quota = round(cpus * period)

    def __enter__(self) -> CpuQuota:
        super().__enter__()
        assert self.folder is not None
        try:
            if self.version == "v2":
                (self.folder / "cpu.max").write_text(f"{self.quota} {self.period}")
            else:  # the period first: the kernel checks the quota against the period in force
                (self.folder / "cpu.cfs_period_us").write_text(str(self.period))
                (self.folder / "cpu.cfs_quota_us").write_text(str(self.quota))
        except OSError:
            self.__exit__()
            raise
        return self


class CpuWeight:
    """This process (and all it starts later) in a group of `factor` times the default CPU weight."""

    def __init__(self, factor: int = 8) -> None:
        self.factor = factor
        self.group: Path | None = None
        self.home: Path | None = None

    def __enter__(self) -> CpuWeight:
        version, home = cpu_controller()
        if version != "v1":  # cgroup v2 keeps processes in leaves only: the quota groups could not nest here
            raise OSError("a CPU weight for the benchmark is made on cgroup v1 (cpu.shares) only")
        self.home = home
        self.group = home / f"fp8lab-weight-{os.getpid()}"
        self.group.mkdir()
        (self.group / "cpu.shares").write_text(str(1024 * self.factor))
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc) -> None:
        if self.group is None or self.home is None:
            return
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        _remove(self.group)
