"""The machinery of `bench load` and `bench room` (fp8lab/bench/load.py, room.py, kernelrun.py, drag.py): the
kernels start as each way says (the environment `fp8lab lab` gives, a plain one, torch imported first), a
CPU quota is a real cgroup that a kernel enters and leaves, the busy processes are another program's group
(or the kernel's own, for the shared condition), and a drag measures what it says. No test
judges a time: the benchmarks measure, docs/performance.md quotes them.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.bench import cgroups as cgroups_module
from fp8lab.bench.cgroups import CpuQuota, CpuWeight, autogroup, cpu_controller
from fp8lab.bench.drag import drag
from fp8lab.bench.kernelrun import START_WAYS, kernel_environment, run_in_subprocess, spec
from fp8lab.bench.load import CONDITIONS, Busy, groups, notebook_path
from fp8lab.threads import MARKER

REPO = Path(__file__).resolve().parents[2]


def test_each_start_way_gives_the_kernel_its_own_environment(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as this process's fp8lab set it
    monkeypatch.setenv(MARKER, "OMP_WAIT_POLICY")
    monkeypatch.setenv("FP8LAB_SMOKE", "1")
    lab = kernel_environment("lab", REPO)
    plain = kernel_environment("jupyter", REPO)
    assert lab["OMP_WAIT_POLICY"] == "PASSIVE" and "OMP_WAIT_POLICY" in lab[MARKER]
    assert "OMP_WAIT_POLICY" not in plain and MARKER not in plain, "fp8lab's own variables leaked into a plain start"
    assert "FP8LAB_SMOKE" not in lab and "FP8LAB_SMOKE" not in plain  # workshop size
    assert plain["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert kernel_environment("torch-first", REPO) == plain
    with pytest.raises(ValueError, match="valid: lab, jupyter, torch-first"):
        kernel_environment("colab", REPO)
    assert START_WAYS == ("lab", "jupyter", "torch-first")
    with pytest.raises(ValueError, match="no notebook 42"):
        notebook_path(REPO, "42")


def test_a_drag_reports_every_value_and_the_redraws_that_showed_them(monkeypatch):
    import fp8lab.lab.panels.base as base
    from fp8lab.lab.panels import PerTensorPanel

    monkeypatch.setattr(base, "draw_mode", lambda: "thread")
    panel = PerTensorPanel()
    out = drag(panel, "outliers", interval=0.005, sweeps=1)
    options = len(panel.controls["outliers"].options)
    assert out["changes"] == 2 * (options - 1)
    assert 1 <= out["redraws"] <= out["changes"]
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("median_ms", "p95_ms", "max_ms", "last_ms"))
    assert out["median_ms"] <= out["p95_ms"] <= out["max_ms"]
    assert panel.drawn_values["outliers"] == panel.controls["outliers"].value  # the last value is what is shown


def _cgroup_root() -> str | None:
    root = Path("/sys/fs/cgroup")
    v2 = root / "cgroup.controllers"
    usable = (v2.exists() and "cpu" in v2.read_text().split()) or (root / "cpu" / "cpu.cfs_quota_us").exists()
    return str(root) if usable and hasattr(os, "geteuid") and os.geteuid() == 0 else None


@pytest.mark.skipif(_cgroup_root() is None, reason="needs root and a cgroup CPU controller")
def test_a_cpu_quota_is_a_cgroup_a_process_enters_and_that_goes_away():
    code = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "from fp8lab.threads import cpu_quota; print(cpu_quota())")
    with CpuQuota(1.0) as quota:
        folder = Path(quota.procs).parent
        r = subprocess.run([sys.executable, "-c", code, quota.procs], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().startswith("(1.0, 'cgroup"), r.stdout
    assert not folder.exists(), "the benchmark's cgroup was left behind"
    if cpu_controller()[0] == "v1":
        home = cpu_controller()[1]
        with CpuWeight(8) as weight:
            assert cpu_controller()[1] == weight.group and (weight.group / "cpu.shares").read_text().strip() == "8192"
            with CpuQuota(1.0) as quota:  # nested in the weighted group: a kernel keeps the weight
                assert Path(quota.procs).parent.parent == weight.group
        assert cpu_controller()[1] == home and not weight.group.exists()


def _cgroup_of(pid: int) -> str:
    """The process's cgroup on the cpu controller (v1), or its v2 cgroup."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    v1 = [x.split(":", 2)[2] for x in lines if "cpu" in x.split(":", 2)[1].split(",")]
    return (v1 or [x.split(":", 2)[2] for x in lines if x.startswith("0::")])[0]


