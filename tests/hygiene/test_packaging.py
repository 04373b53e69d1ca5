"""The wheel is what `pip install .` gives a user: complete, with ranges, and its kernels load.

Builds the wheel from a copy of the sources (offline: no build isolation, this venv's
setuptools; tests/wheels.py), installs it without dependencies into a folder of its own, and imports
fp8lab from there with this venv's torch and a fresh kernel cache: the CPU kernels must compile from
the _kernels.c inside the wheel and load. The wheel carries the ten notebooks and the answer key,
the shipped runs' data files (fp8lab/training/runs/*.json), and its optional extras. ~15-25 s on 2 busy
cores. tests/hygiene/test_install.py installs it into fresh venvs.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["fp8lab/numerics/_kernels.c", "fp8lab/lab/jupyter_config/jupyter_lab_config.json",
           "fp8lab/lab/jupyter_config/labconfig/default_setting_overrides.json", "fp8lab/notebooks/ANSWERS.md",
           *(f"fp8lab/notebooks/{p.name}" for p in sorted((REPO / "notebooks").glob("*.ipynb"))),
           *(f"fp8lab/training/runs/{p.name}" for p in sorted((REPO / "fp8lab" / "training" / "runs").glob("*.json"))),
           "fp8lab/training/sources/published.json"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


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


def test_the_notebooks_in_the_wheel_are_the_repositorys(wheel):
    with zipfile.ZipFile(wheel) as z:
        for path in [*sorted((REPO / "notebooks").glob("*.ipynb")), REPO / "notebooks" / "ANSWERS.md"]:
            assert z.read(f"fp8lab/notebooks/{path.name}") == path.read_bytes(), path.name
    assert len([p for p in SHIPPED if p.endswith(".ipynb")]) == 10


def test_torchao_and_scikit_learn_are_extras_and_the_lab_brings_both(wheel):
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        info = email.message_from_bytes(z.read(meta))
    requires = info.get_all("Requires-Dist")
    base = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]
    assert not [r for r in base if r.startswith(("torchao", "scikit-learn"))], base
    by_extra: dict[str, list[str]] = {}
    for r in requires:
        if "extra ==" in r:
            req, extra = r.split(";")
            by_extra.setdefault(extra.split("==")[1].strip().strip('"'), []).append(req.strip())
    assert {"torchao", "data", "lab", "book"} <= set(info.get_all("Provides-Extra"))
    # torchao 0.18 needs torch 2.11: the extra raises torch's floor for itself, above the base floor
    assert [r.split("<")[0].split(">")[0] for r in by_extra["torchao"]] == ["torchao", "torch"]
    assert "torch>=2.11" in by_extra["torchao"], by_extra["torchao"]
    assert [r.split("<")[0].split(">")[0] for r in by_extra["data"]] == ["scikit-learn"]
    assert "fp8lab[data,torchao]" in by_extra["lab"], by_extra["lab"]


def test_the_installed_wheel_builds_and_loads_its_kernels(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    code = ("import fp8lab; from fp8lab.numerics import kernels; from fp8lab.lab.launcher import CONFIG_DIR; "
            "from fp8lab.training import measured, measured_fp4; "
            "print(fp8lab.__file__); print(CONFIG_DIR.is_dir()); print(*kernels.status(), sep=' | '); "
            "print(len(measured.cliff()), len(measured_fp4.parts()), measured.MEASURED_ON)")
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("FP8LAB_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert Path(out[0]).is_relative_to(site), f"imported {out[0]}, not the installed wheel"
    assert out[1] == "True"
    # the shipped runs load from the wheel's own data files, as from the checkout's
    from fp8lab.training import measured, measured_fp4

    assert out[3] == f"{len(measured.cliff())} {len(measured_fp4.parts())} {measured.MEASURED_ON}", out[3]
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler here: the kernels cannot build from any install")
    assert out[2].startswith("True | fused CPU kernels"), out[2]


def test_the_source_distribution_ships_the_runs_data_files(tmp_path):
    """`python -m build --sdist`'s content, offline: the shipped runs' data files travel with the sources (a wheel
    built from the sdist, as pip builds one, would miss them otherwise)."""
    pytest.importorskip("setuptools", reason="the sdist is built with this venv's setuptools (the test extra)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("fp8lab", "notebooks"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta; build_meta.build_sdist('dist')"],
                   cwd=src, check=True, capture_output=True, text=True, timeout=300)
    (sdist,) = (src / "dist").glob("fp8lab-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    runs = sorted(p.name for p in (REPO / "fp8lab" / "training" / "runs").glob("*.json"))
    assert runs and not [r for r in runs if f"fp8lab/training/runs/{r}" not in names], sorted(names)
