"""fp8lab's wheel and fresh virtual environments for the install tests, offline and without touching .venv.

Public: build_wheel(dest), fresh_venv(path, lab_packages, own_torch), pip(python, *args), isolated_env(home),
start_lab(cmd, env, cwd), lab_children(pid), stop_lab(proc).
build_wheel: `pip wheel --no-deps --no-build-isolation --no-index` of a copy of what a clone holds
(pyproject.toml, setup.py, MANIFEST.in, README.md, fp8lab/, notebooks/), as a user's `pip install .`.
fresh_venv: a new venv without fp8lab. lab_packages puts this venv's site-packages (torch, Jupyter,
...) behind the new one's own through a .pth file, so that nothing is downloaded; fp8lab is not
importable there (this venv's editable install is a .pth that only runs in its own site directory).
own_torch installs torch 2.13.0 into the new venv itself, from the local wheel pip's find-links
name, as a user's own torch.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
VENV_PREFIX = Path(sys.prefix)
URL = re.compile(r"http://[^\s:]+:(\d+)/lab/tree/(\S+)\?token=([A-Za-z0-9_\-]{16,})")  # not Jupyter's token=...


def build_wheel(dest: Path) -> Path:
    pytest.importorskip("setuptools", reason="the wheel is built with this venv's setuptools (the test extra)")
    src = dest / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        shutil.copy(REPO / name, src / name)
    for folder in ("fp8lab", "notebooks"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(dest / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (built,) = (dest / "dist").glob("fp8lab-*.whl")
    return built


def pip(python: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m pip ...` offline (--no-index), output captured; raises with pip's output on failure."""
    r = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def fresh_venv(path: Path, lab_packages: bool = True, own_torch: bool = False) -> Path:
    """A new venv at `path` (its python returned), without fp8lab."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    if lab_packages:
        (site / "_fp8lab_test_lab_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if own_torch:
        # --ignore-installed: into the venv itself, although this venv's torch is visible through the .pth
        r = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                            "--ignore-installed", "torch==2.13.0"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]})
        if r.returncode != 0:
            pytest.skip(f"no local torch 2.13.0 wheel for pip's find-links here: {r.stderr.strip()[-200:]}")
    return python


def isolated_env(home: Path) -> dict[str, str]:
    """os.environ with every Jupyter directory in `home`, no PYTHONPATH (the installed fp8lab is imported,
    not the checkout), and JupyterLab's application files from this venv (a fresh venv has its own
    share/jupyter only when pip installs JupyterLab into it; lab_packages borrows this venv's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_TOKEN", "FP8LAB_SMOKE")}
    env.update({
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "IPYTHONDIR": str(home / "ipython"),
        "MPLCONFIGDIR": str(home / "matplotlib"),
        "JUPYTERLAB_DIR": str(VENV_PREFIX / "share" / "jupyter" / "lab"),
        "JUPYTER_PATH": str(VENV_PREFIX / "share" / "jupyter"),
    })
    return env


def start_lab(cmd: list[str], env: dict[str, str], cwd: Path, wait: float = 120.0
              ) -> tuple[subprocess.Popen, list[str], dict]:
    """Run a `fp8lab lab ...` command until it prints its URL: (process, its output lines so far,
    {"port", "path", "token"}). The output keeps being collected into the list."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if URL.search(line):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + wait  # a hang guard, not a timing assertion
    while not found.is_set() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not found.is_set():
        stop_lab(proc)
        raise AssertionError("the lab printed no URL:\n" + "\n".join(lines[-40:]))
    m = next(URL.search(line) for line in lines if URL.search(line))
    return proc, lines, {"port": int(m[1]), "path": urllib.parse.unquote(m[2]), "token": m[3]}


def lab_children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop_lab(proc: subprocess.Popen, children: list[int] = ()) -> None:
    """Clean up after a test: the launcher and any server it left (by pid)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
