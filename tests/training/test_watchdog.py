"""fp8lab.training.watchdog: the pids it reads, how it ends a command, its usage. (A launcher that dies mid-run is
tested end to end with the distributed runs.)"""

from __future__ import annotations

import subprocess
import sys

from fp8lab.training import watchdog as wd
from fp8lab.training.watchdog import main, stop, worker_pids


def test_worker_pids_reads_each_pid_file_and_skips_one_being_written(tmp_path):
    (tmp_path / "pid.0").write_text("123")
    (tmp_path / "pid.1").write_text("456")
    (tmp_path / "pid.2").write_text("")  # still being written
    (tmp_path / "other").write_text("789")
    assert sorted(worker_pids(tmp_path)) == [123, 456]
    assert worker_pids(tmp_path / "missing") == []


def test_stop_ends_a_running_command(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop(child, tmp_path, grace_s=5.0)
    assert child.poll() is not None  # ended (by SIGTERM), and waited for


def test_run_as_a_script_it_returns_the_commands_exit_code_while_its_launcher_lives(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    watchdog = subprocess.Popen([sys.executable, "-I", wd.__file__, str(run_dir), "--", sys.executable, "-c",
                                 "raise SystemExit(3)"], stdin=subprocess.PIPE)  # the launcher's end of the pipe
    try:
        assert watchdog.wait(timeout=60) == 3
    finally:
        watchdog.stdin.close()
    assert run_dir.exists()  # the launcher cleans up, not the watchdog


def test_when_its_launcher_goes_it_ends_the_command_and_removes_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    watchdog = subprocess.Popen([sys.executable, "-I", wd.__file__, str(run_dir), "--", sys.executable, "-c",
                                 "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    watchdog.stdin.close()  # the launcher's end closes: as if it died
    assert watchdog.wait(timeout=30) != 0  # the command was ended, not left to finish
    assert not run_dir.exists()


def test_main_prints_its_usage_on_bad_arguments(capsys):
    assert main(["only-a-dir"]) == 2
    assert main(["dir", "cmd", "x"]) == 2
    assert "usage" in capsys.readouterr().err
