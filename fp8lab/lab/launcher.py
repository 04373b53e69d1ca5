"""Start JupyterLab for the lab: `fp8lab lab` (= `python -m fp8lab lab`; `make lab` in a clone).

Public: main(argv), launch(), stop(), copy_notebooks(), working_folder(), notebooks_source(), find_free_port(),
jupyter_command(), lab_environment(), ready(), CONFIG_DIR, DEFAULT_DIR.
Where the notebooks are: from a clone of the repository, its notebooks/ folder, served in place;
from a pip install, the copies the wheel carries (fp8lab/notebooks), copied into a working folder
(--dir, default ./fp8lab-notebooks) on first use; --dir in a clone copies there too. A file already
in the folder is never overwritten (a learner's edits stay; main() lists what it kept).
Binds 127.0.0.1 only (another --ip needs --allow-remote, and is warned about), picks a free port,
keeps token authentication on (a fresh random token each start, passed in the environment as
JUPYTER_TOKEN, never on the command line where `ps` shows it to every user), opens at notebook 00,
adds --allow-root when run as root, and prints the URL with its token. The lab's own Jupyter
configuration (CONFIG_DIR: no news feed, no update check, no "get notified about Jupyter news"
pop-up) is added to JUPYTER_CONFIG_PATH, below the user's own settings. The thread policy's variables
(fp8lab.threads.environment: OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS under a CPU quota, unless the user
set them) go into the server's environment, which every kernel it starts inherits: OpenMP reads them
when torch loads, whatever a notebook imports first. SIGTERM, SIGHUP and Ctrl-C stop Jupyter with the
launcher. The browser test starts the lab through here too.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from http.client import HTTPException
from pathlib import Path

from fp8lab import threads

__all__ = ["CONFIG_DIR", "DEFAULT_DIR", "copy_notebooks", "find_free_port", "jupyter_command", "lab_environment",
           "launch", "main", "notebooks_source", "ready", "stop", "working_folder"]

REPO = Path(__file__).resolve().parents[2]  # the checkout, when fp8lab runs from one
SHIPPED = Path(__file__).resolve().parents[1] / "notebooks"  # the wheel's copies (setup.py puts them there)
FIRST = "00_setup_check.ipynb"
FIRST_NOTEBOOK = f"notebooks/{FIRST}"  # in a checkout, from its root
DEFAULT_DIR = "fp8lab-notebooks"  # from a pip install: the working folder, under the current directory
LOOPBACK = "127.0.0.1"
# jupyter_lab_config.json (LabApp: news_url None, NeverCheckForUpdate) and
# labconfig/default_setting_overrides.json (the notification plugin's defaults: fetchNews
# "false", checkForUpdates false). Defaults only: a user's own settings still win.
CONFIG_DIR = Path(__file__).resolve().parent / "jupyter_config"


def notebooks_source() -> Path:
    """The folder the notebooks are copied from: the wheel's copies, else the checkout's notebooks/."""
    for folder in (SHIPPED, REPO / "notebooks"):
        if (folder / FIRST).is_file():
            return folder
    raise FileNotFoundError(f"fp8lab's notebooks are neither in {SHIPPED} nor in {REPO / 'notebooks'}: "
                            "reinstall fp8lab (pip install --force-reinstall fp8lab)")


def in_checkout() -> bool:
    """Whether fp8lab runs from a clone of the repository (an editable install or the source tree)."""
    return not SHIPPED.is_dir() and (REPO / "pyproject.toml").is_file() and (REPO / FIRST_NOTEBOOK).is_file()


def working_folder(folder: str | os.PathLike | None) -> tuple[Path, str]:
    """(Jupyter's root folder, the first notebook's path inside it) for `--dir folder`.

    None: in a clone, the repository (notebooks/ served in place, as `make lab` does); from a pip
    install, ./fp8lab-notebooks."""
    if folder is None and in_checkout():
        return REPO, FIRST_NOTEBOOK
    return Path(folder if folder is not None else DEFAULT_DIR).expanduser().resolve(), FIRST


def copy_notebooks(dest: Path, source: Path | None = None) -> tuple[list[str], list[str]]:
    """Copy the notebooks (*.ipynb and ANSWERS.md) from `source` into `dest`, only those missing.

    Returns (copied, kept): file names copied, and names already in `dest`, left as they are."""
    source = source or notebooks_source()
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for src in sorted([*source.glob("*.ipynb"), source / "ANSWERS.md"]):
        target = dest / src.name
        if target.exists():
            kept.append(src.name)
        elif src.is_file():
            shutil.copyfile(src, target)
            copied.append(src.name)
    return copied, kept


def find_free_port(start: int = 8888, tries: int = 100, host: str = LOOPBACK) -> int:
    """The first port from `start` that `host` can bind."""
    for port in range(start, start + tries):
        if _can_bind(host, port):
            return port
    raise RuntimeError(f"no free port in {start}..{start + tries - 1} on {host}")


def _can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def jupyter_command(port: int, root: Path = REPO, extra: list[str] | None = None, first: str = FIRST_NOTEBOOK,
                    ip: str = LOOPBACK, open_browser: bool = False) -> list[str]:
    """The jupyter lab command line: `ip` (loopback unless asked), rooted at `root`, opening `first`.
    It holds no token: launch() passes that in the environment (lab_environment). With open_browser,
    Jupyter opens the browser itself, through a file only this user can read (no token in a
    browser's command line)."""
    cmd = [
        sys.executable, "-m", "jupyterlab",  # this Python's JupyterLab, whatever its bin/ and PATH hold
        f"--ip={ip}",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url=/lab/tree/{first}",
    ]
    if not open_browser:
        cmd.insert(3, "--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # Jupyter refuses to run as root without it
    return cmd + list(extra or [])


def lab_environment(token: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment (and so its kernels'): `base` (default os.environ) plus the thread
    policy's variables (fp8lab.threads.environment), JUPYTER_TOKEN and the lab's configuration
    directory in front of JUPYTER_CONFIG_PATH."""
    if not token:
        raise ValueError("fp8lab never starts Jupyter without a token")
    env = dict(os.environ if base is None else base)
    env.update(threads.environment(env))
    env.pop("JUPYTER_TOKEN_FILE", None)  # jupyter_server would read it only without JUPYTER_TOKEN; be plain
    env["JUPYTER_TOKEN"] = token
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(CONFIG_DIR), env.get("JUPYTER_CONFIG_PATH", "")) if p)
    return env


def ready(port: int, token: str, timeout: float = 2.0, host: str = LOOPBACK) -> bool:
    """Whether the server on host:port answers /api/status to this token.

    Direct, never through a proxy (http_proxy would otherwise receive the request, and with
    it the token), and the token goes in the Authorization header, not the URL.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    netloc = f"[{host}]" if ":" in host else host
    req = urllib.request.Request(f"http://{netloc}:{port}/api/status", headers={"Authorization": f"token {token}"})
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status == 200
    except (OSError, HTTPException):  # refused, not yet up, 403, or not an HTTP server
        return False


def _is_loopback(ip: str) -> bool:
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _probe_host(ip: str) -> str:
    """Where this machine reaches a server bound to `ip` (all interfaces: the loopback)."""
    if ip in ("", "0.0.0.0"):
        return LOOPBACK
    if ip == "::":
        return "::1"
    return ip


def launch(
    port: int | None = None, token: str | None = None, extra: list[str] | None = None,
    env: dict[str, str] | None = None, wait: float = 60.0, log=None, root: Path | None = None,
    first: str | None = None, ip: str = LOOPBACK, open_browser: bool = False,
) -> tuple[subprocess.Popen, str]:
    """Start JupyterLab; return (process, URL with token) once it answers.

    root, first: Jupyter's root folder and the notebook it opens (default: this checkout and its
    notebooks/00). env: variables added to os.environ for the server (the token and configuration
    path are set on top, as lab_environment says).
    """
    if root is None:
        root, first = REPO, first or FIRST_NOTEBOOK
    first = first or FIRST
    host = _probe_host(ip)
    port = port or find_free_port(host=LOOPBACK if _is_loopback(ip) else host)
    token = token or secrets.token_urlsafe(24)
    cmd = jupyter_command(port, root, extra, first, ip, open_browser)
    proc = subprocess.Popen(cmd, cwd=root, env=lab_environment(token, {**os.environ, **(env or {})}),
                            stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT if log else subprocess.DEVNULL)
    shown = socket.gethostname() if ip in ("0.0.0.0", "::") else host
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/lab/tree/{first}?token={token}"
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {proc.returncode}; run `{' '.join(cmd)}` to see why")
            if ready(port, token, host=host):
                return proc, url
            time.sleep(0.3)
        raise RuntimeError(f"jupyter lab did not answer on port {port} within {wait:.0f} s")
    except BaseException:  # not up in time, Ctrl-C or SIGTERM while waiting: no server is left behind
        stop(proc)
        raise


def stop(proc: subprocess.Popen) -> None:
    """Terminate the server (Jupyter shuts its kernels down) and wait for it; kill it after 20 s."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fp8lab lab",
        description="Open the lab's notebooks in JupyterLab, at notebook 00.",
        epilog=f"From a pip install the notebooks are copied into --dir (default ./{DEFAULT_DIR}) on first use; "
               "files already there are kept, never overwritten. From a clone of the repository, its notebooks/ "
               "folder is served in place unless --dir names another.")
    p.add_argument("--dir", metavar="FOLDER", help=f"the working folder (default: ./{DEFAULT_DIR}, or the "
                   "clone's notebooks/ when run from one)")
    p.add_argument("--port", type=int, metavar="N", help="the port (default: the first free one from 8888)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, do not open a browser")
    p.add_argument("--ip", default=LOOPBACK, help=f"the address to listen on (default {LOOPBACK}: this machine "
                   "only); any other needs --allow-remote")
    p.add_argument("--allow-remote", action="store_true",
                   help="confirm a non-loopback --ip: anyone who reaches it with the token can run code as you")
    return p


class _Stop(Exception):
    """SIGTERM or SIGHUP reached the launcher."""


def _raise_stop(signum, frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)  # unknown arguments: usage and exit 2
    if args.port is not None and not 0 < args.port < 65536:
        p.error(f"--port must be in 1..65535, not {args.port}")
    if not _is_loopback(args.ip):
        if not args.allow_remote:
            p.error(f"--ip {args.ip} lets other machines reach the lab (which runs code as you); add --allow-remote "
                    f"to confirm, or keep the default {LOOPBACK} and use an SSH tunnel")
        print(f"fp8lab: WARNING: the lab listens on {args.ip}: anyone who can reach this machine on that address and "
              "has the token can run code as you. Use it on a network you trust.", file=sys.stderr)
    host = LOOPBACK if _is_loopback(args.ip) else _probe_host(args.ip)
    if args.port is not None and not _can_bind(host, args.port):
        p.error(f"port {args.port} is in use on {host}; pick another --port, or leave it out for a free one")

    root, first = working_folder(args.dir)
    if (root, first) != (REPO, FIRST_NOTEBOOK):
        try:
            copied, kept = copy_notebooks(root)
        except OSError as err:  # a file of that name, no permission, a full disk
            p.error(f"--dir {root} cannot hold the notebooks: {err}")
        if copied:
            print(f"fp8lab: copied {len(copied)} files into {root}: {', '.join(copied)}")
        if kept:
            print(f"fp8lab: kept {len(kept)} files already in {root} as they are (yours; not overwritten): "
                  f"{', '.join(kept)}. To get a fresh copy of one, delete or rename it and start again.")
    signal.signal(signal.SIGTERM, _raise_stop)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _raise_stop)
    proc = None
    try:
        proc, url = launch(port=args.port, log=sys.stderr, root=root, first=first, ip=args.ip,
                           open_browser=not args.no_browser)
        print(f"fp8lab: JupyterLab serves {root}. Open this URL in your browser (it holds your token):", flush=True)
        print(f"\n    {url}\n", flush=True)
        print("Stop with Ctrl-C.", flush=True)
        return proc.wait()
    except (KeyboardInterrupt, _Stop):
        return 0
    finally:
        if proc is not None:
            stop(proc)
