"""fp8lab.bench.kernelrun: the environment a kernel gets for each start way, the kernelspec it is started
from, and how a runner's output is read (a stand-in runner process; no notebook runs here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.bench import kernelrun
from fp8lab.threads import MARKER


def test_a_jupyter_kernel_gets_a_learners_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(MARKER, "OMP_WAIT_POLICY,FP8LAB_TEST_VAR")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # set by this process's fp8lab: not the learner's
    monkeypatch.setenv("FP8LAB_TEST_VAR", "x")
    monkeypatch.setenv("FP8LAB_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = kernelrun.kernel_environment("jupyter", tmp_path)
    for name in (MARKER, "OMP_WAIT_POLICY", "FP8LAB_TEST_VAR", "FP8LAB_SMOKE"):
        assert name not in env
    assert env["PYTHONPATH"].split(":") == [str(tmp_path), "/elsewhere"]
    with pytest.raises(ValueError, match="unknown start way"):
        kernelrun.kernel_environment("vscode", tmp_path)


def test_the_kernelspec_enters_the_cgroup_first():
    plain = json.loads((Path(kernelrun._kernel_spec_dir(None)) / "kernels/python3/kernel.json").read_text())
    assert plain["argv"] == [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    grouped = json.loads((Path(kernelrun._kernel_spec_dir("/sys/fs/cgroup/x/cgroup.procs"))
                          / "kernels/python3/kernel.json").read_text())
    assert grouped["argv"][:4] == [sys.executable, "-c", kernelrun.ENTER_CGROUP, "/sys/fs/cgroup/x/cgroup.procs"]
    assert grouped["argv"][4:] == plain["argv"]


def _runner(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_finish_reads_the_last_result_line_or_says_what_went_wrong():
    ok = _runner("print('noise'); print('RESULT {\"seconds\": 1}'); print('RESULT {\"seconds\": 2.5}')")
    assert kernelrun.finish(ok, 60) == {"seconds": 2.5}
    failed = _runner("import sys; sys.stderr.write('boom'); sys.exit(3)")
    assert kernelrun.finish(failed, 60) == {"error": "the runner exited 3: boom"}


def test_the_probe_reports_the_kernels_own_peak_not_the_large_process_that_started_it():
    """bench load's and bench room's probe (run in each kernel after its notebook) reports the kernel's own peak
    memory: getrusage's ru_maxrss, which survives fork and exec, would report a large parent's (a gigabyte held
    here), and bench room's memory check would refuse a room that fits."""
    import torch

    held = torch.ones(2**28)  # 1 GiB, touched
    # preexec_fn makes Python fork (not vfork or posix_spawn), as jupyter_client's kernel launch can
    r = subprocess.run([sys.executable, "-c", kernelrun.PROBE], capture_output=True, text=True, check=True,
                       preexec_fn=lambda: None)
    del held
    line = next(x for x in r.stdout.splitlines() if x.startswith("PROBE "))
    assert 1 < json.loads(line[len("PROBE "):])["peak_mb"] < 512, line
