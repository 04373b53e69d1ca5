"""fp8lab.bench.cgroups: which controller a process's /proc/self/cgroup and the mount say it has (a fake root),
and what the quota and weight groups write (into a folder standing for the cgroup; no root needed)."""

import os

import pytest

from fp8lab.bench import cgroups


def _root(tmp_path, proc_cgroup: str, files: dict[str, str]):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(proc_cgroup)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cpu_controller_v2_v1_and_none(tmp_path):
    v2 = _root(tmp_path / "a", "0::/user.slice/me\n", {"cgroup.controllers": "cpuset cpu io memory"})
    assert cgroups.cpu_controller(v2) == ("v2", v2 / "sys/fs/cgroup/user.slice/me")
    v1 = _root(tmp_path / "b", "4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n",
               {"cpu,cpuacct/cpu.cfs_quota_us": "-1"})
    assert cgroups.cpu_controller(v1) == ("v1", v1 / "sys/fs/cgroup/cpu,cpuacct/docker/abc")
    none = _root(tmp_path / "c", "0::/\n", {"cgroup.controllers": "memory io"})  # v2 without the cpu controller
    with pytest.raises(OSError, match="no cgroup CPU controller"):
        cgroups.cpu_controller(none)


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    removed = []
    monkeypatch.setattr(cgroups, "_remove", removed.append)
    return tmp_path, removed


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_quota_writes_cpus_times_the_period_and_is_removed(fake_cgroup, monkeypatch, version):
    home, removed = fake_cgroup
    monkeypatch.setattr(cgroups, "cpu_controller", lambda: (version, home))
    with cgroups.CpuQuota(0.5, period=10_000) as q:
        folder = home / f"fp8lab-quota-{os.getpid()}"
        assert q.folder == folder and q.procs == str(folder / "cgroup.procs") and q.quota == 5000
        if version == "v2":
            assert (folder / "cpu.max").read_text() == "5000 10000"
        else:
            assert (folder / "cpu.cfs_period_us").read_text() == "10000"
            assert (folder / "cpu.cfs_quota_us").read_text() == "5000"
    assert removed == [folder]


def test_a_failed_quota_removes_its_folder_and_a_weight_needs_v1(fake_cgroup, monkeypatch):
    home, removed = fake_cgroup
    monkeypatch.setattr(cgroups, "cpu_controller", lambda: ("v2", home))
    (home / f"fp8lab-quota-{os.getpid()}" / "cpu.max").mkdir(parents=True)  # writing it fails (a folder)
    monkeypatch.setattr(cgroups.Path, "mkdir", lambda self, *a, **k: None)
    with pytest.raises(OSError):
        cgroups.CpuQuota(1.0).__enter__()
    assert removed == [home / f"fp8lab-quota-{os.getpid()}"]
    with pytest.raises(OSError, match="cgroup v1"):
        cgroups.CpuWeight(8).__enter__()
