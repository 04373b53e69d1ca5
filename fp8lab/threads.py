"""The CPUs fp8lab may use, torch's threads sized to them, and OpenMP's wait policy: decided before OpenMP starts.

Public: Decision, decide(...), environment(base), apply(), decision(), cpu_quota(root), affinity_cpus(),
physical_cores(cpus, root), own_cgroups(root) (also the benchmarks' cgroups), QUOTA_FILES, parallel_min(wait_policy,
environ) (the fewest elements the C kernels split over threads, by the wait policy).
`import fp8lab` calls apply() before it imports torch; setup()
and `python -m fp8lab doctor` print decision().line(); `fp8lab lab` puts environment() into its server's
environment, so that every kernel it starts has the policy whatever the kernel imports first.

What is decided, and why (docs/performance.md measures each part):
- The CPUs: those of the affinity mask (os.sched_getaffinity), capped by a CPU quota (cgroup v2
  `cpu.max`, cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the process's own cgroup and its
  parents), rounded down, at least one. torch sizes its pool from the CPUs it sees, not from a quota:
  in a 1-CPU container on a 64-core node every kernel would start 64 threads.
- torch's intra-op threads (and the C kernels', which run on torch's OpenMP): that many, where the
  quota is below the cores (OMP_NUM_THREADS, set before torch loads; torch.set_num_threads where
  torch was imported first). Without a quota torch's own choice stands.
- OpenMP's wait policy: PASSIVE (OMP_WAIT_POLICY). OpenMP threads otherwise spin at every barrier
  while their partner core runs another program: on a shared machine a notebook then takes many
  times its share. libgomp reads the policy once, when torch loads it: after `import torch` it
  stays as read, and the decision says so instead of pretending.
- A user's setting always wins: OMP_NUM_THREADS, OMP_WAIT_POLICY or GOMP_SPINCOUNT in the
  environment, or a torch.set_num_threads call made before fp8lab was imported (seen as a thread
  count that is neither torch's default for these CPUs nor fp8lab's). FP8LAB_THREADS_SET names the
  variables fp8lab itself put in the environment, so that a process started from this one (a kernel
  of `fp8lab lab`, a torchrun worker) decides them again instead of taking them for the user's.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "PARALLEL_MIN_PASSIVE", "PARALLEL_MIN_SPINNING", "QUOTA_FILES", "Decision", "affinity_cpus",
           "apply", "cpu_quota", "decide", "decision", "environment", "own_cgroups", "parallel_min", "physical_cores"]

MARKER = "FP8LAB_THREADS_SET"  # the variables fp8lab put in the environment (comma-separated)
PASSIVE = "PASSIVE"
# where the quota lives: cgroup v2 (one file, "max 100000" or "quota period") and v1 (two files), under
# the controller's mount point; the process's own cgroup is read from /proc/self/cgroup
QUOTA_FILES = {
    "v2": ("sys/fs/cgroup", "sys/fs/cgroup/unified"),
    "v1": ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu", "sys/fs/cgroup/cpuacct,cpu"),
}


# ---- reading the machine: every reader takes the root folder, so tests plant their own files ------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def own_cgroups(root: str | os.PathLike = "/") -> dict[str, str]:
    """{"v2": path} and/or {"v1": path} from /proc/self/cgroup (v1: the hierarchy holding the cpu controller)."""
    out: dict[str, str] = {}
    for line in (_read(Path(root) / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            out["v2"] = path
        elif "cpu" in controllers.split(","):
            out["v1"] = path
    return out


def _levels(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder under `mount` and each parent up to the mount itself (a namespaced container
    sees its own cgroup at the mount's root: folders that do not exist are skipped)."""
    parts = [p for p in path.split("/") if p]
    return [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cpu_quota(root: str | os.PathLike = "/") -> tuple[float | None, str]:
    """(CPUs the cgroup quota allows, where that was read), or (None, "no CPU quota"); the smallest
    quota of the process's cgroup and its parents, v2 or v1."""
    root = Path(root)
    own = own_cgroups(root)
    found: list[tuple[float, str]] = []
    for mount_name in QUOTA_FILES["v2"]:
        mount = root / mount_name
        for folder in _levels(mount, own.get("v2", "/")):
            text = _read(folder / "cpu.max")
            if text is None:
                continue
            fields = text.split()
            if len(fields) == 2 and fields[0] != "max":
                try:
                    quota, period = int(fields[0]), int(fields[1])
                except ValueError:
                    continue
                if quota > 0 and period > 0:
                    found.append((quota / period, f"cgroup cpu.max {quota}/{period}"))
    for mount_name in QUOTA_FILES["v1"]:
        mount = root / mount_name
        for folder in _levels(mount, own.get("v1", "/")):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            try:
                q, p = int(quota or ""), int(period or "")
            except ValueError:
                continue
            if q > 0 and p > 0:  # -1: no quota
                found.append((q / p, f"cgroup v1 cpu.cfs_quota_us/cfs_period_us {q}/{p}"))
    if not found:
        return None, "no CPU quota"
    return min(found)


def affinity_cpus() -> set[int]:
    """The CPUs this process may run on (os.sched_getaffinity; all of os.cpu_count() where there is none)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int], root: str | os.PathLike = "/") -> int:
    """How many physical cores `cpus` sit on (sysfs topology; len(cpus) where it cannot be read): torch's
    math library sizes its default pool by physical cores."""
    cores = set()
    for cpu in cpus:
        topology = Path(root) / f"sys/devices/system/cpu/cpu{cpu}/topology"
        core, package = _read(topology / "core_id"), _read(topology / "physical_package_id")
        if core is None or package is None:
            return len(cpus)
        cores.add((package, core))
    return len(cores) or len(cpus)


# ---- the decision ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What fp8lab decided for this process's threads, and why.

    Parameters
    ----------
    cores: CPUs in the affinity mask.
    quota: CPUs the cgroup quota allows (None: no quota); quota_source: where it was read.
    cpus: the CPUs fp8lab may use: min(cores, floor(quota)), at least 1.
    threads: torch's intra-op threads (also the C kernels'); threads_by: who chose them.
    wait_policy: OpenMP's wait policy in force ("PASSIVE", the user's value, or "libgomp's default");
    wait_by: who chose it.
    variables: the environment variables fp8lab set (name -> value).
    late: torch was imported before fp8lab, so OpenMP had read its environment already.
    """

    cores: int
    quota: float | None
    quota_source: str
    cpus: int
    threads: int
    threads_by: str
    wait_policy: str
    wait_by: str
    variables: tuple[tuple[str, str], ...] = ()
    late: bool = False

    def line(self) -> str:
        """One line for setup() and doctor: "threads: 1 of 2 cores (cgroup cpu.max 100000/100000), set by
        fp8lab; OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, set by fp8lab)"."""
        where = f"{self.quota_source}" if self.quota is not None else "no CPU quota"
        threads = f"threads: {self.threads} of {self.cores} cores ({where}), {self.threads_by}"
        if self.wait_policy == PASSIVE:
            wait = f"OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, {self.wait_by})"
        else:
            wait = f"OpenMP wait policy {self.wait_policy} ({self.wait_by})"
        return f"{threads}; {wait}"


def _positive_int(text: str | None) -> int | None:
    try:
        value = int((text or "").split(",")[0])
    except ValueError:
        return None
    return value if value > 0 else None


def decide(environ: dict[str, str], cores: int, quota: float | None, quota_source: str, torch_imported: bool,
           torch_threads: int | None = None, torch_defaults: frozenset[int] = frozenset()) -> Decision:
    """The policy as a pure function of what the process sees.

    environ: the environment (OMP_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT, FP8LAB_THREADS_SET);
    cores: CPUs in the affinity mask; quota, quota_source: cpu_quota()'s; torch_imported: whether torch
    (and with it OpenMP) is loaded already; torch_threads: torch.get_num_threads() then; torch_defaults:
    the counts torch picks by itself here (the CPUs, their physical cores)."""
    ours = set(filter(None, environ.get(MARKER, "").split(",")))
    cpus = max(1, min(cores, math.floor(quota + 1e-9))) if quota is not None else cores
    variables: dict[str, str] = {}

    in_env = _positive_int(environ.get("OMP_NUM_THREADS"))
    if in_env is not None and "OMP_NUM_THREADS" not in ours:
        threads, threads_by = in_env, "yours (OMP_NUM_THREADS)"
    elif torch_imported and torch_threads is not None and torch_threads not in torch_defaults | {cpus, in_env}:
        threads, threads_by = torch_threads, "yours (torch.set_num_threads before fp8lab was imported)"
    elif cpus < cores:
        threads, threads_by = cpus, "set by fp8lab to the CPU quota"
        if not torch_imported:
            variables["OMP_NUM_THREADS"] = str(cpus)
    elif in_env is not None:  # fp8lab's, from the process that started this one (a torchrun worker's 1)
        threads, threads_by = in_env, "OMP_NUM_THREADS from the process that started this one"
    else:
        threads = cpus if torch_threads is None else torch_threads
        threads_by = "torch's default"

    user_wait = next((f"{k}={environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                      if k in environ and k not in ours), None)
    if user_wait is not None:
        policy = environ.get("OMP_WAIT_POLICY", "").upper() or f"spin count {environ.get('GOMP_SPINCOUNT')}"
        wait_by = f"yours ({user_wait})"
    elif "OMP_WAIT_POLICY" in ours and environ.get("OMP_WAIT_POLICY", "").upper() == PASSIVE:
        policy, wait_by = PASSIVE, "set by fp8lab before this process started"
    elif torch_imported:
        policy = "libgomp's default (spin, then sleep)"
        wait_by = ("too late to change: torch was imported before fp8lab; import fp8lab first, or set "
                   "OMP_WAIT_POLICY=PASSIVE before starting Python")
    else:
        policy, wait_by = PASSIVE, "set by fp8lab"
        variables["OMP_WAIT_POLICY"] = PASSIVE
    return Decision(cores, quota, quota_source, cpus, threads, threads_by, policy, wait_by,
                    tuple(sorted(variables.items())), late=torch_imported)


def environment(base: dict[str, str] | None = None, root: str | os.PathLike = "/",
                cores: int | None = None) -> dict[str, str]:
    """The variables the policy adds to `base` (default os.environ) for a process that starts afresh (a
    Jupyter server's kernels): {name: value}, with FP8LAB_THREADS_SET naming them; {} where the user
    set them all. cores: the CPUs of the affinity mask (default: this process's)."""
    base = dict(os.environ if base is None else base)
    quota, source = cpu_quota(root)
    cores = len(affinity_cpus()) if cores is None else cores
    chosen = decide(base, cores, quota, source, torch_imported=False)
    variables = dict(chosen.variables)
    if variables:
        ours = set(filter(None, base.get(MARKER, "").split(","))) | set(variables)
        variables[MARKER] = ",".join(sorted(ours))
    return variables


_DECIDED: list[Decision] = []


def apply(root: str | os.PathLike = "/") -> Decision:
    """Decide once per process and act: before torch is imported, put the variables in os.environ
    (libgomp and MKL read them when torch loads them); after, size torch's pool with
    torch.set_num_threads where the quota asks for fewer threads (the wait policy cannot change then).
    Later calls return the first decision."""
    if _DECIDED:
        return _DECIDED[0]
    torch_imported = "torch" in sys.modules
    cpus = affinity_cpus()
    quota, source = cpu_quota(root)
    current = defaults = None
    if torch_imported:
        import torch

        current = torch.get_num_threads()
        defaults = frozenset({len(cpus), physical_cores(cpus, root)})
    chosen = decide(dict(os.environ), len(cpus), quota, source, torch_imported, current, defaults or frozenset())
    if chosen.variables:
        os.environ.update(chosen.variables)
        ours = set(filter(None, os.environ.get(MARKER, "").split(","))) | {k for k, _ in chosen.variables}
        os.environ[MARKER] = ",".join(sorted(ours))
    if torch_imported and chosen.threads != current:
        import torch

        torch.set_num_threads(chosen.threads)
    _DECIDED.append(chosen)
    return chosen


def decision() -> Decision:
    """The decision apply() made for this process (apply() now, if it has not run)."""
    return _DECIDED[0] if _DECIDED else apply()


# The fewest elements the kernels split over OpenMP's threads. Waiting passively (fp8lab's policy), the threads
# sleep after each parallel region and the next one wakes them first: on a 2-core KVM guest that cost ~100 us a
# region (quantizing 65536 elements back to back: 35 us on one thread, 149 us on two; 2^21: 1109 and 782 us), and
# bench train's steps were fastest splitting from 2^18 (2^15, 2^17, 2^18, 2^19, 2^20 tried: docs/performance.md).
# Spinning, they are awake (65536 elements: 44 us on one thread, 32 us on two).
PARALLEL_MIN_PASSIVE, PARALLEL_MIN_SPINNING = 1 << 18, 1 << 15


def parallel_min(wait_policy: str | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The fewest elements the kernels split over OpenMP's threads: FP8LAB_PARALLEL_MIN where set in `environ`
    (os.environ by default; a positive integer), else PARALLEL_MIN_PASSIVE where OpenMP waits passively
    (`wait_policy`, decision()'s by default), else PARALLEL_MIN_SPINNING. fp8lab.numerics.kernels gives it to its
    library; the bits are the same for any split."""
    environ = os.environ if environ is None else environ
    wait_policy = decision().wait_policy if wait_policy is None else wait_policy
    given = environ.get("FP8LAB_PARALLEL_MIN")
    if given is not None:
        if not given.strip().isdigit() or int(given) < 1:
            raise ValueError(f"FP8LAB_PARALLEL_MIN must be a positive integer (elements), got {given!r}")
        return int(given)
    return PARALLEL_MIN_PASSIVE if wait_policy == PASSIVE else PARALLEL_MIN_SPINNING
