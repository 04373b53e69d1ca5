"""Running a command under torchrun, watched: the processes fp8lab.training.distributed launches.

Public, for distributed.run_distributed: worker_env (the workers' environment), free_port,
own_process_group, end_run (every process of a run ended, through the watchdog where there are no
process groups), MAX_TIMEOUT_S and check_timeout (a bounded timeout), write_atomically (the output
written through a private temporary), root_cause (read off the ranks' output) and follow_output
(their output followed line by line as it comes).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from fp8lab.training import watchdog

__all__ = ["MAX_TIMEOUT_S", "check_timeout", "end_run", "follow_output", "free_port", "own_process_group", "root_cause",
           "worker_env", "write_atomically"]


def worker_env() -> dict[str, str]:
    """This process's environment for torchrun's workers: this fp8lab on PYTHONPATH, one thread, no inherited rank."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the fp8lab this process imported
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"  # one thread per rank: 2 ranks on 2 cores, and no torchrun warning
    env["PYTHONUNBUFFERED"] = "1"
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)  # a launcher inside a torchrun job must not pass on its own rank
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_process_group() -> dict:
    """Popen arguments that start the launched process in a process group of its own, so that
    one signal reaches it and its children (POSIX: a new session; Windows: a new group)."""
    if hasattr(os, "setsid"):
        return {"start_new_session": True}
    return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}


def end_run(proc: subprocess.Popen, run_dir: Path, grace_s: float = 5.0) -> None:
    """End the watchdog, torchrun and every worker: gently, then for good after grace_s.

    Closing the watchdog's stdin is its cue to stop torchrun and the workers itself (the one way
    that works everywhere). Where POSIX process groups exist, SIGTERM also goes to the
    watchdog's group (it and torchrun) and to each worker's (torchrun starts each worker in a
    session of its own; they wrote their pids to run_dir), then SIGKILL: none outlives the run,
    even if torchrun hangs. Elsewhere (Windows) the watchdog is given its time, then killed,
    and the workers terminated by pid.
    """
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()
    groups = hasattr(os, "killpg")
    for hard in (False, True):
        if groups:
            watchdog.signal_process(proc.pid, hard, group=True)
        elif hard and proc.poll() is None:
            proc.kill()
        if groups or hard:
            for pid in watchdog.worker_pids(run_dir):
                watchdog.signal_process(pid, hard, group=groups)
        if not hard:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s if groups else grace_s + watchdog.GRACE_S + 1)
    proc.wait()


# the longest wall-clock limit: 30 days (the ranks' collectives wait this plus 30 s, which
# timedelta and the process groups' millisecond clocks hold with room to spare)
MAX_TIMEOUT_S = 30 * 86400.0


def check_timeout(timeout_s: float) -> float:
    """timeout_s as a positive finite float up to MAX_TIMEOUT_S, or ValueError."""
    why = f"timeout must be a positive, finite number of seconds up to {MAX_TIMEOUT_S:.0f} (30 days), got {timeout_s!r}"
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        raise ValueError(why) from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise ValueError(why)
    return value


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a private temporary of an unguessable name beside
    it (created anew, so nothing planted under a predictable name is followed or written), then a
    rename. The file gets the mode a new file gets (the umask's), or keeps an existing one's."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def root_cause(lines: list[str]) -> str:
    """The failing rank and its error, from torchrun's failure summary ("Root Cause ...")."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Root Cause")]
    if not starts:
        return ""
    summary = lines[starts[-1]:]
    fields_ = {}
    for line in summary:
        key, sep, value = line.strip().partition(":")
        if sep and key.strip() in ("rank", "exitcode") and key.strip() not in fields_:
            fields_[key.strip()] = value.strip()
    errors = [line.strip() for line in summary if re.match(r"\s*[\w.]*(Error|Exception|Interrupt)\b", line)]
    signals = [line[line.index("Signal"):].strip() for line in summary if "Signal" in line and "received" in line]
    cause = errors[-1] if errors else (signals[-1] if signals else f"exit code {fields_.get('exitcode', '?')}")
    return f"rank {fields_.get('rank', '?')}: {cause}"


def follow_output(proc: subprocess.Popen, deadline: float, tail: deque[str],
            stream: Callable[[str], object] | None) -> int:
    """Pass proc's output lines to `stream` as they come, until it exits; TimeoutError at `deadline`.

    A thread reads the pipe; the lines reach `stream` on this thread, so a notebook cell
    shows them as they come.
    """
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            continue
        if line is None:  # end of output: every process holding the pipe has exited
            break
        tail.append(line)
        if stream is not None:
            stream(line)
    try:
        return proc.wait(timeout=max(deadline - time.perf_counter(), 0.1))
    except subprocess.TimeoutExpired:
        raise TimeoutError from None
