"""The thread policy (fp8lab.threads): planted cgroup files and affinities decide as its docstring says, a
user's setting always wins, and what `import fp8lab` does in a real process (torch imported after it, or
before it; OMP_NUM_THREADS set; a real 1-CPU cgroup where this machine lets root make one).

Every reader takes a root folder: the tests plant /proc/self/cgroup and the cgroup files under tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab import threads
from fp8lab.threads import MARKER, cpu_quota, decide, environment, physical_cores

REPO = Path(__file__).resolve().parents[1]


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V2_POD = "0::/kubepods/pod1/c1\n"
V1_DOCKER = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"


# ---- reading the quota ------------------------------------------------------------------------------------------


def test_cgroup_v2_cpu_max_of_the_process_cgroup(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": V2_POD,
                             "sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "100000 100000\n",
                             "sys/fs/cgroup/kubepods/pod1/cpu.max": "max 100000\n"})
    assert cpu_quota(root) == (1.0, "cgroup cpu.max 100000/100000")


def test_cgroup_v2_unlimited_and_garbage_mean_no_quota(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": V2_POD, "sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "max 100000\n",
                             "sys/fs/cgroup/kubepods/cpu.max": "lots 100000\n"})
    assert cpu_quota(root) == (None, "no CPU quota")
    assert cpu_quota(tmp_path / "nothing-here") == (None, "no CPU quota")


def test_a_parents_smaller_quota_limits_the_child(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": V2_POD,
                             "sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "400000 100000",
                             "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000"})
    assert cpu_quota(root) == (1.5, "cgroup cpu.max 150000/100000")


def test_a_namespaced_container_reads_the_mounts_root(tmp_path):
    """Inside a cgroup namespace /proc/self/cgroup says "/" and the container's own cgroup is the mount."""
    root = _plant(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "200000 100000"})
    assert cpu_quota(root) == (2.0, "cgroup cpu.max 200000/100000")


