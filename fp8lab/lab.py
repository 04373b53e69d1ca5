"""Start JupyterLab for the lab: `make lab` (or `python -m fp8lab lab`).

Public: launch(), find_free_port(), jupyter_command().
Binds 127.0.0.1 only, picks a free port, keeps token authentication on (a fresh random
token each start), opens at notebooks/00_setup_check.ipynb, adds --allow-root when run as
root, and prints the URL with its token. The browser test starts the lab through here too.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["find_free_port", "jupyter_command", "launch", "main"]

REPO = Path(__file__).resolve().parent.parent
FIRST_NOTEBOOK = "notebooks/00_setup_check.ipynb"


def find_free_port(start: int = 8888, tries: int = 100) -> int:
    """The first port from `start` that 127.0.0.1 can bind."""
    for port in range(start, start + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}..{start + tries - 1} on 127.0.0.1")


def jupyter_command(port: int, token: str, root: Path = REPO, extra: list[str] | None = None) -> list[str]:
    """The jupyter lab command line: loopback only, token on, rooted at the repository."""
    if not token:
        raise ValueError("fp8lab never starts Jupyter without a token")
    cmd = [
        sys.executable, "-m", "jupyter", "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url=/lab/tree/{FIRST_NOTEBOOK}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # Jupyter refuses to run as root without it
    return cmd + list(extra or [])


def launch(
    port: int | None = None, token: str | None = None, extra: list[str] | None = None,
    env: dict[str, str] | None = None, wait: float = 60.0, log=None,
) -> tuple[subprocess.Popen, str]:
    """Start JupyterLab; return (process, URL with token) once it answers."""
    port = port or find_free_port()
    token = token or secrets.token_urlsafe(24)
    cmd = jupyter_command(port, token, extra=extra)
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})},
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/lab/tree/{FIRST_NOTEBOOK}?token={token}"
    api = f"http://127.0.0.1:{port}/api/status?token={token}"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}; run `{' '.join(cmd)}` to see why")
        try:
            with urllib.request.urlopen(api, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise RuntimeError(f"jupyter lab did not answer on port {port} within {wait:.0f} s")


def main(argv: list[str] | None = None) -> int:
    proc, url = launch(log=sys.stderr)
    print("fp8lab: JupyterLab is running. Open this URL in your browser (it holds your token):")
    print(f"\n    {url}\n")
    print("Stop with Ctrl-C.")
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(10)
        return 0
