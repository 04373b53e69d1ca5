"""Where learners are: fp8lab installed from its wheel into a fresh venv, outside the repository.

- `fp8lab lab --dir X --no-browser` (the console script) copies the ten notebooks into X and
  serves notebook 00 behind the token; a second start keeps a learner's edit.
- pip keeps a user's own torch: the wheel installed beside torch 2.13.0 leaves it as it was.
- A hosted notebook (Colab, Kaggle, a JupyterHub): notebook 00 run with nbclient in a venv without
  fp8lab; its first cell installs fp8lab from the wheel named in FP8LAB_SOURCE, and it completes.
Everything is offline: the fresh venvs see this venv's packages through a .pth file (tests/wheels.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.wheels import REPO, build_wheel, fresh_venv, isolated_env, lab_children, pip, start_lab, stop_lab

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _status(url: str, token: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with DIRECT.open(req, timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _installed_from(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import fp8lab; print(fp8lab.__file__)"], capture_output=True,
                          text=True, timeout=120, check=True, cwd="/").stdout.strip()


def test_the_wheel_serves_the_lab_from_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    r = pip(python, "install", str(wheel))
    assert "Successfully installed fp8lab-" in r.stdout, r.stdout
    assert Path(_installed_from(python)).is_relative_to(venv), "fp8lab must come from the wheel, not the checkout"
    work = tmp_path / "learner" / "fp8 notebooks"
    env = isolated_env(tmp_path / "home")
    cmd = [str(venv / "bin" / "fp8lab"), "lab", "--dir", str(work), "--no-browser"]

    proc, lines, url = start_lab(cmd, env, tmp_path)
    children = lab_children(proc.pid)
    try:
        assert url["path"] == "00_setup_check.ipynb"
        assert sorted(p.name for p in work.glob("*.ipynb")) == sorted(p.name for p in (REPO / "notebooks").glob(
            "*.ipynb")) and len(list(work.glob("*.ipynb"))) == 10
        assert (work / "ANSWERS.md").is_file()
        assert any("copied 11 files" in line for line in lines), lines
        base = f"http://127.0.0.1:{url['port']}"
        assert _status(f"{base}/lab/tree/00_setup_check.ipynb?token={url['token']}") == 200
        assert _status(f"{base}/api/contents/00_setup_check.ipynb", url["token"]) == 200
        assert _status(f"{base}/api/contents/00_setup_check.ipynb") == 403
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        stop_lab(proc, children)

    notebook = work / "00_setup_check.ipynb"
    edited = json.loads(notebook.read_text())
    edited["cells"][0]["source"] = ["# my own notes\n"]
    notebook.write_text(json.dumps(edited))
    (work / "04_per_block_scaling.ipynb").unlink()
    proc, lines, url = start_lab([str(python), "-m", "fp8lab", "lab", "--dir", str(work), "--no-browser"], env,
                                 tmp_path)
    children = lab_children(proc.pid)
    try:
        assert json.loads(notebook.read_text())["cells"][0]["source"] == ["# my own notes\n"], "an edit was lost"
        assert any("copied 1 files" in line and "04_per_block_scaling.ipynb" in line for line in lines), lines
        assert any("kept 10 files" in line and "00_setup_check.ipynb" in line for line in lines), lines
        assert _status(f"http://127.0.0.1:{url['port']}/api/contents/00_setup_check.ipynb", url["token"]) == 200
    finally:
        stop_lab(proc, children)


def _dist_info(site: Path, name: str) -> Path:
    (found,) = site.glob(f"{name}-*.dist-info")
    return found


def test_pip_keeps_the_users_own_torch(wheel, tmp_path):
    """A venv that already holds torch 2.13.0 (the lab's, from the local wheel) gets fp8lab and keeps its
    torch: same version, same files, and pip does not name torch among what it installed."""
    venv = tmp_path / "venv"
    python = fresh_venv(venv, own_torch=True)
    site = Path(subprocess.run([str(python), "-c", "import torch, pathlib; print(pathlib.Path(torch.__file__)"
                                ".parent.parent)"], capture_output=True, text=True, check=True, timeout=120,
                               cwd="/").stdout.strip())
    assert site.is_relative_to(venv), f"torch must be the venv's own, found {site}"
    record = _dist_info(site, "torch") / "RECORD"
    before = (record.read_bytes(), record.stat().st_mtime_ns, _dist_info(site, "torch").name)

    r = pip(python, "install", f"{wheel}[torchao]")
    installed = next((line for line in r.stdout.splitlines() if line.startswith("Successfully installed")), "")
    assert "fp8lab-" in installed and "torch-" not in installed, r.stdout
    assert "Requirement already satisfied: torch" in r.stdout, r.stdout
    assert (record.read_bytes(), record.stat().st_mtime_ns, _dist_info(site, "torch").name) == before
    out = subprocess.run([str(python), "-c", "import torch, fp8lab; print(torch.__version__, torch.__file__)"],
                         capture_output=True, text=True, check=True, timeout=300, cwd="/").stdout.split()
    assert out[0] == "2.13.0+cpu" and Path(out[1]).is_relative_to(venv), out


DRIVER = """
import sys
import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
nb.cells.append(nbformat.v4.new_code_cell("print('fp8lab from', fp8lab.__file__)"))
NotebookClient(nb, timeout=600, kernel_name="fresh", resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[3])
"""


def test_a_hosted_notebook_installs_fp8lab_in_its_first_cell(wheel, tmp_path):
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    assert subprocess.run([str(python), "-c", "import fp8lab"], capture_output=True, cwd="/").returncode != 0
    home = tmp_path / "home"
    env = isolated_env(home)
    kernels = home / "data" / "kernels" / "fresh"  # a kernel that runs this venv's python
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv", "language": "python"}))
    env.update({"FP8LAB_SOURCE": str(wheel), "PIP_NO_INDEX": "1", "FP8LAB_SMOKE": "1"})
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "ran.ipynb"
    r = subprocess.run([str(python), str(tmp_path / "driver.py"), str(REPO / "notebooks" / "00_setup_check.ipynb"),
                        str(tmp_path), str(out)], env=env, capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, errors
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert Path(last.split("fp8lab from ", 1)[1].strip()).is_relative_to(venv), last
    assert Path(_installed_from(python)).is_relative_to(venv)
