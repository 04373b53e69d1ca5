"""fp8lab.training.torchrun: the helpers run_distributed launches and watches torchrun with (the runs themselves are
tested with fp8lab.training.distributed). These are private to the module: tested here directly."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import deque

import pytest

from fp8lab.training import torchrun
from fp8lab.training.torchrun import MAX_TIMEOUT_S


def test_timeouts_are_positive_finite_and_at_most_thirty_days():
    assert MAX_TIMEOUT_S == 30 * 24 * 3600
    assert torchrun.check_timeout(5) == 5.0 and torchrun.check_timeout("2.5") == 2.5
    for bad in (0, -1, math.inf, math.nan, MAX_TIMEOUT_S + 1, "soon", None):
        with pytest.raises(ValueError, match="30 days"):
            torchrun.check_timeout(bad)


def test_the_workers_environment_drops_a_parent_jobs_rank_and_finds_this_fp8lab(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "1234")
    env = torchrun.worker_env()
    assert "RANK" not in env and "MASTER_PORT" not in env
    assert env["OMP_NUM_THREADS"] == "1"
    import fp8lab

    root = os.path.dirname(os.path.dirname(os.path.abspath(fp8lab.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == root


def test_a_write_is_whole_and_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    torchrun.write_atomically(path, "new text")
    assert path.read_text() == "new text"
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary left behind


def test_the_root_cause_names_the_rank_and_its_error():
    lines = ["[rank1]: Traceback (most recent call last):", "Root Cause (first observed failure):",
             "[0]:", "  time      : 2026-12-01_10:00:00", "  host      : box", "  rank      : 1 (local_rank: 1)",
             "  exitcode  : 1 (pid: 42)", "  error_file: <N/A>", "RuntimeError: the ranks disagree"]
    assert torchrun.root_cause(lines) == "rank 1 (local_rank: 1): RuntimeError: the ranks disagree"
    assert torchrun.root_cause(["all fine"]) == ""
    signalled = ["Root Cause (first observed failure):", "  rank      : 0", "  exitcode  : -9",
                 "Signal 9 (SIGKILL) received by PID 7"]
    assert torchrun.root_cause(signalled) == "rank 0: Signal 9 (SIGKILL) received by PID 7"


def test_follow_streams_each_line_and_returns_the_exit_code():
    proc = subprocess.Popen([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(4)"],
                            stdout=subprocess.PIPE, text=True)
    seen: list[str] = []
    tail: deque[str] = deque(maxlen=1)
    assert torchrun.follow_output(proc, time.perf_counter() + 60, tail, seen.append) == 4
    assert seen == ["a", "b"] and list(tail) == ["b"]


def test_follow_raises_timeout_at_the_deadline():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(TimeoutError):
            torchrun.follow_output(proc, time.perf_counter() + 0.3, deque(), None)
    finally:
        proc.kill()
        proc.wait()
