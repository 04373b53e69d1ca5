"""The wheel is what `pip install .` gives a user: complete, with ranges, and its kernels load.

Builds the wheel from a copy of the sources (offline: no build isolation, this venv's
setuptools), installs it without dependencies into a folder of its own, and imports fp8lab from
there with this venv's torch and a fresh kernel cache: the CPU kernels must compile from the
_kernels.c inside the wheel and load. ~15-25 s on 2 busy cores.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ["fp8lab/numerics/_kernels.c", "fp8lab/lab/jupyter_config/jupyter_lab_config.json",
           "fp8lab/lab/jupyter_config/labconfig/default_setting_overrides.json"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="the wheel is built with this venv's setuptools (the test extra)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "fp8lab", src / "fp8lab", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (built,) = (tmp / "dist").glob("fp8lab-*.whl")
    return built


def test_the_wheel_ships_the_kernels_source_and_the_lab_config(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        info = email.message_from_bytes(z.read(meta))
    missing = [n for n in SHIPPED if n not in names]
    assert not missing, f"the wheel leaves out {missing}"
    requires = info.get_all("Requires-Dist")
    assert any(r.startswith("torch") for r in requires)
    pinned = [r for r in requires if "==" in r.split(";")[0]]
    assert not pinned, f"exact pins would replace a user's packages: {pinned}"
    assert info["Requires-Python"] == ">=3.11"


def test_the_installed_wheel_builds_and_loads_its_kernels(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    code = ("import fp8lab; from fp8lab.numerics import kernels; from fp8lab.lab.launcher import CONFIG_DIR; "
            "print(fp8lab.__file__); print(CONFIG_DIR.is_dir()); print(*kernels.status(), sep=' | ')")
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("FP8LAB_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert Path(out[0]).is_relative_to(site), f"imported {out[0]}, not the installed wheel"
    assert out[1] == "True"
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler here: the kernels cannot build from any install")
    assert out[2].startswith("True | fused CPU kernels"), out[2]
