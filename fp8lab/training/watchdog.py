"""Run a command, and end it if the process that started it dies: fp8lab.training.distributed's launcher.

    python -I watchdog.py RUN_DIR -- COMMAND...

run_distributed starts this (standard library only, no torch: it starts in a few ms) with a
pipe on its stdin, in a process group of its own, and this starts COMMAND (torchrun) in that
group. The launcher never writes to the pipe: its end closes when the launcher exits, however it
exits (a notebook kernel killed or restarted included), or when it closes it on purpose. If that
happens before COMMAND exits, this ends COMMAND (SIGTERM, then SIGKILL after GRACE_S; on Windows
TerminateProcess) and the workers whose pids are in RUN_DIR/pid.* (each in a session of its
own), then removes RUN_DIR. Otherwise it exits with COMMAND's exit code, and the launcher
cleans up. Run with -I: this file's folder (fp8lab/) must not shadow the standard library.
Public: main, stop, and signal_process, worker_pids, GRACE_S (fp8lab.training.torchrun.end_run uses them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

GRACE_S = 5.0


def signal_process(pid: int, hard: bool, group: bool) -> None:
    """Signal a process (its process group where `group` and POSIX has them); gone is fine."""
    sig = getattr(signal, "SIGKILL", signal.SIGTERM) if hard else signal.SIGTERM  # Windows: TerminateProcess
    try:
        if group and hasattr(os, "killpg"):
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def worker_pids(run_dir: Path) -> list[int]:
    """The pids the workers wrote to run_dir (pid.RANK), skipping any still being written."""
    pids = []
    for path in run_dir.glob("pid.*"):
        try:
            pids.append(int(path.read_text()))
        except (OSError, ValueError):
            pass
    return pids


def stop(child: subprocess.Popen, run_dir: Path, grace_s: float = GRACE_S) -> None:
    """End `child` (torchrun: on SIGTERM it stops its workers) and the workers in run_dir."""
    for hard in (False, True):
        if child.poll() is None:
            if hard:
                child.kill()
            else:
                child.terminate()
        for pid in worker_pids(run_dir):
            signal_process(pid, hard, group=True)
        if not hard:
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    child.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -I watchdog.py RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir, command = Path(argv[0]), argv[2:]
    child = subprocess.Popen(command)  # same stdout/stderr, same process group as this one
    orphaned = threading.Event()

    def watch() -> None:
        try:  # (os.read, not sys.stdin: a buffered reader's lock held at exit is a fatal error)
            while os.read(0, 65536):  # the launcher never writes: this returns at EOF
                pass
        except OSError:
            pass
        orphaned.set()
        if child.poll() is None:
            stop(child, run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code = child.wait()
    if orphaned.is_set():
        watcher.join(GRACE_S + 10)  # let it finish stopping the workers and removing run_dir
    return code


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # now, with the watcher still blocked in its read