@pytest.mark.skipif(_cgroup_root() is None, reason="needs root and a cgroup CPU controller")
def test_busy_processes_are_another_programs_group_and_shared_puts_them_in_the_kernels():
    assert CONDITIONS == ("quiet", "busy", "shared", "quota")
    with groups("busy") as (kernel, others, how):
        assert kernel and others and kernel != others and "per group" in how
        with Busy(2, others) as spinners:
            assert all(_cgroup_of(p.pid).endswith("/" + Path(others).parent.name) for p in spinners)
        folders = [Path(kernel).parent, Path(others).parent]
        assert all(f.is_dir() and f.name.startswith("fp8lab-") for f in folders)
    assert not any(f.exists() for f in folders), "the benchmark's groups were left behind"
    with groups("shared") as (kernel, others, how):
        assert kernel == others and "per thread" in how
        with Busy(1, others) as spinners:
            assert _cgroup_of(spinners[0].pid).endswith("/" + Path(kernel).parent.name)
        folder = Path(kernel).parent
    assert not folder.exists()
    with pytest.raises(ValueError, match="busy, shared"):
        with groups("quota"):
            pass


def test_without_cgroups_busy_leaves_the_groups_to_autogroup_and_shared_says_it_cannot(monkeypatch, tmp_path):
    def refuse(*_):
        raise OSError("no cgroup CPU controller for this process")

    monkeypatch.setattr(cgroups_module, "cpu_controller", refuse)
    with groups("busy") as (kernel, others, how):
        assert kernel is None and others is None and "sessions of their own" in how and "no cgroup" in how
        assert ("autogroup schedules" in how) == autogroup()
        with Busy(1, others) as spinners:
            assert os.getsid(spinners[0].pid) == spinners[0].pid, "a spinner shares the benchmark's session"
    with pytest.raises(OSError, match="shared condition needs a cgroup"):
        with groups("shared"):
            pass
    planted = tmp_path / "proc/sys/kernel"
    planted.mkdir(parents=True)
    (planted / "sched_autogroup_enabled").write_text("1\n")
    assert autogroup(tmp_path)
    (planted / "sched_autogroup_enabled").write_text("0\n")
    assert not autogroup(tmp_path) and not autogroup(tmp_path / "nowhere")


@pytest.mark.slow
def test_a_kernel_started_torch_first_says_it_is_too_late_for_the_wait_policy():
    """A real run of notebook 00 in a kernel whose first cell imports torch: the kernel reports the thread line."""
    result = run_in_subprocess(spec(notebook_path(REPO, "00"), "torch-first", REPO, timeout=600))
    assert "error" not in result and result["errors"] == [], result
    assert result["omp_wait_policy"] is None and "too late to change" in result["threads"]
    assert result["run_all_s"] > result["kernel_start_s"] > 0 and result["peak_mb"] > 0
    lab = run_in_subprocess(spec(notebook_path(REPO, "00"), "lab", REPO, timeout=600))
    assert lab["omp_wait_policy"] == "PASSIVE" and "set by fp8lab before this process started" in lab["threads"]


@pytest.mark.slow
def test_bench_threads_runs_each_count_as_the_users_setting():
    """bench threads' candidates: OMP_NUM_THREADS as a user sets it, which fp8lab keeps."""
    from fp8lab.bench.threadcount import run

    assert run(1, 2)["threads"] == 1
    if len(os.sched_getaffinity(0)) >= 2:
        assert run(2, 2)["threads"] == 2
