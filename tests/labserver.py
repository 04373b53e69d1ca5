"""JupyterLab for the tests, started by fp8lab.lab.launch (what `make lab` runs), isolated.

Public: Lab, isolated_jupyter(home), running_lab(home, env, extra).
Config, data, runtime, workspaces, checkpoints and user settings live in `home` (a temporary
directory), so nothing leaks into the venv, ~ or the checkout; the user settings turn off the
news toast and autosave. The token stays on. Used by tests/lab/test_launcher.py (the launcher over HTTP) and
tests/notebooks/test_browser.py (chromium).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fp8lab.lab.launcher import REPO, launch

__all__ = ["Lab", "isolated_jupyter", "running_lab"]


@dataclass
class Lab:
    """A running lab: its base URL, token, the URL `make lab` prints, its process and log."""

    base: str  # http://127.0.0.1:PORT
    token: str
    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def port(self) -> int:
        return int(urllib.parse.urlsplit(self.base).port)

    def open_url(self, relpath: str) -> str:
        """`relpath` (from the repository root) in a fresh workspace, so that no tab restored from
        an earlier workspace can match a selector."""
        path = urllib.parse.quote(relpath)
        return f"{self.base}/lab/workspaces/t{uuid.uuid4().hex[:12]}/tree/{path}?reset&token={self.token}"

    def api(self, method: str, path: str):
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self, wait: bool = True) -> threading.Thread | None:
        """Shut down every running kernel; wait=False returns at once (the sessions to end are
        listed now, so a kernel started later is left alone) with the thread doing it."""
        ids = [session["id"] for session in self.api("GET", "/api/sessions")]

        def delete() -> None:
            for session_id in ids:
                self.api("DELETE", f"/api/sessions/{session_id}")

        if wait:
            delete()
            return None
        thread = threading.Thread(target=delete, daemon=True)
        thread.start()
        return thread

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def isolated_jupyter(home: Path) -> tuple[dict[str, str], list[str]]:
    """Environment variables and lab options that keep every Jupyter directory in `home`."""
    settings = home / "user-settings"
    user_settings = {
        # the "get notified about Jupyter news" toast can cover controls: fetchNews off
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        # a run notebook autosaved with its outputs would change the checkout
        "docmanager-extension/plugin": {"autosave": False},
    }
    for name, values in user_settings.items():
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "IPYTHONDIR": str(home / "ipython"),
        "MPLCONFIGDIR": str(home / "matplotlib"),
        # kernels import fp8lab from this checkout, whatever the venv has installed
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    options = [
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--LabApp.news_url=",
        # opening a notebook writes a checkpoint; an absolute directory keeps it out of the checkout
        f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}",
    ]
    return env, options


@contextmanager
def running_lab(
    home: Path, env: dict[str, str] | None = None, extra: list[str] | None = None, wait: float = 60.0
) -> Iterator[Lab]:
    """Start the lab through fp8lab.lab.launch in isolated directories; terminate it on exit."""
    jupyter_env, options = isolated_jupyter(home)
    log_path = home / "server.log"
    with open(log_path, "w") as log:
        proc, url = launch(env={**jupyter_env, **(env or {})}, extra=[*options, *(extra or [])], wait=wait, log=log)
        parts = urllib.parse.urlsplit(url)
        token = urllib.parse.parse_qs(parts.query)["token"][0]
        try:
            yield Lab(base=f"{parts.scheme}://{parts.netloc}", token=token, url=url, proc=proc, log=log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