def test_cgroup_v1_quota_and_period(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": V1_DOCKER,
                             "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                             "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(root) == (0.5, "cgroup v1 cpu.cfs_quota_us/cfs_period_us 50000/100000")
    (root / "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert cpu_quota(root)[0] is None


def test_cgroup_v1_where_the_mount_root_is_the_containers_cgroup(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": V1_DOCKER, "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000",
                             "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"})
    assert cpu_quota(root) == (1.0, "cgroup v1 cpu.cfs_quota_us/cfs_period_us 100000/100000")


def test_physical_cores_from_the_topology(tmp_path):
    files = {}
    for cpu, core in enumerate((0, 0, 1, 1)):  # two hyperthreads per core
        files[f"sys/devices/system/cpu/cpu{cpu}/topology/core_id"] = str(core)
        files[f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"] = "0"
    root = _plant(tmp_path, files)
    assert physical_cores({0, 1, 2, 3}, root) == 2
    assert physical_cores({0, 2}, root) == 2 and physical_cores({0, 1}, root) == 1
    assert physical_cores({0, 7}, root) == 2  # unreadable: the CPUs themselves


# ---- the decision -------------------------------------------------------------------------------------------------


def test_a_one_cpu_quota_on_a_big_node_gives_one_thread_and_passive_waits():
    d = decide({}, cores=64, quota=1.0, quota_source="cgroup cpu.max 100000/100000", torch_imported=False)
    assert (d.cpus, d.threads) == (1, 1)
    assert dict(d.variables) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert d.line() == ("threads: 1 of 64 cores (cgroup cpu.max 100000/100000), set by fp8lab to the CPU quota; "
                        "OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, set by fp8lab)")


def test_a_fractional_quota_rounds_down_and_never_below_one():
    assert decide({}, 8, 2.5, "q", False).threads == 2
    assert decide({}, 8, 0.2, "q", False).threads == 1
    assert decide({}, 2, 4.0, "q", False).threads == 2  # a quota above the affinity: the affinity
    assert "OMP_NUM_THREADS" not in dict(decide({}, 2, 4.0, "q", False).variables)


def test_without_a_quota_torch_keeps_its_own_count_and_only_the_wait_policy_is_set():
    d = decide({}, cores=2, quota=None, quota_source="no CPU quota", torch_imported=False)
    assert d.threads == 2 and d.threads_by == "torch's default"
    assert dict(d.variables) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert d.line().startswith("threads: 2 of 2 cores (no CPU quota), torch's default; OpenMP waits passively")


def test_the_affinity_sets_the_cores():
    assert decide({}, cores=1, quota=None, quota_source="no CPU quota", torch_imported=False).threads == 1
    assert decide({}, cores=3, quota=2.0, quota_source="q", torch_imported=False).threads == 2


@pytest.mark.parametrize("environ,threads_by,wait_by", [
    ({"OMP_NUM_THREADS": "3"}, "yours (OMP_NUM_THREADS)", "set by fp8lab"),
    ({"OMP_NUM_THREADS": "2,1"}, "yours (OMP_NUM_THREADS)", "set by fp8lab"),
    ({"OMP_WAIT_POLICY": "active"}, "set by fp8lab to the CPU quota", "yours (OMP_WAIT_POLICY=active)"),
    ({"GOMP_SPINCOUNT": "10000"}, "set by fp8lab to the CPU quota", "yours (GOMP_SPINCOUNT=10000)"),
])
def test_the_users_environment_wins(environ, threads_by, wait_by):
    d = decide(environ, cores=4, quota=1.0, quota_source="q", torch_imported=False)
    assert d.threads_by == threads_by and d.wait_by == wait_by
    for name in environ:
        assert name not in dict(d.variables), f"fp8lab would overwrite the user's {name}"
    if "OMP_NUM_THREADS" in environ:
        assert d.threads == int(environ["OMP_NUM_THREADS"].split(",")[0])


def test_a_users_torch_set_num_threads_before_fp8lab_wins_and_the_late_wait_policy_is_said():
    d = decide({}, cores=2, quota=1.0, quota_source="q", torch_imported=True, torch_threads=3,
               torch_defaults=frozenset({2}))
    assert d.threads == 3 and d.threads_by == "yours (torch.set_num_threads before fp8lab was imported)"
    assert d.variables == () and d.late
    assert "too late to change: torch was imported before fp8lab" in d.line()
    # torch's own default count: not the user's, so the quota applies (through torch.set_num_threads)
    d = decide({}, cores=2, quota=1.0, quota_source="q", torch_imported=True, torch_threads=2,
               torch_defaults=frozenset({2}))
    assert d.threads == 1 and d.variables == ()


def test_variables_fp8lab_set_in_a_parent_are_decided_again_not_taken_for_the_users():
    inherited = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", MARKER: "OMP_NUM_THREADS,OMP_WAIT_POLICY"}
    d = decide(inherited, cores=4, quota=2.0, quota_source="q", torch_imported=False)
    assert d.threads == 2 and dict(d.variables)["OMP_NUM_THREADS"] == "2"
    assert d.wait_by == "set by fp8lab before this process started"
    # a torchrun worker: its launcher set OMP_NUM_THREADS=1 for it, no quota here: that count is in force
    d = decide(inherited, cores=2, quota=None, quota_source="no CPU quota", torch_imported=False)
    assert d.threads == 1 and d.threads_by == "OMP_NUM_THREADS from the process that started this one"


def test_the_environment_a_lab_server_gets(tmp_path):
    root = _plant(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "100000 100000"})
    env = environment({}, root, cores=4)
    assert env == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", MARKER: "OMP_NUM_THREADS,OMP_WAIT_POLICY"}
    assert environment({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}, root, cores=4) == {}
    from fp8lab.lab.launcher import lab_environment

    served = lab_environment("token", {"PATH": "/bin"})
    assert served["OMP_WAIT_POLICY"] == "PASSIVE" and "OMP_WAIT_POLICY" in served[MARKER].split(",")
    assert lab_environment("token", {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


# ---- in real processes --------------------------------------------------------------------------------------------

PROBE = """
import json, os, sys
{before}
import fp8lab, torch
from fp8lab import threads
d = threads.decision()
print(json.dumps({{"threads": torch.get_num_threads(), "line": d.line(), "late": d.late,
                  "wait": os.environ.get("OMP_WAIT_POLICY"), "status": fp8lab.status_line()}}))
"""


def _probe(before: str = "", env: dict | None = None, prefix: tuple[str, ...] = ()) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                               MARKER)}
    r = subprocess.run([*prefix, sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True,
                       env={**base, "PYTHONPATH": str(REPO), **(env or {})}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_fp8lab_first_sets_the_wait_policy_before_openmp_loads():
    out = _probe()
    assert out["wait"] == "PASSIVE" and not out["late"]
    assert "OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, set by fp8lab)" in out["line"]
    assert out["status"].splitlines()[-1] == out["line"]  # setup()'s status line says it too


def test_torch_imported_first_is_said_and_a_users_thread_count_wins():
    out = _probe("import torch; torch.set_num_threads(1)")
    assert out["late"] and out["threads"] == 1
    assert "yours (torch.set_num_threads before fp8lab was imported)" in out["line"]
    assert "too late to change: torch was imported before fp8lab" in out["line"]


def test_omp_num_threads_in_the_environment_wins():
    out = _probe(env={"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"})
    assert out["threads"] == 1 and "yours (OMP_NUM_THREADS)" in out["line"]
    assert out["wait"] == "ACTIVE" and "yours (OMP_WAIT_POLICY=ACTIVE)" in out["line"]


def _v1_cpu() -> Path | None:
    folder = Path("/sys/fs/cgroup/cpu")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and (folder / "cpu.cfs_quota_us").exists():
        return folder
    return None


@pytest.mark.skipif(_v1_cpu() is None, reason="needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: a quota of 1 must change something")
def test_a_real_one_cpu_cgroup_gives_one_thread(tmp_path):
    group = _v1_cpu() / f"fp8lab-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
        enter = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                 "os.execv(sys.argv[2], sys.argv[2:])")
        out = _probe(prefix=(sys.executable, "-c", enter, str(group / "cgroup.procs")))
        assert out["threads"] == 1
        assert out["line"].startswith("threads: 1 of")
        assert "cgroup v1 cpu.cfs_quota_us/cfs_period_us 100000/100000" in out["line"]
        late = _probe("import torch", prefix=(sys.executable, "-c", enter, str(group / "cgroup.procs")))
        assert late["threads"] == 1 and late["late"]  # sized with torch.set_num_threads after the fact
    finally:
        group.rmdir()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell 1 thread from the default")
def test_the_c_kernels_in_a_new_thread_use_torchs_count_not_openmps_default():
    code = """
import ctypes, threading, torch, fp8lab
from fp8lab.numerics import kernels
torch.set_num_threads(1)
gomp = next((ctypes.CDLL(l.split()[-1]) for l in open("/proc/self/maps") if "libgomp" in l), None)
seen = []
x = torch.randn(512, 512)  # made here: the new thread runs no torch operation before the kernels
def work():
    fp8lab.quantize(x, fp8lab.E4M3, fp8lab.PerBlock(1, 128))
    seen.append(gomp.omp_get_max_threads() if gomp else 1)
t = threading.Thread(target=work); t.start(); t.join()
print(kernels.status()[0], seen[0])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    on, seen = r.stdout.split()
    if on != "True":
        pytest.skip("the CPU kernels are off here")
    assert seen == "1", "a kernel call in a new thread ran with OpenMP's default count, not torch's"


def test_apply_decides_once():
    assert threads.apply() is threads.decision() is threads.apply()


# ---- what `import fp8lab` changes: exactly what fp8lab/__init__.py's docstring and docs/internals.md say -------------

EFFECTS_PROBE = """
import gc, json, os, sys, warnings
def state():
    import torch
    return {"threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "dtype": str(torch.get_default_dtype()), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "matmul": torch.get_float32_matmul_precision(), "grad": torch.is_grad_enabled(),
            "frozen": gc.get_freeze_count(), "plots": "matplotlib" in sys.modules}
first = TORCH_FIRST
env_at_start, state_at_start = dict(os.environ), (state() if first else None)
import fp8lab
after_env = dict(os.environ)
print(json.dumps({"changed": {k: v for k, v in after_env.items() if env_at_start.get(k) != v},
                  "removed": sorted(set(env_at_start) - set(after_env)), "at_import": state_at_start, "after": state(),
                  "variables": dict(fp8lab.threads.decision().variables)}))
"""
# the variables `import fp8lab` may set, as its docstring's table lists them (TORCHINDUCTOR_CACHE_DIR is torch's own,
# set when torch's compiler loads)
DOCUMENTED = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "FP8LAB_THREADS_SET", "MKL_CBWR", "TORCHINDUCTOR_CACHE_DIR")


def _effects(torch_first: bool) -> dict:
    unset = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_CBWR", "TORCHINDUCTOR_CACHE_DIR", MARKER)
    base = {k: v for k, v in os.environ.items() if k not in unset}
    probe = EFFECTS_PROBE.replace("TORCH_FIRST", str(torch_first))
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env={**base, "PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _torch_default_threads() -> int:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_CBWR")}
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True,
                       text=True, env=base, timeout=300, check=True)
    return int(r.stdout.strip())


def test_import_fp8lab_changes_exactly_what_it_documents():
    """A fresh process with none of the variables set: `import fp8lab` sets the wait policy (and the thread count only
    under a quota), names them, pins MKL's reproducible mode, and changes no other variable and no torch setting."""
    out = _effects(torch_first=False)
    ours = out["variables"]
    assert ours.get("OMP_WAIT_POLICY") == "PASSIVE"
    expected = {**ours, MARKER: ",".join(sorted(ours)), "MKL_CBWR": "AUTO,STRICT"}
    changed = dict(out["changed"])
    assert changed.pop("TORCHINDUCTOR_CACHE_DIR", None) is not None  # torch's own, when its compiler loads
    assert changed == expected and not out["removed"]
    after = out["after"]
    threads = int(ours["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in ours else _torch_default_threads()
    assert after["threads"] == threads
    settings = ("dtype", "deterministic", "matmul", "grad", "frozen", "plots")
    assert [after[k] for k in settings] == ["torch.float32", False, "highest", True, 0, False]


def test_import_fp8lab_after_torch_changes_only_mkls_mode_and_nothing_of_torchs():
    """torch imported first: OpenMP has read its environment, so fp8lab sets none of its variables; without a quota
    below the cores torch's thread count stays; MKL's mode is still pinned (MKL reads it at its first GEMM)."""
    out = _effects(torch_first=True)
    changed = dict(out["changed"])
    changed.pop("TORCHINDUCTOR_CACHE_DIR", None)
    assert out["variables"] == {} and changed == {"MKL_CBWR": "AUTO,STRICT"} and not out["removed"]
    if threads.cpu_quota()[0] is None or threads.cpu_quota()[0] >= len(threads.affinity_cpus()):
        assert out["after"] == out["at_import"]


def test_the_documented_effects_are_the_docstring_and_the_docs():
    doc = Path(threads.__file__).with_name("__init__.py").read_text().split('"""')[1]
    internals = (REPO / "docs" / "internals.md").read_text()
    section = internals.split("## What importing fp8lab changes")[1].split("\n## ")[0]
    for name in (*DOCUMENTED, "torch.set_num_threads"):
        assert name in doc, f"fp8lab/__init__.py's docstring does not list {name}"
        assert name in section, f"docs/internals.md's table does not list {name}"
