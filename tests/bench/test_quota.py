"""`bench NAME --quota 0.5` (fp8lab/bench/quota.py, the options in fp8lab/bench/__init__.py): a slower machine on
demand. Bad options exit 2 with the usage line; where no quota can be made (not root, cgroup v2 only, no cpu
controller) the command says why and what to do, exit 2, no traceback; where it can, the child runs in a cgroup
with the quota and period asked for, the table says so, and the group (with anything left running in it) is gone
afterwards. No test judges a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fp8lab.bench import main as bench_main
from fp8lab.bench import quota as quota_module
from fp8lab.bench.quota import (
    DEFAULT_PERIOD_MS,
    QUOTA_BENCHES,
    QuotaUnavailable,
    check_host,
    quota_problem,
    run_in_quota,
)

REPO = Path(__file__).resolve().parents[2]
V1 = Path("/sys/fs/cgroup/cpu")


def _no_v1_quota() -> str:
    """Why this machine cannot make a cgroup v1 CPU quota ("" where it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "making a cgroup needs root"
    try:
        check_host()
    except QuotaUnavailable as err:
        return str(err)
    return ""


needs_v1 = pytest.mark.skipif(bool(_no_v1_quota()), reason=f"no cgroup v1 CPU quota here: {_no_v1_quota()}")


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        bench_main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m fp8lab bench"), err
    return err


def test_bad_quota_options_exit_2_with_the_usage_line(capsys):
    assert "positive number of CPUs" in _usage_error(capsys, "widgets", "--quota", "0")
    assert "positive number of CPUs" in _usage_error(capsys, "widgets", "--quota", "-1")
    assert "more than this machine's" in _usage_error(capsys, "widgets", "--quota", str((os.cpu_count() or 1) + 1))
    assert "--period-ms must be from 1 to 1000" in _usage_error(capsys, "widgets", "--quota", "0.5", "--period-ms",
                                                                "0.5")
    assert "smallest quota of 1 ms" in _usage_error(capsys, "widgets", "--quota", "0.05")
    assert "--period-ms goes with --quota" in _usage_error(capsys, "widgets", "--period-ms", "10")
    err = _usage_error(capsys, "load", "--quota", "0.5")
    assert "not 'load'" in err and "widgets" in err
    assert "unknown panels ['nope']; valid: timing, bits" in _usage_error(capsys, "widgets", "--only", "nope")
    assert "unknown models ['mlp']; valid: unseen_mlp, lesson_mlp, llm_like" in _usage_error(
        capsys, "train", "--only", "mlp")
    assert quota_problem(0.5, DEFAULT_PERIOD_MS) is None and quota_problem(0.1, 10) is None
    assert {"widgets", "notebooks", "train", "gemm"} <= set(QUOTA_BENCHES)
    assert not {"load", "room", "threads", "gpu"} & set(QUOTA_BENCHES)


def test_the_command_line_refuses_bad_options_from_a_shell():
    r = subprocess.run([sys.executable, "-m", "fp8lab", "bench", "widgets", "--quota", "0"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("usage: python -m fp8lab bench"), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("host", ["not root", "cgroup v2 only", "no cpu controller", "read-only cgroups"])
def test_where_no_quota_can_be_made_it_says_why_and_what_to_do(monkeypatch, capsys, host):
    monkeypatch.setattr(quota_module.os, "geteuid", lambda: 1000 if host == "not root" else 0)
    if host == "cgroup v2 only":
        monkeypatch.setattr(quota_module, "cpu_controller", lambda: ("v2", Path("/sys/fs/cgroup")))
    elif host == "no cpu controller":
        def none():
            raise OSError("no cgroup CPU controller for this process under /sys/fs/cgroup")
        monkeypatch.setattr(quota_module, "cpu_controller", none)
    elif host == "read-only cgroups":  # root and cgroup v1, but the mount refuses a new folder (a container)
        class ReadOnly:
            def __init__(self, *args) -> None:
                pass

            def __enter__(self):
                raise PermissionError(30, "Read-only file system", "/sys/fs/cgroup/cpu/fp8lab-quota-1")

        monkeypatch.setattr(quota_module, "cpu_controller", lambda: ("v1", Path("/sys/fs/cgroup/cpu")))
        monkeypatch.setattr(quota_module, "CpuQuota", ReadOnly)
    started = []
    monkeypatch.setattr(quota_module.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert bench_main(["widgets", "--quota", "0.5"]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err and started == [] and "in the cgroup" not in out.out
    said = {"not root": "needs root (this process runs as uid 1000): run it with sudo",
            "cgroup v2 only": "this machine has cgroup v2 only",
            "no cpu controller": "needs a cgroup v1 cpu controller: no cgroup CPU controller",
            "read-only cgroups": "could not make the quota's cgroup"}[host]
    assert said in out.err, out.err
    assert "systemd-run --scope -p CPUQuota=50% -p CPUQuotaPeriodSec=10ms" in out.err  # what to do instead


REPORT = """\
import json, os, signal, sys
from pathlib import Path
cpu = [x.split(":", 2)[2] for x in Path("/proc/self/cgroup").read_text().splitlines()
       if "cpu" in x.split(":", 2)[1].split(",")][0]
folder = Path("/sys/fs/cgroup/cpu") / cpu.lstrip("/")
print(json.dumps({"pid": os.getpid(), "cgroup": cpu, "folder": str(folder),
                  "quota_us": int((folder / "cpu.cfs_quota_us").read_text()),
                  "period_us": int((folder / "cpu.cfs_period_us").read_text()),
                  "ignores_ctrl_c": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}), flush=True)
"""


def _run_reporting(cpus: float, period_ms: float, extra: str = "") -> tuple[int, dict]:
    out = Path(tempfile.gettempdir()) / f"fp8lab-quota-test-{os.getpid()}.json"
    code = REPORT.replace("flush=True)", f"flush=True, file=open({str(out)!r}, 'w'))") + extra
    status = run_in_quota([sys.executable, "-c", code], cpus, period_ms, env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads(out.read_text())
    out.unlink()
    return status, report


@needs_v1
def test_the_child_runs_in_a_group_with_the_quota_and_period_asked_for_which_goes_away_after():
    status, report = _run_reporting(0.5, 10)
    assert status == 0
    assert report["cgroup"].endswith(f"/fp8lab-quota-{os.getpid()}"), report  # the child itself, from /proc/self/cgroup
    assert (report["quota_us"], report["period_us"]) == (5000, 10000), report
    assert report["ignores_ctrl_c"]  # Ctrl-C is the parent's to handle: it ends the child and removes the group
    assert not Path(report["folder"]).exists(), "the quota's cgroup was left behind"
    status, report = _run_reporting(0.25, 40, "sys.exit(3)")
    assert status == 3 and (report["quota_us"], report["period_us"]) == (10000, 40000)
    assert not Path(report["folder"]).exists()


@needs_v1
def test_what_the_child_leaves_running_in_the_group_is_ended_and_the_group_removed():
    marker = Path(tempfile.gettempdir()) / f"fp8lab-quota-left-{os.getpid()}"
    leave = ("import subprocess; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
             "start_new_session=True); open(" + repr(str(marker)) + ", 'w').write(str(p.pid))")
    status, report = _run_reporting(0.5, 10, leave)
    left = int(marker.read_text())
    marker.unlink()
    try:
        assert status == 0 and not Path(report["folder"]).exists()
        for _ in range(50):  # reaped by init once killed
            if not Path(f"/proc/{left}").exists() or "Z" in Path(f"/proc/{left}/stat").read_text().split()[2]:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the child's own child {left} still runs")
    finally:  # where it failed: end this test's own sleeper and its group, so that nothing is left behind
        if Path(f"/proc/{left}").exists():
            os.kill(left, signal.SIGKILL)
            time.sleep(0.5)
        if Path(report["folder"]).exists():
            Path(report["folder"]).rmdir()


@needs_v1
def test_bench_in_a_quota_names_the_quota_and_the_reference_speed_in_its_table():
    r = subprocess.run([sys.executable, "-m", "fp8lab", "bench", "quantize", "--size", "64", "--rounds", "1",
                        "--quota", "0.5", "--period-ms", "20"], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    said = next(x for x in r.stdout.splitlines() if x.startswith("bench: in the cgroup "))
    folder = Path(said.split()[4])
    assert str(folder).startswith(str(V1) + "/") and folder.name.startswith("fp8lab-quota-"), said
    assert said.endswith("with a CPU quota of 0.5 CPU (10 ms in every 20 ms)"), said
    line = next(x for x in r.stdout.splitlines() if "reference: fp32 2048^3 mm" in x)
    assert "in a CPU quota of 0.5 CPU (cgroup v1 cpu.cfs_quota_us/cfs_period_us 10000/20000)" in line, line
    assert ", 1 threads," in line  # fp8lab sized torch's threads to the quota
    assert not folder.exists(), "the quota's cgroup was left behind"
