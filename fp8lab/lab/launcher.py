"""Start JupyterLab for the lab: `make lab` (or `python -m fp8lab lab`).

Public: launch(), find_free_port(), jupyter_command(), lab_environment(), ready(), CONFIG_DIR.
Binds 127.0.0.1 only, picks a free port, keeps token authentication on (a fresh random
token each start, passed in the environment as JUPYTER_TOKEN, never on the command line
where `ps` shows it to every user), opens at notebooks/00_setup_check.ipynb, adds
--allow-root when run as root, and prints the URL with its token. The lab's own Jupyter
configuration (CONFIG_DIR: no news feed, no update check, no "get notified about Jupyter
news" pop-up) is added to JUPYTER_CONFIG_PATH, below the user's own settings, which stay
where Jupyter keeps them. The browser test starts the lab through here too.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from http.client import HTTPException
from pathlib import Path

__all__ = ["CONFIG_DIR", "find_free_port", "jupyter_command", "lab_environment", "launch", "main", "ready"]

REPO = Path(__file__).resolve().parents[2]
FIRST_NOTEBOOK = "notebooks/00_setup_check.ipynb"
# jupyter_lab_config.json (LabApp: news_url None, NeverCheckForUpdate) and
# labconfig/default_setting_overrides.json (the notification plugin's defaults: fetchNews
# "false", checkForUpdates false). Defaults only: a user's own settings still win.
CONFIG_DIR = Path(__file__).resolve().parent / "jupyter_config"


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


def jupyter_command(port: int, root: Path = REPO, extra: list[str] | None = None) -> list[str]:
    """The jupyter lab command line: loopback only, rooted at the repository. It holds no
    token: launch() passes that in the environment (lab_environment)."""
    cmd = [
        sys.executable, "-m", "jupyter", "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url=/lab/tree/{FIRST_NOTEBOOK}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # Jupyter refuses to run as root without it
    return cmd + list(extra or [])


def lab_environment(token: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) plus JUPYTER_TOKEN and the lab's
    configuration directory in front of JUPYTER_CONFIG_PATH."""
    if not token:
        raise ValueError("fp8lab never starts Jupyter without a token")
    env = dict(os.environ if base is None else base)
    env.pop("JUPYTER_TOKEN_FILE", None)  # jupyter_server would read it only without JUPYTER_TOKEN; be plain
    env["JUPYTER_TOKEN"] = token
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(CONFIG_DIR), env.get("JUPYTER_CONFIG_PATH", "")) if p)
    return env


def ready(port: int, token: str, timeout: float = 2.0) -> bool:
    """Whether the server on 127.0.0.1:port answers /api/status to this token.

    Direct, never through a proxy (http_proxy would otherwise receive the request, and with
    it the token), and the token goes in the Authorization header, not the URL.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Authorization": f"token {token}"})
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status == 200
    except (OSError, HTTPException):  # refused, not yet up, 403, or not an HTTP server
        return False


def launch(
    port: int | None = None, token: str | None = None, extra: list[str] | None = None,
    env: dict[str, str] | None = None, wait: float = 60.0, log=None,
) -> tuple[subprocess.Popen, str]:
    """Start JupyterLab; return (process, URL with token) once it answers.

    env: variables added to os.environ for the server (the token and configuration path are
    set on top, as lab_environment says).
    """
    port = port or find_free_port()
    token = token or secrets.token_urlsafe(24)
    cmd = jupyter_command(port, extra=extra)
    proc = subprocess.Popen(cmd, cwd=REPO, env=lab_environment(token, {**os.environ, **(env or {})}),
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/lab/tree/{FIRST_NOTEBOOK}?token={token}"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}; run `{' '.join(cmd)}` to see why")
        if ready(port, token):
            return proc, url
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
